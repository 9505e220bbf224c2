"""AR, sparse (``IndexedSlices``): duplicates summed first (unique rows), then every rank's rows
gathered, summed per row and divided by W.

Without local aggregation, every variable of one values dtype and row shape rides one
allgather over all W ranks a step, as rows of one table that carry their int64 ids
(:mod:`..grouped_rows`): one call where Horovod's allreduce of ``IndexedSlices`` issues two per
variable (values, indices), which its background loop fuses only when every rank has handed
them in the same cycle. With local aggregation, the two-level allgather of
:meth:`..hierarchical.Hierarchy.allgather_sparse` per variable; on one machine one gather for
every variable of one values dtype and row shape
(:meth:`..hierarchical.Hierarchy.gather_sparse_group`).

Bytes: the handed rows of this rank (``o``: values and 8-byte ids, read from the tensors) and
of everyone (``t``): an allgather sends ``(W - 1) o`` and receives ``t - o``, scaled by the
share of peers on other machines; a variable of a shared call is charged its own rows.
"""
from __future__ import annotations

import math

import tensorflow as tf

from ...types import Collective, Kind, Method
from ..accounting import allgather_bytes
from ..grouped_rows import gather_summed, owners
from ..tensor_ops import deduplicate, op_tag
from .base import Exchange


def group_of(variable) -> tuple[str, tuple[int, ...]]:
    """The call a variable's rows share with others' (flat, or with local aggregation on one
    machine): its values dtype and row shape (as the cost side's ``MethodCost.group``)."""
    return tf.as_dtype(variable.dtype).name, tuple(int(d) for d in variable.shape[1:])


class SparseAllgather(Exchange):
    method, kind = Method.AR, Kind.SPARSE

    def gradients(self, items, carried=None):
        present = [(sync, grads[0]) for sync, grads in items if grads[0] is not None]
        h = self.wire.hierarchy
        if self.wire.ranks == 1:
            return [(_rows(grad), sync.variable) for sync, grad in present], None
        if h is None:
            return self._grouped(present, self._allgather_group), None
        if h.N == 1:
            return self._grouped(present, self._machine_group), None
        return [(self._two_level(sync, grad), sync.variable) for sync, grad in present], None

    def _grouped(self, present: list[tuple], exchange) -> list[tuple]:
        """Every variable of one values dtype and row shape (:func:`group_of`) in one call of
        ``exchange`` (``(syncs, grads, tag) -> summed grads``)."""
        groups: dict = {}
        for sync, grad in present:
            groups.setdefault(group_of(sync.variable), []).append((sync, _rows(grad)))
        summed = {}
        for key, group in groups.items():
            tag = key[0] + "".join(f"_{d}" for d in key[1])
            syncs = [sync for sync, _ in group]
            for sync, grad in zip(syncs, exchange(syncs, [g for _, g in group], tag)):
                summed[sync.name] = grad
        return [(summed[sync.name], sync.variable) for sync, _ in present]

    def _allgather_group(self, syncs: list, grads: list[tf.IndexedSlices], tag: str) -> list[tf.IndexedSlices]:
        """One allgather over all W ranks of ``grads`` as one table's rows with their ids."""
        wire = self.wire
        summed, ids, table = gather_summed(
            grads, wire.ranks, lambda packed: wire.hvd.allgather(packed, name=f"px_ar_rows_{tag}", ignore_name_scope=True))
        values = grads[0].values   # a row: its values and its int64 id
        row_bytes = tf.cast(tf.reduce_prod(tf.shape(values)[1:]), tf.float64) * values.dtype.size + tf.int64.size
        everyone = tf.math.bincount(owners(ids, table.offsets), minlength=len(grads), maxlength=len(grads),
                                    dtype=tf.int64)
        for k, (sync, grad) in enumerate(zip(syncs, grads)):
            own = tf.cast(tf.shape(grad.indices)[0], tf.float64) * row_bytes
            sent, received = allgather_bytes(own, tf.cast(everyone[k], tf.float64) * row_bytes, wire.ranks)
            wire.ledger.add(sync.name, sent * wire.remote_share, received * wire.remote_share)
        return summed

    def _machine_group(self, syncs: list, grads: list[tf.IndexedSlices], tag: str) -> list[tf.IndexedSlices]:
        """Local aggregation on one machine: one gather inside it
        (:meth:`..hierarchical.Hierarchy.gather_sparse_group`); nothing crosses machines, so
        the ledger counts nothing."""
        return self.wire.hierarchy.gather_sparse_group(grads, tag)

    def _two_level(self, sync, grad: tf.IndexedSlices) -> tf.IndexedSlices:
        """Local aggregation across machines: the variable's own two-level allgather."""
        grad = _rows(grad)
        row_bytes = int(math.prod(sync.variable.shape[1:])) * grad.values.dtype.size + grad.indices.dtype.size
        summed, sent, received = self.wire.hierarchy.allgather_sparse(grad, row_bytes, op_tag(sync.name))
        self.wire.ledger.add(sync.name, sent, received)
        return summed

    def collectives(self) -> list[Collective]:
        """Flat, one allgather per values dtype and row shape of the served variables
        (:func:`group_of`), whatever their number; with local aggregation, per variable two
        gathers in the machine, two exchanges across machines and two shares in the machine,
        and on one machine one gather per values dtype and row shape."""
        n = len(self.served)
        if not n:
            return []
        h = self.wire.hierarchy
        groups = len({group_of(s.variable) for s in self.syncs if s.name in self.served}) or 1
        if h is None:
            return [Collective("allgather", groups)]
        if h.N == 1:
            return [Collective("alltoall", groups, "machine")] if h.G > 1 else []
        out = [Collective("alltoall", 2 * n, "cross")]
        if h.G > 1:
            out = [Collective("alltoall", 4 * n, "machine")] + out
        return out


def _rows(grad: tf.IndexedSlices) -> tf.IndexedSlices:
    """``grad`` with its duplicate rows summed and int64 ids (8 bytes an id, as priced)."""
    grad = deduplicate(grad)
    return tf.IndexedSlices(grad.values, tf.cast(grad.indices, tf.int64), grad.dense_shape)
