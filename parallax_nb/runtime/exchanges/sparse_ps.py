"""PS, sparse: rows partitioned across owner ranks, served to lookups and updated on the owners.

A lookup of rows ``ids`` (:class:`ShardedLookupRouter`, installed with
``parallax_nb.ops.route_lookups`` during the train step):

1. ``unique(ids)`` on the requesting rank; order the unique ids by owner rank;
2. ``alltoall`` the ids to their owners (int64, 8 bytes per remote id);
3. each owner gathers the requested rows from its partitions;
4. ``alltoall`` the rows back; rebuild ``ids``' shape from the unique rows.

Gradients flow back through both gathers and the row ``alltoall`` (Horovod registers its
gradient as the reverse ``alltoall``), so the backward pass hands each owner, for every row a
rank touched, that rank's summed gradient as an ``IndexedSlices`` on the owner's partition:
duplicates inside a rank are summed by the unique/gather, duplicates across ranks by the
optimizer's scatter. The trainer divides by N so the update is the global-batch mean.

The step's health flags (:mod:`..guards`) check the row gradients a rank sends
(:attr:`ShardedLookupRouter.sent_finite`), not the sums its partitions receive: a NaN is named
on the rank whose batch made it, and the collective that carries the flags need not wait for
the row gradients' alltoall (one dependent round less a step). The owners' sums of finite
gradients are not checked again; a checkpoint refuses non-finite arrays all the same.

With local aggregation (a :class:`~.hierarchical.Hierarchy`, G ranks per machine) a machine
asks for each row once: its ranks first gather their unique ids into the machine's union U
(shared memory); the ids of U owned by a rank of local index j are requested by this
machine's rank of local index j (one requester per owner and machine; an owner on the own
machine is the requester itself); the rows come back to that requester and are shared with
the machine's other ranks. Backward, the reverse of that sharing sums the machine's
gradients of each row on its requester, which pushes one gradient per row and machine to
the owner: pull and push move alpha_G of the rows per machine, the cost model's PS figure
with local aggregation.

Variables looked up together (:func:`parallax_nb.ops.embedding_lookups` at one ids tensor,
as the sampled softmax's weights and biases), of one dtype and with the same owner for every
id, are one exchange: the ids go once, and each row travels as the variables' rows side by
side (flattened and concatenated), split again on arrival; the row gradients come back the
same way. Three alltoalls for the group instead of three per variable.

Bytes: the split sizes handed to the alltoalls (8 bytes per remote id, a row's bytes per
remote row), for ids out, rows back and row gradients out again.

One rank (W = 1) owns every row: its lookups read its partitions directly and issue no
alltoall, as the cost model prices a one-rank step (no collective). Horovod would run each
alltoall of one rank through its background loop all the same (the recommender's 12 a step
cost about 0.65 ms of a 1.7 ms step, 2026-11-29). The row gradients then reach the partitions
through the gathers, and the health flags check them there (:meth:`..sync.GradientExchange.checked_gradients`).
"""
from __future__ import annotations

import math

import tensorflow as tf

from ...ops import variable_path
from ...types import Collective, Kind, Method, row_owners
from ..sharded import ShardedVariable
from ..tensor_ops import deduplicate, op_tag, tile_rows
from .base import Exchange, Wire


def exchange_rows(served: tf.Tensor, send_splits: tf.Tensor, receive_splits: tf.Tensor, tag: str,
                  what: str = "rows", hierarchy=None, sent_finite: list | None = None) -> tf.Tensor:
    """alltoall of the rows owners serve back to their requesters, with an explicitly named
    reverse alltoall as its gradient (row gradients to the owners). ``sent_finite``: a list
    that receives, while the backward pass is built, whether every row gradient this rank
    sends is finite (a boolean scalar).

    Every Horovod op of the step carries a name built from the variable and the call
    number: Horovod matches collectives across ranks by name, and automatic names would
    differ between ranks whose graphs differ (a rank owning two partitions gathers from
    both, a rank owning one does not).

    Traced, ``tf.custom_gradient`` registers the gradient in TensorFlow's process-wide
    registry under a new name, and that entry keeps the whole traced graph alive
    (tensorflow#27492, #97697): the trainer drops every registration its step's trace made
    (:func:`..tensor_ops.forget_custom_gradients_since`).
    """
    import horovod.tensorflow as hvd

    def alltoall(x, splits, name):   # within the hierarchy's process set of the splits' peers, if given
        if hierarchy is not None:
            return hierarchy.alltoall(x, splits, name)
        return hvd.alltoall(x, splits=splits, name=name, ignore_name_scope=True)

    @tf.custom_gradient
    def exchange(x):
        y, _ = alltoall(x, send_splits, f"px_{what}_{tag}")

        def grad(dy):
            dy = tf.convert_to_tensor(dy)
            if sent_finite is not None:
                sent_finite.append(tf.reduce_all(tf.math.is_finite(dy)))
            dx, _ = alltoall(dy, receive_splits, f"px_{what}grads_{tag}")
            return dx

        return y, grad

    return exchange(served)


class ShardedLookupRouter:
    """Serves ``embedding_lookup`` of PS variables from their shards through ``alltoall``.

    Bytes of every exchange with ranks on other machines (``wire.remote``: per rank 1.0 when
    on another machine) are written to the ledger under the variable's name: forward ids and
    rows, and the row gradients the backward pass will send (the reverse of the rows), from
    the split sizes handed to the alltoalls. With ``wire.hierarchy`` each machine's lookups
    are aggregated first (module docstring). ``lookups``: lookups in the last trace;
    ``sent_finite``: whether the row gradients this rank sends are finite, one boolean scalar
    per backward alltoall of the last trace (filled while its gradient is built).
    """

    def __init__(self, variables: dict[str, ShardedVariable], wire: Wire):
        self._hvd = wire.hvd
        self.variables = variables
        self.ranks = wire.ranks
        self.rank = wire.rank
        self.ledger = wire.ledger
        self.remote = wire.remote
        self.hierarchy = wire.hierarchy
        self.lookups = 0
        self.sent_finite: list[tf.Tensor] = []

    def reset(self) -> None:
        """Start a new trace: lookups are numbered per variable from 0 again."""
        self._calls: dict[str, int] = {}
        self.lookups = 0
        self.sent_finite = []

    def lookup(self, params, ids):
        return self.lookup_many([(params, ids)])[0]

    def lookup_many(self, pairs):
        """Rows of each ``(params, ids)`` this router serves (None for the others). Variables
        looked up at the same ids (one tensor, as the sampled softmax's weights and biases),
        of one dtype and with the same owner of every row, are served together: one alltoall
        of the ids, one of their rows side by side, one of the row gradients back."""
        out = [None] * len(pairs)
        groups: dict[tuple, list[tuple[int, ShardedVariable]]] = {}
        for i, (params, ids) in enumerate(pairs):
            sharded = self.variables.get(variable_path(params))
            if sharded is not None:
                owners = row_owners(sharded.partitioning.partitions, self.ranks)
                groups.setdefault((id(ids), owners, sharded.dtype), []).append((i, sharded))
        for members in groups.values():
            ids = pairs[members[0][0]][1]
            for (i, _), rows in zip(members, self._lookup([sharded for _, sharded in members], ids)):
                out[i] = rows
        return out

    def _lookup(self, group: list[ShardedVariable], ids) -> list[tf.Tensor]:
        calls = getattr(self, "_calls", None)
        if calls is None:
            self.reset()
            calls = self._calls
        first = group[0].name
        tag = f"{op_tag(first)}_{calls.get(first, 0)}"
        calls[first] = calls.get(first, 0) + 1
        self.lookups += 1
        served = _ServedTogether(group)
        ids = tf.convert_to_tensor(ids)
        flat = tf.cast(tf.reshape(ids, [-1]), tf.int64)
        unique_ids, position = tf.unique(flat)
        if self.ranks == 1:   # the one rank owns every row: read them, no alltoall (module docstring)
            unique_rows = served.local_rows(unique_ids)
        elif self.hierarchy is not None and self.hierarchy.G > 1:
            unique_rows = self._machine_lookup(served, unique_ids, tag)
        else:
            unique_rows = self._request(served, unique_ids, self._owners(group[0], unique_ids), tag)
        return [tf.reshape(tf.gather(rows, position), tf.concat([tf.shape(ids), tf.constant(s.row_shape, tf.int32)], 0))
                for s, rows in zip(group, served.split(unique_rows))]

    def _owners(self, sharded: ShardedVariable, ids: tf.Tensor) -> tf.Tensor:
        P, N = sharded.partitioning.partitions, self.ranks
        return tf.cast(ids % N if P % N == 0 else (ids % P) % N, tf.int32)   # (id % P) % N is id % N where N divides P

    def _request(self, served: "_ServedTogether", ids: tf.Tensor, owners: tf.Tensor, tag: str) -> tf.Tensor:
        """Rows ``ids`` (unique) from their ``owners``: ids out by owner (alltoall), the owners'
        rows back through :func:`exchange_rows`, in the order of ``ids``; bytes counted. The
        order by owner is a stable partition by owner, undone by the permutation's inverse."""
        N = self.ranks
        order = tf.concat(tf.dynamic_partition(tf.range(tf.size(owners)), owners, N), 0)
        splits = tf.math.unsorted_segment_sum(tf.ones_like(owners), owners, N)
        recv_ids, recv_splits = self._hvd.alltoall(tf.gather(ids, order), splits=splits, name=f"px_ids_{tag}",
                                                   ignore_name_scope=True)
        rows = exchange_rows(served.local_rows(recv_ids), send_splits=recv_splits, receive_splits=splits, tag=tag,
                             sent_finite=self.sent_finite)
        self._count(served, splits, recv_splits)
        return tf.gather(rows, tf.math.invert_permutation(order))

    def _machine_lookup(self, served: "_ServedTogether", unique_ids: tf.Tensor, tag: str) -> tf.Tensor:
        """Rows of this rank's ``unique_ids``, requested once per machine (module docstring)."""
        h = self.hierarchy
        together, together_splits = h.local_gather(unique_ids, f"px_la_ids_local_{tag}")
        union, union_position = tf.unique(together)
        start = tf.reduce_sum(together_splits[:self.rank])
        mine = tf.slice(union_position, [start], tf.shape(unique_ids))  # my unique ids' places in the union
        owner = self._owners(served.variables[0], union)
        requester = owner % h.G  # local index of the owner = the local index that asks for the row
        asked = tf.equal(requester, h.local)
        my_rows = self._request(served, tf.boolean_mask(union, asked), tf.boolean_mask(owner, asked), tag)
        # share with the machine: every rank receives each requester's rows (requesters in rank order)
        counts = [tf.reduce_sum(tf.cast(tf.equal(requester, i), tf.int32)) for i in range(h.G)]
        shared = exchange_rows(tile_rows(my_rows, h.G), send_splits=h.local_splits(tf.shape(my_rows)[0]),
                               receive_splits=h.splits(h.local_peers, counts), tag=tag, what="la_share",
                               hierarchy=h, sent_finite=self.sent_finite)
        places = tf.concat([tf.cast(tf.where(tf.equal(requester, i))[:, 0], tf.int32) for i in range(h.G)], 0)
        union_rows = tf.gather(shared, tf.math.invert_permutation(places))
        return tf.gather(union_rows, mine)

    def _count(self, served: "_ServedTogether", splits, recv_splits) -> None:
        """ids out + rows back + row gradients out again, parts exchanged with other machines
        only; the ids, sent once for variables served together, are counted for the first."""
        mine = tf.constant(self.remote, tf.float64)
        remote_requested = tf.reduce_sum(tf.cast(splits, tf.float64) * mine)      # my ids others own
        remote_served = tf.reduce_sum(tf.cast(recv_splits, tf.float64) * mine)    # others' ids I own
        for k, sharded in enumerate(served.variables):
            id_bytes, row_bytes = (8.0 if k == 0 else 0.0), float(sharded.row_bytes)
            sent = remote_requested * id_bytes + remote_served * row_bytes + remote_requested * row_bytes
            received = remote_served * id_bytes + remote_requested * row_bytes + remote_served * row_bytes
            self.ledger.add(sharded.name, sent, received)


class _ServedTogether:
    """Variables served by one exchange: each row is theirs side by side, flattened, in order."""

    def __init__(self, variables: list[ShardedVariable]):
        self.variables = variables
        self.widths = [math.prod(v.row_shape) for v in variables]

    def local_rows(self, ids: tf.Tensor) -> tf.Tensor:
        if len(self.variables) == 1:
            return self.variables[0].local_rows(ids)
        return tf.concat([tf.reshape(v.local_rows(ids), [-1, w]) for v, w in zip(self.variables, self.widths)], 1)

    def split(self, rows: tf.Tensor) -> list[tf.Tensor]:
        if len(self.variables) == 1:
            return [rows]
        parts = tf.split(rows, self.widths, axis=1)
        return [tf.reshape(p, tf.concat([[-1], tf.constant(v.row_shape, tf.int32)], 0))
                for v, p in zip(self.variables, parts)]


class SparsePS(Exchange):
    """The row gradients arrived at the owners through the lookups' alltoalls (``router``);
    each owner sums duplicates, divides by W and applies the optimizer to its partitions."""

    method, kind = Method.PS, Kind.SPARSE

    def __init__(self, wire, syncs):
        super().__init__(wire, syncs)
        self.router = ShardedLookupRouter({s.name: s.shard for s in syncs}, wire)

    def gradients(self, items, carried=None):
        pairs = []
        W = self.wire.ranks
        for sync, grads in items:
            for grad, part in zip(grads, sync.shard.parts):
                if grad is not None:
                    grad = deduplicate(grad) if isinstance(grad, tf.IndexedSlices) else grad
                    pairs.append((_scale(grad, 1.0 / W), part))
        return pairs, None

    def collectives(self) -> list[Collective]:
        """Per lookup (all PS sparse variables' lookups of the last trace): ids out, rows back
        and row gradients out; with local aggregation the requests go to one local index on
        every machine, after a gather of the machine's ids and with a share of the rows (and
        its reverse) inside the machine."""
        n = self.router.lookups
        if not n:
            return []
        h = self.wire.hierarchy
        if h is None or h.G == 1:
            return [Collective("alltoall", 3 * n)]
        return [Collective("alltoall", 3 * n, "cross"), Collective("alltoall", 3 * n, "machine")]


def _scale(grad, factor: float):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
    return grad * factor
