"""Gradient exchange per variable, inside the train step (DESIGN.md §5).

* AR, dense gradient: one grouped Horovod allreduce (average) of all of them, and of the
  step's loss.
* AR, sparse gradient (``IndexedSlices``): duplicates summed first (unique rows), then what
  Horovod's allreduce of ``IndexedSlices`` does (an allgather of values and one of indices,
  values divided by N), written out to give the collectives explicit names.

Every collective is named explicitly (``px_<what>_<variable>``): Horovod pairs collectives
across ranks by name, and the graphs of ranks that own different partitions differ.
* PS, sparse: the gradient already arrived at the owners through the lookup's alltoall
  (:mod:`.sharded`); each owner divides by N and applies the optimizer to its partitions.
* PS, dense: each rank sends the gradient rows of every partition to its owner (alltoall),
  the owner sums the N contributions, divides by N and applies the optimizer to its
  partitions; after the update every rank pulls the fresh partitions (allgather) into its
  full copy of the variable, which the forward pass reads.

With local aggregation (a :class:`~.hierarchical.Hierarchy`: G ranks per machine, the plan's
``local_aggregation`` on) the same methods combine a machine's gradients first: AR sparse through the two-level
allgather of :mod:`.hierarchical` (AR dense stays one allreduce over all ranks: see
``GradientExchange._allreduce_dense``); PS dense pushes each
partition's machine sum once per machine (a local reduce-scatter, then the rank of the
owner's local index sends it) and pulls once per machine (then shares inside it); PS sparse
is aggregated inside its lookup (:mod:`.sharded`).

Bytes are counted only for traffic with ranks on other machines (:mod:`.topology`): exactly
for the alltoalls, and scaled by the share of remote peers ``r = (W - G) / (W - 1)`` for
Horovod's allreduce and allgather over all ranks (whose traffic spreads over all peers).

Dividing by N turns the sum of per-rank mean-loss gradients into the gradient of the mean
loss over the global batch of N * b examples, which is what single-device training with that
batch computes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from ..types import Kind, Method
from .accounting import ByteLedger, allgather_bytes, ring_allreduce_bytes
from .hierarchical import Hierarchy
from .sharded import ShardedVariable
from .tensor_ops import deduplicate, op_tag
from .topology import Topology


@dataclass
class VariableSync:
    """How one trainable variable is synchronised on this rank.

    ``variable`` is the model's Keras variable; ``shard`` the owned partitions of a PS
    variable (None for AR). ``routed``: the model reads it through ``embedding_lookup``
    (only then can PS serve it sparsely).
    """

    name: str
    variable: object
    method: Method
    kind: Kind
    partitions: int
    shard: ShardedVariable | None = None
    routed: bool = False

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


def _scale(grad, factor: float):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
    return grad * factor


class GradientExchange:
    """Turns this rank's local gradients into the (grad, variable) pairs its optimizer applies,
    and pulls PS dense values after the update. Call both inside the traced train step."""

    def __init__(self, syncs: list[VariableSync], ranks: int, rank: int, ledger: ByteLedger,
                 topology: Topology | None = None, hierarchy: Hierarchy | None = None):
        import horovod.tensorflow as hvd

        self.hvd = hvd
        self.syncs = syncs
        self.ranks = ranks
        self.rank = rank
        self.ledger = ledger
        self.topology = topology or Topology.blocks(ranks, 1, "one machine per rank")
        self.remote = self.topology.remote(rank)
        self.remote_share = self.topology.remote_share(rank)
        self.hierarchy = hierarchy
        self._pushed: dict[str, tf.Tensor] = {}

    def exchange(self, grads_by_sync: list[list], loss=None) -> tuple[list[tuple], "tf.Tensor | None"]:
        """(grad, variable) pairs for the optimizer, and ``loss`` averaged over the ranks when
        it could ride along with the dense allreduce (None when there was none to ride)."""
        hvd, N = self.hvd, self.ranks
        pairs: list[tuple] = []
        dense_ar: list[tuple[VariableSync, tf.Tensor]] = []
        for sync, grads in zip(self.syncs, grads_by_sync):
            if sync.method is Method.AR:
                grad = grads[0]
                if grad is None:
                    continue
                if isinstance(grad, tf.IndexedSlices):
                    pairs.append((self._allgather_sparse(sync, grad), sync.variable))
                else:
                    dense_ar.append((sync, grad))
            elif sync.ps_sparse:
                for grad, part in zip(grads, sync.shard.parts):
                    if grad is not None:
                        grad = deduplicate(grad) if isinstance(grad, tf.IndexedSlices) else grad
                        pairs.append((_scale(grad, 1.0 / N), part))
            else:
                grad = grads[0]
                if grad is not None:
                    pairs.extend(self._push_dense(sync, tf.convert_to_tensor(grad)))
        mean_loss = None
        if dense_ar:
            reduced, mean_loss = self._allreduce_dense(dense_ar, loss)
            pairs.extend(reduced)
        return pairs, mean_loss

    def _allreduce_dense(self, dense_ar: list[tuple[VariableSync, tf.Tensor]], loss=None):
        """One grouped Horovod allreduce (average) of every dense AR gradient, with the step's
        loss riding along when given (one collective fewer per step).

        With local aggregation too: a machine's ranks hold consecutive ranks, and MPI's
        allreduce over them already crosses machines about as a two-level ring would (on
        the emulated 2 x 2 network Open MPI's allreduce of the CNN's 0.33 MB carried 2.02 m
        per machine link against the two-level 4 m (N - 1) / N = 2 m), while the two-level
        ring written as four chained alltoalls cost the CNN twice its step time. Its bytes
        are then counted as the cost model's figure with local aggregation: a machine sends
        and receives ``2 m (N - 1) / N`` each way, ``1/G`` of it per rank.
        """
        hvd, N = self.hvd, self.ranks
        grads = [g for _, g in dense_ar]
        if loss is not None and loss.dtype != grads[0].dtype:
            loss = None  # e.g. float16 gradients: the loss keeps its own allreduce
        tensors = grads + ([loss] if loss is not None else [])
        if N > 1:
            tensors = hvd.grouped_allreduce(tensors, op=hvd.Average, name="px_ar_dense", ignore_name_scope=True)
        mean_loss = tensors[len(grads)] if loss is not None else None
        h = self.hierarchy
        out = []
        for (sync, _), grad in zip(dense_ar, tensors):
            if h is not None:  # the machine's ring share among N machines, 1/G of it per rank
                sent, received = ring_allreduce_bytes(sync.size_bytes / h.G, h.N)
            else:
                sent, received = ring_allreduce_bytes(sync.size_bytes, N)
                sent, received = sent * self.remote_share, received * self.remote_share
            self.ledger.add(sync.name, sent, received)
            out.append((grad, sync.variable))
        return out, mean_loss

    def _allgather_sparse(self, sync: VariableSync, grad: tf.IndexedSlices) -> tf.IndexedSlices:
        hvd, N = self.hvd, self.ranks
        grad = deduplicate(grad)
        row_bytes = int(math.prod(sync.variable.shape[1:])) * tf.as_dtype(sync.variable.dtype).size + 8
        own = tf.cast(tf.shape(grad.indices)[0], tf.float64) * row_bytes
        if N == 1:
            return grad
        tag = op_tag(sync.name)
        if self.hierarchy is not None:
            summed, sent, received = self.hierarchy.allgather_sparse(grad, row_bytes, tag)
            self.ledger.add(sync.name, sent, received)
            return summed
        values = hvd.allgather(grad.values, name=f"px_ar_values_{tag}", ignore_name_scope=True)
        indices = hvd.allgather(grad.indices, name=f"px_ar_indices_{tag}", ignore_name_scope=True)
        total = tf.cast(tf.shape(indices)[0], tf.float64) * row_bytes
        sent, received = allgather_bytes(own, total, N)
        self.ledger.add(sync.name, sent * self.remote_share, received * self.remote_share)
        return deduplicate(tf.IndexedSlices(values / N, indices, grad.dense_shape))

    # ---------------------------------------------------------------- PS dense
    @staticmethod
    def _partition_rows(full: tf.Tensor, partitions: int, p: int) -> tf.Tensor:
        return full[p::partitions]

    def _owner_blocks(self, sync: VariableSync, grad: tf.Tensor) -> tuple[list[tf.Tensor], list[int]]:
        """Per owner rank: its partitions' rows of ``grad``, flattened and concatenated, and sizes."""
        shard, part = sync.shard, sync.shard.partitioning
        grad = tf.reshape(grad, (part.rows,) + shard.row_shape)
        row = int(np.prod(shard.row_shape))
        blocks, sizes = [], []
        for owner in range(self.ranks):
            pieces = [tf.reshape(self._partition_rows(grad, part.partitions, p), [-1]) for p in part.owned_by(owner)]
            blocks.append(tf.concat(pieces, 0) if pieces else tf.zeros([0], grad.dtype))
            sizes.append(sum(part.rows_in(p) for p in part.owned_by(owner)) * row)
        return blocks, sizes

    def _push_dense(self, sync: VariableSync, grad: tf.Tensor) -> list[tuple]:
        """alltoall each partition's gradient to its owner; the owner sums and averages.

        With local aggregation the machine's ranks first reduce-scatter the blocks by the
        owner's local index, so each owner receives one sum per machine."""
        hvd, N, shard = self.hvd, self.ranks, sync.shard
        part = shard.partitioning
        blocks, sizes = self._owner_blocks(sync, tf.convert_to_tensor(grad))
        mine = sizes[self.rank]
        itemsize = grad.dtype.size
        tag = op_tag(sync.name)
        h = self.hierarchy
        if N == 1:
            summed = blocks[0]
        elif h is None:
            received, _ = hvd.alltoall(tf.concat(blocks, 0), splits=tf.constant(sizes, tf.int32), name=f"px_push_{tag}",
                                       ignore_name_scope=True)
            summed = tf.reduce_sum(tf.reshape(received, [N, mine]), 0)
            senders = sum(self.remote)
            self.ledger.add(sync.name, sum(s * r for s, r in zip(sizes, self.remote)) * itemsize,
                            senders * mine * itemsize)
        else:
            served = h.cross_peers  # the owners this rank pushes to for its machine (its local index)
            machine_sum = tf.concat([blocks[o] for o in served], 0)
            if h.G > 1:
                by_peer = [sum(sizes[o] for o in h.peers_of(i)) for i in range(h.G)]
                received, _ = h.alltoall(tf.concat([blocks[o] for o in h.by_local_index], 0),
                                         h.splits(h.local_peers, by_peer), f"px_la_push_local_{tag}")
                machine_sum = tf.reduce_sum(tf.reshape(received, [h.G, by_peer[h.local]]), 0)
            received, _ = h.alltoall(machine_sum, h.splits(served, [sizes[o] for o in served]), f"px_la_push_{tag}")
            summed = tf.reduce_sum(tf.reshape(received, [h.N, mine]), 0)
            self.ledger.add(sync.name, sum(sizes[o] * self.remote[o] for o in served) * itemsize,
                            (h.N - 1) * mine * itemsize)
        self._pushed[sync.name] = summed
        pairs, offset = [], 0
        for p, variable in zip(shard.owned, shard.parts):
            size = part.rows_in(p) * int(np.prod(shard.row_shape))
            piece = tf.reshape(summed[offset:offset + size], (part.rows_in(p),) + shard.row_shape)
            pairs.append((piece / N, variable))
            offset += size
        return pairs

    def pull_dense(self) -> None:
        """Every rank's full copy of each PS dense variable := the owners' fresh partitions."""
        hvd, N = self.hvd, self.ranks
        for sync in self.syncs:
            if not sync.ps_dense:
                continue
            shard, part = sync.shard, sync.shard.partitioning
            row = int(np.prod(shard.row_shape))
            mine = [tf.reshape(v.value, [-1]) for v in shard.parts]
            # a rank that owns nothing sends the (empty) result of its push: a constant here would
            # let the pull start before the step's other collectives and stall them (seen with
            # Horovod 0.28: a rank sitting in the pull never submitted its lookups)
            own = tf.concat(mine, 0) if mine else self._pushed.get(sync.name, tf.zeros([0], shard.dtype))
            own_size = sum(part.rows_in(p) for p in shard.owned) * row
            owner_sizes = [part.rows_owned_by(o) * row for o in range(N)]
            itemsize = shard.dtype.size
            h = self.hierarchy
            owners = list(range(N))
            if N == 1:
                everything = own
            elif h is None:
                # an allgather written as alltoall (own block to every rank): Horovod's allgather
                # stalled here when a rank that owns no partition contributed an empty block
                everything, _ = hvd.alltoall(tf.tile(own, [N]), splits=tf.constant([own_size] * N, tf.int32),
                                             name=f"px_pull_{op_tag(sync.name)}", ignore_name_scope=True)
                self.ledger.add(sync.name, own_size * sum(self.remote) * itemsize,
                                sum(s * r for s, r in zip(owner_sizes, self.remote)) * itemsize)
            else:
                # once to each machine's rank of my local index, which shares it inside its machine
                tag = op_tag(sync.name)
                everything, _ = h.alltoall(tf.tile(own, [h.N]), h.splits(h.cross_peers, [own_size] * h.N),
                                           f"px_la_pull_{tag}")
                self.ledger.add(sync.name, own_size * (h.N - 1) * itemsize,
                                sum(owner_sizes[o] * self.remote[o] for o in h.cross_peers) * itemsize)
                if h.G > 1:
                    everything, _ = h.local_gather(everything, f"px_la_pull_local_{tag}")
                owners = h.by_local_index
            order = [p for o in owners for p in part.owned_by(o)]
            sizes = [part.rows_in(p) * row for p in order]
            pieces = tf.split(everything, sizes) if len(sizes) > 1 else [everything]
            indices = [tf.range(p, part.rows, part.partitions) for p in order]
            rows = [tf.reshape(piece, (part.rows_in(p),) + shard.row_shape) for p, piece in zip(order, pieces)]
            full = tf.dynamic_stitch(indices, rows)
            sync.variable.assign(tf.reshape(full, sync.variable.shape))
