"""One exchange per (Method, Kind): how a variable's gradient (and, for PS, its rows) crosses
the ranks inside the train step (DESIGN.md §5, §9). The cost side's table
(``parallax_nb.cost.methods.METHOD_COSTS``) has the same keys.

| (method, kind) | exchange | collectives per step (no local aggregation) |
|---|---|---|
| AR, dense | :class:`DenseAllreduce` | 1 allreduce per dense AR variable, fused by Horovod (charged as 1) |
| AR, sparse | :class:`SparseAllgather` | 1 allgather per values dtype and row shape (rows with their ids) |
| PS, dense | :class:`DensePS` | 2 alltoalls per variable (push, pull) |
| PS, sparse | :class:`SparsePS` | 3 alltoalls per lookup (ids, rows, row gradients); variables looked up together at the same ids share them |
| ASYNC_PS, dense | :class:`AsyncDensePS` | none: a pull and a push per variable, point to point |
| ASYNC_PS, sparse | :class:`AsyncSparsePS` | none: a pull per lookup and a push, point to point |

Every collective carries an explicit name (``px_<what>_<variable>``): Horovod pairs
collectives across ranks by name, and the graphs of ranks that own different partitions
differ. Each exchange counts the bytes it hands to MPI, read from the tensors (or the split
sizes) it passes, turned into bytes on the wire by its algorithm's factor (:mod:`.base`).

Dividing by W turns the sum of per-rank mean-loss gradients into the gradient of the mean
loss over the global batch of W * b examples, which single-device training with that batch
computes.
"""
from __future__ import annotations

from types import MappingProxyType

from .async_pull_push import AsyncDensePS, AsyncSparsePS
from .base import Exchange, Wire
from .dense_allreduce import DenseAllreduce
from .dense_ps import DensePS
from .sparse_allgather import SparseAllgather
from .sparse_ps import SparsePS

EXCHANGES = MappingProxyType({(c.method, c.kind): c for c in (DenseAllreduce, SparseAllgather, DensePS, SparsePS,
                                                               AsyncDensePS, AsyncSparsePS)})

__all__ = ["EXCHANGES", "Exchange", "Wire", "DenseAllreduce", "SparseAllgather", "DensePS", "SparsePS",
           "AsyncDensePS", "AsyncSparsePS"]
