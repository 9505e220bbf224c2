"""The plan's sync flag and staleness bound (issue 16): JSON round-trip, older plans load as
synchronous, and bad combinations are refused with a PlanError naming the value and the
alternative. No MPI."""
from __future__ import annotations

import pytest

from parallax_nb.errors import PlanError
from parallax_nb.plan import Plan, plan_for_kinds

KINDS = {"embedding/embeddings": "sparse", "dense/kernel": "dense"}


def _ps_plan(**kwargs) -> Plan:
    return plan_for_kinds(KINDS, "ps", **kwargs)


def test_plans_are_synchronous_by_default():
    plan = _ps_plan()
    assert plan.sync is True and plan.max_staleness is None
    assert "asynchronous" not in plan.summary()


@pytest.mark.parametrize("max_staleness", [None, 0, 1, 7])
def test_an_asynchronous_plan_round_trips_through_json(max_staleness):
    plan = _ps_plan().with_sync(False, max_staleness)
    loaded = Plan.from_json(plan.to_json())
    assert loaded == plan
    assert (loaded.sync, loaded.max_staleness) == (False, max_staleness)
    bound = "unbounded" if max_staleness is None else f"max_staleness={max_staleness}"
    assert f"asynchronous ({bound})" in plan.summary()


def test_a_plan_without_the_fields_loads_as_synchronous():
    data = _ps_plan().with_sync(False, 2).to_dict()
    del data["sync"], data["max_staleness"]
    loaded = Plan.from_dict(data)
    assert (loaded.sync, loaded.max_staleness) == (True, None)


def test_plan_for_kinds_takes_the_flag():
    plan = plan_for_kinds(KINDS, "ps", sync=False, max_staleness=3)
    assert (plan.sync, plan.max_staleness) == (False, 3)


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_a_bad_max_staleness_is_refused_naming_it(bad):
    with pytest.raises(PlanError) as err:
        _ps_plan().with_sync(False, bad)
    assert repr(bad) in err.value.message and "max_staleness" in err.value.message


def test_a_bad_max_staleness_in_json_is_refused():
    data = _ps_plan().with_sync(False, 1).to_dict()
    data["max_staleness"] = -3
    with pytest.raises(PlanError, match="-3"):
        Plan.from_dict(data)


def test_a_sync_flag_that_is_not_a_boolean_is_refused():
    data = _ps_plan().to_dict()
    data["sync"] = "false"
    with pytest.raises(PlanError, match="'false'"):
        Plan.from_dict(data)


def test_max_staleness_on_a_synchronous_plan_is_refused():
    with pytest.raises(PlanError) as err:
        _ps_plan().with_sync(True, 2)
    assert "max_staleness=2" in err.value.message and "synchronous" in err.value.message
    assert "with_sync(False, max_staleness=2)" in err.value.hint


def test_an_all_allreduce_plan_cannot_be_asynchronous():
    with pytest.raises(PlanError) as err:
        plan_for_kinds(KINDS, "ar").with_sync(False)
    assert "every variable" in err.value.message and "AllReduce" in err.value.message
    assert "architecture='ps'" in err.value.hint


def test_a_hybrid_plan_cannot_be_asynchronous_naming_its_allreduce_variables():
    with pytest.raises(PlanError) as err:
        plan_for_kinds(KINDS, "hybrid").with_sync(False)
    assert "'dense/kernel'" in err.value.message and "barrier" in err.value.message
    assert "architecture='ps'" in err.value.hint


def test_switching_a_variable_of_an_asynchronous_plan_to_allreduce_is_refused():
    plan = _ps_plan().with_sync(False)
    with pytest.raises(PlanError, match="AllReduce"):
        plan.with_methods({"dense/kernel": "ar"})
