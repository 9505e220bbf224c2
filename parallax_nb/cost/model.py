"""The communication cost model: bytes and message rounds per machine per step, per variable.

Pure Python over plain numbers (no TensorFlow), so a 1,000-variable plan recomputes in
milliseconds.

Symbols and units
-----------------
``m``  size of the variable, bytes; ``R`` its rows (first dimension); ``m / R`` bytes per row.
``N``  machines; ``G`` workers per machine; ``W = N * G`` workers (ranks).
``a``  fraction of the R rows one participant sends in one step (alpha, 0..1; 1 when dense).
``n``  participants in a collective; ``g`` participants on one machine.
``I = 8`` bytes per row index (int64: parallax_nb's exchanges send ids as int64; plain
Horovod's allgathered indices are as wide as TensorFlow made them, ``VariableProfile.index_bytes``).

Every figure is the bytes **sent plus received** by one machine's link to the network in one
step, an expectation over steps (a real number, not rounded; a test compares to the byte with
a tolerance of half a byte). Traffic inside a machine (shared memory, PCIe, NVLink) is free.

Who participates (local aggregation)
------------------------------------
* With local aggregation (``ClusterSpec.local_aggregation``, the default) the G workers of a
  machine first combine their gradients inside the machine, so one participant per machine
  crosses the network: ``n = N``, ``g = 1``, and ``a = alpha_G``, the fraction of rows touched
  by the **union** of G batches (``VariableProfile.alpha_for_workers(G)``, measured by the
  profiler, not assumed to be ``G * alpha``).
* Without it every worker is a participant on its own: ``n = W``, ``g = G``, ``a = alpha_1``.

Per-participant volume (to and from all its peers)
--------------------------------------------------
* dense allreduce (ring: reduce-scatter then allgather)      ``4 * m * (n-1) / n``
* PS values: a participant pulls its remote rows, pushes their gradients, and, as owner of
  ``1/n`` of the rows, receives the others' gradients for them and sends them the values:
  ``4 * a * m * (n-1) / n``; the ids travel once to the owners and are received once by them:
  ``2 * I * a * R * (n-1) / n``
* AR of a sparse gradient (allgatherv of values and of indices): each participant's
  ``a * m`` bytes reach its ``n-1`` peers and theirs reach it: ``2 * a * m * (n-1)``, indices
  ``2 * I * a * R * (n-1)`` (what crosses machines: below)
* sparse-as-dense AR: the sparse gradient densified, then allreduced: ``4 * m * (n-1) / n``
* PS of a dense variable: the PS formula with ``a = 1`` and no indices, ``4 * m * (n-1) / n``.
* plain Horovod's default for a sparse gradient (the ``horovod`` baseline): the
  ``IndexedSlices`` allgathered as TensorFlow made it among all W ranks, one row per lookup,
  duplicates included, so the profiled ``grad_bytes_per_step`` (``s`` bytes of values +
  indices per worker) replaces ``a * (m + I * R)``, never locally aggregated. parallax_nb's
  own AR sums duplicates first, so its AR figure uses the unique rows.

From participants to one machine's link
---------------------------------------
A machine carries the traffic of its g participants with peers on **other** machines. We
assume each participant's volume is spread evenly over its ``n-1`` peers (exact for the
all-to-all exchange of the PS; the volume of a ring), so the share that leaves the machine is
``r = (n - g) / (n - 1)`` (``r = 0`` when ``N = 1``):

    machine bytes = g * r * per-participant bytes

(This is "G times one worker's bytes among W participants" scaled by r, the share of a
worker's peers that live on other machines; without r a single machine of G workers would
seem to use the network.)

An allgatherv among ranks of several per machine (plain Horovod's, parallax_nb's AR without
local aggregation) is the exception: what crosses depends on the algorithm Open MPI picks for
the size, and a ring or a neighbour exchange relays each slice into a machine once instead of
to each of its ranks (:func:`allgatherv_link_bytes`, :mod:`parallax_nb.allgatherv`). On 2 x 2 ranks a
machine carries 6, 8 or 10 slices by size, where ``2 g r (n-1) = 8``; on 8 x 6, 94 in a ring
against 504. With one participant per machine every algorithm but the gather and broadcast of slices
under a few hundred bytes moves ``2 (n-1)`` slices.

With local aggregation ``g = 1, r = 1`` and the figures are DESIGN.md §6's formulas with N
machines. Without it, PS figures become ``G`` times the per-machine formula with N
(e.g. ``4 * G * m * (N-1) / N``), and the sparse AR figure is the allgatherv's among all W
ranks (above): ``2 * G**2 * alpha_1 * m * (N-1)`` under direct sends, less where the algorithm
relays. Local aggregation also removes the duplicate rows of a machine's G batches. The
dense allreduce is the exception (:func:`parallax_nb.cost.methods.ar_dense`): the runtime
issues the same allreduce over all ranks either way, and over ranks placed machine by machine
Open MPI's allreduce crosses as the two-level figure, so it is charged that figure either way.

Message rounds (latency)
------------------------
A collective of n participants costs sequential rounds, each charged ``latency_s``: ring
allreduce ``2 (n-1)`` (reduce-scatter, allgather); sparse AR ``2 (n-1)`` (one ring allgather
of values and one of indices); sparse PS ``3 (n-1)`` (three pairwise alltoalls: ids to owners,
rows back, gradients to owners); dense PS ``2 (n-1)`` (reduce-scatter of the gradient to the
owners, allgather of the fresh values). Nothing crosses machines when ``N = 1``: 0 rounds.
Partitions do not change bytes or rounds here: rows are assumed spread evenly over the owners.
With fewer partitions than participants (P < N) only P ranks own rows: the total is the same
(a rank's rows are local with probability 1/N either way), but it is concentrated on the
owners and their machines' links, which this per-participant average does not show. The
partition count trades per-owner work against per-partition overhead, which the runtime's
partition search measures.
"""
from __future__ import annotations

from ..types import ClusterSpec
from ..allgatherv import crossing_slices

INDEX_BYTES = 8  # one int64 row index
_ROUNDS_PER_PEER = {"allreduce": 2, "allgather": 2, "ps_sparse": 3, "ps_dense": 2}


def participants(cluster: ClusterSpec) -> tuple[int, int]:
    """``(n, g)``: participants per collective and participants sharing one machine's link."""
    if cluster.local_aggregation:
        return cluster.machines, 1
    return cluster.workers, cluster.workers_per_machine


def remote_share(n: int, g: int) -> float:
    """``r = (n - g) / (n - 1)``: share of a participant's volume exchanged with other machines."""
    return (n - g) / (n - 1) if n > g else 0.0


def allreduce_bytes(size_bytes: float, n: int) -> float:
    """Ring allreduce, one participant: ``4 * m * (n-1) / n`` bytes (2 sent + 2 received halves)."""
    return 4.0 * size_bytes * (n - 1) / n


def ps_value_bytes(alpha: float, size_bytes: float, n: int) -> float:
    """PS pull + push as worker and as owner, one participant: ``4 * a * m * (n-1) / n`` bytes."""
    return 4.0 * alpha * size_bytes * (n - 1) / n


def ps_index_bytes(alpha: float, rows: int, n: int) -> float:
    """PS row ids, sent once to the owners and received once by them: ``2 * 8 * a * R * (n-1) / n``."""
    return 2.0 * INDEX_BYTES * alpha * rows * (n - 1) / n


def allgather_value_bytes(alpha: float, size_bytes: float, n: int) -> float:
    """Allgatherv of ``a * m`` bytes per participant: ``2 * a * m * (n-1)`` bytes."""
    return 2.0 * alpha * size_bytes * (n - 1)


def allgather_index_bytes(alpha: float, rows: int, n: int) -> float:
    """Allgatherv of the row indices: ``2 * 8 * a * R * (n-1)`` bytes."""
    return 2.0 * INDEX_BYTES * alpha * rows * (n - 1)


def allgatherv_link_bytes(slice_bytes: float, n: int, g: int, call_bytes: float | None = None) -> float:
    """One allgatherv of ``slice_bytes`` per participant among n participants placed g to a
    machine: the bytes one machine's link sends plus receives as Open MPI's algorithm for that
    size moves them (:func:`parallax_nb.allgatherv.crossing_slices`), the mean over the
    machines; ``2 * slice_bytes * g * (n-g)`` under direct sends, ``2 * slice_bytes * (n-1)``
    for every algorithm with one participant per machine; 0 on one machine. ``call_bytes``:
    what each participant hands to the whole call when these slices ride a fused one (the
    algorithm follows the call's size), else ``slice_bytes``."""
    return 2.0 * slice_bytes * crossing_slices(n, g, slice_bytes if call_bytes is None else call_bytes)


def rounds(collective: str, n: int) -> int:
    """Sequential message rounds of one collective among n participants (0 when n = 1)."""
    return _ROUNDS_PER_PEER[collective] * (n - 1)
