"""What every MPI rank of a benchmark launch runs: the configurations of one spec, in turn.

``python benchmarks/worker.py SPEC.json RESULTS.json`` under mpirun. The spec names the
workload (``lm``/``cnn``/``recommender``, size, overrides, per-rank batch), the configurations and the
schedule: ``warmup_steps`` untimed steps, then ``repeats`` windows of ``steps_per_repeat``
steps each (with ``interleave``: ``repeats`` rounds of one window of every configuration,
:func:`main`). A configuration is plain Horovod (``sparse_as_dense`` false/true,
:mod:`baselines`) or parallax_nb's runtime with a plan file (AR, PS, HYBRID, AUTO).

Per window, measured on every rank at the step boundaries (``on_step``):

* wall time of rank 0 (steps are synchronous, every rank ends a step together within a
  message latency): ``steps_per_s = S / dt``, ``examples_per_s = N * b * S / dt``;
* accounted bytes: the runtime's (or the baseline's) per-step (sent + received), mean over
  the window and over ranks;
* kernel bytes: the namespace counters (:mod:`counters`) read by one rank per machine.

Rank 0 rewrites RESULTS.json after each configuration, so a launch that dies part-way keeps
what it finished; the driver relaunches the rest (an interleaved launch writes once, at the end).
"""
from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import counters  # noqa: E402


def make_job(spec: dict):
    from parallax_nb.workloads import cnn_job, lm_job, recommender_job

    factory = {"lm": lm_job, "cnn": cnn_job, "recommender": recommender_job}[spec["workload"]]
    return factory(spec["size"], batch_size=spec["batch_size"], optimizer=spec.get("optimizer", "sgd"),
                   **spec.get("overrides", {}))


class WindowProbe:
    """``on_step`` callback: time and kernel counters at the window boundaries, bytes per step."""

    def __init__(self, boundaries: list[int]):
        self.boundaries = set(boundaries)  # number of steps done when a reading is taken
        self.readings: dict[int, tuple[float, dict]] = {}
        self.accounted: list[float] = []
        self.by_variable: list[dict] = []
        self.ends: list[float] = []  # perf_counter at the end of every step, warm-up included
        self.steps_done = 0

    def start(self) -> None:
        self.steps_done = 0
        self.ends = [time.perf_counter()]
        if 0 in self.boundaries:
            self.readings[0] = (time.perf_counter(), counters.read_interfaces())

    def __call__(self, record) -> None:
        self.steps_done += 1
        self.ends.append(time.perf_counter())
        if self.steps_done in self.boundaries:
            self.readings[self.steps_done] = (time.perf_counter(), counters.read_interfaces())
        self.accounted.append(float(record.bytes_sent) + float(record.bytes_received))
        self.by_variable.append({k: float(s) + float(r) for k, (s, r) in record.bytes_by_variable.items()})


def run_config(job, config: dict, spec: dict, probe: WindowProbe, steps: int):
    """Train one configuration for ``steps`` steps on this rank, feeding ``probe``."""
    probe.start()
    if config["kind"] == "horovod":
        from baselines import horovod_train

        horovod_train(job, steps, sparse_as_dense=config["sparse_as_dense"], on_step=probe)
        return {}
    from parallax_nb.plan import Plan
    from parallax_nb.runtime import train

    with open(config["plan"]) as f:
        plan = Plan.from_json(f.read())
    result = train(job, plan, steps, on_step=probe)
    return {name: info.get("method") for name, info in result.variables.items()}


def summarise(probe_all: list[dict], spec: dict, ranks: int) -> dict:
    """Rank 0: per window throughput and bytes from every rank's probe."""
    warmup, repeats, per = spec["warmup_steps"], spec["repeats"], spec["steps_per_repeat"]
    r0 = probe_all[0]
    by_ns = {}
    for p in probe_all:  # one reading per machine: the lowest rank in each namespace
        by_ns.setdefault(p["netns"], p)
    windows = []
    for w in range(repeats):
        a, b = warmup + w * per, warmup + (w + 1) * per
        dt = r0["readings"][str(b)][0] - r0["readings"][str(a)][0]
        accounted = sum(sum(p["accounted"][a:b]) / per for p in probe_all) / ranks
        variables = {}
        for p in probe_all:
            for row in p["by_variable"][a:b]:
                for k, v in row.items():
                    variables[k] = variables.get(k, 0.0) + v / (per * ranks)
        kernel = counters.kernel_bytes({ns: p["readings"][str(a)][1] for ns, p in by_ns.items()},
                                       {ns: p["readings"][str(b)][1] for ns, p in by_ns.items()}, ranks, per)
        windows.append({"seconds": dt, "steps_per_s": per / dt,
                        "examples_per_s": per * ranks * spec["batch_size"] / dt,
                        "accounted_bytes_per_rank_per_step": accounted,
                        "accounted_bytes_by_variable": variables, **{f"kernel_{k}": v for k, v in kernel.items()}})
    # every step's seconds on rank 0, the first (tracing, first allocations) and the warm-up
    # included, so a reader sees how long the configuration took to settle
    step_seconds = [b - a for a, b in zip(r0["ends"], r0["ends"][1:])]
    return {"windows": windows, "step_seconds": step_seconds, "losses_first_last": r0.get("losses")}


def launch_compute(job, config: dict) -> float:
    """The calibration's compute figure of ``config``'s program, timed in this launch right
    before it runs (every rank; :func:`parallax_nb.runtime.calibrate.compute_seconds`)."""
    from parallax_nb.runtime.calibrate import compute_seconds
    from parallax_nb.types import PLAIN_HOROVOD, SPARSE_AS_DENSE

    baseline = None
    if config["kind"] == "horovod":
        baseline = SPARSE_AS_DENSE if config["sparse_as_dense"] else PLAIN_HOROVOD
    return compute_seconds(job, baseline)


def bind_to_core(rank: int) -> None:
    """Bind every thread of this rank to one core of the host, rank ``r`` to the ``r mod C``-th of
    the ``C`` cores it may use, also when the ranks are fewer than the cores (the runtime binds
    by itself only when they are not: :func:`parallax_nb.devices.bind_rank`). Called once
    Horovod has started: binding at the very start hung 2 of 6 launches of 8 ranks on 2 cores
    inside ``hvd.init()`` (benchmarks/README.md)."""
    from parallax_nb.devices import bind_threads

    cores = sorted(os.sched_getaffinity(0))
    bind_threads(cores[rank % len(cores)])


def run_schedule(job, config: dict, schedule: dict, hvd) -> dict | None:
    """Run ``config`` on every rank for ``schedule`` (warm-up, then its windows) and, on rank 0,
    return its summary (:func:`summarise`); None on the other ranks."""
    rank, ranks = hvd.rank(), hvd.size()
    warmup, repeats, per = schedule["warmup_steps"], schedule["repeats"], schedule["steps_per_repeat"]
    probe = WindowProbe([warmup + w * per for w in range(repeats + 1)])
    compute_s = launch_compute(job, config) if schedule.get("compute_control") else None
    start = time.perf_counter()
    methods = run_config(job, config, schedule, probe, warmup + repeats * per)
    wall = time.perf_counter() - start
    mine = {"netns": counters.namespace_id(), "accounted": probe.accounted, "by_variable": probe.by_variable,
            "ends": probe.ends, "readings": {str(k): v for k, v in probe.readings.items()}}
    everyone = hvd.allgather_object(mine)
    if rank != 0:
        return None
    summary = summarise(everyone, schedule, ranks)
    summary.update(config=config["name"], methods=methods, wall_s=wall, ranks=ranks,
                   schedule={"warmup_steps": warmup, "repeats": repeats, "steps_per_repeat": per},
                   machines=len({p["netns"] for p in everyone}), launch_compute_s=compute_s)
    return summary


def round_order(configs: list, round_index: int) -> list:
    """The configurations in interleaved round ``round_index`` (from 0): as given, then reversed,
    in turn, so that each one's rounds sit, on average, at the same time as every other's."""
    return list(configs) if round_index % 2 == 0 else list(configs)[::-1]


def merge_rounds(rounds: list[dict]) -> dict:
    """One configuration's summaries of interleaved rounds (one window each) as one summary: the
    windows in round order, the first round's steps (its warm-up traced the step), the walls
    added, the compute timed before each round as their median."""
    computes = [r["launch_compute_s"] for r in rounds if r["launch_compute_s"] is not None]
    first = rounds[0]
    return {**first, "windows": [w for r in rounds for w in r["windows"]],
            "losses_first_last": rounds[-1]["losses_first_last"], "wall_s": sum(r["wall_s"] for r in rounds),
            "schedule": {**first["schedule"], "repeats": len(rounds), "interleaved": True},
            "launch_compute_s": statistics.median(computes) if computes else None,
            "launch_compute_rounds_s": computes}


def _write(results: dict, results_path: str) -> None:
    tmp = results_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, results_path)


def _print_summary(spec: dict, summary: dict) -> None:
    w = summary["windows"]
    print(f"[bench] {spec['workload']} N={summary['ranks']} {summary['config']}: "
          + ", ".join(f"{x['steps_per_s']:.2f} steps/s" for x in w)
          + f"; {w[0]['accounted_bytes_per_rank_per_step'] / 1e6:.3f} MB/rank/step accounted, "
          f"{w[0]['kernel_bytes_per_rank_per_step'] / 1e6:.3f} MB kernel; wall {summary['wall_s']:.1f} s", flush=True)


def main(spec_path: str, results_path: str) -> int:
    """Each configuration in turn, all its windows in one run; or, with ``interleave`` in the
    spec, ``repeats`` rounds of one window of every configuration, the order reversed every
    other round (A B C, C B A, ...), so that a machine whose speed drifts over minutes slows
    every configuration alike. An interleaved launch writes its results once, at the end."""
    with open(spec_path) as f:
        spec = json.load(f)
    from parallax_nb.runtime.context import horovod

    hvd = horovod()
    rank = hvd.rank()
    if spec.get("bind_cores"):
        bind_to_core(rank)
    job = make_job(spec)
    results = {}
    if rank == 0 and os.path.exists(results_path):
        with open(results_path) as f:
            results = json.load(f)
    configs = spec["configs"]
    interleave = bool(spec.get("interleave"))
    rounds = spec["repeats"] if interleave else 1
    done: dict[str, list[dict]] = {c["name"]: [] for c in configs}
    for r in range(rounds):
        for config in round_order(configs, r):
            schedule = {**spec, **config.get("schedule", {})}  # a slow configuration may take fewer steps
            if interleave:
                schedule["repeats"] = 1
            summary = run_schedule(job, config, schedule, hvd)
            if summary is not None:
                if not interleave:
                    results[config["name"]] = summary
                    _write(results, results_path)
                    _print_summary(spec, summary)
                else:   # kept until every round ran (merge_rounds)
                    done[config["name"]].append(summary)
                    print(f"[bench] round {r + 1} of {rounds}: {config['name']} "
                          f"{summary['windows'][0]['steps_per_s']:.2f} steps/s", flush=True)
            gc.collect()
    if interleave and rank == 0:
        for config in configs:
            results[config["name"]] = merge_rounds(done[config["name"]])
            _print_summary(spec, results[config["name"]])
        _write(results, results_path)
    from parallax_nb.runtime.context import shutdown

    shutdown()
    return 0


if __name__ == "__main__":
    try:
        code = main(sys.argv[1], sys.argv[2])
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # mpirun then stops the other ranks; no atexit hook may block in a collective
    sys.stdout.flush()
    os._exit(code)
