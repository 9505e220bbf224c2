"""The pure-Python cost model: bytes per machine per step for PS, AR and sparse-as-dense AR,
step-time estimates, and the per-variable choices behind a Plan. No TensorFlow is imported.

* :func:`variable_cost` — one variable on one ClusterSpec (formulas in :mod:`.model`)
* :func:`estimate` — a Plan's bytes, communication and step time (:mod:`.estimate`)
* :func:`compare_architectures` — AR, PS, HYBRID, AUTO and :data:`SPARSE_AS_DENSE`
* :func:`step_time_curve` / :func:`step_time_curves` — step time against the machine count
"""
from ..types import SPARSE_AS_DENSE, Estimate, VariableCost
from .estimate import (WHOLE_MODEL, compare_architectures, estimate, step_time_curve, step_time_curves,
                       variable_costs)
from .model import INDEX_BYTES, variable_cost
from .planner import choose_method, default_partitions

__all__ = ["INDEX_BYTES", "SPARSE_AS_DENSE", "WHOLE_MODEL", "Estimate", "VariableCost", "choose_method",
           "compare_architectures", "default_partitions", "estimate", "step_time_curve", "step_time_curves",
           "variable_cost", "variable_costs"]
