"""Reference workloads (DESIGN.md §8), with data generated locally: an LM1B-shaped language
model, a DLRM-shaped recommender and a small dense CNN. Each takes a size knob: ``tiny`` for
tests, ``small``, and ``realistic`` for benchmarks.

The module-level ``lm_tiny``, ``recommender_tiny`` and ``cnn_tiny`` are factories usable as
``module:name`` job specs on the command line (``parallax_nb.workloads:lm_tiny``).
"""
from .cnn import CNNConfig, cnn_job
from .lm import LMConfig, lm_job
from .recommender import RecommenderConfig, recommender_job

WORKLOADS = {"lm": lm_job, "recommender": recommender_job, "cnn": cnn_job}


def lm_tiny():
    return lm_job("tiny")


def lm_small():
    return lm_job("small")


def lm_realistic():
    return lm_job("realistic")


def recommender_tiny():
    return recommender_job("tiny")


def cnn_tiny():
    return cnn_job("tiny")


__all__ = ["WORKLOADS", "lm_job", "recommender_job", "cnn_job", "LMConfig", "RecommenderConfig", "CNNConfig",
           "lm_tiny", "lm_small", "lm_realistic", "recommender_tiny", "cnn_tiny"]
