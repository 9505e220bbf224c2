"""One GPU per rank (parallax_nb.devices).

The choice is a pure function, tested for every host of 1-8 GPUs with 1-8 ranks. Applying it
goes through ``tf.config``; no GPU exists on the machines these tests run on, so those tests
hand :class:`ProcessPlacer` a simulated ``tf.config`` of a host with G GPUs (the same calls
TensorFlow offers: list, set visible, memory growth, and the RuntimeError TensorFlow raises once
its runtime has started). Real TensorFlow on this CPU host is checked on every rank of a real
2-rank mpirun launch in tests/test_runtime.py.
"""
from __future__ import annotations

from collections import namedtuple

import pytest

from parallax_nb.devices import DevicePlacement, ProcessPlacer, gpu_for_rank
from parallax_nb.errors import SetupError

Device = namedtuple("Device", "name device_type")


def gpu_names(count: int) -> tuple[str, ...]:
    return tuple(f"/physical_device:GPU:{i}" for i in range(count))


@pytest.mark.parametrize("gpus", range(1, 9))
@pytest.mark.parametrize("local_size", range(1, 9))
def test_every_rank_gets_its_own_gpu_or_a_clear_error(gpus, local_size):
    names = gpu_names(gpus)
    if gpus >= local_size:
        chosen = [gpu_for_rank(r, local_size, names, "node7") for r in range(local_size)]
        assert chosen == list(range(local_size))  # distinct, all in range
        return
    for r in range(local_size):
        with pytest.raises(SetupError) as err:
            gpu_for_rank(r, local_size, names, "node7")
        text = str(err.value)
        assert "host 'node7'" in text and f"runs {local_size} ranks" in text
        assert f"local ranks 0..{local_size - 1}" in text and f"only {gpus} GPU(s)" in text
        assert all(n in text for n in names)
        assert f"at most {gpus} rank(s) per host" in err.value.hint


@pytest.mark.parametrize("local_size", range(1, 9))
def test_a_cpu_host_gets_no_gpu(local_size):
    assert all(gpu_for_rank(r, local_size, (), "cpu-host") is None for r in range(local_size))


@pytest.mark.parametrize("local_rank, local_size, fragment", [
    (2, 2, "local rank 2 is outside the 2 rank(s)"), (-1, 2, "local_rank must be a whole number >= 0"),
    (0, 0, "local_size must be a whole number >= 1"), (True, 2, "got True"), (0, 2.0, "got 2.0"),
])
def test_impossible_ranks_are_refused(local_rank, local_size, fragment):
    with pytest.raises(SetupError) as err:
        gpu_for_rank(local_rank, local_size, gpu_names(4), "h")
    assert fragment in str(err.value) and "host 'h'" in str(err.value)


class SimulatedConfig:
    """``tf.config``'s device calls on a host with ``gpus`` GPUs (no GPU here). ``started``: the
    TensorFlow runtime has started, so visibility and memory growth raise RuntimeError, as in TF."""

    def __init__(self, gpus: int, started: bool = False):
        self.physical = [Device(n, "GPU") for n in gpu_names(gpus)]
        self.visible = list(self.physical)
        self.growth: dict[str, bool] = {}
        self.started = started
        self.calls: list[str] = []
        self.experimental = self

    def list_physical_devices(self, kind):
        return list(self.physical) if kind == "GPU" else [Device("/physical_device:CPU:0", "CPU")]

    def get_visible_devices(self, kind):
        return list(self.visible)

    def set_visible_devices(self, devices, kind):
        self.calls.append("set_visible_devices")
        if self.started:
            raise RuntimeError("Visible devices cannot be modified after being initialized")
        self.visible = list(devices)

    def set_memory_growth(self, device, enable):
        self.calls.append("set_memory_growth")
        if self.started:
            raise RuntimeError("Physical devices cannot be modified after being initialized")
        self.growth[device.name] = enable


@pytest.mark.parametrize("gpus, local_size", [(1, 1), (4, 4), (6, 4), (8, 8)])
def test_each_rank_sees_only_its_gpu_with_memory_growth(gpus, local_size):
    for rank in range(local_size):
        config = SimulatedConfig(gpus)
        placement = ProcessPlacer(config).place(rank, local_size, "gpu-host")
        wanted = f"/physical_device:GPU:{rank}"
        assert [d.name for d in config.visible] == [wanted]
        assert config.growth == {wanted: True}
        assert placement == DevicePlacement("gpu-host", rank, local_size, gpu_names(gpus), wanted, applied=True)
        assert placement.label == f"GPU {wanted} (local rank {rank} of {local_size}, {gpus} GPUs on host gpu-host)"


def test_a_cpu_host_is_left_unchanged():
    config = SimulatedConfig(0)
    placement = ProcessPlacer(config).place(1, 2, "cpu-host")
    assert config.calls == [] and placement.gpu is None and not placement.applied and placement.label == "CPU"


def test_fewer_gpus_than_ranks_changes_nothing():
    config = SimulatedConfig(2)
    with pytest.raises(SetupError, match="host 'gpu-host' runs 4 ranks"):
        ProcessPlacer(config).place(3, 4, "gpu-host")
    assert config.calls == [] and len(config.visible) == 2


def test_started_tensorflow_is_an_error_only_when_ranks_share_the_host():
    alone = ProcessPlacer(SimulatedConfig(4, started=True)).place(0, 1, "h")
    assert alone.gpu == "/physical_device:GPU:0" and not alone.applied  # what TF computes on by default
    with pytest.raises(SetupError, match="before parallax_nb could give it its own GPU") as err:
        ProcessPlacer(SimulatedConfig(4, started=True)).place(1, 4, "h")
    assert "/physical_device:GPU:1 alone" in str(err.value) and "restart them" in err.value.hint


def test_a_process_is_placed_once():
    """An engine trains many times in one process; the profiler may run on a placed rank."""
    config = SimulatedConfig(4)
    placer = ProcessPlacer(config)
    first = placer.place(2, 4, "h")
    assert placer.place(2, 4, "h") == first
    assert placer.place(0, 1, "h") == first  # the profiler on this rank measures on the rank's GPU
    assert config.calls == ["set_memory_growth", "set_visible_devices"]
    with pytest.raises(SetupError, match="already computes on /physical_device:GPU:2, but as local rank 3"):
        placer.place(3, 4, "h")


def test_a_profiled_process_cannot_become_another_ranks_process():
    placer = ProcessPlacer(SimulatedConfig(4))
    assert placer.place(0, 1, "h").gpu == "/physical_device:GPU:0"
    assert placer.place(0, 4, "h").local_size == 4
    with pytest.raises(SetupError, match="must use /physical_device:GPU:1"):
        placer.place(1, 4, "h")


# ----------------------------------------------------------------------------- cores

def test_ranks_at_least_as_many_as_the_shared_cores_get_one_core_each_in_turn():
    from parallax_nb.devices import core_for_rank

    assert [core_for_rank(r, 8, [0, 1]) for r in range(8)] == [0, 1] * 4
    assert [core_for_rank(r, 4, {5, 2}) for r in range(4)] == [2, 5, 2, 5]   # the cores this process may use
    assert [core_for_rank(r, 3, [0, 1]) for r in range(3)] == [0, 1, 0]
    assert [core_for_rank(r, 2, [0, 1]) for r in range(2)] == [0, 1]          # as many: one core each
    assert [core_for_rank(r, 2, [0, 1, 2, 3]) for r in range(2)] == [None, None]   # fewer: left alone
    assert core_for_rank(0, 2, [3]) == 3       # a rank its launcher bound already stays on its core
    assert core_for_rank(0, 1, [0]) is None    # one rank alone
    assert core_for_rank(0, 1, [0, 1]) is None


BIND_PROGRAM = """
import json, os, sys, threading
from parallax_nb.devices import bind_rank
rank, ranks, local_rank, local_size = (int(a) for a in sys.argv[1:5])
env = dict(a.split("=") for a in sys.argv[5:])
before = sorted(os.sched_getaffinity(0))
core = bind_rank(rank, ranks, local_rank, local_size, env)
later = []
thread = threading.Thread(target=lambda: later.append(sorted(os.sched_getaffinity(0))))
thread.start()
thread.join()
print(json.dumps(dict(before=before, core=core, after=sorted(os.sched_getaffinity(0)), later=later[0])))
"""


@pytest.mark.parametrize("ranks, local, env, sharing", [
    ("C+1", (1, 1), ["PARALLAX_SHARED_HOST=1"], "ranks"),      # an emulated cluster: every rank on this host
    ("C", (1, 1), ["PARALLAX_SHARED_HOST=1"], "ranks"),
    ("C", (1, "C"), [], "local"),                              # one host: Horovod's local ranks
    ("2C", (1, "C+1"), ["PARALLAX_SHARED_HOST=0"], "local"),
    ("2C", (0, 1), [], None),                                  # one rank on each host: left alone
    ("C", (1, "C"), ["PARALLAX_BIND_CORES=0"], None),          # asked not to
    ("C+1", (1, 1), ["PARALLAX_SHARED_HOST=1", "PARALLAX_BIND_CORES=0"], None),
])
def test_a_rank_that_shares_the_cores_binds_itself_and_its_later_threads(ranks, local, env, sharing):
    """Real affinity, in a child process: rank 1 (local rank ``local[0]`` of ``local[1]``), and a
    thread it starts afterwards, are on the core ``core_for_rank`` names when the ranks that
    share this host (all of them in an emulated cluster's launch, else the local ones) are at
    least as many as its cores, and on all of them otherwise."""
    import json
    import os
    import subprocess
    import sys

    cores = sorted(os.sched_getaffinity(0))
    count = {"C": len(cores), "C+1": len(cores) + 1, "2C": 2 * len(cores)}
    ranks = count[ranks]
    local_rank, local_size = local[0], count.get(local[1], local[1])
    out = json.loads(subprocess.run([sys.executable, "-c", BIND_PROGRAM, "1", str(ranks), str(local_rank),
                                     str(local_size), *env], capture_output=True,
                                    text=True, timeout=60, check=True).stdout)
    assert out["before"] == cores
    index, sharing_ranks = {"ranks": (1, ranks), "local": (local_rank, local_size), None: (0, 0)}[sharing]
    if sharing_ranks >= max(2, len(cores)):
        core = cores[index % len(cores)]
        assert out["core"] == core and out["after"] == out["later"] == [core], out
    else:
        assert out["core"] is None and out["after"] == out["later"] == cores, out


def test_ranks_on_this_host_come_from_the_launchers_environment():
    from parallax_nb.devices import ranks_on_this_host

    assert ranks_on_this_host({"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}) == 2
    assert ranks_on_this_host({"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                               "PARALLAX_SHARED_HOST": "1"}) == 8     # an emulated cluster: every rank here
    assert ranks_on_this_host({"MPI_LOCALNRANKS": "3"}) == 3          # MPICH's name
    assert ranks_on_this_host({}) == 0                                 # not launched by MPI
    assert ranks_on_this_host({"OMPI_COMM_WORLD_LOCAL_SIZE": "two"}) == 0


@pytest.mark.parametrize("env, expected", [
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "C"}, "1"),                                       # share the cores
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_COMM_WORLD_SIZE": "C"}, None),         # one rank per host
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_COMM_WORLD_SIZE": "C", "PARALLAX_SHARED_HOST": "1"}, "1"),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "C", "OMPI_MCA_mpi_yield_when_idle": "0"}, "0"),  # the launch said so
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "C", "PARALLAX_BIND_CORES": "0"}, None),
    ({}, None),
])
def test_ranks_that_share_the_cores_wait_in_mpi_without_spinning(env, expected):
    import os

    from parallax_nb.devices import yield_when_idle_default

    cores = max(2, len(os.sched_getaffinity(0)))
    env = {k: str(cores) if v == "C" else v for k, v in env.items()}
    assert yield_when_idle_default(env) == (expected == "1")
    assert env.get("OMPI_MCA_mpi_yield_when_idle") == expected


def test_launches_on_this_host_that_share_the_cores_wait_without_spinning(tmp_path):
    import os

    from parallax_nb.launch import mpirun_command

    cores = len(os.sched_getaffinity(0))
    many = mpirun_command(max(2, cores), ["x"])
    assert many[many.index("mpi_yield_when_idle") + 1] == "1"
    assert "mpi_yield_when_idle" not in mpirun_command(1, ["x"])
    asked = mpirun_command(2 * cores, ["x"], extra_mca={"mpi_yield_when_idle": "0"})   # the caller's wins
    assert asked.count("mpi_yield_when_idle") == 1 and asked[asked.index("mpi_yield_when_idle") + 1] == "0"
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=2\n")
    assert "mpi_yield_when_idle" not in mpirun_command(4, ["x"], hostfile=str(hostfile))   # other hosts: their own
