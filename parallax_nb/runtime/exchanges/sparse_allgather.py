"""AR, sparse (``IndexedSlices``): duplicates summed first (unique rows), then what Horovod's
allreduce of ``IndexedSlices`` does (an allgather of values and one of indices, values divided
by W), written out so that the collectives carry explicit names.

With local aggregation, the two-level allgather of
:meth:`..hierarchical.Hierarchy.allgather_sparse_group`, every variable of one values dtype
in the same calls.

Bytes: the handed values and indices of this rank (``o``, read from the tensors) and of
everyone (``t``, the gathered tensors): an allgather sends ``(W - 1) o`` and receives
``t - o``, scaled by the share of peers on other machines.
"""
from __future__ import annotations

import tensorflow as tf

from ...types import Collective, Kind, Method
from ..accounting import allgather_bytes
from ..tensor_ops import deduplicate, op_tag
from .base import Exchange, handed_bytes


class SparseAllgather(Exchange):
    method, kind = Method.AR, Kind.SPARSE

    def gradients(self, items, carried=None):
        present = [(sync, grads[0]) for sync, grads in items if grads[0] is not None]
        if self.wire.hierarchy is not None and self.wire.ranks > 1:
            return self._two_level(present), None
        return [(self._allgather(sync, grad), sync.variable) for sync, grad in present], None

    def _two_level(self, present: list[tuple]) -> list[tuple]:
        """Local aggregation: every variable of one values dtype in one grouped exchange
        (:meth:`..hierarchical.Hierarchy.allgather_sparse_group`)."""
        wire = self.wire
        by_dtype: dict = {}
        for sync, grad in present:
            grad = deduplicate(grad)
            grad = tf.IndexedSlices(grad.values, tf.cast(grad.indices, tf.int64), grad.dense_shape)  # 8-byte ids
            by_dtype.setdefault(grad.values.dtype, []).append((sync, grad))
        summed = {}
        for dtype, group in by_dtype.items():
            results = wire.hierarchy.allgather_sparse_group([g for _, g in group], dtype.name)
            for (sync, _), (grad, sent, received) in zip(group, results):
                wire.ledger.add(sync.name, sent, received)
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
        values = hvd.allgather(grad.values, name=f"px_ar_values_{tag}", ignore_name_scope=True)
        indices = hvd.allgather(grad.indices, name=f"px_ar_indices_{tag}", ignore_name_scope=True)
        own = handed_bytes(grad.values) + handed_bytes(grad.indices)
        total = handed_bytes(values) + handed_bytes(indices)
        sent, received = allgather_bytes(own, total, W)
        wire.ledger.add(sync.name, sent * wire.remote_share, received * wire.remote_share)
        return deduplicate(tf.IndexedSlices(values / W, indices, grad.dense_shape))

    def collectives(self) -> list[Collective]:
        """Per variable: two allgathers (values, indices). With local aggregation, per values
        dtype of the served variables (one, as a rule) and whatever their number: a gather in
        the machine, an exchange across machines and a share in the machine (on one machine the
        gather alone)."""
        n = len(self.served)
        if not n:
            return []
        h = self.wire.hierarchy
        if h is None:
            return [Collective("allgather", 2 * n)]
        groups = len({s.variable.dtype for s in self.syncs if s.name in self.served}) or 1
        if h.N == 1:
            return [Collective("alltoall", groups, "machine")] if h.G > 1 else []
        out = [Collective("alltoall", groups, "cross")]
        if h.G > 1:
            out = [Collective("alltoall", 2 * groups, "machine")] + out
        return out
