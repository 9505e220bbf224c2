"""What the ranks run for tests/test_async_trainer.py: asynchronous training through the real
trainer (issue 16), returning plain numpy values the test checks in its own process."""
from __future__ import annotations

import time

import numpy as np

ROWS, DIM, IDS_PER_EXAMPLE, BATCH, EXAMPLES = 24, 2, 3, 4, 400
LEARNING_RATE = 0.5   # with BATCH = 4 every update is a multiple of 1/8: exact in float32
TABLE, BIAS = "table/embeddings", "bias/bias"


def example_ids() -> np.ndarray:
    """The data: EXAMPLES examples of IDS_PER_EXAMPLE row ids each (duplicates inside an
    example, a batch and across ranks)."""
    return np.random.default_rng(7).integers(0, ROWS, (EXAMPLES, IDS_PER_EXAMPLE)).astype(np.int32)


def initial_table() -> np.ndarray:
    return np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM)


def _table_initializer(shape, dtype=None):
    return initial_table()


def build_model():
    """An example's output is the sum of its rows' entries plus a bias: its loss (the output
    itself) has gradient 1 in every entry of each row occurrence and 1 for the bias."""
    import keras

    class Bias(keras.layers.Layer):
        def build(self, input_shape):
            self.bias = self.add_weight(shape=(1,), initializer="zeros", name="bias")

        def call(self, x):
            return x + self.bias[0]

    ids = keras.Input((IDS_PER_EXAMPLE,), dtype="int32")
    rows = keras.layers.Embedding(ROWS, DIM, embeddings_initializer=_table_initializer, name="table")(ids)
    total = keras.ops.sum(rows, axis=(1, 2))
    return keras.Model(ids, Bias(name="bias")(total), name="constant_gradient")


def _loss(y, y_pred):
    return y_pred


def _data():
    import tensorflow as tf

    ids = example_ids()
    return tf.data.Dataset.from_tensor_slices((ids, np.zeros(len(ids), np.float32)))


def constant_gradient_job():
    import keras
    from parallax_nb.job import Job

    return Job(model=build_model, loss=_loss, optimizer=lambda: keras.optimizers.SGD(LEARNING_RATE), data=_data,
               batch_size=BATCH, name="constant_gradient")


def nadam_job():
    """The constant-gradient job with an optimizer the owners have no rule for."""
    return constant_gradient_job().replace(optimizer=_nadam)


def _nadam():
    import keras

    return keras.optimizers.Nadam(0.01)


def constant_gradient_case(steps: int, partitions: int, max_staleness, slow_rank: int, slow_s: float) -> dict:
    """Asynchronous PS training of the constant-gradient model; ``slow_rank`` sleeps ``slow_s``
    after each step, so the others run ahead (as far as ``max_staleness`` lets them)."""
    from parallax_nb.plan import plan_for_kinds
    from parallax_nb.runtime.trainer import Trainer

    plan = plan_for_kinds({TABLE: "sparse", BIAS: "dense"}, "ps", partitions=partitions, model_name="constant_gradient",
                          sync=False, max_staleness=max_staleness)
    import horovod.tensorflow as hvd

    trainer = Trainer(constant_gradient_job(), plan)
    horovod_in_steps = []

    def on_step(record):
        horovod_in_steps.append(hvd.is_initialized())
        if trainer.rank == slow_rank:
            time.sleep(slow_s)

    result = trainer.run(steps, on_step=on_step, step_timeout_s=120)
    out = {"rank": trainer.rank, "steps_ahead": list(trainer.steps_ahead), "losses": [r.loss for r in result.history],
           "bytes": [r.bytes_by_variable for r in result.history], "horovod_in_steps": horovod_in_steps,
           "horovod_after": hvd.is_initialized()}
    if trainer.rank == 0:
        out["weights"] = result.weights
    return out


def make_optimizer(name: str):
    """The optimizers the owners' rules are checked against, by name (every option a rule
    implements, with weight decay, a schedule and each kind of clipping)."""
    import keras

    o = keras.optimizers
    return {
        "sgd": lambda: o.SGD(0.5),
        "sgd_nesterov_clipnorm": lambda: o.SGD(0.2, momentum=0.9, nesterov=True, clipnorm=0.05),
        "sgd_momentum_decay": lambda: o.SGD(0.2, momentum=0.5, weight_decay=0.01),
        "adam_schedule": lambda: o.Adam(o.schedules.ExponentialDecay(0.01, 2, 0.5), amsgrad=True),
        "adamw_global_clipnorm": lambda: o.AdamW(0.01, weight_decay=0.1, global_clipnorm=0.5),
        "adagrad_clipvalue": lambda: o.Adagrad(0.1, clipvalue=0.001),
        "rmsprop": lambda: o.RMSprop(0.01, momentum=0.5, centered=True),
    }[name]()


def sync_against_async(workload: str, steps: int, partitions: int, optimizer: str = "sgd") -> dict:
    """The same job and plan (architecture PS) trained synchronously, then asynchronously,
    with the optimizer :func:`make_optimizer` names; with the final optimizer slots."""
    import functools

    from runtime_cases import make_job, make_plan

    from parallax_nb.runtime.checkpoint import slot_map
    from parallax_nb.runtime.trainer import Trainer

    out = {}
    for sync in (True, False):
        job = make_job(workload, "sgd").replace(optimizer=functools.partial(make_optimizer, optimizer))
        plan = make_plan(job, "ps", partitions).with_sync(sync)
        trainer = Trainer(job, plan)
        result = trainer.run(steps, step_timeout_s=120)
        slots, _ = slot_map(trainer.optimizer, [v for s in trainer.syncs for v in s.optimizer_variables])
        by_part = {f"{s.name}:{slot}:{p}": v.numpy() for s in trainer.syncs if s.shard is not None
                   for p, part in zip(s.shard.owned, s.shard.parts) for slot, v in slots.get(id(part), {}).items()}
        out["sync" if sync else "async"] = {"weights": result.weights, "losses": [r.loss for r in result.history],
                                            "variables": result.variables, "steps_ahead": list(trainer.steps_ahead),
                                            "slots": by_part}
    return out


def _constant_plan(partitions: int, max_staleness):
    from parallax_nb.plan import plan_for_kinds

    return plan_for_kinds({TABLE: "sparse", BIAS: "dense"}, "ps", partitions=partitions, model_name="constant_gradient",
                          sync=False, max_staleness=max_staleness)


def _slowed(trainer, slow_rank: int, slow_s: float):
    def on_step(record):
        if trainer.rank == slow_rank:
            time.sleep(slow_s)
    return on_step


def checkpoint_case(steps: int, resume_to: int, stop_from: int, every: int, partitions: int, max_staleness,
                    directory: str, slow_rank: int, slow_s: float) -> dict:
    """Checkpoints of asynchronous training of the constant-gradient model (``slow_rank``
    sleeping after each step, so the workers drift apart between checkpoints):

    1. ``steps`` steps with a checkpoint every ``every`` steps into ``directory/run``;
    2. a new trainer resumes from the newest of them and goes on to ``resume_to`` steps;
    3. into ``directory/stop``, rank ``slow_rank`` asks to stop from step ``stop_from`` on (the
       others never ask): every rank must stop together at the next checkpoint.

    Returns each part's checkpoint paths, steps done and (rank 0) final weights."""
    import os

    from parallax_nb.runtime.trainer import Trainer

    plan = _constant_plan(partitions, max_staleness)
    run_dir, stop_dir = os.path.join(directory, "run"), os.path.join(directory, "stop")
    trainer = Trainer(constant_gradient_job(), plan)
    first = trainer.run(steps, checkpoint_dir=run_dir, checkpoint_every=every,
                        on_step=_slowed(trainer, slow_rank, slow_s), step_timeout_s=120)
    trainer = Trainer(constant_gradient_job(), plan)
    resumed = trainer.run(resume_to, checkpoint_dir=run_dir, checkpoint_every=every, resume=True,
                          on_step=_slowed(trainer, slow_rank, slow_s), step_timeout_s=120)
    trainer = Trainer(constant_gradient_job(), plan)
    asked = {"step": 0}

    def on_step(record):
        asked["step"] = record.step
        _slowed(trainer, slow_rank, slow_s)(record)

    stopped = trainer.run(resume_to, checkpoint_dir=stop_dir, checkpoint_every=every, on_step=on_step,
                          should_stop=lambda: trainer.rank == slow_rank and asked["step"] + 1 >= stop_from,
                          step_timeout_s=120)
    out = {"rank": trainer.rank, "checkpoints": first.checkpoints, "steps_done": first.steps_done,
           "resumed_steps": [r.step for r in resumed.history], "resumed_checkpoints": resumed.checkpoints,
           "stopped_early": stopped.stopped_early, "stopped_steps_done": stopped.steps_done,
           "stopped_checkpoints": stopped.checkpoints}
    if trainer.rank == 0:
        out.update(weights=first.weights, resumed_weights=resumed.weights, stopped_weights=stopped.weights)
    return out


ACCUMULATOR_START = 0.5   # Adagrad's initial accumulator: with squares of multiples of 1/4, exact sums


def adagrad_checkpoint_case(steps: int, resume_to: int, every: int, partitions: int, directory: str,
                            slow_rank: int, slow_s: float) -> dict:
    """The constant-gradient model under asynchronous Adagrad (an optimizer with a slot):
    ``steps`` steps with a checkpoint every ``every`` into ``directory/adagrad``, then a new
    trainer resumed from the newest to ``resume_to``. The accumulator sums the squares of every
    push's gradients, so each checkpoint's says exactly which pushes its owners had applied.
    Returns the checkpoint paths of both runs."""
    import functools
    import os

    import keras

    from parallax_nb.runtime.trainer import Trainer

    job = constant_gradient_job().replace(optimizer=functools.partial(
        keras.optimizers.Adagrad, LEARNING_RATE, initial_accumulator_value=ACCUMULATOR_START))
    plan = _constant_plan(partitions, None)
    folder = os.path.join(directory, "adagrad")
    trainer = Trainer(job, plan)
    first = trainer.run(steps, checkpoint_dir=folder, checkpoint_every=every,
                        on_step=_slowed(trainer, slow_rank, slow_s), step_timeout_s=120)
    trainer = Trainer(job, plan)
    resumed = trainer.run(resume_to, checkpoint_dir=folder, checkpoint_every=every, resume=True,
                          on_step=_slowed(trainer, slow_rank, slow_s), step_timeout_s=120)
    return {"rank": trainer.rank, "checkpoints": first.checkpoints, "resumed_checkpoints": resumed.checkpoints}


def expected_accumulators(ranks: int, steps: int) -> tuple[np.ndarray, float]:
    """Adagrad's accumulators of the table and the bias after every push of every rank's first
    ``steps`` steps, each applied once: a push of rank r's step s adds, per row, the square of
    (the row's occurrences in that batch / BATCH) in every entry, and 1 for the bias."""
    ids = example_ids()
    table = np.full((ROWS, DIM), ACCUMULATOR_START, np.float32)
    for r in range(ranks):
        shard = ids[r::ranks]
        for s in range(steps):
            counts = np.bincount(shard[s * BATCH:(s + 1) * BATCH].reshape(-1), minlength=ROWS)
            table += np.square(counts / np.float32(BATCH)).astype(np.float32)[:, None]
    return table, ACCUMULATOR_START + ranks * steps


def nan_labels_job(fail_rank: int, fail_step: int):
    """The constant-gradient job whose loss also adds ``0 * label``: the same gradients, but
    shard ``fail_rank``'s labels of step ``fail_step`` are NaN, so that rank's loss (only) is
    NaN in that step and its NaN guard raises."""
    import keras
    from parallax_nb.job import Job

    def data(shard_index: int, num_shards: int):
        import tensorflow as tf

        ids = example_ids()[shard_index::num_shards]
        labels = np.zeros(len(ids), np.float32)
        if shard_index == fail_rank:
            labels[(fail_step - 1) * BATCH:fail_step * BATCH] = np.nan
        return tf.data.Dataset.from_tensor_slices((ids, labels))

    def loss(y, y_pred):
        return y_pred + 0.0 * y

    return Job(model=build_model, loss=loss, optimizer=lambda: keras.optimizers.SGD(LEARNING_RATE), data=data,
               batch_size=BATCH, name="constant_gradient_nan")


def failing_step_case(steps: int, partitions: int, fail_rank: int, fail_step: int, how: str = "nan") -> dict:
    """Asynchronous training, unbounded staleness, where rank ``fail_rank`` fails in step
    ``fail_step``: ``how`` "nan": its loss is NaN, its NaN guard raises; "callback": its
    ``on_step`` raises a plain RuntimeError after that step. Every rank records the error it
    ended with (class, message, wall time), and which asynchronous serving threads are still
    alive afterwards."""
    import threading

    from parallax_nb.runtime.trainer import Trainer

    job = nan_labels_job(fail_rank, fail_step) if how == "nan" else constant_gradient_job()
    trainer = Trainer(job, _constant_plan(partitions, None))

    def on_step(record):
        if how == "callback" and trainer.rank == fail_rank and record.step == fail_step:
            raise RuntimeError(f"the user's callback failed at step {record.step}")

    out = {"rank": trainer.rank, "error": None, "message": None, "raised_at": None}
    try:
        result = trainer.run(steps, on_step=on_step, step_timeout_s=120)
        out["steps_done"] = result.steps_done
    except Exception as e:  # noqa: BLE001 - what each rank ended with is the result
        out.update(error=type(e).__name__, message=str(e), raised_at=time.time(), steps_done=trainer.step)
    out["servers_alive"] = [t.name for t in threading.enumerate() if t.name.startswith("px-async-ps-server")]
    out["server_released"] = trainer.server is None
    return out


def run_cases(cases: list[tuple[str, dict]]) -> list:
    return [globals()[name](**kwargs) for name, kwargs in cases]


# ----------------------------------------------------------------------------- a rank SIGKILLed
KILL_RANK, KILL_AT_STEP = 1, 4
_PASSES = {"n": 0}


def _mark(name: str, text: str) -> None:
    import os

    folder = os.environ.get("PX_TEST_MARKERS")
    if folder:
        with open(os.path.join(folder, name + ".tmp"), "w") as f:
            f.write(text)
        os.replace(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))


def _killing_data(shard_index: int, num_shards: int):
    """The constant-gradient examples of one shard through a Python generator; every rank
    writes its pid (``pid-<shard>``), and shard KILL_RANK SIGKILLs its own process when
    training reads the first example of step KILL_AT_STEP (the trainer's first-batch check
    reads the data twice before training does), writing the time first (``killed_at``)."""
    import os
    import signal

    import tensorflow as tf

    _mark(f"pid-{shard_index}", str(os.getpid()))
    ids = example_ids()[shard_index::num_shards]

    def generate():
        _PASSES["n"] += 1
        for i, row in enumerate(ids):
            if shard_index == KILL_RANK and _PASSES["n"] > 2 and i == (KILL_AT_STEP - 1) * BATCH:
                _mark("killed_at", repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            yield row, np.float32(0.0)

    spec = (tf.TensorSpec((IDS_PER_EXAMPLE,), tf.int32), tf.TensorSpec((), tf.float32))
    return tf.data.Dataset.from_generator(generate, output_signature=spec)


def killed_rank_job():
    """For ``python -m parallax_nb run --async``: the constant-gradient job whose rank KILL_RANK
    is SIGKILLed in step KILL_AT_STEP."""
    return constant_gradient_job().replace(data=_killing_data, name="constant_gradient_killed")


def sigkilled_case(marker_dir: str, steps: int, kill_rank: int, kill_step: int) -> dict:
    """For ``launch.run_on_ranks``: asynchronous training (max_staleness 2) in which rank
    ``kill_rank`` SIGKILLs its own process after step ``kill_step``, writing the time first
    (``killed_at``); every rank writes its pid (``pid-<rank>``)."""
    import os
    import signal

    from parallax_nb.runtime.trainer import Trainer

    trainer = Trainer(constant_gradient_job(), _constant_plan(2, 2))
    with open(os.path.join(marker_dir, f"pid-{trainer.rank}"), "w") as f:
        f.write(str(os.getpid()))

    def on_step(record):
        if trainer.rank == kill_rank and record.step == kill_step:
            with open(os.path.join(marker_dir, "killed_at"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

    trainer.run(steps, on_step=on_step, step_timeout_s=120)
    return {"rank": trainer.rank}


def _slow_data(shard_index: int, num_shards: int, pause_s: float = 0.05):
    """The constant-gradient examples of one shard, each after ``pause_s`` (a step of 4 takes
    0.2 s: slow enough for a test to kill a rank mid-run)."""
    import tensorflow as tf

    ids = example_ids()[shard_index::num_shards]

    def generate():
        for row in ids:
            time.sleep(pause_s)
            yield row, np.float32(0.0)

    spec = (tf.TensorSpec((IDS_PER_EXAMPLE,), tf.int32), tf.TensorSpec((), tf.float32))
    return tf.data.Dataset.from_generator(generate, output_signature=spec)


def slow_constant_gradient_job():
    return constant_gradient_job().replace(data=_slow_data, name="constant_gradient_slow")


def nan_on_rank_1_job():
    """For ``python -m parallax_nb run --async``: rank 1's loss is NaN in step 3."""
    return nan_labels_job(1, 3)
