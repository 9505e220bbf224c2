"""Everything the estimates of one ``(profile, cluster, calibration)`` share, computed once: each
variable's costs under every method and baseline (:mod:`.methods`), and the time of the calls
they issue under the calibration (:mod:`.timing`). The plan's estimate, the whole-model ones
and AUTO's search all read one :class:`Pricing`, which :func:`pricing` keeps while the same
inputs come back (a 1,000-variable replan stays within milliseconds).
"""
from __future__ import annotations

from typing import Sequence

from ..errors import ConfigError
from ..types import (BASELINE_KEYS, Architecture, ClusterSpec, Estimate, Kind, Method, Profile, VariableCost)
from .choice import choose_method
from .methods import variable_cost
from .link import predict_link_bytes
from .model import participants, rounds
from .timing import (CallTime, calibration_for, call_time, calls_by_scope, compute_time_s, payload_by_call,
                     step_communication, time_basis)

_PRICINGS: dict = {}
_PRICINGS_KEPT = 2   # the planner asks for one cluster with local aggregation on and off; more only feeds the GC


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


def variable_costs(profile: Profile, cluster: ClusterSpec) -> list[VariableCost]:
    """:func:`variable_cost` of every variable of ``profile``, in profile order. A dense
    variable's costs depend on its bytes alone, so dense variables of one size share one
    table of entries (a model repeats its layers' shapes)."""
    by_size: dict[int, VariableCost] = {}
    out = []
    for v in profile.variables:
        if v.kind is not Kind.DENSE:
            out.append(variable_cost(v, cluster))
            continue
        same = by_size.get(v.size_bytes)
        if same is None:
            same = by_size[v.size_bytes] = variable_cost(v, cluster)
            out.append(same)
        else:
            out.append(VariableCost(v.name, v.kind, v.size_bytes, v.rows, same.alpha, same.participants,
                                    same.participants_per_machine, same.methods))
    return out


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
        self.compute_time_s = compute_time_s(profile, self.calibration)
        self._times: dict[str, list[CallTime]] = {}

    def times(self, key: str) -> list[CallTime]:
        """Per variable, the call time of its cost under ``key`` (a Method value or baseline key)."""
        if key not in self._times:
            ranks = self.cluster.workers
            priced: dict[int, CallTime] = {}   # by cost entry: dense variables of one size share theirs
            times = []
            for c in self.costs:
                cost = c.cost_of(key)
                time = priced.get(id(cost))
                if time is None:
                    time = priced[id(cost)] = call_time(cost, self.calibration, ranks)
                times.append(time)
            self._times[key] = times
        return self._times[key]

    def charged_keys(self, label: str, methods: Sequence[Method]) -> list[str]:
        return [label] * len(self.costs) if label in BASELINE_KEYS else [m.value for m in methods]

    def total(self, label: str, methods: Sequence[Method], explanations: tuple[str, ...] = ()) -> Estimate:
        """Sum the charged costs' bytes and rounds and the calls' time (module docstring).

        A baseline ``label`` (:data:`BASELINE_KEYS`) charges every variable that baseline's cost;
        otherwise each variable is charged its method's cost from :data:`.methods.METHOD_COSTS`.
        """
        profile, cluster, costs = self.profile, self.cluster, self.costs
        keys = self.charged_keys(label, methods)
        total = index = sparse = dense = 0.0
        by_method: dict[str, float] = {}
        messages = 0
        fused_allreduce = False
        times, charged_costs = [], []
        for i, (cost, key) in enumerate(zip(costs, keys)):
            charged = cost.cost_of(key)
            charged_costs.append(charged)
            total += charged.bytes_per_step
            index += charged.index_bytes_per_step
            by_method[key] = by_method.get(key, 0.0) + charged.bytes_per_step
            if charged.fused_allreduce:
                fused_allreduce = True
            else:
                messages += charged.messages_per_step
            if cost.kind is Kind.SPARSE:
                sparse += charged.bytes_per_step
            else:
                dense += charged.bytes_per_step
            times.append(self.times(key)[i])
        if fused_allreduce and cluster.machines > 1:
            messages += rounds("allreduce", participants(cluster)[0])
        comm = step_communication(times, self.calibration)
        compute = self.compute_time_s
        step = compute + comm.comm_time_s
        link = predict_link_bytes(total, step, self.calibration if cluster.machines > 1 else None,
                                  calls=calls_by_scope(charged_costs, cluster.workers),
                                  payload_calls=payload_by_call(charged_costs, cluster))
        return Estimate(
            architecture=label, cluster=cluster, bytes_per_machine_per_step=total,
            index_bytes_per_machine_per_step=index, method_bytes_per_machine_per_step=by_method,
            sparse_bytes_per_machine_per_step=sparse,
            dense_bytes_per_machine_per_step=dense, messages_per_step=messages,
            compute_time_s=compute, transfer_time_s=comm.transfer_time_s, latency_time_s=comm.latency_time_s,
            comm_time_s=comm.comm_time_s, step_time_s=step,
            examples_per_s=cluster.workers * profile.batch_size / step if step > 0 else float("inf"),
            variables=tuple(costs), methods=tuple(methods), calibration=time_basis(profile, self.calibration),
            collective_calls_per_step=comm.calls, link=link,
            explanations=tuple(explanations),
        )

    def architecture(self, architecture: Architecture) -> Estimate:
        """AR, PS or HYBRID on this pricing's cluster (AUTO: see :func:`.auto.choose_auto`)."""
        return self.total(architecture.value, [choose_method(c.kind, architecture) for c in self.costs])

    def baseline(self, key: str) -> Estimate:
        return self.total(key, [Method.AR] * len(self.costs))


def pricing(profile: Profile, cluster: ClusterSpec, calibration=None) -> Pricing:
    """The :class:`Pricing` of these inputs, reused while the same profile, cluster and
    calibration come back (the planner asks several times per change)."""
    check_inputs(profile, cluster)
    key = (id(profile), cluster, calibration)
    kept = _PRICINGS.get(key)
    if kept is not None and kept.profile is profile:
        return kept
    made = Pricing(profile, cluster, calibration)
    if len(_PRICINGS) >= _PRICINGS_KEPT:
        _PRICINGS.pop(next(iter(_PRICINGS)))
    _PRICINGS[key] = made
    return made
