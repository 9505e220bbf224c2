"""Plans proven against time: predict first, then run, then print both side by side.

For each setting (workload x network), in one invocation:

1. **predict** with the cost model, before anything runs: the step time of every
   configuration (:func:`parallax_nb.cost.compare_architectures`, plain Horovod and
   ``sparse_as_dense`` without local aggregation) and the bytes one machine's link carries per
   step as its kernel counters count them (:func:`parallax_nb.cost.link.predict_link_bytes`:
   payload x TCP/IP framing + Horovod's coordination rate x the predicted step time; with a
   calibration that read its links, the measured framing and each call's measured bytes). With a
   calibration (``--calibration FILE`` for its cluster shape, or ``--calibrate``: measured
   per setting with ``px.calibrate`` where that API is installed) the estimate is calibrated;
   otherwise it uses the documented defaults and every row says "uncalibrated";
2. **run** every configuration (:mod:`bench_comm`'s launch: the ranks in network namespaces,
   :mod:`worker` on every rank, :mod:`counters` for the links);
3. **print** predicted against measured step time (median over the timed windows; each
   configuration's windows last about ``--window-s`` at its predicted pace, its warm-up
   ``--warmup-s``: :func:`bench_comm.sized_schedule`), predicted
   against measured link bytes per machine (on loopback, where there is no link: bytes per
   rank through ``lo``, against the payload framed and each call's bytes priced as a
   calibration read them on that ``lo``, or the payload alone without one), and whether AUTO's
   plan was the measured fastest configuration or within 5 % of it (and where a Horovod
   baseline was fastest, the same against parallax_nb's plans alone:
   :func:`predict_repeats.auto_verdict`);
4. with a calibration, tell the model from the machine: each configuration's compute is timed
   again in its own launch right before it runs (the calibration's compute figure, no
   communication: :func:`worker.launch_compute`), and each row also shows the step time the
   model predicts with that figure and its error (``--no-compute-control`` skips it). On a
   machine whose speed drifts between launches, a prediction can miss by the drift alone.

Settings: workloads ``lm`` (LM realistic, :data:`bench_comm.WORKLOADS`), ``cnn``,
``recommender``; networks ``loop2``, ``loop4`` (2 or 4 ranks on one host, each taken as a
machine), ``1x2``, ``1x4`` (2 or 4 ranks as one machine, local aggregation planned and run:
no link, the step time alone is compared) and emulated ``MxG@BANDWIDTH``; configurations AR,
PS, HYBRID, AUTO, plain Horovod and ``sparse_as_dense``.

The default grid is every workload at ``loop2``, ``loop4``, ``2x2@100Mbit/s`` and
``2x2@1Gbit/s``, without ``sparse_as_dense``: about 15 minutes on 2 cores uncalibrated (an
estimate from its parts, measured one invocation each: benchmarks/README.md), and more than 40
minutes with ``--calibrate --interleave`` (one invocation on 2026-11-28 was still in its 11th of
12 settings at 40 minutes). ``--json`` is written after every setting, so a stopped invocation
keeps the settings it finished (``"complete": false``). It leaves out ``1x2``, ``1x4``
(about 10 minutes for the three workloads), ``2x2@10Gbit/s`` and ``4x2@1Gbit/s`` (8 ranks on 2
cores), which ``--networks all`` adds, and
``sparse_as_dense``, which ``--configs all`` adds (its densified tables make an LM step seconds
long).

    python benchmarks/bench_predict.py --quick                     # tiny workloads: the harness
    python benchmarks/bench_predict.py --workloads lm --networks 2x2@1Gbit/s --json out.json --markdown out.md

Needs root (network namespaces), Open MPI and Horovod. Every run is kept in the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import bench_comm  # noqa: E402
from predict_repeats import auto_verdict  # noqa: E402
import report  # noqa: E402
from parallax_nb.errors import ConfigError  # noqa: E402
from parallax_nb.types import PLAIN_HOROVOD, SPARSE_AS_DENSE, ClusterSpec  # noqa: E402

WORKLOADS = {
    "lm": bench_comm.WORKLOADS["lm"],
    "cnn": bench_comm.WORKLOADS["cnn"],
    "recommender": dict(workload="recommender", size="small", batch_size=64, overrides={}),
}
QUICK = {"lm": bench_comm.QUICK["lm"], "cnn": bench_comm.QUICK["cnn"],
         "recommender": dict(workload="recommender", size="tiny", batch_size=16, overrides={})}
DEFAULT_NETWORKS = ("loop2", "loop4", "2x2@100Mbit/s", "2x2@1Gbit/s")
FULL_NETWORKS = ("loop2", "loop4", "1x2", "1x4", "2x2@100Mbit/s", "2x2@1Gbit/s", "2x2@10Gbit/s", "4x2@1Gbit/s")
QUICK_NETWORKS = ("loop2", "2x2@1Gbit/s")
DEFAULT_CONFIGS = ("ar", "ps", "hybrid", "auto", "horovod")
QUICK_CONFIGS = ("ar", "hybrid", "auto", "horovod")
ESTIMATE_KEY = {"ar": "ar", "ps": "ps", "hybrid": "hybrid", "auto": "auto", "horovod": PLAIN_HOROVOD,
                "sparse_as_dense": SPARSE_AS_DENSE}
LOOPBACK_BANDWIDTH = "100Gbit/s"   # what the model assumes between ranks of one machine, uncalibrated


class Setting(NamedTuple):
    """Where a setting runs: ``machines`` x ``workers`` ranks over an emulated link of
    ``bandwidth``, or on loopback (``bandwidth`` None) ``workers`` ranks of one host, taken as a
    machine each (``loopW``) or as one machine whose local aggregation is planned and run
    (``1xW``, a multi-GPU machine: nothing crosses a link)."""

    machines: int
    workers: int
    bandwidth: str | None
    one_machine: bool = False


def parse_setting_network(text: str) -> Setting:
    """``"loop4"`` -> 4 ranks each its own machine; ``"1x4"`` -> one machine of 4 ranks;
    ``"2x2@1Gbit/s"`` as :func:`bench_comm.parse_network`."""
    if text.startswith("loop") or ("@" not in text and text.lower().startswith("1x")):
        try:
            ranks = int(text[4:] if text.startswith("loop") else text[2:])
        except ValueError:
            ranks = 0
        if ranks < 1:
            raise ConfigError(f"cannot read network {text!r}",
                              hint="loopback is loopN (each rank a machine) or 1xN (one machine of N ranks)")
        return Setting(1, ranks, None, one_machine=not text.startswith("loop"))
    return Setting(*bench_comm.parse_network(text))


def model_cluster(setting: Setting) -> ClusterSpec:
    """The cluster the prediction is for: the emulated machines (local aggregation on), one
    machine of every rank (``1xW``), or on loopback each rank taken as a machine (as the runtime
    does on one host when the plan is for as many machines as ranks)."""
    if setting.one_machine:
        return ClusterSpec.create(machines=1, workers_per_machine=setting.workers, bandwidth=LOOPBACK_BANDWIDTH)
    if setting.bandwidth is None:
        return ClusterSpec.create(machines=setting.workers, workers_per_machine=1, bandwidth=LOOPBACK_BANDWIDTH)
    return ClusterSpec.create(machines=setting.machines, workers_per_machine=setting.workers,
                              bandwidth=setting.bandwidth)


def run_horovod_env() -> dict:
    """The Horovod settings every benchmark run gets (:func:`bench_comm.rank_env`)."""
    from parallax_nb.calibration import horovod_settings

    return horovod_settings(bench_comm.rank_env())


def setting_calibration(args, spec: dict, network: str, setting: Setting):
    """``(Calibration or None, how)``: ``--calibration`` when it is for this shape, else one
    measured now with ``px.calibrate`` (``--calibrate``, when that API is installed), else None.

    ``--calibrate`` measures on the launch the runs will have: the same network namespaces
    (on loopback one unshaped namespace, ``emulate="1xW"``, as :func:`bench_comm.launch`
    places the ranks; ``1xW`` measured as one machine) and the same Horovod settings
    (:func:`run_horovod_env`). A calibration that Open MPI's failed connection between two
    ranks stopped (:class:`~parallax_nb.errors.RankConnectionError`) is taken once more, and
    the label says so."""
    from parallax_nb.calibration import Calibration

    machines, workers, bandwidth, _ = setting
    cluster = model_cluster(setting)
    shape = (cluster.machines, cluster.workers_per_machine)
    if args.calibration:
        cal = Calibration.from_json(args.calibration)
        if (cal.machines, cal.workers_per_machine) == shape:
            return cal, cal.label
    if args.calibrate:
        try:
            from parallax_nb.calibrate import calibrate
        except ImportError:
            return None, "uncalibrated (px.calibrate is not installed)"
        import worker

        from parallax_nb.errors import RankConnectionError

        retried = ""
        for attempt in (1, 2):
            try:
                cal = calibrate(np=machines * workers, emulate=f"1x{workers}" if bandwidth is None else network,
                                job=worker.make_job(spec),
                                # on loopback the machines are the model's; on a network the namespaces'
                                workers_per_machine=cluster.workers_per_machine if bandwidth is None else None,
                                env=run_horovod_env())
            except RankConnectionError as e:
                if attempt == 1:
                    # a connection between the emulated machines failed on a loaded host: once more
                    print(f"   calibration stopped on a failed connection between ranks; calibrating again: "
                          f"{str(e).splitlines()[0]}", flush=True)
                    retried = " (calibrated twice: the first stopped on a failed TCP connection between ranks)"
                    continue
                return None, f"uncalibrated (calibrate failed: {type(e).__name__}: {e})"
            except Exception as e:  # noqa: BLE001 - the benchmark goes on uncalibrated and says why
                return None, f"uncalibrated (calibrate failed: {type(e).__name__}: {e})"
            return cal, cal.label + retried
    return None, "uncalibrated (defaults)"


def predict(profile, setting: Setting, configs: list[str], calibration) -> dict:
    """Per configuration, before running: the estimate's step time and payload, and the link
    bytes per machine per step (``link``; on loopback per rank, as :func:`read_loopback` says;
    on one machine none: no link)."""
    from parallax_nb import cost
    from parallax_nb.cost.link import predict_link_bytes

    spec = model_cluster(setting)
    extra = {"calibration": calibration}
    ours = cost.compare_architectures(profile, spec, include_horovod=True, **extra)
    out = {}
    for c in configs:
        est = ours[ESTIMATE_KEY[c]]   # the baselines' entries model Horovod as users run it
        if setting.one_machine:
            link = {"payload_bytes": None, "total_bytes": None}
        elif setting.bandwidth is None and not read_loopback(calibration):
            link = {"payload_bytes": est.bytes_per_machine_per_step, "total_bytes": est.bytes_per_machine_per_step}
        else:
            # the estimate's own: with a calibration that read its links, every call priced as measured
            link = (est.link or predict_link_bytes(est.bytes_per_machine_per_step, est.step_time_s, calibration)).to_dict()
        out[c] = {"step_time_s": est.step_time_s, "link": link, "link_bound": est.link_bound,
                  "link_floor_s": est.link_floor_s}
    return out


def read_loopback(calibration) -> bool:
    """Whether ``calibration`` read the loopback of the ranks' one machine as a link per rank
    (``px.calibrate`` on one emulated machine, each rank taken as a machine): its link fits
    carry bytes. Then a loopback row predicts ``lo``'s bytes per rank as a link's, framing and
    the calls' overhead included; without them, the payload."""
    fits = getattr(calibration, "link_fits", None) or {}
    return any(fit.bytes_per_handed_byte > 0 or fit.overhead_bytes > 0 for fit in fits.values())


def baseline_of(config: str) -> str | None:
    """The Horovod baseline key a configuration runs (its own compute program), None for parallax's."""
    return ESTIMATE_KEY[config] if config in ("horovod", "sparse_as_dense") else None


def with_launch_compute(calibration, model_name: str, config: str, seconds: float):
    """``calibration`` with ``config``'s compute replaced by ``seconds`` (the runtime's program,
    or for a Horovod configuration that baseline's): the prediction again, compute aside."""
    import dataclasses

    baseline = baseline_of(config)
    if baseline is None:
        return dataclasses.replace(calibration, compute_time_s={**calibration.compute_time_s, model_name: seconds})
    own = {**calibration.baseline_compute_time_s.get(model_name, {}), baseline: seconds}
    return dataclasses.replace(calibration, baseline_compute_time_s={**calibration.baseline_compute_time_s,
                                                                     model_name: own})


def launch_compute_rows(profile, setting: Setting, run: dict, calibration) -> dict:
    """Per configuration run with a calibration: its compute as calibrated and as timed in its
    own launch right before it ran (:func:`worker.launch_compute`), and the step time the model
    predicts with the launch's figure. Tells the model's error apart from the machine's drift
    between calibration and run: a diagnostic, not the prediction a user sees."""
    out = {}
    for c, result in run["configs"].items():
        seconds = result.get("launch_compute_s") if isinstance(result, dict) else None
        if calibration is None or seconds is None:
            continue
        again = predict(profile, setting, [c],
                        with_launch_compute(calibration, profile.model_name, c, seconds))[c]
        out[c] = {"calibrated_compute_s": calibration.compute_for(profile.model_name, baseline_of(c)),
                  "launch_compute_s": seconds, "predicted_with_launch_compute_s": again["step_time_s"]}
    return out


def measured(config: dict, on_network: bool | None) -> dict:
    """Median step time over the timed windows, and the link's bytes per machine per step (on
    loopback: kernel bytes per rank per step; ``on_network`` None: one machine, no link)."""
    windows = config.get("windows") or []
    if not windows:
        return {"step_time_s": None, "link_bytes": None}
    key = "kernel_link_bytes_per_machine_per_step" if on_network else "kernel_bytes_per_rank_per_step"
    return {"step_time_s": statistics.median(1.0 / w["steps_per_s"] for w in windows),
            "link_bytes": None if on_network is None else statistics.median(w[key] for w in windows)}


def error_pct(predicted, measured_value):
    if not predicted or measured_value is None:
        return None
    return 100.0 * (measured_value - predicted) / predicted


def compare_setting(prediction: dict, run: dict, on_network: bool | None,
                    launch_compute: dict | None = None) -> dict:
    """Rows of predicted against measured, and the AUTO verdict (``on_network``: as
    :func:`measured`); with ``launch_compute``
    (:func:`launch_compute_rows`) each row also has its error with the launch's compute."""
    rows = {}
    for c, p in prediction.items():
        result = run["configs"].get(c, {"error": "not run"})
        m = measured(result, on_network) if "error" not in result else {"step_time_s": None, "link_bytes": None}
        rows[c] = {"predicted_step_time_s": p["step_time_s"], "predicted_link_bound": p.get("link_bound", False),
                   "measured_step_time_s": m["step_time_s"],
                   "step_time_error_pct": error_pct(p["step_time_s"], m["step_time_s"]),
                   "predicted_link_bytes": p["link"]["total_bytes"], "measured_link_bytes": m["link_bytes"],
                   "link_error_pct": error_pct(p["link"]["total_bytes"], m["link_bytes"]),
                   "link_prediction": p["link"], "same_as": result.get("same_as"), "error": result.get("error")}
        control = (launch_compute or {}).get(c)
        if control:
            rows[c].update(control, step_time_error_with_launch_compute_pct=error_pct(
                control["predicted_with_launch_compute_s"], m["step_time_s"]))
    return {"rows": rows, "auto": auto_verdict(rows)}


def _ms(x):
    return "-" if x is None else f"{x * 1e3:.1f}"


def _kb(x):
    return "-" if x is None else f"{x / 1e3:,.1f}"


def _pct(x):
    return "-" if x is None else f"{x:+.1f} %"


def _compute_pair(row: dict) -> str:
    if row.get("launch_compute_s") is None:
        return "-"
    return f"{_ms(row['calibrated_compute_s'])} / {_ms(row['launch_compute_s'])}"


def markdown(doc: dict) -> str:
    """One table: a row per setting and configuration; "(link)" marks a prediction the link's pace
    sets, not the step's calls (:func:`parallax_nb.cost.timing.link_floor_s`)."""
    lines = ["| workload | network | config | step predicted (ms) | step measured (ms) | error | "
             "compute calibrated / in the launch (ms) | error with the launch's compute | "
             "link pred. (KB/step) | link measured (KB/step) | error | AUTO within 5 % of fastest | calibration |",
             "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|---|"]
    for s in doc["settings"]:
        verdict = s["comparison"]["auto"]
        auto_text = "-" if verdict is None else (
            f"{'yes' if verdict['ok'] else 'NO'} (fastest {verdict['fastest']}, AUTO {verdict['auto_behind_pct']:+.1f} %)"
            + ("" if verdict["fastest"] == verdict.get("plan_fastest", verdict["fastest"]) else
               f"; of the plans {'yes' if verdict['plan_ok'] else 'NO'} (fastest {verdict['plan_fastest']}, "
               f"AUTO {verdict['plan_auto_behind_pct']:+.1f} %)"))
        for c, r in s["comparison"]["rows"].items():
            name = c + (f" (= {r['same_as']})" if r["same_as"] else "") + (" FAILED" if r["error"] else "")
            bound = " (link)" if r.get("predicted_link_bound") else ""
            lines.append(f"| {s['workload']} | {s['network']} | {name} | {_ms(r['predicted_step_time_s'])}{bound} | "
                         f"{_ms(r['measured_step_time_s'])} | {_pct(r['step_time_error_pct'])} | "
                         f"{_compute_pair(r)} | {_pct(r.get('step_time_error_with_launch_compute_pct'))} | "
                         f"{_kb(r['predicted_link_bytes'])} | {_kb(r['measured_link_bytes'])} | "
                         f"{_pct(r['link_error_pct'])} | {auto_text if c == 'auto' else ''} | {s['calibration']} |")
    return "\n".join(lines)


def run_one(args, name: str, spec: dict, profile, network: str, workdir: str) -> dict:
    setting = parse_setting_network(network)
    machines, workers, bandwidth, one_machine = setting
    calibration, how = setting_calibration(args, spec, network, setting)
    prediction = predict(profile, setting, args.configs, calibration)
    mismatch = calibration.settings_mismatch(run_horovod_env()) if calibration is not None else ""
    print(f"== {name} {network}: predicted first ({how}): "
          + ", ".join(f"{c} {p['step_time_s'] * 1e3:.1f} ms" for c, p in prediction.items()), flush=True)
    if mismatch:
        print(f"   WARNING: {mismatch}", flush=True)
    drift = calibration.compute_drift(profile.model_name) if calibration is not None else ""
    if drift:
        print(f"   NOTE: {drift}", flush=True)
    run = bench_comm.run_setting(f"predict-{network}".replace("@", "-").replace("/", ""), name, spec, profile,
                                 args.configs, machines, workers, bandwidth, args, workdir, calibration,
                                 plan_cluster=model_cluster(setting),   # plans for the cluster predicted
                                 # each configuration's windows sized by its own prediction
                                 step_estimates={c: p["step_time_s"] for c, p in prediction.items()})
    comparison = compare_setting(prediction, run, None if one_machine else bandwidth is not None,
                                 launch_compute_rows(profile, setting, run, calibration))
    return {"workload": name, "network": network, "calibration": how, "calibration_warning": mismatch,
            "calibration_compute_drift": drift,
            "run_horovod_env": run_horovod_env(),
            "calibration_figures": calibration.to_dict() if calibration is not None else None,
            "prediction": prediction, "run": run, "comparison": comparison}


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=sorted(WORKLOADS))
    parser.add_argument("--networks", nargs="+", default=None,
                        help=f"loopN (N ranks, each a machine), 1xN (one machine of N ranks, local "
                             f"aggregation planned), MxG@BANDWIDTH, or 'all' ({' '.join(FULL_NETWORKS)}); "
                             f"default {' '.join(DEFAULT_NETWORKS)}")
    parser.add_argument("--configs", nargs="+", default=None,
                        help=f"of {' '.join(ESTIMATE_KEY)}, or 'all'; default {' '.join(DEFAULT_CONFIGS)}")
    parser.add_argument("--calibration", help="a calibration.json; used for the settings of its cluster shape")
    parser.add_argument("--calibrate", action="store_true", help="calibrate every setting first with px.calibrate")
    parser.add_argument("--quick", action="store_true", help="tiny workloads, loop2 and 2x2@1Gbit/s: the harness")
    parser.add_argument("--no-compute-control", dest="compute_control", action="store_false",
                        help="with a calibration, do not time each configuration's compute in its own launch "
                             "(the rows then lack the error with the launch's compute)")
    bench_comm.add_launch_options(parser, warmup=5, steps=5)
    parser.add_argument("--json", metavar="PATH", help="write every prediction and run here")
    parser.add_argument("--markdown", metavar="PATH", help="write the table here")
    parser.add_argument("--workdir")
    return parser


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    networks = list(args.networks or (QUICK_NETWORKS if args.quick else DEFAULT_NETWORKS))
    networks = list(FULL_NETWORKS) if networks == ["all"] else networks
    configs = list(args.configs or (QUICK_CONFIGS if args.quick else DEFAULT_CONFIGS))
    args.configs = list(ESTIMATE_KEY) if configs == ["all"] else configs
    for c in args.configs:
        if c not in ESTIMATE_KEY:
            raise ConfigError(f"unknown configuration {c!r}", hint=f"choose from {' '.join(ESTIMATE_KEY)} or all")
    for n in networks:
        parse_setting_network(n)
    if os.geteuid() != 0:
        print("bench_predict: needs root for the network namespaces", file=sys.stderr)
        return 2
    workdir = bench_comm.work_directory(args.workdir, "bench_predict")
    from parallax_nb.jsonfile import atomic_write_text

    started = time.monotonic()
    settings = []
    planned = len(args.workloads) * len(networks)

    def document() -> dict:
        return {"schema": "parallax_nb.bench_predict",
                "finished_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "command": " ".join(["benchmarks/bench_predict.py", *(argv if argv is not None else sys.argv[1:])]),
                "machine": report.machine_description(), "wall_s": time.monotonic() - started, "quick": args.quick,
                "schedule": {"warmup": args.warmup, "steps": args.steps, "repeats": args.repeats,
                             "warmup_s": args.warmup_s, "window_s": args.window_s},
                "workloads": {w: (QUICK if args.quick else WORKLOADS)[w] for w in args.workloads},
                "settings_planned": planned, "complete": len(settings) == planned, "settings": settings}

    for name in args.workloads:
        spec = (QUICK if args.quick else WORKLOADS)[name]
        profile = bench_comm.profile_workload(spec, workdir, args.profile_steps)
        for network in networks:
            settings.append(run_one(args, name, spec, profile, network, workdir))
            if args.json and len(settings) < planned:
                # an invocation stopped part way keeps the settings it finished ("complete": false)
                atomic_write_text(args.json, json.dumps(document(), indent=1))
    doc = document()
    table = markdown(doc)
    print()
    print(table)
    print(f"\n{doc['machine']}; {doc['wall_s']:.0f} s in all")
    if args.json:
        atomic_write_text(args.json, json.dumps(doc, indent=1))
        print(f"wrote {args.json}")
    if args.markdown:
        schedule = doc["schedule"]
        atomic_write_text(args.markdown, f"`{doc['command']}` on {doc['machine']}, {doc['finished_utc']}, "
                                         f"{doc['wall_s']:.0f} s; measured step time = median over "
                                         f"{schedule['repeats']} windows of at least {schedule['steps']} steps "
                                         f"and about {schedule['window_s']:g} s at the predicted pace, after "
                                         f"at least {schedule['warmup']} warm-up steps and "
                                         f"{schedule['warmup_s']:g} s\n\n{table}\n")
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
