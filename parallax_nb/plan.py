"""Plan: per variable, how it is synchronised (PS or AR) and into how many partitions.

A Plan is what the runtime executes and what reports explain. It is made from a profile and a
cluster by :func:`make_plan` (bytes per machine per step recorded per variable, from
:mod:`parallax_nb.cost`), or from variable kinds alone by :func:`plan_for_kinds` (no bytes).
It round-trips through JSON (schema ``parallax_nb.plan``, version 1) and is validated on load:
an unknown method, a partition count below 1, a corrupted file or a plan from another model
raise :class:`~parallax_nb.errors.PlanError` naming the variable and the value.

Synchronous or asynchronous (issue 16): ``Plan.sync`` (default True) and ``max_staleness``.
An asynchronous plan trains its PS variables without a barrier (each worker pulls rows,
computes on its own batch, pushes its gradient and moves on; :mod:`parallax_nb.runtime.async_ps`),
with ``max_staleness = k`` bounding how many steps a worker may run ahead of the slowest
(None: unbounded, 0: lock-step). Async applies to PS only, as in the original Parallax, and
to whole plans: a plan with any AllReduce variable is refused for async, because an
allreduce is a barrier by nature (every rank waits for every other at each step), so a
HYBRID plan would keep the straggler's pace it is meant to escape; plan it with
``architecture="ps"`` instead. ``max_staleness`` on a synchronous plan is refused rather
than ignored: it would read as a setting that took effect. JSON without the two fields (older
plans) loads as synchronous.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator, Mapping

from .cost.choice import check_partitions, choose_method, default_partitions, partitions_resolver
from .cost.pricing import check_inputs, variable_costs
from .errors import ConfigError, ParallaxError, PlanError
from .jsonfile import check_schema
from .types import (SPARSE_AS_DENSE, SUMMARY_ROWS, Architecture, ClusterSpec, Kind, Method, Profile, format_bytes,
                    largest_in_order, method_key)

PLAN_SCHEMA = "parallax_nb.plan"
PLAN_SCHEMA_VERSION = 1
RECORDED_COSTS = (*(m.value for m in Method), SPARSE_AS_DENSE)  # each planned variable's bytes under these
_BYTE_FIELDS = tuple(f"{key}_bytes_per_step" for key in RECORDED_COSTS)


class UnknownVariableError(PlanError, KeyError):
    """``plan[name]`` for a name the plan does not have (a PlanError and a KeyError)."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return ParallaxError.__str__(self)


def _parse_method(name: str, value: Any) -> Method:
    try:
        return value if isinstance(value, Method) else Method(str(value).strip().lower())
    except ValueError:
        raise PlanError(f"variable {name!r}: unknown method {value!r}",
                        hint=f"a method is one of {Method.choices()}") from None


def _parse_kind(name: str, value: Any) -> Kind:
    try:
        return value if isinstance(value, Kind) else Kind(str(value).strip().lower())
    except ValueError:
        raise PlanError(f"variable {name!r}: unknown kind {value!r}",
                        hint="a kind is 'dense' or 'sparse'") from None


def _optional_number(name: str, label: str, value: Any, upper: float | None = None) -> float | None:
    if value is None:
        return None
    if type(value) in (int, float) and 0 <= value < math.inf and (upper is None or value <= upper):
        return value  # the common case, checked fast: a planner rebuilds thousands of these
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
            or (upper is not None and value > upper):
        bound = f"between 0 and {upper:g}" if upper is not None else "a finite number >= 0"
        raise PlanError(f"variable {name!r}: {label} must be {bound} (or null), got {value!r}")
    return value


@dataclass(frozen=True)
class VariablePlan:
    """One variable's method and partitions, with what the cost model said about it.

    ``alpha`` is the profiled fraction of rows one worker touches per step; ``costs`` maps
    each key of :data:`RECORDED_COSTS` (every method and sparse-as-dense AR) to the bytes sent +
    received per machine per step on the plan's cluster (JSON: ``"<key>_bytes_per_step"``).
    It is empty for a plan made without a profile. ``partitions`` is the number of server
    partitions when the method is PS (AR ignores it).
    """

    name: str
    kind: Kind
    method: Method
    partitions: int = 1
    alpha: float | None = None
    size_bytes: int | None = None
    costs: dict = field(default_factory=dict, hash=False)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise PlanError(f"a variable name must be a non-empty string, got {self.name!r}")
        object.__setattr__(self, "kind", _parse_kind(self.name, self.kind))
        object.__setattr__(self, "method", _parse_method(self.name, self.method))
        object.__setattr__(self, "partitions", check_partitions(self.name, self.partitions))
        _optional_number(self.name, "alpha", self.alpha, upper=1.0)
        _optional_number(self.name, "size_bytes", self.size_bytes)
        costs = {(k if type(k) is str and k.islower() else method_key(k)): v
                 for k, v in dict(self.costs or {}).items() if v is not None}
        for key, value in costs.items():
            if not (type(value) in (int, float) and 0 <= value < math.inf):   # checked fast: thousands per replan
                _optional_number(self.name, f"{key}_bytes_per_step", value)
        object.__setattr__(self, "costs", costs)

    def bytes_for(self, method: "Method | str") -> float | None:
        """Bytes per machine per step under ``method`` (None without a profile)."""
        return self.costs.get(method_key(method))

    @property
    def bytes_per_step(self) -> float | None:
        """Bytes per machine per step under the chosen method (None without a profile)."""
        return self.bytes_for(self.method)

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind.value, "method": self.method.value,
                "partitions": self.partitions, "alpha": self.alpha, "size_bytes": self.size_bytes,
                **{f"{key}_bytes_per_step": self.costs.get(key) for key in RECORDED_COSTS}}

    @classmethod
    def from_dict(cls, d: Any, position: int = 0) -> "VariablePlan":
        if not isinstance(d, dict):
            raise PlanError(f"plan variable #{position} must be an object, got {type(d).__name__}")
        name = d.get("name")
        for required in ("name", "kind", "method"):
            if required not in d:
                raise PlanError(f"plan variable #{position} ({name!r}) lacks field {required!r}")
        unknown = set(d) - {"name", "kind", "method", "partitions", "alpha", "size_bytes", *_BYTE_FIELDS}
        if unknown:
            raise PlanError(f"plan variable {name!r} has unknown field(s) {sorted(unknown)}")
        plain = {k: v for k, v in d.items() if k not in _BYTE_FIELDS}
        return cls(**plain, costs={key: d.get(f"{key}_bytes_per_step") for key in RECORDED_COSTS})


@dataclass(frozen=True)
class Plan:
    """Per-variable methods and partitions for one model (and, when planned with costs, one cluster).

    ``plan[name]`` is a :class:`VariablePlan`; ``plan.method(name)``, ``plan.partitions(name)``;
    ``plan.names``, ``plan.ps_variables`` and ``plan.ar_variables`` are tuples of names.
    ``overrides`` names the variables whose method the user set by hand (:meth:`with_methods`).
    ``explanations``: why AUTO chose what it chose, one line per decision (empty otherwise).
    ``sync``: False trains the PS variables asynchronously, with ``max_staleness`` (None or a
    whole number >= 0) as the stale-synchronous bound (module docstring; :meth:`with_sync`).
    """

    model_name: str
    architecture: Architecture
    cluster: ClusterSpec | None
    variables: tuple[VariablePlan, ...]
    local_aggregation: bool = True
    overrides: tuple[str, ...] = ()
    explanations: tuple[str, ...] = ()
    sync: bool = True
    max_staleness: int | None = None
    _index: dict = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        try:
            object.__setattr__(self, "architecture", Architecture.parse(self.architecture))
        except ConfigError as e:
            raise PlanError(e.message, hint=e.hint) from None
        if self.cluster is not None and not isinstance(self.cluster, ClusterSpec):
            raise PlanError(f"plan cluster must be a ClusterSpec or None, got {type(self.cluster).__name__}")
        variables = tuple(self.variables)
        for v in variables:
            if not isinstance(v, VariablePlan):
                raise PlanError(f"plan variables must be VariablePlan objects, got {type(v).__name__}")
        index = {}
        for v in variables:
            if v.name in index:
                raise PlanError(f"variable {v.name!r} appears twice in the plan of {self.model_name!r}",
                                hint="each variable has exactly one entry")
            index[v.name] = v
        unknown = sorted(set(self.overrides) - set(index))
        if unknown:
            raise PlanError(f"overrides name unknown variable(s) {unknown}")
        object.__setattr__(self, "variables", variables)
        object.__setattr__(self, "overrides", tuple(self.overrides))
        object.__setattr__(self, "explanations", tuple(self.explanations))
        object.__setattr__(self, "local_aggregation", bool(self.local_aggregation))
        object.__setattr__(self, "_index", index)
        self._check_sync()

    def _check_sync(self) -> None:
        """The sync flag and the staleness bound fit each other and the plan's methods."""
        if not isinstance(self.sync, bool):
            raise PlanError(f"plan 'sync' must be true or false, got {self.sync!r}")
        k = self.max_staleness
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise PlanError(f"max_staleness must be a whole number >= 0 or None, got {k!r}",
                            hint="0 is lock-step, k lets a worker run k steps ahead of the slowest, "
                                 "None (the default) leaves it unbounded")
        if self.sync:
            if k is not None:
                raise PlanError(f"max_staleness={k} applies to asynchronous training, and this plan is synchronous",
                                hint=f"train asynchronously with plan.with_sync(False, max_staleness={k}), "
                                     "or leave max_staleness unset")
            return
        ar = self.ar_variables
        if not self.ps_variables:
            raise PlanError(f"asynchronous training needs parameter-server variables, and every variable of "
                            f"{self.model_name!r} is AllReduce ({len(ar)} variable(s))",
                            hint="plan with architecture='ps' to train asynchronously, or keep sync=True")
        if ar:
            shown = list(ar) if len(ar) <= 4 else [*ar[:4], "..."]
            raise PlanError(f"asynchronous training applies to PS variables only; {len(ar)} variable(s) of "
                            f"{self.model_name!r} are AllReduce {shown}: an allreduce is a barrier at every step",
                            hint="plan with architecture='ps' (every variable on the parameter servers), "
                                 "or plan.with_methods({name: 'ps'}) for these, or keep sync=True")

    # ------------------------------------------------------------------ lookup
    def __getitem__(self, name: str) -> VariablePlan:
        try:
            return self._index[name]
        except (KeyError, TypeError):
            close = difflib.get_close_matches(str(name), list(self._index), n=3)
            hint = f"did you mean {close}?" if close else f"variables of {self.model_name!r}: {list(self._index)}"
            raise UnknownVariableError(f"no variable {name!r} in the plan of {self.model_name!r}",
                                       hint=hint) from None

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __iter__(self) -> Iterator[VariablePlan]:
        return iter(self.variables)

    def __len__(self) -> int:
        return len(self.variables)

    def method(self, name: str) -> Method:
        return self[name].method

    def partitions(self, name: str) -> int:
        return self[name].partitions

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._index)

    @property
    def ps_variables(self) -> tuple[str, ...]:
        """Names of the variables synchronised through parameter servers."""
        return tuple(v.name for v in self.variables if v.method is Method.PS)

    @property
    def ar_variables(self) -> tuple[str, ...]:
        """Names of the variables synchronised by allreduce (dense) or allgather (sparse)."""
        return tuple(v.name for v in self.variables if v.method is Method.AR)

    @property
    def bytes_per_machine_per_step(self) -> float | None:
        """Sum of the chosen methods' bytes per machine per step (None without a profile)."""
        chosen = [v.bytes_per_step for v in self.variables]
        return None if any(b is None for b in chosen) else float(sum(chosen))

    def validate_for(self, variable_names: Iterable[str]) -> None:
        """Raise PlanError unless the plan names exactly ``variable_names`` (the model's variables)."""
        names = list(variable_names)
        model, planned = set(names), set(self._index)
        if model == planned:
            return
        missing, unknown = sorted(model - planned), sorted(planned - model)
        parts = []
        if missing:
            parts.append(f"no entry for model variable(s) {missing}")
        if unknown:
            parts.append(f"entries for unknown variable(s) {unknown}")
        raise PlanError(f"plan of {self.model_name!r} does not match this model: " + "; ".join(parts),
                        hint="is it a plan from another model? Re-plan from this model's profile")

    # ------------------------------------------------------------------ changes
    def with_sync(self, sync: bool, max_staleness: int | None = None) -> "Plan":
        """A copy trained synchronously (``sync=True``) or asynchronously with ``max_staleness``."""
        return replace(self, sync=sync, max_staleness=max_staleness)

    def with_methods(self, methods: Mapping[str, "Method | str"],
                     partitions: Mapping[str, int] | None = None) -> "Plan":
        """A copy with the user's methods (and optionally partitions) for the named variables.

        A variable switched from AR to PS with one partition gets the default partition count
        (one per worker of the plan's cluster) unless ``partitions`` names it.
        """
        partitions = dict(partitions or {})
        unknown = sorted((set(methods) | set(partitions)) - set(self._index))
        if unknown:
            raise PlanError(f"cannot override unknown variable(s) {unknown} in the plan of {self.model_name!r}",
                            hint=f"variables: {list(self._index)}")
        changed = []
        for v in self.variables:
            if v.name not in methods and v.name not in partitions:
                changed.append(v)
                continue
            method = _parse_method(v.name, methods.get(v.name, v.method))
            if v.name in partitions:
                parts = check_partitions(v.name, partitions[v.name])
            elif method.partitioned and not v.method.partitioned and v.partitions == 1:
                parts = default_partitions(self.cluster)
            else:
                parts = v.partitions
            changed.append(replace(v, method=method, partitions=parts))
        overrides = tuple(dict.fromkeys([*self.overrides, *[n for n in self._index if n in methods]]))
        return replace(self, variables=tuple(changed), overrides=overrides)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        return {
            "schema": PLAN_SCHEMA,
            "schema_version": PLAN_SCHEMA_VERSION,
            "model_name": self.model_name,
            "architecture": self.architecture.value,
            "local_aggregation": self.local_aggregation,
            "sync": self.sync,
            "max_staleness": self.max_staleness,
            "cluster": self.cluster.to_dict() if self.cluster is not None else None,
            "overrides": list(self.overrides),
            "explanations": list(self.explanations),
            "variables": [v.to_dict() for v in self.variables],
        }

    def to_json(self, path: str | None = None) -> str:
        """The plan as JSON text; with ``path``, also written there atomically."""
        from .jsonfile import dump_json

        return dump_json(self.to_dict(), path)

    @classmethod
    def from_dict(cls, d: Any, variable_names: Iterable[str] | None = None) -> "Plan":
        """Validate and build a plan; with ``variable_names``, also check it fits that model."""
        check_schema(d, PLAN_SCHEMA, PLAN_SCHEMA_VERSION, "plan", PlanError,
                     make_hint="make one with make_plan() or `python -m parallax_nb plan profile.json ...`",
                     version_hint="re-plan with this version of parallax_nb")
        for required in ("model_name", "architecture", "variables"):
            if required not in d:
                raise PlanError(f"plan lacks field {required!r}", hint="the file may be truncated; re-plan")
        if not isinstance(d["variables"], list):
            raise PlanError(f"plan 'variables' must be a list, got {type(d['variables']).__name__}")
        cluster = d.get("cluster")
        if cluster is not None:
            try:
                cluster = ClusterSpec.from_dict(cluster) if isinstance(cluster, dict) else _bad_cluster(cluster)
            except (ConfigError, TypeError) as e:
                raise PlanError(f"plan's cluster is invalid: {getattr(e, 'message', e)}") from None
        overrides = d.get("overrides", [])
        if not isinstance(overrides, list):
            raise PlanError(f"plan 'overrides' must be a list of names, got {overrides!r}")
        explanations = d.get("explanations", [])
        if not isinstance(explanations, list):
            raise PlanError(f"plan 'explanations' must be a list of lines, got {explanations!r}")
        plan = cls(
            model_name=str(d["model_name"]),
            architecture=d["architecture"],
            cluster=cluster,
            variables=tuple(VariablePlan.from_dict(v, i) for i, v in enumerate(d["variables"])),
            local_aggregation=bool(d.get("local_aggregation", True)),
            overrides=tuple(overrides),
            explanations=tuple(str(line) for line in explanations),
            sync=d.get("sync", True),
            max_staleness=d.get("max_staleness"),
        )
        if variable_names is not None:
            plan.validate_for(variable_names)
        return plan

    @classmethod
    def from_json(cls, path_or_text: str, variable_names: Iterable[str] | None = None) -> "Plan":
        """Load a plan from a path or JSON text; errors name the file and the problem (PlanError)."""
        from .jsonfile import load_json

        try:
            data = load_json(path_or_text, what="plan")
        except PlanError:
            raise
        except ParallaxError as e:
            raise PlanError(e.message, hint=e.hint) from None
        return cls.from_dict(data, variable_names)

    # ------------------------------------------------------------------ views
    def dataframe(self):
        """One row per variable (index: name): kind, method, partitions, alpha, size and bytes."""
        import pandas as pd

        columns = ["name", "kind", "method", "partitions", "alpha", "size_bytes", *_BYTE_FIELDS, "bytes_per_step"]
        rows = [dict(v.to_dict(), bytes_per_step=v.bytes_per_step) for v in self.variables]
        return pd.DataFrame(rows, columns=columns).set_index("name")

    def summary(self, limit: int | None = SUMMARY_ROWS) -> str:
        """The plan as text: a head line, a row per variable and AUTO's reasons.

        A plan of more than ``limit`` variables lists the ``limit`` that move the most bytes
        per machine per step under their method (in plan order, their reasons with them) and
        counts the rest; ``None`` lists every one (``plan.dataframe()`` holds them all too)."""
        where = str(self.cluster) if self.cluster is not None else "no cluster"
        head = (f"Plan for {self.model_name} ({self.architecture.value}) on {where}: {len(self)} variables, "
                f"{len(self.ps_variables)} PS / {len(self.ar_variables)} AR")
        total = self.bytes_per_machine_per_step
        if total is not None:
            head += f", {format_bytes(total)} per machine per step"
        if self.overrides:
            head += f", methods set by hand: {list(self.overrides)}"
        if not self.sync:
            bound = "unbounded" if self.max_staleness is None else f"max_staleness={self.max_staleness}"
            head += f", asynchronous ({bound})"
        variables = self.variables
        listed = largest_in_order([v.bytes_per_step or 0.0 for v in variables], limit)
        shown = [variables[i] for i in listed]
        width = max([len(v.name) for v in shown] + [8])
        lines = [head, f"  {'variable':<{width}}  {'kind':<6}  {'alpha':>8}  {'PS bytes':>10}  "
                       f"{'AR bytes':>10}  method  partitions"]

        def fmt(x):
            return format_bytes(x) if x is not None else "-"
        for v in shown:
            alpha = f"{v.alpha:.4f}" if v.alpha is not None else "-"
            lines.append(f"  {v.name:<{width}}  {v.kind.value:<6}  {alpha:>8}  {fmt(v.bytes_for(Method.PS)):>10}  "
                         f"{fmt(v.bytes_for(Method.AR)):>10}  {v.method.value:<6}  {v.partitions:>10}")
        hidden = len(variables) - len(shown)
        if hidden:
            kept = set(listed)
            rest = [v.bytes_per_step for i, v in enumerate(variables) if i not in kept and v.bytes_per_step is not None]
            moved = f", {format_bytes(sum(rest))} per machine per step in all" if rest else ""
            lines.append(f"  ... and {hidden} more variables{moved} (every one: plan.summary(limit=None), "
                         f"plan.dataframe(), or `plan --all` on the command line)")
        if self.explanations:
            lines.append("Why (AUTO, estimated step time):")
            lines.extend(f"  {line}" for line in reasons_listed(self.explanations, [v.name for v in variables],
                                                                 [v.name for v in shown]))
            if hidden:
                lines.append(f"  ... and one for each of the {hidden} variables not listed (plan.explanations)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return self.dataframe()._repr_html_()


def reasons_listed(explanations, names, listed) -> list[str]:
    """AUTO's ``explanations`` but the lines about the variables of ``names`` that are not in
    ``listed`` (a variable's line begins with its name and ": "): the reasons a view that
    lists only some variables shows, with the lines about the whole plan."""
    others = set(names) - set(listed)
    return [line for line in explanations if line.split(": ", 1)[0] not in others]


def _bad_cluster(value: Any):
    raise PlanError(f"plan's cluster must be an object or null, got {value!r}")


def make_plan(profile: Profile, cluster: ClusterSpec, architecture: "str | Architecture" = "auto",
              partitions: "int | Mapping[str, int] | None" = None,
              local_aggregation: bool | None = None, calibration=None) -> Plan:
    """Plan every variable of ``profile`` for ``cluster`` under ``architecture``.

    AR / PS: every variable that method; HYBRID: PS for sparse, AR for dense; AUTO: per
    variable, and local aggregation on or off, whatever gives the least estimated step time
    (:mod:`parallax_nb.cost.auto`), with its reasons in ``plan.explanations``.
    ``partitions``: an int for every PS variable, a mapping name -> P, or None (one partition
    per worker for PS variables). ``local_aggregation`` overrides the cluster's setting; None
    keeps it, except under AUTO, which then chooses it. ``calibration`` (a
    :class:`~parallax_nb.calibration.Calibration` of this cluster's shape) prices AUTO's
    choices; without one the defaults do. Each VariablePlan records the PS, AR and
    sparse-as-dense bytes from :func:`parallax_nb.cost.pricing.variable_costs`.
    """
    check_inputs(profile, cluster, "make_plan", hint="profile the job first, or use plan_for_kinds() without a profile")
    architecture = Architecture.parse(architecture)
    explanations: tuple[str, ...] = ()
    if architecture is Architecture.AUTO:
        from .cost.auto import choose_auto
        from .cost.pricing import pricing

        choice = choose_auto(profile, cluster, calibration, local_aggregation)
        cluster, methods, explanations = choice.cluster, choice.methods, choice.explanations
        costs = pricing(profile, cluster, calibration).costs
    else:
        if local_aggregation is not None and bool(local_aggregation) != cluster.local_aggregation:
            cluster = cluster.replace(local_aggregation=bool(local_aggregation))
        if calibration is not None:
            from .cost.timing import calibration_for
            calibration_for(cluster, calibration)   # a calibration of another shape is refused here too
        costs = variable_costs(profile, cluster)
        methods = [choose_method(var.kind, architecture) for var in profile.variables]
    resolve = partitions_resolver(profile.names, partitions, cluster)
    planned = []
    for var, cost, method in zip(profile.variables, costs, methods):
        planned.append(VariablePlan(
            name=var.name, kind=var.kind, method=method, partitions=resolve(var.name, method),
            alpha=min(max(var.alpha_mean, 0.0), 1.0), size_bytes=var.size_bytes,
            costs={key: cost.bytes_for(key) for key in RECORDED_COSTS},
        ))
    return Plan(model_name=profile.model_name, architecture=architecture, cluster=cluster,
                variables=tuple(planned), local_aggregation=cluster.local_aggregation, explanations=explanations)


def plan_for_kinds(kinds: Mapping[str, "Kind | str"], architecture: "str | Architecture",
                   cluster: ClusterSpec | None = None, partitions: "int | Mapping[str, int] | None" = 1,
                   model_name: str = "model", sync: bool = True, max_staleness: int | None = None) -> Plan:
    """A plan from variable kinds alone (no profile, so no bytes and no alpha).

    AUTO has no bytes to compare and follows HYBRID's rule (sparse -> PS, dense -> AR).
    ``partitions`` as in :func:`make_plan` (default 1: every variable whole); ``sync`` and
    ``max_staleness`` as on :class:`Plan`.
    """
    if not isinstance(kinds, Mapping) or not kinds:
        raise PlanError(f"plan_for_kinds needs a non-empty mapping name -> kind, got {kinds!r}")
    architecture = Architecture.parse(architecture)
    names = list(kinds)
    resolve = partitions_resolver(names, partitions, cluster)
    planned = []
    for name in names:
        kind = _parse_kind(name, kinds[name])
        method = choose_method(kind, architecture)
        planned.append(VariablePlan(name=name, kind=kind, method=method, partitions=resolve(name, method)))
    return Plan(model_name=model_name, architecture=architecture, cluster=cluster, variables=tuple(planned),
                local_aggregation=cluster.local_aggregation if cluster is not None else True,
                sync=sync, max_staleness=max_staleness)
