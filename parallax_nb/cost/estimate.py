"""Step-time estimates of a plan and of the whole-model architectures.

For a choice of one method per variable on a ClusterSpec (bandwidth ``B`` in bits/s, latency
``L`` in s per message round):

* ``bytes_per_machine_per_step`` = sum over variables of the chosen method's bytes
  (:mod:`parallax_nb.cost.model`), bytes;
* ``messages_per_step`` = sum over variables of their collectives' rounds, except that every
  tensor reduced by a dense allreduce (dense AR variables; every variable under
  sparse-as-dense) is fused into **one** allreduce per step, as Horovod's tensor fusion does
  (``2 (n-1)`` rounds in all). Sparse allgathers and PS exchanges are one collective per variable;
* ``transfer_time_s = bytes / (B / 8)``, ``latency_time_s = messages * L``,
  ``comm_time_s = transfer_time_s + latency_time_s``;
* ``step_time_s = compute_time_s + comm_time_s`` where ``compute_time_s`` is the profiled
  single-device step time with the per-worker batch: no overlap of communication with
  compute (a pessimistic bound), and the network is the only shared resource;
* ``examples_per_s = workers * batch_size / step_time_s``;
* speedups are step-time ratios: ``speedup_vs_ar = step(all AR) / step(this)``.

The baselines (:data:`parallax_nb.cost.methods.BASELINES`) are estimated the same way, every
variable charged the baseline's cost: Horovod with ``sparse_as_dense=True``
(:data:`SPARSE_AS_DENSE`), Horovod's defaults (:data:`PLAIN_HOROVOD`: sparse gradients
allgathered with their duplicate rows, dense ones fused into one allreduce) and TensorFlow's
parameter servers (:data:`TF_PS`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

from ..errors import ConfigError, PlanError
from ..types import (BASELINE_KEYS, PLAIN_HOROVOD, SPARSE_AS_DENSE, Architecture, ClusterSpec, Estimate, Kind, Method,
                     Profile, VariableCost)
from .methods import variable_cost
from .model import participants, rounds
from .choice import choose_method

WHOLE_MODEL = (Architecture.AR, Architecture.PS, Architecture.HYBRID, Architecture.AUTO)


def _check_inputs(profile, cluster) -> None:
    if not isinstance(profile, Profile):
        raise ConfigError(f"expected a parallax_nb Profile, got {type(profile).__name__}",
                          hint="profile the job first (px.profile(job)) or load one with Profile.from_json(path)")
    if not isinstance(cluster, ClusterSpec):
        raise ConfigError(f"expected a ClusterSpec, got {type(cluster).__name__}",
                          hint='build one with ClusterSpec.create(machines=8, bandwidth="10Gbit/s")')


def variable_costs(profile: Profile, cluster: ClusterSpec) -> list[VariableCost]:
    """:func:`variable_cost` of every variable of ``profile``, in profile order."""
    return [variable_cost(v, cluster) for v in profile.variables]


def _total(label: str, profile: Profile, cluster: ClusterSpec, costs: Sequence[VariableCost],
           methods: Sequence[Method]) -> Estimate:
    """Sum the charged costs' bytes and rounds and turn them into times (module docstring).

    A baseline ``label`` (:data:`BASELINE_KEYS`) charges every variable that baseline's cost;
    otherwise each variable is charged its method's cost from :data:`.methods.METHOD_COSTS`.
    """
    baseline = label if label in BASELINE_KEYS else None
    total = index = sparse = dense = 0.0
    by_method: dict[str, float] = {}
    messages = 0
    fused_allreduce = False
    for cost, method in zip(costs, methods):
        key = baseline or method.value
        charged = cost.cost_of(key)
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
    if fused_allreduce and cluster.machines > 1:
        messages += rounds("allreduce", participants(cluster)[0])
    transfer = total * 8.0 / cluster.bandwidth_bps
    latency = messages * cluster.latency_s
    comm = transfer + latency
    step = profile.step_time_s + comm
    return Estimate(
        architecture=label, cluster=cluster, bytes_per_machine_per_step=total,
        index_bytes_per_machine_per_step=index, method_bytes_per_machine_per_step=by_method,
        sparse_bytes_per_machine_per_step=sparse,
        dense_bytes_per_machine_per_step=dense, messages_per_step=messages,
        compute_time_s=profile.step_time_s, transfer_time_s=transfer, latency_time_s=latency,
        comm_time_s=comm, step_time_s=step,
        examples_per_s=cluster.workers * profile.batch_size / step if step > 0 else float("inf"),
        variables=tuple(costs), methods=tuple(methods),
    )


def _methods(costs: Sequence[VariableCost], architecture: Architecture) -> list[Method]:
    return [choose_method(c.kind, architecture, c) for c in costs]


def _with_speedups(est: Estimate, ar: Estimate, ps: Estimate) -> Estimate:
    def ratio(base: Estimate) -> float:
        return base.step_time_s / est.step_time_s if est.step_time_s > 0 else float("inf")
    return replace(est, speedup_vs_ar=ratio(ar), speedup_vs_ps=ratio(ps))


def _whole_model(profile: Profile, cluster: ClusterSpec, costs: Sequence[VariableCost],
                 include_horovod: bool = False) -> dict:
    out: dict = {a: _total(a.value, profile, cluster, costs, _methods(costs, a)) for a in WHOLE_MODEL}
    baselines = (SPARSE_AS_DENSE, PLAIN_HOROVOD) if include_horovod else (SPARSE_AS_DENSE,)
    for key in baselines:
        out[key] = _total(key, profile, cluster, costs, [Method.AR] * len(costs))
    ar, ps = out[Architecture.AR], out[Architecture.PS]
    return {k: _with_speedups(e, ar, ps) for k, e in out.items()}


def estimate(profile: Profile, plan, cluster: ClusterSpec | None = None) -> Estimate:
    """Estimated bytes, communication and step time of ``plan`` for ``profile``.

    ``cluster`` defaults to the plan's own, with the plan's ``local_aggregation`` (the switch
    the runtime follows); the plan must name exactly the profile's variables. Speedups compare
    with all-AR and all-PS on the same cluster.
    """
    if cluster is None and plan.cluster is not None:
        cluster = plan.cluster
        if cluster.local_aggregation != plan.local_aggregation:
            cluster = cluster.replace(local_aggregation=plan.local_aggregation)
    if cluster is None:
        raise PlanError(f"plan for {plan.model_name!r} was made without a cluster, so it has no cost",
                        hint="pass cluster=ClusterSpec(...) to estimate(), or make the plan with make_plan()")
    _check_inputs(profile, cluster)
    plan.validate_for(profile.names)
    costs = variable_costs(profile, cluster)
    own = _total(plan.architecture.value, profile, cluster, costs, [plan.method(c.name) for c in costs])
    ar = _total("ar", profile, cluster, costs, _methods(costs, Architecture.AR))
    ps = _total("ps", profile, cluster, costs, _methods(costs, Architecture.PS))
    return _with_speedups(own, ar, ps)


def estimate_executed(profile: Profile, executed, cluster: ClusterSpec) -> Estimate:
    """Estimated cost of what a run executed (:class:`parallax_nb.executed.ExecutedPlan`): each
    variable charged the table entry of the method and the kind it ran as (a sparse variable
    served whole is charged as a dense one), on ``cluster`` (the run's topology)."""
    _check_inputs(profile, cluster)
    ran = [executed[v.name] if v.name in executed else None for v in profile.variables]
    missing = [v.name for v, r in zip(profile.variables, ran) if r is None]
    if missing:
        raise PlanError(f"the executed plan has no entry for variable(s) {missing}",
                        hint="is the run from another model? Compare it with this model's profile")
    served = [v if r.kind is v.kind else replace(v, kind=r.kind) for v, r in zip(profile.variables, ran)]
    costs = [variable_cost(v, cluster) for v in served]
    own = _total(executed.architecture, profile, cluster, costs, [r.method for r in ran])
    ar = _total("ar", profile, cluster, costs, _methods(costs, Architecture.AR))
    ps = _total("ps", profile, cluster, costs, _methods(costs, Architecture.PS))
    return _with_speedups(own, ar, ps)


def compare_architectures(profile: Profile, cluster: ClusterSpec, include_horovod: bool = False) -> dict:
    """``{Architecture.AR, .PS, .HYBRID, .AUTO, SPARSE_AS_DENSE: Estimate}`` on ``cluster``.

    Keys are str-valued, so ``result["hybrid"]`` works too. ``SPARSE_AS_DENSE`` is plain
    Horovod with ``sparse_as_dense=True``: every variable allreduced densely. With
    ``include_horovod``, also ``PLAIN_HOROVOD``: Horovod's defaults, sparse gradients
    allgathered with their duplicate rows (for benchmarks against plain Horovod).
    """
    _check_inputs(profile, cluster)
    return _whole_model(profile, cluster, variable_costs(profile, cluster), include_horovod)


def _curve_key(architecture) -> str:
    if architecture in BASELINE_KEYS:
        return str(architecture)
    return Architecture.parse(architecture).value


def _check_machines(machines: Iterable[int]) -> list[int]:
    counts = list(machines)
    if not counts:
        raise ConfigError("machines to sweep is empty", hint="pass e.g. machines=range(1, 65)")
    return counts


def step_time_curves(profile: Profile, cluster: ClusterSpec, machines: Iterable[int] = range(1, 65),
                     architectures: Iterable = (*WHOLE_MODEL, SPARSE_AS_DENSE)) -> dict:
    """Estimated step time against the machine count, other cluster fields kept.

    Returns ``{"machines": [N, ...], "step_time_s": {architecture: [seconds, ...]}}`` (the
    report's chart data); AUTO re-chooses its methods at every N.
    """
    _check_inputs(profile, cluster)
    counts = _check_machines(machines)
    keys = [_curve_key(a) for a in architectures]
    curves: dict[str, list[float]] = {k: [] for k in keys}
    for n in counts:
        spec = cluster.replace(machines=n)
        costs = variable_costs(profile, spec)
        for key in keys:
            if key in BASELINE_KEYS:
                est = _total(key, profile, spec, costs, [Method.AR] * len(costs))
            else:
                est = _total(key, profile, spec, costs, _methods(costs, Architecture(key)))
            curves[key].append(est.step_time_s)
    return {"machines": counts, "step_time_s": curves}


def step_time_curve(profile: Profile, cluster: ClusterSpec, architecture="auto",
                    machines: Iterable[int] = range(1, 65)) -> list[tuple[int, float]]:
    """``[(machines, step_time_s), ...]`` for one architecture or baseline key (BASELINE_KEYS)."""
    key = _curve_key(architecture)
    data = step_time_curves(profile, cluster, machines, architectures=(key,))
    return list(zip(data["machines"], data["step_time_s"][key]))
