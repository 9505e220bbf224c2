"""Gradient exchange of one rank, inside the train step (DESIGN.md §5): each variable's
gradients go to the exchange of its (method, kind) (:mod:`.exchanges`).

An AR variable goes by its gradient: an ``IndexedSlices`` gradient is allgathered, a dense one
is allreduced, whatever the profile called it. A PS variable goes by its kind:
sparse when the model reads it through ``embedding_lookup`` (then its rows are served by the
lookups), dense otherwise.

With local aggregation (a :class:`~.hierarchical.Hierarchy`: G ranks per machine, the plan's
``local_aggregation`` on) the exchanges combine a machine's gradients first where that saves
link bytes (see each exchange).

In an asynchronous run (the plan's ``sync`` False) every variable is PS and goes to the
exchanges of ``(ASYNC_PS, kind)`` (:mod:`.exchanges.async_pull_push`): the step issues no
collective for them, and the trainer pushes their gradients after it (:meth:`GradientExchange.push`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import tensorflow as tf

from ..types import ASYNC_PS, Collective, Kind, Method
from .accounting import ByteLedger
from .exchanges import EXCHANGES, Wire
from .hierarchical import Hierarchy
from .sharded import ShardedVariable
from .topology import Topology


@dataclass
class VariableSync:
    """How one trainable variable is synchronised on this rank.

    ``variable`` is the model's Keras variable; ``shard`` the owned partitions of a PS
    variable (None for AR). ``routed``: the model reads it through ``embedding_lookup``
    (only then can PS serve it sparsely). ``asynchronous``: a PS variable of an asynchronous
    run (exchanged under the key ``(ASYNC_PS, kind)``).
    """

    name: str
    variable: object
    method: Method
    kind: Kind
    partitions: int
    shard: ShardedVariable | None = None
    routed: bool = False
    asynchronous: bool = False

    @property
    def key(self) -> tuple:
        """This variable's key in the method tables (an AR variable's kind is its gradient's: see
        :meth:`GradientExchange.exchange`)."""
        return (ASYNC_PS if self.asynchronous else self.method), self.kind

    @property
    def ps_sparse(self) -> bool:
        return self.method is Method.PS and self.kind is Kind.SPARSE

    @property
    def ps_dense(self) -> bool:
        return self.method is Method.PS and self.kind is Kind.DENSE

    @property
    def tape_variables(self) -> list:
        """What the tape differentiates: the owned partitions of a PS sparse variable (the
        model variable itself is never read), the model variable otherwise."""
        return self.shard.tape_variables if self.ps_sparse else [self.variable]

    @property
    def optimizer_variables(self) -> list:
        """What the optimizer updates on this rank: owned partitions for PS, else the variable."""
        return list(self.shard.parts) if self.method is Method.PS else [self.variable]

    @property
    def size_bytes(self) -> int:
        return int(math.prod(self.variable.shape)) * tf.as_dtype(self.variable.dtype).size


class GradientExchange:
    """Turns this rank's local gradients into the (grad, variable) pairs its optimizer applies,
    and pulls PS dense values after the update. Call both inside the traced train step.
    ``exchanges[(method, kind)]``: this rank's exchange of each key of :data:`.EXCHANGES`."""

    def __init__(self, syncs: list[VariableSync], ranks: int, rank: int, ledger: ByteLedger,
                 topology: Topology | None = None, hierarchy: Hierarchy | None = None, server=None):
        self.syncs = syncs
        self.wire = Wire(ranks, rank, ledger, topology or Topology.blocks(ranks, 1, "one machine per rank"), hierarchy,
                         server)
        self.exchanges = {key: cls(self.wire, [s for s in syncs if s.key == key])
                          for key, cls in EXCHANGES.items()}

    @property
    def router(self):
        """The lookup router of the PS sparse variables (install it during the forward pass):
        the asynchronous one when this run's sparse PS variables are asynchronous."""
        asynchronous = self.exchanges[(ASYNC_PS, Kind.SPARSE)]
        return asynchronous.router if asynchronous.syncs else self.exchanges[(Method.PS, Kind.SPARSE)].router

    def _key(self, sync: VariableSync, grads: list) -> tuple:
        if sync.method is Method.AR:
            return Method.AR, (Kind.SPARSE if isinstance(grads[0], tf.IndexedSlices) else Kind.DENSE)
        return sync.key

    def tape_sources(self, sync: VariableSync) -> list:
        """What the step differentiates for ``sync`` (call after the forward pass)."""
        return self.exchanges[sync.key].tape_sources(sync) if sync.method is Method.PS else sync.tape_variables

    def before_step(self) -> None:
        """In Python, before each step (asynchronous PS dense pulls its variables)."""
        for exchange in self.exchanges.values():
            exchange.before_step()

    def outgoing(self) -> list[tuple]:
        """(ids, gradient) tensors the step hands back for pushing, in the order of :meth:`push`."""
        return [(ids, grad) for e in self.exchanges.values() for _, ids, grad in e.outgoing]

    def outgoing_names(self) -> list[str]:
        """The variable of each of :meth:`outgoing`'s entries."""
        return [name for e in self.exchanges.values() for name, _, _ in e.outgoing]

    def push(self, values: list[tuple]) -> None:
        """Push the step's gradients (:meth:`outgoing`, evaluated) to their owners (asynchronous PS)."""
        self.wire.server.push_many([(name, ids, grad) for name, (ids, grad) in zip(self.outgoing_names(), values)])

    def checked_gradients(self, grads_by_sync: list[list]) -> tuple[list, list]:
        """What the step's health flags check (:func:`..guards.local_health`): every local
        gradient but those of the synchronous PS sparse variables, whose partitions' gradients
        are the owners' sums after the backward alltoall; for those, whether the row gradients
        this rank sent were finite (:attr:`.exchanges.sparse_ps.ShardedLookupRouter.sent_finite`).
        So the collective that carries the flags does not wait for that alltoall. One rank sends
        no row gradient (its lookups read its own partitions): every gradient is checked."""
        key = (Method.PS, Kind.SPARSE)
        if self.wire.ranks == 1:
            return [g for gs in grads_by_sync for g in gs], []
        grads = [g for sync, gs in zip(self.syncs, grads_by_sync) if sync.key != key for g in gs]
        return grads, list(self.exchanges[key].router.sent_finite)

    def exchange(self, grads_by_sync: list[list], carried=None) -> tuple[list[tuple], "tf.Tensor | None"]:
        """(grad, variable) pairs for the optimizer, and ``carried`` averaged over the ranks when
        it could ride along with the dense allreduce (None when there was none to ride)."""
        items: dict[tuple, list] = {key: [] for key in self.exchanges}
        for sync, grads in zip(self.syncs, grads_by_sync):
            items[self._key(sync, grads)].append((sync, grads))
        pairs, reduced = [], None
        for key, exchange in self.exchanges.items():
            exchange.served = [sync.name for sync, _ in items[key]]
            got, mean = exchange.gradients(items[key], carried if reduced is None else None)
            pairs.extend(got)
            reduced = reduced if mean is None else mean
        return pairs, reduced

    def pull_dense(self) -> None:
        """Every rank's full copy of each PS dense variable := the owners' fresh partitions."""
        for exchange in self.exchanges.values():
            exchange.pull()

    def collectives(self) -> dict[tuple[Method, Kind], list[Collective]]:
        """What each exchange issued per step in the last trace: nothing on one rank, where every
        exchange keeps its gradients (the cost model's one-rank step)."""
        if self.wire.ranks == 1:
            return {key: [] for key in self.exchanges}
        return {key: exchange.collectives() for key, exchange in self.exchanges.items()}
