"""Step time from the collectives a step issues, each priced by a calibration.

The method table (:data:`.methods.METHOD_COSTS`, kept equal to the runtime's exchanges by
``tests/test_method_tables.py``) lists, per variable and method, the calls the runtime issues
and the bytes one rank hands to them. A :class:`~parallax_nb.calibration.Calibration` of the
cluster (measured by ``px.calibrate``, or :meth:`~parallax_nb.calibration.Calibration.defaults`
from the ClusterSpec's bandwidth and latency, then labelled "uncalibrated") gives each op and
scope a fit ``t(call) = latency_s + handed_bytes / (bandwidth_bps / 8)``. Per step::

    comm_time_s = sum over the variables' calls (count * latency_s + handed_bytes * 8 / bandwidth_bps)
                + [one fused allreduce: latency_s + sum of the dense AR handed bytes * 8 / bandwidth_bps]
    step_time_s = compute_time_s + comm_time_s

* ``compute_time_s``: the calibration's compute of this model measured on every rank at once
  under the real placement (ranks sharing cores or devices), each step with the taking of its
  batch from the job's data as a training loop pays it, else the profile's single-device step
  time (the step and the taking of a batch, unshared). The Horovod baselines run the model
  as Keras builds it, whose ``Embedding`` layers copy the whole table on every read once a
  sparse update wrote it (measured: 38-42 ms against 21-23 ms a step for the benchmarks' LM
  on one rank): they are charged their own measured compute (:data:`KERAS_BUILT`).
* **No overlap**: the calls are charged one after the other and after the compute. Horovod
  runs a step's collectives from one background thread in the order the ranks agree on, and
  parallax_nb's lookups feed the forward pass, so most calls cannot hide behind compute; a
  runtime that overlaps more is faster than estimated.
* The dense AR gradients of a step are allreduced one by one and fused by Horovod's
  background thread (tensor fusion): charged as one call, its latency paid once per step,
  its bytes the sum of theirs.
* With local aggregation on one machine the AR sparse variables of a step of one row shape
  travel in one gather (:func:`.methods.ar_sparse`): its latency is paid once per step when
  any variable rides it, each variable's bytes at the call's bandwidth.
* **Plain Horovod's allgathers of a step's sparse gradients**
  (:attr:`~parallax_nb.types.MethodCost.fused_allgather`) leave ``DistributedGradientTape``'s
  backward pass together, and Horovod fuses them into two ``MPI_Allgatherv`` a step, one of
  every variable's values and one of their indices (the recommender's eight calls in Horovod's
  timeline). Where a measured calibration prices calls as a chain (ranks sharing cores:
  :data:`~parallax_nb.calibration.CALL_PRICING_CHAIN`), a call's latency is mostly the wait for
  the other ranks' turns on the cores and for Horovod's next cycle, which a fused call pays
  once: the two calls' latency is charged once a step (:data:`FUSED_ALLGATHERS`), each
  variable's bytes at the call's bandwidth. The recommender's plain Horovod on 4 ranks of 2
  cores (loop4, 2 x 2 at 1 Gbit/s; 17 readings of 2026-11-30) ran 17-56 % shorter than priced
  per call and -25 to +52 % from the fused pricing (with 2 x 2 at 100 Mbit/s, where the link's
  pace sets both, median |error| 25.6 % against 12.5 % over 25). Where calls are priced in
  stride (every rank a core of its own), the calibrated latency is what one more call adds to
  a running chain, and plain Horovod's steps on 2 ranks followed the calls as listed (-20 to
  +24 % per call, +18 to +86 % fused): there each call is charged as issued. Uncalibrated
  estimates charge each call.
* **parallax_nb's AR without local aggregation** issues the same allgathers, but its calls are
  charged as issued: its ranks reach each call further apart (Horovod's timeline on 2 x 2,
  2026-11-28: the last rank asked 250-350 us after the first, against 163-176 us for plain
  Horovod), and priced as fused calls the recommender's AR steps on loop4 ran 30-48 % longer
  than predicted (priced per call, the readings before read 28-39 % shorter), and AUTO,
  taking it for cheaper than it ran, fell from 12 of 12 to 3 of 7 settings within 5 % of the
  fastest (2026-11-30).
* Every other call is charged as the program issues it. The link bytes follow the fused call's
  size (:func:`.methods.horovod_sparse`).
* **The link's pace.** Each call's fit was read off calls timed apart, each with the link to
  itself. A step's calls share one machine's link, and on a slow link its bytes cross no
  faster than the link's pace, however few or cheap the calls (a step of many small flows at
  once can beat that pace: :attr:`~parallax_nb.calibration.Calibration.link_bytes_per_s`). The communication is charged
  at least :func:`link_floor_s`: the step's payload (with the measured framing) each way at
  :attr:`~parallax_nb.calibration.Calibration.link_bytes_per_s`, the pace the calibration's
  largest calls across machines read. Without that pace (uncalibrated, one machine, files
  written before link counters were read) there is no floor.
* One rank (``W = 1``) issues no collective: the step is compute only.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

from ..calibration import CALL_PRICING_CHAIN, Calibration
from ..errors import ConfigError
from ..types import PLAIN_HOROVOD, SPARSE_AS_DENSE, ClusterSpec, MethodCost, Profile

#: the step's allgathers of sparse gradients as Horovod fuses them (:func:`call_time`): one call
#: of every variable's values and one of their indices, two dtypes
FUSED_ALLGATHERS = "Horovod's fused allgathers of the sparse gradients"
FUSED_ALLGATHER_CALLS = 2

# The baselines that run the user's model as Keras builds it, not the runtime's routed model:
# their compute is their own (``Calibration.baseline_compute_time_s``). TensorFlow's parameter
# servers (``TF_PS``) are priced with the runtime's compute.
KERAS_BUILT = (PLAIN_HOROVOD, SPARSE_AS_DENSE)


@functools.lru_cache(maxsize=64)
def _defaults(machines: int, workers_per_machine: int, bandwidth_bps: float, latency_s: float) -> Calibration:
    return Calibration.defaults(machines, workers_per_machine, bandwidth_bps, latency_s)


def calibration_for(cluster: ClusterSpec, calibration: Calibration | None = None) -> Calibration:
    """``calibration`` checked against ``cluster``'s shape (a ConfigError naming both shapes),
    or the defaults of ``cluster`` when None."""
    if calibration is None:
        return _defaults(cluster.machines, cluster.workers_per_machine, cluster.bandwidth_bps, cluster.latency_s)
    if not isinstance(calibration, Calibration):
        raise ConfigError(f"calibration must be a parallax_nb Calibration, got {type(calibration).__name__}",
                          hint="load one with px.Calibration.from_json(path), or leave it out for the defaults")
    calibration.check_shape(cluster.machines, cluster.workers_per_machine)
    return calibration


def compute_time_s(profile: Profile, calibration: Calibration, label: str | None = None) -> float:
    """Measured compute per step of ``profile``'s model under the real placement, else the
    profile's single-device step time. For a Horovod baseline ``label`` (:data:`KERAS_BUILT`),
    its own compute where the calibration measured it."""
    baseline = label if label in KERAS_BUILT else None
    measured = calibration.compute_for(profile.model_name, baseline) if calibration.measured else None
    return profile.step_time_s if measured is None else measured


def time_basis(profile: Profile, calibration: Calibration, label: str | None = None) -> str:
    """What an estimate's time figures rest on: the calibration's label, then its
    :func:`time_basis_notes`, joined by "; "."""
    return "; ".join((calibration.label, *time_basis_notes(profile, calibration, label)))


def time_basis_notes(profile: Profile, calibration: Calibration, label: str | None = None) -> tuple[str, ...]:
    """What a measured calibration leaves to other figures: where it holds no compute for
    ``profile``'s model (taken without the job), that the compute is the one-device profile's
    step, which ranks sharing cores or a device exceed; for a Horovod baseline ``label`` from a
    calibration that predates the baselines' own compute, that the compute is the runtime's
    (tables read by row, not copied whole); that the compute read apart at the start and the
    end of the calibration (:meth:`Calibration.compute_drift`). Empty when nothing is."""
    if calibration.measured and calibration.compute_for(profile.model_name) is None:
        return ("compute: one-device profile, not measured on these ranks",)
    notes = []
    if calibration.measured and label in KERAS_BUILT and not calibration.baseline_compute_known(profile.model_name):
        notes.append("Horovod baselines' compute: parallax_nb's model (tables read by row), not the model as Keras "
                     "builds it; calibrate again to measure theirs")
    drift = calibration.compute_drift(profile.model_name) if calibration.measured else ""
    return (*notes, drift) if drift else tuple(notes)


class Group(NamedTuple):
    """The calls of a grouped exchange (:attr:`~parallax_nb.types.MethodCost.group`), charged
    once per step: their latency, their number, ``(("op/scope", count), ...)`` and their
    message rounds."""

    key: str
    latency_s: float
    calls: int
    scoped: tuple
    rounds: int


class CallTime(NamedTuple):
    """One variable's calls under one charged cost: ``time_s`` of its own calls (``latency_s``
    of it per-call latency), ``calls`` of them, ``fused_bytes`` it adds to the step's one
    fused allreduce (whose latency is charged once per step, not here), and the grouped
    exchange it rides (``group``, None when none; charged once per step too). A tuple: a
    planner makes thousands per change."""

    time_s: float
    latency_s: float
    calls: int
    fused_bytes: float
    group: Group | None = None


NO_CALLS = CallTime(0.0, 0.0, 0, 0.0)


def fuses_allgathers(calibration: Calibration) -> bool:
    """Whether ``calibration`` prices a step's fused allgathers once per fused call (module
    docstring): a measured calibration whose calls are priced as a chain (ranks sharing cores)."""
    return calibration.measured and calibration.call_pricing == CALL_PRICING_CHAIN


def call_time(cost: MethodCost, calibration: Calibration, ranks: int) -> CallTime:
    """Price the calls of one charged cost (module docstring)."""
    if ranks == 1:
        return NO_CALLS
    time = latency = fused = 0.0
    calls = 0
    fused_gathers = cost.fused_allgather and fuses_allgathers(calibration)
    for c in cost.collectives:
        if cost.fused_allreduce and c.op == "allreduce":
            fused += c.handed_bytes
            continue
        fit = calibration.fit(c.op, c.participants)
        calls += c.count
        if fused_gathers and c.op == "allgather":   # its bytes here, the fused calls' latency once a step
            time += c.handed_bytes * 8.0 / fit.bandwidth_bps
            continue
        time += c.time_s(fit)
        latency += c.count * fit.latency_s
    group = None
    if cost.group:
        group = Group(cost.group, sum(c.count * calibration.fit(c.op, c.participants).latency_s for c in cost.grouped),
                      sum(c.count for c in cost.grouped),
                      tuple((f"{c.op}/{c.participants}", c.count) for c in cost.grouped), cost.messages_per_step)
    elif fused_gathers:
        group = Group(FUSED_ALLGATHERS, FUSED_ALLGATHER_CALLS * calibration.fit("allgather", "all").latency_s, 0, (), 0)
    return CallTime(time, latency, calls, fused, group)


@dataclass(frozen=True)
class StepTime:
    """A whole step's communication: seconds, the latency part of them, and calls."""

    comm_time_s: float
    latency_time_s: float
    calls: int

    @property
    def transfer_time_s(self) -> float:
        return self.comm_time_s - self.latency_time_s


def step_communication(times: Sequence[CallTime], calibration: Calibration) -> StepTime:
    """Sum the variables' calls and add the one fused allreduce when any variable rides it,
    and each grouped exchange once."""
    time = latency = fused = 0.0
    calls = 0
    for t in times:
        time += t[0]
        latency += t[1]
        calls += t[2]
        fused += t[3]
    return with_fused_call(time, latency, calls, fused, calibration, distinct_groups(t[4] for t in times))


def distinct_groups(groups: Iterable[Group | None]) -> list[Group]:
    """Each grouped exchange among ``groups`` once (None and 0, no group, left out)."""
    return list({g.key: g for g in groups if g}.values())


def with_fused_call(time_s: float, latency_s: float, calls: int, fused_bytes: float,
                    calibration: Calibration, groups: Iterable[Group] = ()) -> StepTime:
    """The step's communication from the sums of its variables' :class:`CallTime` fields: the
    one fused allreduce is added when any variable rides it (``fused_bytes`` > 0), and the
    calls of each grouped exchange some variable rides (``groups``, one each)."""
    if fused_bytes > 0:
        fit = calibration.fit("allreduce", "all")
        time_s += fit.latency_s + fused_bytes * 8.0 / fit.bandwidth_bps
        latency_s += fit.latency_s
        calls += 1
    for group in groups:
        time_s += group.latency_s
        latency_s += group.latency_s
        calls += group.calls
    return StepTime(time_s, latency_s, calls)


def duration(seconds: float) -> str:
    """``"2.86 s"``, ``"3.1 ms"`` or ``"42 µs"``: a step's time or a difference of two, readable."""
    seconds = abs(seconds)
    for scale, unit in ((1.0, "s"), (1e-3, "ms")):
        if seconds >= scale * 0.9995:   # what rounds to 1 of this unit at 3 digits: "1 s", not "1e+03 ms"
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e6:.3g} µs"


def link_floor_s(payload_bytes: float, calibration: Calibration) -> float:
    """Seconds ``payload_bytes`` per machine per step (received + sent, the cost model's bytes)
    need across a machine's link at the pace the calibration read it to sustain: the payload
    with its measured framing, halved to one direction, over
    :attr:`~parallax_nb.calibration.Calibration.link_bytes_per_s`. 0 without a pace."""
    pace = calibration.link_bytes_per_s
    if not pace or payload_bytes <= 0:
        return 0.0
    framing = calibration.payload_framing_factor or 1.0
    return payload_bytes * framing / 2.0 / pace


def fused_seconds_per_byte(calibration: Calibration) -> float:
    """Seconds one more byte handed to the fused allreduce adds (its latency is paid anyway)."""
    return 8.0 / calibration.fit("allreduce", "all").bandwidth_bps


def payload_by_call(costs: Sequence[MethodCost], cluster: ClusterSpec) -> dict:
    """``{"op/scope": payload bytes per machine per step}``: each charged cost's bytes split
    over its calls that cross machines (any scope but "machine") in proportion to what they put
    on a machine's link (handed bytes x :func:`~parallax_nb.calibration.link_factor`), equally
    by calls where the sizes are unknown. A cost with no such call (one machine, point-to-point
    asynchronous pulls and pushes) is left out."""
    out: dict = {}
    if cluster.machines == 1:
        return out
    for cost in costs:
        for key, share in payload_shares(cost, cluster):
            out[key] = out.get(key, 0.0) + share
    return out


def payload_shares(cost: MethodCost, cluster: ClusterSpec) -> list[tuple[str, float]]:
    """One charged cost's part of :func:`payload_by_call`: ``[("op/scope", bytes)]`` per call
    that crosses machines, [] when none does or nothing moves."""
    from ..calibration import link_factor

    # a call counted 0 times carries bytes of a variable served in another's exchange
    crossing = [c for c in cost.collectives if c.participants != "machine" and (c.count > 0 or c.handed_bytes > 0)]
    if cost.bytes_per_step <= 0 or not crossing:
        return []
    weights = [c.handed_bytes * link_factor(c.op, c.participants, cluster.machines, cluster.workers_per_machine)
               for c in crossing]
    if sum(weights) <= 0:
        weights = [float(c.count) for c in crossing]
    per_weight = cost.bytes_per_step / sum(weights)
    return [(f"{c.op}/{c.participants}", w * per_weight) for c, w in zip(crossing, weights)]


def calls_by_scope(costs: Sequence[MethodCost], ranks: int) -> dict:
    """``{"op/scope": calls per step}`` of the charged costs, as :func:`step_communication`
    counts them: the dense AR gradients' allreduces as one fused "allreduce/all" call, each
    grouped exchange's calls once; {} on one rank (no collective)."""
    out: dict = {}
    fused = False
    groups = {}
    if ranks == 1:
        return out
    for cost in costs:
        fused = fused or rides_fused_allreduce(cost)
        for key, count in own_calls(cost):
            out[key] = out.get(key, 0) + count
        if cost.group:
            groups[cost.group] = cost.grouped
    if fused:
        out["allreduce/all"] = out.get("allreduce/all", 0) + 1
    for grouped in groups.values():
        for c in grouped:
            key = f"{c.op}/{c.participants}"
            out[key] = out.get(key, 0) + c.count
    return out


def rides_fused_allreduce(cost: MethodCost) -> bool:
    """``cost`` hands bytes to the step's one fused allreduce."""
    return cost.fused_allreduce and any(c.op == "allreduce" for c in cost.collectives)


def own_calls(cost: MethodCost) -> list[tuple[str, int]]:
    """``[("op/scope", count)]`` of the calls ``cost`` issues itself (not the fused allreduce)."""
    return [(f"{c.op}/{c.participants}", c.count) for c in cost.collectives
            if not (cost.fused_allreduce and c.op == "allreduce")]
