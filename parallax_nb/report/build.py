"""Assemble a report's data: one plain, JSON-ready dict from a Profile, a Plan and a run.

The dict is the report: the HTML, CSV and JSON are all drawn from it, and a report read back
from JSON redraws the same page. Every figure comes from the cost model
(:mod:`parallax_nb.cost`) or from the run summary; nothing is recomputed here except the
differences between them.

Predicted against measured, like with like: a run reports, per rank, the mean bytes it sent
plus received per step (``bytes_sent_per_step + bytes_received_per_step``), counting only
traffic with ranks on other machines. The model's figure is per machine per step; it is
computed for the run's own topology (its ``machines`` x ``workers_per_machine`` and whether it
executed local aggregation; summaries without that field: ``ranks`` machines of one worker),
with the plan's bandwidth and latency and what the run executed (its ExecutedPlan: each variable's
method and the kind it was served as), and compared with
the run's per-rank figure times its ranks per machine. error % =
100 * (measured - predicted) / predicted, None where the prediction is 0.
"""
from __future__ import annotations

import math
import os
from datetime import datetime, timezone

from .. import labels
from ..errors import ConfigError, PlanError
from ..executed import ExecutedPlan, ExecutedVariable
from ..plan import RECORDED_COSTS, Plan
from ..staleness import MeasuredStaleness, describe_sync
from ..types import (BASELINE_KEYS, PLAIN_HOROVOD, RUN_SCHEMA, RUN_SCHEMA_VERSION, SPARSE_AS_DENSE, Architecture,
                     ClusterSpec, Kind, Method, Profile)

SCHEMA = "parallax_nb.report"
SCHEMA_VERSION = 1
CURVE_MACHINES = range(1, 65)
_ARCH_RANK = {key: rank for rank, key in enumerate((*(a.value for a in Architecture), *BASELINE_KEYS))}
ARCHITECTURE_LABELS = {key: labels.text(key) for key in _ARCH_RANK}

# What the report itself assumes, on top of the cost model's own (cost.ASSUMPTIONS).
REPORT_ASSUMPTIONS = (
    "Every figure of this report is recomputed by the cost model from the profile on the plan's "
    "cluster (its bandwidth, latency and the plan's local-aggregation switch); the plan "
    "contributes only its methods and partitions.",
    "Measured against predicted: a run's per-rank bytes (sent + received, mean per step over "
    "ranks and measured steps), times its ranks per machine, are compared with the model's "
    "per-machine figure for the topology the run used (its machines x workers per machine and "
    "whether it aggregated locally), with the plan's bandwidth and latency and the methods and kinds "
    "the run executed (its executed plan); the predicted step time uses the profiled compute time at "
    "the profiled batch size.",
    "Training semantics: a row gathered several times in one step gets the sum of its gradients before "
    "the optimizer (dense-equivalent updates; Keras alone gives Adam one entry per occurrence).",
)

_RUN_FIELDS = {
    "ranks": int, "machines": int, "workers_per_machine": int, "architecture": str, "steps": int,
    "batch_size_per_rank": int, "step_time_s_median": float, "examples_per_s_median": float,
    "final_loss": float, "bytes_sent_per_step": float, "bytes_received_per_step": float,
}
_MAY_BE_UNKNOWN = ("step_time_s_median", "examples_per_s_median", "final_loss")
_RUN_VARIABLE_FIELDS = {"method": str, "bytes_sent_per_step": float, "bytes_received_per_step": float}


def _number(x) -> float | None:
    """A float for JSON, None for NaN or infinity (JSON has no such numbers)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def error_pct(predicted: float | None, measured: float | None) -> float | None:
    """100 * (measured - predicted) / predicted; None where predicted is 0 or unknown."""
    if predicted is None or measured is None or predicted == 0:
        return None
    return 100.0 * (measured - predicted) / predicted


# ---------------------------------------------------------------- the run summary

def load_run(run) -> dict | None:
    """The run summary dict from None, a dict, a run directory (or its run.json) or an object
    with ``.summary()``; validated against the ``parallax_nb.run`` schema, version 1."""
    if run is None:
        return None
    source = "run summary"
    if isinstance(run, (str, os.PathLike)):
        from ..jsonfile import load_json

        path = os.fspath(run)
        if not os.path.exists(path):
            raise ConfigError(f"run not found: {path!r} is neither a run directory nor a run.json",
                              hint="pass the --output directory of `python -m parallax_nb run`, or its run.json")
        if os.path.isdir(path):
            path = os.path.join(path, "run.json")
            if not os.path.exists(path):
                raise ConfigError(f"run directory {os.fspath(run)!r} has no run.json",
                                  hint="pass the --output directory of `python -m parallax_nb run`")
        source = path
        summary = load_json(path, what="run summary")
    elif isinstance(run, dict):
        summary = run
    elif callable(getattr(run, "summary", None)):
        summary = run.summary()
        source = f"{type(run).__name__}.summary()"
    else:
        raise ConfigError(f"cannot read a run from {type(run).__name__} {run!r:.80}",
                          hint="pass None, a run summary dict, a run directory with run.json, "
                               "or a training result with .summary()")
    return validate_run(summary, source)


def validate_run(summary, source: str = "run summary") -> dict:
    """A clean copy of a run summary, or a ConfigError naming the field that is wrong."""
    if not isinstance(summary, dict) or summary.get("schema") != RUN_SCHEMA:
        raise ConfigError(f"{source} is not a parallax_nb run summary (expected 'schema': {RUN_SCHEMA!r}, "
                          f"got {summary.get('schema') if isinstance(summary, dict) else type(summary).__name__!r})")
    if summary.get("schema_version") != RUN_SCHEMA_VERSION:
        raise ConfigError(f"{source} has schema_version {summary.get('schema_version')!r}; this parallax_nb "
                          f"reads version {RUN_SCHEMA_VERSION}", hint="regenerate it with this version")
    clean = {"schema": RUN_SCHEMA, "schema_version": RUN_SCHEMA_VERSION}
    clean.update(_typed_fields(summary, _RUN_FIELDS, source))
    if clean["ranks"] < 1:
        raise ConfigError(f"{source}: ranks must be >= 1, got {clean['ranks']}")
    if "local_aggregation" in summary:  # written by runs that report their topology
        if not isinstance(summary["local_aggregation"], bool):
            raise ConfigError(f"{source}: field 'local_aggregation' must be true or false, "
                              f"got {summary['local_aggregation']!r}")
        clean["local_aggregation"] = summary["local_aggregation"]
    steps = summary.get("measured_steps")
    if isinstance(steps, list) and len(steps) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in steps):
        clean["measured_steps"] = list(steps)   # [first, last] step of the median step time
    if isinstance(summary.get("batch_norm"), dict):  # written by runs that know their BatchNorm layers
        clean["batch_norm"] = dict(summary["batch_norm"])
    if "executed_plan" in summary:  # written by runs that record what they executed
        clean["executed_plan"] = ExecutedPlan.from_dict(summary["executed_plan"], f"{source}: executed_plan").to_dict()
    if "sync" in summary:   # written by runs that know sync from async (issue 16)
        sync, k = summary["sync"], summary.get("max_staleness")
        if not isinstance(sync, bool):
            raise ConfigError(f"{source}: field 'sync' must be true or false, got {sync!r}")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise ConfigError(f"{source}: field 'max_staleness' must be null or a whole number >= 0, got {k!r}")
        clean["sync"], clean["max_staleness"] = sync, k
    if summary.get("staleness") is not None:
        clean["staleness"] = MeasuredStaleness.from_dict(summary["staleness"], f"{source}: staleness").to_dict()
    variables = summary.get("variables")
    if not isinstance(variables, dict):
        raise ConfigError(f"{source} lacks its 'variables' mapping (name -> bytes per step)")
    clean["variables"] = {}
    for name, entry in variables.items():
        where = f"{source}: variable {name!r}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} is not a mapping")
        v = dict(entry)
        v.update(_typed_fields(entry, _RUN_VARIABLE_FIELDS, where))
        if v["method"] not in (m.value for m in Method):
            raise ConfigError(f"{where} has unknown method {v['method']!r}", hint=f"expected one of {Method.choices()}")
        if "kind" in v and v["kind"] not in (k.value for k in Kind):
            raise ConfigError(f"{where} has unknown kind {v['kind']!r}", hint="expected 'sparse' or 'dense'")
        clean["variables"][str(name)] = v
    return clean


def _typed_fields(d: dict, spec: dict, where: str) -> dict:
    out = {}
    for key, typ in spec.items():
        if key not in d:
            raise ConfigError(f"{where} lacks field {key!r}")
        value = d[key]
        try:
            if typ is int and (isinstance(value, bool) or float(value) != int(value)):
                raise ValueError
            out[key] = typ(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: field {key!r} should be {typ.__name__}, got {value!r}") from None
        if typ is float and not math.isfinite(out[key]):
            if key not in _MAY_BE_UNKNOWN:
                raise ConfigError(f"{where}: field {key!r} must be a finite number, got {value!r}")
            out[key] = None  # a run without measured steps has no median; JSON has no NaN
        elif typ is float and key.startswith("bytes_") and out[key] < 0:
            raise ConfigError(f"{where}: field {key!r} must be >= 0, got {value!r}")
    return out


# ---------------------------------------------------------------- the report data

def build_report_data(profile: Profile, plan: Plan, run=None, *, title: str | None = None,
                      notes: str | None = None, calibration=None) -> dict:
    """Everything the report shows, as plain JSON-ready data (schema ``parallax_nb.report`` v1).

    Bytes and times come from :func:`parallax_nb.cost.estimate` on the plan's cluster (not the
    figures stored in the plan, which may come from another profile); methods and partitions
    come from the plan.
    """
    from .. import cost
    from ..cost.pricing import check_profile
    from ..version import __version__

    check_profile(profile, "report()", hint="profile the job first: px.profile(job) or Profile.from_json(path)")
    if not isinstance(plan, Plan):
        raise ConfigError(f"report() needs a parallax_nb Plan, got {type(plan).__name__}",
                          hint="make one with px.make_plan(profile, cluster) or Plan.from_json(path)")
    if plan.cluster is None:
        raise PlanError(f"plan for {plan.model_name!r} has no cluster, so the report has nothing to estimate",
                        hint="make the plan with make_plan(profile, ClusterSpec...) or `python -m parallax_nb plan`")
    run_summary = load_run(run)
    cluster = planned_cluster(plan)
    plan_estimate = cost.estimate(profile, plan, cluster, calibration=calibration)  # also checks the variables
    by_arch = {_key(k): v for k, v in cost.compare_architectures(profile, cluster, include_horovod=True,
                                                                 calibration=calibration).items()}
    costs = {c.name: c for c in plan_estimate.variables}

    data = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "generated_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "parallax_nb_version": __version__,
        "title": title or f"parallax_nb cost report: {profile.model_name}",
        "notes": notes,
        "profile": _profile_data(profile),
        "cluster": _cluster_data(cluster),
        "plan": {"architecture": plan.architecture.value, "overrides": list(plan.overrides),
                 "explanations": list(plan.explanations), "sync": plan.sync, "max_staleness": plan.max_staleness,
                 "training": describe_sync(plan.sync, plan.max_staleness), **_estimate_data(plan_estimate)},
        "calibration": plan_estimate.calibration,
        "assumptions": list(cost_assumptions()) + list(REPORT_ASSUMPTIONS),
        "variables": [_variable_data(var, plan[var.name], costs[var.name]) for var in profile.variables],
        "architectures": [
            {"name": key, "label": ARCHITECTURE_LABELS.get(key, key), **_estimate_data(est)}
            for key, est in sorted(by_arch.items(), key=lambda kv: _ARCH_RANK.get(kv[0], 99))
        ],
        "step_time_curve": step_time_curves(profile, cluster),
        "measured": None,
    }
    if not plan.sync:
        data["assumptions"].append(f"The plan trains asynchronously ({describe_sync(plan.sync, plan.max_staleness)}): "
                                   "the estimated step times and bytes above are of synchronous steps; an "
                                   "asynchronous worker does not wait for the slowest at each step. The owners "
                                   "apply the optimizer once per push, so W workers make W updates where "
                                   "synchronous training makes one of their mean; under momentum, Adam or "
                                   "RMSprop each push updates an owner's whole partitions, work these "
                                   "estimates do not charge.")
        if cluster.workers > 1:
            from ..cost.asynchronous import straggler_outlook

            data["plan"]["straggler_outlook"] = straggler_outlook(plan_estimate,
                                                                  max_staleness=plan.max_staleness).lines()
    if run_summary is not None:
        data["measured"] = measured_against_predicted(profile, plan, run_summary, calibration)
        if run_summary.get("batch_norm", {}).get("statistics") == "per rank":
            data["assumptions"].append("The run normalised its BatchNorm layers with each rank's own batch "
                                       "(Job(sync_batch_norm=False)): its weights are not those of the "
                                       "single-device run on the global batch.")
    return data


def planned_cluster(plan: Plan) -> ClusterSpec:
    """The plan's cluster with the plan's local-aggregation switch (what the runtime follows)."""
    cluster = plan.cluster
    if cluster.local_aggregation != plan.local_aggregation:
        cluster = cluster.replace(local_aggregation=plan.local_aggregation)
    return cluster


def _key(architecture) -> str:
    return architecture.value if isinstance(architecture, Architecture) else str(architecture)


def _profile_data(profile: Profile) -> dict:
    return {
        "model_name": profile.model_name,
        "batch_size": profile.batch_size,
        "steps": profile.steps,
        "step_time_s": _number(profile.step_time_s),
        "peak_memory_bytes": int(profile.peak_memory_bytes),
        "variables_count": len(profile.variables),
        "sparse_variables_count": sum(v.is_sparse for v in profile.variables),
        "total_bytes": int(profile.total_bytes),
        "sparse_bytes": int(profile.sparse_bytes),
        "environment": {str(k): str(v) for k, v in profile.environment.items()},
    }


def _cluster_data(cluster: ClusterSpec) -> dict:
    return {
        "machines": cluster.machines,
        "workers_per_machine": cluster.workers_per_machine,
        "workers": cluster.workers,
        "bandwidth_bps": float(cluster.bandwidth_bps),
        "latency_s": float(cluster.latency_s),
        "local_aggregation": bool(cluster.local_aggregation),
    }


_ESTIMATE_FIELDS = ("bytes_per_machine_per_step", "index_bytes_per_machine_per_step", "messages_per_step",
                    "compute_time_s", "transfer_time_s", "latency_time_s", "comm_time_s", "step_time_s",
                    "examples_per_s", "speedup_vs_ar", "speedup_vs_ps", "link_floor_s")


def _estimate_data(est) -> dict:
    """The figures of one :class:`parallax_nb.types.Estimate` (see its docstring for the formulas)."""
    return {**{name: _number(getattr(est, name, None)) for name in _ESTIMATE_FIELDS},
            "link_bound": bool(getattr(est, "link_bound", False))}


def _variable_data(var, vp, c) -> dict:
    """One row: the profile's facts, the plan's choice, the cost model's bytes (VariableCost ``c``).

    ``alpha`` is the profiled fraction of rows one worker touches per step; ``alpha_per_machine``
    is what the cost model charged a participant (the union of a machine's workers with local
    aggregation); both are 1 for a dense variable.
    """
    return {
        "name": var.name,
        "kind": var.kind.value,
        "shape": list(var.shape),
        "dtype": var.dtype,
        "size_bytes": int(var.size_bytes),
        "alpha": _number(var.alpha_mean if var.is_sparse else 1.0),
        "alpha_per_machine": _number(c.alpha),
        **{f"{key}_bytes_per_step": _number(c.bytes_for(key)) for key in RECORDED_COSTS},
        "method": vp.method.value,
        "partitions": int(vp.partitions),
    }


# ---------------------------------------------------------------- predicted against measured

def run_cluster(cluster: ClusterSpec, ranks: int, workers_per_machine: int = 1,
                local_aggregation: bool | None = None) -> ClusterSpec:
    """The cluster a run's figures are compared with: ``ranks / workers_per_machine`` machines
    of ``workers_per_machine`` workers, the plan's bandwidth and latency, and the run's local
    aggregation (the plan's setting when None)."""
    changes = dict(machines=max(int(ranks) // int(workers_per_machine), 1), workers_per_machine=int(workers_per_machine))
    if local_aggregation is not None:
        changes["local_aggregation"] = bool(local_aggregation)
    return cluster.replace(**changes)


def run_topology(run: dict) -> tuple[int, bool | None]:
    """(ranks per machine, local aggregation executed) of a run summary: its own when it
    reports ``local_aggregation``, else one rank per machine and the plan's setting."""
    if "local_aggregation" not in run:
        return 1, None
    workers = int(run["workers_per_machine"])
    return (workers if workers >= 1 and run["ranks"] % workers == 0 else 1), bool(run["local_aggregation"])


def executed_of(run: dict, profile: Profile, plan: Plan) -> ExecutedPlan:
    """What the run executed: its recorded executed plan, or, for a summary without one, its
    per-variable table read as run (methods, kinds and partitions, no changes known). A
    variable the run does not report keeps the plan's method and the profile's kind."""
    if "executed_plan" in run:
        return ExecutedPlan.from_dict(run["executed_plan"])
    ran = []
    for var in profile.variables:
        entry = run["variables"].get(var.name)
        if entry is None:
            ran.append(ExecutedVariable(var.name, plan.method(var.name), var.kind, plan.partitions(var.name)))
        else:
            ran.append(ExecutedVariable(var.name, Method(entry["method"]), Kind(entry.get("kind", var.kind.value)),
                                        int(entry.get("partitions", 1))))
    workers, aggregated = run_topology(run)
    return ExecutedPlan(architecture=run["architecture"], ranks=run["ranks"], machines=max(run["ranks"] // workers, 1),
                        workers_per_machine=workers,
                        local_aggregation=plan.local_aggregation if aggregated is None else aggregated,
                        variables=tuple(ran))


def measured_against_predicted(profile: Profile, plan: Plan, run: dict, calibration=None) -> dict:
    """Predicted and measured bytes per rank per step (in all and per variable) and step time.

    The prediction charges what the run executed (:func:`executed_of`), on :func:`run_cluster`,
    priced by ``calibration`` when it is of the run's shape (else the defaults). The step times are
    :func:`parallax_nb.cost.against_run.check_step_time`'s: the estimate against the run's median
    over its steps after the first. See the module docstring for the basis.
    """
    from .. import cost
    from ..cost.against_run import calibration_of_shape, check_step_time, measured_steps_text, recorded_settings

    warnings = []
    run_vars = run["variables"]
    unknown = sorted(set(run_vars) - set(plan.names))
    if unknown:
        warnings.append(f"the run reports variables the profile does not have: {unknown}; "
                        f"they are left out of the per-variable comparison")
    missing = sorted(set(plan.names) - set(run_vars))
    if missing:
        warnings.append(f"the run reports no bytes for {missing}; the prediction uses the plan's methods for them")
    executed = executed_of(run, profile, plan)
    workers, aggregated = run_topology(run)
    spec = run_cluster(planned_cluster(plan), run["ranks"], workers, aggregated)
    est = cost.estimate_executed(profile, executed, spec, calibration=calibration_of_shape(spec, calibration))
    if "measured_steps" in run:
        first, last = run["measured_steps"]
        steps_text = f"steps {first}-{last}" if last > first else f"step {last}"
    else:
        steps_text = measured_steps_text(1, run["steps"])
    step_time = check_step_time(profile, executed, spec, run["step_time_s_median"], steps_text, calibration,
                                **recorded_settings(run))
    if run["batch_size_per_rank"] != profile.batch_size:
        warnings.append(f"the run used a batch of {run['batch_size_per_rank']} per rank but the profile measured "
                        f"batch {profile.batch_size}: the prediction's alpha and compute time are for the profiled batch")

    measured_total = (run["bytes_sent_per_step"] + run["bytes_received_per_step"]) * workers
    totals = [
        {"quantity": "bytes sent + received per machine per step", "unit": "bytes",
         "predicted": _number(est.bytes_per_machine_per_step), "measured": _number(measured_total),
         "error_pct": _number(error_pct(est.bytes_per_machine_per_step, measured_total))},
        {"quantity": f"step time (median of {steps_text}, the first step left out as warm-up)", "unit": "s",
         "predicted": _number(est.step_time_s), "measured": _number(run["step_time_s_median"]),
         "error_pct": _number(step_time.error_pct if step_time else None)},
    ]
    per_variable = []
    for c, method in zip(est.variables, est.methods):
        if c.name not in run_vars:
            continue
        measured = (run_vars[c.name]["bytes_sent_per_step"] + run_vars[c.name]["bytes_received_per_step"]) * workers
        predicted = c.bytes_for(method)
        per_variable.append({"name": c.name, "method": method.value, "kind": c.kind.value,
                             "predicted_bytes_per_step": _number(predicted),
                             "measured_bytes_per_step": _number(measured),
                             "error_pct": _number(error_pct(predicted, measured))})
    basis = (f"Like with like: the run's bytes are per machine (sent + received to and from other machines, "
             f"mean per step over {run['steps']} steps and over ranks, times {workers} rank(s) per machine); "
             f"the prediction is the cost model's per-machine figure for the run's cluster of "
             f"{spec.machines} machine(s) x {spec.workers_per_machine} worker(s), local aggregation "
             f"{'on' if spec.local_aggregation else 'off'}, with the plan's bandwidth "
             f"({spec.bandwidth}) and latency ({spec.latency_s * 1e6:g} us) and the methods and kinds the run executed. "
             f"The predicted step time is the profiled compute time plus communication at that bandwidth; "
             f"the run's links (e.g. loopback on one host) may be much faster or slower.")
    return {
        "basis": basis,
        "run": {k: run[k] for k in (*_RUN_FIELDS, "local_aggregation") if k in run},
        "executed_plan": executed.to_dict(),
        "training": describe_sync(run.get("sync", executed.sync), run.get("max_staleness", executed.max_staleness)),
        "staleness": run.get("staleness"),
        "prediction_cluster": _cluster_data(spec),
        "prediction": _estimate_data(est),
        "step_time": step_time.to_dict() if step_time else None,
        "totals": totals,
        "variables": per_variable,
        "warnings": warnings,
    }


# ---------------------------------------------------------------- cost-model pieces

def cost_assumptions() -> tuple[str, ...]:
    """The cost model's assumptions in words, as :data:`parallax_nb.cost.ASSUMPTIONS` states them."""
    from .. import cost

    return tuple(str(a) for a in cost.ASSUMPTIONS)


def step_time_curves(profile: Profile, cluster: ClusterSpec, machines=CURVE_MACHINES) -> dict:
    """Estimated step time of every architecture (and sparse-as-dense) on 1..64 machines of the
    cluster's kind: ``{"machines": [...], "step_time_s": {architecture: [seconds, ...]}}``."""
    from .. import cost

    curves = cost.step_time_curves(profile, cluster, machines=machines,
                                   architectures=(*cost.WHOLE_MODEL, SPARSE_AS_DENSE, PLAIN_HOROVOD))
    return {"machines": [int(m) for m in curves["machines"]],
            "step_time_s": {_key(k): [_number(t) for t in ts] for k, ts in curves["step_time_s"].items()}}
