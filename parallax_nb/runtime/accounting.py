"""Bytes on the wire, per rank, for each collective the runtime uses.

Every rank counts what it hands to each collective (from the actual tensor sizes of the
step) and converts it to bytes that leave (``sent``) and arrive at (``received``) this rank
over the network for the algorithm used. Data a rank keeps for itself (its own block of an
alltoall, its own partition) never crosses the wire and is not counted.

With N ranks, for one call:

* ring allreduce of ``s`` bytes: sent = received = 2 * (N - 1) / N * s
  (reduce-scatter then allgather, each moving (N - 1)/N of the tensor).
* allgather(v) of an own block of ``o`` bytes into a total of ``t`` bytes: sent = (N - 1) * o
  (the block reaches every other rank), received = t - o. A ring sends the same total, spread
  differently over ranks; the mean per rank is identical.
* alltoall(v): sent = bytes addressed to other ranks, received = bytes from other ranks.

Per step and variable these sum to the cost model of ``parallax_nb.cost`` (bytes sent +
received per machine per step, one rank per machine): for an AR dense variable of m bytes
4 * m * (N - 1) / N; for a PS sparse variable pull (ids + rows) and push (row gradients) of
the rows a rank touches, of which (N - 1)/N are on average owned by other ranks; for an AR
sparse variable 2 * (N - 1) * (rows touched * (row bytes + 8 index bytes)).
"""
from __future__ import annotations

from collections import defaultdict


def ring_allreduce_bytes(size_bytes: float, ranks: int) -> tuple[float, float]:
    """(sent, received) of one rank in a ring allreduce of ``size_bytes``."""
    moved = 2.0 * (ranks - 1) / ranks * size_bytes if ranks > 1 else 0.0
    return moved, moved


def allgather_bytes(own_bytes, total_bytes, ranks: int):
    """(sent, received) of one rank in an allgather: own block to N-1 ranks, the rest in."""
    return own_bytes * (ranks - 1), total_bytes - own_bytes


class ByteLedger:
    """Collects (sent, received) byte counts per variable while a train step is traced.

    Entries may be Python numbers or scalar tensors of the step; :meth:`totals` sums them per
    variable so that the step function can return them as float64 tensors.
    """

    def __init__(self):
        self._entries: dict[str, list[tuple]] = defaultdict(list)

    def add(self, name: str, sent, received) -> None:
        self._entries[name].append((sent, received))

    def clear(self) -> None:
        self._entries.clear()

    def totals(self, names):
        """(sent, received) of each of ``names`` this step, as one float64 tensor of shape
        (len(names), 2): the step returns it whole, so reading it costs one copy, not one
        eager op per variable."""
        import tensorflow as tf

        rows = []
        for name in names:
            sent = tf.constant(0.0, tf.float64)
            received = tf.constant(0.0, tf.float64)
            for s, r in self._entries.get(name, []):
                sent += tf.cast(s, tf.float64)
                received += tf.cast(r, tf.float64)
            rows.append(tf.stack([sent, received]))
        return tf.stack(rows) if rows else tf.zeros([0, 2], tf.float64)


def interface_totals(interface: str) -> tuple[int, int]:
    """(bytes, packets) received + sent so far by ``interface`` of this process's network
    namespace, from the kernel's interface statistics (headers and every protocol included)."""
    totals = []
    for unit in ("bytes", "packets"):
        total = 0
        for direction in ("rx", "tx"):
            with open(f"/sys/class/net/{interface}/statistics/{direction}_{unit}") as f:
                total += int(f.read())
        totals.append(total)
    return totals[0], totals[1]
