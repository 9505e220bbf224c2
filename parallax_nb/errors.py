"""Errors a user of parallax_nb can see.

Every error says what was wrong, the value seen, and what to do about it. Bad user input
raises a subclass of :class:`ParallaxError` before anything deep in TensorFlow or MPI runs.
"""
from __future__ import annotations


class ParallaxError(Exception):
    """Base class of every error parallax_nb raises on purpose.

    ``hint`` is an optional sentence telling the user what to change; it is appended to the
    message so that a plain ``print(err)`` shows it.
    """

    def __init__(self, message: str, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(message if not hint else f"{message}\n  -> {hint}")


class ConfigError(ParallaxError, ValueError):
    """A value given by the user is invalid (batch size, cluster spec, bandwidth, ...)."""


class JobError(ParallaxError, ValueError):
    """The user's Job (model builder, loss, optimizer, data function) does not fit."""


class ProfileError(ParallaxError):
    """Profiling could not measure the model (no trainable variables, bad data, ...)."""


class PlanError(ParallaxError, ValueError):
    """A plan is invalid or does not match the model (unknown variable or method, ...)."""


class SetupError(ParallaxError, RuntimeError):
    """The environment is wrong: missing MPI, Horovod without TensorFlow, wrong TF version."""


class DistributedError(ParallaxError, RuntimeError):
    """A distributed run failed: a rank died, raised, or hung past its step timeout."""


class RankConnectionError(DistributedError):
    """Open MPI could not open a connection between two ranks, and the job did not finish."""


class CheckpointError(ParallaxError, RuntimeError):
    """A checkpoint is missing, corrupted, or from another model."""


class NumericError(ParallaxError, RuntimeError):
    """Training went numerically wrong: a loss, gradient or weight is NaN or infinite."""
