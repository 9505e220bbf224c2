"""Per-variable statistics from the rows each profiled step touched (pure numpy, no TensorFlow).

The profiler hands this module, for every sparse variable, the sorted unique row ids of its
``tf.IndexedSlices`` gradient at each step; everything reported about sparsity is computed
here, so it can be checked against an independent numpy computation from the batches.

Definitions (k profiled steps, R = rows of the variable, S_s = unique rows touched at step s):

- ``alpha_s = |S_s| / R`` (dimensionless, 0..1); mean, p50, p95 and max are over the k steps,
  percentiles with numpy's linear interpolation.
- ``union_rows_by_workers[G-1] = mean over i of |S_i ∪ ... ∪ S_{i+G-1}|`` for every window of
  G consecutive steps (k - G + 1 windows): the unique rows a machine of G workers sends after
  local aggregation. Measured for G = 1 .. min(max_workers, k); longer windows are left to
  :meth:`parallax_nb.types.VariableProfile.alpha_for_workers` to extrapolate.
- ``grad_bytes_per_step`` of a sparse variable = mean over steps of
  ``n_s * (row_bytes + 8)``, where n_s is the length of the gradient's index vector (each
  lookup contributes one row, duplicates included: what the ``IndexedSlices`` occupies) and
  8 bytes is one int64 index. A dense variable's gradient is the whole tensor: ``size_bytes``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..types import Kind, VariableProfile

INDEX_BYTES = 8  # one int64 row index on the wire


def alpha_summary(touched_rows: Sequence[int], rows: int) -> dict[str, float]:
    """Mean, p50, p95 and max of ``touched / rows`` over the steps."""
    alphas = np.asarray(touched_rows, dtype=np.float64) / max(int(rows), 1)
    return {
        "alpha_mean": float(alphas.mean()),
        "alpha_p50": float(np.percentile(alphas, 50)),
        "alpha_p95": float(np.percentile(alphas, 95)),
        "alpha_max": float(alphas.max()),
    }


def union_rows_by_workers(unique_rows_per_step: Sequence[np.ndarray], rows: int,
                          max_workers: int) -> tuple[float, ...]:
    """Mean unique rows touched by G consecutive steps, for G = 1 .. min(max_workers, k).

    One pass per window start: a boolean mask of the R rows grows batch by batch, so each
    window size costs only the ids of the batch it adds (O(k * G_max * ids), not O(R)).
    """
    k = len(unique_rows_per_step)
    g_max = min(int(max_workers), k)
    totals = np.zeros(g_max, dtype=np.float64)
    counts = np.zeros(g_max, dtype=np.int64)
    mask = np.zeros(int(rows), dtype=bool)
    for start in range(k):
        union_size = 0
        marked = []
        for g in range(min(g_max, k - start)):
            ids = unique_rows_per_step[start + g]
            new = ids[~mask[ids]]
            mask[new] = True
            marked.append(new)
            union_size += new.size
            totals[g] += union_size
            counts[g] += 1
        for new in marked:
            mask[new] = False
    return tuple(float(t / c) for t, c in zip(totals, counts))


def sparse_variable_profile(name: str, shape: tuple[int, ...], dtype: str, itemsize: int,
                            unique_rows_per_step: Sequence[np.ndarray], index_counts: Sequence[int],
                            max_workers: int) -> VariableProfile:
    """The profile of a variable whose gradient was a ``tf.IndexedSlices`` at every step."""
    rows = int(shape[0])
    size_bytes = int(np.prod(shape, dtype=np.int64)) * itemsize
    row_bytes = size_bytes / max(rows, 1)
    touched = [int(ids.size) for ids in unique_rows_per_step]
    grad_bytes = float(np.mean([n * (row_bytes + INDEX_BYTES) for n in index_counts]))
    return VariableProfile(
        name=name, shape=shape, dtype=dtype, size_bytes=size_bytes, kind=Kind.SPARSE,
        rows_touched_mean=float(np.mean(touched)), **alpha_summary(touched, rows),
        grad_bytes_per_step=grad_bytes,
        union_rows_by_workers=union_rows_by_workers(unique_rows_per_step, rows, max_workers),
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
