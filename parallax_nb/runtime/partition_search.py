"""Automatic partition count for PS variables, as the original Parallax did it.

Time a few steps at a few partition counts P, fit

    t(P) = a + b / P + c * (P - 1)        (seconds per step)

by least squares (``b / P``: per-owner work and transfer that more partitions spread out;
``c * (P - 1)``: the fixed cost each extra partition adds: one more variable, gather and
optimizer update), and take the whole P that minimises the fit within the measured range.
Every rank measures; a step's time is the slowest rank's (what a synchronous step costs).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError


@dataclass(frozen=True)
class PartitionSearch:
    """Measured ``points`` ((P, seconds per step), ...), the fit t(P) = a + b/P + c(P-1) and its
    argmin ``best`` among whole P in [min, max] of the measured counts."""

    points: tuple[tuple[int, float], ...]
    a_s: float
    b_s: float
    c_s: float
    best: int

    def predict(self, partitions: int) -> float:
        return self.a_s + self.b_s / partitions + self.c_s * (partitions - 1)

    def to_dict(self) -> dict:
        return {"points": [{"partitions": p, "step_time_s": t} for p, t in self.points],
                "fit": {"formula": "t(P) = a + b/P + c*(P-1)", "a_s": self.a_s, "b_s": self.b_s, "c_s": self.c_s},
                "best_partitions": self.best}

    def __str__(self) -> str:
        pts = ", ".join(f"P={p}: {t * 1e3:.1f} ms" for p, t in self.points)
        return (f"partition search: {pts}; fit t(P) = {self.a_s * 1e3:.2f} + {self.b_s * 1e3:.2f}/P "
                f"+ {self.c_s * 1e3:.3f}*(P-1) ms -> P = {self.best}")


def fit_partition_model(points) -> PartitionSearch:
    """Least-squares fit of t(P) = a + b/P + c(P-1) to >= 3 distinct (P, seconds) points."""
    points = tuple(sorted((int(p), float(t)) for p, t in points))
    distinct = sorted({p for p, _ in points})
    if len(distinct) < 3:
        raise ConfigError(f"partition search needs at least 3 distinct partition counts, got {distinct}",
                          hint="measure e.g. P = 1, N, 2N")
    P = np.array([p for p, _ in points], dtype=np.float64)
    t = np.array([s for _, s in points], dtype=np.float64)
    design = np.stack([np.ones_like(P), 1.0 / P, P - 1.0], axis=1)
    (a, b, c), *_ = np.linalg.lstsq(design, t, rcond=None)
    candidates = np.arange(distinct[0], distinct[-1] + 1)
    predicted = a + b / candidates + c * (candidates - 1)
    best = int(candidates[int(np.argmin(predicted))])
    return PartitionSearch(points=points, a_s=float(a), b_s=float(b), c_s=float(c), best=best)


def default_candidates(ranks: int, max_rows: int) -> list[int]:
    """N, 2N, 3N and 4N partitions (at most ``max_rows``): every rank owns a partition."""
    values = sorted({ranks, 2 * ranks, 3 * ranks, 4 * ranks})
    values = [v for v in values if v <= max_rows]
    return values[:4] if len(values) >= 3 else values


def search_partitions(job, plan, candidates=None, steps: int = 4, warmup: int = 1) -> PartitionSearch:
    """Measure the step time at each partition count (every PS variable split into P) and fit.

    Collective: call on every rank with the same arguments. ``steps`` timed steps follow
    ``warmup`` untimed ones (the first traces the step function) for every P. Without
    ``candidates``: N, 2N, 3N, 4N (see :func:`default_candidates`).
    """
    from ..types import Method
    from .context import horovod
    from .trainer import Trainer

    if not plan.ps_variables:
        raise ConfigError("partition search needs at least one PS variable in the plan",
                          hint="use --arch ps or hybrid, or a plan with PS variables")
    if candidates is None:
        model = job.build_model()
        rows = [int(v.shape[0]) if len(v.shape) else 1 for v in model.trainable_variables
                if plan.method(v.path) is Method.PS]
        candidates = default_candidates(horovod().size(), min(rows))
    points = [(int(P), _time_steps(Trainer(job, plan, partitions=int(P)), steps, warmup, f"P{P}"))
              for P in candidates]
    return fit_partition_model(points)


def _time_steps(trainer, steps: int, warmup: int, tag: str) -> float:
    import tensorflow as tf

    data = iter(trainer.job.dataset(trainer.rank, trainer.ranks))
    times = []
    for i in range(warmup + steps):
        x, y = next(data)
        start = time.perf_counter()
        trainer.run_step(x, y)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    if trainer.ranks > 1:
        median = float(trainer.hvd.allreduce(tf.constant(median), op=trainer.hvd.Max,
                                             name=f"px_psearch_{tag}").numpy())
    return median
