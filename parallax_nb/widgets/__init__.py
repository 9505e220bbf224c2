"""Notebook views of parallax_nb: thin ipywidgets over model objects.

``PlannerView`` (the controls, cost table and charts of a :class:`parallax_nb.planner.Planner`),
``ProfileView`` (a profile's per-variable table and chart) and ``RunView`` (a run's live
progress). Each shows itself for its model in IPython (:func:`.ipython.install` registers the
displays), so the models' rooms never import this one. Logic lives in the models; a view only copies widget values into its model and
model state into its widgets, so tests drive views without a browser.

Names resolve lazily: importing this package needs neither ipywidgets nor matplotlib, and
``RunView`` (written with the cluster room) is looked up only when asked for.
"""
from __future__ import annotations

import importlib

_LAZY = {
    "PlannerView": "parallax_nb.widgets.planner_view",
    "ProfileView": "parallax_nb.widgets.profile_view",
    "RunView": "parallax_nb.widgets.run_view",
}

__all__ = ["PlannerView", "ProfileView", "RunView"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'parallax_nb.widgets' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
