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

__version__ = "0.1.0"

_EXPORTS = {
    "Job": "parallax_nb.job",
    "load_job": "parallax_nb.job",
    "ClusterSpec": "parallax_nb.types",
    "Profile": "parallax_nb.types",
    "VariableProfile": "parallax_nb.types",
    "Kind": "parallax_nb.types",
    "Method": "parallax_nb.types",
    "Architecture": "parallax_nb.types",
    "Plan": "parallax_nb.plan",
    "VariablePlan": "parallax_nb.plan",
    "make_plan": "parallax_nb.plan",
    "profile": "parallax_nb.profile",
    "plan": "parallax_nb.widgets",
    "run": "parallax_nb.cluster",
    "Cluster": "parallax_nb.cluster",
    "report": "parallax_nb.report",
    "workloads": "parallax_nb.workloads",
    "ParallaxError": "parallax_nb.errors",
    "ConfigError": "parallax_nb.errors",
    "JobError": "parallax_nb.errors",
    "ProfileError": "parallax_nb.errors",
    "PlanError": "parallax_nb.errors",
    "SetupError": "parallax_nb.errors",
    "DistributedError": "parallax_nb.errors",
    "CheckpointError": "parallax_nb.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'parallax_nb' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    value = module if module_name.endswith("." + name) else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ipython):
    """``%load_ext parallax_nb`` registers the ``%parallax`` magics."""
    from .magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):
    from .magics import unload_ipython_extension as unload

    unload(ipython)
