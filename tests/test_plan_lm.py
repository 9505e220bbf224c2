"""AUTO on a real profile of the tiny LM reference workload: PS for the sparse embedding and
softmax, AR for every dense variable at N >= 2; nothing moves (all AR) at N = 1."""
import pytest

from parallax_nb.cost import compare_architectures
from parallax_nb.plan import Plan, make_plan
from parallax_nb.types import Architecture, ClusterSpec, Kind, Method


@pytest.fixture(scope="module")
def lm_profile():
    from parallax_nb.profile import profile_job
    from parallax_nb.workloads import lm_job

    return profile_job(lm_job("tiny"), steps=8, warmup=1)


def test_the_profile_has_sparse_and_dense_variables(lm_profile):
    kinds = {v.kind for v in lm_profile.variables}
    assert kinds == {Kind.SPARSE, Kind.DENSE}


@pytest.mark.parametrize("machines, workers_per_machine, local_aggregation",
                         [(2, 1, True), (4, 2, True), (8, 4, True), (4, 2, False), (64, 1, True)])
def test_auto_picks_ps_for_sparse_and_ar_for_dense(lm_profile, machines, workers_per_machine, local_aggregation):
    cluster = ClusterSpec.create(machines, workers_per_machine, "10Gbit/s", local_aggregation=local_aggregation)
    plan = make_plan(lm_profile, cluster, "auto")
    for v in lm_profile.variables:
        expected = Method.PS if v.is_sparse else Method.AR
        assert plan.method(v.name) is expected, (v.name, plan[v.name])
    ests = compare_architectures(lm_profile, cluster)
    assert ests[Architecture.AUTO].bytes_per_machine_per_step == pytest.approx(
        ests[Architecture.HYBRID].bytes_per_machine_per_step)
    assert ests[Architecture.AUTO].bytes_per_machine_per_step < ests[Architecture.AR].bytes_per_machine_per_step
    assert Plan.from_json(plan.to_json(), variable_names=lm_profile.names) == plan


def test_one_machine_moves_nothing_and_keeps_ar(lm_profile):
    plan = make_plan(lm_profile, ClusterSpec(machines=1, workers_per_machine=2), "auto")
    assert plan.ps_variables == () and plan.bytes_per_machine_per_step == 0
