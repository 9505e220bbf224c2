"""Keras models written the way their authors write them, and the code every MPI rank runs on
them for tests/test_keras_models.py (one list of cases per mpirun launch).

Models: a ``Sequential`` without ``keras.Input`` (built on first call), a subclassed
word2vec with its Embeddings made in ``__init__`` and dict inputs (its ``__init__`` takes a
dataclass, so Keras cannot serialise it), a subclassed LM whose output projection is its
input embedding (tied) and whose mixing layer is made in ``build()``, and a ``Sequential``
with ``BatchNormalization``, and a ``Sequential`` whose own layer reads its table with
``keras.ops.take`` (not through the runtime's lookup). Token ids come from small vocabularies, so rows repeat inside a
batch and across ranks.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

VOCAB, LENGTH, EXAMPLES, BATCH = 24, 6, 256, 8


def _ids(seed: int, shape) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.minimum(rng.zipf(1.5, shape) - 1, VOCAB - 1).astype(np.int32)


# ---------------------------------------------------------------------- models
def lazy_sequential():
    import keras

    keras.utils.set_random_seed(0)  # the same initial weights in every process (the reference's too)
    return keras.Sequential([keras.layers.Embedding(VOCAB, 8), keras.layers.GlobalAveragePooling1D(),
                             keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)], name="imdb")


def sequence_data():
    import tensorflow as tf

    ids = _ids(1, (EXAMPLES, LENGTH))
    labels = (np.random.default_rng(2).random(EXAMPLES) < 0.5).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((ids, labels))


@dataclass(frozen=True)
class Sizes:
    vocabulary: int
    dimension: int


def word2vec(sizes: Sizes = Sizes(VOCAB, 6)):
    import keras

    class Word2Vec(keras.Model):
        def __init__(self, sizes: Sizes):
            super().__init__(name="word2vec")
            self.target = keras.layers.Embedding(sizes.vocabulary, sizes.dimension, name="target")
            self.context = keras.layers.Embedding(sizes.vocabulary, sizes.dimension, name="context")

        def call(self, x):
            return keras.ops.sum(self.target(x["target"]) * self.context(x["context"]), axis=-1, keepdims=True)

    keras.utils.set_random_seed(0)
    return Word2Vec(sizes)


def pair_data():
    import tensorflow as tf

    pairs = {"target": _ids(3, (EXAMPLES,)), "context": _ids(4, (EXAMPLES,))}
    labels = (np.random.default_rng(5).random(EXAMPLES) < 0.5).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((pairs, labels))


def tied_lm():
    import keras

    keras.utils.set_random_seed(0)

    class TiedLM(keras.Model):
        def __init__(self):
            super().__init__(name="tied_lm")
            self.tokens = keras.layers.Embedding(VOCAB, 8, name="tokens")

        def build(self, input_shape):
            self.mix = keras.layers.Dense(8, activation="tanh", name="mix")

        def call(self, x):
            h = self.mix(self.tokens(x))
            return keras.ops.matmul(h, keras.ops.transpose(self.tokens.embeddings))

    return TiedLM()


def next_token_data():
    import tensorflow as tf

    ids = _ids(6, (EXAMPLES, LENGTH + 1))
    return tf.data.Dataset.from_tensor_slices((ids[:, :-1], ids[:, 1:]))


def batch_norm_sequential():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.layers.Embedding(VOCAB, 4), keras.layers.Flatten(), keras.layers.Dense(8),
                             keras.layers.BatchNormalization(momentum=0.5), keras.layers.Activation("relu"),
                             keras.layers.Dense(1)], name="bn")


def raw_gather():
    """A table read with ``keras.ops.take`` (``tf.gather`` underneath) in the user's own layer:
    a sparse gradient the runtime's lookup router never sees, so a PS plan serves the table
    whole (the executed plan says so)."""
    import keras

    keras.utils.set_random_seed(0)

    class Gathered(keras.layers.Layer):
        def build(self, input_shape):
            self.table = self.add_weight(shape=(VOCAB, 4), initializer="random_normal", name="table")

        def call(self, ids):
            return keras.ops.take(self.table, keras.ops.cast(ids, "int32"), axis=0)

    return keras.Sequential([Gathered(name="gathered"), keras.layers.GlobalAveragePooling1D(),
                             keras.layers.Dense(1)], name="raw_gather")


# ---------------------------------------------------------------------- losses, optimizers
def logistic_loss(y, logits):
    import keras

    return keras.losses.binary_crossentropy(keras.ops.reshape(y, (-1, 1)), logits, from_logits=True)


def next_token_loss(y, logits):
    import keras

    return keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)


def optimizer(name: str, **options):
    import keras

    excluded = options.pop("exclude_from_weight_decay", None)
    kinds = {"sgd": keras.optimizers.SGD, "adam": keras.optimizers.Adam, "adamw": keras.optimizers.AdamW}
    made = kinds[name](**options)
    if excluded:
        made.exclude_from_weight_decay(var_names=excluded)
    return made


MODELS = {
    "lazy_sequential": (lazy_sequential, sequence_data, logistic_loss),
    "word2vec": (word2vec, pair_data, logistic_loss),
    "tied_lm": (tied_lm, next_token_data, next_token_loss),
    "batch_norm": (batch_norm_sequential, sequence_data, logistic_loss),
    "raw_gather": (raw_gather, sequence_data, logistic_loss),
}


def make_job(model: str, opt: str = "sgd", options: dict | None = None, sync_batch_norm: bool = True):
    from parallax_nb.job import Job

    build, data, loss = MODELS[model]
    options = dict(options or {"learning_rate": 0.5 if opt == "sgd" else 0.02})
    return Job(model=build, loss=loss, optimizer=functools.partial(optimizer, opt, **options), data=data,
               batch_size=BATCH, name=model, sync_batch_norm=sync_batch_norm)


def w2v_job():
    """The word2vec job for ``python -m parallax_nb run keras_model_cases:w2v_job``."""
    return make_job("word2vec")


# ---------------------------------------------------------------------- on every rank
def run_case(case: dict) -> dict:
    """Train one case; every rank returns its copy of every variable it holds whole (all but
    PS sparse ones, which only rank 0's gathered result has) and rank 0 all weights; a case
    the runtime refuses returns the error instead."""
    from parallax_nb.errors import ParallaxError
    from parallax_nb.plan import plan_for_kinds
    from parallax_nb.runtime.reference import variable_kinds
    from parallax_nb.runtime.trainer import Trainer

    job = make_job(case["model"], case.get("optimizer", "sgd"), case.get("options"), case.get("sync_batch_norm", True))
    plan = plan_for_kinds(variable_kinds(job), case["architecture"], partitions=case.get("partitions", 2),
                          model_name=job.name)
    try:
        trainer = Trainer(job, plan)
    except ParallaxError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    result = trainer.run(case["steps"], step_timeout_s=240)
    whole = {s.name for s in trainer.syncs if not s.ps_sparse}
    out = {"rank": trainer.rank, "variables": result.variables, "summary": result.summary(),
           "replica": {n: w for n, w in result.weights.items() if n in whole or n not in result.variables}}
    if trainer.rank == 0:
        out["weights"] = result.weights
    return out


def run_cases(cases: list[dict]) -> list[dict]:
    return [run_case(case) for case in cases]
