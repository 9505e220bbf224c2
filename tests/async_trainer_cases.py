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


def constant_gradient_case(steps: int, partitions: int, max_staleness, slow_rank: int, slow_s: float) -> dict:
    """Asynchronous PS training of the constant-gradient model; ``slow_rank`` sleeps ``slow_s``
    after each step, so the others run ahead (as far as ``max_staleness`` lets them)."""
    from parallax_nb.plan import plan_for_kinds
    from parallax_nb.runtime.trainer import Trainer

    plan = plan_for_kinds({TABLE: "sparse", BIAS: "dense"}, "ps", partitions=partitions, model_name="constant_gradient",
                          sync=False, max_staleness=max_staleness)
    trainer = Trainer(constant_gradient_job(), plan)

    def on_step(record):
        if trainer.rank == slow_rank:
            time.sleep(slow_s)

    result = trainer.run(steps, on_step=on_step, step_timeout_s=120)
    out = {"rank": trainer.rank, "steps_ahead": list(trainer.steps_ahead), "losses": [r.loss for r in result.history],
           "bytes": [r.bytes_by_variable for r in result.history]}
    if trainer.rank == 0:
        out["weights"] = result.weights
    return out


def sync_against_async(workload: str, steps: int, partitions: int) -> dict:
    """The same job and plan (architecture PS) trained synchronously, then asynchronously."""
    from runtime_cases import make_job, make_plan

    from parallax_nb.runtime.trainer import Trainer

    out = {}
    for sync in (True, False):
        job = make_job(workload, "sgd")
        plan = make_plan(job, "ps", partitions).with_sync(sync)
        trainer = Trainer(job, plan)
        result = trainer.run(steps, step_timeout_s=120)
        out["sync" if sync else "async"] = {"weights": result.weights, "losses": [r.loss for r in result.history],
                                            "variables": result.variables, "steps_ahead": list(trainer.steps_ahead)}
    return out


def run_cases(cases: list[tuple[str, dict]]) -> list:
    return [globals()[name](**kwargs) for name, kwargs in cases]


def checkpoint_refused(directory: str) -> str:
    """An asynchronous run asked for checkpoints: the ConfigError's text (or "not refused")."""
    from parallax_nb.errors import ConfigError
    from parallax_nb.plan import plan_for_kinds
    from parallax_nb.runtime.trainer import Trainer

    plan = plan_for_kinds({TABLE: "sparse", BIAS: "dense"}, "ps", model_name="constant_gradient", sync=False)
    try:
        Trainer(constant_gradient_job(), plan).run(2, checkpoint_dir=directory)
    except ConfigError as e:
        return str(e)
    return "not refused"
