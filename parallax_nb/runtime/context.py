"""Horovod, initialised once per process, and who this rank is.

Every collective of the runtime goes through Horovod (MPI controller). MPI itself is started
by mpi4py, at ``MPI_THREAD_MULTIPLE``, before Horovod: MPI cannot be initialised twice
(ipyparallel engines run many ``train`` calls in one process), and an MPI that Horovod did not
start is one Horovod's shutdown leaves running, so Horovod can be *parked*.

Parking (:func:`park_horovod`, :func:`resume_horovod`): while Horovod runs, its background
thread negotiates with every other rank once per cycle (1 ms when these figures were taken; 0.1
ms since, :func:`_init`), in blocking MPI collectives that spin while any rank is late.
Synchronous steps keep the ranks together, so that costs little; asynchronous workers are never
together, and the spinning took the cores the workers and the serving threads needed. Measured
on the emulated 2 x 2 cluster (4 ranks on 2 cores, LM small, asynchronous PS): one thread per
rank at 60-100 % of a core, and 50 to 1,600 ms a step that varied from run to run, against
32-42 ms in 3 of 3 runs with Horovod parked for the asynchronous steps. Parking is
``hvd.shutdown()`` after a barrier (a shutdown ends the Horovod operations of every rank, so
none may still be in one); resuming is ``hvd.init()`` again, about 1-3 ms each.

Engines do not park between tasks, although Horovod left running keeps negotiating while the
notebook is idle: after a calibration the 4 engines of an emulated 2 x 2 cluster each took
44-49 % of a core, doing nothing (2026-11-29). Parked after every run and calibration they
took 0-1 %, but resuming Horovod at the next task stalled it in 4 of 8 resumes there: an
engine stopped answering the controller's heartbeats and was dropped (3), or a 10-step run took
39 s instead of 4-7 s. The restarts of :func:`process_sets` are the same shutdown and init
(cause not found). The first run or calibration of several machines of several ranks on
engines makes one, for the machines' sets; a calibration made two more until it stopped timing
allreduce and allgather in a set per local index (it stalled in them once in a loop of five
calibrations on engines).

Process sets (:func:`process_sets`): the sets a run needs (the ranks of one machine, for
local aggregation) are given to ``hvd.init``, and Horovod is restarted (a barrier,
``hvd.shutdown()``, ``hvd.init()`` with the longer list) the first time a set is asked for. Horovod's dynamic sets
(``hvd.add_process_set``) are not used: with them, 4 ranks on 2 emulated machines hung in
about 1 of 20 launches while adding a machine's set (Horovod 0.28.1; one rank's background
loop back at its per-cycle allgather while the others were still in the new set's checks),
and their mode costs every cycle of Horovod's loop an allgather over all ranks. Sets keep
their place in the list, so a set keeps its Horovod id across restarts and parking, and
the ``tf.function`` steps that were traced with it stay valid.
"""
from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass

from ..errors import SetupError

_initialised = False
_parked = False      # park_horovod() ran, resume_horovod() not yet
_abandoned = False   # ... and the run that parked it ended in an error: resume on next use
_rank_info: "RankInfo | None" = None
# ranks -> hvd.ProcessSet, in the order Horovod was (re)started with them (module docstring)
_process_sets: dict[tuple[int, ...], object] = {}


@dataclass(frozen=True)
class RankInfo:
    """This process in the job: ``rank`` of ``size``, ``local_rank`` of ``local_size`` ranks on
    this host; ``machines`` = number of distinct hosts (``size / local_size`` when every host
    runs the same number of ranks)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    machines: int
    hostname: str


def horovod():
    """``horovod.tensorflow``, initialised, and this rank given its own GPU on a GPU host
    (:mod:`parallax_nb.devices`); a clear SetupError when it is missing or broken."""
    global _initialised
    try:
        import horovod.tensorflow as hvd
    except ImportError as e:
        raise SetupError(f"Horovod for TensorFlow cannot be imported: {e}",
                         hint="run scripts/setup.sh (builds horovod==0.28.1 against the installed TensorFlow)") from None
    if _parked and _abandoned:   # the run that parked it failed: every rank's next run starts here
        resume_horovod()
    if not _initialised:
        _start_mpi()
        _init(hvd)
        if not hvd.mpi_enabled():
            raise SetupError("Horovod was built without MPI support",
                             hint="rebuild with HOROVOD_WITH_MPI=1 (scripts/setup.sh does)")
        from ..devices import bind_rank, place_process

        place_process(hvd.local_rank(), hvd.local_size(), socket.gethostname())  # before any TensorFlow op
        bind_rank(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())
        _initialised = True
    return hvd


def _start_mpi() -> None:
    """MPI started by mpi4py at ``MPI_THREAD_MULTIPLE`` (the serving threads of the
    asynchronous PS call MPI beside the training thread), waiting without spinning where the
    ranks share this host's cores (:func:`parallax_nb.devices.yield_when_idle_default`), unless
    something started it already."""
    import mpi4py

    from ..devices import yield_when_idle_default

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.thread_level = "multiple"
        yield_when_idle_default()   # ranks that share the cores: MPI waits without spinning
    from mpi4py import MPI  # noqa: F401  (importing it initialises MPI)


def park_horovod() -> None:
    """Stop Horovod's background thread until :func:`resume_horovod` (module docstring).
    Collective: every rank, after its last Horovod operation before the parked stretch. The
    resume starts the same process sets again, under the same ids."""
    global _parked
    hvd = horovod()
    barrier("px_park")
    hvd.shutdown()
    _parked = True


def resume_horovod() -> None:
    """Start Horovod again after :func:`park_horovod` (collective: every rank); a no-op when
    it is not parked."""
    global _parked, _abandoned
    if not _parked:
        return
    import horovod.tensorflow as hvd

    _init(hvd)
    _parked = _abandoned = False


def abandon_park() -> None:
    """The run that parked Horovod ends in an error, without the collective resume (another
    rank may be dead): Horovod starts again at the next :func:`horovod` call, which every
    rank's next run makes first. Until then Horovod's operations raise."""
    global _abandoned
    _abandoned = _parked


def _init(hvd) -> None:
    """``hvd.init`` with the process sets of :data:`_process_sets`, in their order (static
    sets: see the module docstring), and Horovod's cycle time
    :data:`~parallax_nb.calibration.RUNTIME_HOROVOD_CYCLE_TIME_MS` where the environment sets
    none (a run records it with its settings, as a calibration does)."""
    from ..calibration import RUNTIME_HOROVOD_CYCLE_TIME_MS

    os.environ.pop("HOROVOD_DYNAMIC_PROCESS_SETS", None)   # static sets only
    if not os.environ.get("HOROVOD_CYCLE_TIME", "").strip():
        os.environ["HOROVOD_CYCLE_TIME"] = f"{RUNTIME_HOROVOD_CYCLE_TIME_MS:g}"
    hvd.init(process_sets=list(_process_sets.values()))


def _restart(hvd) -> None:
    """Start Horovod again with the sets of :data:`_process_sets` (collective: every rank).
    The barrier first: a shutdown ends the Horovod operations of every rank."""
    barrier("px_process_sets")
    hvd.shutdown()
    _init(hvd)


def process_sets(wanted: list[list[int]]) -> list:
    """The Horovod process set of each list of world ranks (ascending) in ``wanted``; the
    world's ranks are Horovod's global set.

    A collective: every rank of the job asks for the same sets in the same order, members or
    not (Horovod builds an MPI communicator per set). A set asked for the first time restarts
    Horovod (module docstring); ask for all the sets of one use in one call. Sets are kept
    for the life of the process: engines run many trainings."""
    hvd = horovod()
    world = tuple(range(hvd.size()))
    keys = [tuple(ranks) for ranks in wanted]
    new = [key for key in dict.fromkeys(keys) if key != world and key not in _process_sets]
    if new:
        for key in new:
            _process_sets[key] = hvd.ProcessSet(list(key))
        _restart(hvd)
    return [hvd.global_process_set if key == world else _process_sets[key] for key in keys]


def rank_info() -> RankInfo:
    """Who this rank is (the same for the life of the process; known while Horovod is parked)."""
    global _rank_info
    if _rank_info is None:
        hvd = horovod()
        _rank_info = RankInfo(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                              local_size=hvd.local_size(), cross_rank=hvd.cross_rank(), machines=hvd.cross_size(),
                              hostname=socket.gethostname())
    return _rank_info


def shutdown() -> None:
    """At the end of a rank: shut Horovod down if this process started it, then finalise MPI
    (mpi4py's exit hook would, but a rank that leaves with ``os._exit`` never runs it, and
    mpirun reports a rank that left MPI initialised as exiting improperly)."""
    global _initialised, _parked
    if _initialised:
        import horovod.tensorflow as hvd

        hvd.shutdown()
        _initialised = _parked = False
        _process_sets.clear()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()


def configure_threads() -> None:
    """Honour ``TF_NUM_INTRAOP_THREADS`` / ``TF_NUM_INTEROP_THREADS`` before TensorFlow starts
    its pools (several ranks share a few cores in tests)."""
    import tensorflow as tf

    for env, setter in (("TF_NUM_INTRAOP_THREADS", tf.config.threading.set_intra_op_parallelism_threads),
                        ("TF_NUM_INTEROP_THREADS", tf.config.threading.set_inter_op_parallelism_threads)):
        if os.environ.get(env):
            try:
                setter(int(os.environ[env]))
            except RuntimeError:
                pass  # TensorFlow already started; keep its pools


def barrier(tag: str) -> None:
    """Wait until every rank reaches this point (a one-number allreduce named ``tag``)."""
    import tensorflow as tf

    hvd = horovod()
    if hvd.size() > 1:
        hvd.allreduce(tf.constant(0.0), op=hvd.Sum, name=f"px_barrier_{tag}").numpy()


def clear_keras_session() -> None:
    """Forget Keras's global state, so a reused engine names a new run's variables as the first run did."""
    try:
        import keras
    except ImportError:
        return
    keras.backend.clear_session()
