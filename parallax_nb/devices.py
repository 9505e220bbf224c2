"""Which GPU this process trains on: one GPU per rank, chosen before TensorFlow starts.

By default TensorFlow maps every visible GPU into the process and reserves almost all of each
one's memory. With G ranks on a host that each see all of its GPUs, the first rank takes every
GPU's memory and the others fail or run out of memory, and every rank computes on GPU 0.
Horovod's documented remedy, applied here: after ``hvd.init()`` and before any TensorFlow op,
each rank makes visible only the GPU of its local rank and lets its memory grow on demand
(both can only be set before TensorFlow's runtime starts in the process).

- :func:`gpu_for_rank` is the choice, a pure function (no TensorFlow): local rank ``i`` of
  ``L`` ranks on a host with ``G >= L`` GPUs uses GPU ``i``; ``G = 0`` (a CPU host) means no
  GPU and nothing is changed; ``0 < G < L`` is an error naming the host, the GPUs and the ranks.
- :func:`place_process` applies it through ``tf.config`` once per process (an ipyparallel
  engine trains many times in one process) and keeps the result for :func:`current_placement`.

Called from :func:`parallax_nb.runtime.context.horovod` right after ``hvd.init()`` (every
rank of ``Trainer``, ``python -m parallax_nb run`` and the notebook's engines), and by the
profiler, which measures on the GPU a rank would train on and records it.

Which core, when a host's ranks are at least as many as its cores. Left to the scheduler,
ranks that share cores migrate between them and their thread pools contend: 8 ranks of an
emulated cluster (:mod:`parallax_nb.netem`, every machine on this host) ran the LM's HYBRID
step for a whole launch at one of two speeds, the slow one about half the fast one; 2 ranks on
2 cores ran the tiny LM at half to two thirds of the steps per second they run bound, plain
Horovod and parallax_nb alike (benchmarks/README.md).
Bound, local rank ``r`` of ``L >= C`` ranks on the ``r mod C``-th of the ``C`` cores it may use,
every launch ran at the fast speed. Which ranks share the host: an emulated cluster's launch
says all of them do (:data:`SHARED_HOST_ENV`; Horovod sees them as machines of their own),
otherwise Horovod's local ranks. :func:`core_for_rank` is the choice,
:func:`bind_rank` applies it once Horovod has started (binding earlier hung launches inside
``hvd.init()``). Fewer ranks than cores are left to the scheduler (each rank's TensorFlow
spreads its threads over the cores), and so is every rank when :data:`BIND_ENV` is ``"0"``.
A rank that its launcher already bound (``mpirun``'s own ``--bind-to core``) may use one core,
its own, and stays there.

Bound ranks also wait in MPI without spinning: a rank's core is its TensorFlow threads' too,
and Open MPI busy-polls a waiting collective unless told to yield (it yields by itself only on
a host it knows oversubscribed). On 2 ranks on 2 cores, bound, the tiny LM's HYBRID step took
6.3-9.3 ms spinning and 3.0-4.3 ms yielding, plain Horovod's 3.5-6.7 and 2.0-4.7 ms, over five
alternating launches of each (benchmarks/README.md). :func:`yield_when_idle_args` gives the
``mpirun`` argument for the launches parallax_nb starts on one host;
:func:`yield_when_idle_default` sets it in a rank's own environment before MPI starts, for
launches of the user's own ``mpirun``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from .errors import SetupError

#: ``"1"`` in a rank's environment when every rank of its launch runs on this one host
#: (an emulated cluster's launch sets it: ``netem.EmulatedCluster.transport_args``)
SHARED_HOST_ENV = "PARALLAX_SHARED_HOST"

#: ``"0"`` in a rank's environment leaves its threads to the scheduler (:func:`bind_rank`)
BIND_ENV = "PARALLAX_BIND_CORES"

PER_HOST_HINT = ("start at most {gpus} rank(s) per host (a hostfile with `slots={gpus}`, or "
                 "`mpirun --map-by ppr:{gpus}:node`), or make more of the host's GPUs visible to every rank "
                 "(CUDA_VISIBLE_DEVICES must list all of them: parallax_nb picks each rank's GPU itself)")


def gpu_for_rank(local_rank: int, local_size: int, gpus: Sequence[str], host: str) -> int | None:
    """Index into ``gpus`` of the GPU that local rank ``local_rank`` of ``local_size`` uses on ``host``.

    ``None`` when ``gpus`` is empty (a CPU host: TensorFlow runs on the CPU, unchanged). With more
    GPUs than ranks the first ``local_size`` GPUs are used, one each. Raises :class:`SetupError`
    when the host has fewer GPUs than ranks: two ranks on one GPU would each reserve its memory.
    """
    for name, value, minimum in (("local_size", local_size, 1), ("local_rank", local_rank, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise SetupError(f"{name} must be a whole number >= {minimum}, got {value!r} on host {host!r}")
    if local_rank >= local_size:
        raise SetupError(f"local rank {local_rank} is outside the {local_size} rank(s) of host {host!r}")
    if not gpus:
        return None
    if len(gpus) < local_size:
        raise SetupError(
            f"host {host!r} runs {local_size} ranks (local ranks 0..{local_size - 1}) but has only {len(gpus)} "
            f"GPU(s) visible ({', '.join(gpus)}): parallax_nb gives every rank its own GPU",
            hint=PER_HOST_HINT.format(gpus=len(gpus)))
    return local_rank


@dataclass(frozen=True)
class DevicePlacement:
    """Where this process computes. ``gpu`` is the physical GPU's name (e.g.
    ``/physical_device:GPU:3``) or ``None`` on a CPU host; ``gpus_found`` are the host's GPUs as
    TensorFlow listed them; ``applied``: visibility and memory growth were set by parallax_nb
    (False when TensorFlow had started before, and its own choice was kept)."""

    host: str
    local_rank: int
    local_size: int
    gpus_found: tuple[str, ...]
    gpu: str | None
    applied: bool

    @property
    def label(self) -> str:
        """``GPU /physical_device:GPU:3 (local rank 3 of 4, 4 GPUs on host h)``, or ``CPU``."""
        if self.gpu is None:
            return "CPU"
        return (f"GPU {self.gpu} (local rank {self.local_rank} of {self.local_size}, "
                f"{len(self.gpus_found)} GPUs on host {self.host})")


class ProcessPlacer:
    """Applies :func:`gpu_for_rank` to one process through ``config`` (``tf.config``, or a stand-in
    that simulates GPUs in tests: no GPU exists on the machines this project is tested on)."""

    def __init__(self, config):
        self.config = config
        self.current: DevicePlacement | None = None

    def place(self, local_rank: int, local_size: int, host: str) -> DevicePlacement:
        devices = list(self.config.list_physical_devices("GPU"))
        names = tuple(d.name for d in devices)
        index = gpu_for_rank(local_rank, local_size, names, host)
        wanted = None if index is None else names[index]
        if self.current is not None:
            return self._again(wanted, local_rank, local_size, host)
        applied = False
        if index is not None:
            try:
                self.config.experimental.set_memory_growth(devices[index], True)
                self.config.set_visible_devices([devices[index]], "GPU")
                applied = True
            except RuntimeError:  # TensorFlow's runtime started already: visibility is fixed now
                self._check_started(wanted, local_size, host)
        gpu = wanted if applied or index is None else self._first_visible()
        self.current = DevicePlacement(host, local_rank, local_size, names, gpu, applied)
        return self.current

    def _first_visible(self) -> str | None:
        """The GPU TensorFlow computes on when nothing is placed: the first visible one."""
        visible = [d.name for d in self.config.get_visible_devices("GPU")]
        return visible[0] if visible else None

    def _check_started(self, wanted: str, local_size: int, host: str) -> None:
        visible = [d.name for d in self.config.get_visible_devices("GPU")]
        if local_size > 1 and visible != [wanted]:
            raise SetupError(
                f"TensorFlow started on this process (host {host!r}) before parallax_nb could give it its own GPU: "
                f"it sees {', '.join(visible) or 'no GPU'} instead of {wanted} alone, and with {local_size} ranks on "
                "the host every rank would reserve every GPU's memory",
                hint="run no TensorFlow code on the engines before training (restart them: "
                     "`%parallax cluster stop`, then start)")

    def _again(self, wanted: str | None, local_rank: int, local_size: int, host: str) -> DevicePlacement:
        """A later call in a process already placed (another run on an engine, the profiler on a
        rank): visibility cannot change, so it must already be right."""
        current = self.current
        if local_size > 1 and wanted is not None and current.gpu != wanted:
            raise SetupError(
                f"this process on host {host!r} already computes on {current.gpu or 'the CPU'}, but as local rank "
                f"{local_rank} of {local_size} it must use {wanted}; TensorFlow cannot change GPUs once started",
                hint="restart the engines (`%parallax cluster stop`, then start) and train before profiling on them")
        if local_size > 1:
            self.current = replace(current, local_rank=local_rank, local_size=local_size)
        return self.current


_placer: ProcessPlacer | None = None


def place_process(local_rank: int, local_size: int, host: str) -> DevicePlacement:
    """Give this process the GPU of ``local_rank`` of ``local_size`` on ``host`` (nothing on a CPU
    host), once; later calls check and return the placement made first."""
    global _placer
    if _placer is None:
        import tensorflow as tf

        _placer = ProcessPlacer(tf.config)
    return _placer.place(local_rank, local_size, host)


def current_placement() -> DevicePlacement | None:
    """The placement of this process, or ``None`` when nothing placed it yet."""
    return _placer.current if _placer is not None else None


def rank_cores() -> int:
    """The cores this process may use: one once :func:`bind_rank` bound it (what a calibration
    and a run record, ``rank_cores``)."""
    return len(os.sched_getaffinity(0))


def cores_are_shared(ranks: int, cores: int) -> bool:
    """``ranks`` on one host with ``cores`` cores share them: at least two ranks, at least as
    many as the cores."""
    return ranks >= 2 and ranks >= cores > 0


def core_for_rank(rank: int, ranks: int, cores: Sequence[int]) -> int | None:
    """The core rank ``rank`` of the ``ranks`` that share ``cores`` (the cores this process may
    use) is bound to: the ``rank mod C``-th when the ranks are at least as many as the cores,
    or None (one rank alone, or fewer ranks than cores: the scheduler is left to it)."""
    cores = sorted(cores)
    if not cores_are_shared(ranks, len(cores)):
        return None
    return cores[rank % len(cores)]


def whole_launch_shares_host(environ: Mapping[str, str]) -> bool:
    """Whether every rank of the launch shares this host's cores (an emulated cluster's launch
    says so: :data:`SHARED_HOST_ENV`), not only the ranks Horovod and MPI call local."""
    return environ.get(SHARED_HOST_ENV) == "1"


def ranks_on_this_host(environ: Mapping[str, str] | None = None) -> int:
    """Before MPI starts: the ranks of this launch on this host, as the launcher tells each rank
    (all of them where :func:`whole_launch_shares_host`); 0 when it does not."""
    environ = os.environ if environ is None else environ
    names = (("OMPI_COMM_WORLD_SIZE", "PMI_SIZE") if whole_launch_shares_host(environ)
             else ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"))
    for name in names:
        try:
            return int(environ[name])
        except (KeyError, ValueError):
            continue
    return 0


YIELD_WHEN_IDLE_MCA = "mpi_yield_when_idle"


def yield_when_idle_args(ranks: int, environ: Mapping[str, str] | None = None) -> list[str]:
    """``mpirun`` arguments that make ``ranks`` ranks on this host yield their core while they
    wait in MPI when they share its cores (module docstring); [] otherwise, or when
    :data:`BIND_ENV` is ``"0"``."""
    environ = os.environ if environ is None else environ
    if environ.get(BIND_ENV) == "0" or not cores_are_shared(ranks, len(os.sched_getaffinity(0))):
        return []
    return ["--mca", YIELD_WHEN_IDLE_MCA, "1"]


def yield_when_idle_default(environ=None) -> bool:
    """In a rank, before MPI starts: when the launch's ranks on this host share its cores, make
    Open MPI yield while waiting (``OMPI_MCA_mpi_yield_when_idle=1``) unless the launch set it
    either way. True when the setting is (now) 1."""
    environ = os.environ if environ is None else environ
    name = "OMPI_MCA_" + YIELD_WHEN_IDLE_MCA
    if name not in environ and yield_when_idle_args(ranks_on_this_host(environ), environ):
        environ[name] = "1"
    return environ.get(name) == "1"


def bind_rank(rank: int, ranks: int, local_rank: int, local_size: int,
              environ: Mapping[str, str] | None = None) -> int | None:
    """Bind every thread of this process (threads started later inherit it) to
    :func:`core_for_rank`'s core among the ranks that share this host: all ``ranks`` where
    :func:`whole_launch_shares_host`, else Horovod's ``local_size``. The core, or None
    when nothing was bound (also when :data:`BIND_ENV` is ``"0"``)."""
    environ = os.environ if environ is None else environ
    if environ.get(BIND_ENV) == "0":
        return None
    index, count = (rank, ranks) if whole_launch_shares_host(environ) else (local_rank, local_size)
    core = core_for_rank(index, count, os.sched_getaffinity(0))
    if core is not None:
        bind_threads(core)
    return core


def bind_threads(core: int) -> None:
    """Bind every thread of this process to ``core``; threads started later inherit it."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {core})
        except ProcessLookupError:   # a thread that ended meanwhile
            pass
