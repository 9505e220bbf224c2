"""What parallax_nb sets up in an IPython kernel: short errors and phase displays.

Called by ``%load_ext parallax_nb`` and by ``import parallax_nb`` inside IPython, once each:

- a :class:`~parallax_nb.errors.ParallaxError` raised by a cell shows as its message and hint
  (the way ``%parallax`` reports a bad argument), not as five frames of library traceback:
  the error is about the user's input, and the message already names the value and the fix;
- long waits (profiling, starting or stopping the cluster) show their phase with a ticking
  timer (:mod:`.progress_view`), imported only when the first one begins, so importing
  parallax_nb stays instant;
- a :class:`~parallax_nb.planner.Planner` shows as a :class:`.PlannerView` and a
  :class:`~parallax_nb.cluster.handle.Run` as a live :class:`.RunView` (IPython display formatters
  registered by class name here, so the models' rooms never import widgets).
"""
from __future__ import annotations

from .. import progress
from ..errors import ParallaxError


def short_error_lines(error: ParallaxError) -> list[str]:
    """``["ConfigError: bandwidth 'fast' ...", "  -> give a rate with units, e.g. 10Gbit/s"]``."""
    lines = [f"\x1b[0;31m{type(error).__name__}\x1b[0m: {error.message}"]
    if error.hint:
        lines += [f"  -> {line}" if i == 0 else f"     {line}" for i, line in enumerate(error.hint.splitlines())]
    return lines


def _show_short_error(shell, etype, value, tb, tb_offset=None):
    lines = short_error_lines(value)
    shell._showtraceback(etype, value, lines)
    return lines


_installed_phase_display = False


def _phase_listener(event: progress.Event) -> None:
    global _installed_phase_display
    if event.kind == progress.BEGIN and event.depth == 0:
        from . import progress_view   # ipywidgets only once a long wait begins

        progress.unlisten(_phase_listener)
        progress_view.install()
        _installed_phase_display = True
        progress_view.notebook_listener(event)


def show_planner(planner) -> None:
    from IPython.display import display

    from .planner_view import PlannerView

    display(PlannerView(planner))


def show_run(run) -> None:
    """A live RunView, unless one already watches the run (``px.run`` displays one): then a line."""
    from IPython.display import display

    if run.watched:
        display({"text/plain": repr(run)}, raw=True)
        return
    from .run_view import RunView

    display(RunView(run))


def _register_displays(shell) -> None:
    formatter = getattr(getattr(shell, "display_formatter", None), "ipython_display_formatter", None)
    if formatter is None:
        return
    formatter.for_type_by_name("parallax_nb.planner", "Planner", show_planner)
    formatter.for_type_by_name("parallax_nb.cluster.handle", "Run", show_run)


def install(shell) -> None:
    """Short ParallaxErrors, phase displays and the models' views in ``shell`` (an IPython
    InteractiveShell)."""
    if shell is None:
        return
    _register_displays(shell)
    if ParallaxError not in (getattr(shell, "custom_exceptions", ()) or ()):
        shell.set_custom_exc((ParallaxError,), _show_short_error)
    if getattr(shell, "kernel", None) is not None and not _installed_phase_display:
        progress.unlisten(_phase_listener)
        progress.listen(_phase_listener)
