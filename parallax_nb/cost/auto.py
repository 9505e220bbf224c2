"""AUTO: the plan with the least estimated step time, and why.

For each setting of local aggregation it may use (both, unless the caller pins one) AUTO
prices every variable under AR and under PS with the calls the runtime issues
(:mod:`.timing`) and picks per variable. The step time is a sum over variables except for the
calls that several variables ride: the one fused allreduce of every dense AR variable, and
the one call of the sparse AR variables of a row shape (an allgather over all ranks, or with
local aggregation on one machine a gather inside it: :func:`.methods.ar_sparse`). Their
latency is paid once when any variable rides them. So the exact minimum keeps each shared call off (its variables on PS,
paying none of its latency) or not (each of its variables its faster method, paying the
latency once if any took AR), whichever its variables cost the step less; a variable rides
at most one shared call, so each is decided on its own, except calls whose variables are
looked up together, decided together (:func:`_least_by_shared_call`). Then:

* variables looked up together (the sampled softmax's weights and biases: one exchange under
  PS, :func:`.methods.ps_sparse`) take one method, the one faster for them together;
* AUTO takes the faster local-aggregation setting (ties: on, Parallax's default);
* it compares itself with the whole-model plans AR, PS and HYBRID at that setting and takes
  one of them if its own estimate calls it faster (it cannot be, under this model, but the
  check is what the promise rests on), saying so;
* where the calibration read the link's pace, a step is never charged less than its bytes
  need at it (:func:`.timing.link_floor_s`), so the plan that moves the fewest bytes (each
  variable its method of fewer bytes) is a candidate too, and the per-variable choice is no
  longer exact: the least of the candidates, each priced whole;
* partitions are left to the partition rule (one per worker): the model spreads rows evenly
  over the owners, so under it the partition count changes neither bytes nor calls, and
  there is nothing to choose; the runtime's partition search measures it instead.

Each decision comes with a line of explanation, e.g. ``"softmax/softmax_w: PS, 3.1 ms/step
less than AR"``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..types import Architecture, ClusterSpec, Kind, Method, Profile, format_bytes
from .kept import Kept
from .pricing import check_inputs, pricing
from .timing import calibration_for, duration, fused_seconds_per_byte, link_floor_s, step_communication


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


FUSED_ALLREDUCE = "fused allreduce"


def _best_methods(priced) -> list[Method]:
    ar, ps = _variable_times(priced)
    free = _lesser(priced, ar, ps)
    shared = _shared_call_of(priced)
    candidates = [free, _least_by_shared_call(priced, ar, ps, free, shared)]   # exact under the calls' sum
    if priced.calibration.link_bytes_per_s and priced.cluster.machines > 1:
        # where the link's pace can hold the step the calls' least is not exact: the dense, the
        # sparse or both kept off their shared calls, and the plan that moves the least, may be faster
        off_fused = [Method.PS if c.kind is Kind.DENSE else m for c, m in zip(priced.costs, free)]
        off_grouped = [Method.PS if key not in (None, FUSED_ALLREDUCE) else m for key, m in zip(shared, free)]
        off_both = [Method.PS if key not in (None, FUSED_ALLREDUCE) else m for key, m in zip(shared, off_fused)]
        least_bytes = _lesser(priced, priced.bytes_per_step(Method.AR.value), priced.bytes_per_step(Method.PS.value))
        candidates += [off_fused, off_grouped, off_both, least_bytes]
    candidates = [m for i, m in enumerate(candidates) if m not in candidates[:i]]
    if len(candidates) == 1:
        return free
    return min(candidates, key=lambda methods: _comm(priced, methods))


def _least_by_shared_call(priced, ar: list[float], ps: list[float], free: list[Method], shared: list) -> list[Method]:
    """The least plan under the calls' sum (no link floor): a variable rides at most one shared
    call, so each call is kept off (its variables on PS) or not on its own, except where
    variables looked up together ride different calls: those calls are decided together, every
    combination of them tried (a handful at most)."""
    latency = {}
    for t in priced.times(Method.AR.value):
        if t.group is not None:
            latency[t.group.key] = t.group.latency_s
    if FUSED_ALLREDUCE in shared:
        latency[FUSED_ALLREDUCE] = priced.calibration.fit("allreduce", "all").latency_s
    # the calls linked by lookups made together, and each lookup's variables
    linked = {key: {key} for key in latency}
    partners: dict[int, list[int]] = {}
    for first, others in priced.lookup_groups.items():
        group = [first, *others]
        keys = {shared[i] for i in group if shared[i] is not None}
        merged = set().union(*(linked[k] for k in keys)) if keys else set()
        for k in merged:
            linked[k] = merged
        for i in group:
            partners[i] = group
    members: dict[str, list[int]] = {}
    for i, key in enumerate(shared):
        if key is not None:
            members.setdefault(key, []).append(i)
    methods = list(free)
    for component in {frozenset(keys) for keys in linked.values()}:
        keys = sorted(component)
        touched = sorted({j for k in keys for i in members.get(k, []) for j in partners.get(i, [i])})

        def cost(off: set, touched=touched) -> tuple[float, list]:
            forced = {j for k in off for i in members.get(k, []) for j in partners.get(i, [i])}
            chosen = [Method.PS if j in forced else free[j] for j in touched]
            total = sum(ps[j] if m is Method.PS else ar[j] for j, m in zip(touched, chosen))
            ridden = {shared[j] for j, m in zip(touched, chosen) if m is Method.AR and shared[j] is not None}
            return total + sum(latency[k] for k in ridden), chosen

        best = min((cost(set(off)) for n in range(len(keys) + 1) for off in itertools.combinations(keys, n)),
                   key=lambda c: c[0])
        for j, m in zip(touched, best[1]):
            methods[j] = m
    return methods


def _shared_call_of(priced) -> list[str | None]:
    """Per variable (profile order), the call it would share with others on AR: the fused
    allreduce, its row shape's grouped call (the group's key), or None."""
    return [FUSED_ALLREDUCE if t.fused_bytes > 0 else t.group.key if t.group is not None else None
            for t in priced.times(Method.AR.value)]


def _comm_parts(priced, methods) -> tuple[float, float]:
    """(seconds of the calls ``methods`` issue per step, seconds the step's bytes need at the
    link's pace: :func:`.timing.link_floor_s`, 0 without one)."""
    ar, ps = priced.times(Method.AR.value), priced.times(Method.PS.value)
    times = [a if m is Method.AR else p for a, p, m in zip(ar, ps, methods)]
    calls = step_communication(times, priced.calibration).comm_time_s
    if priced.cluster.machines == 1 or not priced.calibration.link_bytes_per_s:
        return calls, 0.0
    keys = priced.charged_keys("auto", methods)
    per_key = {key: priced.bytes_per_step(key) for key in set(keys)}
    payload = sum(per_key[key][i] for i, key in enumerate(keys))
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
    ar_bytes, ps_bytes = list(priced.bytes_per_step(Method.AR.value)), list(priced.bytes_per_step(Method.PS.value))
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
    shared = _SharedCalls(chosen, priced.calibration)
    lines = []
    for i, (cost, method, a, p) in enumerate(zip(priced.costs, methods, ar, ps)):
        other = Method.PS if method is Method.AR else Method.AR
        gain = (p - a) if method is Method.AR else (a - p)
        # what switching this variable alone would add or spare of the calls variables share
        would = times[other][i]
        added = shared.added_by(would)
        switched = gain + added - shared.spared_by(chosen[i])
        together = ""
        if i in group_of:
            together = f"with {', '.join(names[j] for j in group_of[i] if j != i)} (looked up together), both "
        head = f"{cost.name}: {method.value.upper()}, {together}"
        if gain > 0 and switched > 0:
            lines.append(f"{head}{duration(switched)}/step less than {other.value.upper()}")
            continue
        if gain > 0:   # its own calls are faster, but alone on a shared call it costs the step that call
            lines.append(f"{head}{duration(gain)}/step less than {other.value.upper()} by its calls, but the "
                         f"step would take {duration(-switched)} less with it on {other.value.upper()} alone: "
                         f"AUTO's candidates move the variables of a shared call together")
            continue
        if gain == 0 and switched == 0:
            lines.append(f"{head}same time as {other.value.upper()}")
            continue
        if switched >= 0 and added > 0:   # slower by its own calls, faster by the call it keeps the step off
            fused = would.fused_bytes > 0 and not shared.fused
            call = "fused allreduce" if fused else "shared call of the sparse AR variables"
            lines.append(f"{head}{duration(-gain)}/step more than {other.value.upper()} alone, but the step then "
                         f"needs no {call}")
            continue
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


class _SharedCalls:
    """The calls several variables ride under a plan (``chosen``: each variable's
    :class:`.timing.CallTime`): the fused allreduce and the grouped exchanges, and what one
    variable switching alone would add or spare of their latency."""

    def __init__(self, chosen, calibration):
        self.fused_riders = sum(1 for t in chosen if t.fused_bytes > 0)
        self.fused = self.fused_riders > 0
        self.riders: dict[str, int] = {}
        for t in chosen:
            if t.group is not None:
                self.riders[t.group.key] = self.riders.get(t.group.key, 0) + 1
        self.calibration = calibration

    def _fused_latency(self) -> float:
        return self.calibration.fit("allreduce", "all").latency_s

    def added_by(self, would) -> float:
        """Latency a variable taking ``would`` adds: the shared calls no variable rides yet."""
        added = self._fused_latency() if would.fused_bytes > 0 and not self.fused else 0.0
        if would.group is not None and would.group.key not in self.riders:
            added += would.group.latency_s
        return added

    def spared_by(self, current) -> float:
        """Latency the step is spared when the variable of ``current`` leaves it: the shared
        calls it alone rides."""
        spared = self._fused_latency() if current.fused_bytes > 0 and self.fused_riders == 1 else 0.0
        if current.group is not None and self.riders.get(current.group.key) == 1:
            spared += current.group.latency_s
        return spared


_CHOICES = Kept(2)   # the last two choices, as pricing() keeps its Pricings


def choose_auto(profile: Profile, cluster: ClusterSpec, calibration=None,
                local_aggregation: bool | None = None) -> AutoChoice:
    """AUTO's plan for ``profile`` on ``cluster`` (module docstring). ``local_aggregation``
    None evaluates on and off and takes the faster; a bool pins it. The same inputs give the
    same (frozen) choice back: a planner asks for it to make the plan and again to estimate
    AUTO beside AR, PS and HYBRID."""
    check_inputs(profile, cluster, "AUTO")
    calibration_for(cluster, calibration)   # a ConfigError for another type or shape, before it is a key
    # with both settings evaluated, the cluster's own switch changes nothing
    both = local_aggregation is None and cluster.workers_per_machine > 1
    key = (id(profile), cluster.replace(local_aggregation=True) if both else cluster, calibration, local_aggregation)
    kept = _CHOICES.get(key, profile)
    if kept is not None:
        return kept
    return _CHOICES.put(key, profile, _choose_auto(profile, cluster, calibration, local_aggregation))


def _choose_auto(profile: Profile, cluster: ClusterSpec, calibration, local_aggregation: bool | None) -> AutoChoice:
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
