"""A run's measured step time against the estimate of what it executed, one way for every face.

The run view, the report and the CLI summary all show the same comparison, made here:

* predicted: :func:`parallax_nb.cost.estimate_executed` of the run's executed plan (each
  variable's method and the kind it ran as) on the run's own topology (machines x ranks per
  machine, local aggregation as executed), with the given bandwidth and latency and, when
  given, the calibration (``calibration=``; without one the estimate is uncalibrated);
* measured: the run's median step time over its steps after the first (the first step traces
  the training function and allocates, and is left out as warm-up);
* ``error % = 100 * (measured - predicted) / predicted``;
* a warning when the calibration was taken under other Horovod settings than the run's
  (``run_horovod_env``, the run summary's ``horovod_env``): the cycle time changes the idle
  link traffic and what each collective waits; or with other cores per rank
  (``run_rank_cores``, the summary's ``rank_cores``): bound or not, ranks compute at other
  speeds (:meth:`parallax_nb.calibration.Calibration.settings_mismatch`).

Pure Python.
"""
from __future__ import annotations

from ..types import StepTimeCheck


def calibration_of_shape(cluster, calibration):
    """``calibration`` when it was taken on ``cluster``'s shape (machines x ranks per machine),
    else None: a run on another shape than the calibrated one is estimated with the defaults
    (and its label says "uncalibrated") rather than refused, since the run already happened."""
    if calibration is None or (calibration.machines, calibration.workers_per_machine) != \
            (cluster.machines, cluster.workers_per_machine):
        return None
    return calibration


def measured_steps_text(first_step: int, last_step: int) -> str:
    """``"steps 2-30"``: the steps whose median is the measured step time (the first left out)."""
    first = first_step + 1 if last_step > first_step else first_step
    return f"step {last_step}" if first >= last_step else f"steps {first}-{last_step}"


def recorded_settings(summary: dict) -> dict:
    """What a run summary (run.json) records of the settings a calibration must share with the
    run, as :func:`check_step_time`'s keyword arguments (None where a summary predates one)."""
    return {"run_horovod_env": summary.get("horovod_env"), "run_rank_cores": summary.get("rank_cores")}


def check_step_time(profile, executed, cluster, measured_step_time_s: float, measured_steps: str,
                    calibration=None, run_horovod_env=None, run_rank_cores=None) -> StepTimeCheck | None:
    """:class:`StepTimeCheck` of a run (module docstring), or None when the run measured no step.
    ``run_horovod_env``: the Horovod settings the run ran with, ``run_rank_cores`` the cores each
    of its ranks could use (None: not known, no check)."""
    from .estimate import estimate_executed

    if measured_step_time_s is None or measured_step_time_s != measured_step_time_s:   # None or NaN
        return None
    used = calibration_of_shape(cluster, calibration)
    est = estimate_executed(profile, executed, cluster, calibration=used)
    label = est.calibration
    basis = (f"estimate of what ran on {cluster.machines} machine(s) x {cluster.workers_per_machine} rank(s) at "
             f"{cluster.bandwidth}, {label}")
    return StepTimeCheck(predicted_step_time_s=float(est.step_time_s),
                         measured_step_time_s=float(measured_step_time_s),
                         measured_steps=measured_steps, basis=basis,
                         warning=used.settings_mismatch(run_horovod_env, run_rank_cores) if used is not None else "")
