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

Which core, when the ranks of an emulated cluster outnumber this host's cores: the emulated
machines (:mod:`parallax_nb.netem`) all run on this host and share its cores, and their launch
says so (:data:`SHARED_HOST_ENV`). Left to the scheduler, 8 ranks on 2 cores ran the LM's
HYBRID step for a whole launch at one of two speeds, the slow one about half the fast one, and
plain Horovod's about 15 % slower than bound (benchmarks/README.md); with rank ``r`` bound to
the ``r mod C``-th core every launch ran at the fast one. :func:`core_for_rank` is that
choice, :func:`bind_shared_host_rank` applies it once Horovod has started (binding earlier hung
launches inside ``hvd.init()``). Ranks no more than the cores are left to the scheduler.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from .errors import SetupError

#: ``"1"`` in a rank's environment when every rank of its launch runs on this one host
#: (an emulated cluster's launch sets it: ``netem.EmulatedCluster.transport_args``)
SHARED_HOST_ENV = "PARALLAX_SHARED_HOST"

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


def core_for_rank(rank: int, ranks: int, cores: Sequence[int]) -> int | None:
    """The core rank ``rank`` of ``ranks`` is bound to when all of them share ``cores`` (the
    cores this process may use): the ``rank mod C``-th, or None when the ranks do not
    outnumber the cores (each can have one to itself; the scheduler is left to it)."""
    cores = sorted(cores)
    if ranks <= len(cores) or not cores:
        return None
    return cores[rank % len(cores)]


def bind_shared_host_rank(rank: int, ranks: int, environ: Mapping[str, str] | None = None) -> int | None:
    """Bind every thread of this process (threads started later inherit it) to
    :func:`core_for_rank`'s core when its launch says all ranks share this host
    (:data:`SHARED_HOST_ENV`); the core, or None when nothing was bound."""
    environ = os.environ if environ is None else environ
    if environ.get(SHARED_HOST_ENV) != "1":
        return None
    core = core_for_rank(rank, ranks, os.sched_getaffinity(0))
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
