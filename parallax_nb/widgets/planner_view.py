"""PlannerView: the controls, cost table and charts of a :class:`~parallax_nb.planner.Planner`.

Thin by design. A control's change calls ``planner.set(...)``; every recomputation of the
planner (from this view, another view, or code) calls :meth:`PlannerView.refresh`, which copies
the planner's inputs back into the controls and redraws the figures. Each architecture the view
offers shows its estimated step time under its button; the step-time chart draws bars only for
what can be chosen here (AR, PS, HYBRID, AUTO and the plan), the baselines a user would
otherwise run (plain Horovod, sparse-as-dense, TF-PS) are listed in words beneath it. AUTO's
reasons are listed under the table. Sliders report only when
released and the bandwidth box only on Enter or leaving it (``continuous_update=False``): that
is the debounce, one recomputation per deliberate change.
"""
from __future__ import annotations

import contextlib

import ipywidgets as widgets

from .. import labels, svg
from ..cost.timing import calibration_for, time_basis_notes
from ..plan import reasons_listed
from ..planner import Planner, describe_inputs
from ..staleness import describe_bound
from ..types import (PLAIN_HOROVOD, SPARSE_AS_DENSE, TF_PS, Architecture, Method, format_bandwidth, format_bytes,
                     largest_in_order)
from . import style
from .snapshot import SnapshotDisplay

ARCHITECTURES = (Architecture.AR, Architecture.PS, Architecture.HYBRID, Architecture.AUTO)
ARCHITECTURE_OPTIONS = [(labels.text(a), a.value) for a in ARCHITECTURES]
METHODS = tuple(m.value for m in Method)
METHOD_OPTIONS = [("as planned", ""), *((labels.text(m), m) for m in METHODS)]
METHOD_TOOLTIPS = ["the plan's own choice for this variable", *(labels.label(m).description for m in METHODS)]
CHART_VARIABLES = 25   # a chart of hundreds of bars says nothing
TABLE_VARIABLES = style.TABLE_ROWS   # the table lists at most these, those with the most bytes

COMPARED = ARCHITECTURES   # the step-time chart's bars: only what this view offers
REFERENCE_BASELINES = (PLAIN_HOROVOD, SPARSE_AS_DENSE, TF_PS)   # named beneath the chart, not drawn
LOCAL_AGGREGATION_OPTIONS = [("auto", "auto"), ("on", True), ("off", False)]
SYNC_OPTIONS = [("sync", True), ("async", False)]
SYNC_TOOLTIPS = ["every step ends at a barrier: all workers at the slowest's pace",
                 "PS variables without a barrier: each worker pulls, computes, pushes and moves on "
                 "(every variable must be PS)"]
BUTTON_WIDTH = "76px"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _speedup_mark(x: float) -> str:
    """A badge saying faster or slower (colour on its own background reads in both themes)."""
    if x > 1.005:
        return style.badge("faster", style.GOOD)
    if x < 0.995:
        return style.badge("slower", style.FAIL)
    return ""


def render_summary(planner: Planner) -> str:
    est = planner.estimate
    # what the times rest on (a calibration's place and date, the compute's source) goes under
    # the cards: in the step time's note it made that card, and so the row, eight lines tall
    return style.cards([
        style.card("communication", _ms(planner.comm_time_s),
                   "per step, held to the link's pace" if est.link_bound else "estimated per step",
                   css_class="parallax-comm"),
        style.card("step time", _ms(planner.step_time_s),
                   f"compute {_ms(max(planner.step_time_s - planner.comm_time_s, 0.0))} + communication",
                   css_class="parallax-step"),
        style.card("traffic", format_bytes(est.bytes_per_machine_per_step), "per machine per step"),
        style.card("speedup vs AR", f"{planner.speedup_vs_ar:.2f}x", "every variable allreduced",
                   css_class="parallax-speedup-ar", mark=_speedup_mark(planner.speedup_vs_ar)),
        style.card("speedup vs PS", f"{planner.speedup_vs_ps:.2f}x", "every variable on servers",
                   css_class="parallax-speedup-ps", mark=_speedup_mark(planner.speedup_vs_ps)),
        # the value one word, as the other cards' figures (the bound in the note: "asynchronous,
        # unbounded staleness" in the big type took three lines and tripled the row's height)
        style.card("training", "synchronous" if planner.plan.sync else "asynchronous",
                   "every step ends at a barrier" if planner.plan.sync else
                   f"{describe_bound(planner.plan.max_staleness)}; PS without a barrier; times above are of synchronous "
                   "steps" + _straggler_note(planner),
                   css_class="parallax-sync"),
    ]) + style.note(f'<span class="parallax-time-basis">Times: {style.esc(planner.calibration_label)}.</span>')


def _straggler_note(planner: Planner) -> str:
    """An asynchronous plan's outlook with one worker 2x slower per step (sync, async and the
    bound's examples/s, :func:`parallax_nb.cost.asynchronous.straggler_outlook`); "" on one worker."""
    if planner.plan.cluster.workers < 2:
        return ""
    from ..cost.asynchronous import straggler_outlook

    o = straggler_outlook(planner.estimate, max_staleness=planner.plan.max_staleness)
    note = (f". With one worker 2x slower per step: sync {o.sync_examples_per_s:,.0f}, async "
            f"{o.async_examples_per_s:,.0f} examples/s ({o.async_examples_per_s / o.sync_examples_per_s:.2f}x)")
    if o.bounded_examples_per_s is not None:
        note += f", max staleness {o.max_staleness}: {o.bounded_examples_per_s:,.0f} in the long run"
    return note


def render_table(planner: Planner, table=None) -> str:
    """PS vs AR bytes per machine per step for every variable; the chosen method's cell is bold
    and underlined in its colour, the other in the secondary text colour. The plan's method and
    partitions come right after the name, the profile's figures last: in a narrow notebook
    column what the plan decides is seen first. Of more than :data:`TABLE_VARIABLES`
    variables, those with the most bytes under either method, in model order
    (``planner.table`` holds them all); ``table``: those rows, where the caller has them
    (:func:`listed_rows`)."""
    every = len(planner.plan.variables)
    table = listed_rows(planner) if table is None else table
    rows = []
    for name, r in table.iterrows():
        chosen = r["method"]

        def cell(method: str, value: float) -> str:
            text = style.esc(format_bytes(value))
            if method == chosen:
                return (f'<span style="font-weight:700; border-bottom: 3px solid {labels.colour(method)}; '
                        f'padding: 0 2px">{text}</span>')
            return f'<span style="color:{style.FG2}">{text}</span>'

        override = " *" if name in planner.methods else ""
        rows.append([
            style.name_cell(name),
            style.label_badge(chosen, override),
            style.esc(r["partitions"]) if chosen == "ps" else f'<span style="color:{style.FG2}">-</span>',
            *(cell(m, r[f"{m}_bytes_per_step"]) for m in METHODS),
            style.label_badge(r["kind"]),
            style.esc(format_bytes(r["size_bytes"])),
            style.esc(f"{r['alpha']:.4g}"),
        ])
    header = ["variable", "method", "partitions", *(f"{labels.text(m)} bytes<br>/ step" for m in METHODS),
              "kind", "size", "&alpha;"]
    some = (style.caption(f"The {len(table)} of {every} variables with the most bytes under either method "
                          f"(every one: planner.table).") if len(table) < every else "")
    return some + style.html_table(header, rows, left_columns=2, max_height=style.TABLE_HEIGHT) + style.note(
        "Bytes sent + received per machine per step under each method; the plan's choice is underlined"
        " (* = set by hand). Partitions: the slices a PS variable's rows are split into, one per worker by default.")


def render_option_times(planner: Planner) -> str:
    """The estimated step time of every architecture the view offers, one under each button."""
    cells = []
    for arch in ARCHITECTURES:
        est = planner.estimates[arch]
        cells.append(f'<span class="parallax-option-time" data-architecture="{arch.value}" '
                     f'title="{style.esc(labels.text(arch))}: estimated step time" style="display: inline-block; '
                     f'width: {BUTTON_WIDTH}; margin-right: 4px; text-align: center">{style.esc(_ms(est.step_time_s))}'
                     f'</span>')
    return (f'<div style="{style.FONT} font-size: 11.5px; color: {style.FG2}; font-variant-numeric: tabular-nums">'
            f'{"".join(cells)}</div>')


def render_explanations(planner: Planner, table=None) -> str:
    """AUTO's reasons, one line per decision (nothing when the plan is not AUTO's): those
    about the whole plan and about each variable the table lists (``table``: its rows,
    :func:`listed_rows`), under a note saying so (``planner.explanations`` holds every one)."""
    if not planner.explanations:
        return ""
    names = [v.name for v in planner.plan.variables]
    listed = list((listed_rows(planner) if table is None else table).index)
    lines = reasons_listed(planner.explanations, names, listed)
    items = "".join(f"<li>{style.esc(line)}</li>" for line in lines)
    some = (style.caption(f"The reasons of the {len(listed)} variables the table lists, not of the other "
                          f"{len(names) - len(listed)} (every one: planner.explanations).")
            if len(listed) < len(names) else "")
    return (f'<div class="parallax-explanations" style="{style.FONT} font-size: 12.5px; color: {style.FG}">'
            f'<b>Why AUTO chose this</b> (estimated step time, {style.esc(planner.calibration_label)}){some}'
            f'<ul style="margin: 4px 0 0 0; padding-left: 20px; max-height: {style.TABLE_HEIGHT}; overflow-y: auto">'
            f'{items}</ul></div>')


def render_baselines(planner: Planner) -> str:
    """The baselines a user would otherwise run, in words: they cannot be chosen here."""
    shown = [key for key in REFERENCE_BASELINES if key in planner.estimates]
    parts = [f"{labels.text(key)} {_ms(planner.estimates[key].step_time_s)}" for key in shown]
    # what a baseline's time rests on beyond the plan's own (a calibration from before the
    # baselines' compute was measured): said once, after the figures
    calibration = calibration_for(planner.estimate.cluster, planner.calibration)
    own = set(time_basis_notes(planner.profile, calibration))
    extra = sorted({note for key in shown for note in time_basis_notes(planner.profile, calibration, key)} - own)
    said = f" ({'; '.join(extra)})" if extra else ""
    return style.note("Not offered here, for comparison (estimated step time): " + ", ".join(parts) + said + ".")


def largest(table, limit: int):
    """The ``limit`` rows with the most bytes under either method, in their original order."""
    if len(table) <= limit:
        return table
    peak = table[[f"{m}_bytes_per_step" for m in METHODS]].max(axis=1).fillna(0.0)
    return table.iloc[largest_in_order(peak.tolist(), limit)]


def listed_rows(planner: Planner, every=None):
    """The rows of ``planner.table`` the view's table lists (:data:`TABLE_VARIABLES` at most).
    ``every``: ``planner.table``, where the caller has read it (it is made on each read)."""
    return largest(planner.table if every is None else every, TABLE_VARIABLES)


def render_chart(planner: Planner, every=None) -> str:
    """Two SVG charts: PS and AR bytes per variable (chosen method solid, the other faint, log
    axis), and the estimated step time of each whole-model architecture and of this plan.
    ``every``: ``planner.table``, where the caller has read it (it is made on each read)."""
    every = planner.table if every is None else every
    table = largest(every, CHART_VARIABLES)
    listed = "the table lists all" if len(every) <= TABLE_VARIABLES else "planner.table lists all"
    note = (f"the {len(table)} largest of {len(every)} variables ({listed})" if len(table) < len(every) else "")
    series = [{"name": f"{labels.text(m)} (faint: not chosen)" if i == 0 else labels.text(m),
               "colour": labels.colour(m), "values": list(table[f"{m}_bytes_per_step"]),
               "opacity": [1.0 if c == m else 0.3 for c in table["method"]]} for i, m in enumerate(METHODS)]
    bars = svg.hbars(list(table.index), series, "bytes per machine per step", css_class="parallax-planner-bytes",
                     note=note)
    names, compute, comm = [], [], []
    for arch in COMPARED:
        est = planner.estimates[arch]
        names.append(labels.text(arch).replace(" ", "\n", 1))
        comm.append(est.comm_time_s * 1e3)
        compute.append(max(est.step_time_s - est.comm_time_s, 0.0) * 1e3)
    names.append("this\nplan")
    comm.append(planner.comm_time_s * 1e3)
    compute.append(max(planner.step_time_s - planner.comm_time_s, 0.0) * 1e3)
    steps = svg.columns(names, [{"name": "compute", "colour": "#8a94a3", "values": compute},
                                {"name": "communication", "colour": labels.colour("hybrid"), "values": comm}],
                        "estimated step time", unit="ms / step", css_class="parallax-planner-steps",
                        highlight=len(names) - 1)
    return (f'<div style="display: flex; flex-wrap: wrap; gap: 12px 28px; align-items: flex-start; color: {style.FG}">'
            f'<div style="flex: 1 1 420px; min-width: 0">{bars}</div><div style="flex: 0 1 420px">{steps}'
            f'{render_baselines(planner)}</div></div>')


def chart_key(planner: Planner) -> tuple:
    """Everything :func:`render_chart` draws; equal keys mean an identical chart."""
    baselines = tuple((str(arch), planner.estimates[arch].comm_time_s, planner.estimates[arch].step_time_s)
                      for arch in (*COMPARED, *(k for k in REFERENCE_BASELINES if k in planner.estimates)))
    return (tuple(planner.table.itertuples()), baselines, planner.comm_time_s, planner.step_time_s)


def _label(text: str) -> widgets.HTML:
    return widgets.HTML(f'<span style="{style.FONT} font-size: 12.5px">{text}</span>',
                        layout=widgets.Layout(width="150px"))


def _row(label: str, control: widgets.Widget) -> widgets.HBox:
    return widgets.HBox([_label(label), control], layout=widgets.Layout(align_items="center"))


class PlannerView(SnapshotDisplay, widgets.VBox):
    """Controls over a :class:`Planner` and its recomputed costs. ``PlannerView(planner)``;
    displaying a Planner shows one. Controls: machines, workers per machine, bandwidth (text
    with units), latency, architecture, local aggregation, sync/async with the max staleness
    (text, empty for unbounded; disabled while sync), and a per-variable method and
    partition override. Outputs: summary cards, the per-variable table, the charts."""

    def __init__(self, planner: Planner, **kwargs):
        self.planner = planner
        self._syncing = False
        self._chart_key = None
        names = planner.profile.names
        slider = dict(continuous_update=False, layout=widgets.Layout(width="300px"))
        self.machines = widgets.IntSlider(min=1, max=max(64, _int_or(planner.machines, 1)), **slider)
        self.workers_per_machine = widgets.IntSlider(min=1, max=max(16, _int_or(planner.workers_per_machine, 1)),
                                                     **slider)
        self.bandwidth = widgets.Text(placeholder="e.g. 10Gbit/s, 100Gbps, 1.25GB/s", continuous_update=False,
                                      layout=widgets.Layout(width="180px"))
        self.latency_us = widgets.FloatText(step=5.0, layout=widgets.Layout(width="120px"))
        self.architecture = widgets.ToggleButtons(options=ARCHITECTURE_OPTIONS,
                                                  tooltips=[labels.label(a).description for a in ARCHITECTURES],
                                                  style={"button_width": BUTTON_WIDTH})
        self.option_times = widgets.HTML()
        self.local_aggregation = widgets.ToggleButtons(
            options=LOCAL_AGGREGATION_OPTIONS, style={"button_width": "56px"},
            tooltips=["AUTO chooses whichever its estimate calls faster (other architectures: on)",
                      "combine a machine's gradients before they cross machines", "every rank on its own"])
        self.sync = widgets.ToggleButtons(options=SYNC_OPTIONS, tooltips=SYNC_TOOLTIPS, style={"button_width": "64px"})
        self.max_staleness = widgets.Text(placeholder="unbounded", continuous_update=False,
                                          layout=widgets.Layout(width="100px"),
                                          tooltip="with async: a worker waits when it is more than this many "
                                                  "steps ahead of the slowest (empty: unbounded)")
        self.explanations = widgets.HTML()
        self.variable = widgets.Dropdown(options=names, layout=widgets.Layout(width="260px"))
        self.method = widgets.ToggleButtons(options=METHOD_OPTIONS, tooltips=METHOD_TOOLTIPS,
                                            style={"button_width": "96px"})
        self.partitions = widgets.IntText(layout=widgets.Layout(width="100px"), continuous_update=False)
        self.partitions_note = widgets.HTML()
        self.summary = widgets.HTML()
        self.error = widgets.HTML()
        self.table = widgets.HTML()
        self.chart = widgets.HTML(layout=widgets.Layout(max_width="100%"))

        title = widgets.HTML(style.heading(
            f"Parallax planner: {planner.profile.model_name}",
            "Per-variable PS vs AR transfer volume and the estimated step time; every change recomputes."))
        cluster_box = widgets.VBox(layout=widgets.Layout(margin="0 28px 0 0"), children=[
            _row("machines", self.machines),
            _row("workers per machine", self.workers_per_machine),
            _row("bandwidth", self.bandwidth),
            _row("latency (&micro;s)", self.latency_us),
            _row("local aggregation", self.local_aggregation),
        ])
        plan_box = widgets.VBox([
            _row("architecture", self.architecture),
            _row("estimated step", self.option_times),
            _row("training", widgets.HBox([self.sync, _label("max staleness (steps)"), self.max_staleness],
                                          layout=widgets.Layout(align_items="center"))),
            _row("variable", self.variable),
            _row("its method", self.method),
            _row("its partitions", widgets.HBox([self.partitions, self.partitions_note])),
        ])
        controls = widgets.HBox([cluster_box, plan_box], layout=widgets.Layout(
            padding="10px 12px", margin="0 0 8px 0", border=f"1px solid {style.BORDER}", flex_flow="row wrap"))
        for output in (self.error, self.summary, self.table, self.explanations):
            output.layout.margin = "0 0 8px 0"
        super().__init__([title, controls, self.error, self.summary, self.table, self.explanations, self.chart],
                         **kwargs)
        self.add_class("parallax-planner-view")

        for name in ("machines", "workers_per_machine", "bandwidth", "architecture", "local_aggregation"):
            getattr(self, name).observe(self._control_changed(name), names="value")
        self.latency_us.observe(self._latency_changed, names="value")
        self.sync.observe(self._sync_changed, names="value")
        self.max_staleness.observe(self._max_staleness_changed, names="value")
        self.variable.observe(lambda _change: self._sync_override_controls(), names="value")
        self.method.observe(self._method_changed, names="value")
        self.partitions.observe(self._partitions_changed, names="value")
        planner.observe(self.refresh)
        self.refresh(planner)

    # ----------------------------------------------------------------- controls -> model
    @contextlib.contextmanager
    def _sync(self):
        self._syncing, before = True, self._syncing
        try:
            yield
        finally:
            self._syncing = before

    def _control_changed(self, name: str):
        def handler(change):
            if not self._syncing:
                self.planner.set(**{name: change["new"]})
        return handler

    def _latency_changed(self, change):
        if not self._syncing:
            self.planner.set(latency_s=change["new"] / 1e6)   # 25 / 1e6 == 25e-6 exactly; 25 * 1e-6 is not

    def _sync_changed(self, change):
        if not self._syncing:   # back to sync: the bound applies to async only, so it is cleared with it
            self.planner.set(sync=True, max_staleness=None) if change["new"] else self.planner.set(sync=False)

    def _max_staleness_changed(self, change):
        if not self._syncing:
            self.planner.set(max_staleness=change["new"])

    def _method_changed(self, change):
        if not self._syncing and self.variable.value is not None:
            self.planner.set_method(self.variable.value, change["new"] or None)

    def _partitions_changed(self, change):
        if not self._syncing and self.variable.value is not None:
            self.planner.set_partitions(self.variable.value, change["new"])

    # ----------------------------------------------------------------- model -> widgets
    def refresh(self, planner: Planner | None = None) -> None:
        """Copy the planner's inputs into the controls and redraw the outputs."""
        p = self.planner
        inputs = p.inputs
        with self._sync():
            _set_if_in_range(self.machines, inputs.machines)
            _set_if_in_range(self.workers_per_machine, inputs.workers_per_machine)
            self.bandwidth.value = _bandwidth_text(inputs.bandwidth)
            if isinstance(inputs.latency_s, (int, float)) and not isinstance(inputs.latency_s, bool):
                self.latency_us.value = round(float(inputs.latency_s) * 1e6, 6)   # 25e-6 -> 25, not 24.999999999
            arch = getattr(inputs.architecture, "value", str(inputs.architecture).lower())
            if arch in dict((v, k) for k, v in ARCHITECTURE_OPTIONS):
                self.architecture.value = arch
            if isinstance(inputs.sync, bool):
                self.sync.value = inputs.sync
            self.max_staleness.value = "" if inputs.max_staleness is None else str(inputs.max_staleness)
            self.max_staleness.disabled = inputs.sync is True and inputs.max_staleness is None
            shown = _local_aggregation_option(inputs.local_aggregation)
            if shown is not None:    # an invalid value ("no") is left to the error box
                self.local_aggregation.value = shown
        self._sync_override_controls()
        if p.error is None:
            self.error.value = ""
            self.error.layout.display = "none"
        else:
            self.error.value = style.error_box(
                p.error.message, p.error.hint,
                f"Showing the last valid plan ({describe_inputs(p.result.inputs)}); the inputs you asked for: "
                f"{describe_inputs(inputs)}.")
            self.error.layout.display = None
        self.summary.value = render_summary(p)
        self.option_times.value = render_option_times(p)
        every = p.table   # made from the plan on each read: read once for the table, reasons and chart
        listed = listed_rows(p, every)
        self.table.value = render_table(p, listed)
        self.explanations.value = render_explanations(p, listed)
        self.explanations.layout.display = None if p.explanations else "none"
        key = chart_key(p)
        if key != self._chart_key:     # an invalid input keeps the last plan: no redraw
            self.chart.value = render_chart(p, every)
            self._chart_key = key
        self.publish_snapshot_on_next_cell()

    def _sync_override_controls(self) -> None:
        name = self.variable.value
        if name is None:
            return
        with self._sync():
            self.method.value = getattr(self.planner.methods.get(name), "value", self.planner.methods.get(name)) or ""
            planned = self.planner.partitions.get(name, _plan_partitions(self.planner, name))
            if isinstance(planned, int) and not isinstance(planned, bool):
                self.partitions.value = planned
        self.partitions_note.value = partitions_note(self.planner, name)

    def close(self):
        self.planner.unobserve(self.refresh)
        super().close()

    def summary_line(self) -> str:
        p = self.planner
        return (f"Parallax planner: {p.profile.model_name} on {describe_inputs(p.result.inputs)}: estimated step "
                f"{_ms(p.step_time_s)}, speedup vs AR {p.speedup_vs_ar:.2f}x, vs PS {p.speedup_vs_ps:.2f}x")

    def snapshot_html(self) -> str:
        p = self.planner
        inputs = style.note(f"Planned for {style.esc(describe_inputs(p.result.inputs))}, latency "
                            f"{p.cluster.latency_s * 1e6:.6g} &micro;s, local aggregation "
                            f"{'on' if p.cluster.local_aggregation else 'off'}; {style.esc(p.calibration_label)}.")
        return style.snapshot("parallax-planner-snapshot", [
            self.children[0].value, inputs, self.error.value, self.summary.value, self.table.value,
            self.explanations.value, self.chart.value])


def partitions_note(planner: Planner, name: str) -> str:
    """Why a PS variable has the partitions it has: rows per partition, the default's origin."""
    plan_var = next((v for v in planner.plan.variables if v.name == name), None)
    if plan_var is None:
        return ""
    if plan_var.method.value != "ps":
        text = "AR keeps a variable whole: partitions apply to PS"
    else:
        rows = planner.profile[name].shape[0] if planner.profile[name].shape else 1
        parts = plan_var.partitions
        text = (f"{rows:,} rows in {parts} slices (default: one per worker, {planner.cluster.workers})"
                + (f"; {parts - rows} slices are empty" if parts > rows else ""))
    return f'<span style="{style.FONT} font-size: 11.5px; color: {style.FG2}; margin-left: 8px">{style.esc(text)}</span>'


def _local_aggregation_option(value):
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    return None


def _bandwidth_text(bandwidth) -> str:
    if isinstance(bandwidth, (int, float)) and not isinstance(bandwidth, bool) and bandwidth > 0:
        return format_bandwidth(bandwidth)
    return str(bandwidth)


def _plan_partitions(planner: Planner, name: str) -> int:
    for v in planner.plan.variables:
        if v.name == name:
            return v.partitions
    return 1


def _int_or(value, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _set_if_in_range(slider: widgets.IntSlider, value) -> None:
    """Show ``value`` on the slider when it can; an out-of-range input (0 machines) is left to
    the error box rather than silently clamped into a valid one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        return
    value = int(value)
    if value > slider.max:
        slider.max = value
    if value >= slider.min:
        slider.value = value
