"""The cost side of every synchronisation method: one entry per ``(Method, Kind)``.

:data:`METHOD_COSTS` maps ``(Method, Kind)`` to a function ``(VariableProfile, ClusterSpec) ->
MethodCost``: the bytes one machine's link sends plus receives per step, the int64 index bytes
among them, the sequential message rounds, and the collectives the runtime issues for one
variable per step. The keys ``(ASYNC_PS, kind)`` price the PS variables of an asynchronous
plan (``Plan.sync`` False); they are not a per-variable method a planner chooses. The runtime side keeps one exchange per key in
``parallax_nb.runtime.exchanges.EXCHANGES``; a test keeps the two tables' keys equal, so a new
method (e.g. asynchronous PS) is one entry here, one exchange there, plus their tests.

:data:`BASELINES` maps a baseline's key to one such function per Kind, each as users run
it: plain Horovod's defaults (:data:`PLAIN_HOROVOD`: ``IndexedSlices`` allgathered among all W
ranks, each rank sending its own slices with their duplicate rows, no local aggregation;
dense gradients one fused allreduce), Horovod with ``sparse_as_dense=True``
(:data:`SPARSE_AS_DENSE`) and TensorFlow's parameter-server training (:data:`TF_PS`: every
variable on the servers, each worker pushes and pulls on its own, no local aggregation).
Every formula is in :mod:`parallax_nb.cost.model`.

Collectives describe the runtime as it issues them, each with the bytes one rank hands to
it (what a calibration prices, :mod:`.timing`): a dense allreduce is one grouped call shared
by every dense AR variable (Horovod's tensor fusion); with local aggregation on G > 1 ranks
per machine, sparse collectives first gather inside the machine ("machine"), then exchange
among the ranks of one local index ("cross"), then share inside the machine again.
"""
from __future__ import annotations

import functools
from typing import Callable, Mapping, NamedTuple

from ..types import (ASYNC_PS, PLAIN_HOROVOD, SPARSE_AS_DENSE, TF_PS, ClusterSpec, Collective, Kind, Method, MethodCost,
                     VariableCost, VariableProfile)
from .model import (INDEX_BYTES, allgather_index_bytes, allgather_value_bytes, allgatherv_link_bytes,
                    allreduce_bytes, participants, ps_index_bytes, ps_value_bytes, remote_share, rounds)

CostFunction = Callable[[VariableProfile, ClusterSpec], MethodCost]
#: the one gather that carries every AR sparse variable of one values dtype and row shape with
#: local aggregation on one machine (:func:`ar_sparse`); a cost's ``group`` is this followed by
#: the dtype and the shape
AR_SPARSE_GROUP = "AR sparse, local aggregation on one machine"
#: the one allgather over all ranks that carries every AR sparse variable of one values dtype
#: and row shape without local aggregation (:func:`ar_sparse`); followed by dtype and shape too
AR_SPARSE_ROWS = "AR sparse, one allgather of rows"


def _shape(var: VariableProfile, cluster: ClusterSpec) -> tuple[int, float, float]:
    """``(n, scale, alpha)``: participants, the share of one participant's volume that crosses
    this machine's link times the participants on it (0 on one machine), and the fraction of
    rows a participant sends (the union of G workers with local aggregation)."""
    if cluster.local_aggregation:
        n, g, union_of = cluster.machines, 1, cluster.workers_per_machine
    else:
        n, g, union_of = cluster.machines * cluster.workers_per_machine, cluster.workers_per_machine, 1
    alpha = 1.0 if var.kind is Kind.DENSE else var.alpha_for_workers(union_of)
    return n, g * remote_share(n, g), alpha


def _rounds(collective: str, n: int, cluster: ClusterSpec) -> int:
    return 0 if cluster.machines == 1 else rounds(collective, n)


def _two_level(cluster: ClusterSpec) -> bool:
    """Whether the runtime runs local aggregation's two levels: asked for, and G > 1 (with one
    rank per machine it runs the flat collectives, which move the same bytes)."""
    return cluster.local_aggregation and cluster.workers_per_machine > 1


def _calls(op: str, scope: str, *handed: float) -> Collective:
    """``len(handed)`` calls of ``op`` in ``scope``, one rank handing ``handed[i]`` bytes to call i."""
    return Collective(op, len(handed), scope, float(sum(handed)))


def ar_dense(var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
    """Ring allreduce ``4 m (n-1)/n``, fused with every other dense allreduce of the step; one
    rank hands the whole gradient, ``m`` bytes, to that one call. The runtime keeps it one
    allreduce over all ranks with local aggregation on or off, so it is priced as Horovod's
    flat allreduce over ranks placed machine by machine, whose link bytes Open MPI keeps at
    the two-level figure (measured 2.02 m against 2 m per link on an emulated 2 x 2 network),
    whatever parallax_nb's local-aggregation switch says: the N machines' ``4 m (N-1)/N``
    either way (0 on one machine)."""
    n = cluster.machines
    return MethodCost(allreduce_bytes(var.size_bytes, n) * remote_share(n, 1), 0.0, _rounds("allreduce", n, cluster),
                      (_calls("allreduce", "all", var.size_bytes),), fused_allreduce=True)


def ar_sparse(var: VariableProfile, cluster: ClusterSpec, step: StepAllgathers | None = None) -> MethodCost:
    """Allgatherv of the deduplicated rows: ``2 a m (n-1)`` + indices ``2 * 8 a R (n-1)``.

    Calls (one rank's handed bytes): flat, the runtime sends every variable of one values dtype
    and row shape as rows of one table that carry their ids, in one allgather over all ranks
    (:mod:`parallax_nb.runtime.grouped_rows`): the call is the step's group
    (:data:`AR_SPARSE_ROWS`), counted once per step, and this variable hands it its
    ``a1 (m + 8 R)`` bytes. Two-level (G > 1): gathers of its values and indices inside the
    machine (each tiled to the G ranks: ``G a1 m``, ``G 8 a1 R``), across machines its 1/G of
    the machine's union tiled to N peers (``N aG m / G``, ``N 8 aG R / G``), and shares of the
    N machines' unions inside the machine (``N aG m``, ``N 8 aG R``). On one machine (N = 1) the
    first gather is the whole exchange, and the runtime sends every variable of one values
    dtype and row shape as rows of one table in that one call
    (:meth:`~parallax_nb.runtime.hierarchical.Hierarchy.gather_sparse_group`): the call is the
    step's group (:data:`AR_SPARSE_GROUP`), counted once per step, and this variable hands it
    its ``G a1 (m + 8 R)`` bytes.

    Flat, a machine's link carries what Open MPI's allgatherv algorithm moves across
    (:func:`.model.allgatherv_link_bytes`), chosen by the size of the one call (``step``,
    :func:`step_allgathers`: every sparse variable's rows and ids, taken as if all were on AR
    and of one row shape)."""
    n, scale, alpha = _shape(var, cluster)
    rows, size = var.rows, var.size_bytes
    values, ids = alpha * size, INDEX_BYTES * alpha * rows
    if _two_level(cluster):
        N, G = cluster.machines, cluster.workers_per_machine
        one = var.alpha_for_workers(1)
        index = allgather_index_bytes(alpha, rows, n) * scale
        bytes_ = allgather_value_bytes(alpha, size, n) * scale + index
        own = G * one * (size + INDEX_BYTES * rows)
        if N == 1:   # the one gather of every variable of the group (its bytes stay in the machine)
            return MethodCost(bytes_, index, _rounds("allgather", n, cluster),
                              (Collective("alltoall", 0, "machine", own),),
                              group=f"{AR_SPARSE_GROUP} {var.dtype} {tuple(var.shape[1:])}",
                              grouped=(Collective("alltoall", 1, "machine"),))
        inside = _calls("alltoall", "machine", G * one * size, G * INDEX_BYTES * one * rows,
                        N * values, N * ids)
        return MethodCost(bytes_, index, _rounds("allgather", n, cluster),
                          (inside, _calls("alltoall", "cross", N * values / G, N * ids / G)))
    # flat: Open MPI's allgatherv of the rows with their ids among the n participants, in the
    # one call of every AR sparse variable of the values dtype and row shape
    _, g = participants(cluster)
    call = step and step.ar_values_bytes + step.ar_index_bytes
    index = allgatherv_link_bytes(ids, n, g, call)
    return MethodCost(allgatherv_link_bytes(values, n, g, call) + index, index, _rounds("allgather", n, cluster),
                      (Collective("allgather", 0, "all", values + ids),),
                      group=f"{AR_SPARSE_ROWS} {var.dtype} {tuple(var.shape[1:])}",
                      grouped=(Collective("allgather", 1, "all"),))


def ps_dense(var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
    """Push the gradient to the owners, pull fresh values: ``4 m (n-1)/n``, no indices. With
    local aggregation a machine reduce-scatters inside, pushes and pulls once, then shares.

    Calls: flat, a push (the whole gradient, ``m``) and a pull (the own ``m/W`` tiled to W
    ranks, ``m``). Two-level: inside the machine a reduce-scatter and a share (``m`` each),
    across machines a push and a pull of the rank's ``m/G``."""
    n, scale, _ = _shape(var, cluster)
    m = var.size_bytes
    if _two_level(cluster):
        G = cluster.workers_per_machine
        collectives = (_calls("alltoall", "cross", m / G, m / G), _calls("alltoall", "machine", m, m))
    else:
        collectives = (_calls("alltoall", "all", m, m),)
    return MethodCost(ps_value_bytes(1.0, m, n) * scale, 0.0, _rounds("ps_dense", n, cluster), collectives)


def ps_sparse(var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
    """Touched rows from their owners: ``4 a m (n-1)/n`` + ids ``2 * 8 a R (n-1)/n``
    (alltoalls of ids, rows and row gradients), for one lookup of the variable per step.

    Calls: flat, a rank hands its ``8 a1 R`` unique ids, serves as many rows (``a1 m``) and
    sends their gradients (``a1 m``). Two-level: inside the machine a gather of the ids
    (``G 8 a1 R``), the share of the requested rows and its reverse (``aG m`` each); across
    machines each rank asks for 1/G of the machine's union (``8 aG R / G``, ``aG m / G``,
    ``aG m / G``).

    A variable looked up together with another (``var.lookup_shared_with``: the same ids in
    one ``embedding_lookups`` call) rides that one's exchange: the runtime sends the ids once
    and both variables' rows side by side in the same calls. Its cost is then its rows and
    their gradients only, handed to calls it does not issue (count 0, no rounds). This
    holds while the other variable is on PS too and every id has the same owner in both
    (:func:`~parallax_nb.types.row_owners`), as every architecture, AUTO and the partition
    search keep them. An estimate of a plan that splits them, by method or by partition
    counts, charges :func:`ps_sparse_alone` instead (``pricing.PS_ALONE``), as the runtime
    then serves each in an exchange of its own."""
    return _ps_sparse(var, cluster, own_exchange=not var.lookup_shared_with)


def ps_sparse_alone(var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
    """:func:`ps_sparse` with an exchange of the variable's own, also for a variable looked
    up together with another (TensorFlow's parameter servers serve each lookup on its own)."""
    return _ps_sparse(var, cluster, own_exchange=True)


def _ps_sparse(var: VariableProfile, cluster: ClusterSpec, own_exchange: bool) -> MethodCost:
    n, scale, alpha = _shape(var, cluster)
    rows, size = var.rows, var.size_bytes
    index = ps_index_bytes(alpha, rows, n) * scale if own_exchange else 0.0
    values = alpha * size
    ids = INDEX_BYTES * alpha * rows if own_exchange else 0.0
    if _two_level(cluster):
        G = cluster.workers_per_machine
        one_ids = INDEX_BYTES * var.alpha_for_workers(1) * rows if own_exchange else 0.0
        collectives = (_calls("alltoall", "machine", G * one_ids, values, values),
                       _calls("alltoall", "cross", ids / G, values / G, values / G))
    else:
        collectives = (_calls("alltoall", "all", ids, values, values),)
    if not own_exchange:
        collectives = tuple(Collective(c.op, 0, c.participants, c.handed_bytes) for c in collectives)
    return MethodCost(ps_value_bytes(alpha, size, n) * scale + index, index,
                      _rounds("ps_sparse", n, cluster) if own_exchange else 0, collectives)


#: sequential messages of one asynchronous step: a pull (request, reply) and a push
#: (gradients, acknowledgement), each sent to every owner at once
ASYNC_MESSAGES_PER_STEP = 4


def _asynchronous(synchronous: CostFunction, var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
    """``synchronous``'s PS bytes with every worker a participant of its own (an asynchronous
    worker's pushes and pulls are never combined with its machine's), the row ids sent twice
    (with the pull and again with the push: a push is not the reverse of an exchange the
    owner remembers, as the synchronous backward alltoall is), and no collective: point-to-point
    messages to the owners (:mod:`parallax_nb.runtime.async_ps`), no barrier."""
    flat = _aggregated(cluster, False)
    cost = synchronous(var, flat)
    return MethodCost(cost.bytes_per_step + cost.index_bytes_per_step, 2 * cost.index_bytes_per_step,
                      0 if cluster.machines == 1 else ASYNC_MESSAGES_PER_STEP, ())


def async_ps_dense(var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
    """Asynchronous PS, dense: a worker pulls the whole variable and pushes its whole gradient
    on its own, as the owners' partitions (no row ids): ``4 m (W-1)/W`` per worker (push and
    pull, as worker and as owner), ``W`` workers, no local aggregation. Time: no barrier, each
    worker's step is its own compute plus its own pull and push
    (:func:`parallax_nb.cost.asynchronous.examples_per_s`)."""
    return _asynchronous(ps_dense, var, cluster)


def async_ps_sparse(var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
    """Asynchronous PS, sparse: a worker pulls its unique rows and pushes their gradients on its
    own: ``4 a1 m (W-1)/W`` + ids ``2 * 2 * 8 a1 R (W-1)/W`` per worker (ids go with the pull and
    with the push), no local aggregation, no collective, no barrier."""
    return _asynchronous(ps_sparse_alone, var, cluster)


METHOD_COSTS: Mapping[tuple["Method | str", Kind], CostFunction] = {
    (Method.AR, Kind.DENSE): ar_dense,
    (Method.AR, Kind.SPARSE): ar_sparse,
    (Method.PS, Kind.DENSE): ps_dense,
    (Method.PS, Kind.SPARSE): ps_sparse,
    (ASYNC_PS, Kind.DENSE): async_ps_dense,
    (ASYNC_PS, Kind.SPARSE): async_ps_sparse,
}


@functools.lru_cache(maxsize=64)
def _aggregated(cluster: ClusterSpec, on: bool) -> ClusterSpec:
    return cluster if cluster.local_aggregation == on else cluster.replace(local_aggregation=on)


def sparse_as_dense(var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
    """Horovod ``sparse_as_dense=True``: the gradient densified and allreduced with the step's
    other dense gradients (one fused call over all ranks, ``m`` handed): ``4 m (N-1)/N`` per
    machine as for parallax_nb's dense AR."""
    return ar_dense(var, cluster)


def horovod_dense(var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
    """Plain Horovod's dense gradient: one fused allreduce over all ranks, as parallax_nb's AR."""
    return ar_dense(var, cluster)


def horovod_slices(var: VariableProfile) -> tuple[float, float]:
    """``(values, indices)``: the bytes one rank hands to plain Horovod's two allgathers of
    ``var``'s gradient, the ``IndexedSlices`` as TensorFlow made them (one row per lookup,
    duplicates included): the profiled ``s`` gradient bytes split by row width and index width
    (``var.index_bytes``: int32 ids make int32 indices, which Horovod ships as they are)."""
    width = var.index_bytes
    per_worker = var.grad_bytes_per_step if var.grad_bytes_per_step > 0 else \
        var.alpha_for_workers(1) * var.rows * (var.row_bytes + width)
    index = per_worker * width / (var.row_bytes + width)
    return per_worker - index, index


def horovod_sparse(var: VariableProfile, cluster: ClusterSpec, step: StepAllgathers | None = None) -> MethodCost:
    """Horovod's default for ``IndexedSlices`` as users run it: allgathered among **all W ranks**,
    each rank sending its own slices as TensorFlow made them (:func:`horovod_slices`), no local
    aggregation. Calls: an allgather of the values and one of the indices.

    A machine's link carries what Open MPI's allgatherv algorithm moves across
    (:func:`.model.allgatherv_link_bytes`; ``2 G s (W-G)`` under direct sends), and the algorithm
    follows the size of the MPI call. Horovod fuses the allgathers its background loop finds
    ready together into one call (tensor fusion, as for allreduces): a step's sparse gradients
    leave the backward pass together, and Horovod 0.28's timeline showed the recommender's four
    tables in two ``MPI_Allgatherv`` a step, one of every table's values and one of every
    table's indices. ``step`` (:func:`step_allgathers`) gives those fused calls' sizes; without
    it, the variable's own. The calls stay listed per variable, as the program issues them
    and as parallax_nb's own calls are counted (:mod:`.timing`)."""
    W, G = cluster.workers, cluster.workers_per_machine
    values, index = horovod_slices(var)
    index_link = allgatherv_link_bytes(index, W, G, step and step.horovod_index_bytes)
    return MethodCost(allgatherv_link_bytes(values, W, G, step and step.horovod_values_bytes) + index_link, index_link,
                      0 if cluster.machines == 1 else rounds("allgather", W),
                      (_calls("allgather", "all", values, index),), fused_allgather=True)


class StepAllgathers(NamedTuple):
    """The bytes one rank hands to the fused allgathers of one step, every sparse variable's
    together: plain Horovod's values and indices (:func:`horovod_slices`), and parallax_nb's AR
    of the deduplicated rows without local aggregation (``a1 m`` and ``8 a1 R``)."""

    horovod_values_bytes: float
    horovod_index_bytes: float
    ar_values_bytes: float
    ar_index_bytes: float


def step_allgathers(variables) -> StepAllgathers | None:
    """The :class:`StepAllgathers` of a model's ``variables`` (None without a sparse one)."""
    sparse = [v for v in variables if v.kind is Kind.SPARSE]
    if not sparse:
        return None
    slices = [horovod_slices(v) for v in sparse]
    alphas = [v.alpha_for_workers(1) for v in sparse]
    return StepAllgathers(sum(s[0] for s in slices), sum(s[1] for s in slices),
                          sum(a * v.size_bytes for a, v in zip(alphas, sparse)),
                          sum(INDEX_BYTES * a * v.rows for a, v in zip(alphas, sparse)))


def _without_local_aggregation(cost: CostFunction) -> CostFunction:
    def baseline(var: VariableProfile, cluster: ClusterSpec) -> MethodCost:
        return cost(var, _aggregated(cluster, False))
    baseline.__name__ = f"tf_{cost.__name__}"
    baseline.__doc__ = f"{cost.__name__} with every worker a participant of its own (no local aggregation)."
    return baseline


BASELINES: Mapping[str, Mapping[Kind, CostFunction]] = {
    SPARSE_AS_DENSE: {Kind.DENSE: sparse_as_dense, Kind.SPARSE: sparse_as_dense},
    PLAIN_HOROVOD: {Kind.DENSE: horovod_dense, Kind.SPARSE: horovod_sparse},
    TF_PS: {Kind.DENSE: _without_local_aggregation(ps_dense),
            Kind.SPARSE: _without_local_aggregation(ps_sparse_alone)},
}


# per kind, (key, cost function) for every method and baseline, in the order of Method then BASELINES
_ENTRIES = {kind: [(method.value, METHOD_COSTS[(method, kind)]) for method in Method]
            + [(key, by_kind[kind]) for key, by_kind in BASELINES.items()] for kind in Kind}
# a baseline that is a method's entry on the same cluster: (baseline key, method key, the cluster's
# local aggregation for which they coincide: True, False or None for both); dense only (see the
# baselines' definitions: a dense AR is priced as Horovod's flat allreduce with the switch on or off)
_SAME_AS = ((SPARSE_AS_DENSE, Method.AR.value, None), (PLAIN_HOROVOD, Method.AR.value, None),
            (TF_PS, Method.PS.value, False))


class CostTable(dict):
    """``key -> MethodCost`` of one variable on one cluster: the methods' entries made at once,
    each baseline's on first use (a planner's search over methods needs no baseline). Every
    way of reading the whole table (iteration, ``items()``, ``len``, ``==``) fills it first, so
    it reads as the complete dict it stands for."""

    def __init__(self, var: VariableProfile, cluster: ClusterSpec, step: StepAllgathers | None = None):
        eager, pending, self._reuse = _LAYOUT[var.kind, cluster.local_aggregation]
        self._var, self._cluster, self._step = var, cluster, step
        self._pending = dict(pending)
        # a sparse variable's allgathers priced at the step's fused sizes, where a step is given
        self._fused = _FUSED_ALLGATHERS if step is not None and var.kind is Kind.SPARSE else {}
        super().__init__([(key, self._make(key, cost)) for key, cost in eager])

    def _make(self, key: str, cost: CostFunction) -> MethodCost:
        """The entry of ``key`` (``self._fused``'s function for it, else ``cost``)."""
        fused = self._fused.get(key)
        return fused(self._var, self._cluster, self._step) if fused else cost(self._var, self._cluster)

    def __missing__(self, key):
        cost = self._pending.pop(key, None)
        if cost is None:
            raise KeyError(key)
        value = self[self._reuse[key]] if key in self._reuse else self._make(key, cost)
        dict.__setitem__(self, key, value)
        return value

    def fill(self) -> "CostTable":
        for key in list(self._pending):
            self[key]
        return self

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key):
        return dict.__contains__(self, key) or key in self._pending

    def __iter__(self):
        return dict.__iter__(self.fill())

    def __len__(self):
        return dict.__len__(self.fill())

    def keys(self):
        return dict.keys(self.fill())

    def values(self):
        return dict.values(self.fill())

    def items(self):
        return dict.items(self.fill())

    def __eq__(self, other):
        if isinstance(other, CostTable):
            other.fill()
        return dict.__eq__(self.fill(), other)

    def __ne__(self, other):
        return not self == other

    __hash__ = None

    def __repr__(self):
        return dict.__repr__(self.fill())

    def __reduce__(self):
        return dict, (dict(self.fill()),)


# the sparse entries whose allgathers Horovod fuses across a step's variables
_FUSED_ALLGATHERS = {Method.AR.value: ar_sparse, PLAIN_HOROVOD: horovod_sparse}

# per (kind, local aggregation): the methods' entries, the baselines' (made on first use) and
# which baseline shares which entry
_LAYOUT = {(kind, aggregated): (_ENTRIES[kind][:len(Method)], dict(_ENTRIES[kind][len(Method):]),
                                {key: method for key, method, on in _SAME_AS
                                 if kind is Kind.DENSE and on in (None, aggregated)})
           for kind in Kind for aggregated in (True, False)}


def method_costs(var: VariableProfile, cluster: ClusterSpec) -> dict[str, MethodCost]:
    """Every method's and every baseline's cost of ``var``, keyed by ``Method.value`` or baseline key
    (a :class:`CostTable`: baselines made on first use). A dense variable's baseline that
    coincides with a method's entry on this cluster (e.g. plain Horovod's allreduce and AR with
    local aggregation on) shares that entry's value."""
    return CostTable(var, cluster)


def variable_cost(var: VariableProfile, cluster: ClusterSpec, step: StepAllgathers | None = None) -> VariableCost:
    """``var``'s bytes per machine per step under every method and baseline of the tables above.

    ``alpha`` is ``alpha_for_workers(G)`` with local aggregation and ``alpha_for_workers(1)``
    without (1 for a dense variable). ``step``: the sizes of the fused allgathers in the step of
    ``var``'s model (:func:`step_allgathers`), which choose Open MPI's algorithm for a sparse
    variable's AR and plain Horovod bytes; without it, the variable's own sizes.
    """
    n, g = participants(cluster)
    alpha = 1.0 if var.kind is Kind.DENSE else \
        var.alpha_for_workers(cluster.workers_per_machine if cluster.local_aggregation else 1)
    return VariableCost(var.name, var.kind, var.size_bytes, var.rows, alpha, n, g, CostTable(var, cluster, step))
