"""parallax_nb.launch: mpirun command lines, results from every rank, failures and timeouts."""
from __future__ import annotations

import os
import tempfile
import time

import psutil
import pytest

from parallax_nb.errors import ConfigError, DistributedError
from parallax_nb.failures import mpi_rank
from parallax_nb.launch import mpirun_command, run_on_ranks
from reliability_cases import CONNECT_WARNING   # Open MPI's warning, as mpirun printed it


def _whoami(offset):
    import os

    return int(os.environ["OMPI_COMM_WORLD_RANK"]) + offset, int(os.environ["OMPI_COMM_WORLD_SIZE"])


def _raise_on_rank(rank):
    import os

    if int(os.environ["OMPI_COMM_WORLD_RANK"]) == rank:
        raise ValueError(f"boom from rank {rank}")
    time.sleep(600)  # the others would wait forever; mpirun must stop them


def _traced_in_temporary_folder():
    """A tf.function with Python control flow: AutoGraph writes its generated module to a
    temporary file, which a rank ending with os._exit never deletes."""
    import glob
    import tempfile

    import tensorflow as tf

    @tf.function
    def double_if_positive(x):
        if x > 0:
            return 2 * x
        return x

    double_if_positive(tf.constant(3.0))
    folder = tempfile.gettempdir()
    return folder, len(glob.glob(f"{folder}/__autograph_generated_file*"))


def _sleep_forever(pid_dir):
    import os

    with open(os.path.join(pid_dir, f"pid-{os.environ['OMPI_COMM_WORLD_RANK']}"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)


def test_mpirun_command_defaults():
    cmd = mpirun_command(3, ["python", "-c", "pass"])
    assert cmd[1:3] == ["-np", "3"]
    assert "--oversubscribe" in cmd and cmd[cmd.index("--bind-to") + 1] == "none"
    assert cmd[-3:] == ["python", "-c", "pass"]
    if os.geteuid() == 0:
        assert "--allow-run-as-root" in cmd


def test_local_ranks_use_shared_memory_unless_told_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv("OMPI_MCA_btl", raising=False)
    cmd = mpirun_command(2, ["x"])
    assert cmd[cmd.index("btl") - 1:cmd.index("btl") + 2] == ["--mca", "btl", "self,vader"]
    assert "self,vader" not in mpirun_command(2, ["x"], extra_mca={"btl": "tcp,self"})
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    assert "btl" not in mpirun_command(2, ["x"], hostfile=str(hostfile))   # other hosts: TCP
    monkeypatch.setenv("OMPI_MCA_btl", "tcp,self")
    assert "btl" not in mpirun_command(2, ["x"])


def _tcp_listeners():
    import psutil
    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()   # every transport is up
    me = psutil.Process()
    conns = me.net_connections("tcp") if hasattr(me, "net_connections") else me.connections("tcp")
    MPI.Finalize()   # the launcher finalises MPI only through Horovod
    return sorted((c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN)


@pytest.mark.mpi
def test_local_ranks_listen_on_no_interface():
    """Open MPI's TCP transport would listen on 0.0.0.0 and :: in every rank."""
    per_rank = run_on_ranks(_tcp_listeners, 2, timeout_s=120)
    assert len(per_rank) == 2
    for listeners in per_rank:
        assert not [(ip, port) for ip, port in listeners if ip in ("0.0.0.0", "::")], listeners


def test_mpirun_command_mca_and_hostfile(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    cmd = mpirun_command(2, ["x"], hostfile=str(hostfile), extra_mca={"btl": "tcp,self"})
    assert cmd[cmd.index("--hostfile") + 1] == str(hostfile)
    i = cmd.index("--mca")
    assert cmd[i:i + 3] == ["--mca", "btl", "tcp,self"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_rank_count_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="number of ranks"):
        mpirun_command(bad, ["x"])


def test_missing_hostfile_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="hostfile"):
        mpirun_command(2, ["x"], hostfile=str(tmp_path / "nope"))


@pytest.mark.mpi
def test_run_on_ranks_returns_every_rank():
    assert run_on_ranks(_whoami, 3, args=(10,), timeout_s=120) == [(10, 3), (11, 3), (12, 3)]


@pytest.mark.mpi
def test_ranks_temporary_files_go_with_the_run():
    """Each rank's temporary files (here AutoGraph's module) live in the run's own folder,
    which is removed when the run ends, so nothing accumulates in the system's temp folder."""
    import os
    import tempfile

    per_rank = run_on_ranks(_traced_in_temporary_folder, 2, timeout_s=120)
    for folder, generated in per_rank:
        assert generated >= 1, "AutoGraph wrote no module: the check would prove nothing"
        assert os.path.dirname(os.path.dirname(folder)) == tempfile.gettempdir()
        assert os.path.basename(os.path.dirname(folder)).startswith("parallax-ranks-")
        assert not os.path.exists(folder), f"{folder} was left behind"


@pytest.mark.mpi
def test_a_raising_rank_is_named_with_its_traceback():
    start = time.time()
    with pytest.raises(DistributedError) as info:
        run_on_ranks(_raise_on_rank, 2, args=(1,), timeout_s=120)
    message = str(info.value)
    assert "rank 1 of 2 failed" in message and "ValueError: boom from rank 1" in message
    assert "Traceback" in message
    assert time.time() - start < 60


@pytest.mark.mpi
def test_timeout_kills_every_rank(tmp_path):
    import psutil

    with pytest.raises(DistributedError, match="did not finish within 8 s"):
        run_on_ranks(_sleep_forever, 2, args=(str(tmp_path),), timeout_s=8)
    pids = [int(p.read_text()) for p in tmp_path.glob("pid-*")]
    assert len(pids) == 2
    time.sleep(0.5)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive


LAUNCHER = """
import sys, time
from parallax_nb.launch import run_on_ranks

def sleep_long(marker):
    open(marker + "." + __import__("os").environ.get("OMPI_COMM_WORLD_RANK", "?"), "w").close()
    time.sleep(300)

run_on_ranks(sleep_long, 2, args=(sys.argv[1],), timeout_s=600)
"""


def _processes_mentioning(text: str) -> list:
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(text in part for part in (p.info["cmdline"] or [])):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.mark.mpi
def test_a_killed_launcher_leaves_no_mpirun_or_rank_behind(tmp_path, monkeypatch):
    """SIGKILL of the process that called run_on_ranks (no finally runs): mpirun and both
    ranks must still go away, because mpirun is tied to its launcher's life."""
    import signal
    import subprocess
    import sys

    import psutil

    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    marker = str(tmp_path / "rank-started")
    temporary = tmp_path / "tmp"   # the launcher's temporary folder, where its call's folder is made
    temporary.mkdir()
    launcher = subprocess.Popen([sys.executable, str(script), marker], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(temporary)})
    deadline = time.time() + 120
    while not all(os.path.exists(f"{marker}.{r}") for r in (0, 1)):
        assert launcher.poll() is None, "the launcher exited before its ranks started"
        assert time.time() < deadline, "ranks did not start within 120 s"
        time.sleep(0.5)
    ranks = [p for p in _processes_mentioning("parallax-ranks-") if "rank" in p.cmdline()]
    mpiruns = [p for p in psutil.Process(launcher.pid).children() if "mpirun" in p.name()]
    assert len(ranks) >= 2 and mpiruns, (ranks, mpiruns)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=10)
    gone, alive = psutil.wait_procs(ranks + mpiruns, timeout=30)
    assert not alive, f"left behind after the launcher was killed: {[p.cmdline() for p in alive]}"
    def folders():   # beside Open MPI's session folder
        return [p.name for p in temporary.glob("parallax-ranks-*")]

    left = folders()
    assert len(left) == 1 and left[0].startswith(f"parallax-ranks-{launcher.pid}-"), left   # no finally ran
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    assert run_on_ranks(mpi_rank, 1) == [0]
    assert folders() == [], "the next call leaves the killed launcher's folder behind"


def test_folders_of_launchers_that_ended_are_removed_and_running_ones_kept(tmp_path):
    """remove_left_workdirs: a folder whose launcher has ended goes; this process's, a running
    process's and a process id taken again after the folder last changed are told apart."""
    import subprocess
    import sys

    from parallax_nb.launch import remove_left_workdirs

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                           text=True, check=True)
    ended_pid = int(ended.stdout)
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {"ended": f"parallax-ranks-{ended_pid}-abc", "mine": f"parallax-ranks-{os.getpid()}-abc",
                 "running": f"parallax-ranks-{running.pid}-abc", "other": "parallax-ranks-abc",
                 "reused": f"parallax-ranks-{running.pid}-old"}
        for name in names.values():
            (tmp_path / name).mkdir()
            (tmp_path / name / "payload.pkl").write_bytes(b"x")
        old = psutil.Process(running.pid).create_time() - 60   # changed before that process started
        os.utime(tmp_path / names["reused"], (old, old))
        removed = remove_left_workdirs(str(tmp_path))
    finally:
        running.kill()
        running.wait()
    assert sorted(removed) == sorted(str(tmp_path / names[k]) for k in ("ended", "reused"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[k] for k in ("mine", "running", "other"))


def _mpi4py_before_horovod() -> int:
    from mpi4py import MPI  # MPI_Init by mpi4py: Horovod's shutdown then leaves MPI to it

    from parallax_nb.runtime.context import horovod

    return horovod().rank() + MPI.COMM_WORLD.Get_size()


@pytest.mark.mpi
def test_a_rank_that_started_mpi_through_mpi4py_ends_cleanly():
    """A function that imports mpi4py.MPI before Horovod starts: the rank still finalises MPI
    before it exits (mpirun otherwise reports that the rank exited improperly, and the run fails
    although every rank returned)."""
    assert run_on_ranks(_mpi4py_before_horovod, 2, timeout_s=120) == [2, 3]



def test_open_mpis_failed_connection_is_read_from_its_warning():
    from parallax_nb.launch import mpi_connect_failure

    assert mpi_connect_failure("some output\n" + CONNECT_WARNING + "[vm:1] 1 more process has sent help message") \
        == "on pxnbd9cbm0: connect() to 10.213.1.3:1024 failed: Operation now in progress (115)"
    assert mpi_connect_failure("rank 0 ready\n") is None


def _warn_then(pid_dir, then_s):
    import os

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    with open(os.path.join(pid_dir, f"pid-{rank}"), "w") as f:
        f.write(str(os.getpid()))
    if rank == 1:
        print(CONNECT_WARNING, flush=True)
    time.sleep(then_s)
    return rank


@pytest.mark.mpi
def test_a_job_left_hanging_by_a_failed_connection_stops_with_it_named(tmp_path, monkeypatch):
    """Open MPI's warning, then no progress: the job is stopped the grace period after the
    warning, not at its timeout, and the error names the connection; no rank is left."""
    import psutil

    from parallax_nb import launch

    from parallax_nb.errors import RankConnectionError

    monkeypatch.setattr(launch, "CONNECT_GRACE_S", 3.0)
    start = time.monotonic()
    with pytest.raises(RankConnectionError) as info:
        run_on_ranks(_warn_then, 2, args=(str(tmp_path), 600), timeout_s=300)
    took = time.monotonic() - start
    message = str(info.value)
    assert "could not open a TCP connection between two of its ranks" in message, message
    assert "on pxnbd9cbm0: connect() to 10.213.1.3:1024 failed: Operation now in progress (115)" in message
    assert "btl_tcp_if_include" in info.value.hint
    assert took < 90, took
    pids = [int(p.read_text()) for p in tmp_path.glob("pid-*")]
    assert len(pids) == 2
    time.sleep(0.5)
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.mpi
def test_a_job_that_finishes_after_the_warning_returns_its_results(tmp_path):
    """The warning alone fails nothing: a job that finishes within the grace period returns."""
    assert run_on_ranks(_warn_then, 2, args=(str(tmp_path), 2), timeout_s=120) == [0, 1]


def _report_then(steps, pause_s, then_s):
    """Report ``steps`` progress steps ``pause_s`` apart, then sleep ``then_s`` and return the rank."""
    import os

    from parallax_nb.failures import report_progress

    for i in range(steps):
        report_progress(f"step {i + 1} of {steps}")
        time.sleep(pause_s)
    time.sleep(then_s)
    return int(os.environ["OMPI_COMM_WORLD_RANK"])


def test_progress_is_read_back_per_rank(tmp_path, monkeypatch):
    from parallax_nb.failures import ERROR_DIR_ENV, read_progress, report_progress

    report_progress("nowhere to write: nothing happens")
    monkeypatch.setenv(ERROR_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    report_progress("timing alltoall/cross at 4194304 B a rank, chain 2 of 7")
    (rank, (when, text)), = read_progress(str(tmp_path)).items()
    assert rank == 3 and text == "timing alltoall/cross at 4194304 B a rank, chain 2 of 7"
    assert abs(time.time() - when) < 60
    assert read_progress(str(tmp_path / "missing")) == {}


@pytest.mark.mpi
def test_a_job_whose_ranks_stop_reporting_progress_is_stopped_naming_their_last_steps():
    """Both ranks report two steps and then sleep: stopped ``stall_s`` after their last report,
    long before the timeout, each rank's last step named."""
    start = time.monotonic()
    with pytest.raises(DistributedError) as info:
        run_on_ranks(_report_then, 2, args=(2, 0.2, 600), timeout_s=300, stall_s=4)
    message = str(info.value)
    assert "made no progress for 4 s and was stopped" in message, message
    assert "rank 0: step 2 of 2 (" in message and "rank 1: step 2 of 2 (" in message, message
    assert time.monotonic() - start < 90


@pytest.mark.mpi
def test_a_job_that_keeps_reporting_progress_outlives_the_stall_limit():
    """Seven reports 1 s apart: 7 s in all, longer than ``stall_s`` = 3, never 3 s without one."""
    assert run_on_ranks(_report_then, 2, args=(7, 1.0, 0), timeout_s=120, stall_s=3) == [0, 1]
