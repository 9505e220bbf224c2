"""Everything the estimates of one ``(profile, cluster, calibration)`` share, computed once: each
variable's costs under every method and baseline (:mod:`.methods`), and the time of the calls
they issue under the calibration (:mod:`.timing`). The plan's estimate, the whole-model ones
and AUTO's search all read one :class:`Pricing`, which :func:`pricing` keeps while the same
inputs come back (a 1,000-variable replan stays within milliseconds).

A step's totals are sums over the variables of what each one's charged cost adds. Per cost
key those additions are kept as lists in profile order (:class:`_Column`), and a total picks
each variable's entry from its key's column and sums them in profile order: the same
additions in the same order as a loop over the variables, without rebuilding them for every
plan a planner or AUTO prices.
"""
from __future__ import annotations

from typing import Sequence

from ..errors import ConfigError
from ..types import (BASELINE_KEYS, Architecture, ClusterSpec, Estimate, Kind, Method, Profile, VariableCost,
                     format_bytes, partitions_served, row_owners)
from .choice import choose_method
from .kept import Kept
from .methods import ps_sparse_alone, step_allgathers, variable_cost
from .link import predict_link_bytes
from .model import participants, rounds
from .timing import (CallTime, calibration_for, call_time, compute_time_s, distinct_groups, duration, link_floor_s,
                     own_calls, payload_shares, rides_fused_allreduce, time_basis, with_fused_call)

#: the charged-cost key of a PS variable looked up together with one it is not served with: the
#: other is not on PS, or their partitions give some row id other owners (:meth:`Pricing.charged_keys`)
PS_ALONE = "ps (own exchange)"

# the planner asks for one cluster with local aggregation on and off; more only feeds the GC
_PRICINGS = Kept(2)


def check_profile(profile, who: str = "the cost model",
                  hint: str = "profile the job first (px.profile(job)) or load one with Profile.from_json(path)") -> None:
    """A ConfigError naming ``who`` and the type given unless ``profile`` is a Profile."""
    if not isinstance(profile, Profile):
        raise ConfigError(f"{who} needs a parallax_nb Profile, got {type(profile).__name__}", hint=hint)


def check_inputs(profile, cluster, who: str = "the cost model", **profile_hint) -> None:
    """:func:`check_profile`, then a ConfigError unless ``cluster`` is a ClusterSpec."""
    check_profile(profile, who, **profile_hint)
    if not isinstance(cluster, ClusterSpec):
        raise ConfigError(f"{who} needs a ClusterSpec, got {type(cluster).__name__}",
                          hint='build one with ClusterSpec.create(machines=8, bandwidth="10Gbit/s")')


def variable_costs(profile: Profile, cluster: ClusterSpec, variables=None) -> list[VariableCost]:
    """:func:`variable_cost` of every variable of ``profile`` (or of ``variables``, the same
    model's as a run served them), in order, the sparse variables' allgathers priced at the
    size of the step's fused calls (:func:`.methods.step_allgathers`). A dense
    variable's costs depend on its bytes alone, so dense variables of one size share one
    table of entries (a model repeats its layers' shapes)."""
    variables = profile.variables if variables is None else variables
    by_size: dict[int, VariableCost] = {}
    fused = _step_allgathers(variables)
    out = []
    for v in variables:
        if v.kind is not Kind.DENSE:
            out.append(variable_cost(v, cluster, fused))
            continue
        same = by_size.get(v.size_bytes)
        if same is None:
            same = by_size[v.size_bytes] = variable_cost(v, cluster)
            out.append(same)
        else:
            out.append(VariableCost(v.name, v.kind, v.size_bytes, v.rows, same.alpha, same.participants,
                                    same.participants_per_machine, same.methods))
    return out


_STEP_ALLGATHERS = Kept(2)
_NOT_KEPT = object()


def _step_allgathers(variables):
    """:func:`.methods.step_allgathers` of ``variables``, kept for a profile's own (immutable)
    tuple of them: it depends on the variables alone, and AUTO prices local aggregation on and
    off from the same profile."""
    if type(variables) is not tuple:
        return step_allgathers(variables)
    kept = _STEP_ALLGATHERS.get(id(variables), variables, _NOT_KEPT)   # None: no sparse variable
    return kept if kept is not _NOT_KEPT else _STEP_ALLGATHERS.put(id(variables), variables, step_allgathers(variables))


class Pricing:
    """The costs and call times of every variable of ``profile`` on ``cluster`` under a
    calibration (checked against the cluster's shape; defaults when None), computed once."""

    def __init__(self, profile: Profile, cluster: ClusterSpec, calibration=None,
                 costs: Sequence[VariableCost] | None = None):
        check_inputs(profile, cluster)
        self.profile = profile
        self.cluster = cluster
        self.calibration = calibration_for(cluster, calibration)
        self.costs = list(costs) if costs is not None else variable_costs(profile, cluster)
        self._times: dict[str, list[CallTime]] = {}
        self._columns: dict[str, _Column] = {}
        self._bytes: dict[str, list[float]] = {}
        self._cost_parts: dict[int, tuple] = {}
        self._architectures: dict[Architecture, Estimate] = {}
        self._methods: dict[Architecture, list[Method]] = {}
        self._totals: dict[tuple, Estimate] = {}
        self._sparse = [c.kind is Kind.SPARSE for c in self.costs]
        at = {v.name: i for i, v in enumerate(profile.variables)}
        #: variables looked up together (``VariableProfile.lookup_shared_with``): index of the
        #: first -> indices of the others, in profile order
        self.lookup_groups: dict[int, list[int]] = {}
        for i, v in enumerate(profile.variables):
            if v.lookup_shared_with:
                self.lookup_groups.setdefault(at[v.lookup_shared_with], []).append(i)
        self._alone: list | None = None

    def charged(self, key: str) -> list:
        """Per variable, its cost under ``key``: a Method value, a baseline key, or
        :data:`PS_ALONE` (PS with an exchange of its own, :func:`.methods.ps_sparse_alone`)."""
        if key != PS_ALONE:
            return [c.cost_of(key) for c in self.costs]
        if self._alone is None:
            self._alone = [ps_sparse_alone(v, self.cluster) if v.lookup_shared_with else c.cost_of(Method.PS)
                           for v, c in zip(self.profile.variables, self.costs)]
        return self._alone

    def bytes_per_step(self, key: str) -> list[float]:
        """Per variable, the bytes per machine per step of its cost under ``key`` (as
        :meth:`charged`): what AUTO compares and explains, without the rest of a
        :meth:`column`."""
        column = self._columns.get(key)
        if column is not None:
            return column.bytes
        if key not in self._bytes:
            self._bytes[key] = [c.bytes_per_step for c in self.charged(key)]
        return self._bytes[key]

    def times(self, key: str) -> list[CallTime]:
        """Per variable, the call time of its cost under ``key`` (as :meth:`charged`)."""
        if key not in self._times:
            ranks = self.cluster.workers
            priced: dict[int, CallTime] = {}   # by cost entry: dense variables of one size share theirs
            times = []
            for cost in self.charged(key):
                time = priced.get(id(cost))
                if time is None:
                    time = priced[id(cost)] = call_time(cost, self.calibration, ranks)
                times.append(time)
            self._times[key] = times
        return self._times[key]

    def charged_keys(self, label: str, methods: Sequence[Method], apart: frozenset = frozenset()) -> list[str]:
        """Per variable, the key of the cost it is charged: the baseline's, else its method's; a
        variable on PS that is looked up together with one not on PS, or served apart from it
        (``apart``, :meth:`served_apart`), has its own exchange (:data:`PS_ALONE`), which the
        table's PS entry (riding the other's) leaves out."""
        if label in BASELINE_KEYS:
            return [label] * len(self.costs)
        keys = [m.value for m in methods]
        for first, others in self.lookup_groups.items():
            for i in others:
                if methods[i] is Method.PS and (methods[first] is not Method.PS or i in apart):
                    keys[i] = PS_ALONE
        return keys

    def served_apart(self, partitions: Sequence[int] | None) -> frozenset:
        """Indices of the variables looked up together with another that the runtime serves in
        an exchange of their own under ``partitions`` (per variable, profile order; None: one
        count for all, as every plan parallax_nb makes): their partitions give some row id
        another owner (:func:`~parallax_nb.types.row_owners`), counted as the runtime serves
        them (:func:`~parallax_nb.types.partitions_served`)."""
        if not partitions or not self.lookup_groups:
            return frozenset()
        ranks, variables = self.cluster.workers, self.profile.variables

        def owners(i):
            return row_owners(partitions_served(partitions[i], variables[i].rows), ranks)

        return frozenset(i for first, others in self.lookup_groups.items() for i in others
                         if owners(i) != owners(first))

    def column(self, key: str) -> "_Column":
        """What each variable adds to a step's totals when charged ``key``'s cost."""
        if key not in self._columns:
            self._columns[key] = _Column(self.charged(key), self.times(key), self._parts)
        return self._columns[key]

    def _parts(self, cost) -> tuple:
        """(rides the fused allreduce, own calls, payload shares) of one charged cost, once per
        entry (dense variables of one size share theirs)."""
        made = self._cost_parts.get(id(cost))
        if made is None:
            shares = payload_shares(cost, self.cluster) if self.cluster.machines > 1 else []
            made = self._cost_parts[id(cost)] = (rides_fused_allreduce(cost), own_calls(cost), shares)
        return made

    def total(self, label: str, methods: Sequence[Method], explanations: tuple[str, ...] = (),
              partitions: Sequence[int] | None = None) -> Estimate:
        """Sum the charged costs' bytes and rounds and the calls' time (module docstring).

        A baseline ``label`` (:data:`BASELINE_KEYS`) charges every variable that baseline's cost;
        otherwise each variable is charged its method's cost from :data:`.methods.METHOD_COSTS`,
        with the lookups the runtime serves apart under ``partitions`` (:meth:`served_apart`)
        each in its own exchange. The same inputs give the same (frozen) Estimate back.
        """
        apart = self.served_apart(partitions)
        memo = (label, tuple(methods), tuple(explanations), apart)
        made = self._totals.get(memo)
        if made is None:
            made = self._totals[memo] = self._total(label, methods, explanations, apart)
        return made

    def _total(self, label, methods, explanations, apart) -> Estimate:
        profile, cluster, costs = self.profile, self.cluster, self.costs
        picked = _Picked(self, self.charged_keys(label, methods, apart))
        bytes_ = picked.values("bytes")
        total = sum(bytes_)
        index = sum(picked.values("index"))
        sparse = sum([b if s else 0.0 for b, s in zip(bytes_, self._sparse)])
        dense = sum([0.0 if s else b for b, s in zip(bytes_, self._sparse)])
        by_method: dict[str, float] = {}
        for key, at in picked.groups.items():
            method = Method.PS.value if key == PS_ALONE else key
            by_method[method] = by_method.get(method, 0.0) + sum([picked.columns[key].bytes[i] for i in at])
        fused_allreduce = any(picked.values("fused"))
        messages = sum(picked.values("messages"))
        if fused_allreduce and cluster.machines > 1:
            messages += rounds("allreduce", participants(cluster)[0])
        groups = picked.step_groups()
        messages += sum(g.rounds for g in groups)
        comm = with_fused_call(sum(picked.values("time")), sum(picked.values("latency")), sum(picked.values("calls")),
                               sum(picked.values("fused_bytes")), self.calibration, groups)
        floor = link_floor_s(total, self.calibration) if cluster.machines > 1 else 0.0
        comm_s = max(comm.comm_time_s, floor)
        compute = compute_time_s(profile, self.calibration, label)
        step = compute + comm_s
        basis = time_basis(profile, self.calibration, label)
        if floor > comm.comm_time_s:
            basis += (f"; link-bound: {format_bytes(total * (self.calibration.payload_framing_factor or 1.0) / 2)} "
                      f"each way at the {format_bytes(self.calibration.link_bytes_per_s)}/s its link sustained, "
                      f"{duration(floor)} against its calls' {duration(comm.comm_time_s)}")
        link = predict_link_bytes(total, step, self.calibration if cluster.machines > 1 else None,
                                  calls=picked.calls() if cluster.workers > 1 else {},
                                  payload_calls=picked.payload() if cluster.machines > 1 else {})
        return Estimate(
            architecture=label, cluster=cluster, bytes_per_machine_per_step=total,
            index_bytes_per_machine_per_step=index, method_bytes_per_machine_per_step=by_method,
            sparse_bytes_per_machine_per_step=sparse,
            dense_bytes_per_machine_per_step=dense, messages_per_step=messages,
            compute_time_s=compute, transfer_time_s=comm_s - comm.latency_time_s, latency_time_s=comm.latency_time_s,
            comm_time_s=comm_s, step_time_s=step,
            examples_per_s=cluster.workers * profile.batch_size / step if step > 0 else float("inf"),
            variables=tuple(costs), methods=tuple(methods), calibration=basis,
            collective_calls_per_step=comm.calls, link=link,
            explanations=tuple(explanations), link_floor_s=floor,
        )

    def architecture(self, architecture: Architecture) -> Estimate:
        """AR, PS or HYBRID on this pricing's cluster (AUTO: see :func:`.auto.choose_auto`)."""
        if architecture not in self._architectures:
            self._architectures[architecture] = self.total(architecture.value, self.methods_of(architecture))
        return self._architectures[architecture]

    def methods_of(self, architecture: Architecture) -> list[Method]:
        """Each variable's method under AR, PS or HYBRID (a new list each call)."""
        if architecture not in self._methods:
            self._methods[architecture] = [choose_method(c.kind, architecture) for c in self.costs]
        return list(self._methods[architecture])

    def baseline(self, key: str) -> Estimate:
        return self.total(key, [Method.AR] * len(self.costs))


class _Column:
    """Per variable (lists in profile order), what charging it one key's cost adds to a step:
    bytes, index bytes, message rounds (0 when it rides the fused allreduce or a grouped
    exchange), whether it rides the fused allreduce, its :class:`CallTime` fields, its calls by
    ``"op/scope"`` (and whether it lists that scope at all) and its payload share by the
    ``"op/scope"`` that carries it across machines
    (0.0 where none: shares of 0 bytes frame nothing and the link prediction drops them)."""

    def __init__(self, charged: list, times: list[CallTime], parts):
        n = len(charged)
        self.bytes = [c.bytes_per_step for c in charged]
        self.index = [c.index_bytes_per_step for c in charged]
        self.fused = [c.fused_allreduce for c in charged]
        # a rider's rounds are its fused call's or its group's, counted once per step
        self.messages = [0 if c.fused_allreduce or c.group else c.messages_per_step for c in charged]
        self.time, self.latency, self.calls, self.fused_bytes, self.group = ([t[i] for t in times] for i in range(5))
        self.rides = [False] * n
        self.scope_calls: dict[str, list] = {}
        self.scope_listed: dict[str, list] = {}
        self.scope_payload: dict[str, list] = {}
        for i, cost in enumerate(charged):
            self.rides[i], own, shares = parts(cost)
            for key, count in own:
                if key not in self.scope_calls:
                    self.scope_calls[key], self.scope_listed[key] = [0] * n, [False] * n
                self.scope_calls[key][i] += count
                self.scope_listed[key][i] = True
            for key, share in shares:
                if key not in self.scope_payload:
                    self.scope_payload[key] = [0.0] * n
                self.scope_payload[key][i] += share


class _Picked:
    """Each variable's entry of its charged key's :class:`_Column` (``keys`` in profile order)."""

    def __init__(self, priced: Pricing, keys: list[str]):
        self.groups: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            self.groups.setdefault(key, []).append(i)
        self.n = len(keys)
        self.columns = {key: priced.column(key) for key in self.groups}

    def _pick(self, lists: dict, empty) -> list:
        """Variable i's entry of the list of its key (``empty`` where its key has none)."""
        if len(lists) == 1 and len(self.groups) == 1:
            return next(iter(lists.values()))
        out = [empty] * self.n
        for key, at in self.groups.items():
            values = lists.get(key)
            if values is not None:
                for i in at:
                    out[i] = values[i]
        return out

    def values(self, field: str) -> list:
        return self._pick({key: getattr(column, field) for key, column in self.columns.items()}, 0)

    def _scoped(self, attribute: str, scope: str, empty) -> list:
        return self._pick({k: getattr(c, attribute)[scope] for k, c in self.columns.items()
                           if scope in getattr(c, attribute)}, empty)

    def calls(self) -> dict:
        """``{"op/scope": calls per step}``, the fused allreduce counted once (as
        :func:`.timing.calls_by_scope`)."""
        out = {}
        for scope in sorted({s for c in self.columns.values() for s in c.scope_calls}):
            if any(self._scoped("scope_listed", scope, False)):
                out[scope] = sum(self._scoped("scope_calls", scope, 0))
        if any(self.values("rides")):
            out["allreduce/all"] = out.get("allreduce/all", 0) + 1
        for group in self.step_groups():
            for key, count in group.scoped:
                out[key] = out.get(key, 0) + count
        return out

    def step_groups(self) -> list:
        """The grouped exchanges the picked costs ride, each once (:class:`.timing.Group`)."""
        return distinct_groups(self.values("group"))

    def payload(self) -> dict:
        """``{"op/scope": payload bytes}`` (as :func:`.timing.payload_by_call`; a scope no charged
        cost carries reads 0.0)."""
        return {scope: sum(self._scoped("scope_payload", scope, 0.0))
                for scope in sorted({s for c in self.columns.values() for s in c.scope_payload})}


def _costs_of_shape(profile: Profile, cluster: ClusterSpec) -> list | None:
    """The costs of a kept Pricing of ``profile`` on a cluster of ``cluster``'s shape and local
    aggregation, None if none is kept: a variable's bytes and calls depend on those alone, not
    on the bandwidth or the latency (which the calibration prices), so a planner's bandwidth
    box changes only the times."""
    shape = (cluster.machines, cluster.workers_per_machine, cluster.local_aggregation)
    for kept in _PRICINGS.values():
        other = kept.cluster
        if kept.profile is profile and (other.machines, other.workers_per_machine, other.local_aggregation) == shape:
            return kept.costs
    return None


def pricing(profile: Profile, cluster: ClusterSpec, calibration=None) -> Pricing:
    """The :class:`Pricing` of these inputs, reused while the same profile, cluster and
    calibration come back (the planner asks several times per change)."""
    check_inputs(profile, cluster)
    calibration_for(cluster, calibration)   # a ConfigError for another type or shape, before it is a key
    key = (id(profile), cluster, calibration)
    kept = _PRICINGS.get(key, profile)
    if kept is not None:
        return kept
    return _PRICINGS.put(key, profile, Pricing(profile, cluster, calibration, costs=_costs_of_shape(profile, cluster)))
