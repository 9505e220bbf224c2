"""Optimizer factories that pickle by reference (module-level, wrapped in functools.partial)."""
from __future__ import annotations

import functools

from ..errors import ConfigError

DEFAULT_LEARNING_RATES = {"sgd": 0.5, "adam": 1e-2, "adagrad": 0.1}


def make_optimizer(name: str, learning_rate: float):
    import keras

    if name == "sgd":
        return keras.optimizers.SGD(learning_rate)
    if name == "adam":
        return keras.optimizers.Adam(learning_rate)
    if name == "adagrad":
        return keras.optimizers.Adagrad(learning_rate)
    raise ConfigError(f"unknown optimizer {name!r}", hint=f"choose one of {sorted(DEFAULT_LEARNING_RATES)}")


def optimizer_factory(name: str = "sgd", learning_rate: float | None = None):
    if name not in DEFAULT_LEARNING_RATES:
        raise ConfigError(f"unknown optimizer {name!r}", hint=f"choose one of {sorted(DEFAULT_LEARNING_RATES)}")
    lr = DEFAULT_LEARNING_RATES[name] if learning_rate is None else float(learning_rate)
    return functools.partial(make_optimizer, name, lr)
