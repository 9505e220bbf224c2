"""Synthetic data for the reference workloads, generated locally and deterministically.

Token and category ids follow a Zipf law (p(rank k) ~ 1/k^s), the shape of real text and
click logs: a few ids are hot, most are rare, which is what makes embedding gradients sparse.
"""
from __future__ import annotations

import numpy as np


def zipf_ids(rng: np.random.Generator, vocab_size: int, shape, exponent: float = 1.1) -> np.ndarray:
    """Ids in [0, vocab_size) with p(id = k) proportional to 1 / (k + 1)^exponent."""
    weights = 1.0 / np.arange(1, vocab_size + 1, dtype=np.float64) ** exponent
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    ids = np.searchsorted(cdf, rng.random(shape), side="right")
    return np.minimum(ids, vocab_size - 1).astype(np.int32)


def shard_rows(array: np.ndarray, shard_index: int, num_shards: int) -> np.ndarray:
    """Rows ``shard_index, shard_index + num_shards, ...``: the interleaved shard a Job expects."""
    return array[shard_index::num_shards]


def config_of_size(config_class, sizes: dict, size: str, what: str, overrides: dict):
    """``config_class`` at a named size (``tiny`` for tests ... ``realistic`` for benchmarks),
    with ``overrides`` on top; an unknown size or field is a ConfigError naming it."""
    from dataclasses import fields

    from ..errors import ConfigError

    if size not in sizes:
        raise ConfigError(f"unknown {what} size {size!r}", hint=f"choose one of {sorted(sizes)}")
    unknown = set(overrides) - {f.name for f in fields(config_class)}
    if unknown:
        raise ConfigError(f"unknown {what} settings {sorted(unknown)}",
                          hint=f"settings: {sorted(f.name for f in fields(config_class))}")
    return config_class(**{**sizes[size], **overrides})
