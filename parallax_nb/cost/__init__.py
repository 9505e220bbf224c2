"""The pure-Python cost model: bytes per machine per step for every method and baseline,
step-time estimates, and the per-variable choices behind a Plan. No TensorFlow is imported.

* :data:`METHOD_COSTS` / :data:`BASELINES` — one cost entry per ``(Method, Kind)`` and per
  baseline (:mod:`.methods`; formulas in :mod:`.model`)
* :func:`variable_cost` — one variable on one ClusterSpec, every method and baseline
* :func:`estimate` — a Plan's bytes, communication and step time (:mod:`.estimate`);
  :func:`estimate_executed` — the same for what a run executed
* :func:`compare_architectures` — AR, PS, HYBRID, AUTO and :data:`SPARSE_AS_DENSE`
  (and :data:`PLAIN_HOROVOD` on request)
* :func:`step_time_curve` / :func:`step_time_curves` — step time against the machine count
* :data:`ASSUMPTIONS` — the model's assumptions in words, for reports
"""
from ..types import PLAIN_HOROVOD, SPARSE_AS_DENSE, TF_PS, Estimate, MethodCost, VariableCost
from .estimate import (WHOLE_MODEL, compare_architectures, estimate, estimate_executed, step_time_curve,
                       step_time_curves, variable_costs)
from .choice import choose_method, default_partitions
from .methods import BASELINES, METHOD_COSTS, variable_cost
from .model import INDEX_BYTES

ASSUMPTIONS = (
    "Every byte figure is what one machine's network link sends plus receives in one step, an expectation "
    "over the profiled steps; traffic inside a machine (shared memory, PCIe, NVLink) is free.",
    "Step time = profiled single-device compute time + communication time, with no overlap; communication "
    "time = bytes / (bandwidth / 8) + message rounds x latency. Compute time does not change with N.",
    "Dense AllReduce is a ring (reduce-scatter, then allgather): 4·m·(n−1)/n bytes per participant for a "
    "variable of m bytes among n participants.",
    "AllReduce of a sparse gradient (parallax_nb AR) sums duplicate rows, then allgathers values and int64 "
    "indices: 2·α·m·(n−1) + 2·8·α·R·(n−1) bytes (R rows, α = fraction of rows a participant sends).",
    "Parameter server: every participant owns an even share of the rows; pull rows, push their gradients, "
    "serve the own shard: 4·α·m·(n−1)/n bytes, plus ids sent once to the owners 2·8·α·R·(n−1)/n "
    "(α = 1 and no ids for a dense variable).",
    "Sparse-as-dense AR densifies a sparse gradient and ring-allreduces it: 4·m·(n−1)/n bytes. Plain "
    "Horovod's default allgathers the IndexedSlices with duplicate rows (the profiled gradient bytes). "
    "TensorFlow's parameter servers (the TF-PS baseline) are PS with every worker pushing and pulling on its "
    "own (no local aggregation).",
    "Local aggregation (when on): a machine's G workers combine gradients first, so one participant per "
    "machine crosses the network and a sparse variable sends the measured union of its workers' rows "
    "(not G·α). When off, every worker is a participant with its own α. Dense AllReduce with local "
    "aggregation is one allreduce over ranks placed machine by machine, taken to cross machines as a "
    "two-level ring would (4·m·(N−1)/N per machine; Open MPI's allreduce measured 2.02·m vs 2·m on an "
    "emulated 2 x 2 network).",
    "A participant's volume is spread evenly over its n−1 peers, so the share leaving its machine is "
    "(n−g)/(n−1) for g participants per machine; on one machine nothing crosses the network.",
    "Message rounds: ring allreduce 2·(n−1), all dense allreduces fused into one per step (Horovod's "
    "tensor fusion); sparse allgather 2·(n−1) per variable; sparse PS 3·(n−1) per variable (three "
    "alltoalls: ids, rows, gradients); dense PS 2·(n−1) per variable.",
    "AUTO picks, per variable, the method with fewer bytes (ties to AR); latency enters the step-time "
    "estimate only.",
    "Partitions do not change bytes or rounds in the model (rows spread evenly over the owners); the "
    "runtime's partition search measures their effect.",
    "α was measured on the profiled batches; other batches may be more or less sparse.",
)

__all__ = ["ASSUMPTIONS", "BASELINES", "INDEX_BYTES", "METHOD_COSTS", "PLAIN_HOROVOD", "SPARSE_AS_DENSE", "TF_PS",
           "WHOLE_MODEL", "Estimate", "MethodCost", "VariableCost", "choose_method", "compare_architectures",
           "default_partitions", "estimate", "estimate_executed", "step_time_curve", "step_time_curves",
           "variable_cost", "variable_costs"]
