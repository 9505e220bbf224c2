"""``python -m parallax_nb plan profile.json --machines N ... [--calibration calibration.json]``:
plan from a profile, print the per-variable table (the 40 variables moving the most bytes, the
rest counted; ``--all`` lists every one), AUTO's reasons and the estimated totals per
architecture and baseline (priced by the calibration, or the defaults: "uncalibrated"), write
plan.json atomically. A calibration of another cluster shape is refused, naming both shapes.
``--async [--max-staleness K]`` makes the plan asynchronous (:mod:`parallax_nb.sync_flags`); a plan with
AllReduce variables is then refused before anything is written. An asynchronous plan's output
ends with the outlook of synchronous against asynchronous training with one worker
``--straggler X`` times slower per step (:func:`parallax_nb.cost.asynchronous.straggler_outlook`)."""
from __future__ import annotations

import argparse

from ..errors import ConfigError, ParallaxError, ProfileError
from ..types import SUMMARY_ROWS
from ..sync_flags import add_sync_arguments, apply_sync_flags, check_sync_flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", help="profile.json written by `python -m parallax_nb profile`")
    parser.add_argument("--machines", type=int, required=True, help="machines in the cluster (N)")
    parser.add_argument("--workers-per-machine", type=int, default=1, help="workers (GPUs) per machine (G)")
    parser.add_argument("--bandwidth", default="10Gbit/s", help='link bandwidth with units, e.g. "10Gbit/s"')
    parser.add_argument("--latency-us", type=float, default=25.0, help="latency per message round, microseconds")
    parser.add_argument("--no-local-aggregation", action="store_true",
                        help="every worker communicates on its own (no combining inside a machine); without "
                             "it AUTO chooses, other architectures combine")
    parser.add_argument("--calibration", default=None, metavar="FILE",
                        help="calibration.json of this cluster (python -m parallax_nb calibrate); "
                             "default: documented defaults, estimates marked uncalibrated")
    parser.add_argument("--arch", default="auto", help="auto | hybrid | ps | ar (default auto)")
    parser.add_argument("--partitions", type=int, default=None,
                        help="partitions of every PS variable (default: one per worker)")
    add_sync_arguments(parser)
    parser.add_argument("--straggler", type=float, default=None, metavar="X",
                        help="with --async: the sync/async outlook assumes one worker X times slower per step "
                             "(default 2)")
    parser.add_argument("--all", action="store_true", dest="every_variable",
                        help=f"list every variable (default: the {SUMMARY_ROWS} moving the most bytes, the rest "
                             f"counted)")
    parser.add_argument("-o", "--output", default=None, help="where to write plan.json")


def totals_table(estimates: dict, own=None) -> str:
    """Estimated totals, one row per architecture (and the plan itself when given)."""
    from ..types import format_bytes

    rows = [(getattr(k, "value", k), e) for k, e in estimates.items()]
    if own is not None:
        rows.append((f"this plan ({own.architecture})", own))
    width = max(len(name) for name, _ in rows)
    lines = [f"  {'architecture':<{width}}  {'bytes/machine/step':>18}  {'calls':>6}  {'comm ms':>9}  "
             f"{'step ms':>9}  {'examples/s':>11}  {'vs AR':>6}  {'vs PS':>6}"]
    for name, e in rows:
        lines.append(f"  {name:<{width}}  {format_bytes(e.bytes_per_machine_per_step):>18}  "
                     f"{e.collective_calls_per_step:>6}  "
                     f"{e.comm_time_s * 1e3:>9.3f}  {e.step_time_s * 1e3:>9.3f}  {e.examples_per_s:>11.1f}  "
                     f"{e.speedup_vs_ar:>5.2f}x  {e.speedup_vs_ps:>5.2f}x")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from ..calibration import Calibration
    from ..cost import compare_architectures, estimate
    from ..cost.timing import calibration_for
    from ..plan import make_plan
    from ..types import ClusterSpec, Profile

    check_sync_flags(args)
    straggler = 2.0 if args.straggler is None else args.straggler
    if not (straggler >= 1 and straggler < float("inf")):
        raise ConfigError(f"--straggler must be a finite number >= 1 (how many times slower the slow worker's "
                          f"step is), got {straggler}", hint="e.g. --straggler 2 for one worker 2x slower")
    if args.straggler is not None and not args.asynchronous:
        raise ConfigError(f"--straggler {straggler:g} applies to the outlook of asynchronous training, and "
                          f"--async was not given", hint="add --async, or drop --straggler")
    if not 0 <= args.latency_us < float("inf"):
        raise ConfigError(f"--latency-us must be a finite number of microseconds >= 0, got {args.latency_us:g}",
                          hint="e.g. --latency-us 25 (a data-centre network)")
    cluster = ClusterSpec.create(machines=args.machines, workers_per_machine=args.workers_per_machine,
                                 bandwidth=args.bandwidth, latency_s=args.latency_us * 1e-6,
                                 local_aggregation=not args.no_local_aggregation)
    calibration = Calibration.from_json(args.calibration) if args.calibration else None
    calibration_for(cluster, calibration)   # another shape: refused before anything is written
    try:
        profile = Profile.from_json(args.profile)
    except ParallaxError:
        raise
    except (TypeError, ValueError, AttributeError) as e:  # a JSON file whose entries have the wrong shape
        raise ProfileError(f"cannot read profile {args.profile}: {type(e).__name__}: {e}",
                           hint="regenerate it with `python -m parallax_nb profile`") from None
    plan = make_plan(profile, cluster, args.arch, partitions=args.partitions,
                     local_aggregation=False if args.no_local_aggregation else None, calibration=calibration)
    plan = apply_sync_flags(plan, args)
    own = estimate(profile, plan, calibration=calibration)
    print(plan.summary(limit=None if args.every_variable else SUMMARY_ROWS))
    print()
    print(f"Estimated totals on {plan.cluster} (compute {own.compute_time_s * 1e3:.3f} ms/step, no overlap; "
          f"{own.calibration}):")
    print(totals_table(compare_architectures(profile, plan.cluster, include_horovod=True, calibration=calibration),
                       own))
    if not plan.sync and plan.cluster.workers > 1:
        from ..cost.asynchronous import straggler_outlook

        print()
        print("\n".join(straggler_outlook(own, straggler, max_staleness=plan.max_staleness).lines()))
    if args.output:
        plan.to_json(args.output)
        print(f"\nwrote {args.output}")
    return 0
