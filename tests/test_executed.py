"""The executed plan: what the ranks ran and why it differs from the plan, carried to run.json,
the run view and the report. Pure Python here (the runtime's table is given as the trainer
builds it); tests/test_keras_models.py shows it from a real 2-rank run."""
from __future__ import annotations

import json

import pytest

from parallax_nb.cluster.handle import Run
from parallax_nb.cost import estimate_executed, variable_cost
from parallax_nb.errors import ConfigError
from parallax_nb.executed import ExecutedPlan
from parallax_nb.plan import make_plan
from parallax_nb.report.build import build_report_data, validate_run
from parallax_nb.report.html import render_fragment
from parallax_nb.runtime.executed import SEARCHED, UNROUTED, executed_plan
from parallax_nb.runtime.topology import Topology
from parallax_nb.types import RUN_SCHEMA, ClusterSpec, Kind, Method, Profile
from parallax_nb.widgets.run_view import RunView
from test_cost import dense_var, sparse_var

PROFILE = Profile(model_name="m", batch_size=8, steps=4, step_time_s=0.01, peak_memory_bytes=0,
                  variables=(sparse_var("table", rows=1000, width=16, alpha=0.01), dense_var("dense/kernel")))


def _ran(table_kind="dense", table_partitions=4):
    """The table ``Trainer.variable_table()`` builds: the sparse table served whole (unrouted)."""
    return {"table": {"method": "ps", "kind": table_kind, "partitions": table_partitions},
            "dense/kernel": {"method": "ar", "kind": "dense", "partitions": 1}}


def test_every_difference_is_named_with_its_reason():
    plan = make_plan(PROFILE, ClusterSpec(machines=2, workers_per_machine=2), "hybrid", partitions=2)
    unequal = Topology((0, 0, 0, 1), "hosts")  # 3 + 1 ranks: local aggregation cannot run
    executed = executed_plan(plan, _ran(table_partitions=4), unequal, local_aggregation=False)
    changes = {(c.variable, c.what): c for c in executed.changes}
    assert set(changes) == {("table", "kind"), ("table", "partitions"), (None, "local_aggregation")}
    assert (changes["table", "kind"].requested, changes["table", "kind"].executed) == ("sparse", "dense")
    assert changes["table", "kind"].reason == UNROUTED
    assert (changes["table", "partitions"].requested, changes["table", "partitions"].executed) == (2, 4)
    assert "3 + 1" in changes[None, "local_aggregation"].reason
    assert executed["table"].kind is Kind.DENSE and executed.ranks == 4 and executed.machines == 2
    assert "table: kind sparse -> dense (its rows are read outside the routed lookup" in executed.change_lines()[0]


def test_a_plan_run_as_given_has_no_changes_and_another_count_says_why():
    plan = make_plan(PROFILE, ClusterSpec(machines=4), "hybrid", partitions=2)
    same = executed_plan(plan, _ran("sparse", 2), Topology.blocks(4, 1), local_aggregation=False)
    assert same.changes == ()  # one rank per machine: local aggregation on or off runs the same
    raised = executed_plan(plan, _ran("sparse", 4), Topology.blocks(4, 1), local_aggregation=False)
    assert [c.reason for c in raised.changes] == [SEARCHED]


def test_json_round_trip_and_bad_input():
    plan = make_plan(PROFILE, ClusterSpec(machines=2, workers_per_machine=2), "hybrid", partitions=2)
    executed = executed_plan(plan, _ran(), Topology((0, 0, 0, 1)), local_aggregation=False)
    assert ExecutedPlan.from_dict(json.loads(json.dumps(executed.to_dict()))) == executed
    broken = executed.to_dict()
    del broken["variables"][0]["kind"]
    with pytest.raises(ConfigError, match="executed plan lacks field 'kind'"):
        ExecutedPlan.from_dict(broken)


def test_the_report_charges_what_ran_and_shows_the_changes():
    """The table ran as a dense PS variable: the report predicts the dense PS entry for it,
    4·m·(n−1)/n = 4·64,000·1/2 = 128,000 B on 2 machines (not the sparse PS figure), and
    lists the change with its reason."""
    cluster = ClusterSpec(machines=2)
    plan = make_plan(PROFILE, cluster, "hybrid", partitions=2)
    executed = executed_plan(plan, _ran(table_partitions=2), Topology.blocks(2, 1), local_aggregation=False)
    est = estimate_executed(PROFILE, executed, cluster)
    by_name = dict(zip((c.name for c in est.variables), est.variables))
    assert by_name["table"].bytes_for(Method.PS) == pytest.approx(128_000)
    assert variable_cost(PROFILE["table"], cluster).bytes_for(Method.PS) < 128_000  # the sparse figure
    summary = {"schema": RUN_SCHEMA, "schema_version": 1, "ranks": 2, "machines": 2, "workers_per_machine": 1,
               "local_aggregation": False, "architecture": "hybrid", "steps": 4, "batch_size_per_rank": 8,
               "step_time_s_median": 0.01, "examples_per_s_median": 1600.0, "final_loss": 0.5,
               "bytes_sent_per_step": 70_000.0, "bytes_received_per_step": 70_000.0,
               "variables": {"table": {"method": "ps", "kind": "dense", "partitions": 2,
                                       "bytes_sent_per_step": 64_000.0, "bytes_received_per_step": 64_000.0},
                             "dense/kernel": {"method": "ar", "kind": "dense", "partitions": 1,
                                              "bytes_sent_per_step": 6_000.0, "bytes_received_per_step": 6_000.0}},
               "executed_plan": executed.to_dict()}
    data = build_report_data(PROFILE, plan, run=summary)
    measured = {v["name"]: v for v in data["measured"]["variables"]}
    assert measured["table"]["predicted_bytes_per_step"] == pytest.approx(128_000)
    assert measured["table"]["kind"] == "dense"
    assert data["measured"]["executed_plan"]["changes"][0]["reason"] == UNROUTED
    assert "What the run changed from the plan" in render_fragment(data)
    run = Run(steps=4, engines=2)
    run.finish(summary=summary)
    assert "plan changed: table: kind sparse -> dense" in RunView(run).status_text()
    with pytest.raises(ConfigError, match="executed_plan lacks field 'architecture'"):
        validate_run(dict(summary, executed_plan={"variables": []}))


def test_the_run_check_warns_of_a_calibration_under_another_cycle_time():
    """cost.against_run.check_step_time given the run's Horovod settings (run.json's horovod_env)."""
    from parallax_nb.calibration import Calibration
    from parallax_nb.cost.against_run import check_step_time

    cluster = ClusterSpec(machines=2, workers_per_machine=2)
    plan = make_plan(PROFILE, cluster, "hybrid", partitions=2)
    executed = executed_plan(plan, _ran("sparse", 2), Topology.blocks(2, 2), local_aggregation=True)
    cal = Calibration(2, 2, Calibration.defaults(2, 2, 1e9, 25e-6).fits, where="emulated 2x2@1Gbit/s",
                      horovod_env={"HOROVOD_CYCLE_TIME": "1"})
    same = check_step_time(PROFILE, executed, cluster, 0.2, "steps 2-10", cal,
                           run_horovod_env={"HOROVOD_CYCLE_TIME": "1"})
    other = check_step_time(PROFILE, executed, cluster, 0.2, "steps 2-10", cal,
                            run_horovod_env={"HOROVOD_CYCLE_TIME": "0.1"})
    assert same.warning == "" and "WARNING" not in same.line()
    assert "HOROVOD_CYCLE_TIME 1 ms in the calibration, 0.1 ms in the run" in other.warning
    assert "WARNING: calibrated under other Horovod settings" in other.line() and other.to_dict()["warning"]
    from parallax_nb.report.html import _step_time_basis

    assert "Warning: calibrated under other Horovod settings" in _step_time_basis(other.to_dict())
    # a calibration that does not record its ranks' cores, against a run whose ranks had 1 each
    placed = check_step_time(PROFILE, executed, cluster, 0.2, "steps 2-10", cal,
                             run_horovod_env={"HOROVOD_CYCLE_TIME": "1"}, run_rank_cores=1)
    assert "calibrated with other cores per rank than the run (not recorded in the calibration" in placed.warning
    assert "WARNING: calibrated with other cores per rank" in placed.line()
