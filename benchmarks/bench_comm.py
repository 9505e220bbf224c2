"""Communication volume and throughput: parallax_nb side by side with plain Horovod.

One command runs, on this machine, for the same model, data and per-rank batch:

  horovod     plain Horovod, DistributedGradientTape with defaults (sparse gradients allgathered)
  sparse_as_dense plain Horovod, sparse_as_dense=True (sparse gradients densified and allreduced)
  ar ps hybrid auto   parallax_nb's runtime with make_plan(profile, cluster, architecture)

for the LM (LM1B-shaped: wide embedding and sampled-softmax tables dominate the bytes, a modest
LSTM) and the dense CNN, at each ``--ranks`` on loopback (one emulated machine: every rank in
one private network namespace, Open MPI over TCP ``--mca btl tcp,self`` so bytes cross
sockets), and then on emulated networks (``--network 2x2@1Gbit/s 2x2@100Mbit/s 4x2@1Gbit/s``
by default: machines x workers, shaped links; see :mod:`parallax_nb.netem`). ``lm_tiny`` is
the tiny LM, where the runtime's own per-step cost shows.

Figures per configuration (medians over ``--repeats`` windows of at least ``--steps`` steps
after at least ``--warmup`` steps; a configuration whose estimated step is short gets as many
as last ``--window-s`` and ``--warmup-s``, :func:`sized_schedule`): steps/s, examples/s,
bytes per rank per step three ways (the runtime's accounting, the kernel's counters of the
namespaces, the cost model's prediction from a single-device profile), the share of the
accounted bytes that belongs to sparse variables.
Ratios: HYBRID against plain Horovod, sparse_as_dense and PS; measured against predicted.
Targets (issue 8) are marked MET or MISSED.

    python benchmarks/bench_comm.py --invocations 3 --json benchmarks/results/comm.json
    python benchmarks/bench_comm.py --quick            # tiny sizes, 2 ranks: checks the harness

Headline figures come from ``--invocations 3`` (or more): whole separate invocations, every
one kept in the JSON, each figure reported as the median over them with its range
(:mod:`repeats`); one invocation is a harness check, not a claim. ``--interleave`` runs the
windows in rounds, one window of every configuration per round, the order reversed every other
round, so that configurations compared with each other ran under the same drift of this
machine's speed (2 shared cores here: the same program's speed moves by up to 1.9x within
minutes); each round rebuilds and warms up its configuration.

Needs root (network namespaces), Open MPI and Horovod. Prints the table; ``--json`` writes
every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [REPO, HERE]

from parallax_nb.errors import ConfigError  # noqa: E402
from parallax_nb.types import ClusterSpec, Profile  # noqa: E402

import report  # noqa: E402

HOROVOD_CONFIGS = {"horovod": False, "sparse_as_dense": True}
# a CNN step is ~20x shorter than an LM step: its timed windows get more steps, so that each
# lasts about a second and the median is not at the mercy of one scheduler hiccup
WINDOW_SCALE = {"cnn": 6}
# the most warm-up or window steps :func:`sized_schedule` gives a configuration
MAX_SIZED_STEPS = 1000
ARCHITECTURES = ("ar", "ps", "hybrid", "auto")
ALL_CONFIGS = (*HOROVOD_CONFIGS, *ARCHITECTURES)

# LM1B-shaped at a size 2 cores train in seconds: vocabulary 100,000 x 256 for the input
# embedding and for the sampled softmax (2 x 102 MB: the sparse variables, 99.6% of the
# model), 1,024 sampled candidates, a modest 64-unit LSTM and projection (0.4 MB dense).
# Per-rank batch 32 sequences x 20 tokens. The CNN is the dense control (0.5 MB, 3 convs of
# 64 channels on 16x16 images): small enough for 4 ranks on 2 cores.
WORKLOADS = {
    "lm": dict(workload="lm", size="realistic", batch_size=32,
               overrides=dict(vocab_size=100_000, embedding_dim=256, hidden_dim=64, seq_len=20,
                              num_sampled=1024, num_examples=16384)),
    "cnn": dict(workload="cnn", size="realistic", batch_size=16,
                overrides=dict(image_size=16, channels=64, blocks=1, classes=100, num_examples=4096)),
}
# the tiny LM (``lm_job("tiny")``) at its own size: a step of a few ms, where the runtime's
# per-step overhead against plain Horovod shows (issue 18)
WORKLOADS["lm_tiny"] = dict(workload="lm", size="tiny", batch_size=8, overrides={})
QUICK = {
    "lm": dict(workload="lm", size="tiny", batch_size=8, overrides={}),
    "cnn": dict(workload="cnn", size="tiny", batch_size=16, overrides={}),
    "lm_tiny": WORKLOADS["lm_tiny"],
}


def parse_network(text: str) -> tuple[int, int, str]:
    """``"2x2@1Gbit/s"`` -> (machines, workers per machine, bandwidth)."""
    try:
        shape, bandwidth = text.split("@", 1)
        machines, workers = (int(x) for x in shape.lower().split("x"))
    except ValueError:
        raise ConfigError(f"cannot read network {text!r}", hint='write MACHINESxWORKERS@BANDWIDTH, e.g. "2x2@1Gbit/s"') from None
    if machines < 1 or workers < 1:
        raise ConfigError(f"network {text!r} needs at least one machine and one worker")
    from parallax_nb.types import parse_bandwidth

    parse_bandwidth(bandwidth)
    return machines, workers, bandwidth


def work_directory(path: str | None, benchmark: str) -> str:
    """``path`` (made if missing) or a new temporary folder, said on stdout: specs, plans,
    profiles and logs of the launches are kept there."""
    workdir = path or tempfile.mkdtemp(prefix=f"pxnb-{benchmark}-")
    os.makedirs(workdir, exist_ok=True)
    print(f"{benchmark}: work directory {workdir}", flush=True)
    return workdir


def rank_env() -> dict:
    env = dict(os.environ)
    # Horovod's background loop negotiates collectives once per cycle (ms); ranks here wait on
    # chains of small collectives, so every configuration, baselines included, runs a 0.1 ms cycle
    env.setdefault("HOROVOD_CYCLE_TIME", "0.1")
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([REPO, HERE, env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return env


def profile_workload(spec: dict, workdir: str, steps: int) -> Profile:
    """Single-device profile of the workload, in a child process (this driver stays TF-free)."""
    path = os.path.join(workdir, f"profile-{spec['workload']}.json")
    code = ("import json, sys; sys.path.insert(0, %r); import worker; "
            "from parallax_nb.profile import profile_job; "
            "profile_job(worker.make_job(json.loads(sys.argv[1])), steps=%d).to_json(sys.argv[2])" % (HERE, steps))
    subprocess.run([sys.executable, "-c", code, json.dumps(spec), path], env=rank_env(), check=True,
                   stdout=subprocess.DEVNULL)
    with open(path) as f:
        return Profile.from_json(f.read())


def write_plans(profile: Profile, spec: ClusterSpec, workdir: str, tag: str, calibration=None) -> dict[str, str]:
    """One plan file per architecture; AUTO's choices priced by ``calibration`` when given (the
    plan that runs is then the one a prediction with that calibration describes)."""
    from parallax_nb.plan import make_plan

    paths = {}
    for arch in ARCHITECTURES:
        path = os.path.join(workdir, f"plan-{tag}-{arch}.json")
        make_plan(profile, spec, arch, calibration=calibration).to_json(path)
        paths[arch] = path
    return paths


class StallWatchdog:
    """Kills an mpirun process group when no configuration finishes within ``timeout_s``.

    A configuration that deadlocks (a rank waiting in a collective the others never join)
    would otherwise hold the whole benchmark; the driver then marks it FAILED and relaunches
    the remaining configurations.
    """

    def __init__(self, proc: subprocess.Popen, timeout_s: float):
        import threading

        self.proc, self.timeout_s = proc, timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.fired = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def progress(self) -> None:
        self.deadline = time.monotonic() + self.timeout_s

    def _watch(self) -> None:
        while not self._done.wait(1.0):
            if time.monotonic() > self.deadline and self.proc.poll() is None:
                self.fired = True
                try:
                    os.killpg(self.proc.pid, 9)
                except ProcessLookupError:
                    pass
                return

    def stop(self) -> bool:
        """Stop watching; True when the watchdog killed the launch."""
        self._done.set()
        self._thread.join()
        return self.fired


def launch(spec: dict, configs: list[dict], machines: int, workers: int, bandwidth: str | None,
           workdir: str, tag: str, timeout_s: float) -> dict:
    """Run ``configs`` on an emulated cluster; relaunch after a failing configuration.

    Returns ``{config name: summary}``; a configuration that failed maps to ``{"error": text}``.
    """
    from parallax_nb.netem import EmulatedCluster

    results_path = os.path.join(workdir, f"results-{tag}.json")
    log_path = os.path.join(workdir, f"log-{tag}.txt")
    remaining = list(configs)
    errors = {}
    while remaining:
        spec_path = os.path.join(workdir, f"spec-{tag}.json")
        with open(spec_path, "w") as f:
            json.dump({**spec, "configs": remaining}, f)
        with EmulatedCluster(machines=machines, workers_per_machine=workers, bandwidth=bandwidth) as cluster:
            # HOROVOD_TIMELINE, when set, reaches the ranks too (rank 0 writes it; step_anatomy.py)
            timeline = ["-x", "HOROVOD_TIMELINE"] if os.environ.get("HOROVOD_TIMELINE") else []
            cmd = ["mpirun", "-np", str(cluster.ranks), *cluster.mpirun_args(), "-x", "HOROVOD_CYCLE_TIME", *timeline,
                   sys.executable, os.path.join(HERE, "worker.py"), spec_path, results_path]
            with open(log_path, "a") as log:
                log.write(f"\n$ {' '.join(cmd)}\n")
                log.flush()
                proc = subprocess.Popen(cmd, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, start_new_session=True)
                watchdog = StallWatchdog(proc, timeout_s)
                for line in proc.stdout:
                    log.write(line)
                    if "[bench]" in line:
                        watchdog.progress()
                        print("   ", line.split("[bench]", 1)[1].strip(), flush=True)
                proc.wait()
                if watchdog.stop():
                    log.write(f"\n[driver] killed: no configuration finished within {timeout_s:.0f} s\n")
        done = {}
        if os.path.exists(results_path):
            with open(results_path) as f:
                done = json.load(f)
        before = len(remaining)
        remaining = [c for c in remaining if c["name"] not in done and c["name"] not in errors]
        if remaining and proc.returncode != 0:
            why = (f"no progress in {timeout_s:.0f} s, killed (a hang); see {log_path}"
                   if watchdog.fired else f"launch exited {proc.returncode}; see {log_path}")
            # an interleaved launch runs every configuration in every round: which one failed is
            # in the log, and none has results of its own
            failed = remaining if spec.get("interleave") else [remaining[0]]
            for config in failed:
                errors[config["name"]] = why + (" (interleaved rounds)" if spec.get("interleave") else "")
                print(f"    {config['name']}: FAILED (exit {proc.returncode}, log {log_path})", flush=True)
            remaining = [c for c in remaining if c["name"] not in errors]
        elif remaining and len(remaining) == before:
            break
    out = {}
    if os.path.exists(results_path):
        with open(results_path) as f:
            out = json.load(f)
    out.update({name: {"error": text} for name, text in errors.items()})
    return out


def duplicates(profile: Profile, plans: dict[str, str], configs: list[str]) -> dict[str, str]:
    """Configurations that would run the very same program as an earlier one: ``{name: twin}``.

    A parallax plan with the same method and partitions for every variable and the same local
    aggregation as an earlier plan (e.g. AUTO = HYBRID on the LM; HYBRID = AR on the all-dense
    CNN), and
    ``sparse_as_dense`` on a model without sparse variables (sparse_as_dense changes nothing).
    They are run once and reported twice, marked "same as".
    """
    from parallax_nb.plan import Plan

    out, seen = {}, {}
    for c in configs:
        if c == "sparse_as_dense" and not any(v.is_sparse for v in profile.variables) and "horovod" in configs:
            out[c] = "horovod"
        elif c in plans:
            with open(plans[c]) as f:
                plan = Plan.from_json(f.read())
            key = (plan.local_aggregation, tuple((v.name, v.method.value, v.partitions) for v in plan))
            if key in seen:
                out[c] = seen[key]
            else:
                seen[key] = c
    return out


def estimates_by_config(profile: Profile, spec: ClusterSpec) -> dict:
    """The cost model's uncalibrated estimate of each configuration on ``spec`` (``horovod``:
    plain Horovod as users run it, its IndexedSlices allgathered among all ranks with their
    duplicates)."""
    from parallax_nb.cost import PLAIN_HOROVOD, SPARSE_AS_DENSE, compare_architectures

    est = compare_architectures(profile, spec, include_horovod=True)
    return {**{arch: est[arch] for arch in ARCHITECTURES}, "horovod": est[PLAIN_HOROVOD],
            "sparse_as_dense": est[SPARSE_AS_DENSE]}


def predictions(profile: Profile, spec: ClusterSpec) -> dict:
    """Cost-model bytes per participant per step for each configuration."""
    est = estimates_by_config(profile, spec)
    out = {c: e.bytes_per_machine_per_step for c, e in est.items()}
    out["sparse"] = {arch: est[arch].sparse_bytes_per_machine_per_step for arch in ARCHITECTURES}
    return out


def sized_schedule(step_s: float | None, args, warmup: int, steps: int) -> dict:
    """One configuration's warm-up and window steps: as many as last about ``--warmup-s`` and
    ``--window-s`` at ``step_s`` a step (its estimate), never fewer than ``warmup`` and
    ``steps`` nor more than :data:`MAX_SIZED_STEPS`; {} (the common schedule) without an
    estimate or with ``--window-s 0``. A window of a few short steps is mostly the scheduler's
    noise: a configuration's three windows of 5 recommender steps (15-50 ms each) read a median
    of 30 % apart, up to 111 % (benchmarks/README.md, "Windows of a second")."""
    import math

    if not step_s or step_s <= 0 or not math.isfinite(step_s) or not args.window_s:
        return {}
    def sized(seconds, least):
        return max(least, min(MAX_SIZED_STEPS, math.ceil(seconds / step_s)))
    return {"warmup_steps": sized(args.warmup_s, warmup), "steps_per_repeat": sized(args.window_s, steps)}


def run_setting(name: str, workload_name: str, spec: dict, profile: Profile, configs: list[str], machines: int,
                workers: int, bandwidth: str | None, args, workdir: str, calibration=None,
                plan_cluster: ClusterSpec | None = None, step_estimates: dict | None = None) -> dict:
    """Plan, then run ``configs`` on ``machines`` x ``workers`` ranks. parallax plans for
    ``plan_cluster`` when given (on loopback, one machine of every rank: the runtime takes the
    plan's cluster on one host), else for the emulated machines with local aggregation (the
    runtime finds the namespaces' machines itself), else on loopback for a machine per rank;
    plain Horovod has no local aggregation. Each configuration's windows last about
    ``--window-s`` at its step time in ``step_estimates`` (seconds by configuration), else at
    the cost model's uncalibrated estimate (:func:`sized_schedule`)."""
    ranks = machines * workers
    per_rank = ClusterSpec.create(machines=ranks, workers_per_machine=1, bandwidth=bandwidth or "100Gbit/s")
    plan_spec = plan_cluster or (per_rank if bandwidth is None else
                                 ClusterSpec.create(machines=machines, workers_per_machine=workers,
                                                    bandwidth=bandwidth))
    tag = f"{workload_name}-{name}-{bandwidth or 'lo'}".replace("/", "").replace(" ", "")
    plans = write_plans(profile, plan_spec, workdir, tag, calibration)
    same_as = duplicates(profile, plans, configs)
    steps = args.steps * WINDOW_SCALE.get(spec["workload"], 1)
    if step_estimates is None:
        step_estimates = {c: e.step_time_s for c, e in estimates_by_config(profile, plan_spec).items()}
    config_list = []
    for c in configs:
        if c in same_as:
            continue
        if c in HOROVOD_CONFIGS:
            config_list.append({"name": c, "kind": "horovod", "sparse_as_dense": HOROVOD_CONFIGS[c]})
        else:
            config_list.append({"name": c, "kind": "parallax", "plan": plans[c]})
        if HOROVOD_CONFIGS.get(c) and args.sad_steps:
            config_list[-1]["schedule"] = {"warmup_steps": 1, "steps_per_repeat": args.sad_steps}
        else:
            config_list[-1]["schedule"] = sized_schedule(step_estimates.get(c), args, args.warmup, steps)
    network = (f"{machines}x{workers}@{bandwidth}" if bandwidth is not None else
               "loopback, one machine" if plan_cluster is not None and plan_cluster.machines == 1 else "loopback")
    print(f"== {spec['workload']}: {ranks} ranks, {network}", flush=True)
    start = time.monotonic()
    results = launch({**spec, "warmup_steps": args.warmup, "repeats": args.repeats, "steps_per_repeat": steps,
                      "bind_cores": args.bind_cores, "interleave": args.interleave,
                      # bench_predict: each configuration's compute timed in its launch (worker.launch_compute)
                      "compute_control": calibration is not None and getattr(args, "compute_control", False)},
                     config_list, machines, workers, bandwidth, workdir, tag, args.timeout)
    for c, twin in same_as.items():
        if twin in results:
            results[c] = {**results[twin], "same_as": twin}
    results = {c: results[c] for c in configs if c in results}
    return {"workload": spec["workload"], "workload_name": workload_name, "ranks": ranks, "machines": machines, "workers_per_machine": workers,
            "network": network, "bandwidth": bandwidth, "wall_s": time.monotonic() - start,
            "prediction": predictions(profile, per_rank),
            "link_prediction": None if bandwidth is None else predictions(profile, plan_spec),
            "sparse_variables": [v.name for v in profile.variables if v.is_sparse],
            "configs": results}


def add_launch_options(parser, warmup: int, steps: int) -> None:
    """The options :func:`run_setting` reads, for this benchmark and those that launch through
    it (``bench_predict.py``), with their own schedule defaults."""
    parser.add_argument("--warmup", type=int, default=warmup,
                        help="untimed steps before the windows (as Horovod's own synthetic benchmarks: "
                             "a configuration's first steps run slower while its allocations settle)")
    parser.add_argument("--steps", type=int, default=steps, help="steps per timed window (at least)")
    parser.add_argument("--window-s", type=float, default=1.0,
                        help="seconds a timed window should last: a configuration whose estimated step is "
                             "short gets more steps than --steps (at most %d; 0: --steps alone)" % MAX_SIZED_STEPS)
    parser.add_argument("--warmup-s", type=float, default=0.5,
                        help="seconds the warm-up should last, the same way (at least --warmup steps)")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows (the median is reported)")
    parser.add_argument("--sad-steps", type=int, default=2,
                        help="steps per window (after 1 warm-up step) for sparse_as_dense, whose densified "
                             "tables make each step slow (0: the common schedule)")
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds a configuration may take (incl. start-up) before it is killed as hung")
    parser.add_argument("--interleave", action="store_true",
                        help="run the windows in rounds, one window of every configuration per round, the "
                             "order reversed every other round: configurations compared under the same drift "
                             "of the machine's speed (each round rebuilds and warms up the configuration)")
    parser.add_argument("--bind-cores", action="store_true",
                        help="once Horovod has started, bind each rank to core (rank mod cores), every "
                             "configuration alike, also where the ranks are fewer than the cores (where they are "
                             "not, the ranks bind themselves: see benchmarks/README.md)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--workloads", nargs="+", default=["lm", "cnn"], choices=sorted(WORKLOADS))
    parser.add_argument("--ranks", nargs="*", type=int, default=[2, 4], help="loopback rank counts (one machine)")
    parser.add_argument("--configs", nargs="+", default=list(ALL_CONFIGS), choices=ALL_CONFIGS)
    parser.add_argument("--network", nargs="*", default=["2x2@1Gbit/s", "2x2@100Mbit/s", "4x2@1Gbit/s"],
                        help="emulated networks MACHINESxWORKERS@BANDWIDTH (none: skip)")
    parser.add_argument("--network-configs", nargs="+", default=["horovod", "hybrid"], choices=ALL_CONFIGS)
    add_launch_options(parser, warmup=10, steps=10)
    parser.add_argument("--quick", action="store_true", help="tiny workloads: check the harness in a minute")
    parser.add_argument("--invocations", type=int, default=1,
                        help="run the whole benchmark this many times as separate processes; figures are "
                             "the median over invocations with their range (issue 18: at least 3)")
    parser.add_argument("--json", metavar="PATH", help="write all results here (every invocation's)")
    parser.add_argument("--readme", metavar="PATH", nargs="?", const=os.path.join(HERE, "README.md"),
                        help="replace the 'Latest results' section of this README (default benchmarks/README.md)")
    parser.add_argument("--workdir", help="keep specs, plans, profiles and logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    for n in args.ranks:
        if n < 1:
            raise ConfigError(f"--ranks needs whole numbers >= 1, got {n}")
    networks = [parse_network(t) for t in args.network if t.lower() != "none"]
    if os.geteuid() != 0:
        print("bench_comm: needs root for the network namespaces of the emulated cluster", file=sys.stderr)
        return 2
    if args.invocations < 1:
        raise ConfigError(f"--invocations needs a whole number >= 1, got {args.invocations}")
    if args.invocations > 1:
        return repeated(args, argv if argv is not None else sys.argv[1:])
    workdir = work_directory(args.workdir, "bench_comm")
    started = time.monotonic()
    settings = []
    for w in args.workloads:
        spec = (QUICK if args.quick else WORKLOADS)[w]
        t0 = time.monotonic()
        profile = profile_workload(spec, workdir, args.profile_steps)
        print(f"== {w}: profiled in {time.monotonic() - t0:.0f} s: {profile.summary().splitlines()[0]}", flush=True)
        for n in args.ranks:
            settings.append(run_setting(f"loop{n}", w, spec, profile, args.configs, 1, n, None, args, workdir))
        for machines, workers, bandwidth in networks:
            settings.append(run_setting(f"net{machines}x{workers}", w, spec, profile, args.network_configs,
                                        machines, workers, bandwidth, args, workdir))
    doc = {"schema": "parallax_nb.bench_comm", "finished_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join([os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]]),
           "machine": report.machine_description(), "python": platform.python_version(),
           "wall_s": time.monotonic() - started, "quick": args.quick,
           "schedule": {"warmup": args.warmup, "steps": args.steps, "repeats": args.repeats,
                        "warmup_s": args.warmup_s, "window_s": args.window_s},
           "bind_cores": args.bind_cores, "interleave": args.interleave,
           "workloads": {w: (QUICK if args.quick else WORKLOADS)[w] for w in args.workloads},
           "settings": settings}
    doc["targets"] = report.targets(settings)
    print()
    print(report.render(doc))
    if args.json:
        from parallax_nb.jsonfile import atomic_write_text

        atomic_write_text(args.json, json.dumps(doc, indent=1))
        print(f"\nwrote {args.json}")
    if args.readme:
        report.update_readme(args.readme, doc, report.render(doc))
        print(f"updated {args.readme}")
    return 0


def _without(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """``argv`` without ``options`` and their values (``--x v`` or ``--x=v``)."""
    out, skip = [], False
    for a in argv:
        if skip and not a.startswith("--"):
            continue
        skip = False
        if a.split("=", 1)[0] in options:
            skip = "=" not in a
            continue
        out.append(a)
    return out


def repeated(args, argv: list[str]) -> int:
    """Run this benchmark ``args.invocations`` times, each a separate process that writes its
    own JSON; write every run and the medians with ranges (:mod:`repeats`)."""
    import repeats

    workdir = args.workdir or tempfile.mkdtemp(prefix="pxnb-bench-")
    os.makedirs(workdir, exist_ok=True)
    inner = _without(argv, ("--invocations", "--json", "--readme", "--workdir"))
    runs = []
    started = time.monotonic()
    for i in range(args.invocations):
        path = os.path.join(workdir, f"invocation-{i + 1}.json")
        print(f"=== invocation {i + 1} of {args.invocations}", flush=True)
        subprocess.run([sys.executable, os.path.abspath(__file__), *inner, "--json", path,
                        "--workdir", os.path.join(workdir, f"invocation-{i + 1}")], check=True)
        with open(path) as f:
            runs.append(json.load(f))
    summary = repeats.summarise(runs)
    doc = {"schema": "parallax_nb.bench_comm.invocations",
           "finished_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": " ".join([os.path.relpath(sys.argv[0], REPO), *argv]), "machine": report.machine_description(),
           "wall_s": time.monotonic() - started, "runs": runs, "summary": summary}
    doc["targets"] = repeats.targets(summary)
    text = repeats.render(doc)
    print()
    print(text)
    if args.json:
        from parallax_nb.jsonfile import atomic_write_text

        atomic_write_text(args.json, json.dumps(doc, indent=1))
        print(f"\nwrote {args.json}")
    if args.readme:
        report.update_readme(args.readme, doc, text)
        print(f"updated {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
