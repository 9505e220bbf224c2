"""What every exchange of one rank shares: its place in the run and the byte ledger.

Bytes are counted from the tensors an exchange hands to Horovod (:func:`handed_bytes`:
``tf.size(t) * itemsize``, or the split sizes of an alltoall) and turned into bytes on the
wire by the algorithm's factor (:mod:`..accounting`); only traffic with ranks on other
machines counts (:mod:`..topology`).
"""
from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from ...types import Collective
from ..accounting import ByteLedger
from ..topology import Topology


def handed_bytes(tensor) -> tf.Tensor:
    """Bytes of ``tensor`` as handed to a collective (float64 scalar, read from the tensor)."""
    return tf.cast(tf.size(tensor), tf.float64) * tensor.dtype.size


@dataclass
class Wire:
    """One rank's view of the run for its exchanges: ``ranks`` W, ``rank``, the ledger the
    step's bytes go to, the machines (``topology``) and the two-level collectives of local
    aggregation (``hierarchy``, None when off); ``server``: this rank's
    :class:`~..async_ps.AsyncPS` in an asynchronous run (None when synchronous)."""

    ranks: int
    rank: int
    ledger: ByteLedger
    topology: Topology
    hierarchy: object = None
    server: object = None

    def __post_init__(self):
        import horovod.tensorflow as hvd

        self.hvd = hvd
        self.remote = self.topology.remote(self.rank)
        self.remote_share = self.topology.remote_share(self.rank)


class Exchange:
    """One (method, kind) of synchronisation for the variables ``syncs`` of this rank.

    ``gradients(items, carried)`` turns ``[(sync, grads)]`` into the (grad, variable) pairs
    the optimizer applies; ``carried`` is a small vector (the loss and health flags) that may
    ride this exchange's collective, returned averaged (or None when it did not ride).
    ``pull()`` runs after the optimizer update; ``collectives()`` lists what one step issues
    for ``served``, the variables it exchanged in the last trace. ``tape_sources(sync)``: what
    the step differentiates for ``sync``; ``before_step()`` runs in Python before each step and
    ``outgoing`` lists the (name, ids, gradient) the trainer pushes after it (asynchronous PS).
    """

    outgoing: list = []

    def __init__(self, wire: Wire, syncs: list):
        self.wire = wire
        self.syncs = syncs
        self.served: list[str] = []

    def gradients(self, items: list[tuple], carried=None) -> tuple[list[tuple], "tf.Tensor | None"]:
        raise NotImplementedError

    def pull(self) -> None:
        """Nothing to pull after the update (only PS dense keeps full copies to refresh)."""

    def tape_sources(self, sync) -> list:
        return sync.tape_variables

    def before_step(self) -> None:
        """Nothing to do before the step (asynchronous PS dense pulls its variables here)."""

    def collectives(self) -> list[Collective]:
        raise NotImplementedError
