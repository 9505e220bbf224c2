"""What a distributed run reports: one :class:`StepRecord` per step and a :class:`TrainResult`."""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import devices
from ..calibration import horovod_settings
from ..types import RUN_SCHEMA, RUN_SCHEMA_VERSION

#: How the runtime treats a row gathered several times in one step (README, "Correctness").
SPARSE_GRADIENT_SEMANTICS = ("repeated rows summed before the optimizer: dense-equivalent updates "
                             "(Keras alone feeds Adam/Adagrad/RMSprop one entry per occurrence)")


def assign_weights(model, weights: dict) -> None:
    """Set ``model.variables`` from ``weights`` (path -> array, in ``model.variables`` order).

    By path when every path matches; otherwise by position (Keras numbers auto-named objects
    such as seed generators per process, so a model rebuilt elsewhere may name them
    ``seed_generator_1``), provided count and shapes agree.
    """
    from ..errors import CheckpointError

    variables = list(model.variables)
    if all(v.path in weights for v in variables):
        pairs = [(v, weights[v.path]) for v in variables]
    else:
        values = list(weights.values())
        if len(values) != len(variables) or any(tuple(np.shape(a)) != tuple(v.shape)
                                                for v, a in zip(variables, values)):
            missing = [v.path for v in variables if v.path not in weights]
            raise CheckpointError(f"weights do not fit the model: no values for {missing}",
                                  hint="were they produced by another model?")
        pairs = list(zip(variables, values))
    for v, a in pairs:
        if tuple(np.shape(a)) != tuple(v.shape):
            raise CheckpointError(f"weight {v.path!r} has shape {tuple(np.shape(a))}, the model expects {tuple(v.shape)}")
        v.assign(a)


@dataclass(frozen=True)
class StepRecord:
    """One step as seen by one rank.

    ``loss``: mean over all ranks of their mean batch loss (= the global-batch loss); in an
    asynchronous run this rank's own mean batch loss.
    ``examples_per_s``: global examples (N * b) / ``step_time_s`` (wall time of this rank's step).
    ``bytes_sent`` / ``bytes_received``: bytes this rank put on / took off the wire in this
    step, summed over variables; ``bytes_by_variable[name] = (sent, received)``
    (see :mod:`parallax_nb.runtime.accounting`). ``steps_ahead``: in an asynchronous run, how
    many steps this rank was ahead of the slowest worker when it started this step
    (:mod:`parallax_nb.staleness`); None in a synchronous one.
    """

    step: int
    loss: float
    examples_per_s: float
    step_time_s: float
    bytes_sent: float
    bytes_received: float
    bytes_by_variable: dict = field(default_factory=dict)
    steps_ahead: int | None = None

    def to_row(self) -> dict:
        row = {"step": self.step, "loss": self.loss, "examples_per_s": self.examples_per_s,
               "step_time_s": self.step_time_s, "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received}
        if self.steps_ahead is not None:
            row["steps_ahead"] = self.steps_ahead
        return row


@dataclass
class TrainResult:
    """The outcome of :func:`parallax_nb.runtime.train` on one rank.

    ``weights``: every model variable (trainable and not) by path, full single-device values
    (PS variables gathered from their owners). ``history``: this rank's step records of this
    call (steps continue the numbering of a resumed checkpoint). ``variables``: per trainable
    variable, ``{"method", "kind", "partitions"}`` as executed; ``executed_plan`` the same with the
    topology and every change from the requested plan, with its reason. ``first_measured_step`` is the
    index in ``history`` from which summaries are taken (the first step, which traces the
    step function, is left out when there is more than one).
    """

    steps_done: int
    history: list[StepRecord]
    weights: dict[str, np.ndarray]
    stopped_early: bool
    job: Any = None
    ranks: int = 1
    machines: int = 1
    workers_per_machine: int = 1
    architecture: str = "hybrid"
    batch_size_per_rank: int = 0
    variables: dict = field(default_factory=dict)
    rank: int = 0
    checkpoints: list[str] = field(default_factory=list)
    rank_mean_bytes: dict | None = None  # name -> (sent, received) per step, mean over ranks
    local_aggregation: bool = False  # executed (the plan asked and machines hold several ranks)
    batch_norm: dict | None = None  # {"layers": [names], "statistics": "global batch" | "per rank" | "none"}
    executed_plan: Any = None  # parallax_nb.executed.ExecutedPlan: what ran and how it differs from the plan
    staleness: Any = None  # parallax_nb.staleness.MeasuredStaleness of every rank (asynchronous runs only)
    # the Horovod settings and cores of the process that made the result, the rank that trained
    # (a summary taken in a notebook's kernel, which holds the engines' results, must not read the kernel's)
    horovod_env: dict = field(default_factory=lambda: horovod_settings(os.environ))
    rank_cores: int = field(default_factory=devices.rank_cores)

    def single_device_model(self):
        """The user's model (``job.model()``) holding the trained weights, incl. non-trainable."""
        if self.job is None:
            raise ValueError("this TrainResult carries no Job to rebuild the model from")
        from ..errors import CheckpointError

        model = self.job.build_model()
        assign_weights(model, self.weights)
        return model

    @property
    def measured(self) -> list[StepRecord]:
        return self.history[1:] if len(self.history) > 1 else list(self.history)

    def summary(self) -> dict:
        """The run summary (schema ``parallax_nb.run`` v1). Byte figures are per rank per step,
        averaged over the measured steps and over all ranks (comparable to the cost model's
        bytes per machine per step with one rank per machine); times are this rank's medians.
        ``sync`` / ``max_staleness`` as executed; ``staleness``: every rank's steps ahead of the
        slowest (:class:`parallax_nb.staleness.MeasuredStaleness`), None in a synchronous run."""
        measured = self.measured

        def median(values):
            return float(statistics.median(values)) if values else float("nan")

        def mean(values):
            return float(sum(values) / len(values)) if values else 0.0

        variables = {}
        for name, info in self.variables.items():
            variables[name] = dict(info)
            if self.rank_mean_bytes is not None:
                sent, received = self.rank_mean_bytes.get(name, (0.0, 0.0))
            else:
                sent = mean([r.bytes_by_variable.get(name, (0.0, 0.0))[0] for r in measured])
                received = mean([r.bytes_by_variable.get(name, (0.0, 0.0))[1] for r in measured])
            variables[name]["bytes_sent_per_step"] = float(sent)
            variables[name]["bytes_received_per_step"] = float(received)
        return {
            "schema": RUN_SCHEMA, "schema_version": RUN_SCHEMA_VERSION,
            "ranks": self.ranks, "machines": self.machines, "workers_per_machine": self.workers_per_machine,
            "local_aggregation": bool(self.local_aggregation), "architecture": self.architecture, "steps": self.steps_done,
            "batch_size_per_rank": self.batch_size_per_rank,
            "batch_norm": self.batch_norm or {"layers": [], "statistics": "none"},
            "sparse_gradients": SPARSE_GRADIENT_SEMANTICS,
            "step_time_s_median": median([r.step_time_s for r in measured]),
            "measured_steps": [measured[0].step, measured[-1].step] if measured else [],
            "examples_per_s_median": median([r.examples_per_s for r in measured]),
            "final_loss": float(self.history[-1].loss) if self.history else float("nan"),
            "variables": variables,
            **({"executed_plan": self.executed_plan.to_dict()} if self.executed_plan is not None else {}),
            # synchronous or asynchronous as executed, and the measured staleness (parallax_nb.staleness)
            "sync": self.executed_plan.sync if self.executed_plan is not None else True,
            "max_staleness": self.executed_plan.max_staleness if self.executed_plan is not None else None,
            "staleness": self.staleness.to_dict() if self.staleness is not None else None,
            "bytes_sent_per_step": float(sum(v["bytes_sent_per_step"] for v in variables.values())),
            "bytes_received_per_step": float(sum(v["bytes_received_per_step"] for v in variables.values())),
            # what a calibration must have been taken under to predict this run (parallax_nb.calibration)
            "horovod_env": dict(self.horovod_env),
            "rank_cores": self.rank_cores,   # the cores this rank could use (devices.bind_rank)
        }

