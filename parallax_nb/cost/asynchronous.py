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
