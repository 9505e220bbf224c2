"""How a parameter-server variable's rows are split into partitions and owned by ranks.

Row ``i`` of a variable with ``rows`` rows belongs to partition ``p = i mod P`` at local
index ``i div P``; partition ``p`` is owned by rank ``p mod N``. Striping rows (rather than
contiguous ranges) spreads the hot, low ids of a Zipf vocabulary evenly over partitions, so
each owner serves about the same number of rows and, on average, a fraction (N-1)/N of a
rank's touched rows is remote, the figure the cost model assumes. ``rows`` need not be
divisible by P or N: partition ``p`` has ``ceil((rows - p) / P)`` rows.

Pure numpy helpers for splitting and re-assembling whole arrays live here too (used when
sharding initial values, gathering checkpoints and results).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import PlanError


@dataclass(frozen=True)
class RowPartitioning:
    rows: int
    partitions: int
    ranks: int

    def __post_init__(self):
        if self.partitions < 1:
            raise PlanError(f"a variable needs at least 1 partition, got {self.partitions}")
        if self.rows >= 1 and self.partitions > self.rows:
            raise PlanError(f"{self.partitions} partitions for a variable of {self.rows} rows",
                            hint="use at most as many partitions as the variable has rows")

    def rows_in(self, partition: int) -> int:
        return max(0, -(-(self.rows - partition) // self.partitions))

    def owner(self, partition: int) -> int:
        return partition % self.ranks

    def owned_by(self, rank: int) -> list[int]:
        """Partitions owned by ``rank``, ascending: ``rank, rank + N, rank + 2N, ...``."""
        return list(range(rank, self.partitions, self.ranks))

    def owner_ranks(self) -> list[int]:
        """The ranks that own at least one partition: ``0 .. min(P, N) - 1``."""
        return list(range(min(self.partitions, self.ranks)))

    def rows_owned_by(self, rank: int) -> int:
        return sum(self.rows_in(p) for p in self.owned_by(rank))

    def owner_order(self) -> list[int]:
        """All partitions grouped by owner rank (rank 0's first): the order of every
        gather/allgather of partitions."""
        return [p for r in range(self.ranks) for p in self.owned_by(r)]

    def split(self, array: np.ndarray, partition: int) -> np.ndarray:
        return np.ascontiguousarray(array[partition::self.partitions])

    def assemble(self, parts: dict[int, np.ndarray]) -> np.ndarray:
        """The whole array from all its partitions (``parts[p]`` = rows ``p, p+P, ...``)."""
        first = parts[0]
        full = np.empty((self.rows,) + tuple(first.shape[1:]), dtype=first.dtype)
        for p, part in parts.items():
            full[p::self.partitions] = part
        return full
