"""RunView: a live view of one distributed run (a :class:`parallax_nb.cluster.Run`).

Progress bar (steps done of steps asked), a status line naming the run's phase with a timer
that ticks every half second ("starting the cluster: engines 1 of 2 ready · 6 s", "building
the model", "tracing the training step", then steps, then "gathering the trained weights"),
a Stop button wired to ``run.stop()``, a note when the plan was made for another cluster,
for an asynchronous run its setting and measured staleness (:func:`staleness_text`),
charts of loss, throughput (examples/s over all ranks, smoothed, raw values faint behind)
and bytes per step (measured on rank 0, sent + received, next to the cost model's
prediction for this run), a per-variable table of predicted vs measured bytes per step, per
machine the link's bytes (kernel counters) beside their prediction, and, once the run is done,
its median step time beside the estimate of what it executed (:meth:`Run.step_time_check`).

The Run is the model: the dispatcher's thread feeds it and the view subscribes with
``run.observe``. Cheap widgets (progress, status) update on every change; the SVG charts are
redrawn at most every ``redraw_s`` seconds and once more when the run finishes, when the
view also stores its final snapshot in the notebook. Tests drive a Run by hand
(``run.add_records``, ``run.finish``) and read this view's state: the ``progress`` widget,
``chart_data()``, ``bytes_rows()``, ``stop_button``.
"""
from __future__ import annotations

import threading
import time

import ipywidgets as widgets

from .. import labels, svg
from ..types import format_bytes, largest_in_order
from . import style
from .progress_view import Ticker, elapsed_text
from .snapshot import SnapshotDisplay

_STATUS_COLOURS = {"stopping": "#b35900", "stopped": "#b35900", "failed": style.FAIL}
_BADGED = tuple(_STATUS_COLOURS)
_BAR_STYLES = {"done": "success", "stopped": "warning", "failed": "danger"}
LOSS_COLOUR, THROUGHPUT_COLOUR, BYTES_COLOUR = "currentColor", "#0b7285", "#c2255c"


def chart_series(run) -> dict:
    """The data the charts plot: lists per series (steps on the x axis)."""
    records = run.records
    predicted = run.predicted_bytes_by_variable()
    return {
        "step": [r["step"] for r in records],
        "loss": [r.get("loss") for r in records],
        "examples_per_s": [r.get("examples_per_s") for r in records],
        "bytes_per_step": [r["bytes_per_step"] for r in records],
        "predicted_bytes_per_step": sum(predicted.values()) if predicted else None,
    }


def bytes_rows(run) -> list[dict]:
    """Per variable: method, predicted and measured mean bytes per step (None when unknown)."""
    predicted = run.predicted_bytes_by_variable()
    measured = run.measured_bytes_by_variable()
    methods = {}
    if run.plan is not None and hasattr(run.plan, "variables"):
        methods = {v.name: v.method.value for v in run.plan.variables}
    names = list(methods) + [n for n in list(predicted) + list(measured) if n not in methods]
    seen, rows = set(), []
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        rows.append({"name": name, "method": methods.get(name), "predicted_bytes_per_step": predicted.get(name),
                     "measured_bytes_per_step": measured.get(name)})
    return rows


def render_charts(series: dict) -> str:
    """Three SVG charts side by side (wrapping on a narrow page): loss, examples/s (smoothed,
    raw values faint behind), bytes/step measured against the prediction (dashed)."""
    steps = series["step"]
    throughput = [v if v is not None else None for v in series["examples_per_s"]]
    known = [v for v in throughput if v is not None]
    smoothed = svg.smooth(known) if known else []
    it = iter(smoothed)
    smooth_series = [next(it) if v is not None else None for v in throughput]
    bytes_series = [{"name": "measured (rank 0)", "colour": BYTES_COLOUR, "values": series["bytes_per_step"]}]
    if series.get("predicted_bytes_per_step") is not None:
        bytes_series.append({"name": "predicted", "colour": "currentColor", "values": [series["predicted_bytes_per_step"]],
                             "dash": "5 4", "width": 1.4})
    charts = [
        svg.lines("loss", steps, [{"name": "loss (rank 0)", "colour": LOSS_COLOUR, "values": series["loss"]}],
                  css_class="parallax-run-loss"),
        svg.lines("examples / s (all ranks)", steps, [
            {"name": "raw", "colour": THROUGHPUT_COLOUR, "values": throughput, "opacity": 0.3, "width": 1.2},
            {"name": "smoothed", "colour": THROUGHPUT_COLOUR, "values": smooth_series}],
            y_format=lambda v: f"{v:,.0f}", css_class="parallax-run-throughput"),
        svg.lines("bytes / step", steps, bytes_series, byte_axis=True, css_class="parallax-run-bytes"),
    ]
    return ('<div class="parallax-run-charts" style="display: flex; flex-wrap: wrap; gap: 10px 24px; '
            f'color: {style.FG}">' + "".join(f'<div style="flex: 0 1 330px; min-width: 0">{c}</div>' for c in charts)
            + "</div>")


def render_bytes_table(rows: list[dict]) -> str:
    """Predicted against measured bytes per variable; of more than :data:`style.TABLE_ROWS`
    variables, those with the most bytes (the larger of the two), in plan order."""
    if not rows:
        return style.note("no per-variable bytes yet")
    every = len(rows)
    listed = largest_in_order([max(r["measured_bytes_per_step"] or 0.0, r["predicted_bytes_per_step"] or 0.0)
                               for r in rows], style.TABLE_ROWS)
    rows = [rows[i] for i in listed]

    def fmt(x):
        return format_bytes(x) if x is not None else "-"

    def ratio(row):
        p, m = row["predicted_bytes_per_step"], row["measured_bytes_per_step"]
        return f"{m / p:.2f}" if p and m is not None else "-"

    body = [[style.name_cell(r["name"]), style.label_badge(r["method"]) if r["method"] else "-",
             fmt(r["predicted_bytes_per_step"]), fmt(r["measured_bytes_per_step"]), ratio(r)] for r in rows]
    some = (style.caption(f"The {len(rows)} of {every} variables with the most bytes (every one: "
                          f"run.measured_bytes_by_variable(), run.predicted_bytes_by_variable()).")
            if len(rows) < every else "")
    return some + style.html_table(["variable", "method", "predicted / step", "measured / step",
                                    "measured / predicted"], body, max_height=style.TABLE_HEIGHT)


def render_link_table(run) -> str:
    """Per machine: the bytes per step its network link carried (the kernel's counters, read by
    the engines) next to the prediction for one machine (:meth:`Run.link_prediction`: payload,
    TCP/IP framing, the calls' measured overhead, Horovod's coordination); "" when not measured."""
    measured = run.link_bytes_per_step()
    if not measured:
        return ""
    prediction = run.link_prediction()
    predicted = prediction.total_bytes if prediction is not None else None

    def fmt(x):
        return format_bytes(x) if x is not None else "-"

    calls = (f"+ {prediction.call_count} calls' overhead" if prediction is not None and prediction.call_bytes
             else "+ calls' overhead")
    body = [[style.name_cell(host), fmt(prediction and prediction.payload_bytes),
             fmt(prediction and prediction.framing_bytes), fmt(prediction and prediction.call_bytes),
             fmt(prediction and prediction.coordination_bytes),
             fmt(predicted), format_bytes(value), f"{100.0 * (value - predicted) / predicted:+.1f} %" if predicted else "-"]
            for host, value in measured.items()]
    table = style.html_table(["machine", "payload", "+ TCP/IP framing", calls, "+ coordination",
                              "predicted link / step", "link counters / step", "error"], body)
    return table + (style.note("link prediction: " + style.esc(prediction.coordination)) if prediction is not None else "")


def staleness_text(run) -> str:
    """An asynchronous run's sync setting and measured staleness (:mod:`parallax_nb.staleness`):
    rank 0's while it trains, every rank's once it is done."""
    if run.staleness is not None:
        return f"{run.training_text}; {run.staleness.describe()}"
    live = run.live_staleness
    if live is None:
        return f"{run.training_text}; no step measured yet"
    return (f"{run.training_text}; rank 0 steps ahead of the slowest: mean {live.mean_steps_ahead:.2f}, "
            f"max {live.max_steps_ahead}")


def step_time_text(run) -> str | None:
    """``step time: predicted 120.0 ms, measured 131.5 ms (median of steps 2-30), +9.6 % [...]``
    once the run is done with a profile (:meth:`Run.step_time_check`), else None."""
    check = run.step_time_check() if hasattr(run, "step_time_check") else None
    return check.line() if check is not None else None


class RunView(SnapshotDisplay, widgets.VBox):
    """Live progress of a Run, with a Stop button. ``RunView(run)``; display it in a notebook."""

    def __init__(self, run, redraw_s: float = 0.5, **kwargs):
        self.run = run
        self.redraw_s = float(redraw_s)
        self._last_draw = 0.0
        self._drawn_steps = -1
        self._draw_lock = threading.Lock()
        self.title = widgets.HTML(self.title_html())
        self.progress = widgets.IntProgress(value=0, min=0, max=max(run.steps, 1), description="steps",
                                            layout=widgets.Layout(width="60%"))
        self.status = widgets.HTML()
        self.stop_button = widgets.Button(description="Stop", icon="stop", button_style="danger",
                                          tooltip="stop every engine after its current step")
        self.stop_button.on_click(self._on_stop_clicked)
        mismatch = run.plan_mismatch() if hasattr(run, "plan_mismatch") else None
        self.warning = widgets.HTML(style.warning_box(mismatch) if mismatch else "")
        self.charts = widgets.HTML(layout=widgets.Layout(max_width="100%"))
        self.bytes_table = widgets.HTML()
        self.error = widgets.HTML()
        super().__init__([self.title, widgets.HBox([self.progress, self.stop_button]), self.status, self.warning,
                          self.charts, self.bytes_table, self.error], **kwargs)
        self.add_class("parallax-run-view")
        run.observe(self._on_change)
        self.refresh(force=True)
        self._ticker = None if run.done else Ticker(self._tick)

    # ----- model -> widgets ------------------------------------------------------------------------
    def _on_change(self, run, what: str) -> None:
        self._update_cheap()
        if run.done:
            self.refresh(force=True)
            if self._ticker is not None:
                self._ticker.stop()
            self.publish_snapshot()
        elif time.monotonic() - self._last_draw >= self.redraw_s:
            self.refresh()

    def _tick(self) -> None:
        if self.run.done:
            self._ticker.stop()
            return
        self.status.value = self.status_html()

    def title_html(self) -> str:
        run = self.run
        architecture = getattr(getattr(run.plan, "architecture", None), "value", run.architecture)
        plan = f", {labels.text(architecture)} plan" if architecture else ", no plan yet"
        training = "" if run.sync else f", {run.training_text}"
        return style.heading(f"Run on {run.engines} MPI engines", f"{run.steps} steps{plan}{training}")

    def _update_cheap(self) -> None:
        run = self.run
        self.progress.max = max(run.steps, 1)
        self.progress.value = min(run.steps_done, self.progress.max)
        if run.status in _BAR_STYLES:
            self.progress.bar_style = _BAR_STYLES[run.status]
        self.status.value = self.status_html()
        self.stop_button.disabled = run.done or run.status == "stopping"
        title = self.title_html()
        if title != self.title.value:
            self.title.value = title
        if run.error is not None:
            self.error.value = self.error_html()

    def phase_text(self) -> str:
        """What the run does now and for how long ("building the model · 4 s"); when it is
        over, how it ended ("done in 23.1 s", "stopped after 7 of 100 steps")."""
        run = self.run
        if run.status == "done":
            return f"done in {run.elapsed_s:.1f} s"
        if run.done:
            return run.message or run.status
        if run.status == "stopping":
            asked = run.stop_requested_at
            return f"{run.message} · {elapsed_text(time.monotonic() - asked)}" if asked else run.message
        phase = getattr(run, "phase", run.status)
        since = getattr(run, "phase_started_at", run.started_at)
        return f"{phase} · {elapsed_text(time.time() - since)}"

    def status_text(self) -> str:
        """One line: the phase (or how the run ended), steps, last loss, throughput, bytes/step."""
        run = self.run
        parts = [self.phase_text(), f"{run.steps_done}/{run.steps} steps"]
        records = run.records
        if records:
            last = records[-1]
            if last.get("loss") is not None:
                parts.append(f"loss {last['loss']:.4f}")
            if last.get("examples_per_s") is not None:
                parts.append(f"{last['examples_per_s']:.0f} examples/s")
            parts.append(f"{format_bytes(last['bytes_per_step'])}/step")
        if run.status != "done":
            parts.append(f"{run.elapsed_s:.1f} s in all")
        if not run.sync:
            parts.append(staleness_text(run))
        if run.batch_norm_note:
            parts.append(run.batch_norm_note)
        parts.extend(f"plan changed: {change}" for change in run.plan_changes)
        if run.done:
            step_time = step_time_text(run)
            if step_time:
                parts.append(step_time)
        return " | ".join(parts)

    def status_html(self) -> str:
        """:meth:`status_text`; a run that is stopping, stopped or failed leads with a badge
        of that word instead ("[stopped] after 7 of 100 steps | ...")."""
        run = self.run
        text = self.status_text()
        badge = ""
        if run.status in _BADGED:
            badge = style.badge(run.status, _STATUS_COLOURS[run.status]) + " "
            text = text[len(run.status) + 1:] if text.startswith(run.status + " ") else text
        return (f'<div class="parallax-run-status" style="{style.FONT} font-size: 12.5px">'
                f'{badge}{style.esc(text)}</div>')

    def error_html(self) -> str:
        err = self.run.error
        tb = getattr(err, "remote_traceback", "") or ""
        details = (f'<details><summary>traceback of rank {style.esc(getattr(err, "rank", "?"))}</summary>'
                   f'<pre style="font-size: 11px; white-space: pre-wrap; color: {style.FG}">{style.esc(tb)}</pre>'
                   f'</details>') if tb else ""
        hint = f'<div style="margin-top: 3px">&rarr; {style.esc(err.hint)}</div>' if getattr(err, "hint", None) else ""
        return style.box("Run failed", style.esc(err.message) + hint + details)

    def chart_data(self) -> dict:
        """What the charts show now (see :func:`chart_series`)."""
        return chart_series(self.run)

    def bytes_rows(self) -> list[dict]:
        return bytes_rows(self.run)

    def refresh(self, force: bool = False) -> None:
        """Update every widget; redraw the charts if new steps arrived (or ``force``)."""
        self._update_cheap()
        with self._draw_lock:
            steps_done = self.run.steps_done
            if not force and steps_done == self._drawn_steps:
                return
            self._drawn_steps = steps_done
            self._last_draw = time.monotonic()
            self.charts.value = render_charts(self.chart_data())
            self.bytes_table.value = render_bytes_table(self.bytes_rows()) + render_link_table(self.run)

    def summary_line(self) -> str:
        return f"Run on {self.run.engines} MPI engines: {self.status_text()}"

    def snapshot_html(self) -> str:
        return style.snapshot("parallax-run-snapshot", [self.title.value, self.status.value, self.warning.value,
                                                         self.charts.value, self.bytes_table.value, self.error.value])

    # ----- widgets -> model ------------------------------------------------------------------------
    def _on_stop_clicked(self, _button=None) -> None:
        self.stop_button.disabled = True
        self.run.stop(wait=False)
