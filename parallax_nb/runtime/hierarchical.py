"""Local aggregation: collectives that combine a machine's gradients before anything crosses
machines (Parallax's local aggregation; DESIGN.md §5, cost model in :mod:`parallax_nb.cost.model`).

The topology must be uniform: N machines of G ranks, rank ``r`` on machine ``r // G`` at local
index ``j = r % G`` (see :mod:`.topology`). Every step is a Horovod ``alltoall``, so one
mechanism serves both levels:

* *local* steps exchange only with the G ranks of the own machine, inside the machine's
  Horovod process set: shared memory, and neither bytes nor Horovod's coordination of the
  step cross the machine's link;
* *cross* steps exchange only with the N ranks of the same local index on every machine, so
  each machine's G ranks share the network work and every byte crosses machines once. They
  run over all ranks with zero-length parts to the rest (those to the own machine's ranks
  stay in shared memory): Horovod coordinates every process set in every cycle, so a
  set per local index would add its own rounds of messages across the links all the time,
  while Horovod's coordination of all ranks crosses them anyway.

Callers describe a step by a split vector over all W ranks (:meth:`Hierarchy.splits`, zero
for ranks it does not talk to); :meth:`Hierarchy.alltoall` runs a step whose peers are the own
machine in the machine's process set and hands back what was received as a vector over all
W ranks again. Every rank asks for the N machine sets in the same order when its Hierarchy
is built (a collective; :func:`.context.process_sets`).

Dense gradients are not aggregated here: a flat allreduce over ranks placed machine by
machine already crosses machines about as a two-level ring would, in one collective instead
of four chained ones (:mod:`.exchanges.dense_allreduce`).

Sparse allgather (:meth:`Hierarchy.allgather_sparse`): the machine's ranks gather their
deduplicated slices and sum them into the machine's union of rows (alpha_G of the rows);
rank j sends every j-th row of that union to its peers of local index j on the other
machines; a last local gather gives every rank the union of every machine. A machine sends
its union once to each of the N - 1 other machines: ``2 * alpha_G * (m + 8 R) * (N - 1)`` bytes.
On one machine the first gather is the whole exchange, and every sparse AR variable of one
values dtype and row shape rides the same call, as rows of one table that carry their ids
(:meth:`Hierarchy.gather_sparse_group`). Across machines every variable keeps its own calls:
the same grouping there (three calls a step for all variables) ran the recommender's AR step
in 8.2-10.1 ms against 12.8-13.9 ms on 2 x 2 emulated ranks, but the compute between its
three dependent calls and the ranks' skew on shared cores are not in the cost model, which
then priced it at half what it measured and led AUTO to it where HYBRID was faster
(benchmarks/README.md).

PS lookups with local aggregation live in :mod:`.exchanges.sparse_ps` (they use :func:`local_splits`).
"""
from __future__ import annotations

import weakref

import tensorflow as tf

from .grouped_rows import gather_summed
from .tensor_ops import deduplicate, tile_rows
from .topology import Topology


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
        self._sets: dict[tuple[int, ...], object] = {}   # peers -> Horovod process set of a step
        if self.G > 1:
            from .context import process_sets

            machine_sets = process_sets([list(range(k * self.G, (k + 1) * self.G)) for k in range(self.N)])
            self._sets[tuple(self.local_peers)] = machine_sets[self.machine]
        self._peers_of_splits: dict[int, tuple] = {}   # id(split vector) -> (weak ref, peers)

    @property
    def machine_set(self):
        """The Horovod process set of this rank's machine (None with one rank per machine)."""
        return self._sets.get(tuple(self.local_peers))

    def peers_of(self, local_index: int) -> list[int]:
        """The ranks of ``local_index`` on every machine, in machine order."""
        return [k * self.G + local_index for k in range(self.N)]

    # ---------------------------------------------------------------- plumbing
    def splits(self, peers: list[int], sizes) -> tf.Tensor:
        """A length-W split vector: ``sizes[i]`` rows to ``peers[i]``, none to anyone else.
        ``sizes`` may hold Python ints or int32 scalar tensors."""
        by_rank = dict(zip(peers, sizes))
        vector = tf.stack([tf.cast(by_rank.get(r, 0), tf.int32) for r in range(self.W)])
        key = id(vector)
        self._peers_of_splits[key] = (weakref.ref(vector, lambda _: self._peers_of_splits.pop(key, None)),
                                      tuple(peers))
        return vector

    def local_splits(self, rows) -> tf.Tensor:
        """``rows`` to every rank of this machine (self included), none elsewhere."""
        return self.splits(self.local_peers, [rows] * self.G)

    def alltoall(self, x: tf.Tensor, splits: tf.Tensor, name: str):
        """``x`` split by ``splits`` (over all W ranks) to its peers; (what arrived, rows
        received from each of the W ranks). Runs in the machine's process set when ``splits``
        was made by :meth:`splits` for the machine's ranks (module docstring), else over all ranks."""
        entry = self._peers_of_splits.get(id(splits))
        peers = entry[1] if entry is not None and entry[0]() is splits else None
        process_set = self._sets.get(peers)
        if process_set is None:
            return self.hvd.alltoall(x, splits=splits, name=name, ignore_name_scope=True)
        out, received = self.hvd.alltoall(x, splits=tf.gather(splits, peers), name=name, ignore_name_scope=True,
                                          process_set=process_set)
        return out, tf.scatter_nd(tf.constant(peers)[:, None], received, [self.W])

    def local_gather(self, x: tf.Tensor, name: str) -> tuple[tf.Tensor, tf.Tensor]:
        """The ``x`` of every rank of this machine, concatenated in rank order (and the split
        sizes received). Shared memory only."""
        if self.G == 1:
            return x, tf.reshape(tf.shape(x)[0], [1])
        rows = tf.shape(x)[0]
        return self.alltoall(tile_rows(x, self.G), self.local_splits(rows), name)

    # ---------------------------------------------------------------- sparse
    def allgather_sparse(self, grad: tf.IndexedSlices, row_bytes: int, tag: str):
        """Every rank's (deduplicated) ``grad``, summed per row over all W ranks and divided by
        W, as one deduplicated ``IndexedSlices``; plus (sent, received) bytes to and from other
        machines (scalar tensors; ``row_bytes`` includes the 8 index bytes). On one machine
        :meth:`gather_sparse_group` serves every variable at once instead."""
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

    def gather_sparse_group(self, grads: list[tf.IndexedSlices], tag: str) -> list[tf.IndexedSlices]:
        """One machine (N = 1, G > 1): every rank's deduplicated ``grads`` (one per variable, all
        of one values dtype and row shape), summed per row over the W ranks and divided by W, in
        one gather inside the machine whatever the number of variables: it already holds every
        rank's rows, so nothing is exchanged or shared after it.

        The variables travel as one table whose rows carry their ids (:mod:`.grouped_rows`)."""
        def gather(packed):
            rows = tf.shape(packed)[0]
            return self.alltoall(tile_rows(packed, self.G), self.local_splits(rows), f"px_la_group_local_{tag}")[0]

        return gather_summed(grads, self.W, gather)[0]

