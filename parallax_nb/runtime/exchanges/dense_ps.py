"""PS, dense: each rank sends the gradient rows of every partition to its owner (alltoall), the
owner sums the W contributions, divides by W and applies the optimizer to its partitions;
after the update every rank pulls the fresh partitions (an allgather written as an alltoall)
into its full copy of the variable, which the forward pass reads.

With local aggregation a machine pushes each partition's machine sum once (a local
reduce-scatter, then the rank of the owner's local index sends it) and pulls once per machine
(then shares inside it).

Bytes: the split sizes handed to each alltoall (elements per peer, times the itemsize), the
parts addressed to or arriving from ranks on other machines.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from ...types import Collective, Kind, Method
from ..tensor_ops import live, op_tag
from .base import Exchange


class DensePS(Exchange):
    method, kind = Method.PS, Kind.DENSE

    def __init__(self, wire, syncs):
        super().__init__(wire, syncs)
        self._pushed: dict[str, tf.Tensor] = {}

    def gradients(self, items, carried=None):
        pairs = []
        for sync, grads in items:
            if grads[0] is not None:
                pairs.extend(self._push(sync, tf.convert_to_tensor(grads[0])))
        return pairs, None

    def _owner_blocks(self, sync, grad: tf.Tensor) -> tuple[list[tf.Tensor], list[int]]:
        """Per owner rank: its partitions' rows of ``grad``, flattened and concatenated, and sizes."""
        shard, part = sync.shard, sync.shard.partitioning
        grad = tf.reshape(grad, (part.rows,) + shard.row_shape)
        row = int(np.prod(shard.row_shape))
        blocks, sizes = [], []
        for owner in range(self.wire.ranks):
            pieces = [tf.reshape(grad[p::part.partitions], [-1]) for p in part.owned_by(owner)]
            blocks.append(tf.concat(pieces, 0) if pieces else tf.zeros([0], grad.dtype))
            sizes.append(sum(part.rows_in(p) for p in part.owned_by(owner)) * row)
        return blocks, sizes

    def _push(self, sync, grad: tf.Tensor) -> list[tuple]:
        """alltoall each partition's gradient to its owner; the owner sums and averages."""
        wire = self.wire
        hvd, W, shard = wire.hvd, wire.ranks, sync.shard
        part = shard.partitioning
        blocks, sizes = self._owner_blocks(sync, grad)
        mine = sizes[wire.rank]
        itemsize = grad.dtype.size
        tag = op_tag(sync.name)
        h = wire.hierarchy
        if W == 1:
            summed = blocks[0]
        elif h is None:
            received, _ = hvd.alltoall(tf.concat(blocks, 0), splits=tf.constant(sizes, tf.int32), name=f"px_push_{tag}",
                                       ignore_name_scope=True)
            summed = tf.reduce_sum(tf.reshape(received, [W, mine]), 0)
            wire.ledger.add(sync.name, sum(s * r for s, r in zip(sizes, wire.remote)) * itemsize,
                            sum(wire.remote) * mine * itemsize)
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
            wire.ledger.add(sync.name, sum(sizes[o] * wire.remote[o] for o in served) * itemsize,
                            (h.N - 1) * mine * itemsize)
        self._pushed[sync.name] = summed
        pairs, offset = [], 0
        for p, variable in zip(shard.owned, shard.parts):
            size = part.rows_in(p) * int(np.prod(shard.row_shape))
            piece = tf.reshape(summed[offset:offset + size], (part.rows_in(p),) + shard.row_shape)
            pairs.append((piece / W, variable))
            offset += size
        return pairs

    def pull(self) -> None:
        """Every rank's full copy of each PS dense variable := the owners' fresh partitions."""
        wire = self.wire
        hvd, W = wire.hvd, wire.ranks
        for sync in self.syncs:
            shard, part = sync.shard, sync.shard.partitioning
            row = int(np.prod(shard.row_shape))
            mine = [tf.reshape(v.value, [-1]) for v in shard.parts]
            # a rank that owns nothing sends the (empty) result of its push: never a constant,
            # which grappler would fold (tensor_ops.live)
            own = tf.concat(mine, 0) if mine else self._pushed.get(sync.name, live(tf.zeros([0], shard.dtype)))
            own_size = sum(part.rows_in(p) for p in shard.owned) * row
            owner_sizes = [part.rows_owned_by(o) * row for o in range(W)]
            itemsize = shard.dtype.size
            h = wire.hierarchy
            owners = list(range(W))
            if W == 1:
                everything = own
            elif h is None:
                # an allgather written as alltoall (own block to every rank): Horovod's allgather
                # stalled here when a rank that owns no partition contributed an empty block
                everything, _ = hvd.alltoall(tf.tile(own, [W]), splits=tf.constant([own_size] * W, tf.int32),
                                             name=f"px_pull_{op_tag(sync.name)}", ignore_name_scope=True)
                wire.ledger.add(sync.name, own_size * sum(wire.remote) * itemsize,
                                sum(s * r for s, r in zip(owner_sizes, wire.remote)) * itemsize)
            else:
                # once to each machine's rank of my local index, which shares it inside its machine
                tag = op_tag(sync.name)
                everything, _ = h.alltoall(tf.tile(own, [h.N]), h.splits(h.cross_peers, [own_size] * h.N),
                                           f"px_la_pull_{tag}")
                wire.ledger.add(sync.name, own_size * (h.N - 1) * itemsize,
                                sum(owner_sizes[o] * wire.remote[o] for o in h.cross_peers) * itemsize)
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

    def collectives(self) -> list[Collective]:
        """Per variable: a push and a pull alltoall; with local aggregation a local
        reduce-scatter and a local share around the cross-machine push and pull."""
        n = len(self.served)
        if not n:
            return []
        h = self.wire.hierarchy
        if h is None:
            return [Collective("alltoall", 2 * n)]
        return [Collective("alltoall", 2 * n, "cross")] + ([Collective("alltoall", 2 * n, "machine")] if h.G > 1 else [])
