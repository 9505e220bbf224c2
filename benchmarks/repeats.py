"""Whole invocations of :mod:`bench_comm`, repeated: every headline figure is the median of
at least 3 separate runs (fresh processes, fresh mpirun launches), shown with its range.

One run of a noisy benchmark misled before: the LM's HYBRID / Horovod ratio on 2 x 2 ranks at
1 Gbit/s read 4.03x in one invocation and 1.24x in the next. Within an invocation each figure
is already a median of timed windows; across invocations this module takes, per setting and
configuration, the median and the range (min..max) of each invocation's figure, and of each
invocation's ratio to plain Horovod (the ratio is taken inside an invocation first, so both
sides of it ran under the same load).

Issue 18's targets are judged on those medians.
"""
from __future__ import annotations

import statistics

import report

# (label, workload, ranks, network or None for loopback, configs compared with horovod, op, bound)
TARGETS = (
    ("CNN 2 ranks loopback: AR and HYBRID >= 1.0x plain Horovod", "cnn", 2, None, ("ar", "hybrid"), ">=", 1.0),
    ("CNN 4 ranks loopback: AR and HYBRID >= 1.0x plain Horovod", "cnn", 4, None, ("ar", "hybrid"), ">=", 1.0),
    ("CNN 2x2 @ 1 Gbit/s: AR and HYBRID >= 1.0x plain Horovod", "cnn", 4, "2x2@1Gbit/s", ("ar", "hybrid"), ">=", 1.0),
    ("tiny LM 2 ranks loopback: HYBRID step time <= 1.2x plain Horovod's", "lm_tiny", 2, None, ("hybrid",),
     "step<=", 1.2),
    ("LM 2x2 @ 1 Gbit/s: HYBRID >= 1.5x plain Horovod", "lm", 4, "2x2@1Gbit/s", ("hybrid",), ">=", 1.5),
    ("LM 2x2 @ 100 Mbit/s: HYBRID >= 3x plain Horovod", "lm", 4, "2x2@100Mbit/s", ("hybrid",), ">=", 3.0),
    ("LM 4x2 @ 1 Gbit/s: HYBRID >= 2x plain Horovod", "lm", 8, "4x2@1Gbit/s", ("hybrid",), ">=", 2.0),
)


def _key(setting: dict) -> tuple:
    """A setting is its workload, its rank count and its network (2 and 4 ranks on loopback
    are two settings)."""
    workload = setting["workload_name"] if "workload_name" in setting else setting["workload"]
    return workload, setting["ranks"], setting["network"]


def spread(values: list[float]) -> dict:
    values = [v for v in values if v == v]
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "runs": 0}
    return {"median": float(statistics.median(values)), "min": min(values), "max": max(values), "runs": len(values)}


def summarise(runs: list[dict]) -> list[dict]:
    """Per setting and configuration: steps/s and the ratio to plain Horovod, median and range."""
    by_setting: dict = {}
    for run in runs:
        for s in run["settings"]:
            by_setting.setdefault(_key(s), []).append(s)
    out = []
    for (workload, ranks, network), settings in by_setting.items():
        configs = []
        names = [n for n in settings[0]["configs"]]
        for name in names:
            steps, ratios = [], []
            for s in settings:
                row, base = report._row(s, name), report._row(s, "horovod")
                if row:
                    steps.append(row["steps_per_s"])
                if row and base and name != "horovod":
                    ratios.append(row["steps_per_s"] / base["steps_per_s"])
            configs.append({"config": name, "steps_per_s": spread(steps), "vs_horovod": spread(ratios)})
        out.append({"workload": workload, "ranks": ranks, "network": network, "configs": configs})
    return out


def _find(summary: list[dict], workload: str, ranks: int, network: str | None) -> dict | None:
    for s in summary:
        loop = s["network"] == "loopback"
        if s["workload"] == workload and s["ranks"] == ranks and (loop if network is None else
                                                                   s["network"].lower() == network.lower()):
            return s
    return None


def targets(summary: list[dict]) -> list[dict]:
    """Issue 18's targets on the medians over invocations: MET / MISSED / NOT RUN."""
    out = []
    for label, workload, ranks, network, configs, op, bound in TARGETS:
        s = _find(summary, workload, ranks, network)
        found = {c["config"]: c["vs_horovod"] for c in s["configs"]} if s else {}
        values = {c: found[c] for c in configs if c in found and found[c]["runs"]}
        if len(values) < len(configs):
            out.append({"target": label, "status": "NOT RUN", "values": {}})
            continue
        if op == "step<=":  # step time ratio = 1 / throughput ratio
            values = {c: {k: (1 / v if k != "runs" else v) for k, v in r.items()} for c, r in values.items()}
            values = {c: dict(r, min=r["max"], max=r["min"]) for c, r in values.items()}
            ok = all(r["median"] <= bound for r in values.values())
        else:
            ok = all(r["median"] >= bound for r in values.values())
        out.append({"target": label, "status": "MET" if ok else "MISSED", "values": values})
    return out


def _fmt(r: dict) -> str:
    return f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f}, {r['runs']} runs)"


def render(doc: dict) -> str:
    lines = [f"bench_comm, {len(doc['runs'])} whole invocation(s) on {doc['machine']}; figures: median over "
             f"invocations (min-max); each invocation's figure is its median timed window",
             f"command: {doc['command']}", f"invocation wall: " + ", ".join(f"{r['wall_s'] / 60:.1f} min"
                                                                            for r in doc["runs"]), ""]
    for s in doc["summary"]:
        lines.append(f"{s['workload'].upper()}, {s['ranks']} ranks, {s['network']}")
        lines.append(f"  {'configuration':<26} {'steps/s median (min-max)':>28}   vs plain Horovod, median (min-max)")
        for c in s["configs"]:
            st, vs = c["steps_per_s"], c["vs_horovod"]
            steps = f"{st['median']:.2f} ({st['min']:.2f}-{st['max']:.2f})" if st["runs"] else "FAILED"
            lines.append(f"  {report.NAMES.get(c['config'], c['config']):<26} {steps:>28}   "
                         + (_fmt(vs) if vs["runs"] else "-"))
        lines.append("")
    lines.append("Targets (issue 18, on the medians):")
    for t in doc["targets"]:
        values = "; ".join(f"{c} {_fmt(r)}" for c, r in t["values"].items()) or "-"
        lines.append(f"  [{t['status']:>7}] {t['target']}: {values}")
    return "\n".join(lines)


def main(paths: list[str]) -> int:
    """Print the medians, ranges and targets of several repeated runs' JSON files together
    (e.g. one per workload, each written by ``bench_comm.py --invocations 3 --json``)."""
    import json

    docs = []
    for path in paths:
        with open(path) as f:
            docs.append(json.load(f))
    summary = [s for d in docs for s in summarise(d["runs"])]   # from every kept run, not a stored summary
    merged = {"runs": [r for d in docs for r in d["runs"]], "machine": docs[0]["machine"],
              "command": " && ".join(d["command"] for d in docs), "summary": summary, "targets": targets(summary)}
    print(render(merged))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
