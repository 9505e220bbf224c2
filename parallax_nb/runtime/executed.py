"""The runtime's record of what it ran: an :class:`~parallax_nb.executed.ExecutedPlan` made
from the plan it was given and the per-variable table it built (``Trainer.variable_table()``),
with the reason for every difference. No TensorFlow here: the table and the topology are
plain values, so the reasons are testable and the same on every rank.
"""
from __future__ import annotations

from ..executed import ExecutedPlan, ExecutedVariable, PlanChange
from ..types import Kind, Method
from .topology import Topology

UNROUTED = ("its rows are read outside the routed lookup (not a Keras Embedding or parallax_nb.ops lookup), "
            "so the servers cannot serve rows: served whole, as a dense PS variable")
CAPPED = "a variable has at most one partition per row"
SEARCHED = "the run's partition count for every PS variable (partition search or --partitions)"


def _partitions_reason(wanted: int, executed: int) -> str:
    """Why a PS variable has ``executed`` partitions where ``wanted`` were asked for."""
    if executed < wanted:
        return CAPPED
    return SEARCHED


def executed_plan(plan, table: dict, topology: Topology, local_aggregation: bool,
                  partitions: int | None = None) -> ExecutedPlan:
    """``table``: name -> ``{"method", "kind", "partitions"}`` as built; ``partitions``: the
    count the caller set for every PS variable (None: the plan's own)."""
    variables, changes = [], []
    for name, info in table.items():
        ran = ExecutedVariable(name=name, method=Method(info["method"]), kind=Kind(info["kind"]),
                               partitions=int(info["partitions"]))
        variables.append(ran)
        asked = plan[name]
        if ran.method is not asked.method:
            reason = UNROUTED if asked.kind is Kind.SPARSE and asked.method is Method.PS else "the runtime's choice"
            changes.append(PlanChange("method", asked.method.value, ran.method.value, reason, name))
        if ran.kind is not asked.kind:
            changes.append(PlanChange("kind", asked.kind.value, ran.kind.value, UNROUTED, name))
        if ran.method.partitioned and ran.partitions != asked.partitions:
            reason = _partitions_reason(partitions or asked.partitions, ran.partitions)
            changes.append(PlanChange("partitions", asked.partitions, ran.partitions, reason, name))
    if plan.local_aggregation and not local_aggregation and topology.workers_per_machine > 1:
        # with one rank per machine there is nothing to aggregate: on or off runs the same
        changes.append(PlanChange("local_aggregation", True, False,
                                  f"machines hold unequal blocks of ranks ({topology.describe()})"))
    return ExecutedPlan(architecture=plan.architecture.value, ranks=topology.ranks, machines=topology.machines,
                        workers_per_machine=topology.workers_per_machine, local_aggregation=bool(local_aggregation),
                        variables=tuple(variables), changes=tuple(changes),
                        sync=bool(getattr(plan, "sync", True)), max_staleness=getattr(plan, "max_staleness", None))
