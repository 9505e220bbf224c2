"""Start Python code on N MPI ranks with ``mpirun`` and bring back what each rank returned.

Two entry points:

* :func:`mpirun_command` builds the ``mpirun`` command line (loopback or a hostfile), with
  the defaults this project needs: ``--oversubscribe`` (more ranks than cores is fine for
  tests), ``--bind-to none`` (TensorFlow spreads its own threads; ranks at least as many as
  the cores bind themselves once Horovod starts, and on one host are told to wait in MPI
  without spinning: :mod:`parallax_nb.devices`), ``--allow-run-as-root`` when running as
  root, and ``-x`` for the environment variables ranks on other hosts need.
* :func:`run_on_ranks` cloudpickles a function, runs it on every rank under ``mpirun`` and
  returns the list of per-rank return values, or raises :class:`DistributedError` naming the
  failing rank with its traceback (or, for a rank that died without one, its host and the
  signal or exit code Open MPI reported, as the command line does).

Failure semantics: a rank that raises writes its traceback to ``error-<rank>.txt`` and to
stderr, then leaves with ``os._exit(1)`` (no atexit hooks that could block in a collective);
``mpirun`` notices a rank that exited non-zero and terminates the others (SIGTERM, then
SIGKILL). The parent waits at most ``timeout_s`` and then kills the whole process group it
started, so no rank outlives the call. A job in which Open MPI reports that one rank could not
open a TCP connection to another (:func:`mpi_connect_failure`: "Your Open MPI job may now hang
or fail") and that has not finished :data:`CONNECT_GRACE_S` seconds later is stopped then, with
an error naming the failed connection, instead of at ``timeout_s``.
"""
from __future__ import annotations

import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Sequence

from .devices import YIELD_WHEN_IDLE_MCA, yield_when_idle_args
from .errors import ConfigError, DistributedError, RankConnectionError, SetupError
from .failures import ERROR_DIR_ENV, mpi_rank, read_failures, read_progress, report_rank_failure

#: Environment variables forwarded to every rank with ``-x`` (needed on remote hosts only;
#: local ranks inherit mpirun's environment anyway).
FORWARDED_ENV = ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", "PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV",
                 "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "HOROVOD_CYCLE_TIME",
                 "PARALLAX_NB_STEP_TIMEOUT_S")
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
#: Open MPI byte transports when every rank is on this machine: itself and shared memory.
LOCAL_BTL = "self,vader"
#: The folder of one :func:`run_on_ranks` call, in the temporary folder:
#: ``parallax-ranks-<launcher's process id>-<random>`` (:func:`make_workdir`).
WORKDIR_PREFIX = "parallax-ranks-"


def in_mpi_job() -> bool:
    """True inside a rank started by Open MPI (mpirun, horovodrun, ipyparallel MPI engines)."""
    return "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ


def _check_np(np: Any) -> int:
    if isinstance(np, bool) or not isinstance(np, int) or np < 1:
        raise ConfigError(f"number of ranks must be a whole number >= 1, got {np!r}",
                          hint="pass np=2 for two MPI ranks")
    return np


def mpirun_executable() -> str:
    path = shutil.which("mpirun") or shutil.which("mpiexec")
    if path is None:
        raise SetupError("mpirun was not found on PATH",
                         hint="install Open MPI (apt-get install openmpi-bin libopenmpi-dev) or run scripts/setup.sh")
    return path


def mpirun_command(np: int, argv: Sequence[str], hostfile: str | None = None,
                   extra_mca: dict[str, str] | None = None, mpi_args: Sequence[str] = ()) -> list[str]:
    """The ``mpirun`` command that starts ``argv`` on ``np`` ranks.

    Without ``hostfile`` all ranks run on this machine; with one, ranks are placed by the
    hostfile and the environment in :data:`FORWARDED_ENV` is exported to remote hosts.
    ``extra_mca`` adds ``--mca key value`` pairs (e.g. ``{"btl_tcp_if_include": "10.0.0.0/24"}``);
    ``mpi_args`` more arguments before the program (an emulated network's
    :meth:`~parallax_nb.netem.EmulatedCluster.transport_args`).

    All ranks on this machine: their bytes move through shared memory (``--mca btl
    self,vader``, as the cluster's engines do), so no rank opens Open MPI's TCP transport,
    which listens on every interface (0.0.0.0 and ::). A ``btl`` given in ``extra_mca`` or in
    the environment (``OMPI_MCA_btl``) wins. mpirun itself (its PMIx server, not a rank)
    still listens on a TCP port of every interface: neither ``oob_tcp_if_include=lo`` nor
    ``PMIX_MCA_ptl_tcp_if_include=lo`` confines it under Open MPI 4.1.
    """
    np = _check_np(np)
    if not argv:
        raise ConfigError("mpirun_command needs a program to run (argv is empty)")
    cmd = [mpirun_executable(), "-np", str(np), "--oversubscribe", "--bind-to", "none",
           "--tag-output"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if hostfile is not None:
        if not os.path.exists(hostfile):
            raise ConfigError(f"hostfile {hostfile!r} does not exist", hint="write one host per line: 'host slots=N'")
        cmd += ["--hostfile", os.fspath(hostfile)]
    mca = dict(extra_mca or {})
    if hostfile is None and "btl" not in mca and "OMPI_MCA_btl" not in os.environ:
        mca["btl"] = LOCAL_BTL
    for key, value in mca.items():
        cmd += ["--mca", str(key), str(value)]
    if hostfile is None and YIELD_WHEN_IDLE_MCA not in mca:
        cmd += yield_when_idle_args(np)   # ranks that share the cores wait without spinning
    for name in FORWARDED_ENV:
        if name in os.environ:
            cmd += ["-x", name]
    return cmd + [str(a) for a in mpi_args] + [str(a) for a in argv]


def rank_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus what ranks need: root permission for Open MPI, a quiet
    TensorFlow, and ``PYTHONPATH`` = this interpreter's ``sys.path`` so that functions pickled
    by reference (module-level functions of tests or notebooks' modules) import on the ranks."""
    env = dict(os.environ)
    env.update(ROOT_ENV)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    if os.getcwd() not in paths:
        paths.insert(0, os.getcwd())
    existing = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(paths + ([existing] if existing else []))
    env.update(extra or {})
    return env


class OutputPump(threading.Thread):
    """Reads a child's output so it never blocks on a full pipe; keeps it all, and with
    ``echo`` copies it to ``sink`` (default stderr) as it comes. ``watch``: phrases whose
    first appearance in a line is timed (``seen``: phrase -> ``time.monotonic()``)."""

    def __init__(self, stream, echo: bool, sink=None, watch: Sequence[str] = ()):
        super().__init__(daemon=True)
        self.stream, self.echo, self.sink, self.chunks = stream, echo, sink, []
        self.watch, self.seen = tuple(watch), {}

    def run(self):
        for line in iter(self.stream.readline, b""):
            text = line.decode("utf-8", "replace")
            self.chunks.append(text)
            for phrase in self.watch:
                if phrase not in self.seen and phrase in text:
                    self.seen[phrase] = time.monotonic()
            if self.echo:
                sink = self.sink or sys.stderr
                sink.write(text)
                sink.flush()

    @property
    def text(self) -> str:
        return "".join(self.chunks)


#: Open MPI's warning (btl/tcp) when a rank could not open a TCP connection to another rank.
#: The job "may now hang or fail"; seen here once, between emulated machines on a loaded host.
MPI_CONNECT_WARNING = "Open MPI failed to TCP connect to a peer MPI process"
#: How long a job may go on after :data:`MPI_CONNECT_WARNING` before :func:`run_on_ranks` stops
#: it (the job seen here hung until its timeout). A job that does go on, and has not finished a
#: minute later, is stopped too: what it measures or trains ran over a connection that failed.
CONNECT_GRACE_S = 60.0
# a field line of that warning, as Open MPI's help system prints it, or as a rank's own output
# tagged by mpirun ("[1,0]<stdout>:")
_CONNECT_FIELDS = re.compile(r"^(?:\[\d+,\d+\]<\w+>:)?\s*(Local host|Message|Error):\s*(.+?)\s*$", re.M)


def mpi_connect_failure(output: str) -> str | None:
    """What Open MPI said of a failed TCP connection between ranks, if ``output`` (mpirun's)
    has its warning: ``"on pxnb0: connect() to 10.213.1.3:1024 failed: Operation now in
    progress (115)"``; None without one."""
    at = (output or "").find(MPI_CONNECT_WARNING)
    if at < 0:
        return None
    fields = {}
    for name, value in _CONNECT_FIELDS.findall(output[at:at + 2000]):
        fields.setdefault(name, value)
    where = f"on {fields['Local host']}: " if "Local host" in fields else ""
    what = ": ".join(fields[k] for k in ("Message", "Error") if k in fields) or "no details given"
    return where + what


#: what to do about a job stopped after :data:`MPI_CONNECT_WARNING`
CONNECT_HINT = ("check that every machine reaches the others over TCP on the interface the job uses "
                "(btl_tcp_if_include); where a host was only loaded for a moment, run it again")


def connect_stopped(connect: str | None) -> str:
    """Why a job was stopped :data:`CONNECT_GRACE_S` after Open MPI's failed-connection warning,
    ``connect`` being what it said (:func:`mpi_connect_failure`)."""
    return (f"Open MPI could not open a TCP connection between two of its ranks ({connect}), said the job may "
            f"now hang or fail, and {CONNECT_GRACE_S:g} s later it had not finished")


def connect_failure_note(output: str) -> str:
    """`` (Open MPI had reported a failed TCP connection ...: <what>)`` for a timeout's message
    when ``output`` has Open MPI's warning (:func:`mpi_connect_failure`), else ``""``."""
    connect = mpi_connect_failure(output)
    return f" (Open MPI had reported a failed TCP connection between two of its ranks: {connect})" if connect else ""


_MPI_EXIT = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
_MPI_EXIT_CODE = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]\s+Exit code:\s+(\d+)")


def mpi_exit_culprit(output: str) -> tuple[int, str | None, str] | None:
    """(rank, host or None, "killed by signal N (NAME)" / "exit code N") from Open MPI's
    report of the rank that ended first, if ``output`` (mpirun's) has one."""
    m = _MPI_EXIT.search(output or "")
    if not m:
        code = _MPI_EXIT_CODE.search(output or "")
        return (int(code.group(1)), None, f"exit code {code.group(2)}") if code else None
    number = int(m.group(3))
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = "?"
    return int(m.group(1)), m.group(2).rstrip("."), f"killed by signal {number} ({name})"


def rank_death_error(output: str, np: int, returncode: int) -> DistributedError | None:
    """The error naming the rank that died without a word (SIGKILL, a crash) by rank, host and
    signal or exit code, from mpirun's ``output`` when it says which (:func:`mpi_exit_culprit`);
    None otherwise. The command line and :func:`run_on_ranks` raise the same."""
    culprit = mpi_exit_culprit(output) if returncode != 0 else None
    if culprit is None:
        return None
    rank, host, how = culprit
    return DistributedError(f"rank {rank} of {np} on host {host or '?'} died: {how} (mpirun exited with status "
                            f"{returncode})",
                            hint="SIGKILL (9) often means out of memory: see `dmesg`; the other ranks were stopped")


#: resident memory of one idle rank (Python, TensorFlow, Horovod, MPI) before any model:
#: 517 MiB measured here (TensorFlow 2.18.1, Horovod 0.28.1), rounded up
RANK_BASE_BYTES = 600 * 2**20
#: more ranks than this per core is refused: each rank runs TensorFlow's thread pools
MAX_RANKS_PER_CORE = 4


def available_memory_bytes() -> int:
    """Memory this host can give new processes without swapping (MemAvailable on Linux)."""
    import psutil

    return int(psutil.virtual_memory().available)


def check_host_resources(np: int, peak_bytes_per_rank: int | None = None, force: bool = False) -> None:
    """Refuse ``np`` ranks on this host when they need more memory than is available
    (``np x (RANK_BASE_BYTES + peak)``, peak from the job's profile when known) or more than
    :data:`MAX_RANKS_PER_CORE` per core; with ``force``, only warn."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    per_rank = RANK_BASE_BYTES + int(peak_bytes_per_rank or 0)
    need, free = np * per_rank, available_memory_bytes()
    problems = []
    if need > free:
        source = "the profile's peak" if peak_bytes_per_rank else "no profile given: an idle rank's"
        problems.append(f"{np} ranks need about {need / 2**30:.1f} GiB ({per_rank / 2**20:.0f} MiB each, {source} "
                        f"memory) but this host has {free / 2**30:.1f} GiB available")
    if np > MAX_RANKS_PER_CORE * cores:
        problems.append(f"{np} ranks on {cores} cores is more than {MAX_RANKS_PER_CORE} per core")
    if not problems:
        return
    text = "; ".join(problems)
    if force:
        print(f"parallax_nb: warning: {text}; going on (--force)", file=sys.stderr, flush=True)
        return
    raise ConfigError(f"--np {np} does not fit this host: {text}",
                      hint=f"pass fewer ranks (at most {min(MAX_RANKS_PER_CORE * cores, free // per_rank)}"
                           " here), a --hostfile with more machines, or --force to start anyway")


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL) -> None:
    """Have Linux send ``sig`` to this process when the thread that started it dies.

    mpirun gets it from its launcher (SIGTERM, so it can stop its ranks) and every rank from
    mpirun or orted (SIGKILL): a launcher killed by SIGKILL, where no ``finally`` runs, then
    leaves no mpirun and no rank behind. A no-op off Linux.
    """
    if not sys.platform.startswith("linux"):
        return
    parent_pid = os.getppid() if parent_pid is None else parent_pid
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def start_mpirun(cmd: Sequence[str], **popen_kwargs) -> subprocess.Popen:
    """Start ``cmd`` (an mpirun command line) in its own process group, tied to this process:
    if this process dies, however it dies, mpirun gets SIGTERM and stops its ranks.

    Call it from the thread that will wait for the process (Linux ties the child to the
    thread that forked it).
    """
    launcher_pid = os.getpid()
    preexec = (lambda: die_with_parent(launcher_pid, signal.SIGTERM)) if sys.platform.startswith("linux") else None
    return subprocess.Popen(list(cmd), start_new_session=True, preexec_fn=preexec, **popen_kwargs)


def kill_process_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the process group ``proc`` leads, then SIGKILL what is left after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:
            # mpirun is gone; sweep any orphan still in its group
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def run_on_ranks(fn: Callable[..., Any], np: int, args: Sequence[Any] = (), kwargs: dict | None = None,
                 timeout_s: float = 600.0, hostfile: str | None = None, env: dict[str, str] | None = None,
                 echo: bool = False, mpi_args: Sequence[str] = (),
                 timeout_hint: str = "a rank may hang in a collective: pass step_timeout_s to train()",
                 stall_s: float | None = None) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on each of ``np`` MPI ranks; return the per-rank results.

    ``fn`` and its arguments travel with cloudpickle; results come back with pickle (use
    numpy arrays and plain values). Raises :class:`DistributedError` when a rank raises (its
    rank and traceback in the message), when mpirun fails, :data:`CONNECT_GRACE_S` after Open
    MPI reported a failed connection between ranks, or after ``timeout_s`` seconds (with
    ``timeout_hint``, what the caller's user can do about it); every process started is
    killed. ``hostfile`` and ``mpi_args`` as in :func:`mpirun_command`; ``env``: variables
    for the ranks besides this process's environment (exported to the hosts of a hostfile too).
    ``stall_s``: where ``fn`` reports its progress (:func:`~parallax_nb.failures.report_progress`),
    a job none of whose ranks reported any for that long is stopped as hung, its error naming
    each rank's last report (before the first report, and where the ranks' reports cannot
    reach this host's folder, only ``timeout_s`` applies).
    """
    import cloudpickle

    np = _check_np(np)
    if not callable(fn):
        raise ConfigError(f"run_on_ranks needs a function, got {type(fn).__name__}")
    workdir = make_workdir()
    try:
        payload = os.path.join(workdir, "payload.pkl")
        with open(payload, "wb") as f:
            cloudpickle.dump((fn, tuple(args), dict(kwargs or {})), f)
        # ranks on other hosts get only the variables named with -x: ``env``'s too
        forwarded = [a for k in (env or {}) if hostfile is not None and not (k in FORWARDED_ENV and k in os.environ)
                     for a in ("-x", k)]
        cmd = mpirun_command(np, [sys.executable, "-m", "parallax_nb.launch", "rank", payload, workdir],
                             hostfile=hostfile, mpi_args=[*forwarded, *mpi_args])
        proc = start_mpirun(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=rank_environment({**(env or {}), ERROR_DIR_ENV: workdir}))
        pump = OutputPump(proc.stdout, echo, watch=(MPI_CONNECT_WARNING,))
        pump.start()
        try:
            stopped = _wait(proc, pump, timeout_s, workdir if stall_s else None, stall_s)
        finally:
            kill_process_group(proc)
            pump.join(timeout=5)
        output = pump.text
        failures = read_failures(workdir)
        if failures:
            rank, _, text = failures[0]
            others = f" (ranks that also failed: {[r for r, _, _ in failures[1:]]})" if len(failures) > 1 else ""
            raise DistributedError(f"rank {rank} of {np} failed{others}:\n{text.rstrip()}",
                                   hint="the traceback above is from that rank; the other ranks were stopped")
        if stopped == "connect":
            raise RankConnectionError(f"{np}-rank job stopped: {connect_stopped(mpi_connect_failure(output))}; "
                                      f"last output:\n{_tail(output)}", hint=CONNECT_HINT)
        if stopped == "stall":
            raise DistributedError(f"{np}-rank job made no progress for {stall_s:g} s and was stopped; the ranks' "
                                   f"last steps: {progress_text(read_progress(workdir))}; last output:\n"
                                   f"{_tail(output)}", hint=timeout_hint)
        if stopped == "timeout":
            note = connect_failure_note(output)
            raise (RankConnectionError if note else DistributedError)(
                f"{np}-rank job did not finish within {timeout_s:g} s and was killed{note}; last output:\n"
                f"{_tail(output)}", hint=timeout_hint)
        died = rank_death_error(output, np, proc.returncode)
        if died is not None:   # a rank that died without a word (SIGKILL, a crash): as the CLI names it
            raise died
        results = []
        for rank in range(np):
            path = os.path.join(workdir, f"result-{rank}.pkl")
            if not os.path.exists(path):
                raise DistributedError(f"rank {rank} of {np} left no result (mpirun exit status "
                                       f"{proc.returncode}); output:\n{_tail(output)}")
            with open(path, "rb") as f:
                results.append(pickle.load(f))
        if proc.returncode != 0:
            raise DistributedError(f"mpirun exited with status {proc.returncode}; output:\n{_tail(output)}")
        return results
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def make_workdir(prefix: str = WORKDIR_PREFIX) -> str:
    """A new private folder ``<prefix><this process's id>-<random>`` in the temporary folder,
    after removing those of ``prefix`` that processes no longer running left there
    (:func:`remove_left_workdirs`)."""
    remove_left_workdirs(prefix=prefix)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")


def remove_left_workdirs(directory: str | None = None, prefix: str = WORKDIR_PREFIX) -> list[str]:
    """Remove the folders :func:`make_workdir` made for ``prefix`` whose maker is no longer
    running (in ``directory``, the temporary folder by default) and return their paths. A
    process that was killed (SIGKILL, a notebook's kernel restarted while it calibrated or
    ran) ran no ``finally``, and its folder (for :func:`run_on_ranks`, the pickled function
    and arguments) stayed behind. Only this user's folders are touched; a maker's process id
    taken again by a process started after the folder last changed counts as ended."""
    import psutil

    directory = directory or tempfile.gettempdir()
    pattern = re.compile(rf"^{re.escape(prefix)}(\d+)-")
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry.name)
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if not entry.is_dir(follow_symlinks=False) or info.st_uid != os.getuid():
                continue
            if psutil.Process(int(m.group(1))).create_time() <= info.st_mtime:
                continue   # its launcher still runs
        except psutil.NoSuchProcess:
            pass
        except (OSError, psutil.Error):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


def _wait(proc: subprocess.Popen, pump: OutputPump, timeout_s: float, progress_dir: str | None = None,
          stall_s: float | None = None) -> str | None:
    """Wait for ``proc``: None when it ended, "connect" when it had not
    :data:`CONNECT_GRACE_S` after Open MPI's failed-connection warning, "stall" when the ranks'
    newest progress report in ``progress_dir`` is ``stall_s`` old, "timeout" at ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            return None
        now = time.monotonic()
        seen = pump.seen.get(MPI_CONNECT_WARNING)
        if seen is not None and now - seen >= CONNECT_GRACE_S:
            return "connect"
        if now >= deadline:
            return "timeout"
        if progress_dir is not None and progress_stalled(read_progress(progress_dir), stall_s):
            return "stall"
        try:
            proc.wait(timeout=min(0.5, deadline - now))
            return None
        except subprocess.TimeoutExpired:
            continue


def progress_stalled(reports: dict, stall_s: float) -> bool:
    """Whether the newest of the ranks' progress reports (:func:`read_progress`) is ``stall_s``
    old; False before the first."""
    return bool(reports) and time.time() - max(t for t, _ in reports.values()) >= stall_s


def progress_text(reports: dict) -> str:
    """``rank 0: timing alltoall/cross at 4 MiB (95 s ago); rank 1: ...`` of :func:`read_progress`."""
    now = time.time()
    return "; ".join(f"rank {rank}: {text} ({now - t:.0f} s ago)" for rank, (t, text) in sorted(reports.items())) \
        or "none reported"


def _rank_main(payload: str, out_dir: str) -> None:
    """Body of each rank started by :func:`run_on_ranks`; never returns."""
    die_with_parent()
    rank = mpi_rank()
    try:
        # The rank ends with os._exit, so what TensorFlow writes to temporary files (AutoGraph's
        # generated modules) is never cleaned up: keep it in out_dir, which the parent removes.
        tempfile.tempdir = os.path.join(out_dir, f"tmp-{rank}")
        os.makedirs(tempfile.tempdir, exist_ok=True)
        import cloudpickle  # noqa: F401  (functions pickled by value need it to load)

        with open(payload, "rb") as f:
            fn, args, kwargs = pickle.load(f)
        result = fn(*args, **kwargs)
        tmp = os.path.join(out_dir, f".result-{rank}.pkl")
        with open(tmp, "wb") as f:
            pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, os.path.join(out_dir, f"result-{rank}.pkl"))
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        report_rank_failure(exc, out_dir)
        os._exit(1)
    from .runtime.context import shutdown

    shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "rank":
        _rank_main(sys.argv[2], sys.argv[3])
    print("usage: python -m parallax_nb.launch rank PAYLOAD OUT_DIR (started by run_on_ranks)", file=sys.stderr)
    sys.exit(2)
