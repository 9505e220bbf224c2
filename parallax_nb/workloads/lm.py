"""A word language model in the shape of LM1B (Jozefowicz et al. 2016), scaled by a size knob.

tokens -> Embedding(V, E) -> LSTM(H) -> Dense(E) -> sampled softmax over V. The two large
variables are sparse: the input embedding (rows of the batch's tokens) and the softmax
weights and biases (rows of the targets and of the sampled candidates). The sampled softmax
gathers its rows through :func:`parallax_nb.ops.embedding_lookup`, so on engines those rows
come from parameter servers like the embedding's.

Candidates are drawn from the log-uniform (Zipf) proposal with a stateless RNG keyed by a
step counter kept in the layer, so every worker of a step draws the same candidates as the
single-device run of the same global batch: distributed training stays exactly comparable.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import numpy as np

from .data import config_of_size, shard_rows, zipf_ids

SIZES = {
    "tiny": dict(vocab_size=1003, embedding_dim=16, hidden_dim=16, seq_len=8, num_sampled=32, num_examples=4096),
    "small": dict(vocab_size=20000, embedding_dim=64, hidden_dim=64, seq_len=16, num_sampled=256, num_examples=16384),
    "realistic": dict(vocab_size=100000, embedding_dim=512, hidden_dim=128, seq_len=20, num_sampled=1024,
                      num_examples=32768),
}


@dataclass(frozen=True)
class LMConfig:
    vocab_size: int = 1003
    embedding_dim: int = 16
    hidden_dim: int = 16
    seq_len: int = 8
    num_sampled: int = 32
    num_examples: int = 4096
    zipf_exponent: float = 1.1
    seed: int = 0

    @classmethod
    def of_size(cls, size: str = "tiny", **overrides) -> "LMConfig":
        return config_of_size(cls, SIZES, size, "LM", overrides)


def _log_uniform_log_prob(ids, vocab_size: int):
    import tensorflow as tf

    ids = tf.cast(ids, tf.float64)
    p = (tf.math.log(ids + 2.0) - tf.math.log(ids + 1.0)) / np.log(vocab_size + 1.0)
    return tf.cast(tf.math.log(p), tf.float32)


def _sampled_softmax_layer_class():
    import keras
    import tensorflow as tf

    from ..ops import embedding_lookups

    class SampledSoftmax(keras.layers.Layer):
        """Per-token sampled-softmax loss; ``call((hidden, targets))`` returns (batch, time) losses."""

        def __init__(self, vocab_size, num_sampled, seed=0, **kwargs):
            super().__init__(**kwargs)
            self.vocab_size = int(vocab_size)
            self.num_sampled = int(num_sampled)
            self.seed = int(seed)

        def build(self, input_shape):
            dim = int(input_shape[0][-1])
            self.softmax_w = self.add_weight(name="softmax_w", shape=(self.vocab_size, dim),
                                             initializer=keras.initializers.RandomNormal(stddev=0.05, seed=self.seed + 1))
            self.softmax_b = self.add_weight(name="softmax_b", shape=(self.vocab_size,), initializer="zeros")
            self.sample_step = self.add_weight(name="sample_step", shape=(), dtype="int64",
                                               initializer="zeros", trainable=False)

        def sample_candidates(self):
            u = tf.random.stateless_uniform([self.num_sampled], seed=tf.stack(
                [tf.cast(self.seed, tf.int64), tf.convert_to_tensor(self.sample_step.value)]), dtype=tf.float64)
            ids = tf.floor(tf.exp(u * np.log(self.vocab_size + 1.0))) - 1.0
            return tf.clip_by_value(tf.cast(ids, tf.int64), 0, self.vocab_size - 1)

        def call(self, inputs, training=None):
            hidden, targets = inputs
            targets = tf.cast(targets, tf.int64)
            sampled = self.sample_candidates()
            if training:
                self.sample_step.assign_add(1)
            # One lookup per variable for the targets and the candidates together, so a row
            # that is both moves once (as tf.nn.sampled_softmax_loss does with all_ids); the
            # weights and biases together, so a router that can serves both in one exchange.
            flat_targets = tf.reshape(targets, [-1])
            all_ids = tf.concat([flat_targets, sampled], 0)
            all_w, all_b = embedding_lookups([(self.softmax_w, all_ids), (self.softmax_b, all_ids)])
            n_true = tf.size(flat_targets)
            true_w = tf.reshape(all_w[:n_true], tf.concat([tf.shape(targets), [-1]], 0))   # (B, T, D)
            true_b = tf.reshape(all_b[:n_true], tf.shape(targets))                       # (B, T)
            sampled_w, sampled_b = all_w[n_true:], all_b[n_true:]                        # (S, D), (S,)
            true_logits = tf.reduce_sum(hidden * true_w, -1) + true_b - _log_uniform_log_prob(targets, self.vocab_size)
            sampled_logits = (tf.einsum("btd,sd->bts", hidden, sampled_w) + sampled_b
                              - _log_uniform_log_prob(sampled, self.vocab_size))
            accidental = tf.equal(targets[..., None], sampled[None, None, :])
            sampled_logits = tf.where(accidental, tf.fill(tf.shape(sampled_logits), -1e9), sampled_logits)
            logits = tf.concat([true_logits[..., None], sampled_logits], axis=-1)
            return tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=tf.zeros(tf.shape(targets), tf.int32), logits=logits)

        def get_config(self):
            return {**super().get_config(), "vocab_size": self.vocab_size,
                    "num_sampled": self.num_sampled, "seed": self.seed}

    return SampledSoftmax


@functools.lru_cache(maxsize=None)
def sampled_softmax_class():
    """The SampledSoftmax Keras layer class (created lazily so importing needs no TensorFlow)."""
    cls = _sampled_softmax_layer_class()
    import keras
    return keras.saving.register_keras_serializable("parallax_nb")(cls)


def build_lm_model(config: LMConfig):
    """Inputs ``{"tokens", "targets"}`` (batch, seq_len) int32; output per-token losses."""
    import keras

    tokens = keras.Input((config.seq_len,), dtype="int32", name="tokens")
    targets = keras.Input((config.seq_len,), dtype="int32", name="targets")
    x = keras.layers.Embedding(config.vocab_size, config.embedding_dim, name="embedding",
                               embeddings_initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=config.seed))(tokens)
    x = keras.layers.LSTM(config.hidden_dim, return_sequences=True, name="lstm",
                          kernel_initializer=keras.initializers.GlorotUniform(seed=config.seed + 2),
                          recurrent_initializer=keras.initializers.Orthogonal(seed=config.seed + 3))(x)
    x = keras.layers.Dense(config.embedding_dim, name="projection",
                           kernel_initializer=keras.initializers.GlorotUniform(seed=config.seed + 4))(x)
    losses = sampled_softmax_class()(config.vocab_size, config.num_sampled, seed=config.seed,
                                     name="softmax")((x, targets))
    return keras.Model({"tokens": tokens, "targets": targets}, losses, name="lm")


def model_output_loss(y_true, y_pred):
    """The LM's model already returns its per-token losses: the loss is their mean."""
    import tensorflow as tf

    return tf.reduce_mean(y_pred)


@functools.lru_cache(maxsize=8)
def lm_corpus(config: LMConfig) -> np.ndarray:
    """``num_examples`` sequences of ``seq_len + 1`` Zipf-distributed token ids."""
    rng = np.random.default_rng(config.seed + 1234)
    return zipf_ids(rng, config.vocab_size, (config.num_examples, config.seq_len + 1), config.zipf_exponent)


def lm_data(config: LMConfig, shard_index: int, num_shards: int):
    import tensorflow as tf

    corpus = shard_rows(lm_corpus(config), shard_index, num_shards)
    features = {"tokens": corpus[:, :-1], "targets": corpus[:, 1:]}
    return tf.data.Dataset.from_tensor_slices((features, corpus[:, 1:]))


def lm_job(size: str = "tiny", batch_size: int = 8, optimizer: str = "sgd", learning_rate: float | None = None,
           **overrides):
    """The LM reference workload as a Job. ``size``: tiny (tests), small, realistic (benchmarks)."""
    from ..job import Job
    from .optimizers import optimizer_factory

    config = LMConfig.of_size(size, **overrides)
    return Job(model=functools.partial(build_lm_model, config), loss=model_output_loss,
               optimizer=optimizer_factory(optimizer, learning_rate), data=functools.partial(lm_data, config),
               batch_size=batch_size, name=f"lm-{size}", metadata={"workload": "lm", **asdict(config)})
