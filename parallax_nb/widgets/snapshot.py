"""A static HTML snapshot in every view's display bundle, kept current in the saved notebook.

A widget output holds only a pointer to a model living in the kernel; without the kernel
(GitHub, nbviewer, ``nbconvert --to html``, a reopened notebook) the pointer leads nowhere.
So each view's bundle also carries ``text/html``: a snapshot of what it shows now (tables
and inline SVG charts, no script), and a one-line ``text/plain``. Those renderers pick the
HTML; a live notebook picks the widget.

A snapshot taken at display time would freeze a run at "starting". Views are therefore
displayed with a ``display_id`` and :meth:`SnapshotDisplay.publish_snapshot` replaces the
saved bundle (``update_display``) when the state is worth keeping: at a run's or a wait's end,
and for a planner when the next cell runs (JupyterLab redraws a widget whose bundle is
replaced, which must not happen while the user is typing in it).
"""
from __future__ import annotations

import uuid


class SnapshotDisplay:
    """Mixin for ipywidgets views: ``snapshot_html()`` and ``summary_line()`` to implement."""

    def snapshot_html(self) -> str:
        raise NotImplementedError

    def summary_line(self) -> str:
        raise NotImplementedError

    def _repr_mimebundle_(self, **kwargs):
        data = super()._repr_mimebundle_(**kwargs)
        data["text/plain"] = f"{type(self).__name__}: {self.summary_line()}"
        data["text/html"] = self.snapshot_html()
        return data

    def _ipython_display_(self):
        from IPython.display import display

        display_id = uuid.uuid4().hex
        self.__dict__.setdefault("_px_display_ids", []).append(display_id)
        display(self._repr_mimebundle_(), raw=True, display_id=display_id)

    def publish_snapshot(self) -> None:
        """Replace the saved bundle of every place this view is displayed with the current one."""
        ids = self.__dict__.get("_px_display_ids") or []
        if not ids:
            return
        from IPython.display import update_display

        bundle = self._repr_mimebundle_()
        for display_id in ids:
            update_display(bundle, raw=True, display_id=display_id)

    def publish_snapshot_on_next_cell(self) -> None:
        """:meth:`publish_snapshot` when the next cell runs (a planner being edited): replacing
        a bundle makes JupyterLab redraw the widget, which must not happen under the user's
        hands, so it waits until they have moved on to another cell."""
        if not self.__dict__.get("_px_display_ids") or self.__dict__.get("_px_snapshot_pending"):
            return
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is None:
            return

        def publish(*_args):
            shell.events.unregister("pre_run_cell", publish)
            self.__dict__["_px_snapshot_pending"] = False
            self.publish_snapshot()

        self.__dict__["_px_snapshot_pending"] = True
        shell.events.register("pre_run_cell", publish)
