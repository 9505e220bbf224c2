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
    start = time.perf_counter()
    trainer = Trainer(job, plan)
    storage = trainer.storage_bytes()
    ckpt_dir = case.get("checkpoint_dir")
    result = trainer.run(case["steps"], checkpoint_dir=ckpt_dir, checkpoint_every=case.get("checkpoint_every", 0),
                         resume=case.get("resume", False), step_timeout_s=case.get("step_timeout_s", 240))
    out = {"rank": trainer.rank, "storage": storage, "summary": result.summary(), "wall_s": time.perf_counter() - start,
           "losses": [r.loss for r in result.history], "checkpoints": result.checkpoints,
           "variables": result.variables}
    if trainer.rank == 0:
        out["weights"] = result.weights
    return out


def run_cases(cases: list[dict]) -> list[dict]:
    results = []
    for case in cases:
        if case.get("copy_checkpoint"):
            src, dst = case["copy_checkpoint"]
            from parallax_nb.runtime.context import rank_info

            if rank_info().rank == 0 and not os.path.exists(dst):
                shutil.copytree(src, dst)
            from parallax_nb.runtime.context import barrier

            barrier("copy_checkpoint")
        results.append(run_case(case))
    return results


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
