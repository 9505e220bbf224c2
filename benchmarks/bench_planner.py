"""How fast the planner recomputes: a 1,000-variable time-optimal replan for a new ClusterSpec
(target < 50 ms).

Builds a synthetic profile (a mix of sparse tables with measured-looking unions and dense
layers), then times, for a sequence of different ClusterSpecs, AUTO's ``make_plan`` alone (it
prices every variable under AR and PS with local aggregation on and off and picks the least
estimated step time: the time-optimal replan) and ``Planner.set`` (what the planner widget
recomputes on every change: the plan, its estimate, AR/PS/HYBRID/AUTO and the baselines),
also where only the bandwidth changed (the cost entries are kept; only the times change).
AUTO's replan is timed priced by the defaults (no link pace), and by a calibration that read
its links' pace (each spec's defaults with its calls across machines read at 70 % of the
bandwidth), where AUTO also prices the plan of fewest bytes (:mod:`parallax_nb.cost.auto`);
and on two profiles where no two variables share a cost entry: every dense variable of its
own size, and every variable a sparse table (a recommender of 1,000 tables).
Prints the median (and p90) over the repeats; ``--json PATH`` writes them.

    python benchmarks/bench_planner.py [--variables 1000] [--repeats 50] [--json out.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from parallax_nb.calibration import Calibration  # noqa: E402
from parallax_nb.plan import make_plan  # noqa: E402
from parallax_nb.planner import Planner  # noqa: E402
from parallax_nb.types import ClusterSpec, Kind, Profile, VariableProfile  # noqa: E402

TARGET_MS = 50.0


def synthetic_profile(variables: int, seed: int = 0) -> Profile:
    """``variables`` variables, one in five a sparse table (alpha 1e-4..0.1, unions for G = 1..8)."""
    rng = random.Random(seed)
    out = []
    for i in range(variables):
        if i % 5 == 0:
            rows, width = rng.randint(1_000, 1_000_000), rng.choice([16, 64, 256])
            alpha = 10 ** rng.uniform(-4, -1)
            touched = alpha * rows
            unions = tuple(min(rows, touched * (1 + 0.85 * g)) for g in range(8))
            out.append(VariableProfile(f"table_{i}/embeddings", (rows, width), "float32", rows * width * 4,
                                       Kind.SPARSE, touched, alpha, alpha, alpha, alpha, touched * (width * 4 + 8),
                                       unions))
        else:
            shape = (rng.choice([64, 256, 1024]), rng.choice([64, 256, 1024]))
            size = shape[0] * shape[1] * 4
            out.append(VariableProfile(f"layer_{i}/kernel", shape, "float32", size, Kind.DENSE, shape[0],
                                       1.0, 1.0, 1.0, 1.0, size))
    return Profile("synthetic", 64, 20, 0.05, 0, tuple(out))


def distinct_dense_sizes(profile: Profile) -> Profile:
    """The same profile with every dense variable of its own size: dense variables of one size
    share their cost entries (a dense variable's cost depends on its bytes alone), so this is
    the planner's worst case among them."""
    return dataclasses.replace(profile, variables=tuple(
        v if v.is_sparse else dataclasses.replace(v, size_bytes=v.size_bytes * 1000 + 4 * i)
        for i, v in enumerate(profile.variables)))


def all_sparse(profile: Profile) -> Profile:
    """The same number of variables, every one a sparse table (a recommender of many tables):
    a sparse variable's costs depend on its own rows and unions, so none share an entry."""
    rng = random.Random(1)
    out = []
    for i, v in enumerate(profile.variables):
        if v.is_sparse:
            out.append(v)
            continue
        rows, width = rng.randint(1_000, 1_000_000), rng.choice([16, 64, 256])
        alpha = 10 ** rng.uniform(-4, -1)
        touched = alpha * rows
        unions = tuple(min(rows, touched * (1 + 0.85 * g)) for g in range(8))
        out.append(VariableProfile(f"table_{i}/embeddings", (rows, width), "float32", rows * width * 4, Kind.SPARSE,
                                   touched, alpha, alpha, alpha, alpha, touched * (width * 4 + 8), unions))
    return dataclasses.replace(profile, variables=tuple(out))


def clusters(count: int) -> list[ClusterSpec]:
    """Different specs each time (as a user dragging sliders): machines, workers, bandwidth, aggregation."""
    return [ClusterSpec(machines=1 + i % 64, workers_per_machine=1 + i % 8, bandwidth_bps=(1 + i % 4) * 10e9,
                        local_aggregation=bool(i % 3)) for i in range(count)]


def paced(spec: ClusterSpec, share: float = 0.7) -> Calibration:
    """``spec``'s default calibration with its calls across machines read at ``share`` of the
    bandwidth each way (:meth:`Calibration.with_link_pace`): a calibration with a link pace, as
    ``px.calibrate`` on emulated machines writes one."""
    cal = Calibration.defaults(spec.machines, spec.workers_per_machine, spec.bandwidth_bps, spec.latency_s)
    return cal.with_link_pace(share * spec.bandwidth_bps / 8)


def time_ms(fn, specs) -> list[float]:
    times = []
    for spec in specs:
        start = time.perf_counter()
        fn(spec)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def summarize(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"median_ms": statistics.median(ordered), "p90_ms": ordered[int(0.9 * (len(ordered) - 1))],
            "min_ms": ordered[0], "repeats": len(ordered)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variables", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)

    profile = synthetic_profile(args.variables)
    specs = clusters(args.repeats)
    make_plan(profile, specs[0])  # warm-up (imports, caches)

    plan_only = summarize(time_ms(lambda spec: make_plan(profile, spec, "auto"), specs))
    distinct = distinct_dense_sizes(profile)
    make_plan(distinct, specs[0])
    distinct_only = summarize(time_ms(lambda spec: make_plan(distinct, spec, "auto"), specs))
    tables = all_sparse(profile)
    make_plan(tables, specs[0])
    tables_only = summarize(time_ms(lambda spec: make_plan(tables, spec, "auto"), specs))
    calibrations = {spec: paced(spec) for spec in specs}
    assert all(c.link_bytes_per_s for spec, c in calibrations.items() if spec.machines > 1)
    make_plan(profile, specs[0], "auto", calibration=calibrations[specs[0]])
    with_pace = summarize(time_ms(lambda spec: make_plan(profile, spec, "auto", calibration=calibrations[spec]), specs))
    planner = Planner(profile, machines=2)

    def full(spec):
        aggregation = spec.local_aggregation if spec.machines % 2 else "auto"
        planner.set(machines=spec.machines, workers_per_machine=spec.workers_per_machine,
                    bandwidth=spec.bandwidth_bps, local_aggregation=aggregation)
        assert planner.ok, planner.error
    everything = summarize(time_ms(full, specs))

    def bandwidth_times(spec) -> float:
        """The planner at ``spec``, then the bandwidth alone changed (as the bandwidth box
        does): milliseconds of that second recompute."""
        full(spec)
        start = time.perf_counter()
        planner.set(bandwidth=spec.bandwidth_bps * 2.5)
        took = (time.perf_counter() - start) * 1e3
        assert planner.ok, planner.error
        return took
    bandwidth_only = summarize([bandwidth_times(spec) for spec in specs])

    print(f"planner benchmark: {args.variables} variables ({sum(v.is_sparse for v in profile.variables)} sparse), "
          f"{args.repeats} different ClusterSpecs, Python {platform.python_version()} on {platform.machine()}")
    print(f"  {'what':<50} {'median ms':>10} {'p90 ms':>8} {'min ms':>8}")
    for label, r in (("time-optimal replan (make_plan AUTO)", plan_only),
                     ("  the same, every dense variable of its own size", distinct_only),
                     ("  the same, every variable a sparse table", tables_only),
                     ("  the same, a calibration that read the link's pace", with_pace),
                     ("planner recompute (Planner.set)", everything),
                     ("  the same, the bandwidth alone changed", bandwidth_only)):
        print(f"  {label:<50} {r['median_ms']:>10.2f} {r['p90_ms']:>8.2f} {r['min_ms']:>8.2f}")
    verdicts = ", ".join(f"{label} {r['median_ms']:.2f} ms ({'meets' if r['median_ms'] < TARGET_MS else 'MISSES'})"
                         for label, r in (("the mix", plan_only), ("with a link pace", with_pace),
                                          ("every dense variable of its own size", distinct_only),
                                          ("every variable a sparse table", tables_only)))
    print(f"  target: a {args.variables}-variable time-optimal replan in < {TARGET_MS:.0f} ms (medians): {verdicts}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"variables": args.variables, "make_plan": plan_only, "make_plan_distinct_dense": distinct_only,
                       "make_plan_all_sparse": tables_only,
                       "make_plan_link_pace": with_pace,
                       "planner_set": everything, "planner_set_bandwidth": bandwidth_only,
                       "target_ms": TARGET_MS, "python": platform.python_version()}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
