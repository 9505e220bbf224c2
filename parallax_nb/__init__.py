"""parallax_nb: plan and run sparsity-aware distributed training of TensorFlow 2 / Keras 3 models.

The journey is Job -> profile -> plan -> run -> report::

    import parallax_nb as px
    job = px.Job(model=build_model, loss=loss_fn, optimizer=make_optimizer, data=make_dataset, batch_size=64)
    prof = px.profile(job, steps=20)
    planner = px.plan(prof, px.ClusterSpec.create(machines=8, workers_per_machine=6, bandwidth="100Gbit/s"))
    run = px.run(job, planner.plan, engines=2, steps=100)
    px.report(prof, planner.plan, run).save("cost_report.html")

Names resolve lazily, so ``import parallax_nb`` is instant and needs no TensorFlow.
"""
from __future__ import annotations

import importlib
import sys
import types

from .version import __version__

# public name -> (module, attribute); attribute None means the module itself
_EXPORTS = {
    "Job": ("parallax_nb.job", "Job"),
    "load_job": ("parallax_nb.job", "load_job"),
    "ClusterSpec": ("parallax_nb.types", "ClusterSpec"),
    "Profile": ("parallax_nb.types", "Profile"),
    "VariableProfile": ("parallax_nb.types", "VariableProfile"),
    "Kind": ("parallax_nb.types", "Kind"),
    "Method": ("parallax_nb.types", "Method"),
    "Architecture": ("parallax_nb.types", "Architecture"),
    "Plan": ("parallax_nb.plan", "Plan"),
    "VariablePlan": ("parallax_nb.plan", "VariablePlan"),
    "make_plan": ("parallax_nb.plan", "make_plan"),
    "plan_for_kinds": ("parallax_nb.plan", "plan_for_kinds"),
    "estimate": ("parallax_nb.cost", "estimate"),
    "calibrate": ("parallax_nb.calibrate", "calibrate"),
    "Calibration": ("parallax_nb.calibration", "Calibration"),
    "compare_architectures": ("parallax_nb.cost", "compare_architectures"),
    "profile": ("parallax_nb.profile", "profile_job"),
    "plan": ("parallax_nb.planner", "plan"),
    "Planner": ("parallax_nb.planner", "Planner"),
    "run": ("parallax_nb.cluster", "run"),
    "Cluster": ("parallax_nb.cluster", "Cluster"),
    "Run": ("parallax_nb.cluster", "Run"),
    "report": ("parallax_nb.report", "report"),
    "Report": ("parallax_nb.report", "Report"),
    "workloads": ("parallax_nb.workloads", None),
    "ParallaxError": ("parallax_nb.errors", "ParallaxError"),
    "ConfigError": ("parallax_nb.errors", "ConfigError"),
    "JobError": ("parallax_nb.errors", "JobError"),
    "ProfileError": ("parallax_nb.errors", "ProfileError"),
    "PlanError": ("parallax_nb.errors", "PlanError"),
    "SetupError": ("parallax_nb.errors", "SetupError"),
    "DistributedError": ("parallax_nb.errors", "DistributedError"),
    "RankConnectionError": ("parallax_nb.errors", "RankConnectionError"),
    "CheckpointError": ("parallax_nb.errors", "CheckpointError"),
    "NumericError": ("parallax_nb.errors", "NumericError"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'parallax_nb' has no attribute {name!r}")
    module_name, attribute = _EXPORTS[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


class _PublicModule(types.ModuleType):
    """Keeps ``px.plan``, ``px.profile`` and ``px.report`` the functions: when a submodule of the
    same name (``parallax_nb.plan`` ...) is first imported, Python sets it as an attribute of
    the package, which would turn ``px.plan(prof)`` into calling a module."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and name in _EXPORTS and _EXPORTS[name][1] is not None:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _PublicModule


def __dir__():
    return sorted(set(globals()) | set(__all__))


def _install_in_ipython() -> None:
    """Inside IPython: ParallaxErrors shown as message + hint, and phase displays for long
    waits (:mod:`parallax_nb.widgets.ipython`); outside, nothing."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is not None:
        from .widgets.ipython import install

        install(shell)


_install_in_ipython()


def load_ipython_extension(ipython):
    """``%load_ext parallax_nb`` registers the ``%parallax`` magics."""
    from .magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):
    from .magics import unload_ipython_extension as unload

    unload(ipython)
