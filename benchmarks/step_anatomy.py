"""Where a step's time goes: parallax_nb's runtime against plain Horovod on the same model.

Run under mpirun (every rank the same command)::

    mpirun -np 2 --mca btl tcp,self python benchmarks/step_anatomy.py --workload lm_tiny

Per configuration (plain Horovod, then parallax AR / PS / HYBRID with P = N), after
``--warmup`` steps, medians over ``--steps`` steps on rank 0:

* ``compute``: forward + backward of the same batch on one rank, no collective (a
  ``tf.function`` of the loss and its gradient): the floor every configuration pays;
* ``step``: the traced train step as the loop sees it (``StepRecord.step_time_s``: the
  ``tf.function`` call and the copies of its outputs to the host);
* ``loop``: the interval between two steps' ends, minus ``step``: the Python around the
  step (data, heartbeats, callbacks, records);
* the collectives one step issues (from the exchanges' own descriptions).

``--thread-cpu``: the CPU time each rank's threads used per step over the measured steps (the
kernel's per-thread counters, ``/proc/self/task``; 10 ms ticks, so a figure moves by about
10 ms / steps): the main (Python) thread, the threads the first ``hvd.init`` started (Horovod's
background loop and MPI's), and every other thread (TensorFlow's). Where a rank's CPU per
step is its whole step, the rank is bound by its core, not by waiting.

``--tf-profile DIR``: TensorFlow's profiler records ``--profile-steps`` steps after the warm-up
of each configuration on rank 0 (into ``DIR/<config>``), and a second table sums its host
events per step: the traced step's time in TensorFlow's executor, the Python around that call,
the asynchronous (Horovod) ops a step waited for, and the longest single op. Horovod's own
timeline of the calls (``HOROVOD_TIMELINE``) is read by ``timeline_calls.py``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]


def compute_floor(job, steps: int) -> float:
    import tensorflow as tf

    model = job.build_model()
    x, y = next(iter(job.dataset(0, 1)))

    @tf.function
    def grads():
        with tf.GradientTape() as tape:
            loss = job.loss_value(model, x, y, training=True)
        return tape.gradient(loss, model.trainable_variables)

    grads()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        [g.numpy() if not hasattr(g, "values") else g.values.numpy() for g in grads()]
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class Probe:
    def __init__(self, cpu: ThreadCpu | None = None):
        self.ends, self.steps = [], []
        self.cpu = cpu

    def __call__(self, record):
        self.ends.append(time.perf_counter())
        self.steps.append(record.step_time_s)
        if self.cpu is not None:
            self.cpu(len(self.ends))

    def medians(self, warmup: int) -> tuple[float, float]:
        step = statistics.median(self.steps[warmup:])
        interval = statistics.median(b - a for a, b in zip(self.ends[warmup:], self.ends[warmup + 1:]))
        return step, interval - step


def thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) each thread of this process has used so far."""
    import glob

    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in glob.glob("/proc/self/task/*"):
        try:
            with open(os.path.join(task, "stat")) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:   # the thread ended
            continue
        out[int(os.path.basename(task))] = (int(fields[11]) + int(fields[12])) / tick
    return out


class ThreadCpu:
    """CPU per step of the main thread, of ``horovod`` (the threads ``hvd.init`` started) and of
    every other thread, from the end of step ``start`` to the end of step ``end`` (read at those
    two steps only: a read takes about 0.3 ms)."""

    def __init__(self, horovod: set[int], start: int, end: int):
        self.horovod, self.start, self.end = horovod, start, end
        self.first = self.last = None
        self.steps = 0

    def __call__(self, done: int) -> None:
        if done == self.start:
            self.first = thread_cpu()
        elif done == self.end:
            self.last, self.steps = thread_cpu(), done - self.start

    def per_step(self) -> dict[str, float]:
        """Seconds per step: ``main``, ``horovod``, ``other`` and ``total``."""
        if not self.steps:
            return {}
        parts = {"main": 0.0, "horovod": 0.0, "other": 0.0}
        for tid, cpu in self.last.items():
            used = cpu - self.first.get(tid, 0.0)
            part = "main" if tid == os.getpid() else "horovod" if tid in self.horovod else "other"
            parts[part] += used / self.steps
        return {**parts, "total": sum(parts.values())}


class ProfiledProbe(Probe):
    """A :class:`Probe` that, on rank 0, runs TensorFlow's profiler over steps
    ``warmup + 1 .. warmup + steps`` into ``logdir``."""

    def __init__(self, logdir: str | None, warmup: int, steps: int, rank: int, cpu: ThreadCpu | None = None):
        super().__init__(cpu)
        self.logdir = logdir if rank == 0 else None
        self.start_at, self.stop_at = warmup, warmup + steps
        self.profiled = 0

    def __call__(self, record):
        super().__call__(record)
        if self.logdir is None:
            return
        import tensorflow as tf

        done = len(self.ends)
        if done == self.start_at:
            tf.profiler.experimental.start(self.logdir)
        elif done == self.stop_at:
            tf.profiler.experimental.stop()
            self.profiled = self.stop_at - self.start_at


def host_profile(logdir: str, steps: int) -> dict:
    """Per step, from the host events of the profile in ``logdir`` (microseconds): ``call`` the
    traced step function as Python called it, ``executor`` its run in TensorFlow's executor
    (``EagerLocalExecute: __inference_...``), ``async_ops`` the asynchronous ops it waited for
    (``ExecutorState::ProcessAsync::Done``, Horovod's ops), ``longest_op`` the longest op on the
    executor's threads (summed over the profiled steps, then divided)."""
    import collections
    import glob

    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))[-1], "rb") as f:
        space.ParseFromString(f.read())
    total, count, ops = collections.Counter(), collections.Counter(), collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host"):
            continue
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name = names.get(event.metadata_id, "")
                total[name] += event.duration_ps / 1e6
                count[name] += 1
                if line.name.startswith("tf_Compute") and ":" in name and "::" not in name:   # "<op>:<type>"
                    ops[name] += event.duration_ps / 1e6
    executor = sum(us for name, us in total.items() if name.startswith("EagerLocalExecute: __inference_"))
    call = max((us for name, us in total.items() if name in ("_step", "train_step")), default=0.0)
    return {"call": call / steps, "executor": executor / steps,
            "async_ops": count["ExecutorState::ProcessAsync::Done"] / steps,
            "longest_op": (max(ops.values()) / steps) if ops else 0.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="lm_tiny", help="lm, lm_tiny, cnn or recommender (bench_comm.py and bench_predict.py sizes)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--configs", nargs="+", default=["horovod", "ar", "ps", "hybrid"])
    parser.add_argument("--tf-profile", metavar="DIR", help="profile steps of each configuration on rank 0 here")
    parser.add_argument("--profile-steps", type=int, default=20)
    parser.add_argument("--workers-per-machine", type=int, default=None,
                        help="ranks per machine for parallax_nb's configurations (all ranks: one machine, where "
                             "local aggregation gathers every sparse AR variable at once); default: as the runtime "
                             "finds the machines")
    parser.add_argument("--thread-cpu", action="store_true",
                        help="the CPU time per step of the main thread, Horovod's and MPI's threads, and the others")
    args = parser.parse_args()
    if args.tf_profile and args.profile_steps > args.steps:
        parser.error(f"--profile-steps {args.profile_steps} is more than --steps {args.steps}")
    from bench_comm import WORKLOADS
    from bench_predict import WORKLOADS as PREDICTED
    from baselines import horovod_train
    from worker import make_job
    from parallax_nb.plan import plan_for_kinds
    from parallax_nb.runtime.context import horovod
    from parallax_nb.runtime.reference import variable_kinds
    from parallax_nb.runtime.trainer import Trainer

    before = set(thread_cpu())
    hvd = horovod()
    started_by_horovod = set(thread_cpu()) - before
    job = make_job({**PREDICTED, **WORKLOADS}[args.workload])
    total = args.warmup + args.steps
    rows, profiles, cpu = [], {}, []
    for config in args.configs:
        logdir = os.path.join(args.tf_profile, config) if args.tf_profile else None
        threads = ThreadCpu(started_by_horovod, args.warmup, total) if args.thread_cpu else None
        probe = ProfiledProbe(logdir, args.warmup, args.profile_steps, hvd.rank(), threads) if logdir else Probe(threads)
        collectives = "DistributedGradientTape: 1 allreduce per dense gradient (fused by Horovod), 2 allgathers per sparse one"
        if config == "horovod":
            horovod_train(job, total, on_step=probe)
        else:
            plan = plan_for_kinds(variable_kinds(job), config, partitions=hvd.size(), model_name=job.name)
            trainer = Trainer(job, plan, workers_per_machine=args.workers_per_machine)
            trainer.run(total, on_step=probe)
            collectives = "; ".join(f"{m.value}/{k.value}: " + ", ".join(f"{c.count} {c.op} ({c.participants})"
                                                                     for c in cs)
                                    for (m, k), cs in trainer.exchange.collectives().items() if cs)
        step, loop = probe.medians(args.warmup)
        rows.append((config, step, loop, collectives))
        if logdir and hvd.rank() == 0:
            profiles[config] = host_profile(logdir, probe.profiled)
        if threads is not None:
            cpu.append((config, threads.per_step(), probe.ends))
    if hvd.rank() == 0:
        floor = compute_floor(job, args.steps)
        print(f"{args.workload}, {hvd.size()} ranks: compute floor (forward + backward, one rank, no collective) "
              f"{floor * 1e3:.2f} ms")
        print(f"  {'config':<8} {'step ms':>8} {'loop ms':>8} {'vs horovod':>10}  collectives per step")
        base = rows[0][1] + rows[0][2] if rows[0][0] == "horovod" else None
        for config, step, loop, collectives in rows:
            ratio = f"{(step + loop) / base:.2f}x" if base else "-"
            print(f"  {config:<8} {step * 1e3:8.2f} {loop * 1e3:8.2f} {ratio:>10}  {collectives}")
        if profiles:
            print(f"TensorFlow's profiler, rank 0, {args.profile_steps} steps each, per step:")
            print(f"  {'config':<8} {'executor us':>11} {'python us':>10} {'async ops':>9} {'longest op us':>13}")
            for config, p in profiles.items():
                print(f"  {config:<8} {p['executor']:11.0f} {p['call'] - p['executor']:10.0f} {p['async_ops']:9.1f} "
                      f"{p['longest_op']:13.1f}")
        if cpu:
            print("CPU per step by thread, rank 0, over the measured steps (10 ms ticks: about "
                  f"{10e3 / args.steps:.0f} us per step of resolution):")
            print(f"  {'config':<8} {'period us':>9} {'all us':>7} {'main us':>8} {'Horovod+MPI us':>14} {'other us':>9}")
            for config, c, ends in cpu:
                period = (ends[-1] - ends[args.warmup - 1]) / (len(ends) - args.warmup)
                print(f"  {config:<8} {period * 1e6:9.0f} {c['total'] * 1e6:7.0f} {c['main'] * 1e6:8.0f} "
                      f"{c['horovod'] * 1e6:14.0f} {c['other'] * 1e6:9.0f}")
    from parallax_nb.runtime.context import shutdown

    shutdown()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # no atexit hook may block in a collective
