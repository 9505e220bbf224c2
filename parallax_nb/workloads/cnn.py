"""A small ResNet-style CNN: the dense control, where every gradient is a dense tensor.

No batch normalisation: its batch statistics would differ between one large batch and
several small ones, and the distributed run must equal the single-device one.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import numpy as np

from .data import config_of_size

SIZES = {
    "tiny": dict(image_size=8, channels=8, blocks=1, classes=10, num_examples=2048),
    "small": dict(image_size=16, channels=16, blocks=2, classes=10, num_examples=4096),
    "realistic": dict(image_size=32, channels=64, blocks=4, classes=100, num_examples=8192),
}


@dataclass(frozen=True)
class CNNConfig:
    image_size: int = 8
    channels: int = 8
    blocks: int = 1
    classes: int = 10
    num_examples: int = 2048
    seed: int = 0

    @classmethod
    def of_size(cls, size: str = "tiny", **overrides) -> "CNNConfig":
        return config_of_size(cls, SIZES, size, "CNN", overrides)


def build_cnn_model(config: CNNConfig):
    import keras

    def init(k):
        return keras.initializers.HeNormal(seed=config.seed + k)

    images = keras.Input((config.image_size, config.image_size, 3), name="images")
    x = keras.layers.Conv2D(config.channels, 3, padding="same", activation="relu", name="stem",
                            kernel_initializer=init(0))(images)
    for b in range(config.blocks):
        y = keras.layers.Conv2D(config.channels, 3, padding="same", activation="relu", name=f"block{b}_conv1",
                                kernel_initializer=init(10 * b + 1))(x)
        y = keras.layers.Conv2D(config.channels, 3, padding="same", name=f"block{b}_conv2",
                                kernel_initializer=init(10 * b + 2))(y)
        x = keras.layers.Activation("relu")(keras.layers.Add()([x, y]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    logits = keras.layers.Dense(config.classes, name="classifier", kernel_initializer=init(99))(x)
    return keras.Model(images, logits, name="cnn")


def classification_loss(y_true, y_pred):
    import tensorflow as tf

    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(y_true, tf.int32), logits=y_pred)


@functools.lru_cache(maxsize=4)
def cnn_examples(config: CNNConfig):
    rng = np.random.default_rng(config.seed + 7)
    images = rng.normal(size=(config.num_examples, config.image_size, config.image_size, 3)).astype(np.float32)
    labels = rng.integers(0, config.classes, size=config.num_examples).astype(np.int32)
    return images, labels


def cnn_data(config: CNNConfig, shard_index: int, num_shards: int):
    import tensorflow as tf

    images, labels = cnn_examples(config)
    return tf.data.Dataset.from_tensor_slices((images[shard_index::num_shards], labels[shard_index::num_shards]))


def cnn_job(size: str = "tiny", batch_size: int = 16, optimizer: str = "sgd", learning_rate: float | None = None,
            **overrides):
    from ..job import Job
    from .optimizers import optimizer_factory

    config = CNNConfig.of_size(size, **overrides)
    return Job(model=functools.partial(build_cnn_model, config), loss=classification_loss,
               optimizer=optimizer_factory(optimizer, learning_rate), data=functools.partial(cnn_data, config),
               batch_size=batch_size, name=f"cnn-{size}", metadata={"workload": "cnn", **asdict(config)})
