"""Horovod, initialised once per process, and who this rank is.

Every collective of the runtime goes through Horovod (MPI controller). ``hvd.init()`` is
called at most once per process: MPI cannot be initialised twice, and ipyparallel engines
run many ``train`` calls in one process.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from ..errors import SetupError

_initialised = False
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
    if not _initialised:
        # "dynamic": process sets (a machine's ranks, one local index across machines) are
        # added once the run knows its machines (:func:`process_set`)
        hvd.init(process_sets="dynamic")
        if not hvd.mpi_enabled():
            raise SetupError("Horovod was built without MPI support",
                             hint="rebuild with HOROVOD_WITH_MPI=1 (scripts/setup.sh does)")
        from ..devices import place_process

        place_process(hvd.local_rank(), hvd.local_size(), socket.gethostname())  # before any TensorFlow op
        _initialised = True
    return hvd


def process_set(ranks: list[int]):
    """The Horovod process set of ``ranks`` (world ranks, ascending), added on first use.

    A collective: every rank of the job must ask for the same sets in the same order, members
    or not (Horovod builds an MPI communicator per set). Kept for the life of the process:
    engines run many trainings, and Horovod refuses a second set of the same ranks. The
    world's ranks are Horovod's global set."""
    hvd = horovod()
    key = tuple(ranks)
    if key == tuple(range(hvd.size())):
        return hvd.global_process_set
    if key not in _process_sets:
        _process_sets[key] = hvd.add_process_set(list(key))
    return _process_sets[key]


def remove_process_set(ranks: list[int]) -> None:
    """Remove the Horovod process set of ``ranks`` added by :func:`process_set` (a collective,
    like adding one); a no-op for a set never added. A set that stays costs every cycle of
    Horovod's loop its negotiation, for the life of the engines."""
    hvd = horovod()
    added = _process_sets.pop(tuple(ranks), None)
    if added is not None:
        hvd.remove_process_set(added)


def rank_info() -> RankInfo:
    hvd = horovod()
    return RankInfo(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), local_size=hvd.local_size(),
                    cross_rank=hvd.cross_rank(), machines=hvd.cross_size(), hostname=socket.gethostname())


def shutdown() -> None:
    """Shut Horovod down (finalising MPI) if this process started it; a no-op otherwise."""
    global _initialised
    if _initialised:
        import horovod.tensorflow as hvd

        hvd.shutdown()
        _initialised = False
        _process_sets.clear()
_process_sets: dict[tuple[int, ...], object] = {}


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
