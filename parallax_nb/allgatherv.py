"""How Open MPI runs an allgatherv, and what of it crosses one machine's link.

Horovod allgathers a sparse gradient (plain Horovod's ``IndexedSlices``, parallax_nb's AR of a
sparse variable without local aggregation) with one ``MPI_Allgatherv`` per tensor. Open MPI
4.1's ``coll/tuned`` component picks the algorithm from the communicator's size and the mean
bytes each rank contributes (its fixed decision rules), and the algorithms differ in what
crosses the machines' links when ranks are placed machine by machine (ranks ``0..G-1`` on the
first machine, and so on):

* **direct sends** (each slice straight to every rank of other machines): ``G (W-G)`` slices
  leave a machine; this is the two-process exchange (W = 2);
* **ring**: each slice passes from rank to rank, so it enters every other machine once: a
  machine sends ``W-1`` slices, whatever G is;
* **Bruck**: ``log2 W`` steps, at step k each rank sends what it holds to the rank ``2^k``
  below it: on 2 x 2 ranks 5 slices leave a machine (direct: 4), on 4 x 2 ranks 13 (12);
* **neighbour exchange** (an even W; odd falls back to the ring): pairs, then 2 slices at a
  time between alternating neighbours;
* **gather to rank 0 and broadcast** (Open MPI's "default", for slices of a few hundred bytes).

Measured on the emulated networks (``px.calibrate``, the allgatherv's link bytes per byte a
rank hands, both directions, the per-call overhead taken out; 2 x 2 ranks, 2026-11-28): 6.13
at 4 KiB (the ring: 6), 9.38 at 64 KiB (Bruck: 10), 7.36-7.78 at 1-4 MiB (neighbour exchange:
8); on 4 x 2 ranks 25.4-26.5 at 256 B-4 MiB (Bruck: 26). Direct sends would say 8 and 24 at
every size.

:func:`crossing_slices` gives the slices one machine's link carries one way per call, the
mean over the machines, by playing the algorithm's messages (:func:`messages`) over ranks
placed machine by machine. Other MPI libraries and NCCL choose differently; this module
describes the stack parallax_nb runs (Open MPI 4.1 over TCP). Pure Python.
"""
from __future__ import annotations

import functools

DIRECT = "direct"
RING = "ring"
BRUCK = "bruck"
NEIGHBOUR = "neighbour exchange"
GATHER_BCAST = "gather and broadcast"

# Open MPI 4.1 coll/tuned, fixed decision for MPI_Allgatherv: per communicator size (below
# the bound), the algorithm for a mean contribution per rank below each byte bound (the last
# bound is None: every larger size).
_RULES = (
    (8, ((256, GATHER_BCAST), (4096, NEIGHBOUR), (8192, RING), (16384, NEIGHBOUR), (262144, BRUCK), (None, NEIGHBOUR))),
    (16, ((1024, GATHER_BCAST), (None, BRUCK))),
    (32, ((128, GATHER_BCAST), (262144, BRUCK), (None, RING))),
    (64, ((256, GATHER_BCAST), (8192, BRUCK), (None, RING))),
    (128, ((256, GATHER_BCAST), (4096, BRUCK), (None, RING))),
    (256, ((1024, BRUCK), (65536, NEIGHBOUR), (None, RING))),
    (512, ((1024, BRUCK), (None, RING))),
    (1024, ((512, BRUCK), (1024, GATHER_BCAST), (4096, BRUCK), (1048576, NEIGHBOUR), (None, RING))),
    (None, ((4096, BRUCK), (None, NEIGHBOUR))),
)


def algorithm(ranks: int, bytes_per_rank: float) -> str:
    """The algorithm Open MPI 4.1 runs for an allgatherv among ``ranks`` ranks whose
    contributions average ``bytes_per_rank`` bytes."""
    if ranks <= 2:
        return DIRECT
    for size_bound, by_bytes in _RULES:
        if size_bound is None or ranks < size_bound:
            for byte_bound, name in by_bytes:
                if byte_bound is None or bytes_per_rank < byte_bound:
                    return RING if name == NEIGHBOUR and ranks % 2 else name
    raise AssertionError("the last rule has no bound")


def messages(name: str, ranks: int) -> tuple[tuple[int, int, int], ...]:
    """``(sender, receiver, slices)`` of every message of one allgatherv by ``name`` among
    ``ranks`` ranks, a slice being one rank's contribution."""
    return tuple(m for pattern, repeats in _steps(name, ranks) for _ in range(repeats) for m in pattern)


@functools.lru_cache(maxsize=256)
def _steps(name: str, ranks: int) -> tuple[tuple[tuple[tuple[int, int, int], ...], int], ...]:
    """The algorithm's messages as ``(one step's messages, how many steps send them)``: a ring
    repeats one step W-1 times and a neighbour exchange alternates two, so counting them costs
    O(W) per step pattern, not O(W^2)."""
    W = ranks
    if name == DIRECT:
        return (tuple((s, r, 1) for s in range(W) for r in range(W) if s != r), 1),
    if name == RING:
        return (tuple((s, (s + 1) % W, 1) for s in range(W)), W - 1),
    if name == BRUCK:
        out, distance = [], 1
        while distance < W:
            out.append((tuple((s, (s - distance) % W, min(distance, W - distance)) for s in range(W)), 1))
            distance *= 2
        return tuple(out)
    if name == NEIGHBOUR:
        def step(which: int, slices: int) -> tuple:
            # even ranks pair with the rank above them in step 0 and the even steps after it,
            # with the rank below in the odd steps; odd ranks the other way round
            return tuple((s, (s + 1) % W if (s % 2 == 0) == (which == 0) else (s - 1) % W, slices) for s in range(W))
        later = W // 2 - 1
        return tuple(pattern for pattern in ((step(0, 1), 1), (step(1, 2), (later + 1) // 2), (step(0, 2), later // 2))
                     if pattern[1] > 0)
    if name == GATHER_BCAST:
        # a gather to rank 0, then a binomial tree from it: each rank receives the whole result
        # from the rank that is it without its highest set bit
        return ((tuple((s, 0, 1) for s in range(1, W)), 1),
                (tuple((r - (1 << (r.bit_length() - 1)), r, W) for r in range(1, W)), 1))
    raise ValueError(f"unknown allgatherv algorithm {name!r}")


def crossing_slices(ranks: int, per_machine: int, bytes_per_rank: float | None) -> float:
    """Slices (one rank's contribution each) that one machine's link carries **one way** in one
    allgatherv among ``ranks`` ranks placed ``per_machine`` to a machine, the mean over the
    machines: the algorithm Open MPI runs at ``bytes_per_rank`` played message by message
    (direct sends where the size is None). 0 when all ranks share one machine."""
    if per_machine < 1 or ranks % per_machine:
        raise ValueError(f"{ranks} ranks do not fill machines of {per_machine}")
    machines = ranks // per_machine
    if machines < 2:
        return 0.0
    name = DIRECT if bytes_per_rank is None else algorithm(ranks, bytes_per_rank)
    return _crossing(name, ranks, per_machine) / machines


@functools.lru_cache(maxsize=1024)
def _crossing(name: str, ranks: int, per_machine: int) -> int:
    if name == DIRECT:   # every rank to each rank of the other machines
        return ranks * (ranks - per_machine)
    return sum(repeats * sum(n for s, r, n in pattern if s // per_machine != r // per_machine)
               for pattern, repeats in _steps(name, ranks))


def direct_slices(ranks: int, per_machine: int) -> float:
    """Slices one machine's link carries one way under direct sends: ``G (W-G)``."""
    return float(per_machine * (ranks - per_machine))
