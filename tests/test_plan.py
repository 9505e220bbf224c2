"""Plan: architectures, partitions, lookups, overrides, JSON round-trip and every validation error."""
import json
import pickle

import pytest

from parallax_nb.errors import ConfigError, ParallaxError, PlanError
from parallax_nb.plan import PLAN_SCHEMA, Plan, VariablePlan, make_plan, plan_for_kinds
from parallax_nb.types import Architecture, ClusterSpec, Kind, Method

from test_cost import lm_profile

SPARSE = ("embedding", "softmax_w", "softmax_b")
DENSE = ("lstm/kernel", "lstm/bias", "projection/kernel")


@pytest.fixture(scope="module")
def profile():
    return lm_profile()


@pytest.fixture(scope="module")
def cluster():
    return ClusterSpec.create(machines=4, workers_per_machine=2, bandwidth="10Gbit/s")


@pytest.fixture(scope="module")
def plan(profile, cluster):
    return make_plan(profile, cluster, "auto", local_aggregation=True)


# ----------------------------------------------------------------------------- making plans


@pytest.mark.parametrize("architecture, sparse_method, dense_method", [
    ("ar", Method.AR, Method.AR), ("ps", Method.PS, Method.PS),
    ("hybrid", Method.PS, Method.AR)])
def test_architectures_choose_methods(profile, cluster, architecture, sparse_method, dense_method):
    plan = make_plan(profile, cluster, architecture)
    assert plan.architecture is Architecture.parse(architecture)
    assert all(plan.method(n) is sparse_method for n in SPARSE)
    assert all(plan.method(n) is dense_method for n in DENSE)
    assert set(plan.ps_variables) | set(plan.ar_variables) == set(profile.names)
    assert plan.names == tuple(profile.names)


def test_plan_records_the_cost_model_figures(plan, profile, cluster):
    from parallax_nb.cost import variable_cost

    for var in profile.variables:
        vp, cost = plan[var.name], variable_cost(var, cluster)
        assert vp.kind is var.kind and vp.size_bytes == var.size_bytes and vp.alpha == var.alpha_mean
        assert (vp.bytes_for("ps"), vp.bytes_for("ar"), vp.bytes_for("sparse_as_dense")) == \
            (cost.bytes_for("ps"), cost.bytes_for("ar"), cost.bytes_for("sparse_as_dense"))
        assert vp.bytes_per_step == cost.bytes_for(vp.method)
    assert plan.bytes_per_machine_per_step == pytest.approx(sum(v.bytes_per_step for v in plan))
    assert plan.cluster == cluster and plan.local_aggregation is True


def test_partitions_default_int_and_mapping(profile, cluster):
    plan = make_plan(profile, cluster, "hybrid")
    assert [plan.partitions(n) for n in SPARSE] == [cluster.workers] * 3  # one shard per worker
    assert [plan.partitions(n) for n in DENSE] == [1] * 3                 # AR is never split
    plan = make_plan(profile, cluster, "hybrid", partitions=3)
    assert [plan.partitions(n) for n in SPARSE + DENSE] == [3, 3, 3, 1, 1, 1]
    plan = make_plan(profile, cluster, "hybrid", partitions={"embedding": 5})
    assert (plan.partitions("embedding"), plan.partitions("softmax_w"), plan.partitions("lstm/bias")) == \
        (5, cluster.workers, 1)


@pytest.mark.parametrize("partitions, message", [
    (0, "partitions of 'every PS variable' must be >= 1, got 0"),
    ({"embedding": 0}, "partitions of 'embedding' must be >= 1, got 0"),
    ({"embedding": "many"}, "partitions of 'embedding' must be a whole number >= 1, got 'many'"),
    ({"nope": 2}, "partitions given for unknown variable(s) ['nope']"),
])
def test_bad_partitions_raise_plan_errors(profile, cluster, partitions, message):
    with pytest.raises(PlanError) as info:
        make_plan(profile, cluster, "auto", partitions=partitions)
    assert message in str(info.value)


def test_local_aggregation_argument_overrides_the_cluster(profile, cluster):
    plan = make_plan(profile, cluster, "auto", local_aggregation=False)
    assert plan.local_aggregation is False and plan.cluster.local_aggregation is False
    with_la = make_plan(profile, cluster, "auto", local_aggregation=True)
    assert plan["embedding"].bytes_for("ps") > with_la["embedding"].bytes_for("ps")


def test_make_plan_rejects_wrong_inputs(profile, cluster):
    with pytest.raises(ConfigError, match="unknown architecture 'fastest'"):
        make_plan(profile, cluster, "fastest")
    with pytest.raises(ConfigError, match="needs a parallax_nb Profile"):
        make_plan({"embedding": 1}, cluster)
    with pytest.raises(ConfigError, match="needs a ClusterSpec"):
        make_plan(profile, 8)


def test_plan_for_kinds_needs_no_profile():
    plan = plan_for_kinds({"emb": "sparse", "dense": Kind.DENSE}, "auto", model_name="m")
    assert plan.method("emb") is Method.PS and plan.method("dense") is Method.AR  # AUTO -> HYBRID's rule
    assert plan["emb"].bytes_for("ps") is None and plan.bytes_per_machine_per_step is None
    assert plan.cluster is None and plan.partitions("emb") == 1
    assert plan_for_kinds({"emb": "sparse"}, "ps", partitions={"emb": 4}).partitions("emb") == 4
    with pytest.raises(PlanError, match="variable 'emb': unknown kind 'spiky'"):
        plan_for_kinds({"emb": "spiky"}, "auto")
    with pytest.raises(PlanError, match="non-empty mapping"):
        plan_for_kinds({}, "auto")


# ----------------------------------------------------------------------------- lookups


def test_lookup_of_an_unknown_variable_names_it(plan):
    with pytest.raises(KeyError) as info:
        plan["embeding"]
    assert isinstance(info.value, PlanError)
    assert "no variable 'embeding' in the plan of 'lm_like'" in str(info.value)
    assert "did you mean ['embedding']" in str(info.value)
    with pytest.raises(PlanError, match="no variable 'x'"):
        plan.method("x")
    assert "embedding" in plan and "x" not in plan and len(plan) == 6


def test_validate_for_names_missing_and_unknown_variables(plan, profile):
    plan.validate_for(profile.names)
    plan.validate_for(reversed(profile.names))
    with pytest.raises(PlanError) as info:
        plan.validate_for(["embedding", "lstm/kernel", "other/var"])
    text = str(info.value)
    assert "no entry for model variable(s) ['other/var']" in text
    assert "entries for unknown variable(s) ['lstm/bias', 'projection/kernel', 'softmax_b', 'softmax_w']" in text
    assert "plan from another model" in text


# ----------------------------------------------------------------------------- overrides


def test_with_methods_overrides_and_records(plan, cluster):
    changed = plan.with_methods({"lstm/kernel": "ps", "embedding": Method.AR})
    assert changed.method("lstm/kernel") is Method.PS and changed.method("embedding") is Method.AR
    assert changed.partitions("lstm/kernel") == cluster.workers  # AR -> PS gets the default partitions
    assert changed.overrides == ("embedding", "lstm/kernel")  # in plan order
    assert plan.method("embedding") is Method.PS  # the original is unchanged (frozen)
    assert changed.with_methods({"lstm/kernel": "ps"}, partitions={"lstm/kernel": 2}).partitions("lstm/kernel") == 2
    assert "methods set by hand" in changed.summary()
    with pytest.raises(PlanError, match=r"unknown variable\(s\) \['nope'\]"):
        plan.with_methods({"nope": "ps"})
    with pytest.raises(PlanError, match="variable 'embedding': unknown method 'xyz'"):
        plan.with_methods({"embedding": "xyz"})


# ----------------------------------------------------------------------------- JSON


def test_json_round_trip_is_equal(plan, tmp_path):
    path = tmp_path / "plan.json"
    text = plan.to_json(str(path))
    assert path.read_text() == text
    loaded = Plan.from_json(str(path))
    assert loaded == plan and loaded.cluster == plan.cluster and loaded["embedding"] == plan["embedding"]
    assert Plan.from_json(text) == plan
    overridden = plan.with_methods({"lstm/bias": "ps"})
    assert Plan.from_dict(json.loads(overridden.to_json())) == overridden
    no_profile = plan_for_kinds({"a": "sparse", "b": "dense"}, "hybrid")
    assert Plan.from_json(no_profile.to_json()) == no_profile


def test_json_carries_what_the_issue_names(plan):
    d = json.loads(plan.to_json())
    assert d["schema"] == PLAN_SCHEMA and d["schema_version"] == 1 and d["architecture"] == "auto"
    emb = next(v for v in d["variables"] if v["name"] == "embedding")
    assert emb["kind"] == "sparse" and emb["method"] == "ps" and emb["alpha"] == 0.02
    assert emb["partitions"] == 8 and emb["ps_bytes_per_step"] > 0 and emb["ar_bytes_per_step"] > emb["ps_bytes_per_step"]
    assert d["cluster"]["machines"] == 4 and d["local_aggregation"] is True


def _corrupt(plan, mutate):
    d = json.loads(plan.to_json())
    mutate(d)
    return json.dumps(d)


def _set_var(field, value, name="embedding"):
    def mutate(d):
        next(v for v in d["variables"] if v["name"] == name)[field] = value
    return mutate


@pytest.mark.parametrize("mutate, message", [
    (_set_var("method", "xyz"), "variable 'embedding': unknown method 'xyz'"),
    (_set_var("partitions", 0), "partitions of 'embedding' must be >= 1, got 0"),
    (_set_var("partitions", 2.5), "partitions of 'embedding' must be a whole number >= 1, got 2.5"),
    (_set_var("kind", "spiky"), "variable 'embedding': unknown kind 'spiky'"),
    (_set_var("alpha", 1.5), "variable 'embedding': alpha must be between 0 and 1"),
    (_set_var("ps_bytes_per_step", -1), "variable 'embedding': ps_bytes_per_step must be a finite number >= 0"),
    (_set_var("colour", "red"), "plan variable 'embedding' has unknown field(s) ['colour']"),
    (lambda d: d["variables"][0].pop("method"), "plan variable #0 ('embedding') lacks field 'method'"),
    (lambda d: d["variables"].append(dict(d["variables"][0])), "variable 'embedding' appears twice"),
    (lambda d: d["variables"].append(7), "plan variable #6 must be an object, got int"),
    (lambda d: d.update(variables={"a": 1}), "plan 'variables' must be a list"),
    (lambda d: d.update(schema="parallax_nb.profile"), "not a parallax_nb plan"),
    (lambda d: d.update(schema_version=2), "plan schema_version 2 is not supported"),
    (lambda d: d.pop("model_name"), "plan lacks field 'model_name'"),
    (lambda d: d.update(architecture="fastest"), "unknown architecture 'fastest'"),
    (lambda d: d["cluster"].update(machines=0), "plan's cluster is invalid: ClusterSpec.machines must be"),
    (lambda d: d["cluster"].update(colour="red"), "plan's cluster is invalid: unknown cluster spec fields"),
    (lambda d: d.update(cluster=[1]), "plan's cluster must be an object or null"),
    (lambda d: d.update(overrides=["nope"]), "overrides name unknown variable(s) ['nope']"),
])
def test_loading_an_invalid_plan_names_the_problem(plan, mutate, message):
    with pytest.raises(PlanError) as info:
        Plan.from_json(_corrupt(plan, mutate))
    assert message in str(info.value)


def test_loading_corrupted_or_missing_files_raises_plan_errors(plan, tmp_path, profile):
    truncated = tmp_path / "truncated.json"
    truncated.write_text(plan.to_json()[:200])
    with pytest.raises(PlanError, match="is not valid JSON"):
        Plan.from_json(str(truncated))
    with pytest.raises(PlanError, match="plan file not found"):
        Plan.from_json(str(tmp_path / "missing.json"))
    with pytest.raises(PlanError, match="not a parallax_nb plan"):
        Plan.from_dict([1, 2])
    good = tmp_path / "plan.json"
    plan.to_json(str(good))
    assert Plan.from_json(str(good), variable_names=profile.names) == plan
    with pytest.raises(PlanError, match=r"(?s)unknown variable\(s\).*another model"):
        Plan.from_json(str(good), variable_names=["embedding"])


def test_variable_plan_validates_itself():
    with pytest.raises(PlanError, match="non-empty string"):
        VariablePlan(name="", kind="dense", method="ar")
    with pytest.raises(PlanError, match="partitions of 'w' must be >= 1, got -1"):
        VariablePlan(name="w", kind="dense", method="ps", partitions=-1)
    assert VariablePlan(name="w", kind="dense", method="PS").method is Method.PS
    assert issubclass(PlanError, ParallaxError)


# ----------------------------------------------------------------------------- views, pickling


def test_dataframe_and_summary(plan):
    df = plan.dataframe()
    assert list(df.index) == list(plan.names)
    assert {"kind", "method", "partitions", "alpha", "size_bytes", "ps_bytes_per_step", "ar_bytes_per_step",
            "sparse_as_dense_bytes_per_step", "bytes_per_step"} <= set(df.columns)
    assert df.loc["embedding", "method"] == "ps" and df.loc["lstm/kernel", "method"] == "ar"
    text = repr(plan)
    assert text.startswith("Plan for lm_like (auto) on 4 machine(s) x 2 worker(s)")
    assert "3 PS / 3 AR" in text and "softmax_w" in text and "<table" in plan._repr_html_()


def test_plan_pickles_for_the_engines(plan):
    loaded = pickle.loads(pickle.dumps(plan))
    assert loaded == plan and loaded.method("embedding") is Method.PS and hash(loaded) == hash(plan)


def test_estimates_follow_the_plans_local_aggregation_switch(plan, profile):
    from dataclasses import replace as dc_replace

    from parallax_nb.cost import estimate

    off = dc_replace(plan, local_aggregation=False)
    assert estimate(profile, off).cluster.local_aggregation is False
    assert estimate(profile, off).bytes_per_machine_per_step > estimate(profile, plan).bytes_per_machine_per_step


def test_a_large_plans_text_lists_the_variables_moving_the_most_bytes_and_counts_the_rest():
    """100 dense variables of 1 to 100 KiB: the text lists the 40 largest in plan order with
    their reasons, counts the other 60 and the bytes they move; ``limit=None`` lists all."""
    from test_cost import dense_var
    from parallax_nb.types import Profile, format_bytes

    variables = tuple(dense_var(f"layer_{i:03d}", (i % 100 + 1, 256)) for i in range(37, 137))
    prof = Profile("wide", 32, 20, 0.01, 0, variables)
    plan = make_plan(prof, ClusterSpec(machines=4, workers_per_machine=2))
    text = plan.summary()
    largest = sorted(plan.variables, key=lambda v: -v.bytes_per_step)[:40]
    rows = [line.split()[0] for line in text.splitlines()[2:42]]
    assert rows == [v.name for v in plan.variables if v in largest]
    rest = sum(v.bytes_per_step for v in plan.variables if v not in largest)
    assert f"  ... and 60 more variables, {format_bytes(rest)} per machine per step in all" in text
    why = text.split("Why (AUTO, estimated step time):\n")[1]
    reasons = [line.split(": ", 1)[0].strip() for line in why.splitlines()]
    assert reasons[0] == "local aggregation off" or reasons[0] == "local aggregation on"
    assert reasons[1:-1] == rows and "60 variables not listed" in reasons[-1]
    every = plan.summary(limit=None)
    assert all(f"  {v.name} " in every for v in plan.variables) and "more variables" not in every
    assert len(every.splitlines()) == 2 + 100 + 1 + len(plan.explanations)
    small = make_plan(lm_profile(), ClusterSpec(machines=4, workers_per_machine=2))
    assert small.summary() == small.summary(limit=None)
