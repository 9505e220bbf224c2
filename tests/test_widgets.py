"""The planner and profile views, driven without a browser: set widget values and read the
model, or set model values and read the widgets. Every figure is checked against
parallax_nb.cost / parallax_nb.plan computed independently for the same inputs."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("ipywidgets")

import parallax_nb as px
from parallax_nb import cost
from parallax_nb.cost.pricing import variable_costs
from parallax_nb.errors import ConfigError, ParallaxError, PlanError
from parallax_nb.plan import make_plan
from parallax_nb.types import SPARSE_AS_DENSE, Architecture, ClusterSpec, Method, format_bytes
from parallax_nb.planner import Planner, plan
from parallax_nb.widgets import PlannerView, ProfileView
from conftest import shown_text


@pytest.fixture(scope="module")
def profile():
    """A real profile of the tiny LM (3 sparse variables, 5 dense), measured once."""
    from parallax_nb.workloads import lm_job

    return px.profile(lm_job("tiny"), steps=5, warmup=1)


@pytest.fixture
def planner(profile):
    return plan(profile, machines=8, workers_per_machine=6, bandwidth="10Gbit/s")


@pytest.fixture
def view(planner):
    v = PlannerView(planner)
    yield v
    v.close()


def assert_svg_chart(html: str) -> None:
    """The chart is inline, well-formed SVG with bars or lines (what replaced the PNG)."""
    import xml.etree.ElementTree as ET

    charts = re.findall(r"<svg.*?</svg>", html, flags=re.S)
    assert charts, html[:200]
    for chart in charts:
        root = ET.fromstring(chart)
        assert root.tag.endswith("svg") and root.get("viewBox")
    assert "<rect" in html or "<path" in html


def expected(profile, machines, workers, bandwidth, local_aggregation="auto", architecture="auto",
             methods=None, partitions=None):
    """Plan, estimate and baselines straight from the cost model for these inputs. With
    local aggregation "auto" (the planner's default) AUTO chooses it and the other
    architectures run with it on; the whole-model estimates are on the plan's cluster."""
    chosen = None if local_aggregation == "auto" else local_aggregation
    cluster = ClusterSpec.create(machines, workers, bandwidth, local_aggregation=chosen is not False)
    p = make_plan(profile, cluster, architecture, partitions=partitions, local_aggregation=chosen)
    if methods:
        p = p.with_methods(methods, partitions={k: v for k, v in (partitions or {}).items() if k in methods})
    return p.cluster, p, cost.estimate(profile, p), cost.compare_architectures(profile, p.cluster, include_horovod=True,
                                                                             local_aggregation=chosen)


def assert_planner_matches(planner, profile, **inputs):
    cluster, expected_plan, expected_estimate, baselines = expected(profile, **inputs)
    assert planner.ok, planner.error
    assert planner.cluster == cluster
    assert planner.plan == expected_plan
    assert planner.estimate == expected_estimate
    assert planner.estimates == baselines
    table = planner.table
    assert list(table.index) == profile.names
    for var, figures in zip(profile.variables, variable_costs(profile, cluster)):
        row = table.loc[var.name]
        assert row["ps_bytes_per_step"] == pytest.approx(figures.bytes_for("ps"), abs=0.5)
        assert row["ar_bytes_per_step"] == pytest.approx(figures.bytes_for("ar"), abs=0.5)
        assert row["method"] == expected_plan[var.name].method.value
        assert row["partitions"] == expected_plan[var.name].partitions
        assert row["kind"] == var.kind.value
        assert row["size_bytes"] == var.size_bytes
    assert planner.comm_time_s == pytest.approx(expected_estimate.comm_time_s)
    assert planner.step_time_s == pytest.approx(expected_estimate.step_time_s)
    assert planner.speedup_vs_ar == pytest.approx(baselines[Architecture.AR].step_time_s / expected_estimate.step_time_s)
    assert planner.speedup_vs_ps == pytest.approx(baselines[Architecture.PS].step_time_s / expected_estimate.step_time_s)
    assert planner.speedup_vs_ar == pytest.approx(expected_estimate.speedup_vs_ar)


def test_initial_plan_equals_cost_model(planner, profile):
    assert_planner_matches(planner, profile, machines=8, workers=6, bandwidth="10Gbit/s")
    # AUTO: the least estimated step time (the tiny LM's tables are latency-bound at 10 Gbit/s),
    # never slower than what the view offers, with a reason per variable
    fastest = min(planner.estimates[a].step_time_s for a in (Architecture.AR, Architecture.PS, Architecture.HYBRID))
    assert planner.step_time_s <= fastest and planner.speedup_vs_ar >= 1.0
    assert [line.split(":")[0] for line in planner.explanations[1:]] == profile.names


@pytest.mark.parametrize("machines, workers", [(2, 1), (2, 2), (8, 6), (32, 6)])
def test_auto_is_never_offered_slower_on_the_real_profile(view, planner, machines, workers):
    """The quickstart's model at 10 Gbit/s (the report once showed AUTO at 0.89x AR, the planner
    0.92x at 32 x 6): AUTO's step time under its button is the least of the four."""
    planner.set(machines=machines, workers_per_machine=workers, bandwidth="10Gbit/s", architecture="auto")
    times = {a: planner.estimates[a].step_time_s for a in (Architecture.AR, Architecture.PS, Architecture.HYBRID)}
    assert planner.step_time_s <= min(times.values()) and planner.speedup_vs_ar >= 1.0
    assert "slower" not in view.summary.value
    shown = re.findall(r'data-architecture="(\w+)"[^>]*>([^<]+)</span>', view.option_times.value)
    assert [a for a, _ in shown] == ["ar", "ps", "hybrid", "auto"]
    assert dict(shown)["auto"] == f"{planner.step_time_s * 1e3:.3g} ms"


@pytest.mark.parametrize("widget_changes, inputs", [
    ({"machines": 2}, dict(machines=2, workers=6, bandwidth="10Gbit/s")),
    ({"machines": 32, "workers_per_machine": 2}, dict(machines=32, workers=2, bandwidth="10Gbit/s")),
    ({"bandwidth": "100 Gbps"}, dict(machines=8, workers=6, bandwidth="100Gbit/s")),
    ({"bandwidth": "1.25GB/s", "machines": 3}, dict(machines=3, workers=6, bandwidth="10Gbit/s")),
    ({"local_aggregation": False}, dict(machines=8, workers=6, bandwidth="10Gbit/s", local_aggregation=False)),
    ({"architecture": "ar"}, dict(machines=8, workers=6, bandwidth="10Gbit/s", architecture="ar")),
    ({"architecture": "ps", "machines": 4}, dict(machines=4, workers=6, bandwidth="10Gbit/s", architecture="ps")),
    ({"architecture": "hybrid", "local_aggregation": False, "bandwidth": "1Gbit/s"},
     dict(machines=8, workers=6, bandwidth="1Gbit/s", architecture="hybrid", local_aggregation=False)),
])
def test_setting_widgets_recomputes_the_model(view, planner, profile, widget_changes, inputs):
    for name, value in widget_changes.items():
        getattr(view, name).value = value
    assert_planner_matches(planner, profile, **inputs)
    # what the view shows is the recomputed model
    assert format_bytes(planner.estimate.bytes_per_machine_per_step) in view.summary.value
    assert f"{planner.speedup_vs_ar:.2f}x" in view.summary.value
    assert f"{planner.speedup_vs_ps:.2f}x" in view.summary.value
    for name, row in planner.table.iterrows():
        assert name in shown_text(view.table.value)
        assert format_bytes(row["ps_bytes_per_step"]) in view.table.value
    assert_svg_chart(view.chart.value)


def test_local_aggregation_changes_the_sparse_figures(view, planner, profile):
    view.local_aggregation.value = True
    with_la = planner.table.copy()
    view.local_aggregation.value = False
    without = planner.table
    sparse = [v.name for v in profile.variables if v.is_sparse]
    # without local aggregation each of the 6 workers per machine is a participant of its own
    for name in sparse:
        assert without.loc[name, "ar_bytes_per_step"] > with_la.loc[name, "ar_bytes_per_step"]


def test_setting_the_model_updates_the_widgets(view, planner, profile):
    planner.set(machines=12, workers_per_machine=3, bandwidth="100Gbit/s", architecture="ps",
                local_aggregation=False, latency_s=50e-6)
    assert (view.machines.value, view.workers_per_machine.value) == (12, 3)
    assert view.bandwidth.value == "100Gbit/s"
    assert view.architecture.value == "ps"
    assert view.local_aggregation.value is False
    assert view.latency_us.value == pytest.approx(50.0)
    cluster = ClusterSpec.create(12, 3, "100Gbit/s", latency_s=50e-6, local_aggregation=False)
    assert planner.estimate == cost.estimate(profile, make_plan(profile, cluster, "ps"))
    planner.machines = 200   # beyond the slider's range: the slider grows to show it
    assert view.machines.value == 200 and view.machines.max >= 200


def test_per_variable_overrides_through_the_view(view, planner, profile):
    sparse = next(v.name for v in profile.variables if v.is_sparse)
    dense = next(v.name for v in profile.variables if not v.is_sparse)
    own = planner.table.loc[sparse, "method"]
    view.variable.value = sparse
    view.method.value = "ar"
    assert planner.methods == {sparse: "ar"}
    assert planner.table.loc[sparse, "method"] == "ar"
    view.variable.value = dense
    view.method.value = "ps"
    view.partitions.value = 3
    assert planner.partitions == {dense: 3}
    assert planner.table.loc[dense, "method"] == "ps" and planner.table.loc[dense, "partitions"] == 3
    assert_planner_matches(planner, profile, machines=8, workers=6, bandwidth="10Gbit/s",
                           methods={sparse: "ar", dense: "ps"}, partitions={dense: 3})
    assert "ps *" in view.table.value.lower()           # hand-set methods are marked
    view.variable.value = sparse                        # the controls follow the selected variable
    assert view.method.value == "ar"
    view.method.value = ""                              # back to the plan's own choice
    assert sparse not in planner.methods
    assert planner.table.loc[sparse, "method"] == own


@pytest.mark.parametrize("change, words", [
    (dict(bandwidth="fast"), ["bandwidth", "fast"]),
    (dict(machines=0), ["machines", "0"]),
    (dict(workers_per_machine=-2), ["workers_per_machine", "-2"]),
    (dict(latency_s=-1.0), ["latency", "-1"]),
    (dict(architecture="star"), ["architecture", "star"]),
    (dict(machines="eight"), ["machines", "eight"]),
    (dict(local_aggregation="no"), ["local_aggregation", "no"]),
])
def test_invalid_input_shows_an_error_and_keeps_the_last_plan(view, planner, change, words):
    before_plan, before_estimate, before_table = planner.plan, planner.estimate, view.table.value
    calls = []
    planner.observe(calls.append)
    planner.set(**change)                       # no exception: the view shows the problem
    assert len(calls) == 1
    assert isinstance(planner.error, ParallaxError)
    assert not planner.ok
    message = str(planner.error).lower()
    assert all(w.lower() in message for w in words), message
    assert planner.plan is before_plan and planner.estimate is before_estimate
    assert view.error.layout.display != "none"
    assert "invalid input" in view.error.value.lower()
    assert words[-1] in view.error.value
    assert view.table.value == before_table
    with pytest.raises(ParallaxError):
        planner.check()
    planner.set(machines=8, workers_per_machine=6, bandwidth="10Gbit/s", latency_s=25e-6, architecture="auto",
                local_aggregation=True)
    assert planner.ok and view.error.value == "" and view.error.layout.display == "none"


def test_invalid_bandwidth_typed_in_the_view(view, planner):
    before = planner.plan
    view.bandwidth.value = "fast"
    assert isinstance(planner.error, ConfigError) and "fast" in str(planner.error)
    assert planner.plan is before
    assert view.bandwidth.value == "fast"       # what the user typed stays visible
    view.bandwidth.value = "40Gbit/s"
    assert planner.ok and planner.cluster.bandwidth_bps == 40e9


def test_bad_overrides_are_errors_not_exceptions(planner):
    """A name the model lacks or a method that is none is shown and not kept: the next change
    computes (it used to fail with the same error until the overrides were reset)."""
    before = planner.plan
    planner.set_method("no_such_variable", "ps")
    assert isinstance(planner.error, PlanError) and "no_such_variable" in str(planner.error)
    assert planner.plan is before and "no_such_variable" not in planner.methods
    planner.set(bandwidth="40Gbit/s")
    assert planner.ok and planner.cluster.bandwidth_bps == 40e9
    planner.set_partitions("no_such_variable", 3)
    assert isinstance(planner.error, PlanError) and "no_such_variable" in str(planner.error)
    planner.set(bandwidth="10Gbit/s")
    assert planner.ok
    name = planner.profile.names[0]
    planner.set_partitions(name, 0)
    assert isinstance(planner.error, PlanError) and "partitions" in str(planner.error)
    planner.set_partitions(name, None)
    assert planner.ok
    planner.set_method(name, "carrier pigeon")
    assert isinstance(planner.error, PlanError) and "carrier pigeon" in str(planner.error)
    planner.set(bandwidth="40Gbit/s")
    assert planner.ok and name not in planner.methods


def test_bad_construction_raises(profile):
    with pytest.raises(ConfigError, match="machines"):
        plan(profile, machines=0)
    with pytest.raises(ConfigError, match="fast"):
        plan(profile, machines=2, bandwidth="fast")
    with pytest.raises(ConfigError, match="Profile"):
        plan("profile.json", machines=2)
    with pytest.raises(ConfigError, match="gpus"):
        plan(profile, gpus=6)
    with pytest.raises(ConfigError, match="cannot set"):
        plan(profile, machines=2).set(gpus=6)
    # one count for every variable is make_plan's form; the planner's partitions and methods
    # are per variable (0 was read as no overrides, 4 raised a TypeError from dict())
    for value in (0, 4, 2.5):
        with pytest.raises(ConfigError, match=f"partitions must map variable names to partition counts, got {value}"):
            plan(profile, machines=2, architecture="ps", partitions=value)
    with pytest.raises(ConfigError, match="methods must map variable names to methods, got 'ps'"):
        plan(profile, machines=2, methods="ps")


def test_cluster_argument_and_keyword_overrides(profile):
    spec = ClusterSpec.create(4, 2, "25Gbit/s", local_aggregation=False)
    p = plan(profile, spec, architecture="hybrid", machines=16)
    assert p.cluster == spec.replace(machines=16)
    assert p.plan.architecture is Architecture.HYBRID
    assert px.plan is plan and isinstance(p, Planner)


def test_observers_and_closing_a_view(planner):
    seen = []

    def record(p):
        seen.append((p.cluster.machines, p.cluster.bandwidth_bps))

    assert planner.observe(record) is record
    planner.machines = 3
    planner.set(machines=4, bandwidth="1Gbit/s")       # several inputs, one recomputation
    assert seen == [(3, 10e9), (4, 1e9)]
    planner.unobserve(record)
    planner.machines = 5
    assert len(seen) == 2
    view = PlannerView(planner)
    view.close()
    planner.machines = 6                                 # a closed view no longer listens
    assert view.machines.value == 5


def test_speedups_and_baselines(planner, profile):
    planner.set(machines=16, bandwidth="1Gbit/s", architecture="hybrid")
    est = planner.estimates
    assert set(est) >= {Architecture.AR, Architecture.PS, Architecture.HYBRID, Architecture.AUTO, SPARSE_AS_DENSE}
    assert planner.speedup_vs("hybrid") == pytest.approx(1.0)
    assert planner.speedup_vs(SPARSE_AS_DENSE) == pytest.approx(
        est[SPARSE_AS_DENSE].step_time_s / planner.step_time_s)
    assert "speedup vs all-AR" in repr(planner)


def test_profile_view_shows_every_variable(profile):
    view = ProfileView(profile)
    assert [r["name"] for r in view.rows] == profile.names
    for var, row in zip(profile.variables, view.rows):
        assert row["kind"] == var.kind.value
        assert row["size_bytes"] == var.size_bytes
        assert row["alpha_mean"] == var.alpha_mean
        assert var.name in shown_text(view.table.value)
        assert format_bytes(var.size_bytes) in view.table.value
    assert profile.model_name in view.header.value
    assert view.table.value.count("sparse") >= sum(v.is_sparse for v in profile.variables)
    assert_svg_chart(view.chart.value)
    with pytest.raises(ConfigError):
        ProfileView({"not": "a profile"})


def test_methods_accept_enum_values(planner, profile):
    sparse = next(v.name for v in profile.variables if v.is_sparse)
    planner.set_method(sparse, Method.AR)
    assert planner.ok and planner.table.loc[sparse, "method"] == "ar"


def test_many_variables_table_lists_all_chart_the_largest(profile):
    import dataclasses

    from parallax_nb.widgets.planner_view import CHART_VARIABLES, TABLE_VARIABLES, largest

    base = profile.variables
    many = dataclasses.replace(profile, variables=tuple(
        dataclasses.replace(base[i % len(base)], name=f"block{i}/{base[i % len(base)].name}", lookup_shared_with="")
        for i in range(TABLE_VARIABLES)))
    view = PlannerView(plan(many, machines=4))
    try:
        assert all(name in shown_text(view.table.value) for name in many.names)
        assert "planner.table" not in shown_text(view.table.value)
        top = largest(view.planner.table, CHART_VARIABLES)
        assert len(top) == CHART_VARIABLES
        peak = view.planner.table[["ps_bytes_per_step", "ar_bytes_per_step"]].max(axis=1)
        assert peak[top.index].min() >= peak.drop(top.index).max()
        assert_svg_chart(view.chart.value)
    finally:
        view.close()
    assert_svg_chart(ProfileView(many).chart.value)


def test_a_thousand_variables_table_lists_those_with_the_most_bytes(profile):
    """Past TABLE_VARIABLES rows the planner's and the profile's tables list the variables with
    the most bytes (the planner's under either method, the profile's by size), in model order,
    and say where every one is: 1,000 rows were 2.5 MB of HTML on every change."""
    import dataclasses

    from parallax_nb.widgets import profile_view
    from parallax_nb.widgets.planner_view import TABLE_VARIABLES

    base = profile.variables
    many = dataclasses.replace(profile, variables=tuple(
        dataclasses.replace(base[i % len(base)], name=f"block{i:04d}/{base[i % len(base)].name}",
                            lookup_shared_with="", size_bytes=base[i % len(base)].size_bytes + i)
        for i in range(1000)))
    view = PlannerView(plan(many, machines=4))
    try:
        text = shown_text(view.table.value)
        peak = view.planner.table[["ps_bytes_per_step", "ar_bytes_per_step"]].max(axis=1)
        top = set(peak.nlargest(TABLE_VARIABLES).index)
        listed = [name for name in many.names if name in text]
        assert listed == [name for name in many.names if name in top]
        assert f"The {TABLE_VARIABLES} of 1000 variables with the most bytes under either method (every one: " \
               f"planner.table)" in text
        assert len(view.table.value) < 400_000
        # AUTO's reasons: the whole plan's and those of the variables listed, the rest counted
        reasons = shown_text(view.explanations.value)
        assert len(view.planner.explanations) > 1000
        assert [name for name in many.names if f"{name}: " in reasons] == listed
        assert "local aggregation " in reasons
        assert f"The reasons of the {TABLE_VARIABLES} variables the table lists, not of the other " \
               f"{1000 - TABLE_VARIABLES} (every one: planner.explanations)." in reasons
    finally:
        view.close()
    profile_table = ProfileView(many)
    try:
        text = shown_text(profile_table.table.value)
        largest = sorted(many.variables, key=lambda v: -v.size_bytes)[:profile_view.TABLE_VARIABLES]
        assert [r["name"] for r in profile_table.rows] == [v.name for v in many.variables if v in largest]
        assert all(v.name in text for v in largest) and "profile.dataframe()" in text
    finally:
        profile_table.close()


def test_bad_inputs_in_the_view_speak_user_units_and_keep_the_last_plan(view, planner, profile):
    """A bad latency, bandwidth and partition count typed into the controls: each error names
    the value as typed (microseconds, the text, the count), and the last valid plan stays."""
    before = (planner.plan, planner.estimate, view.summary.value)
    view.latency_us.value = -5.0
    assert not planner.ok
    message = planner.error.message
    assert "latency" in message and "-5 µs" in message, message
    assert "latency_s" not in message and "e-06" not in message and "ClusterSpec" not in message
    assert "-5 µs" in view.error.value and "last valid plan" in view.error.value
    assert (planner.plan, planner.estimate, view.summary.value) == before
    view.latency_us.value = 25.0
    assert planner.ok and planner.plan == before[0]

    view.bandwidth.value = "fast"
    assert not planner.ok and "'fast'" in planner.error.message and planner.error.hint
    assert (planner.plan, planner.estimate) == before[:2]
    view.bandwidth.value = "10Gbit/s"
    assert planner.ok

    sparse = next(v.name for v in profile.variables if v.is_sparse)
    view.variable.value = sparse
    view.partitions.value = 0
    assert not planner.ok and f"partitions of {sparse} must be >= 1, got 0" in planner.error.message
    assert (planner.plan, planner.estimate) == before[:2]
    assert "got 0" in view.error.value
    view.partitions.value = 3
    assert planner.ok and planner.plan[sparse].partitions == 3


def test_latency_box_shows_the_microseconds_given(view, planner):
    assert view.latency_us.value == 25.0          # 25e-6 s, not 24.999999999999996
    planner.set(latency_s=7.3e-6)
    assert view.latency_us.value == 7.3


def test_partitions_are_explained(view, planner, profile):
    dense = next(v for v in profile.variables if not v.is_sparse)
    view.variable.value = dense.name
    view.method.value = "ps"
    parts = planner.plan[dense.name].partitions
    assert parts == planner.cluster.workers      # the default: one per worker
    note = view.partitions_note.value
    assert f"{dense.shape[0]:,} rows in {parts} slices" in note and "one per worker" in note
    if parts > dense.shape[0]:
        assert f"{parts - dense.shape[0]} slices are empty" in note


def test_every_view_carries_a_static_snapshot(view, profile):
    """What GitHub, nbviewer and nbconvert show for a widget output: its text/html."""
    bundles = {"planner": view._repr_mimebundle_(), "profile": ProfileView(profile)._repr_mimebundle_()}
    for name, bundle in bundles.items():
        assert "application/vnd.jupyter.widget-view+json" in bundle
        html = bundle["text/html"]
        assert "parallax-snapshot" in html and "<table" in html and "<script" not in html.lower()
        assert_svg_chart(html)
        assert "\n" not in bundle["text/plain"] and len(bundle["text/plain"]) < 400
    assert profile.model_name in bundles["profile"]["text/html"]
    assert "Planned for 8 machine(s) x 6 worker(s), 10Gbit/s" in bundles["planner"]["text/html"]
    view.bandwidth.value = "1Gbit/s"      # the snapshot follows the state
    assert "1Gbit/s" in view._repr_mimebundle_()["text/html"]


def test_one_vocabulary_and_palette(view, profile):
    from parallax_nb import labels
    from parallax_nb.report import html as report_html

    view.architecture.value = "hybrid"     # PS and AR both in the table
    ps, ar = labels.colour("ps"), labels.colour("ar")
    assert ps != ar
    for key, colour in (("ps", ps), ("ar", ar)):
        assert f".pxr .badge.{key} {{ background: {colour}; }}" in report_html.CSS
        assert f'fill="{colour}"' in view.chart.value                # the planner's bars
    assert f"background:{ps}" in view.table.value and ">PS</span>" in view.table.value
    assert [label for label, _ in view.architecture.options] == ["AR", "PS", "HYBRID", "AUTO"]
    assert labels.text("sparse_as_dense") in view.chart.value.replace("\n", " ") or \
        "sparse-as-dense" in view.chart.value
    assert all(tip for tip in view.method.tooltips) and view.method.style.button_width == "96px"


def test_svg_charts_axes_follow_the_data():
    from parallax_nb import svg

    ticks = svg.log_byte_ticks(100, 5e6)
    assert [svg.short_bytes(t) for t in ticks] == ["256 B", "4 KiB", "64 KiB", "1 MiB"]   # no colliding labels
    assert len(svg.log_byte_ticks(1, 2 ** 40)) <= 6
    assert svg.linear_ticks(31_000, svg.byte_unit(31_000))[0] == [0, 10240, 20480, 30720, 40960]  # 0 .. 40 KiB
    assert svg.short_bytes(0) == "0 B" and svg.short_bytes(1.5 * 2 ** 20) == "1.5 MiB"
    bars = svg.hbars(["a", "b"], [{"name": "PS", "colour": "#b35900", "values": [0.0, 4096.0]}], "bytes")
    assert bars.count("<rect x=") - bars.count('width="11"') == 1 and ">0 B</text>" in bars   # 0 B is no bar
    empty = svg.lines("loss", [], [{"name": "loss", "colour": "red", "values": []}])
    assert "waiting for the first step" in empty and "<line" not in empty and "<path" not in empty
    tall = svg.columns(["AR", "PS", "x"], [{"name": "t", "colour": "#888", "values": [10.0, 12.0, 974.0]}], "t")
    assert ">974</text>" in tall and "<path d=\"M" in tall       # drawn broken, its value written
    assert svg.smooth([40.0, 3000.0, 40.0, 3000.0])[-1] < 3000.0


def test_phase_view_names_the_phase_and_ends_in_one_line():
    from parallax_nb.widgets.progress_view import PhaseView

    view = PhaseView("profiling lm-tiny")
    assert view.text().startswith("profiling lm-tiny: starting · 0.")
    view.show_phase("step 2 of 5", done=2, total=5)
    assert (view.bar.value, view.bar.max) == (2, 5) and "step 2 of 5 · " in view.label.value
    view.finish(3.25)
    assert view.text() == "profiling lm-tiny: done in 3.2 s" and view.bar.bar_style == "success"
    assert [text for _, text in view.history] == ["starting", "step 2 of 5"]
    assert view._repr_mimebundle_()["text/plain"] == "PhaseView: profiling lm-tiny: done in 3.2 s"
