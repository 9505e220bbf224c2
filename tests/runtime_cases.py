"""Code that the multi-rank runtime tests run on every MPI rank (via parallax_nb.launch.run_on_ranks).

Each launch runs a list of cases in sequence (one mpirun start, one TensorFlow import per
rank) and returns, per case, what the parent compares with single-device training.
"""
from __future__ import annotations

import os
import shutil
import time


def make_job(workload: str, optimizer: str, **overrides):
    from parallax_nb.workloads import lm_job, recommender_job

    factory = {"lm": lm_job, "recommender": recommender_job}[workload]
    return factory("tiny", optimizer=optimizer, **overrides)


def make_plan(job, architecture: str, partitions: int | None):
    from parallax_nb.plan import plan_for_kinds
    from parallax_nb.runtime.reference import variable_kinds

    return plan_for_kinds(variable_kinds(job), architecture, partitions=partitions or 1, model_name=job.name)


def run_case(case: dict) -> dict:
    """Train one case on this rank; rank 0 returns the weights, every rank its shard sizes."""
    from parallax_nb.runtime.trainer import Trainer

    job = make_job(case["workload"], case["optimizer"])
    plan = make_plan(job, case["architecture"], case.get("partitions"))
    placement_at_build: dict = {}
    job = job.replace(model=_noting_placement(job.model, placement_at_build))
    if "local_aggregation" in case:
        import dataclasses

        plan = dataclasses.replace(plan, local_aggregation=case["local_aggregation"])
    start = time.perf_counter()
    trainer = Trainer(job, plan, workers_per_machine=case.get("workers_per_machine"))
    storage = trainer.storage_bytes()
    ckpt_dir = case.get("checkpoint_dir")
    result = trainer.run(case["steps"], checkpoint_dir=ckpt_dir, checkpoint_every=case.get("checkpoint_every", 0),
                         resume=case.get("resume", False), step_timeout_s=case.get("step_timeout_s", 240))
    out = {"rank": trainer.rank, "storage": storage, "summary": result.summary(), "wall_s": time.perf_counter() - start,
           "losses": [r.loss for r in result.history], "checkpoints": result.checkpoints,
           "variables": result.variables, "local_aggregation": result.local_aggregation,
           "placement_at_build": placement_at_build,
           "collectives": {f"{m.value}/{k.value}": [(c.op, c.count, c.participants) for c in calls]
                           for (m, k), calls in trainer.exchange.collectives().items() if calls}}
    if case.get("carried_after"):
        out["carried_after"] = carried_after(trainer, job)
    if case.get("step_ops"):
        out["horovod_ops"] = horovod_ops(trainer, job)
    if trainer.rank == 0:
        out["weights"] = result.weights
    return out


def carried_after(trainer, job) -> list[str] | None:
    """The Horovod ops of the traced step that the allreduce carrying the loss and health
    flags (``px_ar_carried``) waits for, through data or control inputs; None when the step
    has no such allreduce."""
    graph = _step_graph(trainer, job)
    carried = [op for op in graph.get_operations() if op.type.startswith("Horovod") and "px_ar_carried" in op.name]
    if not carried:
        return None
    seen, todo = {}, [t.op for op in carried for t in op.inputs] + [c for op in carried for c in op.control_inputs]
    while todo:
        op = todo.pop()
        if op.name not in seen:
            seen[op.name] = op
            todo.extend([t.op for t in op.inputs] + list(op.control_inputs))
    return sorted(name for name, op in seen.items() if op.type.startswith("Horovod"))


def horovod_ops(trainer, job) -> list[str]:
    """The type and name of every Horovod op in the traced step."""
    graph = _step_graph(trainer, job)
    return sorted(f"{op.type} {op.name}" for op in graph.get_operations() if op.type.startswith("Horovod"))


def _step_graph(trainer, job):
    """The graph of ``trainer``'s traced step, for this rank's first batch of ``job``."""
    import tensorflow as tf

    x, y = next(iter(job.dataset(trainer.rank, trainer.ranks)))
    return trainer._step_fn.get_concrete_function(x, y, tf.constant(0.0)).graph


def _noting_placement(build, into: dict):
    """``build``, noting this rank's device placement and TensorFlow's devices when the model is built."""
    def build_noting_placement():
        import dataclasses

        import tensorflow as tf
        from parallax_nb.devices import current_placement

        placement = current_placement()
        into.update(placement=dataclasses.asdict(placement) if placement else None,
                    visible=[d.name for d in tf.config.get_visible_devices()],
                    physical=[d.name for d in tf.config.list_physical_devices()])
        return build()

    return build_noting_placement


# The LM with tables large enough that reading a whole table per step would show: 400,000 x
# 64 float32 rows (102 MB) for the embedding and for the sampled softmax.
LARGE_TABLES = dict(vocab_size=400_000, embedding_dim=64)


def compute_against_step(steps: int) -> dict:
    """The calibration of the LM with :data:`LARGE_TABLES`, the runtime's own step times
    training it (AR), and plain Horovod's training it as users write it
    (``benchmarks/baselines.py``), on the same ranks of one launch: ``{"calibration": this
    rank's measure_on_rank figures, "steps_s": this rank's step times, "horovod_steps_s":
    plain Horovod's, "launch_compute_s" and "launch_horovod_compute_s": the same compute
    figures timed again after the runs (``compute_seconds``, as benchmarks time them beside a
    run)}``."""
    import sys

    from parallax_nb.runtime.calibrate import compute_seconds, measure_on_rank
    from parallax_nb.runtime.trainer import Trainer
    from parallax_nb.types import PLAIN_HOROVOD

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from baselines import horovod_train

    job = make_job("lm", "sgd", **LARGE_TABLES)
    calibrated = measure_on_rank(job=job, sizes_bytes=(4 << 10, 64 << 10), repeats=2, idle_s=0.1, compute_steps=10)
    result = Trainer(job, make_plan(job, "ar", None)).run(steps)
    horovod = horovod_train(job, steps)
    launch = {key: compute_seconds(job, key, compute_steps=10) for key in (None, PLAIN_HOROVOD)}
    return {"calibration": calibrated, "steps_s": [r.step_time_s for r in result.history],
            "horovod_steps_s": [r.step_time_s for r in horovod],
            "launch_compute_s": launch[None], "launch_horovod_compute_s": launch[PLAIN_HOROVOD]}


def stop_asked_on(rank: int, at_poll: int, steps: int) -> dict:
    """The tiny LM under HYBRID where only ``rank`` asks to stop, from its ``at_poll``-th poll
    on: this rank's steps done, whether it stopped early, and how often it was polled."""
    from parallax_nb.runtime.context import rank_info
    from parallax_nb.runtime.trainer import Trainer

    job = make_job("lm", "sgd")
    me, polls = rank_info().rank, []

    def should_stop() -> bool:
        polls.append(len(polls) + 1)
        return me == rank and len(polls) >= at_poll

    result = Trainer(job, make_plan(job, "hybrid", None)).run(steps, should_stop=should_stop)
    return {"steps_done": result.steps_done, "stopped_early": result.stopped_early, "polls": len(polls)}


def run_cases(cases: list[dict]) -> list[dict]:
    """Every case in order; a case ``{"calibrate": kwargs}`` measures the collectives and the
    compute of the LM instead (:func:`parallax_nb.runtime.calibrate.measure_on_rank`), a case
    ``{"compute_against_step": kwargs}`` runs :func:`compute_against_step`, a case
    ``{"stop_asked_on": kwargs}`` :func:`stop_asked_on`."""
    results = []
    for case in cases:
        if "stop_asked_on" in case:
            results.append(stop_asked_on(**case["stop_asked_on"]))
            continue
        if "calibrate" in case:
            from parallax_nb.runtime.calibrate import measure_on_rank

            results.append(measure_on_rank(job=make_job("lm", "sgd"), **case["calibrate"]))
            continue
        if "compute_against_step" in case:
            results.append(compute_against_step(**case["compute_against_step"]))
            continue
        if "horovod_process_sets" in case:
            results.append(horovod_process_sets())
            continue
        if "guard_cases" in case:   # reliability_cases' guard cases, on these ranks
            import reliability_cases

            results.append(reliability_cases.guard_cases(**case["guard_cases"]))
            continue
        if case.get("copy_checkpoint"):
            src, dst = case["copy_checkpoint"]
            from parallax_nb.runtime.context import rank_info

            if rank_info().rank == 0 and not os.path.exists(dst):
                shutil.copytree(src, dst)
            from parallax_nb.runtime.context import barrier

            barrier("copy_checkpoint")
        results.append(run_case(case))
    return results


def horovod_process_sets() -> dict:
    """The process sets Horovod runs with now (ranks -> id, as the runtime keeps them), and
    whether Horovod is in its dynamic-sets mode."""
    from parallax_nb.runtime import context

    context.horovod()
    return {"sets": {ranks: ps.process_set_id for ranks, ps in context._process_sets.items()},
            "dynamic": os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS")}


def fail_on_rank(failing_rank: int, at_step: int, out_dir: str) -> None:
    """Train the LM; ``failing_rank`` raises inside its step callback at ``at_step`` (after
    writing the time to ``out_dir/failed_at``); every rank writes its pid to ``out_dir``."""
    from parallax_nb.runtime.trainer import Trainer

    job = make_job("lm", "sgd")
    plan = make_plan(job, "hybrid", 2)
    trainer = Trainer(job, plan)
    with open(os.path.join(out_dir, f"pid-{trainer.rank}"), "w") as f:
        f.write(str(os.getpid()))

    def on_step(record):
        if trainer.rank == failing_rank and record.step == at_step:
            with open(os.path.join(out_dir, "failed_at"), "w") as f:
                f.write(repr(time.time()))
            raise RuntimeError(f"injected failure on rank {failing_rank} at step {at_step}")

    trainer.run(1000, on_step=on_step, step_timeout_s=30)


def link_bytes_case(size: str, steps: int, first: int) -> dict:
    """On an emulated cluster: train the LM (HYBRID) with local aggregation on, then off; per
    run, this rank's ledger bytes per step and its machine link's bytes per step (the
    namespace's eth0, sent + received) over steps ``first + 1 .. steps``, and the final weights
    on rank 0."""
    import dataclasses

    from parallax_nb.runtime.trainer import Trainer
    from parallax_nb.workloads import lm_job

    def link() -> int:
        stats = "/sys/class/net/eth0/statistics/"
        return sum(int(open(stats + f"{d}_bytes").read()) for d in ("tx", "rx"))

    out = {}
    for aggregated in (True, False):
        job = lm_job(size, optimizer="sgd")
        plan = dataclasses.replace(make_plan(job, "hybrid", None), local_aggregation=aggregated)
        trainer = Trainer(job, plan)
        marks = {}

        def on_step(record):
            if record.step in (first, steps):
                marks[record.step] = link()

        result = trainer.run(steps, on_step=on_step, step_timeout_s=120)
        measured = result.history[first:steps]
        ledger = sum(r.bytes_sent + r.bytes_received for r in measured) / len(measured)
        out["on" if aggregated else "off"] = {
            "executed": result.local_aggregation, "topology": trainer.topology.describe(),
            "ledger_per_step": ledger, "link_per_step": (marks[steps] - marks[first]) / len(measured),
            "weights": result.weights if trainer.rank == 0 else None}
    return out
