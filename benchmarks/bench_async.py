"""Asynchronous against synchronous training with a straggler, side by side (issue 16).

For every setting (loopback with ``--ranks`` ranks; ``--network MxG@bandwidth``, an emulated
cluster, as root), in one invocation and on the same ranks' launch per configuration: the LM
(``lm_job(--size)``, ``--optimizer`` (plain SGD by default; Adam and Adagrad are applied by
the owners as Keras applies them) at ``--learning-rate``, ``--batch-size`` per rank) under
architecture PS, each rank training ``--steps`` steps

* synchronously (``plan.sync`` True),
* asynchronously, unbounded (``max_staleness`` None),
* stale-synchronous with ``max_staleness = --ssp``,

with rank 1 made ``--slowdown`` times slower per step: after each step it sleeps
``(slowdown - 1)`` times that step's own duration.

Printed per configuration:

* **examples/s**: the sum over ranks of each rank's own rate, ``batch * steps after the
  warm-up / the seconds those steps took on that rank`` (a worker that finished early and
  waits for the others at the end is not charged that wait: it could have gone on training);
* **loss**: the trained model's mean loss on the first ``--eval-batches`` batches of the whole
  data set (one shard), computed on rank 0 with the gathered weights, single device. Every
  configuration has seen the same number of examples (ranks x steps x batch). Synchronous
  training makes one update per step, of the W workers' mean gradient, at ``--learning-rate``;
  asynchronous workers each apply their own, W updates where synchronous training makes one,
  so they train at ``--async-learning-rate`` (default: ``--learning-rate / W``, the same
  distance per W pushes as one synchronous step: a like-for-like comparison of the loss);
* **sequential SGD** (the same optimizer): the loss of single-device training with the same
  per-example learning rate and as many updates as the asynchronous workers make together (``ranks x steps``
  steps of ``--batch-size`` at ``--async-learning-rate``). Asynchronous training is that,
  but with the gradients computed on parameters up to ``max_staleness`` steps old: the
  distance between the two is what staleness costs. Against synchronous training, which makes
  a quarter as many updates of four times the batch, it also differs by the batch size.

**Predicted first**: before anything trains, per setting, the cost model's outlook
(:func:`parallax_nb.cost.asynchronous.straggler_outlook`) for the plan on that cluster (one
machine of ``--ranks`` workers on loopback, the emulated network's machines and bandwidth
otherwise), uncalibrated, from a profile of the job on this process's device: examples/s of
sync, async and SSP (the long run) with rank 1 ``--slowdown`` times slower per step. The
summary puts it beside what was measured.

``--invocations N`` repeats the whole grid and prints each figure's median and range.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from parallax_nb.netem.network import parse_spec  # noqa: E402

CONFIGS = ("sync", "async", "ssp")


def train_with_straggler(size: str, steps: int, warmup: int, sync: bool, max_staleness, slow_rank: int,
                         slowdown: float, learning_rate: float, batch_size: int, eval_batches: int,
                         optimizer: str = "sgd") -> dict:
    """On every rank: train, rank ``slow_rank`` slowed; this rank's rate, rank 0 also the loss."""
    from parallax_nb.plan import plan_for_kinds
    from parallax_nb.runtime.context import rank_info
    from parallax_nb.runtime.reference import variable_kinds
    from parallax_nb.runtime.trainer import Trainer
    from parallax_nb.workloads import lm_job

    job = lm_job(size, optimizer=optimizer, learning_rate=learning_rate, batch_size=batch_size)
    info = rank_info()
    plan = plan_for_kinds(variable_kinds(job), "ps", partitions=info.size, model_name=job.name, sync=sync,
                          max_staleness=None if sync else max_staleness)
    trainer = Trainer(job, plan)
    ends = []

    def on_step(record):
        if info.rank == slow_rank:
            time.sleep((slowdown - 1.0) * record.step_time_s)
        ends.append(time.perf_counter())

    result = trainer.run(steps, on_step=on_step)
    timed = ends[warmup:]
    out = {"rank": info.rank, "examples_per_s": batch_size * (len(timed) - 1) / (timed[-1] - timed[0]),
           "steps_ahead_max": max(trainer.steps_ahead, default=0)}
    if info.rank == 0:
        out["loss"] = _loss_on_data(job, result.weights, eval_batches)
        out["initial_loss"] = _loss_on_data(job, None, eval_batches)
    return out


def _loss_on_data(job, weights: dict, batches: int) -> float:
    """Mean loss of ``job``'s model holding ``weights`` (None: its initial weights, as every
    configuration starts) on the first ``batches`` batches of the whole data set (one shard),
    single device."""
    model = job.build_model()
    for variable in model.variables if weights is not None else ():
        variable.assign(weights[variable.path])
    losses = [float(job.loss_value(model, x, y, training=False))
              for x, y in job.dataset(0, 1).take(batches)]
    return statistics.mean(losses)


def run_setting(setting: str, args) -> dict:
    """Every configuration of one setting: ``{config: {"examples_per_s", "loss", ...}}``."""
    from parallax_nb.launch import run_on_ranks

    kwargs = dict(size=args.size, steps=args.steps, warmup=args.warmup, slow_rank=1, slowdown=args.slowdown,
                  learning_rate=args.learning_rate, batch_size=args.batch_size, eval_batches=args.eval_batches,
                  optimizer=args.optimizer)
    out = {"predicted": predicted_outlook(setting, args)}
    print(f"  {setting} predicted (uncalibrated):\n    " + "\n    ".join(out["predicted"]["lines"]), flush=True)
    for config in CONFIGS:
        call = dict(kwargs, sync=config == "sync", max_staleness=args.ssp if config == "ssp" else None)
        if config != "sync":
            call["learning_rate"] = async_learning_rate(args, ranks_of(setting))
        if setting.startswith("loop"):
            per_rank = run_on_ranks(train_with_straggler, int(setting[4:]), kwargs=call, timeout_s=args.timeout)
        else:
            from parallax_nb.netem import EmulatedCluster

            with EmulatedCluster.from_spec(setting) as cluster:
                per_rank = run_on_ranks(train_with_straggler, cluster.ranks, kwargs=call, timeout_s=args.timeout,
                                        hostfile=cluster.hostfile, mpi_args=cluster.transport_args())
        out[config] = {"examples_per_s": sum(r["examples_per_s"] for r in per_rank),
                       "per_rank_examples_per_s": [r["examples_per_s"] for r in per_rank],
                       "steps_ahead_max": max(r["steps_ahead_max"] for r in per_rank),
                       "loss": per_rank[0]["loss"], "initial_loss": per_rank[0]["initial_loss"]}
        print(f"  {setting} {config}: {out[config]['examples_per_s']:.1f} examples/s "
              f"(per rank {[round(x, 1) for x in out[config]['per_rank_examples_per_s']]}), "
              f"loss {out[config]['loss']:.4f}, most steps ahead {out[config]['steps_ahead_max']}", flush=True)
    out["sequential_loss"] = sequential_loss(args, ranks_of(setting))
    print(f"  {setting} sequential {args.optimizer} (single device, {ranks_of(setting) * args.steps} steps of {args.batch_size}): "
          f"loss {out['sequential_loss']:.4f}", flush=True)
    return out


def predicted_outlook(setting: str, args) -> dict:
    """The cost model's examples/s per configuration for ``setting`` (module docstring)."""
    import parallax_nb as px
    from parallax_nb.cost import estimate
    from parallax_nb.cost.asynchronous import straggler_outlook
    from parallax_nb.plan import make_plan
    from parallax_nb.types import ClusterSpec
    from parallax_nb.workloads import lm_job

    job = lm_job(args.size, optimizer=args.optimizer, learning_rate=args.learning_rate, batch_size=args.batch_size)
    if setting.startswith("loop"):
        cluster = ClusterSpec.create(machines=1, workers_per_machine=ranks_of(setting))
    else:
        machines, per_machine, bandwidth = parse_spec(setting)
        cluster = ClusterSpec.create(machines=machines, workers_per_machine=per_machine,
                                     **({"bandwidth": bandwidth} if bandwidth else {}))
    profile = px.profile(job, steps=10)
    plan = make_plan(profile, cluster, "ps").with_sync(False, max_staleness=args.ssp)
    outlook = straggler_outlook(estimate(profile, plan), slowdown=args.slowdown, max_staleness=args.ssp)
    return {"sync": outlook.sync_examples_per_s, "async": outlook.async_examples_per_s,
            "ssp": outlook.bounded_examples_per_s, "lines": outlook.lines()}


def sequential_loss(args, ranks: int) -> float:
    """The sequential-SGD reference's loss (module docstring), single device, in this process."""
    from parallax_nb.runtime.reference import train_single_device
    from parallax_nb.workloads import lm_job

    job = lm_job(args.size, optimizer=args.optimizer, learning_rate=async_learning_rate(args, ranks),
                 batch_size=args.batch_size)
    weights, _ = train_single_device(job, ranks * args.steps, batch_size=args.batch_size)
    return _loss_on_data(job, weights, args.eval_batches)


def ranks_of(setting: str) -> int:
    """Ranks of a setting: ``loopN`` -> N, ``MxG@bandwidth`` -> M x G."""
    if setting.startswith("loop"):
        return int(setting[4:])
    machines, per_machine, _ = parse_spec(setting)
    return machines * per_machine


def async_learning_rate(args, ranks: int) -> float:
    """The asynchronous configurations' learning rate: ``--async-learning-rate``, else
    ``--learning-rate / ranks`` (module docstring)."""
    return args.async_learning_rate if args.async_learning_rate is not None else args.learning_rate / ranks


def summary(invocations: list[dict], args) -> str:
    """Median (min-max) over invocations of each configuration's examples/s, its ratio to
    sync's (taken inside each invocation) and its loss against sync's."""
    lines = [f"bench_async: LM {args.size}, PS, {args.optimizer} lr {args.learning_rate}, batch {args.batch_size} per rank, "
             f"{args.steps} steps per rank (rates after {args.warmup}), rank 1 {args.slowdown:g}x slower; "
             f"{len(invocations)} invocation(s), median (min-max)"]

    def fmt(values, unit=""):
        return f"{statistics.median(values):.3g}{unit} ({min(values):.3g}-{max(values):.3g})"

    for setting in invocations[0]:
        start = [inv[setting]["sync"]["initial_loss"] for inv in invocations]
        lines.append(f"{setting} (async and SSP at lr {async_learning_rate(args, ranks_of(setting)):g}; "
                     f"loss at the start {fmt(start)})")
        for config in CONFIGS:
            rates = [inv[setting][config]["examples_per_s"] for inv in invocations]
            ratio = [inv[setting][config]["examples_per_s"] / inv[setting]["sync"]["examples_per_s"] for inv in invocations]
            loss = [100 * (inv[setting][config]["loss"] / inv[setting]["sync"]["loss"] - 1) for inv in invocations]
            label = {"sync": "sync", "async": "async (unbounded)", "ssp": f"SSP k={args.ssp}"}[config]
            trained = [inv[setting][config]["loss"] for inv in invocations]
            predicted = [inv[setting]["predicted"][config] for inv in invocations]
            predicted_ratio = [inv[setting]["predicted"][config] / inv[setting]["predicted"]["sync"]
                               for inv in invocations]
            line = (f"  {label:<18} {fmt(rates)} examples/s   {fmt(ratio, 'x')} sync's   "
                    f"(predicted {fmt(predicted)}, {fmt(predicted_ratio, 'x')})   "
                    f"loss {fmt(trained)}, {fmt(loss, ' %')} vs sync's")
            if config != "sync":
                staleness = [100 * (inv[setting][config]["loss"] / inv[setting]["sequential_loss"] - 1)
                             for inv in invocations]
                line += f", {fmt(staleness, ' %')} vs sequential {args.optimizer}'s"
            lines.append(line)
        lines.append(f"  {'sequential ' + args.optimizer:<18} loss {fmt([inv[setting]['sequential_loss'] for inv in invocations])}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="*", default=[4], help="loopback rank counts")
    parser.add_argument("--network", nargs="*", default=[], help="emulated clusters, e.g. 2x2@1Gbit/s (root)")
    parser.add_argument("--size", default="small", choices=("tiny", "small", "realistic"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "adam", "adagrad"),
                        help="the LM's optimizer (lm_job's names)")
    parser.add_argument("--async-learning-rate", type=float, default=None,
                        help="learning rate of the asynchronous configurations (default: --learning-rate / ranks)")
    parser.add_argument("--slowdown", type=float, default=2.0)
    parser.add_argument("--ssp", type=int, default=2)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--invocations", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", help="write every invocation's figures here")
    args = parser.parse_args(argv)
    for name in ("learning_rate", "async_learning_rate"):
        value = getattr(args, name)
        if value is not None and not (value > 0 and value < float("inf")):
            parser.error(f"--{name.replace('_', '-')} must be a positive number, got {value}")
    if args.steps <= args.warmup + 1:
        parser.error(f"--steps ({args.steps}) must exceed --warmup + 1 ({args.warmup + 1})")
    settings = [f"loop{n}" for n in args.ranks] + list(args.network)
    invocations = []
    for i in range(args.invocations):
        print(f"invocation {i + 1} of {args.invocations}", flush=True)
        invocations.append({setting: run_setting(setting, args) for setting in settings})
    text = summary(invocations, args)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "invocations": invocations, "summary": text}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
