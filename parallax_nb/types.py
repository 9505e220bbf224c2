"""Value types shared by every room of parallax_nb, defined once.

Pure Python: no TensorFlow, no widgets. Units are in the names (``size_bytes``,
``bandwidth_bps`` in bits per second, ``step_time_s``). DataFrames and JSON are views of
these objects, never the source of truth.
"""
from __future__ import annotations

import enum
import math
import numbers
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .errors import ConfigError, ProfileError

PROFILE_SCHEMA_VERSION = 1
RUN_SCHEMA = "parallax_nb.run"  # a run's summary (run.json), written by the runtime, read by reports
RUN_SCHEMA_VERSION = 1
MAX_LOCAL_WORKERS = 8  # G = 1..8 workers per machine are profiled for local aggregation


class Kind(str, enum.Enum):
    """How a variable's gradient looks: ``sparse`` when it is a ``tf.IndexedSlices``."""

    DENSE = "dense"
    SPARSE = "sparse"


class Method(str, enum.Enum):
    """How one variable is synchronised: AllReduce or Parameter Server."""

    AR = "ar"
    PS = "ps"

    @property
    def partitioned(self) -> bool:
        """Whether a variable under this method is split into server partitions (PS); AR keeps it whole."""
        return self is Method.PS

    @classmethod
    def choices(cls) -> str:
        """``"'ar', 'ps'"``: the methods as a user writes them, for error hints."""
        return ", ".join(repr(m.value) for m in cls)


#: the method tables' key of a PS variable in an asynchronous plan (``Plan.sync`` False): the
#: same rows and owners as PS, pushed and pulled by each worker on its own, without a barrier
#: (``parallax_nb.runtime.async_ps``). Not a per-variable choice: a plan is async as a whole.
ASYNC_PS = "async_ps"


class Architecture(str, enum.Enum):
    """A whole-model choice of methods.

    AR: every variable AllReduce. PS: every variable on parameter servers. HYBRID: AR for
    dense variables, PS for sparse ones (Parallax's default). AUTO: per variable (and local
    aggregation on or off), whatever gives the least estimated step time
    (:mod:`parallax_nb.cost.auto`).
    """

    AR = "ar"
    PS = "ps"
    HYBRID = "hybrid"
    AUTO = "auto"

    @classmethod
    def parse(cls, value: "str | Architecture") -> "Architecture":
        if isinstance(value, Architecture):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise ConfigError(
                f"unknown architecture {value!r}",
                hint="choose one of: " + ", ".join(a.value for a in cls),
            ) from None


def _enum_value(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


#: the widths of a sparse gradient's row indices TensorFlow makes: int32 and int64 ids
INDEX_WIDTHS = (4, 8)
_PROFILE_AGAIN = "profile the job again: px.profile(job), or `python -m parallax_nb profile`"
# a profiled variable's figures and their upper bounds (the lower is 0): bytes and rows are
# finite, the fractions of rows at most 1
_FRACTION = 1.0 + 1e-9   # a mean of fractions can round a hair above 1
_PROFILED_NUMBERS = (("size_bytes", math.inf), ("rows_touched_mean", math.inf), ("alpha_mean", _FRACTION),
                     ("alpha_p50", _FRACTION), ("alpha_p95", _FRACTION), ("alpha_max", _FRACTION),
                     ("grad_bytes_per_step", math.inf))


def _number(value: Any) -> float:
    """``value`` as a finite float (a ValueError for NaN, infinities, text and booleans)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(value)
    return float(value)


def _whole(value: Any) -> int:
    """``value`` as a whole number >= 0 (a ValueError otherwise: 2.5, -1, "a", True)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value != int(value) or value < 0:
        raise ValueError(value)
    return int(value)


@dataclass(frozen=True)
class VariableProfile:
    """What one trainable variable costs, measured over k single-device steps.

    ``rows`` is the first dimension (1 for a scalar); a step touches ``rows_touched_mean``
    unique rows on average (all rows for a dense variable). ``alpha_*`` = touched rows /
    rows, summarised over the steps. ``union_rows_by_workers[G-1]`` is the mean number of
    unique rows touched by G consecutive batches evaluated at one step's state (the G workers
    of a step share it, so rows drawn from the state, like sampled candidates, count once):
    what a machine of G workers sends after local aggregation (G = 1..8). ``grad_bytes_per_step`` is what one worker's gradient
    occupies: values plus indices for a sparse variable, the whole tensor for a dense one.
    ``index_bytes`` is the width of a sparse gradient's row indices as TensorFlow made them: 4
    when the ids are int32 (a Keras ``Embedding`` fed int32 ids), 8 when int64; plain Horovod
    allgathers them at that width (parallax_nb's own exchanges send int64 ids). Profiles
    written before it was recorded read 8, as their ``grad_bytes_per_step`` was counted.
    ``lookup_shared_with`` names the sparse variable this one is looked up together with, at
    the same ids in one :func:`parallax_nb.ops.embedding_lookups` call (the sampled softmax's
    biases with its weights): with both on parameter servers the runtime serves them in one
    exchange, whose ids count once. Empty for every other variable.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    size_bytes: int
    kind: Kind
    rows_touched_mean: float
    alpha_mean: float
    alpha_p50: float
    alpha_p95: float
    alpha_max: float
    grad_bytes_per_step: float
    union_rows_by_workers: tuple[float, ...] = ()
    lookup_shared_with: str = ""
    index_bytes: int = 8

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ProfileError(f"a profiled variable's name must be a non-empty string, got {self.name!r}",
                               hint=_PROFILE_AGAIN)
        try:
            shape = tuple(_whole(d) for d in self.shape)
        except (TypeError, ValueError):
            raise self._bad("shape", self.shape, "a list of whole numbers >= 0") from None
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "lookup_shared_with", str(self.lookup_shared_with or ""))
        try:
            object.__setattr__(self, "kind", Kind(_enum_value(self.kind)))
        except ValueError:
            raise self._bad("kind", self.kind, "'dense' or 'sparse'") from None
        try:
            unions = tuple(_number(u) for u in self.union_rows_by_workers)
        except (TypeError, ValueError):
            raise self._bad("union_rows_by_workers", self.union_rows_by_workers, "a list of numbers >= 0") from None
        if any(u < 0 for u in unions):
            raise self._bad("union_rows_by_workers", list(self.union_rows_by_workers), "a list of numbers >= 0")
        object.__setattr__(self, "union_rows_by_workers", unions)
        if self.index_bytes not in INDEX_WIDTHS:   # a bool or text is not either
            raise self._bad("index_bytes", self.index_bytes, "4 (int32 row ids) or 8 (int64 row ids)")
        object.__setattr__(self, "index_bytes", int(self.index_bytes))
        # the measured fractions, read thousands of times per replan (alpha_for_workers); not a field
        rows = max(self.rows, 1)
        object.__setattr__(self, "_measured_alphas",
                           tuple(min(1.0, u / rows) for u in unions) if self.kind is Kind.SPARSE else ())
        for name, high in _PROFILED_NUMBERS:
            value = getattr(self, name)
            # checked fast: a planner's tests and benchmarks build thousands of these
            if not (type(value) in (int, float) and 0 <= value < math.inf and value <= high):
                try:
                    good = 0 <= _number(value) <= high
                except (TypeError, ValueError):
                    good = False
                if not good:
                    raise self._bad(name, value, "between 0 and 1" if high < math.inf else "a finite number >= 0")

    def _bad(self, field_name: str, value: Any, expected: str) -> ProfileError:
        """The error of a profiled figure out of its range, naming the variable and the value."""
        return ProfileError(f"variable {self.name!r}: {field_name} must be {expected}, got {value!r}",
                            hint=_PROFILE_AGAIN)

    @property
    def rows(self) -> int:
        return int(self.shape[0]) if self.shape else 1

    @property
    def row_bytes(self) -> float:
        return self.size_bytes / max(self.rows, 1)

    @property
    def is_sparse(self) -> bool:
        return self.kind is Kind.SPARSE

    def alpha_for_workers(self, workers: int) -> float:
        """Fraction of rows touched by the union of ``workers`` consecutive batches.

        Measured for 1..8 workers; beyond that the union is extrapolated as
        ``1 - (1 - alpha_1)^G`` (independent draws), capped by the measured largest union.
        """
        measured = self._measured_alphas
        if 0 < workers <= len(measured):
            return measured[workers - 1]
        if workers < 1:
            raise ConfigError(f"workers must be >= 1, got {workers}")
        if not self.is_sparse:
            return 1.0
        independent = 1.0 - (1.0 - self.alpha_mean) ** workers
        return min(1.0, max(independent, measured[-1] if measured else 0.0))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["kind"] = self.kind.value
        d["shape"] = list(self.shape)
        d["union_rows_by_workers"] = list(self.union_rows_by_workers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "VariableProfile":
        names = {f.name for f in fields(cls)}
        missing = names - {"union_rows_by_workers", "lookup_shared_with", "index_bytes"} - set(d)
        if missing:
            raise ProfileError(f"variable entry {d.get('name', '?')!r} lacks fields {sorted(missing)}")
        return cls(**{k: v for k, v in d.items() if k in names})


#: variables a profile's or a plan's text lists at most (``summary``): the largest, the rest
#: counted (a model of 1,000 variables printed 2,000 lines)
SUMMARY_ROWS = 40


def largest_in_order(sizes, limit: int | None) -> list[int]:
    """Indices of the ``limit`` largest of ``sizes``, in their own order (every index when
    ``limit`` is None or not below their number): the rows a ``summary`` lists."""
    indices = list(range(len(sizes)))
    if limit is None or len(indices) <= limit:
        return indices
    return sorted(sorted(indices, key=lambda i: -sizes[i])[:max(limit, 0)])


@dataclass(frozen=True)
class Profile:
    """The measured profile of one model on one device, one row per trainable variable."""

    model_name: str
    batch_size: int
    steps: int
    step_time_s: float
    peak_memory_bytes: int
    variables: tuple[VariableProfile, ...]
    environment: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "variables", tuple(self.variables))
        for name, whole, low in (("batch_size", True, 1), ("steps", True, 0), ("step_time_s", False, 0),
                                 ("peak_memory_bytes", True, 0)):
            value = getattr(self, name)
            try:
                read = _whole(value) if whole else _number(value)
            except (TypeError, ValueError):
                read = None
            if read is not None and read >= low:
                object.__setattr__(self, name, read)
            else:
                kind = "a whole number" if whole else "a finite number of seconds"
                raise ProfileError(f"profile {self.model_name!r}: {name} must be {kind} >= {low}, got {value!r}",
                                   hint=_PROFILE_AGAIN)
        if not self.variables:
            raise ProfileError(f"profile {self.model_name!r} lists no variables", hint=_PROFILE_AGAIN)
        other = next((v for v in self.variables if not isinstance(v, VariableProfile)), None)
        if other is not None:
            raise ProfileError(f"profile {self.model_name!r}: its variables must be VariableProfiles, "
                               f"got {type(other).__name__}", hint=_PROFILE_AGAIN)
        names = [v.name for v in self.variables]
        if len(set(names)) < len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ProfileError(f"profile {self.model_name!r} lists variable(s) {twice[:5]} more than once",
                               hint=_PROFILE_AGAIN)
        # lookup_shared_with names the first variable of a lookup, a sparse one that names none
        firsts = {v.name for v in self.variables if v.is_sparse and not v.lookup_shared_with}
        for v in self.variables:
            if v.lookup_shared_with and (not v.is_sparse or v.lookup_shared_with not in firsts):
                raise ProfileError(f"variable {v.name!r} is said to be looked up together with "
                                   f"{v.lookup_shared_with!r}, which is not another sparse variable of this profile "
                                   f"looked up first", hint="profile the job again: px.profile(job)")

    def __getitem__(self, name: str) -> VariableProfile:
        for v in self.variables:
            if v.name == name:
                return v
        raise KeyError(f"no variable {name!r} in profile of {self.model_name!r}; "
                       f"variables: {[v.name for v in self.variables]}")

    @property
    def names(self) -> list[str]:
        return [v.name for v in self.variables]

    @property
    def total_bytes(self) -> int:
        return sum(v.size_bytes for v in self.variables)

    @property
    def sparse_bytes(self) -> int:
        return sum(v.size_bytes for v in self.variables if v.is_sparse)

    def to_dict(self) -> dict:
        return {
            "schema": "parallax_nb.profile",
            "schema_version": PROFILE_SCHEMA_VERSION,
            "model_name": self.model_name,
            "batch_size": self.batch_size,
            "steps": self.steps,
            "step_time_s": self.step_time_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "environment": dict(self.environment),
            "variables": [v.to_dict() for v in self.variables],
        }

    def to_json(self, path: str | None = None) -> str:
        from .jsonfile import dump_json

        return dump_json(self.to_dict(), path)

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        from .jsonfile import check_schema
        check_schema(d, "parallax_nb.profile", PROFILE_SCHEMA_VERSION, "profile", ProfileError)
        try:
            variables = d["variables"]
            if not isinstance(variables, list) or not all(isinstance(v, dict) for v in variables):
                raise ProfileError(f"profile 'variables' must be a list of objects, got {variables!r:.80}",
                                   hint=_PROFILE_AGAIN)
            return cls(
                model_name=str(d["model_name"]),
                batch_size=d["batch_size"],
                steps=d["steps"],
                step_time_s=d["step_time_s"],
                peak_memory_bytes=d["peak_memory_bytes"],
                variables=tuple(VariableProfile.from_dict(v) for v in variables),
                environment=dict(d.get("environment") or {}),
            )
        except KeyError as e:
            raise ProfileError(f"profile lacks field {e.args[0]!r}") from None

    @classmethod
    def from_json(cls, path_or_text: str) -> "Profile":
        """The profile in a file (or JSON text); a figure out of range is named with the file."""
        from .jsonfile import load_json
        d = load_json(path_or_text, what="profile")
        try:
            return cls.from_dict(d)
        except ProfileError as e:
            if str(path_or_text).lstrip().startswith("{"):   # text, not a file
                raise
            raise ProfileError(f"{path_or_text}: {e.message}", hint=e.hint) from None

    def dataframe(self):
        """One row per variable: name, kind, shape, size, alpha statistics, gradient bytes."""
        import pandas as pd

        rows = []
        for v in self.variables:
            rows.append({
                "name": v.name, "kind": v.kind.value, "shape": "x".join(map(str, v.shape)) or "scalar",
                "dtype": v.dtype, "size_bytes": v.size_bytes, "rows": v.rows,
                "rows_touched": v.rows_touched_mean, "alpha_mean": v.alpha_mean,
                "alpha_p50": v.alpha_p50, "alpha_p95": v.alpha_p95, "alpha_max": v.alpha_max,
                "grad_bytes_per_step": v.grad_bytes_per_step,
            })
        return pd.DataFrame(rows).set_index("name")

    def summary(self, limit: int | None = SUMMARY_ROWS) -> str:
        """The profile as text: a head line and a row per variable. A model of more than
        ``limit`` variables lists its ``limit`` largest (in model order) and counts the rest;
        ``None`` lists every one (``profile.dataframe()`` holds them all too)."""
        n_sparse = sum(v.is_sparse for v in self.variables)
        lines = [
            f"Profile of {self.model_name}: {len(self.variables)} variables "
            f"({n_sparse} sparse), {format_bytes(self.total_bytes)} "
            f"({100 * self.sparse_bytes / max(self.total_bytes, 1):.1f}% sparse), "
            f"batch {self.batch_size}, {self.steps} steps, "
            f"step {self.step_time_s * 1e3:.1f} ms, peak memory {format_bytes(self.peak_memory_bytes)}",
        ]
        variables = self.variables
        listed = largest_in_order([v.size_bytes for v in variables], limit)
        shown = [variables[i] for i in listed]
        width = max((len(v.name) for v in shown), default=4)
        lines.append(f"  {'variable':<{width}}  {'kind':<6}  {'size':>10}  {'alpha':>8}")
        for v in shown:
            lines.append(f"  {v.name:<{width}}  {v.kind.value:<6}  {format_bytes(v.size_bytes):>10}  "
                         f"{v.alpha_mean:>8.4f}")
        hidden = len(variables) - len(shown)
        if hidden:
            kept = set(listed)
            rest = sum(v.size_bytes for i, v in enumerate(variables) if i not in kept)
            lines.append(f"  ... and {hidden} more variables, {format_bytes(rest)} in all (every one: "
                         f"profile.summary(limit=None), profile.dataframe(), or `profile --all` on the command line)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return self.dataframe()._repr_html_()


_BANDWIDTH = re.compile(
    r"^\s*(?P<num>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?P<prefix>[kKmMgGtT]?)(?P<unit>bit/s|bps|b/s|B/s|Bps)\s*$"
)
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_bandwidth(value: "str | float | int") -> float:
    """Bandwidth in bits per second from ``"10Gbit/s"``, ``"100 Gbps"``, ``"1.25GB/s"`` or a number.

    Prefixes are decimal (k=1e3 ... T=1e12); ``bit/s``, ``bps`` and ``b/s`` are bits,
    ``B/s`` and ``Bps`` are bytes (x8). A bare number is bits per second.
    """
    if isinstance(value, bool):
        raise ConfigError(f"unparsable bandwidth {value!r}", hint='write it like "10Gbit/s" or "1.25GB/s"')
    if isinstance(value, (int, float)):
        bps = float(value)
    else:
        m = _BANDWIDTH.match(str(value))
        if not m:
            raise ConfigError(f"unparsable bandwidth {value!r}",
                              hint='write it like "10Gbit/s", "100Gbps" or "1.25GB/s"')
        bps = float(m["num"]) * _PREFIX[m["prefix"].lower()] * (8.0 if m["unit"] in ("B/s", "Bps") else 1.0)
    if not math.isfinite(bps) or bps <= 0:
        raise ConfigError(f"bandwidth must be positive and finite, got {value!r}")
    return bps


def format_bandwidth(bps: float) -> str:
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g}{prefix}bit/s"
    return f"{bps:g}bit/s"


def format_bytes(n: float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@dataclass(frozen=True)
class ClusterSpec:
    """The cluster a plan is for.

    ``machines`` hosts with ``workers_per_machine`` workers (one per GPU) each, joined by
    links of ``bandwidth_bps`` bits per second with ``latency_s`` seconds per message.
    ``local_aggregation`` combines the gradients of a machine's workers before anything
    crosses machines (Parallax's local aggregation).
    """

    machines: int
    workers_per_machine: int = 1
    bandwidth_bps: float = 10e9
    latency_s: float = 25e-6
    local_aggregation: bool = True

    def __post_init__(self):
        for name in ("machines", "workers_per_machine"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"ClusterSpec.{name} must be a whole number >= 1, got {value!r}",
                                  hint="a cluster has at least one machine with one worker")
        object.__setattr__(self, "bandwidth_bps", parse_bandwidth(self.bandwidth_bps))
        if not (isinstance(self.latency_s, (int, float)) and math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ConfigError(f"ClusterSpec.latency_s must be a finite number >= 0, got {self.latency_s!r}")

    @classmethod
    def create(cls, machines: int, workers_per_machine: int = 1, bandwidth: "str | float" = "10Gbit/s",
               latency_s: float = 25e-6, local_aggregation: bool = True) -> "ClusterSpec":
        """Build a spec with a bandwidth written with units (``"10Gbit/s"``)."""
        return cls(machines, workers_per_machine, parse_bandwidth(bandwidth), latency_s, local_aggregation)

    @property
    def workers(self) -> int:
        return self.machines * self.workers_per_machine

    @property
    def bandwidth(self) -> str:
        return format_bandwidth(self.bandwidth_bps)

    def replace(self, **changes) -> "ClusterSpec":
        if "bandwidth" in changes:
            changes["bandwidth_bps"] = parse_bandwidth(changes.pop("bandwidth"))
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return ClusterSpec(**values)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ClusterSpec":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ConfigError(f"unknown cluster spec fields {sorted(unknown)}; known: {sorted(names)}")
        return cls(**d)

    def __str__(self) -> str:
        return (f"{self.machines} machine(s) x {self.workers_per_machine} worker(s), "
                f"{self.bandwidth}, latency {self.latency_s * 1e6:g} us, "
                f"local aggregation {'on' if self.local_aggregation else 'off'}")


def partitions_served(planned: int, rows: int) -> int:
    """The partitions a PS variable of ``rows`` rows is served in when ``planned`` are asked
    for: at most one per row, at least one (the runtime's count, and the cost model's)."""
    return max(1, min(int(planned), rows))


def row_owners(partitions: int, ranks: int):
    """Which rank owns each row id of a PS variable split into ``partitions`` partitions over
    ``ranks`` ranks, as a key: two variables' keys are equal exactly when every row id has the
    same owner in both (the runtime then serves lookups of both at one ids tensor in one
    exchange, and the cost model prices them so).

    Row ``i`` lies in partition ``i mod P``, owned by rank ``(i mod P) mod N``: that is
    ``i mod N`` whenever N divides P, and for any other P it differs from every other
    count's owners at some id below ``max(P, P')``."""
    return ranks if partitions % ranks == 0 else ("partitions", partitions)


# ---------------------------------------------------------------------------------------------
# Cost value types (computed by parallax_nb.cost; appended by the cost-model owner).
#
# Every byte figure is bytes sent + received by one machine's network link in one training
# step (summed over both directions), as a real-valued expectation (not rounded).
# ---------------------------------------------------------------------------------------------

SPARSE_AS_DENSE = "sparse_as_dense"  # the key of plain Horovod with sparse_as_dense=True in comparisons
PLAIN_HOROVOD = "horovod"  # the key of plain Horovod's defaults (sparse gradients allgathered with duplicates)
TF_PS = "tf_ps"  # the key of TensorFlow's parameter servers: every worker pushes and pulls on its own
BASELINE_KEYS = (SPARSE_AS_DENSE, PLAIN_HOROVOD, TF_PS)


@dataclass(frozen=True)
class MethodCost:
    """One variable's cost under one method (or baseline) on one ClusterSpec, per step.

    ``bytes_per_step`` is what one machine's link sends plus receives, ``index_bytes_per_step``
    the int64 row indices among them; ``messages_per_step`` the sequential message rounds of
    the variable's own collective(s) (:mod:`parallax_nb.cost.model`); ``collectives`` the calls
    the runtime issues; ``fused_allreduce`` marks a dense allreduce that Horovod fuses with the
    step's other dense allreduces into one call (its rounds are then counted once per step).
    ``grouped`` names the calls of a grouped exchange that carries this variable's bytes with
    those of every variable of the step whose cost names the same ``group`` (the runtime sends
    them as rows of one table): those calls and their rounds are counted once per step, and
    this cost's own ``collectives`` list them with count 0 and its handed bytes.
    ``fused_allgather`` marks plain Horovod's allgathers of a sparse gradient, which leave the
    backward pass with the step's others and which Horovod fuses into one call per dtype
    (values, indices): :mod:`parallax_nb.cost.timing` prices those calls.
    """

    bytes_per_step: float
    index_bytes_per_step: float
    messages_per_step: int
    collectives: tuple[Collective, ...] = ()
    fused_allreduce: bool = False
    group: str = ""
    grouped: tuple[Collective, ...] = ()
    fused_allgather: bool = False


def method_key(method: Any) -> str:
    """``"ps"``, ``"ar"`` or a baseline key from a Method or its text."""
    return str(_enum_value(method)).lower()


@dataclass(frozen=True)
class VariableCost:
    """What one variable costs per machine per step under each method, on one ClusterSpec.

    ``participants`` take part in each collective (machines with local aggregation, every
    worker without); ``participants_per_machine`` of them share one machine's link. ``alpha``
    is the fraction of rows one participant sends (the union of a machine's G workers with
    local aggregation, one worker's otherwise; 1 for a dense variable). ``methods`` maps every
    ``Method.value`` and every baseline key (:data:`BASELINE_KEYS`) to its :class:`MethodCost`,
    from the table :data:`parallax_nb.cost.methods.METHOD_COSTS` and its ``BASELINES``.
    """

    name: str
    kind: Kind
    size_bytes: int
    rows: int
    alpha: float
    participants: int
    participants_per_machine: int
    methods: dict = field(default_factory=dict, hash=False)

    @property
    def cheaper_method(self) -> Method:
        """The method that moves strictly fewer bytes; ties (also: nothing moves) go to the first
        in :class:`Method`'s order (AR)."""
        best = next(iter(Method))
        for method in Method:
            low, here = self.bytes_for(best), self.bytes_for(method)
            if here < low and not math.isclose(here, low, rel_tol=1e-12, abs_tol=1e-9):
                best = method
        return best

    def cost_of(self, method: "Method | str") -> MethodCost:
        try:
            return self.methods[method]   # a Method is a str enum: it finds its value's entry
        except KeyError:
            return self.methods[method_key(method)]

    def bytes_for(self, method: "Method | str") -> float:
        return self.cost_of(method).bytes_per_step

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "methods"}
        d["kind"] = self.kind.value
        for key, cost in self.methods.items():
            d[f"{key}_bytes_per_step"] = cost.bytes_per_step
            d[f"{key}_index_bytes_per_step"] = cost.index_bytes_per_step
            d[f"{key}_messages_per_step"] = cost.messages_per_step
        return d


@dataclass(frozen=True)
class Estimate:
    """Estimated cost of one whole-model choice of methods on one ClusterSpec.

    ``architecture`` is ``"ar" | "ps" | "hybrid" | "auto"`` or a baseline key
    (:data:`BASELINE_KEYS`). ``method_bytes_per_machine_per_step`` splits the bytes by the
    method charged (``Method.value`` keys; a baseline charges everything to its own key).
    ``comm_time_s = transfer_time_s + latency_time_s``, summed over the
    ``collective_calls_per_step`` calls the runtime issues: each call costs its calibrated
    ``latency_s`` (``latency_time_s``) plus the bytes one rank hands to it over the fit's
    bandwidth (``transfer_time_s``), see :mod:`parallax_nb.cost.timing`.
    ``messages_per_step`` are the message rounds of the byte model (descriptive).
    ``step_time_s = compute_time_s + comm_time_s`` (no overlap of compute and
    communication); ``compute_time_s`` is the calibration's measured compute of this model
    under the real placement, else the profile's single-device step time. ``calibration``
    says which figures priced the calls (``"uncalibrated (defaults)"`` without a measurement).
    ``link`` is what a machine's link carries per step as its counters count it
    (:func:`parallax_nb.cost.link.predict_link_bytes`: the model's bytes with TCP/IP framing,
    plus Horovod's own coordination, the calibration's rate with every rank computing times
    ``step_time_s``; 0
    uncalibrated or on one machine), kept apart from the model's ``bytes_per_machine_per_step``.
    ``link_floor_s``: the seconds the step's bytes need across a machine's link at the pace
    the calibration read it to sustain (0 without one); ``comm_time_s`` is never below it
    (:attr:`link_bound` when it sets it).
    ``examples_per_s = workers * batch_size / step_time_s``. ``speedup_vs_ar`` /
    ``speedup_vs_ps`` = step time of all-AR / all-PS divided by this step time (> 1: this
    choice is faster). ``variables`` and ``methods`` are aligned: each variable's costs and
    the method this estimate charged it. ``explanations``: AUTO's reasons, one line per
    decision (local aggregation, then each variable), empty for other choices.
    """

    architecture: str
    cluster: ClusterSpec
    bytes_per_machine_per_step: float
    index_bytes_per_machine_per_step: float
    method_bytes_per_machine_per_step: dict = field(hash=False)
    sparse_bytes_per_machine_per_step: float
    dense_bytes_per_machine_per_step: float
    messages_per_step: int
    compute_time_s: float
    transfer_time_s: float
    latency_time_s: float
    comm_time_s: float
    step_time_s: float
    examples_per_s: float
    speedup_vs_ar: float | None = None
    speedup_vs_ps: float | None = None
    variables: tuple[VariableCost, ...] = field(default=(), repr=False)
    methods: tuple[Method, ...] = field(default=(), repr=False)
    calibration: str = "uncalibrated (defaults)"
    collective_calls_per_step: int = 0
    link: LinkBytes | None = field(default=None, repr=False)
    explanations: tuple[str, ...] = field(default=(), repr=False)
    link_floor_s: float = 0.0

    @property
    def link_bound(self) -> bool:
        """The step's communication is the time its bytes need at the pace the calibration read
        its link to sustain (``link_floor_s``), not its calls' time (:func:`parallax_nb.cost.timing.link_floor_s`)."""
        return self.link_floor_s > 0 and self.comm_time_s <= self.link_floor_s

    @property
    def link_bytes_per_machine_per_step(self) -> float:
        """What a machine's link carries per step (``link``; the model's bytes without one)."""
        return self.link.total_bytes if self.link is not None else self.bytes_per_machine_per_step

    @property
    def coordination_bytes_per_machine_per_step(self) -> float:
        """Horovod's coordination among ``link``'s bytes (0 without one)."""
        return self.link.coordination_bytes if self.link is not None else 0.0

    def bytes_by_variable(self) -> dict[str, float]:
        """Variable name -> bytes per machine per step under the method this estimate charged."""
        baseline = self.architecture if self.architecture in BASELINE_KEYS else None
        return {c.name: c.bytes_for(baseline or m) for c, m in zip(self.variables, self.methods)}

    def to_dict(self, include_variables: bool = False) -> dict:
        skip = ("variables", "methods", "method_bytes_per_machine_per_step", "explanations", "link")
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        d["explanations"] = list(self.explanations)
        d["coordination_bytes_per_machine_per_step"] = self.coordination_bytes_per_machine_per_step
        d["link_bytes_per_machine_per_step"] = self.link_bytes_per_machine_per_step
        d.update({f"{key}_bytes_per_machine_per_step": moved
                  for key, moved in self.method_bytes_per_machine_per_step.items()})
        d["cluster"] = self.cluster.to_dict()
        if include_variables:
            d["variables"] = [dict(c.to_dict(), method=m.value) for c, m in zip(self.variables, self.methods)]
        return d

    def summary(self) -> str:
        text = (f"{self.architecture}: {format_bytes(self.bytes_per_machine_per_step)}/machine/step, "
                f"{self.messages_per_step} messages, communication {self.comm_time_s * 1e3:.3f} ms, "
                f"step {self.step_time_s * 1e3:.3f} ms, {self.examples_per_s:.1f} examples/s ({self.calibration})")
        if self.speedup_vs_ar is not None and self.speedup_vs_ps is not None:
            text += f", {self.speedup_vs_ar:.2f}x vs AR, {self.speedup_vs_ps:.2f}x vs PS"
        return text


@dataclass(frozen=True)
class Collective:
    """One kind of collective a method issues per step: ``count`` calls of ``op`` among
    ``participants`` ("all" ranks, one "machine"'s ranks, or "cross": one local index
    on every machine).

    ``handed_bytes`` is what **one rank hands to these ``count`` calls together** (the tensor
    of an allreduce, the rank's own slice of an allgather, the whole tensor a rank gives an
    alltoall, its own part included), an expectation over steps; 0 where unknown (the
    runtime's own listing names calls, not sizes). It is left out of equality, so the cost
    side's listing and the runtime's compare by calls. A calibration turns it into time:
    ``count * latency_s + handed_bytes / (bandwidth_bps / 8)`` (:meth:`time_s`).
    """

    op: str
    count: int
    participants: str = "all"
    handed_bytes: float = field(default=0.0, compare=False)

    def time_s(self, fit) -> float:
        """Seconds of these calls under ``fit`` (a :class:`~parallax_nb.calibration.CollectiveFit`)."""
        return self.count * fit.latency_s + self.handed_bytes * 8.0 / fit.bandwidth_bps


@dataclass(frozen=True)
class LinkBytes:
    """What one machine's network link carries per step, as its kernel counters count it
    (received + sent): the cost model's ``payload_bytes``, the TCP/IP and Ethernet headers of
    its segments and their ACKs (``framing_bytes``), what the step's collective calls carry
    besides their payload (``call_bytes``: measured per call by a calibration, 0 without one;
    ``calls``: ``(("op/scope", calls per step), ...)``, every call a rank issues) and
    Horovod's coordination traffic during the step (``coordination_bytes``).
    ``total_bytes`` is their sum; ``coordination`` says where the figures came from
    ("uncalibrated: ..." without a measurement). ``payload_calls``: ``(("op/scope", payload
    bytes), ...)``, the payload by the calls that carry it across machines, each framed at its
    own measured factor when calibrated."""

    payload_bytes: float
    framing_bytes: float
    coordination_bytes: float
    step_time_s: float
    coordination: str
    call_bytes: float = 0.0
    calls: tuple = ()
    payload_calls: tuple = ()

    @property
    def call_count(self) -> int:
        """Collective calls a rank issues per step."""
        return sum(n for _, n in self.calls)

    @property
    def total_bytes(self) -> float:
        return self.payload_bytes + self.framing_bytes + self.call_bytes + self.coordination_bytes

    def to_dict(self) -> dict:
        return {"payload_bytes": self.payload_bytes, "framing_bytes": self.framing_bytes,
                "call_bytes": self.call_bytes, "calls": dict(self.calls), "payload_calls": dict(self.payload_calls),
                "coordination_bytes": self.coordination_bytes, "total_bytes": self.total_bytes,
                "step_time_s": self.step_time_s, "coordination": self.coordination}


@dataclass(frozen=True)
class StepTimeCheck:
    """A run's step time against the estimate of what it executed.

    ``predicted_step_time_s``: :func:`parallax_nb.cost.estimate_executed` for the run's
    topology; ``measured_step_time_s``: the run's median step time over ``measured_steps``
    (e.g. "steps 2-30": the first step, which traces and allocates, is left out);
    ``error_pct = 100 * (measured - predicted) / predicted``; ``basis`` says how the
    prediction was made (calibrated or not, on which cluster), or, with
    ``predicted_step_time_s`` None, why there is none (e.g. a calibration of another cluster
    shape), so the measurement is still shown and the missing prediction is explained;
    ``warning`` why the comparison is not like for like ("" when it is: e.g. a calibration
    taken under another Horovod cycle time than the run's)."""

    predicted_step_time_s: float | None
    measured_step_time_s: float
    measured_steps: str
    basis: str
    warning: str = ""

    @property
    def error_pct(self) -> float | None:
        if not self.predicted_step_time_s or self.measured_step_time_s is None:
            return None
        return 100.0 * (self.measured_step_time_s - self.predicted_step_time_s) / self.predicted_step_time_s

    def line(self) -> str:
        """``step time: predicted 120.0 ms, measured 131.5 ms (median of steps 2-30), +9.6 %``"""
        pct = self.error_pct
        if self.predicted_step_time_s is None:
            return (f"step time: measured {self.measured_step_time_s * 1e3:.1f} ms (median of {self.measured_steps}); "
                    f"{self.basis}")
        return (f"step time: predicted {self.predicted_step_time_s * 1e3:.1f} ms, measured "
                f"{self.measured_step_time_s * 1e3:.1f} ms (median of {self.measured_steps}), "
                + ("error n/a" if pct is None else f"{pct:+.1f} %") + f" [{self.basis}]"
                + (f" WARNING: {self.warning}" if self.warning else ""))

    def to_dict(self) -> dict:
        return {"predicted_step_time_s": self.predicted_step_time_s, "measured_step_time_s": self.measured_step_time_s,
                "measured_steps": self.measured_steps, "error_pct": self.error_pct, "basis": self.basis,
                "warning": self.warning}
