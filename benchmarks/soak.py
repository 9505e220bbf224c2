"""Soak test: many consecutive short runs on one cluster must not leak (issues 9, 19).

    python benchmarks/soak.py                 # 200 HYBRID runs of the tiny LM, 2 engines, 2 steps each
    python benchmarks/soak.py --arch ar       # the same with AllReduce only
    python benchmarks/soak.py --runs 20       # shorter
    python benchmarks/soak.py --json soak.json

One :class:`parallax_nb.cluster.Cluster` of 2 MPI engines is started once; after ``--warmup``
runs (the first run imports TensorFlow on the engines and traces the step, which is not a
leak), the resources below are measured, ``--runs`` more runs are made with
``px.run(job, plan, steps=2)``, and the resources are measured again:

* processes: this process's descendants (controller and its schedulers, mpiexec, engines,
  nannies), its own threads and the engines' threads (sum);
* open files: file descriptors (files, sockets, pipes) of the client (this process) and of
  the engines (sum);
* memory: resident set size (RSS) of the client and of the engines (sum), in MiB;
* temporary files: entries in the session's own temporary folder (``TMPDIR``, set to a fresh
  folder for the client, controller, mpiexec and engines), and what is left there after the
  cluster stopped (nothing may be).

Growth = (end - start) / start. The script exits 1 when the engines' memory grew by more than
``--memory-tolerance`` (default 2 %), any other figure by more than ``--tolerance`` (default
10 %), a run did not finish, or the cluster left files behind, else 0. Not part of the test
suite: 200 runs take ~20-25 minutes on a 2-core machine.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")


def measure(cluster, tmp_dir: str) -> dict:
    """Processes, open file descriptors, RSS (MiB) of the client and the engines, and entries
    of the temporary folder ``tmp_dir`` now."""
    import psutil

    gc.collect()
    me = psutil.Process()
    descendants = [p for p in me.children(recursive=True) if _alive(p)]
    engines = [psutil.Process(e.pid) for e in cluster.engines]
    mib = 1024.0 * 1024.0
    return {
        "processes": len(descendants),
        "client_threads": me.num_threads(),
        "engine_threads": sum(p.num_threads() for p in engines),
        "client_open_fds": me.num_fds(),
        "engine_open_fds": sum(p.num_fds() for p in engines),
        "client_rss_mib": me.memory_info().rss / mib,
        "engine_rss_mib": sum(p.memory_info().rss for p in engines) / mib,
        "tmp_entries": len(os.listdir(tmp_dir)),
    }


def _alive(p) -> bool:
    import psutil

    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def one_run(job, plan, cluster, steps: int, timeout_s: float) -> float:
    """One short run; its wall time in seconds. Raises when it fails or does not finish."""
    from parallax_nb.cluster import run

    start = time.perf_counter()
    the_run = run(job, plan, engines=cluster.n, steps=steps, cluster=cluster, display=False, wait=False)
    the_run.wait(timeout=timeout_s, raise_on_error=False)
    if not the_run.done:
        the_run._controller.abort("soak: run did not finish in time")
        the_run.wait(timeout=60, raise_on_error=False)
        raise RuntimeError(f"run did not finish within {timeout_s:g} s: {the_run}")
    if the_run.status != "done":
        raise RuntimeError(f"run ended {the_run.status}: {the_run.message}")
    return time.perf_counter() - start


def growth_table(start: dict, end: dict, tolerances: dict) -> tuple[str, list[str]]:
    """The table of start, end and growth of every figure, and the figures over their tolerance
    (``tolerances[figure]``, else ``tolerances[None]``)."""
    lines = [f"{'figure':<18} {'start':>10} {'end':>10} {'growth':>8} {'bound':>6}"]
    over = []
    for key in start:
        a, b = start[key], end[key]
        bound = tolerances.get(key, tolerances[None])
        growth = (b - a) / a if a else (0.0 if b == a else float("inf"))
        flag = "  <-- over" if growth > bound else ""
        lines.append(f"{key:<18} {a:>10.1f} {b:>10.1f} {100 * growth:>+7.1f}% {100 * bound:>5g}%{flag}")
        if growth > bound:
            over.append(key)
    return "\n".join(lines), over


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="measured runs (default 200)")
    parser.add_argument("--warmup", type=int, default=3, help="runs before the first measurement (default 3)")
    parser.add_argument("--steps", type=int, default=2, help="steps per run (default 2)")
    parser.add_argument("--engines", type=int, default=2, help="MPI engines (default 2)")
    parser.add_argument("--arch", default="hybrid", choices=["ar", "ps", "hybrid"],
                        help="plan of the tiny LM (default hybrid: PS for its sparse tables, AR for the rest)")
    parser.add_argument("--memory-tolerance", type=float, default=0.02,
                        help="allowed growth of the engines' memory (default 0.02 = 2%%)")
    parser.add_argument("--tolerance", type=float, default=0.10,
                        help="allowed growth of every other figure (default 0.10 = 10%%)")
    parser.add_argument("--run-timeout", type=float, default=300.0, help="seconds one run may take")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.warmup < 1 or args.steps < 1 or args.engines < 1:
        parser.error("--runs, --warmup, --steps and --engines must be >= 1")

    from parallax_nb.cluster import Cluster
    from parallax_nb.runtime.reference import default_plan
    from parallax_nb.workloads import lm_job

    tmp_dir = tempfile.mkdtemp(prefix="parallax_nb-soak-")
    os.environ["TMPDIR"] = tmp_dir     # inherited by the controller, mpiexec and the engines
    tempfile.tempdir = None
    tolerances = {None: args.tolerance, "engine_rss_mib": args.memory_tolerance}
    job = lm_job("tiny")
    plan = default_plan(job, args.arch)
    cluster = Cluster(n=args.engines)
    try:
        t0 = time.perf_counter()
        cluster.start()
        print(f"soak: cluster of {args.engines} engines started in {time.perf_counter() - t0:.1f} s", flush=True)
        for _ in range(args.warmup):
            one_run(job, plan, cluster, args.steps, args.run_timeout)
        engines_before = [e.pid for e in cluster.engines]
        start = measure(cluster, tmp_dir)
        times = []
        t_runs = time.perf_counter()
        for i in range(args.runs):
            times.append(one_run(job, plan, cluster, args.steps, args.run_timeout))
            if (i + 1) % max(1, args.runs // 10) == 0:
                now = measure(cluster, tmp_dir)
                print(f"  run {i + 1:>4}/{args.runs}: {times[-1]:.2f} s; processes {now['processes']}, "
                      f"fds client {now['client_open_fds']} engines {now['engine_open_fds']}, RSS client "
                      f"{now['client_rss_mib']:.0f} MiB engines {now['engine_rss_mib']:.1f} MiB", flush=True)
        end = measure(cluster, tmp_dir)
        table, over = growth_table(start, end, tolerances)
        same_engines = [e.pid for e in cluster.engines] == engines_before
        print(f"\nsoak: {args.runs} runs of {args.steps} steps ({args.arch}) in {time.perf_counter() - t_runs:.0f} s, "
              f"median {statistics.median(times):.2f} s per run; engines never restarted: {same_engines}")
        print(table)
        result = {"runs": args.runs, "steps": args.steps, "arch": args.arch, "start": start, "end": end,
                  "median_run_s": statistics.median(times), "over": over, "engines_restarted": not same_engines}
    except Exception as e:  # noqa: BLE001 - report and fail
        print(f"soak: FAILED: {type(e).__name__}: {e}")
        return 1
    finally:
        cluster.stop()
        left = sorted(os.listdir(tmp_dir))
        shutil.rmtree(tmp_dir, ignore_errors=True)
    print(f"soak: left in the temporary folder after stop: {left or 'nothing'}")
    result["left_in_tmp"] = left
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if over or not same_engines or left:
        print(f"soak: FAILED: over their bound: {over}" + ("" if same_engines else "; engines were restarted")
              + (f"; left in the temporary folder: {left}" if left else ""))
        return 1
    print("soak: OK: every figure within its bound, nothing left behind")
    return 0


if __name__ == "__main__":
    sys.exit(main())
