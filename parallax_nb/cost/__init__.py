"""The pure-Python cost model: bytes per machine per step for every method and baseline,
step-time estimates, and the per-variable choices behind a Plan. No TensorFlow is imported.

* :data:`METHOD_COSTS` / :data:`BASELINES` — one cost entry per ``(Method, Kind)`` and per
  baseline (:mod:`.methods`; formulas in :mod:`.model`)
* :func:`variable_cost` — one variable on one ClusterSpec, every method and baseline
* :func:`estimate` — a Plan's bytes, communication and step time (:mod:`.estimate`), its
  calls priced by a calibration (:mod:`.timing`; defaults when none is given);
  :func:`estimate_executed` — the same for what a run executed
* :func:`choose_auto` — AUTO: least estimated step time, with a reason per decision (:mod:`.auto`)
* :func:`compare_architectures` — AR, PS, HYBRID, AUTO and :data:`SPARSE_AS_DENSE`
  (and :data:`PLAIN_HOROVOD`, :data:`TF_PS` on request)
* :func:`step_time_curve` / :func:`step_time_curves` — step time against the machine count
* :data:`ASSUMPTIONS` — the model's assumptions in words, for reports
"""
from ..types import PLAIN_HOROVOD, SPARSE_AS_DENSE, TF_PS, Estimate, MethodCost, VariableCost
from .estimate import (WHOLE_MODEL, Pricing, compare_architectures, estimate, estimate_executed, pricing,
                       step_time_curve, step_time_curves, variable_costs)
from .auto import AutoChoice, choose_auto
from .choice import choose_method, default_partitions
from .methods import BASELINES, METHOD_COSTS, variable_cost
from .model import INDEX_BYTES

ASSUMPTIONS = (
    "Every byte figure is what one machine's network link sends plus receives in one step, an expectation "
    "over the profiled steps; traffic inside a machine (shared memory, PCIe, NVLink) is free.",
    "Step time = compute time + the time of the collective calls the runtime issues (the method table's calls, "
    "one fused allreduce for all dense AR gradients), with no overlap: calls run one after the other and after "
    "the compute. Each call costs latency_s + bytes one rank hands to it / (bandwidth_bps / 8), fitted per "
    "operation and scope by a calibration of the cluster (px.calibrate); without one, defaults from the link's "
    "bandwidth and latency (per call 200 µs + message rounds x latency; bandwidth shared by the machine's ranks "
    "by each algorithm's factor) and the estimate says 'uncalibrated'.",
    "A step's communication is never less than its bytes need at the pace the calibration read a machine's link "
    "to sustain (its largest timed calls across machines: link bytes each way over their time): the calls' fits "
    "were each read with the link to itself, a step's calls share it. Uncalibrated, on one machine, or with a "
    "calibration that read no link, there is no such floor.",
    "Compute time is the calibration's compute of this model measured on every rank at once under the real "
    "placement; uncalibrated, the profiled single-device step time, which does not change with N or with "
    "ranks sharing a device.",
    "Dense AllReduce is a ring (reduce-scatter, then allgather): 4·m·(n−1)/n bytes per participant for a "
    "variable of m bytes among n participants.",
    "AllReduce of a sparse gradient (parallax_nb AR) sums duplicate rows, then allgathers values and int64 "
    "indices: 2·α·m·(n−1) + 2·8·α·R·(n−1) bytes (R rows, α = fraction of rows a participant sends).",
    "Parameter server: every participant owns an even share of the rows; pull rows, push their gradients, "
    "serve the own shard: 4·α·m·(n−1)/n bytes, plus ids sent once to the owners 2·8·α·R·(n−1)/n "
    "(α = 1 and no ids for a dense variable).",
    "Sparse-as-dense AR densifies a sparse gradient and allreduces it with the dense ones: 4·m·(N−1)/N bytes "
    "per machine. Plain Horovod's default allgathers the IndexedSlices among all W ranks, each rank its own "
    "slices with duplicate rows (s profiled gradient bytes), no local aggregation: per machine what Open MPI "
    "4.1's allgatherv algorithm for the call's size carries across (ranks placed machine by machine: 2·G·s·(W−G) "
    "under direct sends, 2·s·(W−1) in a ring, which relays each slice into a machine once). "
    "TensorFlow's parameter servers (the TF-PS baseline) are PS with every worker pushing and pulling on its "
    "own (no local aggregation).",
    "Local aggregation (when on): a machine's G workers combine gradients first, so one participant per "
    "machine crosses the network and a sparse variable sends the measured union of its workers' rows "
    "(not G·α). When off, every worker is a participant with its own α. Dense AllReduce with local "
    "aggregation is one allreduce over ranks placed machine by machine, taken to cross machines as a "
    "two-level ring would (4·m·(N−1)/N per machine; Open MPI's allreduce measured 2.02·m vs 2·m on an "
    "emulated 2 x 2 network).",
    "A participant's volume is spread evenly over its n−1 peers, so the share leaving its machine is "
    "(n−g)/(n−1) for g participants per machine; on one machine nothing crosses the network. Allgathers among "
    "several ranks per machine (plain Horovod's, AR without local aggregation) are the exception: they cross as "
    "the algorithm Open MPI 4.1 picks for the size of Horovod's fused call moves them (a ring or a neighbour "
    "exchange relays each slice into a machine once), every sparse variable's allgathers of a step taken as one "
    "fused call for the values and one for the indices.",
    "Message rounds (descriptive; time comes from the calls): ring allreduce 2·(n−1), all dense allreduces "
    "fused into one per step (Horovod's tensor fusion); sparse allgather 2·(n−1) per variable; sparse PS "
    "3·(n−1) per variable (three alltoalls: ids, rows, gradients; one lookup per variable and step; a variable "
    "looked up together with another at the same ids, as the sampled softmax's biases with its weights, rides "
    "that one's exchange: its rows travel in the same calls, no ids or calls of its own, while both are on PS "
    "and their partition counts give every row id the same owner in both (types.row_owners); otherwise each "
    "has its own); dense PS 2·(n−1) per variable.",
    "AUTO minimises the estimated step time: per variable AR or PS, and local aggregation on or off (both "
    "evaluated, the faster taken); it is never estimated slower than AR, PS or HYBRID, and says why for "
    "each decision. Where the link's pace can hold a step, the plan of fewest bytes is among its candidates.",
    "Apart from that rule, partitions do not change bytes or calls in the model (rows spread evenly over the "
    "owners), so AUTO leaves them at one per worker; the runtime's partition search measures their effect.",
    "α was measured on the profiled batches; other batches may be more or less sparse.",
)

__all__ = ["ASSUMPTIONS", "AutoChoice", "BASELINES", "INDEX_BYTES", "METHOD_COSTS", "PLAIN_HOROVOD", "SPARSE_AS_DENSE",
           "TF_PS", "WHOLE_MODEL", "Estimate", "MethodCost", "Pricing", "VariableCost", "choose_auto", "choose_method",
           "compare_architectures", "default_partitions", "estimate", "estimate_executed", "pricing",
           "step_time_curve", "step_time_curves", "variable_cost", "variable_costs"]
