"""The cost side's method table: one entry per (Method, Kind), the baselines, and what each
entry says a step issues. Figures are worked by hand in the docstrings (pure Python)."""
from __future__ import annotations

import pytest

from parallax_nb.cost import BASELINES, METHOD_COSTS, TF_PS, estimate, step_time_curve, variable_cost
from parallax_nb.cost.methods import AR_SPARSE_GROUP, AR_SPARSE_ROWS
from parallax_nb.plan import make_plan
from parallax_nb.types import ASYNC_PS, BASELINE_KEYS, ClusterSpec, Collective, Kind, Method, MethodCost
from test_cost import BYTE, dense_var, lm_profile, sparse_var


def test_the_table_has_one_entry_per_method_and_kind_and_one_per_kind_per_baseline():
    assert set(METHOD_COSTS) == {(m, k) for m in (*Method, ASYNC_PS) for k in Kind}
    assert set(BASELINES) == set(BASELINE_KEYS)
    assert all(set(by_kind) == set(Kind) for by_kind in BASELINES.values())


@pytest.mark.parametrize("aggregation", [True, False])
@pytest.mark.parametrize("machines,workers", [(1, 4), (2, 1), (4, 2), (3, 4)])
def test_every_entry_of_a_variables_table_is_its_cost_function_s(machines, workers, aggregation):
    """A variable's table shares a dense baseline's entry with a method's where the two
    coincide (e.g. plain Horovod's allreduce and AR): each shared entry is what its own cost
    function gives on that cluster."""
    cluster = ClusterSpec(machines=machines, workers_per_machine=workers, local_aggregation=aggregation)
    for var in (dense_var(), sparse_var(unions=[1000, 1900, 2700, 3400])):
        table = variable_cost(var, cluster).methods
        functions = {**{m.value: METHOD_COSTS[(m, var.kind)] for m in Method},
                     **{key: by_kind[var.kind] for key, by_kind in BASELINES.items()}}
        assert set(table) == set(functions)
        for key, function in functions.items():
            assert table[key] == function(var, cluster), (var.kind, key)


def test_tf_ps_baseline_is_ps_with_every_worker_on_its_own():
    """N = 4, G = 4, R = 100,000 rows, m = 25,600,000 B, alpha_1 = 0.01 (union of 4: 0.034).

    TF-PS ignores local aggregation: W = 16 participants, 4 per machine, r = (16-4)/15:
      sparse = G·r·[4·α·m·15/16 + 16·α·R·15/16] = 3,072,000 + 48,000 = 3,120,000
      dense (16,384 B) = G·r·4·m·15/16 = 196,608
    while parallax_nb's PS with local aggregation moves 2,652,000 (the union, once per machine).
    """
    cluster = ClusterSpec(machines=4, workers_per_machine=4)
    sparse = variable_cost(sparse_var(unions=[1000, 1900, 2700, 3400]), cluster)
    assert sparse.bytes_for(TF_PS) == pytest.approx(3_120_000, abs=BYTE)
    assert sparse.bytes_for(Method.PS) == pytest.approx(2_652_000, abs=BYTE)
    assert sparse.cost_of(TF_PS).index_bytes_per_step == pytest.approx(48_000, abs=BYTE)
    assert variable_cost(dense_var(), cluster).bytes_for(TF_PS) == pytest.approx(196_608, abs=BYTE)


def test_each_entry_names_the_collectives_a_step_issues():
    """Without local aggregation: a fused allreduce, one allgather of rows shared by a row shape, three
    alltoalls (ids, rows, row gradients), two alltoalls (push, pull). With G > 1 and local
    aggregation the sparse ones gather inside the machine, then cross among one local index."""
    flat = ClusterSpec(machines=4, workers_per_machine=1)
    two_level = ClusterSpec(machines=4, workers_per_machine=2)
    sparse, dense = sparse_var(unions=[1000, 1900]), dense_var()
    assert METHOD_COSTS[(Method.AR, Kind.DENSE)](dense, flat).collectives == (Collective("allreduce", 1),)
    assert METHOD_COSTS[(Method.AR, Kind.DENSE)](dense, flat).fused_allreduce
    # flat, the AR sparse variables of a row shape share one allgather of rows with their ids
    rows = METHOD_COSTS[(Method.AR, Kind.SPARSE)](sparse, flat)
    assert rows.collectives == (Collective("allgather", 0),) and rows.collectives[0].handed_bytes > 0
    assert rows.grouped == (Collective("allgather", 1),) and rows.group == f"{AR_SPARSE_ROWS} float32 (64,)"
    assert METHOD_COSTS[(Method.PS, Kind.SPARSE)](sparse, flat).collectives == (Collective("alltoall", 3),)
    assert METHOD_COSTS[(Method.PS, Kind.DENSE)](dense, flat).collectives == (Collective("alltoall", 2),)
    assert METHOD_COSTS[(Method.PS, Kind.SPARSE)](sparse, two_level).collectives == (
        Collective("alltoall", 3, "machine"), Collective("alltoall", 3, "cross"))
    assert METHOD_COSTS[(Method.AR, Kind.SPARSE)](sparse, two_level).collectives == (
        Collective("alltoall", 4, "machine"), Collective("alltoall", 2, "cross"))
    # on one machine the AR sparse variables share one gather: the cost hands its bytes to a call
    # it counts 0 times, and names the group's call (counted once per step)
    grouped = METHOD_COSTS[(Method.AR, Kind.SPARSE)](sparse, ClusterSpec(machines=1, workers_per_machine=4))
    assert grouped.collectives == (Collective("alltoall", 0, "machine"),)
    assert grouped.collectives[0].handed_bytes > 0 and grouped.bytes_per_step == 0
    assert grouped.grouped == (Collective("alltoall", 1, "machine"),)
    assert grouped.group == f"{AR_SPARSE_GROUP} float32 (64,)"
    assert isinstance(METHOD_COSTS[(Method.PS, Kind.DENSE)](dense, flat), MethodCost)


def test_estimates_charge_each_variable_its_entry_and_baselines_their_own():
    """The plan's total is the sum of the entries its methods name; a baseline's total is the
    sum of the baseline's entries, whatever the plan chose."""
    prof, cluster = lm_profile(), ClusterSpec(machines=8, workers_per_machine=2)
    plan = make_plan(prof, cluster, "hybrid")
    est = estimate(prof, plan)
    entries = [METHOD_COSTS[(plan.method(v.name), v.kind)](v, cluster).bytes_per_step for v in prof.variables]
    assert est.bytes_per_machine_per_step == pytest.approx(sum(entries))
    assert set(est.method_bytes_per_machine_per_step) == {"ps", "ar"}
    tf_ps = sum(BASELINES[TF_PS][v.kind](v, cluster).bytes_per_step for v in prof.variables)
    assert variable_cost(prof.variables[0], cluster).bytes_for(TF_PS) > 0 and tf_ps > est.bytes_per_machine_per_step
    one_machine, eight = step_time_curve(prof, cluster, TF_PS, machines=[1, 8])
    assert one_machine[1] > prof.step_time_s   # one machine's 2 ranks still exchange, in shared memory
    assert eight[1] > one_machine[1]


def test_a_variable_looked_up_with_another_rides_its_exchange_under_ps():
    """softmax_b, looked up at softmax_w's ids in one call: under PS the runtime sends those
    ids once and both variables' rows in the same three alltoalls. softmax_b's entry keeps
    its rows and their gradients (handed to calls it does not issue: count 0) and drops its
    ids; TensorFlow's PS and the asynchronous PS still serve it on its own."""
    from dataclasses import replace

    from parallax_nb.cost.methods import ps_sparse_alone

    for cluster in (ClusterSpec(machines=4, workers_per_machine=1), ClusterSpec(machines=4, workers_per_machine=2)):
        alone = sparse_var("softmax_b", rows=100_000, width=1, unions=[1000, 1900])
        rider = replace(alone, lookup_shared_with="softmax_w")
        own, rides = ps_sparse_alone(alone, cluster), METHOD_COSTS[(Method.PS, Kind.SPARSE)](rider, cluster)
        assert METHOD_COSTS[(Method.PS, Kind.SPARSE)](alone, cluster) == own
        assert own.index_bytes_per_step > 0 and own.messages_per_step > 0
        assert rides.bytes_per_step == pytest.approx(own.bytes_per_step - own.index_bytes_per_step)
        assert rides.index_bytes_per_step == 0 and rides.messages_per_step == 0
        assert [c.count for c in rides.collectives] == [0] * len(own.collectives)
        assert [c.participants for c in rides.collectives] == [c.participants for c in own.collectives]
        values = 2 * rider.alpha_for_workers(cluster.workers_per_machine) * rider.size_bytes  # rows, gradients
        assert sum(c.handed_bytes for c in rides.collectives) == pytest.approx(
            values * (1 if cluster.workers_per_machine == 1 else 1 + 1 / cluster.workers_per_machine))
        assert variable_cost(rider, cluster).bytes_for(TF_PS) == variable_cost(alone, cluster).bytes_for(TF_PS)
        assert METHOD_COSTS[(ASYNC_PS, Kind.SPARSE)](rider, cluster) == METHOD_COSTS[(ASYNC_PS, Kind.SPARSE)](alone,
                                                                                                             cluster)


def test_a_plan_with_lookups_made_together_issues_one_exchange_for_them():
    """The LM-shaped profile with softmax_b looked up with softmax_w: HYBRID's step issues the
    embedding's and the softmax's three alltoalls (6), plus the fused allreduce; without the
    shared lookup it would be 9."""
    from dataclasses import replace

    prof = lm_profile()
    shared = replace(prof, variables=tuple(replace(v, lookup_shared_with="softmax_w") if v.name == "softmax_b" else v
                                           for v in prof.variables))
    cluster = ClusterSpec(machines=4, workers_per_machine=1)
    apart, together = (estimate(p, make_plan(p, cluster, "hybrid")) for p in (prof, shared))
    assert apart.collective_calls_per_step == 10 and together.collective_calls_per_step == 7
    assert together.comm_time_s < apart.comm_time_s
    assert together.bytes_per_machine_per_step == pytest.approx(
        apart.bytes_per_machine_per_step - variable_cost(prof["softmax_b"], cluster).cost_of(Method.PS).index_bytes_per_step)


def test_a_plan_that_splits_a_lookup_prices_the_ps_variable_with_its_own_exchange():
    """softmax_b on PS with softmax_w on AR: nothing to ride, so softmax_b issues its own three
    alltoalls and sends its own ids; the estimate is the one made without the shared lookup."""
    from dataclasses import replace

    prof = lm_profile()
    shared = replace(prof, variables=tuple(replace(v, lookup_shared_with="softmax_w") if v.name == "softmax_b" else v
                                           for v in prof.variables))
    cluster = ClusterSpec(machines=4, workers_per_machine=2)
    split = make_plan(prof, cluster, "hybrid").with_methods({"softmax_w": "ar"})
    apart, together = estimate(prof, split), estimate(shared, split)
    assert together.collective_calls_per_step == apart.collective_calls_per_step
    assert together.bytes_per_machine_per_step == pytest.approx(apart.bytes_per_machine_per_step)
    assert together.step_time_s == pytest.approx(apart.step_time_s)
    assert together.method_bytes_per_machine_per_step == pytest.approx(apart.method_bytes_per_machine_per_step)


def test_partition_counts_that_give_a_row_other_owners_price_a_lookup_apart():
    """The runtime serves softmax_w and softmax_b together only while every row id has the
    same owner in both (``row_owners``). On 4 ranks, 4 and 8 partitions give every id the
    owner ``id mod 4``: still one exchange. 4 and 6 do not (id 4: rank 0 against rank 0,
    id 6: rank 2 against rank 0), so softmax_b is priced with its own exchange, as without
    the shared lookup; so is a count the variable's rows cap (the runtime caps it too)."""
    from dataclasses import replace

    from parallax_nb.types import row_owners

    assert row_owners(4, 4) == row_owners(8, 4) == row_owners(12, 4) != row_owners(6, 4)
    assert row_owners(3, 2) != row_owners(5, 2) and row_owners(1, 2) != row_owners(3, 2)
    assert row_owners(1, 1) == row_owners(7, 1)   # one rank owns everything
    for a in range(1, 13):   # the key against the owners themselves, id by id
        for b in range(1, 13):
            same = all((i % a) % 4 == (i % b) % 4 for i in range(a * b))
            assert (row_owners(a, 4) == row_owners(b, 4)) is same, (a, b)
    prof = lm_profile()
    shared = replace(prof, variables=tuple(replace(v, lookup_shared_with="softmax_w") if v.name == "softmax_b" else v
                                           for v in prof.variables))
    cluster = ClusterSpec(machines=4, workers_per_machine=1)
    plan = make_plan(prof, cluster, "hybrid")
    assert plan.partitions("softmax_w") == plan.partitions("softmax_b") == 4
    together = estimate(shared, plan)
    # 8 partitions, and 400,002 capped at the 50,000 rows: 4 divides both, the owners are id mod 4
    for same_owners in ({"softmax_b": 8}, {"softmax_b": 400_002}):
        assert estimate(shared, plan.with_methods({}, partitions=same_owners)) == together
    for other_owners in ({"softmax_b": 6}, {"softmax_w": 2}):
        split = plan.with_methods({}, partitions=other_owners)
        alone, priced = estimate(prof, split), estimate(shared, split)
        calls = priced.collective_calls_per_step
        assert calls == alone.collective_calls_per_step == together.collective_calls_per_step + 3
        assert priced.bytes_per_machine_per_step == pytest.approx(alone.bytes_per_machine_per_step)
        assert priced.step_time_s == pytest.approx(alone.step_time_s)


def test_ar_sparse_variables_on_one_machine_share_one_gather():
    """With local aggregation on one machine the runtime sends every sparse AR variable of one
    row shape in one gather a step, however many there are: the estimate counts that call and
    its latency once, and each further variable adds its bytes only; a table of another row
    shape has a gather of its own. Across machines each variable keeps its own calls."""
    from parallax_nb.cost.timing import calls_by_scope
    from parallax_nb.types import Profile

    def profile(tables: int, extra=()) -> Profile:
        variables = tuple(sparse_var(f"table_{i}/embeddings", rows=10_000, width=16, alpha=0.01,
                                     unions=[100, 180, 250, 310]) for i in range(tables)) + (dense_var(),) + extra
        return Profile(model_name=f"tables_{tables}", batch_size=64, steps=20, step_time_s=0.001,
                       peak_memory_bytes=0, variables=variables)

    cluster = ClusterSpec(machines=1, workers_per_machine=4, local_aggregation=True)
    one, four = (estimate(profile(n), make_plan(profile(n), cluster, "ar")) for n in (1, 4))
    assert one.collective_calls_per_step == four.collective_calls_per_step == 2   # the gather, the fused allreduce
    assert one.latency_time_s == pytest.approx(four.latency_time_s)
    assert four.transfer_time_s > one.transfer_time_s
    charged = [c.cost_of(Method.AR) for c in variable_cost_list(profile(4), cluster)]
    assert calls_by_scope(charged, cluster.workers) == {"alltoall/machine": 1, "allreduce/all": 1}
    wide = profile(4, (sparse_var("wide/embeddings", rows=10_000, width=32, alpha=0.01, unions=[100, 180, 250, 310]),))
    assert estimate(wide, make_plan(wide, cluster, "ar")).collective_calls_per_step == 1 + 1 + 1
    # across machines (2 x 2) each variable issues its own two-level calls: 6 a variable
    two = ClusterSpec(machines=2, workers_per_machine=2, local_aggregation=True)
    assert estimate(profile(4), make_plan(profile(4), two, "ar")).collective_calls_per_step == 4 * 6 + 1


def variable_cost_list(profile, cluster):
    from parallax_nb.cost.pricing import variable_costs

    return variable_costs(profile, cluster)
