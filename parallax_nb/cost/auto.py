"""AUTO: the plan with the least estimated step time, and why.

For each setting of local aggregation it may use (both, unless the caller pins one) AUTO
prices every variable under AR and under PS with the calls the runtime issues
(:mod:`.timing`) and picks per variable. The step time is a sum over variables except for the
calls that several variables ride: the one fused allreduce of every dense AR variable, and
with local aggregation on one machine the gather of the sparse AR variables
(:func:`.methods.ar_sparse`). Their latency is paid once when any variable rides them. So the
exact minimum is the best of up to four per-variable choices: each variable its faster
method, paying the shared calls' latency where any variable took AR; or the dense variables,
the sparse ones, or both kept off their shared calls (PS), paying none. Then:

* variables looked up together (the sampled softmax's weights and biases: one exchange under
  PS, :func:`.methods.ps_sparse`) take one method, the one faster for them together;
* AUTO takes the faster local-aggregation setting (ties: on, Parallax's default);
* it compares itself with the whole-model plans AR, PS and HYBRID at that setting and takes
  one of them if its own estimate calls it faster (it cannot be, under this model, but the
  check is what the promise rests on), saying so;
* where the calibration read the link's pace, a step is never charged less than its bytes
  need at it (:func:`.timing.link_floor_s`): the larger of two sums, its calls' and its bytes'
  time, so the least plan may balance the two with any mix of methods. The candidates then
  also include, for each of the four cases above, the best plan of a sweep from the fewest
  bytes to the least calls, improved by single variables' changes (:func:`_balanced`), and
  AUTO takes the least of the candidates, each priced whole. That is no longer exact: on the
  LM-shaped test profile it found the least of every assignment in 59 of 60 random
  calibrations, and came 3.9 % above it in the other (``tests/test_auto.py``);
* partitions are left to the partition rule (one per worker): the model spreads rows evenly
  over the owners, so under it the partition count changes neither bytes nor calls, and
  there is nothing to choose; the runtime's partition search measures it instead.

Each decision comes with a line of explanation, e.g. ``"softmax/softmax_w: PS, 3.1 ms/step
less than AR"``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..types import Architecture, ClusterSpec, Kind, Method, Profile, format_bytes
from .pricing import pricing
from .timing import duration, fused_seconds_per_byte, link_floor_s, step_communication

#: The most passes of :func:`_balanced`'s descent over single variables' changes (each O(n)):
#: it stops at the first pass that changes nothing
_DESCENT_PASSES = 4


@dataclass(frozen=True)
class AutoChoice:
    """AUTO's methods (in profile order), the cluster with its local aggregation, the
    estimated communication seconds per step and one explanation per decision."""

    methods: tuple[Method, ...]
    cluster: ClusterSpec
    comm_time_s: float
    explanations: tuple[str, ...]


def _variable_times(priced) -> tuple[list[float], list[float]]:
    """Per variable, seconds per step under AR (fused bytes at the fused call's rate) and PS."""
    ar_times, ps_times = priced.times(Method.AR.value), priced.times(Method.PS.value)
    # on one rank nothing rides the fused call, and a calibration of one rank holds no call's figure
    fused = any(t.fused_bytes for t in (*ar_times, *ps_times))
    per_byte = fused_seconds_per_byte(priced.calibration) if fused else 0.0
    return ([t.time_s + t.fused_bytes * per_byte for t in ar_times],
            [t.time_s + t.fused_bytes * per_byte for t in ps_times])


def _lesser(priced, ar: list[float], ps: list[float]) -> list[Method]:
    """Per variable the method of the lesser figure (``ar``/``ps``, profile order; ties: AR),
    variables looked up together taking the one lesser for them together."""
    methods = [Method.PS if p < a else Method.AR for a, p in zip(ar, ps)]
    for first, others in priced.lookup_groups.items():   # one method for a lookup made together
        group = [first, *others]
        together = Method.PS if sum(ps[i] for i in group) < sum(ar[i] for i in group) else Method.AR
        for i in group:
            methods[i] = together
    return methods


def _best_methods(priced) -> list[Method]:
    free = _lesser(priced, *_variable_times(priced))
    grouped = [t.group is not None for t in priced.times(Method.AR.value)]
    dense = [c.kind is Kind.DENSE for c in priced.costs]
    off_fused = [Method.PS if d else m for d, m in zip(dense, free)]
    off_grouped = [Method.PS if g else m for g, m in zip(grouped, free)]
    off_both = [Method.PS if g else m for g, m in zip(grouped, off_fused)]
    candidates = [free] + [m for m in (off_fused, off_grouped, off_both) if m != free]
    if priced.calibration.link_bytes_per_s and priced.cluster.machines > 1:
        # where the link's pace can hold the step, the least plan may balance calls against bytes
        units = _units(priced)
        cases = []
        for forced in ([False] * len(dense), dense, grouped, [d or g for d, g in zip(dense, grouped)]):
            if forced not in cases:   # without grouped or dense variables some cases are one
                cases.append(forced)
        for forced in cases:
            balanced = _balanced(priced, forced, units)
            if balanced not in candidates:
                candidates.append(balanced)
    if len(candidates) == 1:
        return free
    return min(candidates, key=lambda methods: _comm(priced, methods))


def _balanced(priced, forced: list[bool], units: list | None = None) -> list[Method]:
    """The plan of least ``max(calls, floor)`` among those that weigh each variable's call
    seconds against its bytes' seconds at the link's pace (``w * calls + (1 - w) * floor``, each
    variable taking its method of the lesser weighted figure), for every weight ``w`` from 0
    (the fewest bytes) to 1 (the least calls), then improved by single variables' changes while
    one shortens the step. ``forced``: per variable, kept on PS (off the shared calls it would
    ride under AR). Variables looked up together move as one (``units``:
    :func:`_units`, made once per pricing).

    Each variable changes its method at most once as ``w`` grows, so the plans are the
    ``n + 1`` steps of one sweep over those changes, each priced from the last by one
    variable's difference: O(n log n), and O(n) per pass of the descent. The step's time is
    the larger of two sums, so the least plan may still be missed (it can need two variables
    changed at once); the brute-force tests in ``tests/test_auto.py`` measure by how much."""
    units = _units(priced) if units is None else units
    per_byte = link_floor_s(1.0, priced.calibration)
    ar_t, ps_t = priced.times(Method.AR.value), priced.times(Method.PS.value)
    fused_latency = (priced.calibration.fit("allreduce", "all").latency_s
                     if any(t.fused_bytes > 0 for t in (*ar_t, *ps_t)) else 0.0)
    latency = {g.key: g.latency_s for t in (*ar_t, *ps_t) if t.group is not None for g in (t.group,)}
    state = {"calls": 0.0, "payload": 0.0, "fused": 0}
    riding = dict.fromkeys(latency, 0)
    chosen: list[int] = []   # per unit: 0 AR, 1 PS
    fixed = [any(forced[i] for i in unit.members) for unit in units]
    events = []

    def take(unit, side, sign):
        x, y, fused, keys = unit.sides[side]
        state["calls"] += sign * x
        state["payload"] += sign * y
        state["fused"] += sign * fused
        for key in keys:
            riding[key] += sign

    for k, unit in enumerate(units):
        (xa, ya, _, _), (xp, yp, _, _) = unit.sides
        dx, dy = xp - xa, (yp - ya) * per_byte
        if fixed[k]:
            first = last = 1
        else:
            first = 1 if dy < 0 or (dy == 0 and dx < 0) else 0    # w just above 0
            last = 1 if dx < 0 or (dx == 0 and dy < 0) else 0     # w just below 1
        chosen.append(first)
        take(unit, first, 1)
        if last != first:
            events.append((dy / (dy - dx), k))

    def step():
        shared = (fused_latency if state["fused"] > 0 else 0.0) + sum(latency[key] for key, n in riding.items() if n)
        payload = state["payload"]
        return max(state["calls"] + shared, payload * per_byte if payload > 0 else 0.0)

    def flip(k):
        take(units[k], chosen[k], -1)
        chosen[k] = 1 - chosen[k]
        take(units[k], chosen[k], 1)

    best, best_at = step(), 0
    events.sort()
    for n, (_, k) in enumerate(events, 1):
        flip(k)
        now = step()
        if now < best:
            best, best_at = now, n
    for _, k in events[best_at:]:   # back to the best step of the sweep
        flip(k)
    for _ in range(_DESCENT_PASSES):   # then each variable's change that shortens the step, while any does
        shorter = False
        for k in range(len(units)):
            if fixed[k]:
                continue
            flip(k)
            now = step()
            if now < best * (1 - 1e-12):
                best, shorter = now, True
            else:
                flip(k)
        if not shorter:
            break
    methods = [Method.AR] * len(priced.costs)
    for unit, side in zip(units, chosen):
        for i in unit.members:
            methods[i] = Method.PS if side else Method.AR
    return methods


class _Unit(NamedTuple):
    """Variables that take one method (one, or those looked up together) and, per side (AR,
    PS), their call seconds, bytes, riders of the fused allreduce and grouped exchanges ridden."""

    members: tuple
    sides: tuple


def _units(priced) -> list[_Unit]:
    """:func:`_balanced`'s units of ``priced``'s variables, in profile order of their first."""
    (ar_x, ps_x), in_group = _variable_times(priced), {i for f, o in priced.lookup_groups.items() for i in (f, *o)}
    ar_y, ps_y = priced.column(Method.AR.value).bytes, priced.column(Method.PS.value).bytes
    ar_t, ps_t = priced.times(Method.AR.value), priced.times(Method.PS.value)
    units = []
    for i, (xa, ya, ta, xp, yp, tp) in enumerate(zip(ar_x, ar_y, ar_t, ps_x, ps_y, ps_t)):
        if i not in in_group:   # most variables: one each, read directly
            units.append(_Unit((i,), ((xa, ya, int(ta.fused_bytes > 0), () if ta.group is None else (ta.group.key,)),
                                      (xp, yp, int(tp.fused_bytes > 0), () if tp.group is None else (tp.group.key,)))))
    for first, others in priced.lookup_groups.items():
        at = (first, *others)
        units.append(_Unit(at, tuple((sum(x[i] for i in at), sum(y[i] for i in at),
                                      sum(t[i].fused_bytes > 0 for i in at),
                                      tuple(t[i].group.key for i in at if t[i].group is not None))
                                     for x, y, t in ((ar_x, ar_y, ar_t), (ps_x, ps_y, ps_t)))))
    return units


def _comm_parts(priced, methods) -> tuple[float, float]:
    """(seconds of the calls ``methods`` issue per step, seconds the step's bytes need at the
    link's pace: :func:`.timing.link_floor_s`, 0 without one)."""
    ar, ps = priced.times(Method.AR.value), priced.times(Method.PS.value)
    times = [a if m is Method.AR else p for a, p, m in zip(ar, ps, methods)]
    calls = step_communication(times, priced.calibration).comm_time_s
    if priced.cluster.machines == 1 or not priced.calibration.link_bytes_per_s:
        return calls, 0.0
    keys = priced.charged_keys("auto", methods)
    payload = sum(priced.column(key).bytes[i] for i, key in enumerate(keys))
    return calls, link_floor_s(payload, priced.calibration)


def _comm(priced, methods) -> float:
    """The step's communication under ``methods``, as :class:`.pricing.Pricing` totals it."""
    return max(_comm_parts(priced, methods))


def _link_bound(calls: float, floor: float) -> str:
    """The explanation of a step the link's pace holds (``calls``, ``floor``: :func:`_comm_parts`),
    "" when its calls set its time."""
    if floor <= calls:
        return ""
    return (f"link-bound: the step's bytes need {duration(floor)} across a machine's link at the pace the "
            f"calibration read, its calls {duration(calls)}; the variables' figures above are their calls'")


def _explain_variables(priced, methods, held: bool) -> list[str]:
    """One line per variable; ``held``: the step is link-bound (:func:`_link_bound`)."""
    ar, ps = _variable_times(priced)
    ar_bytes, ps_bytes = list(priced.column(Method.AR.value).bytes), list(priced.column(Method.PS.value).bytes)
    names = [c.name for c in priced.costs]
    group_of: dict[int, list[int]] = {}
    for first, others in priced.lookup_groups.items():
        group = [first, *others]
        sums = [sum(values[i] for i in group) for values in (ar, ps, ar_bytes, ps_bytes)]
        for i in group:
            group_of[i] = group
            ar[i], ps[i], ar_bytes[i], ps_bytes[i] = sums
    times = {Method.AR: priced.times(Method.AR.value), Method.PS: priced.times(Method.PS.value)}
    chosen = [times[m][i] for i, m in enumerate(methods)]
    fused_ridden = any(t.fused_bytes > 0 for t in chosen)
    groups_ridden = {t.group.key for t in chosen if t.group is not None}
    lines = []
    for i, (cost, method, a, p) in enumerate(zip(priced.costs, methods, ar, ps)):
        other = Method.PS if method is Method.AR else Method.AR
        gain = (p - a) if method is Method.AR else (a - p)
        together = ""
        if i in group_of:
            together = f"with {', '.join(names[j] for j in group_of[i] if j != i)} (looked up together), both "
        head = f"{cost.name}: {method.value.upper()}, {together}"
        if gain > 0:
            lines.append(f"{head}{duration(gain)}/step less than {other.value.upper()}")
            continue
        if gain == 0:
            lines.append(f"{head}same time as {other.value.upper()}")
            continue
        # slower by its own calls: it keeps the step off a call it would share, or its bytes are fewer
        would = times[other][i]
        if would.fused_bytes > 0 and not fused_ridden:
            lines.append(f"{head}{duration(-gain)}/step more than {other.value.upper()} alone, but the step then "
                         f"needs no fused allreduce")
        elif would.group is not None and would.group.key not in groups_ridden:
            lines.append(f"{head}{duration(-gain)}/step more than {other.value.upper()} alone, but the step then "
                         f"needs no gather of the sparse AR variables")
        else:
            fewer = (ar_bytes[i] - ps_bytes[i]) if method is Method.PS else (ps_bytes[i] - ar_bytes[i])
            slower = f"{head}{duration(-gain)}/step more than {other.value.upper()} by its calls, "
            if fewer > 0:
                lines.append(f"{slower}but {format_bytes(fewer)}/step fewer across a machine's link, "
                             f"{duration(link_floor_s(fewer, priced.calibration))} at the pace the calibration read")
            elif held:
                lines.append(f"{slower}which the step, held to the link's pace, does not wait for")
            else:
                lines.append(f"{slower}the least of AUTO's candidates, which are not exhaustive where the "
                             f"link's pace can hold the step")
    return lines


def choose_auto(profile: Profile, cluster: ClusterSpec, calibration=None,
                local_aggregation: bool | None = None) -> AutoChoice:
    """AUTO's plan for ``profile`` on ``cluster`` (module docstring). ``local_aggregation``
    None evaluates on and off and takes the faster; a bool pins it."""
    if local_aggregation is not None:
        settings = (bool(local_aggregation),)
    elif cluster.workers_per_machine == 1:   # the runtime runs the flat collectives either way
        settings = (cluster.local_aggregation,)
    else:
        settings = (True, False)
    candidates = []
    for on in settings:
        spec = cluster if cluster.local_aggregation == on else cluster.replace(local_aggregation=on)
        priced = pricing(profile, spec, calibration)
        methods = _best_methods(priced)
        candidates.append((_comm(priced, methods), on, priced, methods))
    comm, on, priced, methods = min(candidates, key=lambda c: (c[0], not c[1]))
    explanations = []
    if len(candidates) == 2:
        other = next(c for c in candidates if c[1] != on)
        word = "on" if on else "off"
        explanations.append(f"local aggregation {word}: {duration(other[0] - comm)}/step less than "
                            f"{'off' if on else 'on'}" if other[0] > comm else
                            f"local aggregation {word}: same time as {'off' if on else 'on'}")
    elif local_aggregation is not None:
        explanations.append(f"local aggregation {'on' if on else 'off'}, as asked")
    else:
        explanations.append(f"local aggregation {'on' if on else 'off'}: one rank per machine, nothing to combine")
    taken = None
    for architecture in (Architecture.AR, Architecture.PS, Architecture.HYBRID):
        whole = priced.methods_of(architecture)
        if whole == list(methods):
            continue
        whole_comm = _comm(priced, whole)
        if whole_comm < comm:
            taken = (f"AUTO takes {architecture.value.upper()}'s plan: {duration(comm - whole_comm)}/step less "
                     f"than its per-variable choice")
            comm, methods = whole_comm, whole
    calls, floor = _comm_parts(priced, methods)
    explanations.extend(_explain_variables(priced, methods, held=floor > calls))
    if taken is not None:
        explanations.append(taken)
    bound = _link_bound(calls, floor)
    if bound:
        explanations.append(bound)
    return AutoChoice(tuple(methods), priced.cluster, comm, tuple(explanations))
