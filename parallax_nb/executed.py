"""ExecutedPlan: what the ranks really ran, and every way it differs from the plan they were given.

The runtime may not run a plan exactly as asked, for reasons only the ranks know: a sparse
variable planned PS whose rows are read outside the routed lookup is served whole (a dense PS
variable); a variable gets at most one partition per row; machines holding unequal
blocks of ranks run without local aggregation. The runtime records the outcome once, as this
frozen value (``run.json`` key ``"executed_plan"``); the CLI, the run view and the report show
its changes and the report predicts bytes for what ran, never for a plan rebuilt from the run.

Pure Python, JSON round-trip (``to_dict`` / ``from_dict``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .jsonfile import reading_fields
from .types import Kind, Method


@dataclass(frozen=True)
class ExecutedVariable:
    """One variable as run: its method, the kind it was served as, and its partitions (1 for AR)."""

    name: str
    method: Method
    kind: Kind
    partitions: int = 1

    def to_dict(self) -> dict:
        return {"name": self.name, "method": self.method.value, "kind": self.kind.value,
                "partitions": self.partitions}


@dataclass(frozen=True)
class PlanChange:
    """One difference between the plan and the run: ``what`` (``"kind"``, ``"method"``,
    ``"partitions"`` or ``"local_aggregation"``) went from ``requested`` to ``executed`` for
    ``variable`` (None: the whole run), because of ``reason``."""

    what: str
    requested: Any
    executed: Any
    reason: str
    variable: str | None = None

    def describe(self) -> str:
        where = f"{self.variable}: " if self.variable is not None else ""
        return f"{where}{self.what.replace('_', ' ')} {_show(self.requested)} -> {_show(self.executed)} ({self.reason})"

    def to_dict(self) -> dict:
        return {"variable": self.variable, "what": self.what, "requested": self.requested,
                "executed": self.executed, "reason": self.reason}


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


@dataclass(frozen=True)
class ExecutedPlan:
    """The plan the ranks ran: per variable (:class:`ExecutedVariable`), the topology
    (``ranks`` on ``machines``, at most ``workers_per_machine`` on one), whether local
    aggregation ran, the ``changes`` from the requested plan, each with its reason, and whether
    the PS variables trained synchronously (``sync``) or asynchronously with the stale-synchronous
    bound ``max_staleness`` (None: unbounded). JSON without ``sync`` (older runs) reads as
    synchronous."""

    architecture: str
    ranks: int
    machines: int
    workers_per_machine: int
    local_aggregation: bool
    variables: tuple[ExecutedVariable, ...]
    changes: tuple[PlanChange, ...] = ()
    sync: bool = True
    max_staleness: int | None = None

    def describe_sync(self) -> str:
        """``"synchronous"`` or ``"asynchronous, max staleness k"`` (``"..., unbounded staleness"``)."""
        from .staleness import describe_sync

        return describe_sync(self.sync, self.max_staleness)

    def __getitem__(self, name: str) -> ExecutedVariable:
        for v in self.variables:
            if v.name == name:
                return v
        raise KeyError(f"no variable {name!r} in the executed plan; variables: {[v.name for v in self.variables]}")

    def __contains__(self, name: object) -> bool:
        return any(v.name == name for v in self.variables)

    def change_lines(self) -> list[str]:
        """One sentence per change, for the CLI, the run view and the report."""
        return [c.describe() for c in self.changes]

    def to_dict(self) -> dict:
        return {"architecture": self.architecture, "ranks": self.ranks, "machines": self.machines,
                "workers_per_machine": self.workers_per_machine, "local_aggregation": self.local_aggregation,
                "variables": [v.to_dict() for v in self.variables], "changes": [c.to_dict() for c in self.changes],
                "sync": self.sync, "max_staleness": self.max_staleness}

    @classmethod
    def from_dict(cls, d: Any, source: str = "executed plan") -> "ExecutedPlan":
        """Validate and build; a ConfigError names the field that is wrong."""
        if not isinstance(d, dict):
            raise ConfigError(f"{source} must be a mapping, got {type(d).__name__}")
        with reading_fields(source):
            variables = tuple(ExecutedVariable(name=str(v["name"]), method=Method(v["method"]), kind=Kind(v["kind"]),
                                               partitions=int(v.get("partitions", 1))) for v in d["variables"])
            changes = tuple(PlanChange(what=str(c["what"]), requested=c["requested"], executed=c["executed"],
                                       reason=str(c["reason"]), variable=c.get("variable"))
                            for c in d.get("changes", ()))
            sync, k = d.get("sync", True), d.get("max_staleness")
            if not isinstance(sync, bool):
                raise ValueError(f"'sync' must be true or false, got {sync!r}")
            if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
                raise ValueError(f"'max_staleness' must be null or a whole number >= 0, got {k!r}")
            return cls(architecture=str(d["architecture"]), ranks=int(d["ranks"]), machines=int(d["machines"]),
                       workers_per_machine=int(d["workers_per_machine"]),
                       local_aggregation=bool(d["local_aggregation"]), variables=variables, changes=changes,
                       sync=sync, max_staleness=k)
