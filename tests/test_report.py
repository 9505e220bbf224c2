"""Cost reports from a real profile of the tiny LM: HTML tables, totals and embedded charts,
JSON round-trip, CSV rows, escaping, predicted against measured, run inputs and the CLI."""
import base64
import csv
import dataclasses
import html
import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from parallax_nb import cost
from parallax_nb.errors import ConfigError, PlanError
from parallax_nb.plan import make_plan, plan_for_kinds
from parallax_nb.report import Report, report
from parallax_nb.report.build import run_cluster
from parallax_nb.types import ClusterSpec, Profile, format_bytes

EVIL = "<script>alert(1)</script>"
CLUSTER = ClusterSpec.create(machines=8, workers_per_machine=2, bandwidth="10Gbit/s")


class Tables(HTMLParser):
    """Cell texts of every <table>, keyed by its class: {class: [[cell, ...], ...]} (rows of thead/tbody/tfoot)."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tables, self._table, self._row, self._cell = {}, None, None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._table = self.tables.setdefault(dict(attrs).get("class", ""), [])
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self._table.append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def run_summary_for(profile: Profile, plan, ranks: int, errors: dict[str, float], step_error: float) -> dict:
    """A run summary (schema parallax_nb.run v1) whose per-variable bytes are the cost model's
    prediction for ``ranks`` x 1 times (1 + error), split evenly into sent and received."""
    est = cost.estimate(profile, plan, cluster=run_cluster(plan.cluster, ranks))
    variables, total = {}, 0.0
    for c, m in zip(est.variables, est.methods):
        moved = c.bytes_for(m) * (1 + errors.get(c.name, 0.0))
        total += moved
        variables[c.name] = {"method": m.value, "kind": c.kind.value, "partitions": plan.partitions(c.name),
                             "bytes_sent_per_step": moved / 2, "bytes_received_per_step": moved / 2}
    return {"schema": "parallax_nb.run", "schema_version": 1, "ranks": ranks, "machines": 1,
            "workers_per_machine": ranks, "architecture": plan.architecture.value, "steps": 5,
            "batch_size_per_rank": profile.batch_size, "step_time_s_median": est.step_time_s * (1 + step_error),
            "examples_per_s_median": ranks * profile.batch_size / (est.step_time_s * (1 + step_error)),
            "final_loss": 6.5, "variables": variables,
            "bytes_sent_per_step": total / 2, "bytes_received_per_step": total / 2}


@pytest.fixture(scope="module")
def lm_profile() -> Profile:
    from parallax_nb.profile import profile_job
    from parallax_nb.workloads import lm_job

    return profile_job(lm_job("tiny"), steps=5)


@pytest.fixture(scope="module")
def lm_plan(lm_profile):
    return make_plan(lm_profile, CLUSTER, "auto")


@pytest.fixture(scope="module")
def lm_report(lm_profile, lm_plan):
    return report(lm_profile, lm_plan)


@pytest.fixture(scope="module")
def saved(lm_report, tmp_path_factory):
    return lm_report.save(tmp_path_factory.mktemp("report") / "cost_report.html")


def test_variables_table_has_one_row_per_variable_with_the_cost_models_bytes(lm_profile, lm_plan, lm_report):
    rows = Tables(lm_report.html()).tables["variables"]
    header, body, foot = rows[0], rows[1:-1], rows[-1]
    assert header[:4] == ["variable", "kind", "shape", "size"]
    costs = {c.name: c for c in cost.variable_costs(lm_profile, lm_plan.cluster)}   # AUTO chose local aggregation
    assert [r[0] for r in body] == lm_profile.names
    col = {name: i for i, name in enumerate(header)}
    for row in body:
        var, c = lm_profile[row[0]], costs[row[0]]
        assert row[col["kind"]] == var.kind.value.upper()
        assert row[col["size"]] == format_bytes(var.size_bytes)
        assert row[col["PS bytes/step"]] == format_bytes(c.bytes_for("ps"))
        assert row[col["AR bytes/step"]] == format_bytes(c.bytes_for("ar"))
        assert row[col["method"]] == lm_plan.method(row[0]).value.upper()
        assert row[col["partitions"]] == str(lm_plan.partitions(row[0]))
    assert foot[0] == f"all {len(lm_profile.variables)} variables"
    assert format_bytes(lm_plan.bytes_per_machine_per_step) in foot[-2]


def test_totals_per_architecture_are_the_cost_models(lm_profile, lm_plan, lm_report):
    rows = Tables(lm_report.html()).tables["architectures"]
    by_label = {r[0]: r for r in rows[1:]}
    expected = cost.compare_architectures(lm_profile, lm_plan.cluster, include_horovod=True)
    labels = {"ar": "AR", "ps": "PS", "hybrid": "HYBRID", "auto": "AUTO", cost.SPARSE_AS_DENSE: "sparse-as-dense AR",
              cost.PLAIN_HOROVOD: "plain Horovod (defaults)", cost.TF_PS: "TF parameter servers"}
    assert set(by_label) == set(labels.values())
    for key, est in expected.items():
        row = by_label[labels[getattr(key, "value", key)]]
        assert row[1] == format_bytes(est.bytes_per_machine_per_step)
        assert float(row[6].replace(",", "").removesuffix(" ms")) == pytest.approx(est.step_time_s * 1e3, rel=5e-3)
    totals = lm_report.architecture_totals
    assert totals["hybrid"]["comm_time_s"] == expected["hybrid"].comm_time_s
    assert lm_report.to_dict()["plan"]["step_time_s"] == cost.estimate(lm_profile, lm_plan).step_time_s


def test_an_edited_plan_gets_its_own_totals_row(lm_profile, lm_plan):
    dense = next(v.name for v in lm_profile.variables if not v.is_sparse)
    edited = lm_plan.with_methods({dense: "ps"})
    rows = Tables(report(lm_profile, edited).html()).tables["architectures"]
    assert rows[1][0] == "this plan (AUTO, edited)"
    assert rows[1][1] == format_bytes(cost.estimate(lm_profile, edited).bytes_per_machine_per_step)
    assert len(rows) == 1 + 1 + 7


def test_charts_are_embedded_svg_images_and_nothing_is_fetched(lm_report, lm_profile, lm_plan):
    page = lm_report.html()
    sources = re.findall(r'<img src="([^"]+)"', page)
    assert len(sources) == 2
    for src in sources:
        assert src.startswith("data:image/svg+xml;base64,")
        root = ET.fromstring(base64.b64decode(src.split(",", 1)[1]))
        assert root.tag.endswith("svg")
    curve = lm_report.to_dict()["step_time_curve"]
    assert curve["machines"] == list(range(1, 65))
    assert set(curve["step_time_s"]) == {"ar", "ps", "hybrid", "auto", "sparse_as_dense", "horovod"}
    assert curve["step_time_s"]["hybrid"][7] == pytest.approx(
        cost.step_time_curve(lm_profile, lm_plan.cluster, "hybrid", machines=[8])[0][1])
    without_images = re.sub(r'src="data:[^"]*"', "", page)
    assert "http://" not in without_images and "https://" not in without_images
    assert "<script" not in page.lower()
    assert "Content-Security-Policy" in page
    assert "no overlap" in page.lower()


def test_json_round_trips_to_the_same_numbers(lm_report, saved, lm_profile, lm_plan):
    on_disk = json.loads(open(saved.json, encoding="utf-8").read())
    assert on_disk["schema"] == "parallax_nb.report" and on_disk["schema_version"] == 1
    again = Report.from_json(saved.json)
    assert again.to_dict() == lm_report.to_dict() == on_disk
    assert again.html() == open(saved.html, encoding="utf-8").read()
    est = cost.estimate(lm_profile, lm_plan)
    assert on_disk["plan"]["bytes_per_machine_per_step"] == est.bytes_per_machine_per_step
    assert on_disk["plan"]["comm_time_s"] == est.comm_time_s
    assert [v["name"] for v in on_disk["variables"]] == lm_profile.names
    assert on_disk["cluster"]["bandwidth_bps"] == CLUSTER.bandwidth_bps
    assert on_disk["measured"] is None


def test_csv_has_one_row_per_variable(saved, lm_profile, lm_plan):
    with open(saved.csv, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["name"] for r in rows] == lm_profile.names
    costs = {c.name: c for c in cost.variable_costs(lm_profile, lm_plan.cluster)}
    for r in rows:
        assert r["method"] == lm_plan.method(r["name"]).value
        assert float(r["ps_bytes_per_step"]) == costs[r["name"]].bytes_for("ps")
        assert float(r["ar_bytes_per_step"]) == costs[r["name"]].bytes_for("ar")
        assert int(r["size_bytes"]) == lm_profile[r["name"]].size_bytes


def test_user_text_is_escaped(lm_profile, tmp_path):
    renamed = dataclasses.replace(lm_profile.variables[0], name=EVIL)
    evil_profile = dataclasses.replace(lm_profile, model_name='<img src=x onerror="alert(2)">',
                                       variables=(renamed, *lm_profile.variables[1:]))
    plan = make_plan(evil_profile, CLUSTER, "hybrid")
    run = run_summary_for(evil_profile, plan, 2, {}, 0.0)
    rep = report(evil_profile, plan, run, title="<h1>t</h1>", notes="</div><script>alert(3)</script>")
    page = rep.html()
    assert "<script" not in page and "<img src=x" not in page and "<h1>t</h1>" not in page
    assert html.escape(EVIL) in page
    assert Tables(page).tables["variables"][1][0] == EVIL  # shown as text, in its row
    assert any(r[0].startswith(EVIL) for r in Tables(page).tables["measured-variables"][1:])
    assert "<script" not in rep._repr_html_()
    files = rep.save(tmp_path / "evil.html")
    assert Report.from_json(files.json).to_dict()["variables"][0]["name"] == EVIL
    with open(files.csv, newline="", encoding="utf-8") as f:
        assert next(csv.DictReader(f))["name"] == EVIL


def test_a_spreadsheet_formula_in_a_name_is_neutralised_in_the_csv(lm_profile):
    renamed = dataclasses.replace(lm_profile.variables[0], name="=HYPERLINK(\"x\")")
    prof = dataclasses.replace(lm_profile, variables=(renamed, *lm_profile.variables[1:]))
    rows = list(csv.DictReader(report(prof, make_plan(prof, CLUSTER)).to_csv().splitlines()))
    assert rows[0]["name"] == "'=HYPERLINK(\"x\")"


def test_a_run_gives_measured_against_predicted_with_percent_errors(lm_profile, lm_plan, tmp_path):
    sparse = [v.name for v in lm_profile.variables if v.is_sparse]
    dense = [v.name for v in lm_profile.variables if not v.is_sparse]
    errors = {sparse[0]: 0.10, dense[0]: -0.25}
    run = run_summary_for(lm_profile, lm_plan, 2, errors, step_error=0.5)
    rep = report(lm_profile, lm_plan, run)
    measured = rep.to_dict()["measured"]
    predicted = cost.estimate(lm_profile, lm_plan, cluster=lm_plan.cluster.replace(machines=2, workers_per_machine=1))
    assert measured["prediction_cluster"]["machines"] == 2 and measured["prediction_cluster"]["workers_per_machine"] == 1
    by_name = {v["name"]: v for v in measured["variables"]}
    assert set(by_name) == set(lm_profile.names)
    for name, row in by_name.items():
        assert row["error_pct"] == pytest.approx(100 * errors.get(name, 0.0), abs=1e-9)
    bytes_row, time_row = measured["totals"]
    assert bytes_row["predicted"] == predicted.bytes_per_machine_per_step
    total_measured = run["bytes_sent_per_step"] + run["bytes_received_per_step"]
    assert bytes_row["error_pct"] == pytest.approx(100 * (total_measured / predicted.bytes_per_machine_per_step - 1))
    assert time_row["predicted"] == predicted.step_time_s and time_row["error_pct"] == pytest.approx(50.0)
    rows = Tables(rep.html()).tables["measured-variables"]
    shown = {r[0]: r[3] for r in rows[1:]}
    assert shown[f"{sparse[0]} ({lm_plan.method(sparse[0]).value.upper()})"] == "+10.0%"
    assert shown[f"{dense[0]} ({lm_plan.method(dense[0]).value.upper()})"] == "-25.0%"
    assert "1 worker" in rep.html()  # the basis of the comparison is stated
    files = rep.save(tmp_path / "r.html")
    assert Report.from_json(files.json).to_dict()["measured"] == measured
    with open(files.csv, newline="", encoding="utf-8") as f:
        row = {r["name"]: r for r in csv.DictReader(f)}[sparse[0]]
    assert float(row["error_pct_run"]) == pytest.approx(10.0)
    # the step time, predicted for what ran against the run's median after the warm-up step, on every face
    assert time_row["quantity"] == "step time (median of steps 2-5, the first step left out as warm-up)"
    assert measured["step_time"]["measured_steps"] == "steps 2-5" and "uncalibrated" in measured["step_time"]["basis"]
    assert float(row["step_time_error_pct_run"]) == pytest.approx(50.0)
    assert float(row["measured_step_time_s_run"]) == pytest.approx(run["step_time_s_median"])
    assert "+50.0%" in [r[3] for r in Tables(rep.html()).tables["measured"]]
    assert "measured: the median of steps 2-5." in rep.html()


def test_a_run_with_other_methods_is_predicted_with_the_runs_methods(lm_profile, lm_plan):
    ar_plan = make_plan(lm_profile, CLUSTER, "ar")
    run = run_summary_for(lm_profile, ar_plan, 3, {}, 0.0)
    measured = report(lm_profile, lm_plan, run).to_dict()["measured"]
    assert all(v["method"] == "ar" and v["error_pct"] == pytest.approx(0.0, abs=1e-9) for v in measured["variables"])
    assert measured["totals"][0]["error_pct"] == pytest.approx(0.0, abs=1e-9)
    small_batch = dict(run, batch_size_per_rank=lm_profile.batch_size + 1)
    assert any("batch" in w for w in report(lm_profile, lm_plan, small_batch).to_dict()["measured"]["warnings"])


def test_run_can_be_a_directory_a_file_or_an_object_with_summary(lm_profile, lm_plan, tmp_path):
    run = run_summary_for(lm_profile, lm_plan, 2, {}, 0.1)
    (tmp_path / "run.json").write_text(json.dumps(run))

    class Result:
        def summary(self):
            return run

    expected = report(lm_profile, lm_plan, run).to_dict()["measured"]
    for source in (tmp_path, str(tmp_path / "run.json"), Result()):
        assert report(lm_profile, lm_plan, source).to_dict()["measured"] == expected


@pytest.mark.parametrize("change, message", [
    (lambda r: r.update(schema="something.else"), "not a parallax_nb run summary"),
    (lambda r: r.update(schema_version=2), "schema_version 2"),
    (lambda r: r.pop("step_time_s_median"), "step_time_s_median"),
    (lambda r: r.update(ranks="two"), "'ranks'"),
    (lambda r: r.update(ranks=0), "ranks must be >= 1"),
    (lambda r: next(iter(r["variables"].values())).update(method="allgather"), "unknown method 'allgather'"),
    (lambda r: r.update(bytes_sent_per_step=-1.0), "must be >= 0"),
    (lambda r: r.update(bytes_received_per_step=float("inf")), "must be a finite number"),
])
def test_bad_run_summaries_are_named(lm_profile, lm_plan, change, message):
    run = json.loads(json.dumps(run_summary_for(lm_profile, lm_plan, 2, {}, 0.0)))
    change(run)
    with pytest.raises(ConfigError, match=re.escape(message)):
        report(lm_profile, lm_plan, run)


def test_a_run_without_measured_steps_shows_unknown_times(lm_profile, lm_plan):
    run = dict(run_summary_for(lm_profile, lm_plan, 2, {}, 0.0), step_time_s_median=float("nan"),
               examples_per_s_median=float("nan"), final_loss=float("nan"))
    rep = report(lm_profile, lm_plan, json.loads(json.dumps(run)))  # NaN survives Python's json, not the report's
    time_row = rep.to_dict()["measured"]["totals"][1]
    assert time_row["measured"] is None and time_row["error_pct"] is None
    assert "NaN" not in rep.to_json()
    shown = Tables(rep.html()).tables["measured"][2]
    assert shown[0].startswith("step time (median of steps 2-5") and shown[2:] == ["n/a", "n/a"]


def test_bad_inputs_raise_clear_errors(lm_profile, lm_plan, lm_report, tmp_path):
    with pytest.raises(ConfigError, match="has no run.json"):
        report(lm_profile, lm_plan, tmp_path)
    with pytest.raises(ConfigError, match="run not found: .*nowhere"):
        report(lm_profile, lm_plan, tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="cannot read a run from int"):
        report(lm_profile, lm_plan, 42)
    with pytest.raises(ConfigError, match="must end in .html"):
        lm_report.save(tmp_path / "report.json")
    with pytest.raises(PlanError, match="no cluster"):
        report(lm_profile, plan_for_kinds({v.name: v.kind for v in lm_profile.variables}, "hybrid"))
    other = dataclasses.replace(lm_profile, variables=lm_profile.variables[1:])
    with pytest.raises(PlanError, match="does not match"):
        report(other, lm_plan)
    with pytest.raises(ConfigError, match="needs a parallax_nb Profile"):
        report(lm_profile.to_dict(), lm_plan)
    with pytest.raises(ConfigError, match="not a parallax_nb report"):
        Report.from_json(json.dumps({"schema": "parallax_nb.plan"}))


def test_cli_writes_the_three_files_and_prints_their_paths(lm_profile, lm_plan, tmp_path, capsys):
    from parallax_nb.__main__ import main

    lm_profile.to_json(str(tmp_path / "profile.json"))
    lm_plan.to_json(str(tmp_path / "plan.json"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps(run_summary_for(lm_profile, lm_plan, 2, {}, 0.2)))
    out = tmp_path / "out" / "report.html"
    rc = main(["report", "--profile", str(tmp_path / "profile.json"), "--plan", str(tmp_path / "plan.json"),
               "--run", str(run_dir), "-o", str(out), "--notes", EVIL])
    printed = capsys.readouterr().out.split()
    assert rc == 0
    assert printed == [str(out), str(out.with_suffix(".csv")), str(out.with_suffix(".json"))]
    data = Report.from_json(str(out.with_suffix(".json"))).to_dict()
    assert data["measured"]["totals"][1]["error_pct"] == pytest.approx(20.0)
    assert data["notes"] == EVIL and EVIL not in out.read_text()
    rc = main(["report", "--profile", str(tmp_path / "missing.json"), "--plan", str(tmp_path / "plan.json"),
               "-o", str(out)])
    assert rc == 2 and "missing.json" in capsys.readouterr().err


def train_tiny_lm_summary(plan, steps):
    """On every rank: train the tiny LM under ``plan`` and return the run summary."""
    from parallax_nb.runtime import train
    from parallax_nb.workloads import lm_job

    return train(lm_job("tiny"), plan, steps).summary()


@pytest.mark.mpi
def test_report_of_a_real_two_rank_run(lm_profile, tmp_path, test_output_dir):
    """A real 2-rank HYBRID run of the tiny LM (Horovod over Open MPI), reported against the model."""
    pytest.importorskip("horovod.tensorflow")
    from parallax_nb.launch import run_on_ranks

    plan = make_plan(lm_profile, ClusterSpec.create(machines=2, workers_per_machine=1, bandwidth="10Gbit/s"), "hybrid")
    summaries = run_on_ranks(train_tiny_lm_summary, np=2, args=(plan, 4), timeout_s=300)
    summary = summaries[0]
    (tmp_path / "run.json").write_text(json.dumps(summary))
    rep = report(lm_profile, plan, tmp_path, notes="tiny LM, 2 ranks on one host, 4 steps")
    files = rep.save(test_output_dir / "report_lm_2ranks.html")

    measured = rep.to_dict()["measured"]
    predicted = cost.estimate(lm_profile, plan, cluster=run_cluster(plan.cluster, 2))
    bytes_row, time_row = measured["totals"]
    assert bytes_row["predicted"] == predicted.bytes_per_machine_per_step
    assert bytes_row["measured"] == summary["bytes_sent_per_step"] + summary["bytes_received_per_step"]
    assert bytes_row["error_pct"] == pytest.approx(100 * (bytes_row["measured"] / bytes_row["predicted"] - 1))
    assert abs(bytes_row["error_pct"]) < 25, bytes_row  # same units and basis: per rank, sent + received, per step
    assert time_row["measured"] == summary["step_time_s_median"] and time_row["error_pct"] is not None
    assert summary["measured_steps"] == [2, 4] and "median of steps 2-4" in time_row["quantity"]
    assert time_row["error_pct"] == pytest.approx(100 * (time_row["measured"] / time_row["predicted"] - 1))
    print(f"\ntiny LM HYBRID, 2 ranks on one host: step time predicted {time_row['predicted'] * 1e3:.1f} ms, "
          f"measured {time_row['measured'] * 1e3:.1f} ms ({time_row['error_pct']:+.0f} %)")
    rows = {v["name"]: v for v in measured["variables"]}
    assert set(rows) == set(lm_profile.names)
    for var in lm_profile.variables:
        assert rows[var.name]["method"] == plan.method(var.name).value
        if not var.is_sparse:  # a dense ring allreduce moves exactly the model's bytes
            assert rows[var.name]["error_pct"] == pytest.approx(0.0, abs=1.0), rows[var.name]
    page = open(files.html, encoding="utf-8").read()
    shown = Tables(page).tables["measured-variables"]
    assert len(shown) == 1 + len(lm_profile.variables)
    assert all(r[3].endswith("%") for r in shown[1:])
    assert Report.from_json(files.json).to_dict() == rep.to_dict()


def test_environment_facts_read_as_text_with_units(lm_report):
    """The facts table: seconds with 3 digits in s, ms or µs, no Python list brackets, no raw floats;
    the assumptions speak of the run's topology, not of a literal placeholder."""
    page = lm_report.html()
    facts = re.findall(r"<td>environment: ([^<]+)</td><td>([^<]*)</td>", page)
    assert facts
    for key, value in facts:
        assert "[" not in value and "]" not in value, (key, value)
        if key.endswith("_s"):
            assert re.fullmatch(r"\d[\d.]* (s|ms|µs)", value) and len(value) <= 8, (key, value)
    assert "&lt;ranks&gt;" not in page and "<ranks>" not in page


def test_cli_step_time_line_names_the_steps_and_the_missing_profile(lm_profile, lm_plan):
    """`python -m parallax_nb run`'s summary line: the estimate of what ran against the median
    of the steps after the first; without a profile it says how to get a prediction."""
    from parallax_nb import cost
    from parallax_nb.cli.run import step_time_summary
    from parallax_nb.report.build import executed_of

    run = dict(run_summary_for(lm_profile, lm_plan, 2, {}, 0.0), step_time_s_median=0.25, measured_steps=[2, 5])
    executed = executed_of(run, lm_profile, lm_plan)
    run["executed_plan"] = executed.to_dict()
    predicted = cost.estimate_executed(lm_profile, executed, lm_plan.cluster.replace(
        machines=executed.machines, workers_per_machine=executed.workers_per_machine,
        local_aggregation=executed.local_aggregation)).step_time_s
    line = step_time_summary(lm_profile, lm_plan, run)
    assert line.startswith(f"step time: predicted {predicted * 1e3:.1f} ms, measured 250.0 ms (median of steps 2-5), "
                           f"{100 * (0.25 / predicted - 1):+.1f} %"), line
    assert "no prediction (pass --profile profile.json" in step_time_summary(None, lm_plan, run)
    other = dataclasses.replace(lm_profile, variables=(dataclasses.replace(lm_profile.variables[0], name="other/w"),
                                                       *lm_profile.variables[1:]))    # a profile of another model
    assert step_time_summary(other, lm_plan, run).startswith("step time: no prediction (the executed plan")
