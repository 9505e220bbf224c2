"""Choosing a method and a partition count per variable (the decisions behind a Plan).

* AR: every variable AllReduce. PS: every variable on the parameter servers.
* HYBRID: PS for sparse variables, AR for dense ones (Parallax's default).
* AUTO: the least estimated step time, per variable and for local aggregation, with a reason
  for each decision: :func:`parallax_nb.cost.auto.choose_auto` (``make_plan`` calls it).
  :func:`choose_method` alone has no step times: given a :class:`VariableCost` it takes the
  method moving fewer bytes (ties to AR), and without one (a plan from variable kinds alone)
  HYBRID's rule.

Partitions: a PS variable is split into P partitions, each owned by one rank. Unless told
otherwise a PS variable gets one partition per worker (``cluster.workers``), so every rank
owns a shard; an AR variable is never split (1).
"""
from __future__ import annotations

from typing import Mapping

from ..errors import PlanError
from ..types import Architecture, ClusterSpec, Kind, Method, VariableCost


def choose_method(kind: Kind, architecture: Architecture, cost: VariableCost | None = None) -> Method:
    """The method of one variable under ``architecture`` (``cost`` is needed for AUTO)."""
    if architecture is Architecture.AR:
        return Method.AR
    if architecture is Architecture.PS:
        return Method.PS
    if architecture is Architecture.AUTO and cost is not None:
        return cost.cheaper_method
    return Method.PS if kind is Kind.SPARSE else Method.AR


def default_partitions(cluster: ClusterSpec | None) -> int:
    """Partitions of a PS variable when the user gives none: one per worker (1 without a cluster)."""
    return cluster.workers if cluster is not None else 1


def check_partitions(name: str, value) -> int:
    """A partition count as an int >= 1, or a PlanError naming the variable and the value."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise PlanError(f"partitions of {name!r} must be a whole number >= 1, got {value!r}",
                            hint="1 keeps the variable whole; P > 1 splits it across P servers")
    if value < 1:
        raise PlanError(f"partitions of {name!r} must be >= 1, got {value}",
                        hint="1 keeps the variable whole; P > 1 splits it across P servers")
    return value


def partitions_resolver(names: list[str], partitions: "int | Mapping[str, int] | None",
                        cluster: ClusterSpec | None):
    """``(name, method) -> partitions`` for a new plan.

    ``partitions`` may be an int (every PS variable), a mapping name -> P (those variables,
    kept as given whatever their method; others get the default) or None (the default:
    :func:`default_partitions` for PS variables, 1 for AR ones). Unknown names raise PlanError.
    """
    fallback = default_partitions(cluster)
    if partitions is None or isinstance(partitions, Mapping):
        explicit = {}
        if partitions:
            unknown = sorted(set(partitions) - set(names))
            if unknown:
                raise PlanError(f"partitions given for unknown variable(s) {unknown}",
                                hint=f"variables of this model: {names}")
            explicit = {k: check_partitions(k, v) for k, v in partitions.items()}

        def resolve(name: str, method: Method) -> int:
            if name in explicit:
                return explicit[name]
            return fallback if method.partitioned else 1
        return resolve
    every = check_partitions("every PS variable", partitions)
    return lambda name, method: every if method.partitioned else 1
