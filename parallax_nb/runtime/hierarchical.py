"""Local aggregation: collectives that combine a machine's gradients before anything crosses
machines (Parallax's local aggregation; DESIGN.md §5, cost model in :mod:`parallax_nb.cost.model`).

The topology must be uniform: N machines of G ranks, rank ``r`` on machine ``r // G`` at local
index ``j = r % G`` (see :mod:`.topology`). Every step is a Horovod ``alltoall`` whose split
sizes are zero for the ranks it does not talk to, so one mechanism serves both levels:

* *local* steps exchange only with the G ranks of the own machine (shared memory; no bytes
  on the network);
* *cross* steps exchange only with the N ranks of the same local index on every machine, so
  each machine's G ranks share the network work and every byte crosses machines once.

Dense allreduce (:meth:`Hierarchy.allreduce`), the classic two-level ring of W = N * G ranks
on a buffer of S elements split in G chunks ``c_j`` and each chunk in N sub-chunks ``s_jk``:
local reduce-scatter (rank j gets its machine's sum of chunk j), cross reduce-scatter and
cross allgather of chunk j among the N ranks of local index j (the global sum of chunk j),
local allgather (every rank gets every chunk). A machine sends and receives
``2 * S * (N - 1) / N`` elements each way: ``4 * m * (N - 1) / N`` bytes, the cost model's AR
figure with local aggregation, and nothing when N = 1.

Sparse allgather (:meth:`Hierarchy.allgather_sparse`): the machine's ranks gather their
deduplicated slices and sum them into the machine's union of rows (alpha_G of the rows);
rank j sends every j-th row of that union to its peers of local index j on the other
machines; a last local gather gives every rank the union of every machine. A machine sends
its union once to each of the N - 1 other machines: ``2 * alpha_G * (m + 8 R) * (N - 1)`` bytes.

PS lookups with local aggregation live in :mod:`.sharded` (they use :func:`local_splits`).
"""
from __future__ import annotations

import tensorflow as tf

from .topology import Topology


def even_sizes(total: int, parts: int) -> list[int]:
    """``total`` split in ``parts`` sizes differing by at most one (larger first)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def tile_rows(x: tf.Tensor, copies: int) -> tf.Tensor:
    """``copies`` copies of ``x`` stacked along its first dimension."""
    return tf.tile(x, tf.concat([[copies], tf.ones([tf.rank(x) - 1], tf.int32)], 0))


class Hierarchy:
    """The two-level collectives of one rank in a uniform topology (module docstring)."""

    def __init__(self, topology: Topology, rank: int):
        import horovod.tensorflow as hvd

        if not topology.uniform:
            raise ValueError(f"local aggregation needs machines of equal rank blocks, got {topology.describe()}")
        self.hvd = hvd
        self.topology = topology
        self.rank = rank
        self.G = topology.workers_per_machine
        self.N = topology.machines
        self.W = topology.ranks
        self.machine, self.local = divmod(rank, self.G)
        self.local_peers = [self.machine * self.G + i for i in range(self.G)]
        self.cross_peers = self.peers_of(self.local)
        # every rank grouped by local index (0 first): the order of blocks that a machine's
        # ranks exchange when rank i handles the owners of local index i
        self.by_local_index = [r for i in range(self.G) for r in self.peers_of(i)]

    def peers_of(self, local_index: int) -> list[int]:
        """The ranks of ``local_index`` on every machine, in machine order."""
        return [k * self.G + local_index for k in range(self.N)]

    # ---------------------------------------------------------------- plumbing
    def splits(self, peers: list[int], sizes) -> tf.Tensor:
        """A length-W split vector: ``sizes[i]`` rows to ``peers[i]``, none to anyone else.
        ``sizes`` may hold Python ints or int32 scalar tensors."""
        by_rank = dict(zip(peers, sizes))
        return tf.stack([tf.cast(by_rank.get(r, 0), tf.int32) for r in range(self.W)])

    def local_splits(self, rows) -> tf.Tensor:
        """``rows`` to every rank of this machine (self included), none elsewhere."""
        return self.splits(self.local_peers, [rows] * self.G)

    def alltoall(self, x: tf.Tensor, splits: tf.Tensor, name: str):
        out, received = self.hvd.alltoall(x, splits=splits, name=name, ignore_name_scope=True)
        return out, received

    def local_gather(self, x: tf.Tensor, name: str) -> tuple[tf.Tensor, tf.Tensor]:
        """The ``x`` of every rank of this machine, concatenated in rank order (and the split
        sizes received). Shared memory only."""
        if self.G == 1:
            return x, tf.reshape(tf.shape(x)[0], [1])
        rows = tf.shape(x)[0]
        return self.alltoall(tile_rows(x, self.G), self.local_splits(rows), name)

    # ---------------------------------------------------------------- dense
    def allreduce(self, grads: list[tf.Tensor], tag: str) -> tuple[list[tf.Tensor], float]:
        """Sum over all W ranks of each gradient, divided by W, through the two-level ring.

        Returns the averaged gradients and the bytes this rank sent to (= received from)
        other machines, a Python number (sizes are static)."""
        shapes = [g.shape for g in grads]
        sizes = [int(s.num_elements()) for s in shapes]
        flat = tf.concat([tf.reshape(g, [-1]) for g in grads], 0)
        chunks = even_sizes(sum(sizes), self.G)
        sub = even_sizes(chunks[self.local], self.N)
        mine = flat
        if self.G > 1:
            received, _ = self.alltoall(flat, self.splits(self.local_peers, chunks), f"px_la_rs_local_{tag}")
            mine = tf.reduce_sum(tf.reshape(received, [self.G, chunks[self.local]]), 0)
        chunk = mine
        if self.N > 1:
            received, _ = self.alltoall(mine, self.splits(self.cross_peers, sub), f"px_la_rs_cross_{tag}")
            reduced = tf.reduce_sum(tf.reshape(received, [self.N, sub[self.machine]]), 0)
            chunk, _ = self.alltoall(tf.tile(reduced, [self.N]),
                                     self.splits(self.cross_peers, [sub[self.machine]] * self.N),
                                     f"px_la_ag_cross_{tag}")
        full = chunk
        if self.G > 1:
            full, _ = self.alltoall(tf.tile(chunk, [self.G]), self.local_splits(chunks[self.local]),
                                    f"px_la_ag_local_{tag}")
        full = full / self.W
        pieces = tf.split(full, sizes) if len(sizes) > 1 else [full]
        averaged = [tf.reshape(p, s) for p, s in zip(pieces, shapes)]
        # reduce-scatter: the other machines' sub-chunks out, N-1 copies of mine in; allgather: reverse
        remote_elements = (chunks[self.local] - sub[self.machine]) + (self.N - 1) * sub[self.machine]
        return averaged, float(remote_elements * flat.dtype.size)

    # ---------------------------------------------------------------- sparse
    def allgather_sparse(self, grad: tf.IndexedSlices, row_bytes: int, tag: str):
        """Every rank's (deduplicated) ``grad``, summed per row over all W ranks and divided by
        W, as one deduplicated ``IndexedSlices``; plus (sent, received) bytes to and from other
        machines (scalar tensors; ``row_bytes`` includes the 8 index bytes)."""
        from .sync import deduplicate

        values, indices = grad.values, grad.indices
        if self.G > 1:
            values, _ = self.local_gather(values, f"px_la_sv_local_{tag}")
            indices, _ = self.local_gather(indices, f"px_la_si_local_{tag}")
            union = deduplicate(tf.IndexedSlices(values, indices, grad.dense_shape))
            values, indices = union.values[self.local::self.G], union.indices[self.local::self.G]
        sent = received = tf.constant(0.0, tf.float64)
        if self.N > 1:
            rows = tf.shape(indices)[0]
            splits = self.splits(self.cross_peers, [rows] * self.N)
            values, got = self.alltoall(tile_rows(values, self.N), splits, f"px_la_sv_cross_{tag}")
            indices, _ = self.alltoall(tf.tile(indices, [self.N]), splits, f"px_la_si_cross_{tag}")
            own = tf.cast(rows, tf.float64) * row_bytes
            sent = own * (self.N - 1)
            received = tf.cast(tf.reduce_sum(got), tf.float64) * row_bytes - own
        if self.G > 1:
            values, _ = self.local_gather(values, f"px_la_sv_share_{tag}")
            indices, _ = self.local_gather(indices, f"px_la_si_share_{tag}")
        return deduplicate(tf.IndexedSlices(values / self.W, indices, grad.dense_shape)), sent, received
