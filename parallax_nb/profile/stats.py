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
                          max_workers: int, chunk_columns: int = 1 << 20) -> tuple[float, ...]:
    """Mean unique rows touched by G consecutive steps, for G = 1 .. min(max_workers, k).

    Vectorised: ``counts[s, u]`` = how many of the first s steps touched row u (a cumulative
    sum over steps), and row u is in the window ``[i, i+G)`` iff
    ``counts[i+G, u] - counts[i, u] > 0``. Columns are the rows of the table, or for a table
    of more than ``chunk_columns`` rows the touched rows renumbered 0..U-1, processed at most
    ``chunk_columns`` at a time (columns are independent): memory <= (k+1) x chunk int32.
    """
    k = len(unique_rows_per_step)
    g_max = min(int(max_workers), k)
    if g_max == 0:
        return ()
    sizes = [ids.size for ids in unique_rows_per_step]
    all_ids = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in unique_rows_per_step])
    steps_of = np.repeat(np.arange(k), sizes)
    if rows <= chunk_columns:  # small table: the row id is the column
        column, touched_rows = all_ids, int(rows)
    else:  # large table: renumber the touched rows 0..U-1
        _, column = np.unique(all_ids, return_inverse=True)
        touched_rows = int(column.max()) + 1 if column.size else 0
    union_sums = np.zeros(g_max, dtype=np.float64)  # summed over all windows of each size
    for first in range(0, touched_rows, chunk_columns):
        in_chunk = (column >= first) & (column < first + chunk_columns)
        width = min(chunk_columns, touched_rows - first)
        counts = np.zeros((k + 1, width), dtype=np.int32)
        counts[steps_of[in_chunk] + 1, column[in_chunk] - first] = 1  # each step's ids are unique
        np.cumsum(counts, axis=0, out=counts)
        for g in range(1, g_max + 1):
            union_sums[g - 1] += np.count_nonzero(counts[g:] - counts[:-g])
    return tuple(float(union_sums[g - 1] / (k - g + 1)) for g in range(1, g_max + 1))


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
