"""Per-variable statistics from the rows each profiled step touched (pure numpy, no TensorFlow).

The profiler hands this module, for every sparse variable, the sorted unique row ids of its
``tf.IndexedSlices`` gradient at each step; everything reported about sparsity is computed
here, so it can be checked against an independent numpy computation from the batches.

Definitions (k profiled steps, R = rows of the variable, S_s = unique rows touched at step s):

- ``alpha_s = |S_s| / R`` (dimensionless, 0..1); mean, p50, p95 and max are over the k steps,
  percentiles with numpy's linear interpolation.
- ``union_rows_by_workers[G-1] = mean over i of |S(i, b_i) ∪ ... ∪ S(i, b_{i+G-1})|``, where
  ``S(i, b)`` = rows touched by batch b at the state of step i, for every window of G
  consecutive batches (k - G + 1 windows): the unique rows a machine of G workers sends
  after local aggregation. The workers of one step share its state, so rows drawn from the
  state rather than the batch (sampled candidates) count once per window. Measured for
  G = 1 .. min(max_workers, k); longer windows are left to
  :meth:`parallax_nb.types.VariableProfile.alpha_for_workers` to extrapolate.
- ``grad_bytes_per_step`` of a sparse variable = mean over steps of
  ``n_s * (row_bytes + index_bytes)``, where n_s is the length of the gradient's index vector
  (each lookup contributes one row, duplicates included: what the ``IndexedSlices`` occupies)
  and ``index_bytes`` the width of its indices as TensorFlow made them (4 for int32 ids, 8 for
  int64). A dense variable's gradient is the whole tensor: ``size_bytes``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..types import Kind, VariableProfile


def alpha_summary(touched_rows: Sequence[int], rows: int) -> dict[str, float]:
    """Mean, p50, p95 and max of ``touched / rows`` over the steps."""
    alphas = np.asarray(touched_rows, dtype=np.float64) / max(int(rows), 1)
    return {
        "alpha_mean": float(alphas.mean()),
        "alpha_p50": float(np.percentile(alphas, 50)),
        "alpha_p95": float(np.percentile(alphas, 95)),
        "alpha_max": float(alphas.max()),
    }


def union_rows_by_workers(windows: Sequence[Sequence[np.ndarray]], max_workers: int) -> tuple[float, ...]:
    """Mean unique rows of G workers' batches at one step state, for G = 1 .. max_workers.

    ``windows[i]`` holds the unique row ids of consecutive batches ``i, i+1, ...`` all
    evaluated at the state of profiled step i (its first entry is step i's own rows): the
    G workers of one distributed step see the same state, so rows that come from the state
    and not from the batch (an LM's sampled-softmax candidates, drawn from a step counter)
    count once per window, batch rows once per batch. ``union[G-1]`` is the mean over the
    windows with at least G batches (the last windows of a profile are shorter); G stops at
    the longest window.
    """
    g_max = min(int(max_workers), max((len(w) for w in windows), default=0))
    sums, counts = np.zeros(g_max), np.zeros(g_max)
    for window in windows:
        union = np.zeros(0, dtype=np.int64)
        for g, ids in enumerate(window[:g_max]):
            union = np.union1d(union, np.asarray(ids, dtype=np.int64))
            sums[g] += union.size
            counts[g] += 1
    return tuple(float(sums[g] / counts[g]) for g in range(g_max))


def sparse_variable_profile(name: str, shape: tuple[int, ...], dtype: str, itemsize: int,
                            unique_rows_per_step: Sequence[np.ndarray], index_counts: Sequence[int],
                            max_workers: int, windows: Sequence[Sequence[np.ndarray]] | None = None,
                            index_bytes: int = 8) -> VariableProfile:
    """The profile of a variable whose gradient was a ``tf.IndexedSlices`` at every step.

    ``windows``: see :func:`union_rows_by_workers`; without them each step's own rows make a
    window of one batch (no union measured beyond G = 1). ``index_bytes``: the width of the
    gradient's indices (4 or 8)."""
    if windows is None:
        windows = [[ids] for ids in unique_rows_per_step]
    rows = int(shape[0])
    size_bytes = int(np.prod(shape, dtype=np.int64)) * itemsize
    row_bytes = size_bytes / max(rows, 1)
    touched = [int(ids.size) for ids in unique_rows_per_step]
    grad_bytes = float(np.mean([n * (row_bytes + index_bytes) for n in index_counts]))
    return VariableProfile(
        name=name, shape=shape, dtype=dtype, size_bytes=size_bytes, kind=Kind.SPARSE,
        rows_touched_mean=float(np.mean(touched)), **alpha_summary(touched, rows),
        grad_bytes_per_step=grad_bytes,
        union_rows_by_workers=union_rows_by_workers(windows, max_workers), index_bytes=index_bytes,
    )


def dense_variable_profile(name: str, shape: tuple[int, ...], dtype: str, itemsize: int,
                           steps: int, max_workers: int) -> VariableProfile:
    """A dense variable touches every row at every step: alpha 1, union = rows, whole tensor sent."""
    rows = int(shape[0]) if shape else 1
    size_bytes = int(np.prod(shape, dtype=np.int64)) * itemsize
    return VariableProfile(
        name=name, shape=shape, dtype=dtype, size_bytes=size_bytes, kind=Kind.DENSE,
        rows_touched_mean=float(rows), alpha_mean=1.0, alpha_p50=1.0, alpha_p95=1.0, alpha_max=1.0,
        grad_bytes_per_step=float(size_bytes),
        union_rows_by_workers=tuple(float(rows) for _ in range(min(int(max_workers), steps))),
    )
