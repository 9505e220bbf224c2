"""AUTO on a real profile of the tiny LM reference workload: the least estimated step time.
Its tables are a few tens of KB, so the calls' latency decides: at 10 Gbit/s AUTO keeps every
variable AR (two allgathers a variable against PS's three alltoalls), and says so per
variable; at 100 Mbit/s the bytes decide and the sparse variables go PS. Nothing moves (all
AR) at N = 1."""
import pytest

from parallax_nb.cost import compare_architectures, estimate
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
def test_auto_is_never_estimated_slower_and_says_why(lm_profile, machines, workers_per_machine, local_aggregation):
    cluster = ClusterSpec.create(machines, workers_per_machine, "10Gbit/s", local_aggregation=local_aggregation)
    plan = make_plan(lm_profile, cluster, "auto")
    for v in lm_profile.variables:
        other = "PS" if plan.method(v.name) is Method.AR else "AR"
        line = next(e for e in plan.explanations if e.startswith(f"{v.name}: "))
        assert line.startswith(f"{v.name}: {plan.method(v.name).value.upper()}, ") and other in line, line
    # the sampled softmax's weights and biases, looked up together, take one method and say so
    assert plan.method("softmax/softmax_w") is plan.method("softmax/softmax_b")
    together = [e for e in plan.explanations if "(looked up together), both" in e]
    assert [e.split(":")[0] for e in together] == ["softmax/softmax_w", "softmax/softmax_b"], plan.explanations
    ests = compare_architectures(lm_profile, cluster)
    fastest_other = min(ests[a].step_time_s for a in (Architecture.AR, Architecture.PS, Architecture.HYBRID))
    assert ests[Architecture.AUTO].step_time_s <= fastest_other
    assert Plan.from_json(plan.to_json(), variable_names=lm_profile.names) == plan


def test_on_a_slow_network_the_bytes_decide(lm_profile):
    plan = make_plan(lm_profile, ClusterSpec.create(8, 1, "100Mbit/s"), "auto")
    assert {v.name for v in lm_profile.variables if v.is_sparse and v.size_bytes > 60_000} <= set(plan.ps_variables)
    assert all(plan.method(v.name) is Method.AR for v in lm_profile.variables if not v.is_sparse)


def test_one_machine_moves_nothing_and_auto_goes_by_calls(lm_profile):
    """On one machine nothing crosses a link, so AUTO decides by the calls a step issues. The
    sparse AR variables ride one call per row shape either way (the embedding's and the softmax
    weights' rows of 16 in one, the biases in another): with local aggregation a gather inside
    the machine, without it an allgather of the rows with their ids. Against 3 alltoalls for the
    embedding's PS and 3 for the softmax's weights and biases looked up together, every variable
    stays on AR, at 3 calls a step (two grouped calls, the fused allreduce), aggregation on or
    off."""
    cluster = ClusterSpec(machines=1, workers_per_machine=2)
    for aggregated in (None, True, False):
        plan = make_plan(lm_profile, cluster, "auto", local_aggregation=aggregated)
        assert plan.bytes_per_machine_per_step == 0
        assert plan.ps_variables == (), aggregated
        assert aggregated is None or plan.local_aggregation is aggregated
        assert estimate(lm_profile, plan).collective_calls_per_step == 3, aggregated
