"""The planner model: a profile, a cluster, an architecture and per-variable overrides in; a Plan
and its estimated cost out. No widgets here: :class:`~parallax_nb.widgets.PlannerView` observes
this object, and tests drive it by setting values and reading state.

Every change recomputes, in this order (all pure Python, milliseconds):

1. ``ClusterSpec.create(machines, workers_per_machine, bandwidth, latency_s, local_aggregation)``;
   a ``calibration`` given to the planner must be of this cluster's shape (else the
   ConfigError of :meth:`~parallax_nb.calibration.Calibration.check_shape`, naming both shapes)
2. ``plan = make_plan(profile, cluster, architecture, partitions, calibration=...)``, then the
   per-variable method overrides (``plan.with_methods``). ``local_aggregation="auto"`` (the
   default without a ClusterSpec) lets AUTO choose it; other architectures then run with it on
3. ``estimate(profile, plan)`` for the plan, and ``compare_architectures(profile, plan.cluster)``
   for the whole-model options AR, PS, HYBRID and AUTO (with the local aggregation the inputs
   ask for, or its own choice under "auto") and the baselines a user would
   otherwise run (sparse-as-dense, plain Horovod, TF-PS), all priced by the calibration
   (its defaults, "uncalibrated", without one).

Speedups compare estimated step times: ``speedup_vs_ar = t_step(AR) / t_step(plan)`` (> 1 means
the plan is faster than allreducing everything), likewise ``speedup_vs_ps``. AUTO is never
estimated slower than AR, PS or HYBRID (:mod:`parallax_nb.cost.auto`).

Synchronous or asynchronous (issue 16): ``sync`` (True or False) and ``max_staleness`` (None:
unbounded, or a whole number >= 0; text from a view, ``""`` meaning unbounded) make the plan
``plan.with_sync(sync, max_staleness)``, so the Plan's own refusals apply: async with any
AllReduce variable, a bound on a synchronous plan. The estimates stay those of synchronous
steps (the cost model prices an asynchronous worker's step apart, :mod:`parallax_nb.cost.asynchronous`).

Bad input (0 machines, a bandwidth of ``"fast"``) does not raise from a change: the planner
keeps the last valid plan and estimates, and records the problem in :attr:`Planner.error`, which
the view shows. Only the inputs given when the planner is created must be valid (there is no
earlier plan to keep), and :meth:`Planner.check` raises the recorded error for scripts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from .errors import ConfigError, ParallaxError, PlanError
from .types import BASELINE_KEYS, Architecture, ClusterSpec, Method, Profile, format_bandwidth, format_bytes

Observer = Callable[["Planner"], None]

CLUSTER_FIELDS = ("machines", "workers_per_machine", "bandwidth", "latency_s", "local_aggregation")
AUTO_LOCAL_AGGREGATION = "auto"   # the local-aggregation input that lets AUTO choose
SYNC_FIELDS = ("sync", "max_staleness")
SETTABLE = CLUSTER_FIELDS + ("architecture",) + SYNC_FIELDS


@dataclass(frozen=True)
class PlannerInputs:
    """What the user asked for, valid or not. ``bandwidth`` is kept as given (text such as
    ``"10Gbit/s"``, shown back unchanged by a view, or bits per second as a number, exact when it
    comes from a ClusterSpec); ``local_aggregation`` is True, False or ``"auto"`` (AUTO chooses);
    ``partitions`` and ``methods`` are the per-variable overrides (variable name -> partition
    count / method). ``sync``: True or False; ``max_staleness``: None, a whole number or its text."""

    machines: Any = 1
    workers_per_machine: Any = 1
    bandwidth: Any = "10Gbit/s"
    latency_s: Any = 25e-6
    local_aggregation: Any = AUTO_LOCAL_AGGREGATION
    architecture: Any = Architecture.AUTO
    partitions: Mapping[str, Any] = field(default_factory=dict)
    methods: Mapping[str, Any] = field(default_factory=dict)
    sync: Any = True
    max_staleness: Any = None


@dataclass(frozen=True)
class PlannerResult:
    """One consistent, valid computation: the inputs it came from and everything derived."""

    inputs: PlannerInputs
    cluster: ClusterSpec
    architecture: Architecture
    plan: Any            # parallax_nb.plan.Plan
    estimate: Any        # parallax_nb.cost.Estimate of ``plan``
    estimates: dict      # Architecture and baseline key -> Estimate, on the plan's cluster


def _as_int(name: str, value: Any) -> int:
    """Whole numbers from widgets and users (``8``, ``8.0``, ``"8"``); anything else is a ConfigError."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a whole number, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("+").isdigit():
        return int(value.strip())
    raise ConfigError(f"{name} must be a whole number, got {value!r}", hint=f"type {name} like 8")


def _as_local_aggregation(value: Any) -> bool | None:
    """True/False, or None for ``"auto"`` (AUTO chooses)."""
    if isinstance(value, str) and value.strip().lower() == AUTO_LOCAL_AGGREGATION:
        return None
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise ConfigError(f"local_aggregation must be True, False or 'auto', got {value!r}",
                      hint="'auto' lets AUTO choose whichever its estimate calls faster")


def _as_bandwidth_text(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def _as_latency_s(value: Any) -> float:
    """Seconds per message from ``latency_s``; the error speaks microseconds, as the view does."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0:
        shown = f"{value * 1e6:.6g} µs" if number else repr(value)
        raise ConfigError(f"latency must be a number of microseconds >= 0, got {shown}",
                          hint="about 25 µs for a data-centre network, 0 to ignore per-message latency")
    return float(value)


def _as_sync(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"sync must be True (synchronous) or False (asynchronous), got {value!r}")


def _as_max_staleness(value: Any) -> int | None:
    """None (unbounded) from None or blank text; a whole number >= 0 from a number or its text."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "unbounded")):
        return None
    hint = "0 is lock-step, k lets a worker run k steps ahead of the slowest; leave it empty for unbounded"
    try:
        k = _as_int("max staleness", value)
    except ConfigError:
        raise ConfigError(f"max staleness must be a whole number >= 0 or empty (unbounded), got {value!r}",
                          hint=hint) from None
    if k < 0:
        raise ConfigError(f"max staleness must be a whole number >= 0 or empty (unbounded), got {k}", hint=hint)
    return k


def _build(profile: Profile, inputs: PlannerInputs, calibration=None) -> PlannerResult:
    """Compute everything from ``inputs``; raises a ParallaxError naming the first bad input."""
    from .cost import compare_architectures, estimate
    from .cost.timing import calibration_for
    from .plan import make_plan

    local_aggregation = _as_local_aggregation(inputs.local_aggregation)
    cluster = ClusterSpec.create(
        machines=_as_int("machines", inputs.machines),
        workers_per_machine=_as_int("workers per machine", inputs.workers_per_machine),
        bandwidth=_as_bandwidth_text(inputs.bandwidth),
        latency_s=_as_latency_s(inputs.latency_s),
        local_aggregation=True if local_aggregation is None else local_aggregation,
    )
    calibration_for(cluster, calibration)   # another shape: the error names both
    architecture = Architecture.parse(inputs.architecture)
    known = set(profile.names)
    for kind, overrides in (("partition", inputs.partitions), ("method", inputs.methods)):
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise PlanError(f"{kind} override for unknown variable(s) {unknown}",
                            hint=f"variables of {profile.model_name}: {profile.names}")
    partitions = {}
    for name, p in inputs.partitions.items():
        p = _as_int(f"partitions of {name}", p)
        if p < 1:
            raise PlanError(f"partitions of {name} must be >= 1, got {p}",
                            hint="1 keeps the variable whole; P > 1 splits it across P servers")
        partitions[name] = p
    methods = {}
    for name, m in inputs.methods.items():
        try:
            methods[name] = m if isinstance(m, Method) else Method(str(m).strip().lower())
        except ValueError:
            raise PlanError(f"unknown method {m!r} for {name}", hint=f"choose one of {Method.choices()}") from None
    plan = make_plan(profile, cluster, architecture, partitions=partitions or None,
                     local_aggregation=local_aggregation, calibration=calibration)
    if methods:   # partitions again: a variable switched to PS keeps the partitions asked for
        plan = plan.with_methods(methods, partitions={n: p for n, p in partitions.items() if n in methods})
    sync, max_staleness = _as_sync(inputs.sync), _as_max_staleness(inputs.max_staleness)
    if not sync or max_staleness is not None:
        plan = plan.with_sync(sync, max_staleness)   # the Plan refuses async with AllReduce variables
    estimates = compare_architectures(profile, plan.cluster, include_horovod=True, calibration=calibration,
                                      local_aggregation=local_aggregation)   # AUTO as the inputs would make it
    return PlannerResult(inputs=inputs, cluster=plan.cluster, architecture=architecture, plan=plan,
                         estimate=estimate(profile, plan, calibration=calibration), estimates=dict(estimates))


class Planner:
    """Interactive planning for one profile: change any input, read the recomputed plan and costs.

    Inputs (read and write): ``machines``, ``workers_per_machine``, ``bandwidth`` (text with
    units, e.g. ``"100Gbit/s"``), ``latency_s``, ``local_aggregation`` (True, False or
    ``"auto"``: AUTO chooses; the default unless a ClusterSpec says), ``architecture``
    (``"ar" | "ps" | "hybrid" | "auto"``), ``sync`` and ``max_staleness`` (module docstring),
    plus per-variable overrides through :meth:`set_partitions` and :meth:`set_method`.
    ``set(**changes)`` applies several at once and recomputes once.

    Results (read only, always from the last valid inputs): ``plan``, ``estimate`` (of the
    plan), ``estimates`` (per whole-model architecture and baseline), ``table``, ``comm_time_s``,
    ``step_time_s``, ``speedup_vs_ar``, ``speedup_vs_ps``, ``cluster`` (with the local
    aggregation the plan runs with), ``explanations`` (AUTO's reasons). ``calibration`` (fixed
    for the planner's life) prices every estimate; a change to another cluster shape is an
    :attr:`error` naming both shapes. ``error`` is the problem with the latest inputs (None
    when they are valid).
    """

    def __init__(self, profile: Profile, cluster: ClusterSpec | None = None,
                 architecture: "str | Architecture" = "auto", calibration=None, **cluster_kwargs):
        if not isinstance(profile, Profile):
            raise ConfigError(f"plan() needs a parallax_nb Profile, got {type(profile).__name__}",
                              hint="profile first: prof = px.profile(job, steps=20); px.plan(prof, ...)")
        unknown = set(cluster_kwargs) - set(CLUSTER_FIELDS) - set(SYNC_FIELDS) - {"partitions", "methods"}
        if unknown:
            raise ConfigError(f"unknown planner option(s) {sorted(unknown)}",
                              hint=f"choose among {list(CLUSTER_FIELDS + SYNC_FIELDS)}, partitions, methods")
        base = cluster or ClusterSpec(machines=1)
        if not isinstance(base, ClusterSpec):
            raise ConfigError(f"cluster must be a ClusterSpec, got {type(base).__name__}",
                              hint='build one with px.ClusterSpec.create(machines=8, bandwidth="10Gbit/s")')
        values = dict(machines=base.machines, workers_per_machine=base.workers_per_machine,
                      bandwidth=base.bandwidth_bps, latency_s=base.latency_s,
                      local_aggregation=base.local_aggregation if cluster is not None else AUTO_LOCAL_AGGREGATION,
                      architecture=architecture)
        values.update(cluster_kwargs)
        if calibration is not None:
            from .calibration import Calibration
            if not isinstance(calibration, Calibration):
                raise ConfigError(f"calibration must be a parallax_nb Calibration, got {type(calibration).__name__}",
                                  hint="load one with px.Calibration.from_json(path), or leave it out")
        for key, what, hint in (
                ("partitions", "partition counts",
                 "e.g. partitions={'embedding/embeddings': 4}; a PS variable not named gets one per worker"),
                ("methods", "methods", "e.g. methods={'embedding/embeddings': 'ps'}; a variable not named keeps "
                                       "its architecture's method")):
            given = values.get(key)
            if given is not None and not isinstance(given, Mapping):   # an int was read as no overrides
                raise ConfigError(f"{key} must map variable names to {what}, got {given!r:.80}", hint=hint)
        self.profile = profile
        self.calibration = calibration
        self._observers: list[Observer] = []
        self._inputs = PlannerInputs(**{**values, "partitions": dict(values.get("partitions") or {}),
                                        "methods": dict(values.get("methods") or {})})
        self._result = _build(profile, self._inputs, calibration)   # invalid initial inputs raise here
        self.error: ParallaxError | None = None

    # ----------------------------------------------------------------- changing inputs
    def set(self, **changes) -> "Planner":
        """Apply input changes and recompute once. Invalid inputs set :attr:`error` and keep
        the previous valid results; observers are called either way."""
        unknown = set(changes) - set(SETTABLE)
        if unknown:
            raise ConfigError(f"cannot set {sorted(unknown)} on a Planner", hint=f"settable: {list(SETTABLE)}")
        return self._apply(replace(self._inputs, **changes))

    def set_partitions(self, variable: str, partitions: int | None) -> "Planner":
        """Split ``variable`` into ``partitions`` parts on the servers (None: back to the plan's
        choice). A name that is not the model's sets :attr:`error` and changes no input."""
        if not self._known(variable, "partitions"):
            return self
        overrides = dict(self._inputs.partitions)
        if partitions is None:
            overrides.pop(variable, None)
        else:
            overrides[variable] = partitions
        return self._apply(replace(self._inputs, partitions=overrides))

    def set_method(self, variable: str, method: "str | Method | None") -> "Planner":
        """Force ``variable`` to ``method`` whatever the architecture (None: no override). A name
        that is not the model's, or a method that is none, sets :attr:`error` and changes no input."""
        if not self._known(variable, "method"):
            return self
        if method is not None and not isinstance(method, Method):
            try:
                method = Method(str(method).strip().lower())
            except ValueError:
                return self._refuse(PlanError(f"unknown method {method!r} for {variable}",
                                              hint=f"choose one of {Method.choices()}, or None for the plan's own"))
        overrides = dict(self._inputs.methods)
        if method is None:
            overrides.pop(variable, None)
        else:
            overrides[variable] = method
        return self._apply(replace(self._inputs, methods=overrides))

    def _known(self, variable, what: str) -> bool:
        """Whether ``variable`` is one of the model's; if not, :meth:`_refuse` a PlanError naming
        it and the model's variables."""
        if variable in self.profile.names:
            return True
        self._refuse(PlanError(f"cannot set the {what} of {variable!r}: {self.profile.model_name} has no such "
                               f"variable", hint=f"variables of {self.profile.model_name}: {self.profile.names}"))
        return False

    def _refuse(self, error: PlanError) -> "Planner":
        """Show ``error`` (:attr:`error`, observers told) and keep the inputs as they were: an
        override kept for a name the model lacks, or a method that is none, would fail every
        later change until removed."""
        self.error = error
        self._notify()
        return self

    def reset_overrides(self) -> "Planner":
        return self._apply(replace(self._inputs, partitions={}, methods={}))

    def _apply(self, inputs: PlannerInputs) -> "Planner":
        self._inputs = inputs
        try:
            self._result = _build(self.profile, inputs, self.calibration)
            self.error = None
        except ParallaxError as e:
            self.error = e
        self._notify()
        return self

    def check(self) -> "Planner":
        """Raise the problem with the latest inputs, if any (for scripts; views show it instead)."""
        if self.error is not None:
            raise self.error
        return self

    # ----------------------------------------------------------------- observers
    def observe(self, callback: Observer) -> Observer:
        """Call ``callback(planner)`` after every recomputation (valid or not)."""
        self._observers.append(callback)
        return callback

    def unobserve(self, callback: Observer) -> None:
        if callback in self._observers:
            self._observers.remove(callback)

    def _notify(self) -> None:
        for callback in list(self._observers):
            callback(self)

    # ----------------------------------------------------------------- inputs as attributes
    @property
    def inputs(self) -> PlannerInputs:
        """The latest inputs, exactly as given (possibly invalid: see :attr:`error`)."""
        return self._inputs

    machines = property(lambda self: self._inputs.machines, lambda self, v: self.set(machines=v))
    workers_per_machine = property(lambda self: self._inputs.workers_per_machine,
                                   lambda self, v: self.set(workers_per_machine=v))
    bandwidth = property(lambda self: self._inputs.bandwidth, lambda self, v: self.set(bandwidth=v))
    latency_s = property(lambda self: self._inputs.latency_s, lambda self, v: self.set(latency_s=v))
    local_aggregation = property(lambda self: self._inputs.local_aggregation,
                                 lambda self, v: self.set(local_aggregation=v))
    architecture = property(lambda self: self._inputs.architecture, lambda self, v: self.set(architecture=v))
    sync = property(lambda self: self._inputs.sync, lambda self, v: self.set(sync=v))
    max_staleness = property(lambda self: self._inputs.max_staleness, lambda self, v: self.set(max_staleness=v))

    @property
    def partitions(self) -> dict:
        """Per-variable partition overrides."""
        return dict(self._inputs.partitions)

    @property
    def methods(self) -> dict:
        """Per-variable method overrides."""
        return dict(self._inputs.methods)

    # ----------------------------------------------------------------- results
    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def result(self) -> PlannerResult:
        return self._result

    @property
    def cluster(self) -> ClusterSpec:
        return self._result.cluster

    @property
    def plan(self):
        """The Plan of the last valid inputs (hand it to ``px.run``)."""
        return self._result.plan

    @property
    def estimate(self):
        """Estimated cost of :attr:`plan` (parallax_nb.cost.Estimate)."""
        return self._result.estimate

    @property
    def estimates(self) -> dict:
        """Estimated cost of each whole-model architecture (AR, PS, HYBRID, AUTO) on :attr:`cluster`."""
        return dict(self._result.estimates)

    @property
    def explanations(self) -> tuple[str, ...]:
        """Why AUTO chose what it chose (local aggregation, then each variable); empty otherwise."""
        return tuple(self.plan.explanations)

    @property
    def calibration_label(self) -> str:
        """Which figures priced the estimates: "uncalibrated (defaults)" or "calibrated on ..."."""
        return self.estimate.calibration

    @property
    def comm_time_s(self) -> float:
        return self.estimate.comm_time_s

    @property
    def step_time_s(self) -> float:
        return self.estimate.step_time_s

    @property
    def bytes_per_machine_per_step(self) -> float:
        return self.estimate.bytes_per_machine_per_step

    def speedup_vs(self, architecture: "str | Architecture") -> float:
        """``t_step(architecture) / t_step(plan)``: how much faster the plan is than that baseline."""
        key = architecture if architecture in BASELINE_KEYS else Architecture.parse(architecture)
        baseline = self._result.estimates[key]
        return baseline.step_time_s / self.step_time_s if self.step_time_s > 0 else float("inf")

    @property
    def speedup_vs_ar(self) -> float:
        """``t_step(all AR) / t_step(plan)``."""
        return self.speedup_vs(Architecture.AR)

    @property
    def speedup_vs_ps(self) -> float:
        """``t_step(all PS) / t_step(plan)``."""
        return self.speedup_vs(Architecture.PS)

    @property
    def table(self):
        """One row per variable (index: name): kind, size_bytes, alpha, ``<method>_bytes_per_step``
        for every method (bytes per machine per step, e.g. ``ps_bytes_per_step``), method (the
        plan's choice) and partitions. A view of :attr:`plan`, recomputed with it."""
        import pandas as pd

        byte_columns = [f"{m.value}_bytes_per_step" for m in Method]
        rows = [{
            "name": v.name,
            "kind": getattr(v.kind, "value", v.kind),
            "size_bytes": v.size_bytes,
            "alpha": v.alpha,
            **{f"{m.value}_bytes_per_step": v.bytes_for(m) for m in Method},
            "method": getattr(v.method, "value", v.method),
            "partitions": v.partitions,
        } for v in self.plan.variables]
        columns = ["name", "kind", "size_bytes", "alpha", *byte_columns, "method", "partitions"]
        return pd.DataFrame(rows, columns=columns).set_index("name")

    # ----------------------------------------------------------------- display
    def summary(self) -> str:
        r = self._result
        from .staleness import describe_sync

        training = "" if r.plan.sync else f", {describe_sync(r.plan.sync, r.plan.max_staleness)}"
        lines = [
            f"Planner for {self.profile.model_name} on {r.cluster} -- architecture {r.architecture.value}{training}",
            f"  estimated communication {self.comm_time_s * 1e3:.2f} ms/step, step {self.step_time_s * 1e3:.2f} ms, "
            f"{format_bytes(self.bytes_per_machine_per_step)} per machine per step",
            f"  speedup vs all-AR {self.speedup_vs_ar:.2f}x, vs all-PS {self.speedup_vs_ps:.2f}x "
            f"({self.calibration_label})",
        ]
        if self.explanations:
            lines.append("  why: " + "; ".join(self.explanations))
        if self.error is not None:
            lines.append(f"  ERROR in latest inputs (showing the last valid plan): {self.error}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()


def plan(profile: Profile, cluster: ClusterSpec | None = None, architecture: "str | Architecture" = "auto",
         calibration=None, **cluster_kwargs) -> Planner:
    """Plan ``profile`` for a cluster; returns a :class:`Planner` that shows itself as a widget.

    ``px.plan(prof, machines=8, workers_per_machine=6, bandwidth="100Gbit/s")`` or
    ``px.plan(prof, px.ClusterSpec.create(8, 6, "100Gbit/s"), architecture="hybrid")``; keyword
    arguments override the fields of ``cluster``. ``calibration`` (``px.calibrate(...)`` or
    ``Calibration.from_json(path)``, of this cluster's shape) prices the estimates; without one
    the defaults do and the estimates say "uncalibrated". ``planner.plan`` is the Plan to run.
    """
    return Planner(profile, cluster, architecture, calibration=calibration, **cluster_kwargs)


def describe_inputs(inputs: PlannerInputs) -> str:
    """One line naming the inputs (for error notes in views)."""
    bandwidth = inputs.bandwidth
    if isinstance(bandwidth, (int, float)) and not isinstance(bandwidth, bool):
        bandwidth = format_bandwidth(bandwidth)
    text = (f"{inputs.machines} machine(s) x {inputs.workers_per_machine} worker(s), {bandwidth}, "
            f"architecture {getattr(inputs.architecture, 'value', inputs.architecture)}")
    if inputs.sync is not True:
        k = inputs.max_staleness
        text += ", asynchronous" if k is None or k == "" else f", asynchronous, max staleness {k}"
    elif inputs.max_staleness not in (None, ""):
        text += f", synchronous, max staleness {inputs.max_staleness}"
    return text
