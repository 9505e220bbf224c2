"""Measured staleness of an asynchronous run (issue 16): how far each rank ran ahead of the slowest.

Definition. When rank r starts its step t (after any stale-synchronous wait), let ``done_r``
be the steps it has finished (t - 1) and ``done_min`` the fewest steps any worker has
finished, as far as r has heard (its own count included). Its **steps ahead** at that step is
``done_r - done_min`` >= 0: the number of the slowest worker's steps whose pushes may be
missing from the values r reads in step t. ``max_staleness = k`` bounds it by k; 0 is
lock-step. A synchronous run has no such figure (every step ends at a barrier).

Per rank the run records one figure per step (``StepRecord.steps_ahead``) and summarises them
as their mean and maximum over every step of the run (the first included: its figure is 0
unless another rank already finished steps). Pure Python: the runtime fills it, the CLI,
run view and report read it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .errors import ConfigError
from .jsonfile import reading_fields

DEFINITION = ("steps ahead = steps this rank had finished minus the fewest any worker had finished, "
              "when it started a step (after any max_staleness wait); mean and max over the run's steps")


@dataclass(frozen=True)
class RankStaleness:
    """One rank's steps ahead of the slowest: ``steps`` figures, their mean and maximum."""

    rank: int
    steps: int
    mean_steps_ahead: float
    max_steps_ahead: int

    @classmethod
    def of(cls, rank: int, steps_ahead: Sequence[int]) -> "RankStaleness":
        figures = [int(s) for s in steps_ahead]
        if any(s < 0 for s in figures):
            raise ConfigError(f"rank {rank}: steps ahead are >= 0, got {figures}")
        return cls(rank=int(rank), steps=len(figures),
                   mean_steps_ahead=float(sum(figures) / len(figures)) if figures else 0.0,
                   max_steps_ahead=max(figures) if figures else 0)

    def to_dict(self) -> dict:
        return {"rank": self.rank, "steps": self.steps, "mean_steps_ahead": self.mean_steps_ahead,
                "max_steps_ahead": self.max_steps_ahead}


@dataclass(frozen=True)
class MeasuredStaleness:
    """Every rank's :class:`RankStaleness` in an asynchronous run with bound ``max_staleness``
    (None: unbounded)."""

    max_staleness: int | None
    ranks: tuple[RankStaleness, ...]

    @classmethod
    def from_steps_ahead(cls, per_rank: Sequence[Sequence[int]], max_staleness: int | None) -> "MeasuredStaleness":
        """``per_rank[r]``: rank r's steps ahead, one per step (``AsyncPS.steps_ahead``)."""
        return cls(max_staleness=max_staleness,
                   ranks=tuple(RankStaleness.of(r, figures) for r, figures in enumerate(per_rank)))

    @property
    def mean_steps_ahead(self) -> float:
        """Mean over every step of every rank."""
        steps = sum(r.steps for r in self.ranks)
        return sum(r.mean_steps_ahead * r.steps for r in self.ranks) / steps if steps else 0.0

    @property
    def max_steps_ahead(self) -> int:
        return max((r.max_steps_ahead for r in self.ranks), default=0)

    def describe(self) -> str:
        """One line, e.g. ``steps ahead of the slowest: mean 0.42, max 1 (rank 0: mean 0.40, max 1; ...)``."""
        per_rank = "; ".join(f"rank {r.rank}: mean {r.mean_steps_ahead:.2f}, max {r.max_steps_ahead}"
                             for r in self.ranks)
        return f"steps ahead of the slowest: mean {self.mean_steps_ahead:.2f}, max {self.max_steps_ahead} ({per_rank})"

    def to_dict(self) -> dict:
        return {"definition": DEFINITION, "max_staleness": self.max_staleness,
                "mean_steps_ahead": self.mean_steps_ahead, "max_steps_ahead": self.max_steps_ahead,
                "per_rank": [r.to_dict() for r in self.ranks]}

    @classmethod
    def from_dict(cls, d: Any, source: str = "measured staleness") -> "MeasuredStaleness":
        if not isinstance(d, dict):
            raise ConfigError(f"{source} must be a mapping, got {type(d).__name__}")
        with reading_fields(source):
            ranks = tuple(RankStaleness(rank=int(r["rank"]), steps=int(r["steps"]),
                                        mean_steps_ahead=float(r["mean_steps_ahead"]),
                                        max_steps_ahead=int(r["max_steps_ahead"])) for r in d["per_rank"])
            k = d.get("max_staleness")
            return cls(max_staleness=None if k is None else int(k), ranks=ranks)


def describe_sync(sync: bool, max_staleness: int | None) -> str:
    """``"synchronous"``, ``"asynchronous, max staleness 2"`` or ``"asynchronous, unbounded staleness"``."""
    if sync:
        return "synchronous"
    return "asynchronous, " + describe_bound(max_staleness)


def describe_bound(max_staleness: int | None) -> str:
    """``"max staleness 2"`` or ``"unbounded staleness"``."""
    return "unbounded staleness" if max_staleness is None else f"max staleness {max_staleness}"
