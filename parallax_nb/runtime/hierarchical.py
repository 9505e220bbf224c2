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

Sparse allgather (:meth:`Hierarchy.allgather_sparse_group`): the machine's ranks gather their
deduplicated slices and sum them into the machine's union of rows (alpha_G of the rows);
rank j sends every j-th row of that union to its peers of local index j on the other
machines; a last local gather gives every rank the union of every machine. A machine sends
its union once to each of the N - 1 other machines: ``2 * alpha_G * (m + 8 R) * (N - 1)`` bytes.
Every sparse AR variable of a step (of one values dtype) travels in the same three calls,
packed into one byte buffer per call (:func:`pack_slices`): a step's calls do not grow with
its tables. Measured on the recommender (4 tables), 2 x 2 emulated ranks at 1 Gbit/s, AR with
local aggregation: 24 alltoalls a step before, 3 after, the step 12.8-13.0 ms before and
8.3-8.6 ms after (benchmarks/README.md).

PS lookups with local aggregation live in :mod:`.exchanges.sparse_ps` (they use :func:`local_splits`).
"""
from __future__ import annotations

import weakref

import tensorflow as tf

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
    def allgather_sparse_group(self, grads: list[tf.IndexedSlices], tag: str) -> list[tuple]:
        """Every rank's deduplicated ``grads`` (one per variable), summed per row over all W
        ranks and divided by W (module docstring), in one call per level: the rows of every
        variable (deduplicated, int64 indices, one values dtype) travel packed
        in one byte buffer (:func:`pack_slices`), so a step issues two gathers inside the
        machine and one exchange across machines whatever the number of variables (on one
        machine the first gather alone: it already holds every rank's rows). Per variable:
        (summed ``IndexedSlices``, bytes sent to and received from other machines)."""
        parts = [(g.values, g.indices) for g in grads]
        shapes = [g.values.shape[1:] for g in grads]
        row_bytes = [int(_elements(shape)) * g.values.dtype.size + g.indices.dtype.size
                     for g, shape in zip(grads, shapes)]
        dtype = grads[0].values.dtype
        if self.G > 1:
            parts = self._gather_packed(parts, self.local_peers, self.G, dtype, shapes, f"px_la_group_local_{tag}")
            if self.N == 1:   # the machine's union is every rank's: nothing to exchange or share
                return [(deduplicate(tf.IndexedSlices(v / self.W, i, g.dense_shape)), tf.constant(0.0, tf.float64),
                         tf.constant(0.0, tf.float64)) for (v, i), g in zip(parts, grads)]
            parts = [_share(v, i, g.dense_shape, self.local, self.G) for (v, i), g in zip(parts, grads)]
        moved = [(tf.constant(0.0, tf.float64), tf.constant(0.0, tf.float64))] * len(grads)
        if self.N > 1:
            own = [tf.cast(tf.shape(i)[0], tf.float64) * b for (_, i), b in zip(parts, row_bytes)]
            parts = self._gather_packed(parts, self.cross_peers, self.N, dtype, shapes, f"px_la_group_cross_{tag}")
            moved = [(o * (self.N - 1), tf.cast(tf.shape(i)[0], tf.float64) * b - o)
                     for o, (_, i), b in zip(own, parts, row_bytes)]
        if self.G > 1:
            parts = self._gather_packed(parts, self.local_peers, self.G, dtype, shapes, f"px_la_group_share_{tag}")
        return [(deduplicate(tf.IndexedSlices(v / self.W, i, g.dense_shape)), sent, received)
                for (v, i), g, (sent, received) in zip(parts, grads, moved)]

    def _gather_packed(self, parts: list[tuple], peers: list[int], copies: int, dtype, shapes, name: str) -> list[tuple]:
        """Every peer's (values, indices) of each variable, concatenated in peer order: one
        alltoall of the packed buffer tiled to the ``copies`` peers."""
        packed = pack_slices(parts)
        out, received = self.alltoall(tf.tile(packed, [copies]), self.splits(peers, [tf.size(packed)] * copies), name)
        blocks = tf.split(out, received, num=self.W)
        unpacked = [unpack_slices(blocks[r], dtype, shapes) for r in peers]
        return [(tf.concat([b[k][0] for b in unpacked], 0), tf.concat([b[k][1] for b in unpacked], 0))
                for k in range(len(parts))]



def _elements(shape) -> int:
    out = 1
    for d in shape:
        out *= int(d)
    return out


def _share(values: tf.Tensor, indices: tf.Tensor, dense_shape, local: int, G: int) -> tuple:
    """The machine's union of the gathered rows, every ``G``-th row from ``local`` on: the share
    this rank sends across machines."""
    union = deduplicate(tf.IndexedSlices(values, indices, dense_shape))
    return union.values[local::G], union.indices[local::G]


def pack_slices(parts: list[tuple]) -> tf.Tensor:
    """Several variables' (values, int64 indices) as one uint8 buffer: their row counts (int32),
    then each variable's values and indices, as bytes. :func:`unpack_slices` reverses it."""
    counts = tf.stack([tf.shape(i)[0] for _, i in parts])
    pieces = [counts] + [t for pair in parts for t in pair]
    return tf.concat([tf.reshape(tf.bitcast(t, tf.uint8), [-1]) for t in pieces], 0)


def unpack_slices(block: tf.Tensor, dtype, shapes) -> list[tuple]:
    """The (values of ``dtype`` with rows of ``shapes[k]``, int64 indices) of each variable in
    one :func:`pack_slices` buffer."""
    n = len(shapes)
    counts = tf.bitcast(tf.reshape(block[:4 * n], [n, 4]), tf.int32)
    sizes = []
    for k, shape in enumerate(shapes):
        sizes += [counts[k] * (_elements(shape) * dtype.size), counts[k] * 8]
    pieces = tf.split(block[4 * n:], tf.stack(sizes), num=2 * n)
    out = []
    for k, shape in enumerate(shapes):
        values = tf.bitcast(tf.reshape(pieces[2 * k], [-1, dtype.size]), dtype) if dtype.size > 1 else \
            tf.bitcast(pieces[2 * k], dtype)
        out.append((tf.reshape(values, [-1, *shape]), tf.bitcast(tf.reshape(pieces[2 * k + 1], [-1, 8]), tf.int64)))
    return out
