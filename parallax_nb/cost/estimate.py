"""Step-time estimates of a plan and of the whole-model architectures.

For a choice of one method per variable on a ClusterSpec, priced by a calibration
(:mod:`.timing`; its defaults when none is given):

* ``bytes_per_machine_per_step`` = sum over variables of the chosen method's bytes
  (:mod:`parallax_nb.cost.model`), bytes; ``messages_per_step`` their message rounds, every
  dense allreduce fused into one per step (descriptive: time comes from the calls);
* ``comm_time_s`` = the time of the calls the runtime issues, each from the calibration's
  fit of its op and scope with the bytes one rank hands to it; the dense AR gradients ride
  one fused allreduce (:mod:`.timing`); ``latency_time_s`` its per-call part,
  ``transfer_time_s`` the rest;
* ``step_time_s = compute_time_s + comm_time_s``: no overlap of communication with compute;
  ``compute_time_s`` is the calibration's measured compute of the model under the real
  placement, else the profile's single-device step time;
* ``examples_per_s = workers * batch_size / step_time_s``;
* speedups are step-time ratios: ``speedup_vs_ar = step(all AR) / step(this)``.

The baselines (:data:`parallax_nb.cost.methods.BASELINES`) are estimated the same way, every
variable charged the baseline's cost and calls: Horovod with ``sparse_as_dense=True``
(:data:`SPARSE_AS_DENSE`), Horovod's defaults (:data:`PLAIN_HOROVOD`: sparse gradients
allgathered among all ranks with their duplicate rows, dense ones fused into one allreduce)
and TensorFlow's parameter servers (:data:`TF_PS`).

Everything one ``(profile, cluster, calibration)`` needs is computed once in a
:class:`Pricing` and reused by the plan's estimate, the whole-model ones and AUTO's search
(a 1,000-variable replan stays within milliseconds).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from ..errors import ConfigError, PlanError
from ..types import BASELINE_KEYS, PLAIN_HOROVOD, SPARSE_AS_DENSE, TF_PS, Architecture, ClusterSpec, Estimate, Profile
from .auto import choose_auto
from .pricing import Pricing, check_inputs as _check_inputs, pricing, variable_costs  # noqa: F401 (re-exported)

WHOLE_MODEL = (Architecture.AR, Architecture.PS, Architecture.HYBRID, Architecture.AUTO)


def _with_speedups(est: Estimate, ar: Estimate, ps: Estimate) -> Estimate:
    def ratio(base: Estimate) -> float:
        return base.step_time_s / est.step_time_s if est.step_time_s > 0 else float("inf")
    return replace(est, speedup_vs_ar=ratio(ar), speedup_vs_ps=ratio(ps))


def auto_estimate(profile: Profile, cluster: ClusterSpec, calibration=None, local_aggregation=None) -> Estimate:
    """AUTO's time-optimal choice as an Estimate, with its explanations (:mod:`.auto`);
    ``local_aggregation`` None lets AUTO choose it, a bool pins it."""
    choice = choose_auto(profile, cluster, calibration, local_aggregation)
    return pricing(profile, choice.cluster, calibration).total(Architecture.AUTO.value, choice.methods,
                                                                choice.explanations)


def _whole_model(profile: Profile, cluster: ClusterSpec, calibration=None, include_horovod: bool = False,
                 local_aggregation: bool | None = None) -> dict:
    priced = pricing(profile, cluster, calibration)
    out: dict = {a: priced.architecture(a) for a in WHOLE_MODEL if a is not Architecture.AUTO}
    out[Architecture.AUTO] = auto_estimate(profile, cluster, calibration, local_aggregation)
    baselines = (SPARSE_AS_DENSE, PLAIN_HOROVOD, TF_PS) if include_horovod else (SPARSE_AS_DENSE,)
    for key in baselines:
        out[key] = priced.baseline(key)
    ar, ps = out[Architecture.AR], out[Architecture.PS]
    return {k: _with_speedups(e, ar, ps) for k, e in out.items()}


def estimate(profile: Profile, plan, cluster: ClusterSpec | None = None, calibration=None) -> Estimate:
    """Estimated bytes, communication and step time of ``plan`` for ``profile``.

    ``cluster`` defaults to the plan's own, with the plan's ``local_aggregation`` (the switch
    the runtime follows); the plan must name exactly the profile's variables. ``calibration``
    (a :class:`~parallax_nb.calibration.Calibration` of the cluster's shape) prices the calls;
    without one the defaults do and the estimate says "uncalibrated". Speedups compare with
    all-AR and all-PS on the same cluster. A plan AUTO made keeps its explanations.
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
    priced = pricing(profile, cluster, calibration)
    own = priced.total(plan.architecture.value, [plan.method(c.name) for c in priced.costs],
                       getattr(plan, "explanations", ()), [plan.partitions(c.name) for c in priced.costs])
    return _with_speedups(own, priced.architecture(Architecture.AR), priced.architecture(Architecture.PS))


def estimate_executed(profile: Profile, executed, cluster: ClusterSpec, calibration=None) -> Estimate:
    """Estimated cost of what a run executed (:class:`parallax_nb.executed.ExecutedPlan`): each
    variable charged the table entry of the method and the kind it ran as (a sparse variable
    served whole is charged as a dense one), on ``cluster`` (the run's topology), priced by
    ``calibration`` (defaults when None)."""
    _check_inputs(profile, cluster)
    ran = [executed[v.name] if v.name in executed else None for v in profile.variables]
    missing = [v.name for v, r in zip(profile.variables, ran) if r is None]
    if missing:
        raise PlanError(f"the executed plan has no entry for variable(s) {missing}",
                        hint="is the run from another model? Compare it with this model's profile")
    served = [v if r.kind is v.kind else replace(v, kind=r.kind) for v, r in zip(profile.variables, ran)]
    priced = Pricing(profile, cluster, calibration, costs=variable_costs(profile, cluster, served))
    own = priced.total(executed.architecture, [r.method for r in ran], partitions=[r.partitions for r in ran])
    return _with_speedups(own, priced.architecture(Architecture.AR), priced.architecture(Architecture.PS))


def compare_architectures(profile: Profile, cluster: ClusterSpec, include_horovod: bool = False,
                          calibration=None, local_aggregation: bool | None = None) -> dict:
    """``{Architecture.AR, .PS, .HYBRID, .AUTO, SPARSE_AS_DENSE: Estimate}`` on ``cluster``.

    Keys are str-valued, so ``result["hybrid"]`` works too. AR, PS and HYBRID run with the
    cluster's local aggregation; AUTO chooses its methods and local aggregation for the
    least estimated step time (:mod:`.auto`), so it is never estimated slower than they are
    (``local_aggregation`` True/False pins AUTO's instead).
    ``SPARSE_AS_DENSE`` is plain Horovod with ``sparse_as_dense=True``: every variable
    allreduced densely. With ``include_horovod``, also ``PLAIN_HOROVOD`` (Horovod's defaults,
    sparse gradients allgathered among all ranks with their duplicate rows) and ``TF_PS``
    (TensorFlow's parameter servers), the baselines a user would otherwise run.
    ``calibration`` prices the calls (defaults when None).
    """
    _check_inputs(profile, cluster)
    return _whole_model(profile, cluster, calibration, include_horovod, local_aggregation)


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
    """Estimated step time against the machine count, other cluster fields kept (uncalibrated:
    a calibration holds for one cluster shape only).

    Returns ``{"machines": [N, ...], "step_time_s": {architecture: [seconds, ...]}}`` (the
    report's chart data); AUTO re-chooses its methods and local aggregation at every N.
    """
    _check_inputs(profile, cluster)
    counts = _check_machines(machines)
    keys = [_curve_key(a) for a in architectures]
    curves: dict[str, list[float]] = {k: [] for k in keys}
    for n in counts:
        spec = cluster.replace(machines=n)
        priced = pricing(profile, spec)   # the one AUTO's choice below prices again, kept
        for key in keys:
            if key in BASELINE_KEYS:
                est = priced.baseline(key)
            elif key == Architecture.AUTO.value:
                est = auto_estimate(profile, spec)
            else:
                est = priced.architecture(Architecture(key))
            curves[key].append(est.step_time_s)
    return {"machines": counts, "step_time_s": curves}


def step_time_curve(profile: Profile, cluster: ClusterSpec, architecture="auto",
                    machines: Iterable[int] = range(1, 65)) -> list[tuple[int, float]]:
    """``[(machines, step_time_s), ...]`` for one architecture or baseline key (BASELINE_KEYS)."""
    key = _curve_key(architecture)
    data = step_time_curves(profile, cluster, machines, architectures=(key,))
    return list(zip(data["machines"], data["step_time_s"][key]))
