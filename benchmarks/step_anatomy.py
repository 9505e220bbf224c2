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
    def __init__(self):
        self.ends, self.steps = [], []

    def __call__(self, record):
        self.ends.append(time.perf_counter())
        self.steps.append(record.step_time_s)

    def medians(self, warmup: int) -> tuple[float, float]:
        step = statistics.median(self.steps[warmup:])
        interval = statistics.median(b - a for a, b in zip(self.ends[warmup:], self.ends[warmup + 1:]))
        return step, interval - step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="lm_tiny")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--configs", nargs="+", default=["horovod", "ar", "ps", "hybrid"])
    args = parser.parse_args()
    from bench_comm import WORKLOADS
    from baselines import horovod_train
    from worker import make_job
    from parallax_nb.plan import plan_for_kinds
    from parallax_nb.runtime.context import horovod
    from parallax_nb.runtime.reference import variable_kinds
    from parallax_nb.runtime.trainer import Trainer

    hvd = horovod()
    job = make_job(WORKLOADS[args.workload])
    total = args.warmup + args.steps
    rows = []
    for config in args.configs:
        probe = Probe()
        collectives = "DistributedGradientTape: 1 allreduce per dense gradient (fused by Horovod), 2 allgathers per sparse one"
        if config == "horovod":
            horovod_train(job, total, on_step=probe)
        else:
            plan = plan_for_kinds(variable_kinds(job), config, partitions=hvd.size(), model_name=job.name)
            trainer = Trainer(job, plan)
            trainer.run(total, on_step=probe)
            collectives = "; ".join(f"{m.value}/{k.value}: " + ", ".join(f"{c.count} {c.op} ({c.participants})"
                                                                     for c in cs)
                                    for (m, k), cs in trainer.exchange.collectives().items() if cs)
        step, loop = probe.medians(args.warmup)
        rows.append((config, step, loop, collectives))
    if hvd.rank() == 0:
        floor = compute_floor(job, args.steps)
        print(f"{args.workload}, {hvd.size()} ranks: compute floor (forward + backward, one rank, no collective) "
              f"{floor * 1e3:.2f} ms")
        print(f"  {'config':<8} {'step ms':>8} {'loop ms':>8} {'vs horovod':>10}  collectives per step")
        base = rows[0][1] + rows[0][2] if rows[0][0] == "horovod" else None
        for config, step, loop, collectives in rows:
            ratio = f"{(step + loop) / base:.2f}x" if base else "-"
            print(f"  {config:<8} {step * 1e3:8.2f} {loop * 1e3:8.2f} {ratio:>10}  {collectives}")
    from parallax_nb.runtime.context import shutdown

    shutdown()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # no atexit hook may block in a collective
