"""Throughput of synchronous against asynchronous training for a given straggler profile
(issue 16). Pure Python over plain numbers, seconds and examples.

A step of worker r takes ``compute_s[r]`` (its own forward and backward, the profile's
compute time scaled by how slow that rank is) plus ``exchange_s`` (its share of the
variables' communication: a synchronous step's collectives, or an asynchronous worker's own
pull and push, :data:`.methods.METHOD_COSTS`). With W workers of ``batch_size`` examples:

* synchronous: every step ends at a barrier, so all go at the slowest's pace:
  ``W b / (max_r compute_s[r] + exchange_s)`` examples/s;
* asynchronous, unbounded staleness (``max_staleness`` None): each worker at its own pace:
  ``sum_r b / (compute_s[r] + exchange_s)`` examples/s;
* stale-synchronous with a bound k: a worker waits once it is k steps ahead of the slowest,
  so over a run in which the slowest worker does S steps a faster one does at most S + k.
  :func:`examples_per_s` with ``slowest_steps = S`` counts that; without it (the long run,
  S -> infinity) the bound makes every worker go at the slowest's pace, the synchronous
  figure: SSP absorbs stragglers that come and go, not one that stays slow.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..errors import ConfigError


def examples_per_s(compute_s: Sequence[float], exchange_s: float, batch_size: int, sync: bool,
                   max_staleness: int | None = None, slowest_steps: int | None = None) -> float:
    """Examples per second of all workers together (module docstring).

    ``compute_s``: one step's compute time per worker (s); ``exchange_s``: a step's
    communication time (s); ``max_staleness``: the SSP bound k when ``sync`` is False;
    ``slowest_steps``: the run's length in steps of the slowest worker (None: the long run).
    """
    times = [float(c) for c in compute_s]
    if not times or any(not (math.isfinite(c) and c >= 0) for c in times):
        raise ConfigError(f"compute_s must be finite times >= 0 (s), one per worker, got {list(compute_s)!r}")
    if not (math.isfinite(exchange_s) and exchange_s >= 0):
        raise ConfigError(f"exchange_s must be a finite time >= 0 (s), got {exchange_s!r}")
    steps = [c + exchange_s for c in times]
    if min(steps) <= 0:
        raise ConfigError("every worker's step takes some time: compute_s + exchange_s must be > 0")
    slowest = max(steps)
    if sync:
        return len(steps) * batch_size / slowest
    if max_staleness is None:
        return sum(batch_size / s for s in steps)
    if slowest_steps is None:
        return len(steps) * batch_size / slowest
    duration = slowest_steps * slowest
    done = sum(min(math.floor(duration / s), slowest_steps + max_staleness) for s in steps)
    return done * batch_size / duration


@dataclass(frozen=True)
class StragglerOutlook:
    """Predicted examples/s of one plan trained synchronously, asynchronously and
    stale-synchronously when ``slow_workers`` of the ``workers`` compute ``slowdown`` times
    slower (:func:`straggler_outlook`)."""

    workers: int
    slow_workers: int
    slowdown: float
    max_staleness: int | None
    compute_s: float
    exchange_s: float
    sync_examples_per_s: float
    async_examples_per_s: float
    bounded_examples_per_s: float | None

    def lines(self) -> list[str]:
        """What the CLI and the report print: the straggler profile, then one line per mode."""
        who = "1 worker" if self.slow_workers == 1 else f"{self.slow_workers} workers"
        own = self.compute_s + self.exchange_s
        lines = [f"With {who} of {self.workers} {self.slowdown:g}x slower per step (a worker's own step "
                 f"{own * 1e3:.3f} ms, {own * self.slowdown * 1e3:.3f} ms on the slow: compute "
                 f"{self.compute_s * 1e3:.3f} ms + exchange {self.exchange_s * 1e3:.3f} ms, priced as the "
                 f"synchronous PS exchange):",
                 f"  synchronous                {self.sync_examples_per_s:>11.1f} examples/s (everyone at the slowest's pace)",
                 f"  asynchronous, unbounded    {self.async_examples_per_s:>11.1f} examples/s "
                 f"({self.async_examples_per_s / self.sync_examples_per_s:.2f}x sync)"]
        if self.bounded_examples_per_s is not None:
            lines.append(f"  max staleness {self.max_staleness:<12} {self.bounded_examples_per_s:>11.1f} examples/s "
                         f"({self.bounded_examples_per_s / self.sync_examples_per_s:.2f}x sync: a straggler that "
                         f"stays slow holds the others to its pace, k steps ahead at most)")
        return lines


def straggler_outlook(estimate, slowdown: float = 2.0, slow_workers: int = 1,
                      max_staleness: int | None = None) -> StragglerOutlook:
    """:func:`examples_per_s` of ``estimate``'s plan (an :class:`~parallax_nb.types.Estimate`)
    with ``slow_workers`` workers whose own step (compute and exchange, not waiting for the
    others) takes ``slowdown`` times as long as the others' (as ``benchmarks/bench_async.py``
    slows its rank 1), synchronous, asynchronous and, with ``max_staleness``, bounded (the
    long run). An asynchronous worker's own pulls and pushes are priced as the estimate's
    communication (``comm_time_s``): the same bytes, to the same owners; the calibration
    times collectives, not the serving threads' point-to-point messages, which measured
    0.6-1.9 ms per pull or push of 256 KB (``benchmarks/bench_async_ps.py``)."""
    workers = estimate.cluster.workers
    if isinstance(slowdown, bool) or not isinstance(slowdown, (int, float)) or not (math.isfinite(slowdown)
                                                                                     and slowdown >= 1):
        raise ConfigError(f"slowdown must be a finite number >= 1 (how many times slower the straggler "
                          f"computes), got {slowdown!r}")
    if isinstance(slow_workers, bool) or not isinstance(slow_workers, int) or not 0 <= slow_workers <= workers:
        raise ConfigError(f"slow_workers must be a whole number from 0 to the plan's {workers} workers, "
                          f"got {slow_workers!r}")
    if max_staleness is not None and (isinstance(max_staleness, bool) or not isinstance(max_staleness, int)
                                      or max_staleness < 0):
        raise ConfigError(f"max_staleness must be None (unbounded) or a whole number >= 0, got {max_staleness!r}")
    batch = estimate.examples_per_s * estimate.step_time_s / workers
    exchange = estimate.comm_time_s
    own_step = estimate.compute_time_s + exchange
    compute = [own_step * float(slowdown) - exchange if r < slow_workers else estimate.compute_time_s
               for r in range(workers)]
    return StragglerOutlook(
        workers=workers, slow_workers=slow_workers, slowdown=float(slowdown), max_staleness=max_staleness,
        compute_s=estimate.compute_time_s, exchange_s=exchange,
        sync_examples_per_s=examples_per_s(compute, exchange, batch, sync=True),
        async_examples_per_s=examples_per_s(compute, exchange, batch, sync=False),
        bounded_examples_per_s=None if max_staleness is None else examples_per_s(compute, exchange, batch, sync=False,
                                                                                 max_staleness=max_staleness))
