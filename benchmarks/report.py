"""The printed table of :mod:`bench_comm`, its ratios and the issue-8 targets (MET / MISSED).

Every figure is a median over the timed windows of one configuration. Bytes are sent +
received per rank per step (MB = 1e6 bytes): ``acct`` from the runtime's accounting (the
baselines count Horovod's collectives the same way), ``kernel`` from the namespaces'
interface counters (payload plus TCP/IP headers and MPI/Horovod control traffic), ``pred``
from the cost model (:func:`parallax_nb.cost.compare_architectures` with one participant per
rank; plain Horovod is predicted as AR, which assumes unique rows per sparse gradient).
``sparse`` is the share of the accounted bytes that belongs to sparse variables.

On an emulated network parallax runs with local aggregation and its accounting counts only
bytes exchanged with other machines, so its ``pred`` is the cost model's per-machine figure
for the network's machines (local aggregation on) divided by the ranks per machine; plain
Horovod (no local aggregation, every peer counted) keeps the per-rank AR figure. ``MB/link/step``
is what one machine's shaped link carried (kernel counters) beside the model's ``link pred``,
and the HYBRID ratios on a network compare link bytes.
"""
from __future__ import annotations

import os
import platform
import statistics

from parallax_nb import labels

NAMES = {"horovod": labels.text("horovod"), "sparse_as_dense": labels.text("sparse_as_dense"),
         **{key: f"parallax {labels.text(key)}" for key in ("ar", "ps", "hybrid", "auto")}}
TARGETS = {
    "sparse_bytes_ratio": 1.8,       # LM, 4 ranks: Horovod sparse bytes / HYBRID sparse bytes >=
    "prediction_tolerance": 0.05,    # |accounted / predicted - 1| <=
    "lm_network_speedup": 1.3,       # LM, 4 ranks, emulated 1 Gbit/s: HYBRID / Horovod examples/s >=
    "cnn_network_slowdown": 0.10,    # CNN, same: HYBRID / Horovod examples/s >= 1 - this
}


def machine_description() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem_gib:.0f} GiB, {platform.system()} {platform.release()}"


def median_of(config: dict, key: str) -> float:
    values = [w[key] for w in config.get("windows", []) if key in w]
    return float(statistics.median(values)) if values else float("nan")


def sparse_bytes(config: dict, sparse_names) -> float:
    """Accounted sparse-variable bytes per rank per step (median over windows)."""
    values = [sum(v for k, v in w["accounted_bytes_by_variable"].items() if k in sparse_names)
              for w in config.get("windows", [])]
    return float(statistics.median(values)) if values else float("nan")


def _ratio(a: float, b: float) -> float:
    return a / b if b and b == b and a == a else float("nan")


def _mb(x: float) -> str:
    return "-" if x != x else f"{x / 1e6:9.3f}"


def setting_rows(setting: dict) -> list[dict]:
    sparse_names = set(setting["sparse_variables"])
    rows = []
    for name, config in setting["configs"].items():
        if "error" in config:
            rows.append({"config": name, "error": config["error"]})
            continue
        acct = median_of(config, "accounted_bytes_per_rank_per_step")
        pred = setting["prediction"].get(name, float("nan"))
        link_pred = (setting.get("link_prediction") or {}).get(name, float("nan"))
        if setting["bandwidth"] and name not in ("horovod", "sparse_as_dense"):
            # parallax counts only bytes to other machines: its share of the machine's figure
            pred = link_pred / setting["workers_per_machine"]
        rows.append({
            "config": name,
            "steps_per_s": median_of(config, "steps_per_s"),
            "examples_per_s": median_of(config, "examples_per_s"),
            "accounted": acct, "kernel": median_of(config, "kernel_bytes_per_rank_per_step"),
            "link": median_of(config, "kernel_link_bytes_per_machine_per_step"), "link_predicted": link_pred,
            "predicted": pred, "sparse": sparse_bytes(config, sparse_names),
            "sparse_predicted": setting["prediction"]["sparse"].get(name if name in setting["prediction"]["sparse"]
                                                                    else "ar", float("nan")),
        })
    return rows


def settling(config: dict) -> float:
    """Median seconds of the warm-up steps after the first (which traces the step) over the
    median timed step: how much slower a configuration ran before its windows started."""
    steps, sched = config.get("step_seconds"), config.get("schedule") or {}
    warmup = sched.get("warmup_steps", 0)
    if not steps or warmup < 2:
        return float("nan")
    timed = steps[warmup:]
    return _ratio(statistics.median(steps[1:warmup]), statistics.median(timed)) if timed else float("nan")


def _row(setting: dict, name: str) -> dict | None:
    for r in setting_rows(setting):
        if r["config"] == name and "error" not in r:
            return r
    return None


def targets(settings: list[dict]) -> list[dict]:
    """The issue-8 targets with the measured value and MET / MISSED (or NOT RUN)."""
    out = []

    def find(workload, ranks, loopback):
        for s in settings:
            if s["workload"] == workload and s["ranks"] == ranks and (s["bandwidth"] is None) == loopback:
                return s
        return None

    def add(label, value, ok, detail=""):
        out.append({"target": label, "value": value, "status": "NOT RUN" if ok is None else ("MET" if ok else "MISSED"),
                    "detail": detail})

    lm4 = find("lm", 4, True)
    hv, hy = (_row(lm4, "horovod"), _row(lm4, "hybrid")) if lm4 else (None, None)
    if hv and hy:
        ratio = _ratio(hv["sparse"], hy["sparse"])
        add("LM 4 ranks: Horovod / HYBRID bytes on sparse variables >= 1.8x", ratio,
            ratio >= TARGETS["sparse_bytes_ratio"],
            f"total bytes {_ratio(hv['accounted'], hy['accounted']):.2f}x accounted, "
            f"{_ratio(hv['kernel'], hy['kernel']):.2f}x kernel; cost model AR/HYBRID "
            f"{_ratio(lm4['prediction']['ar'], lm4['prediction']['hybrid']):.2f}x total, "
            f"{_ratio(lm4['prediction']['sparse']['ar'], lm4['prediction']['sparse']['hybrid']):.2f}x sparse "
            f"(Horovod also ships duplicate rows)")
    else:
        add("LM 4 ranks: Horovod / HYBRID bytes on sparse variables >= 1.8x", None, None)
    if hy:
        err = _ratio(hy["accounted"], hy["predicted"]) - 1
        add("LM 4 ranks: HYBRID accounted bytes within 5% of the cost model", err,
            abs(err) <= TARGETS["prediction_tolerance"],
            f"kernel counters {100 * (_ratio(hy['kernel'], hy['predicted']) - 1):+.1f}% of predicted")
    else:
        add("LM 4 ranks: HYBRID accounted bytes within 5% of the cost model", None, None)
    for workload, key, label in (("lm", "lm_network_speedup", "LM emulated 1 Gbit/s, 4 ranks: HYBRID >= 1.3x Horovod"),
                                 ("cnn", "cnn_network_slowdown", "CNN emulated 1 Gbit/s, 4 ranks: HYBRID within 10% of Horovod")):
        net = next((s for s in settings if s["workload"] == workload and s["ranks"] == 4 and s["bandwidth"]
                    and s["bandwidth"].replace(" ", "").lower() in ("1gbit/s", "1gbps")), None)
        a, b = (_row(net, "hybrid"), _row(net, "horovod")) if net else (None, None)
        if a and b:
            ratio = _ratio(a["examples_per_s"], b["examples_per_s"])
            ok = ratio >= TARGETS[key] if key == "lm_network_speedup" else ratio >= 1 - TARGETS[key]
            add(label, ratio, ok, f"{net['network']}: {a['examples_per_s']:.1f} vs {b['examples_per_s']:.1f} examples/s")
        else:
            add(label, None, None)
    return out


def render_setting(setting: dict) -> str:
    title = (f"{setting['workload'].upper()}, {setting['ranks']} ranks, {setting['network']}"
             f"  (launch wall {setting['wall_s']:.0f} s)")
    head = (f"  {'configuration':<34} {'steps/s':>8} {'ex/s':>8} | MB/rank/step {'acct':>9} {'kernel':>9} "
            f"{'pred':>9} {'acct/pred':>9} {'kern/pred':>9} | {'sparse':>6}")
    if setting["bandwidth"]:
        head += f" | {'MB/link/step':>12} {'link pred':>9}"
    lines = [title, head]
    rows = setting_rows(setting)
    for r in rows:
        label = NAMES.get(r["config"], r["config"])
        twin = setting["configs"][r["config"]].get("same_as")
        if twin:
            label = f"{label} (= {twin})"
        if "error" in r:
            lines.append(f"  {label:<34} FAILED: {r['error']}")
            continue
        line = (f"  {label:<34} {r['steps_per_s']:8.2f} {r['examples_per_s']:8.1f} |              "
                f"{_mb(r['accounted'])} {_mb(r['kernel'])} {_mb(r['predicted'])} "
                f"{_ratio(r['accounted'], r['predicted']):9.3f} {_ratio(r['kernel'], r['predicted']):9.3f} | "
                f"{100 * _ratio(r['sparse'], r['accounted']):5.1f}%")
        if setting["bandwidth"]:
            line += f" | {_mb(r['link']):>12} {_mb(r['link_predicted'])}"
        lines.append(line)
    steps = [f"{NAMES.get(name, name)} {c['schedule']['warmup_steps']} + {c['schedule']['repeats']} x "
             f"{c['schedule']['steps_per_repeat']}" for name, c in setting["configs"].items()
             if c.get("schedule") and "error" not in c and not c.get("same_as")]
    if steps:
        lines.append("  steps (warm-up + windows x steps): " + ", ".join(steps))
    settle = [(name, settling(c)) for name, c in setting["configs"].items()
              if "error" not in c and not c.get("same_as")]
    settle = [(n, x) for n, x in settle if x == x]
    if settle:
        lines.append("  warm-up steps (untimed) took " + ", ".join(
            f"{NAMES.get(n, n)} {x:.2f}x" for n, x in settle) + " the median timed step")
    hy = _row(setting, "hybrid")
    if hy:
        parts = []
        measure = "link" if setting["bandwidth"] else "accounted"  # on a network: what the links carried
        for other in ("horovod", "sparse_as_dense", "ps"):
            o = _row(setting, other)
            if o:
                parts.append(f"vs {NAMES[other]}: {_ratio(hy['examples_per_s'], o['examples_per_s']):.2f}x throughput, "
                             f"{_ratio(o[measure], hy[measure]):.2f}x {'link ' if setting['bandwidth'] else ''}bytes")
        hv = _row(setting, "horovod")
        if hv:
            parts.append(f"sparse-variable bytes Horovod/HYBRID {_ratio(hv['sparse'], hy['sparse']):.2f}x "
                         f"(total {_ratio(hv['accounted'], hy['accounted']):.2f}x)")
        lines += ["  HYBRID " + p for p in parts]
    return "\n".join(lines)


def scaling_lines(settings: list[dict]) -> list[str]:
    """One line per workload and network kind with two or more rank counts."""
    groups: dict = {}
    for s in settings:
        hy, hv = _row(s, "hybrid"), _row(s, "horovod")
        if hy and hv:
            kind = "loopback" if s["bandwidth"] is None else s["bandwidth"]
            groups.setdefault((s["workload"], kind), []).append(
                (s["ranks"], s["network"], _ratio(hy["examples_per_s"], hv["examples_per_s"]),
                 _ratio(hv["accounted"], hy["accounted"])))
    lines = []
    for (workload, kind), points in groups.items():
        if len(points) > 1:
            points.sort()
            lines.append(f"  {workload.upper()} {kind}: " + ", ".join(
                f"N={n} ({net}) {t:.2f}x; {b:.2f}x" for n, net, t, b in points))
    return lines


def render(doc: dict) -> str:
    sched = doc["schedule"]
    sized = (f" (and as many as last {sched['warmup_s']:g} s and {sched['window_s']:g} s at the estimated pace)"
             if sched.get("window_s") else "")
    out = [f"bench_comm on {doc['machine']}; schedule: at least {sched['warmup']} warm-up steps, "
           f"median of {sched['repeats']} windows of at least {sched['steps']} steps{sized}; "
           f"total wall {doc['wall_s'] / 60:.1f} min", f"command: {doc['command']}", ""]
    for s in doc["settings"]:
        out += [render_setting(s), ""]
    scaling = scaling_lines(doc["settings"])
    if scaling:
        out += ["HYBRID vs plain Horovod as N grows (throughput ratio; bytes per rank ratio):", *scaling, ""]
    out.append("Targets (issue 8):")
    for t in doc["targets"]:
        value = "-" if t["value"] is None else (f"{100 * t['value']:+.1f}%" if "within 5%" in t["target"]
                                                else f"{t['value']:.2f}x")
        out.append(f"  [{t['status']:>7}] {t['target']}: {value}  {t['detail']}")
    return "\n".join(out)


RESULTS_HEADING = "## Latest results"


def update_readme(path: str, doc: dict, text: str) -> None:
    """Replace everything from the "Latest results" heading on with this run's table ``text``."""
    from parallax_nb.jsonfile import atomic_write_text

    with open(path) as f:
        text = f.read()
    head = text.split(RESULTS_HEADING, 1)[0].rstrip() + "\n\n"
    section = (f"{RESULTS_HEADING}\n\nRun {doc['finished_utc']} on {doc['machine']}"
               + (" (quick sizes: a harness check, not a measurement)" if doc.get("quick") else "")
               + f".\n\n```bash\n{doc['command']}\n```\n\n```text\n{text}\n```\n")
    atomic_write_text(path, head + section)
