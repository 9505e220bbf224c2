"""AR, sparse (``IndexedSlices``): duplicates summed first (unique rows), then what Horovod's
allreduce of ``IndexedSlices`` does (an allgather of values and one of indices, values divided
by W), written out so that the collectives carry explicit names.

With local aggregation, the two-level allgather of :meth:`..hierarchical.Hierarchy.allgather_sparse`;
on one machine one gather for every variable of one values dtype and row shape
(:meth:`..hierarchical.Hierarchy.gather_sparse_group`).

Bytes: the handed values and indices of this rank (``o``, read from the tensors) and of
everyone (``t``, the gathered tensors): an allgather sends ``(W - 1) o`` and receives
``t - o``, scaled by the share of peers on other machines.
"""
from __future__ import annotations

import math

import tensorflow as tf

from ...types import Collective, Kind, Method
from ..accounting import allgather_bytes
from ..tensor_ops import deduplicate, op_tag
from .base import Exchange, handed_bytes


def group_of(variable) -> tuple[str, tuple[int, ...]]:
    """The gather a variable's rows travel in with local aggregation on one machine: its values
    dtype and row shape (as the cost side's ``MethodCost.group``)."""
    return tf.as_dtype(variable.dtype).name, tuple(int(d) for d in variable.shape[1:])


class SparseAllgather(Exchange):
    method, kind = Method.AR, Kind.SPARSE

    def gradients(self, items, carried=None):
        present = [(sync, grads[0]) for sync, grads in items if grads[0] is not None]
        h = self.wire.hierarchy
        if h is not None and h.N == 1 and self.wire.ranks > 1:
            return self._one_machine(present), None
        return [(self._allgather(sync, grad), sync.variable) for sync, grad in present], None

    def _one_machine(self, present: list[tuple]) -> list[tuple]:
        """Local aggregation on one machine: every variable of one values dtype and row shape
        in one gather (:meth:`..hierarchical.Hierarchy.gather_sparse_group`); nothing crosses
        machines, so the ledger counts nothing."""
        groups: dict = {}
        for sync, grad in present:
            grad = deduplicate(grad)
            grad = tf.IndexedSlices(grad.values, tf.cast(grad.indices, tf.int64), grad.dense_shape)  # 8-byte ids
            groups.setdefault(group_of(sync.variable), []).append((sync, grad))
        summed = {}
        for key, group in groups.items():
            tag = key[0] + "".join(f"_{d}" for d in key[1])
            for (sync, _), grad in zip(group, self.wire.hierarchy.gather_sparse_group([g for _, g in group], tag)):
                summed[sync.name] = grad
        return [(summed[sync.name], sync.variable) for sync, _ in present]

    def _allgather(self, sync, grad: tf.IndexedSlices) -> tf.IndexedSlices:
        wire = self.wire
        hvd, W = wire.hvd, wire.ranks
        grad = deduplicate(grad)
        grad = tf.IndexedSlices(grad.values, tf.cast(grad.indices, tf.int64), grad.dense_shape)  # 8-byte ids, as priced
        if W == 1:
            return grad
        tag = op_tag(sync.name)
        if wire.hierarchy is not None:
            row_bytes = int(math.prod(sync.variable.shape[1:])) * grad.values.dtype.size + grad.indices.dtype.size
            summed, sent, received = wire.hierarchy.allgather_sparse(grad, row_bytes, tag)
            wire.ledger.add(sync.name, sent, received)
            return summed
        values = hvd.allgather(grad.values, name=f"px_ar_values_{tag}", ignore_name_scope=True)
        indices = hvd.allgather(grad.indices, name=f"px_ar_indices_{tag}", ignore_name_scope=True)
        own = handed_bytes(grad.values) + handed_bytes(grad.indices)
        total = handed_bytes(values) + handed_bytes(indices)
        sent, received = allgather_bytes(own, total, W)
        wire.ledger.add(sync.name, sent * wire.remote_share, received * wire.remote_share)
        return deduplicate(tf.IndexedSlices(values / W, indices, grad.dense_shape))

    def collectives(self) -> list[Collective]:
        """Per variable: two allgathers (values, indices); with local aggregation two gathers in
        the machine, two exchanges across machines and two shares in the machine; on one
        machine one gather per values dtype and row shape of the served variables
        (:func:`group_of`), whatever their number."""
        n = len(self.served)
        if not n:
            return []
        h = self.wire.hierarchy
        if h is None:
            return [Collective("allgather", 2 * n)]
        if h.N == 1:
            groups = len({group_of(s.variable) for s in self.syncs if s.name in self.served}) or 1
            return [Collective("alltoall", groups, "machine")] if h.G > 1 else []
        out = [Collective("alltoall", 2 * n, "cross")]
        if h.G > 1:
            out = [Collective("alltoall", 4 * n, "machine")] + out
        return out
