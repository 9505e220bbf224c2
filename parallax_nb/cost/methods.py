"""The cost side of every synchronisation method: one entry per ``(Method, Kind)``.

:data:`METHOD_COSTS` maps ``(Method, Kind)`` to a function ``(VariableProfile, ClusterSpec) ->
MethodCost``: the bytes one machine's link sends plus receives per step, the int64 index bytes
among them, the sequential message rounds, and the collectives the runtime issues for one
variable per step. The runtime side keeps one exchange per key in
``parallax_nb.runtime.exchanges.EXCHANGES``; a test keeps the two tables' keys equal, so a new
method (e.g. asynchronous PS) is one entry here, one exchange there, plus their tests.

:data:`BASELINES` maps a baseline's key to one such function per Kind: plain Horovod's
defaults (:data:`PLAIN_HOROVOD`: ``IndexedSlices`` allgathered among all W ranks with their
duplicate rows, no local aggregation), Horovod with ``sparse_as_dense=True``
(:data:`SPARSE_AS_DENSE`) and TensorFlow's parameter-server training (:data:`TF_PS`: every
variable on the servers, each worker pushes and pulls on its own, no local aggregation).
Every formula is in :mod:`parallax_nb.cost.model`.

Collectives describe the runtime as it issues them: a dense allreduce is one grouped call
shared by every dense AR variable (Horovod's tensor fusion); with local aggregation on G > 1
ranks per machine, sparse collectives first gather inside the machine ("machine"), then
exchange among the ranks of one local index ("cross"), then share inside the machine again.
"""
from __future__ import annotations

from typing import Callable, Mapping

from ..types import (PLAIN_HOROVOD, SPARSE_AS_DENSE, TF_PS, ClusterSpec, Collective, Kind, Method, MethodCost,
                     VariableCost, VariableProfile)
from .model import (INDEX_BYTES, allgather_duplicates_bytes, allgather_index_bytes, allgather_value_bytes,
                    allreduce_bytes, participants, ps_index_bytes, ps_value_bytes, remote_share, rounds)

CostFunction = Callable[[VariableProfile, ClusterSpec], MethodCost]


def _shape(var: VariableProfile, cluster: ClusterSpec) -> tuple[int, float, float]:
    """``(n, scale, alpha)``: participants, the share of one participant's volume that crosses
    this machine's link times the participants on it (0 on one machine), and the fraction of
    rows a participant sends (the union of G workers with local aggregation)."""
    n, g = participants(cluster)
    alpha = var.alpha_for_workers(cluster.workers_per_machine if cluster.local_aggregation else 1)
    return n, g * remote_share(n, g), alpha


def _rounds(collective: str, n: int, cluster: ClusterSpec) -> int:
    return 0 if cluster.machines == 1 else rounds(collective, n)


def _two_level(cluster: ClusterSpec, flat: tuple, machine: int, cross: int) -> tuple:
    """``flat`` collectives among all ranks, or, with local aggregation on G > 1 ranks per
    machine, ``machine`` alltoalls inside the machine and ``cross`` among one local index."""
    if cluster.local_aggregation and cluster.workers_per_machine > 1:
        return Collective("alltoall", machine, "machine"), Collective("alltoall", cross, "cross")
    return flat


def ar_dense(var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
    """Ring allreduce ``4 m (n-1)/n``, fused with every other dense allreduce of the step."""
    n, scale, _ = _shape(var, cluster)
    return MethodCost(allreduce_bytes(var.size_bytes, n) * scale, 0.0, _rounds("allreduce", n, cluster),
                      (Collective("allreduce", 1, "all"),), fused_allreduce=True)


def ar_sparse(var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
    """Allgatherv of the deduplicated rows: ``2 a m (n-1)`` + indices ``2 * 8 a R (n-1)``."""
    n, scale, alpha = _shape(var, cluster)
    index = allgather_index_bytes(alpha, var.rows, n) * scale
    return MethodCost(allgather_value_bytes(alpha, var.size_bytes, n) * scale + index, index,
                      _rounds("allgather", n, cluster),
                      _two_level(cluster, (Collective("allgather", 2, "all"),), machine=4, cross=2))


def ps_dense(var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
    """Push the gradient to the owners, pull fresh values: ``4 m (n-1)/n``, no indices. With
    local aggregation a machine reduce-scatters inside, pushes and pulls once, then shares."""
    n, scale, _ = _shape(var, cluster)
    return MethodCost(ps_value_bytes(1.0, var.size_bytes, n) * scale, 0.0, _rounds("ps_dense", n, cluster),
                      _two_level(cluster, (Collective("alltoall", 2, "all"),), machine=2, cross=2))


def ps_sparse(var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
    """Touched rows from their owners: ``4 a m (n-1)/n`` + ids ``2 * 8 a R (n-1)/n``
    (alltoalls of ids, rows and row gradients)."""
    n, scale, alpha = _shape(var, cluster)
    index = ps_index_bytes(alpha, var.rows, n) * scale
    return MethodCost(ps_value_bytes(alpha, var.size_bytes, n) * scale + index, index,
                      _rounds("ps_sparse", n, cluster),
                      _two_level(cluster, (Collective("alltoall", 3, "all"),), machine=3, cross=3))


METHOD_COSTS: Mapping[tuple[Method, Kind], CostFunction] = {
    (Method.AR, Kind.DENSE): ar_dense,
    (Method.AR, Kind.SPARSE): ar_sparse,
    (Method.PS, Kind.DENSE): ps_dense,
    (Method.PS, Kind.SPARSE): ps_sparse,
}


def sparse_as_dense(var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
    """Horovod ``sparse_as_dense=True``: the gradient densified and ring-allreduced, ``4 m (n-1)/n``."""
    n, scale, _ = _shape(var, cluster)
    return MethodCost(allreduce_bytes(var.size_bytes, n) * scale, 0.0, _rounds("allreduce", n, cluster),
                      (Collective("allreduce", 1, "all"),), fused_allreduce=True)


def horovod_sparse(var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
    """Horovod's default for ``IndexedSlices``: allgathered among all W ranks as TensorFlow made
    them, one row per lookup with duplicates: ``2 c s (n-1)`` for ``s`` profiled gradient bytes
    per worker and ``c`` slices per participant (G under local aggregation, 1 without); indices
    not split out. Under local aggregation this is the machine's G slices crossing its link
    once per other machine, as a ring allgather over ranks placed machine by machine does
    (Horovod does not combine them; the figure is the existing model's, unchanged)."""
    n, scale, _ = _shape(var, cluster)
    slices = cluster.workers_per_machine if cluster.local_aggregation else 1
    per_worker = var.grad_bytes_per_step if var.grad_bytes_per_step > 0 else \
        var.alpha_for_workers(1) * var.rows * (var.row_bytes + INDEX_BYTES)
    return MethodCost(allgather_duplicates_bytes(slices * per_worker, n) * scale, 0.0,
                      _rounds("allgather", n, cluster), (Collective("allgather", 2, "all"),))


def _without_local_aggregation(cost: CostFunction) -> CostFunction:
    def baseline(var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
        return cost(var, cluster.replace(local_aggregation=False))
    baseline.__doc__ = f"{cost.__name__} with every worker a participant of its own (no local aggregation)."
    return baseline


BASELINES: Mapping[str, Mapping[Kind, CostFunction]] = {
    SPARSE_AS_DENSE: {Kind.DENSE: sparse_as_dense, Kind.SPARSE: sparse_as_dense},
    PLAIN_HOROVOD: {Kind.DENSE: ar_dense, Kind.SPARSE: horovod_sparse},
    TF_PS: {Kind.DENSE: _without_local_aggregation(ps_dense), Kind.SPARSE: _without_local_aggregation(ps_sparse)},
}


def method_costs(var: VariableProfile, cluster: ClusterSpec) -> dict[str, MethodCost]:
    """Every method's and every baseline's cost of ``var``, keyed by ``Method.value`` or baseline key."""
    costs = {method.value: METHOD_COSTS[(method, var.kind)](var, cluster) for method in Method}
    costs.update({key: by_kind[var.kind](var, cluster) for key, by_kind in BASELINES.items()})
    return costs


def variable_cost(var: VariableProfile, cluster: ClusterSpec) -> VariableCost:
    """``var``'s bytes per machine per step under every method and baseline of the tables above.

    ``alpha`` is ``alpha_for_workers(G)`` with local aggregation and ``alpha_for_workers(1)``
    without (1 for a dense variable).
    """
    n, g = participants(cluster)
    return VariableCost(name=var.name, kind=var.kind, size_bytes=var.size_bytes, rows=var.rows,
                        alpha=_shape(var, cluster)[2], participants=n, participants_per_machine=g,
                        methods=method_costs(var, cluster))
