"""PhaseView: the phase of a long wait (profile, cluster start or stop) with a ticking timer.

:func:`install` makes the notebook listen to :mod:`parallax_nb.progress`: when a profile or
a cluster start/stop begins at the top level, a PhaseView appears at once in the output of
the running cell ("starting a cluster of 2 MPI engines: engines 1 of 2 ready · 6 s"), ticks
every half second while the kernel is busy, and ends as one line ("done in 13.1 s"). A run
shows its phases in its own :class:`~parallax_nb.widgets.run_view.RunView`.
"""
from __future__ import annotations

import threading
import time

import ipywidgets as widgets

from .. import progress
from . import style
from .snapshot import SnapshotDisplay

SHOWN_TASKS = ("profile", "cluster")
TICK_S = 0.5


class Ticker:
    """Calls ``fn()`` every ``period_s`` on a daemon thread until :meth:`stop` (a timer that
    keeps moving while the kernel's main thread is busy)."""

    def __init__(self, fn, period_s: float = TICK_S):
        self._fn, self._period_s = fn, period_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="parallax_nb-ticker", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopped.wait(self._period_s):
            try:
                self._fn()
            except Exception:
                return

    def stop(self) -> None:
        self._stopped.set()


def elapsed_text(seconds: float) -> str:
    """``4.2 s``, ``2 min 05 s``: tenths under a minute, so the timer visibly moves every tick."""
    return f"{seconds:.1f} s" if seconds < 60 else f"{int(seconds // 60)} min {seconds % 60:02.0f} s"


class PhaseView(SnapshotDisplay, widgets.HBox):
    """One long operation: a progress bar (when the phase is countable) and "title: phase · 4 s".

    ``history`` lists ``(seconds since begin, phase text)`` of every phase shown (tests read it).
    """

    def __init__(self, title: str, **kwargs):
        self.title = title
        self.phase_text = "starting"
        self.started = time.monotonic()
        self.finished_s: float | None = None
        self.failed: str | None = None
        self.history: list[tuple[float, str]] = [(0.0, self.phase_text)]
        self.bar = widgets.IntProgress(value=0, min=0, max=1, layout=widgets.Layout(width="220px"))
        self.bar.layout.visibility = "hidden"
        self.label = widgets.HTML()
        super().__init__([self.bar, self.label], layout=widgets.Layout(align_items="center"), **kwargs)
        self.add_class("parallax-phase-view")
        self.render()
        self._ticker = Ticker(self.render)

    def show_phase(self, text: str, done: int | None = None, total: int | None = None) -> None:
        self.phase_text = text
        self.history.append((time.monotonic() - self.started, text))
        if total:
            self.bar.max, self.bar.value = total, min(done or 0, total)
            self.bar.layout.visibility = "visible"
        self.render()

    def finish(self, elapsed_s: float, error: str | None = None) -> None:
        self._ticker.stop()
        self.finished_s, self.failed = elapsed_s, error
        self.bar.value = self.bar.max
        self.bar.bar_style = "danger" if error else "success"
        self.render()
        self.publish_snapshot()

    def text(self) -> str:
        if self.failed:
            return f"{self.title}: failed after {elapsed_text(self.finished_s)} ({self.failed})"
        if self.finished_s is not None:
            return f"{self.title}: done in {self.finished_s:.1f} s"
        return f"{self.title}: {self.phase_text} · {elapsed_text(time.monotonic() - self.started)}"

    def render(self) -> None:
        self.label.value = (f'<span class="parallax-phase" style="{style.FONT} font-size: 12.5px; margin-left: 8px">'
                            f'{style.esc(self.text())}</span>')

    def summary_line(self) -> str:
        return self.text()

    def snapshot_html(self) -> str:
        return style.snapshot("parallax-phase-snapshot", [self.label.value])


_open: dict[str, PhaseView] = {}


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def notebook_listener(event: progress.Event) -> None:
    """Shows top-level profile and cluster tasks as PhaseViews in the running cell."""
    if event.task not in SHOWN_TASKS or event.depth != 0:
        return
    if event.kind == progress.BEGIN:
        if not _in_kernel():
            return
        from IPython.display import display

        view = _open[event.task] = PhaseView(event.text)
        display(view)
    elif event.kind == progress.PHASE and event.task in _open:
        _open[event.task].show_phase(event.text, event.done, event.total)
    elif event.kind == progress.END and event.task in _open:
        _open.pop(event.task).finish(event.elapsed_s, event.error)


def install() -> None:
    """Listen once per process (``%load_ext parallax_nb`` or importing parallax_nb in a kernel)."""
    progress.unlisten(notebook_listener)
    progress.listen(notebook_listener)
