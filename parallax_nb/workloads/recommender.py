"""A recommender in the wide & deep / DLRM shape: several embedding tables of different sizes
(Zipf-distributed category ids), a few dense features, an MLP, a click label."""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import numpy as np

from .data import config_of_size, shard_rows, zipf_ids

SIZES = {
    "tiny": dict(table_sizes=(101, 57, 13), embedding_dim=8, dense_features=4, hidden=(16,), num_examples=4096),
    "small": dict(table_sizes=(20000, 5000, 1000, 100), embedding_dim=32, dense_features=8, hidden=(64, 32),
                  num_examples=16384),
    "realistic": dict(table_sizes=(200000, 50000, 10000, 1000), embedding_dim=64, dense_features=13,
                      hidden=(256, 128), num_examples=65536),
}


@dataclass(frozen=True)
class RecommenderConfig:
    table_sizes: tuple = (101, 57, 13)
    embedding_dim: int = 8
    dense_features: int = 4
    hidden: tuple = (16,)
    num_examples: int = 4096
    zipf_exponent: float = 1.05
    seed: int = 0

    @classmethod
    def of_size(cls, size: str = "tiny", **overrides) -> "RecommenderConfig":
        return config_of_size(cls, SIZES, size, "recommender", overrides)


def build_recommender_model(config: RecommenderConfig):
    import keras

    inputs, parts = {}, []
    for i, size in enumerate(config.table_sizes):
        inputs[f"cat_{i}"] = keras.Input((1,), dtype="int32", name=f"cat_{i}")
        emb = keras.layers.Embedding(size, config.embedding_dim, name=f"table_{i}",
                                     embeddings_initializer=keras.initializers.RandomUniform(-0.05, 0.05,
                                                                                             seed=config.seed + i))
        parts.append(keras.layers.Flatten()(emb(inputs[f"cat_{i}"])))
    inputs["dense"] = keras.Input((config.dense_features,), dtype="float32", name="dense")
    parts.append(inputs["dense"])
    x = keras.layers.Concatenate()(parts)
    for j, width in enumerate(config.hidden):
        x = keras.layers.Dense(width, activation="relu", name=f"mlp_{j}",
                               kernel_initializer=keras.initializers.GlorotUniform(seed=config.seed + 100 + j))(x)
    logit = keras.layers.Dense(1, name="click",
                               kernel_initializer=keras.initializers.GlorotUniform(seed=config.seed + 200))(x)
    return keras.Model(inputs, logit, name="recommender")


def click_loss(y_true, y_pred):
    import tensorflow as tf

    return tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.cast(y_true, tf.float32), logits=y_pred)


@functools.lru_cache(maxsize=8)
def recommender_examples(config: RecommenderConfig):
    rng = np.random.default_rng(config.seed + 99)
    n = config.num_examples
    cats = [zipf_ids(rng, size, (n, 1), config.zipf_exponent) for size in config.table_sizes]
    dense = rng.normal(size=(n, config.dense_features)).astype(np.float32)
    score = dense[:, 0] + 0.5 * (cats[0][:, 0] % 7 == 0)
    labels = (score + 0.3 * rng.normal(size=n) > 0.5).astype(np.float32)[:, None]
    return cats, dense, labels


def recommender_data(config: RecommenderConfig, shard_index: int, num_shards: int):
    import tensorflow as tf

    cats, dense, labels = recommender_examples(config)
    features = {f"cat_{i}": shard_rows(c, shard_index, num_shards) for i, c in enumerate(cats)}
    features["dense"] = shard_rows(dense, shard_index, num_shards)
    return tf.data.Dataset.from_tensor_slices((features, shard_rows(labels, shard_index, num_shards)))


def recommender_job(size: str = "tiny", batch_size: int = 16, optimizer: str = "sgd",
                    learning_rate: float | None = None, **overrides):
    from ..job import Job
    from .optimizers import optimizer_factory

    config = RecommenderConfig.of_size(size, **overrides)
    return Job(model=functools.partial(build_recommender_model, config), loss=click_loss,
               optimizer=optimizer_factory(optimizer, learning_rate),
               data=functools.partial(recommender_data, config), batch_size=batch_size,
               name=f"recommender-{size}", metadata={"workload": "recommender", **asdict(config)})
