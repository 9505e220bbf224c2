"""Real Keras models, unchanged, on real Horovod over Open MPI (2 and 3 ranks), against
single-device training with the global batch computed in this process (issue 21).

* Models built on their first call (a ``Sequential`` without ``keras.Input``, a subclassed
  word2vec, a subclassed LM with tied embeddings and a layer made in ``build()``) train
  under AR, PS and HYBRID to the single-device weights.
* ``global_clipnorm`` and ``clipnorm`` with the clip active (the clipped reference differs
  from the unclipped one) give the deduplicated single-device weights; weight decay
  excludes what ``exclude_from_weight_decay`` excludes on one device.
* Every rank's copy of every variable it holds whole is bit-identical to rank 0's.
* BatchNorm with statistics synchronised over ranks equals the global-batch run, moving
  statistics included; per-rank BatchNorm does not, and the run summary says "per rank".
* Adam: the distributed run equals the deduplicated (dense-equivalent) reference and differs
  from Keras' own per-entry treatment of repeated rows by a measured amount (printed).
* Optimizer options the runtime cannot carry across ranks are refused by name.
* A model Keras cannot serialise leaves loadable weights; the CLI exits 0 with a warning.

Cases are grouped into one mpirun launch per rank count (module-scoped fixtures).
Tolerances: SGD rtol 1e-5 / atol 1e-6; Adam(W) rtol 1e-4 / atol 1e-5 (see test_runtime.py).
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

import keras_model_cases as cases_module

pytestmark = pytest.mark.mpi

STEPS = 6
SGD_TOL = dict(rtol=1e-5, atol=1e-6)
ADAM_TOL = dict(rtol=1e-4, atol=1e-5)
ARCHITECTURES = ("ar", "ps", "hybrid")
LAZY_MODELS = ("lazy_sequential", "word2vec", "tied_lm")
CLIP = {"global_clipnorm": 0.05, "clipnorm": 0.02, "clipvalue": 0.005}
WEIGHT_DECAY = dict(learning_rate=0.02, weight_decay=0.5, exclude_from_weight_decay=["bias", "dense"])
REFUSED = {"gradient_accumulation_steps": 2, "use_ema": True, "loss_scale_factor": 128.0}


def _training_cases(ranks: int) -> list[dict]:
    cases = [dict(model=m, architecture=a, steps=STEPS) for m in LAZY_MODELS for a in ARCHITECTURES]
    if ranks == 2:
        cases += [dict(model="lazy_sequential", architecture=a, steps=STEPS,
                       options={"learning_rate": 0.5, option: value})
                  for option, value in CLIP.items() for a in ARCHITECTURES]
        cases += [dict(model="lazy_sequential", architecture="ps", steps=STEPS, optimizer="adamw",
                       options=WEIGHT_DECAY),
                  dict(model="lazy_sequential", architecture="hybrid", steps=STEPS, optimizer="adam"),
                  dict(model="batch_norm", architecture="ar", steps=STEPS),
                  dict(model="batch_norm", architecture="hybrid", steps=STEPS),
                  dict(model="batch_norm", architecture="hybrid", steps=STEPS, sync_batch_norm=False),
                  dict(model="raw_gather", architecture="ps", steps=STEPS)]
        cases += [dict(model="lazy_sequential", architecture="hybrid", steps=STEPS,
                       options={"learning_rate": 0.5, option: value}, refused=option)
                  for option, value in REFUSED.items()]
    else:
        cases += [dict(model="lazy_sequential", architecture="hybrid", steps=STEPS,
                       options={"learning_rate": 0.5, "global_clipnorm": CLIP["global_clipnorm"]}),
                  dict(model="batch_norm", architecture="ps", steps=STEPS)]
    return cases


def _launch(ranks: int):
    from parallax_nb.launch import run_on_ranks

    cases = _training_cases(ranks)
    start = time.perf_counter()
    per_rank = run_on_ranks(cases_module.run_cases, ranks, args=(cases,), timeout_s=900)
    print(f"\n{ranks}-rank launch of {len(cases)} cases: {time.perf_counter() - start:.1f} s")
    return cases, per_rank


@pytest.fixture(scope="module")
def two_ranks():
    return _launch(2)


@pytest.fixture(scope="module")
def three_ranks():
    return _launch(3)


_REFERENCES: dict = {}


def reference(case: dict, ranks: int, **changes) -> dict:
    """Single-device weights after STEPS steps with batch ranks * b (cached)."""
    from parallax_nb.runtime.reference import train_single_device

    case = dict(case, **changes)
    deduplicate = case.pop("deduplicate_sparse", True)
    key = (repr(sorted(case.items())), ranks, deduplicate)
    if key not in _REFERENCES:
        job = cases_module.make_job(case["model"], case.get("optimizer", "sgd"), case.get("options"))
        _REFERENCES[key], _ = train_single_device(job, STEPS, batch_size=ranks * job.batch_size,
                                                  deduplicate_sparse=deduplicate)
    return _REFERENCES[key]


def _max_diff(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(a[n] - b[n]))) for n in b if "seed_generator" not in n)


def _assert_equal_to_reference(case: dict, weights: dict, ref: dict) -> float:
    tol = SGD_TOL if case.get("optimizer", "sgd") == "sgd" else ADAM_TOL
    for name in ref:
        if "seed_generator" in name:
            continue
        np.testing.assert_allclose(weights[name], ref[name], **tol, err_msg=f"{case} variable {name}")
    return _max_diff(weights, ref)


def _assert_replicas_identical(case: dict, per_rank: list, i: int) -> int:
    """Every rank's whole copy of each variable equals rank 0's bit for bit (moving
    statistics too, unless BatchNorm is per rank). Returns the number of copies compared."""
    compared = 0
    trainable = per_rank[0][i]["variables"]
    for r in range(1, len(per_rank)):
        for name, value in per_rank[r][i]["replica"].items():
            if case.get("sync_batch_norm") is False and name not in trainable:
                continue
            np.testing.assert_array_equal(value, per_rank[0][i]["replica"][name], err_msg=f"{case} rank {r} {name}")
            compared += 1
    return compared


def _label(case: dict) -> str:
    extra = {k: v for k, v in (case.get("options") or {}).items() if k != "learning_rate"}
    return (f"{case['model']}-{case['architecture']}-{case.get('optimizer', 'sgd')}"
            f"{' ' + str(extra) if extra else ''}{' per-rank BN' if case.get('sync_batch_norm') is False else ''}")


def _trained(cases, per_rank, model=None, option=None):
    for i, case in enumerate(cases):
        if case.get("refused") or (model and case["model"] != model):
            continue
        if option is not None and option not in (case.get("options") or {}):
            continue
        yield i, case


@pytest.mark.parametrize("launch", ["two_ranks", "three_ranks"])
def test_models_built_on_first_call_train_to_single_device_weights(launch, request):
    cases, per_rank = request.getfixturevalue(launch)
    ranks, lines, checked = len(per_rank), [], set()
    for i, case in enumerate(cases):
        if case["model"] not in LAZY_MODELS or case.get("options") or case.get("optimizer"):
            continue
        ref = reference(case, ranks)
        worst = _assert_equal_to_reference(case, per_rank[0][i]["weights"], ref)
        copies = _assert_replicas_identical(case, per_rank, i)
        assert set(per_rank[0][i]["variables"]) == {n for n in ref if "seed_generator" not in n and
                                                    "moving" not in n}
        lines.append(f"{ranks} ranks {_label(case)}: max |diff| {worst:.2e}, {copies} replica copies identical")
        checked.add((case["model"], case["architecture"]))
    print("\n" + "\n".join(lines))
    assert checked == {(m, a) for m in LAZY_MODELS for a in ARCHITECTURES}


@pytest.mark.parametrize("launch", ["two_ranks", "three_ranks"])
def test_clipping_acts_on_whole_variables_across_shards(launch, request):
    cases, per_rank = request.getfixturevalue(launch)
    ranks, lines, checked = len(per_rank), [], set()
    for option in CLIP:
        for i, case in _trained(cases, per_rank, option=option):
            ref = reference(case, ranks)
            unclipped = reference(case, ranks, options={"learning_rate": 0.5})
            effect = _max_diff(ref, unclipped)
            assert effect > 1e-2, f"{option} is not active in {case}: clipped and unclipped differ by {effect:.2e}"
            worst = _assert_equal_to_reference(case, per_rank[0][i]["weights"], ref)
            copies = _assert_replicas_identical(case, per_rank, i)
            lines.append(f"{ranks} ranks {_label(case)}: clip moves weights {effect:.2e}; max |diff| {worst:.2e}; "
                         f"{copies} replica copies identical")
            checked.add((option, case["architecture"]))
    print("\n" + "\n".join(lines))
    assert checked == ({(o, a) for o in CLIP for a in ARCHITECTURES} if ranks == 2 else {("global_clipnorm", "hybrid")})


def test_weight_decay_exclusion_matches_the_users_variable_names(two_ranks):
    """``exclude_from_weight_decay(var_names=["bias", "dense"])``: on one device Keras matches the
    tensor names (``bias:0`` excluded, ``kernel:0`` decayed); the PS partitions' own names
    (``px_shard__imdb__dense__kernel__p0``) must not change that."""
    cases, per_rank = two_ranks
    i, case = next((i, c) for i, c in enumerate(cases) if c.get("optimizer") == "adamw")
    ref = reference(case, 2)
    everything_decayed = reference(case, 2, options=dict(WEIGHT_DECAY, exclude_from_weight_decay=None))
    assert _max_diff(ref, everything_decayed) > 1e-4  # the exclusion acts
    worst = _assert_equal_to_reference(case, per_rank[0][i]["weights"], ref)
    assert {v["method"] for v in per_rank[0][i]["variables"].values()} == {"ps"}
    print(f"\nAdamW under PS with exclusions: max |diff| {worst:.2e}")


def test_adam_is_dense_equivalent_not_keras_per_entry(two_ranks):
    """Both references: the run equals the deduplicated one (rows summed first) and differs
    from Keras' own per-entry Adam, which the runtime does not reproduce (README)."""
    cases, per_rank = two_ranks
    i, case = next((i, c) for i, c in enumerate(cases) if c.get("optimizer") == "adam")
    weights = per_rank[0][i]["weights"]
    worst = _assert_equal_to_reference(case, weights, reference(case, 2))
    keras_entries = reference(case, 2, deduplicate_sparse=False)
    gap = _max_diff({"e": weights["imdb/embedding/embeddings"]}, {"e": keras_entries["imdb/embedding/embeddings"]})
    assert gap > 1e-3
    print(f"\nAdam HYBRID: max |diff| to the dense-equivalent reference {worst:.2e}, "
          f"to Keras' per-entry reference {gap:.2e} (embedding)")


@pytest.mark.parametrize("launch", ["two_ranks", "three_ranks"])
def test_synchronised_batch_norm_equals_the_global_batch_run(launch, request):
    cases, per_rank = request.getfixturevalue(launch)
    ranks, lines = len(per_rank), []
    synced = [(i, c) for i, c in _trained(cases, per_rank, model="batch_norm") if c.get("sync_batch_norm", True)]
    assert synced
    for i, case in synced:
        ref = reference(case, ranks)
        assert any("moving_mean" in n for n in ref)
        worst = _assert_equal_to_reference(case, per_rank[0][i]["weights"], ref)
        copies = _assert_replicas_identical(case, per_rank, i)
        assert per_rank[0][i]["summary"]["batch_norm"] == {"layers": ["batch_normalization"],
                                                           "statistics": "global batch"}
        lines.append(f"{ranks} ranks {_label(case)}: max |diff| {worst:.2e} (moving statistics included), "
                     f"{copies} replica copies identical")
    print("\n" + "\n".join(lines))


def test_per_rank_batch_norm_differs_and_says_so(two_ranks):
    cases, per_rank = two_ranks
    i, case = next((i, c) for i, c in enumerate(cases) if c.get("sync_batch_norm") is False)
    assert per_rank[0][i]["summary"]["batch_norm"]["statistics"] == "per rank"
    gap = _max_diff(per_rank[0][i]["weights"], reference(case, 2))
    assert gap > 1e-4
    moving = [n for n in per_rank[0][i]["replica"] if "moving_mean" in n][0]
    assert not np.array_equal(per_rank[0][i]["replica"][moving], per_rank[1][i]["replica"][moving])
    print(f"\nper-rank BatchNorm: {gap:.2e} from the global-batch run; moving means differ between ranks")


def test_per_rank_batch_norm_is_said_in_the_run_view_and_the_report(two_ranks):
    """The per-rank run's own summary, as the notebook's Run and the report receive it."""
    from parallax_nb.cluster.handle import Run
    from parallax_nb.plan import make_plan
    from parallax_nb.profile import profile_job
    from parallax_nb.report.build import build_report_data
    from parallax_nb.types import ClusterSpec
    from parallax_nb.widgets.run_view import RunView

    cases, per_rank = two_ranks
    i, case = next((i, c) for i, c in enumerate(cases) if c.get("sync_batch_norm") is False)
    summary = per_rank[0][i]["summary"]
    run = Run(steps=STEPS, engines=2)
    run.finish(summary=summary)
    assert "BatchNorm statistics per rank" in RunView(run).status_text()
    job = cases_module.make_job("batch_norm", sync_batch_norm=False)
    profile = profile_job(job, steps=2, warmup=0)
    data = build_report_data(profile, make_plan(profile, ClusterSpec(machines=2), "hybrid"), run=summary)
    assert any("each rank's own batch" in line for line in data["assumptions"])


def test_a_table_read_outside_the_router_is_said_in_run_json_the_run_view_and_the_report(two_ranks):
    """The PS plan asks for the sparse table; the ranks serve it whole (a dense PS variable),
    train to the single-device weights, and say so in the executed plan of the run summary
    (run.json), the notebook's Run and the report, which predicts the dense PS bytes for it.
    The one-row bias planned with 2 partitions runs with 1, and says so too."""
    from parallax_nb.cluster.handle import Run
    from parallax_nb.plan import make_plan
    from parallax_nb.profile import profile_job
    from parallax_nb.report.build import build_report_data
    from parallax_nb.report.html import render_fragment
    from parallax_nb.runtime.executed import CAPPED, UNROUTED
    from parallax_nb.types import ClusterSpec
    from parallax_nb.widgets.run_view import RunView

    cases, per_rank = two_ranks
    i, case = next((i, c) for i, c in enumerate(cases) if c["model"] == "raw_gather")
    _assert_equal_to_reference(case, per_rank[0][i]["weights"], reference(case, 2))
    summary = per_rank[0][i]["summary"]
    table = "raw_gather/gathered/table"
    assert summary["executed_plan"]["changes"] == [
        {"variable": table, "what": "kind", "requested": "sparse", "executed": "dense", "reason": UNROUTED},
        {"variable": "raw_gather/dense/bias", "what": "partitions", "requested": 2, "executed": 1, "reason": CAPPED}]
    assert {v["name"]: v["kind"] for v in summary["executed_plan"]["variables"]}[table] == "dense"
    run = Run(steps=STEPS, engines=2)
    run.finish(summary=summary)
    assert f"plan changed: {table}: kind sparse -> dense" in RunView(run).status_text()
    job = cases_module.make_job("raw_gather")
    profile = profile_job(job, steps=2, warmup=0)
    data = build_report_data(profile, make_plan(profile, ClusterSpec(machines=2), "ps", partitions=2), run=summary)
    measured = {v["name"]: v for v in data["measured"]["variables"]}
    size = profile[table].size_bytes
    assert measured[table]["kind"] == "dense"
    assert measured[table]["predicted_bytes_per_step"] == pytest.approx(4 * size * (2 - 1) / 2)  # dense PS, N = 2
    assert UNROUTED in render_fragment(data)


def test_unsupported_optimizer_options_are_refused_by_name(two_ranks):
    cases, per_rank = two_ranks
    refused = [(i, c) for i, c in enumerate(cases) if c.get("refused")]
    assert len(refused) == len(REFUSED)
    for i, case in refused:
        for r in range(2):
            error = per_rank[r][i]["error"]
            assert error.startswith("JobError") and case["refused"] in error, error


def test_unserialisable_model_leaves_loadable_weights(tmp_path):
    """The CLI on a subclassed model without get_config: exit 0, a warning that says how to load
    the weights, model.weights.h5 equal to the last checkpoint, no partial file; ``Run.model``
    rebuilds the same subclassed model from the weights; the summary says predicted against
    measured step time."""
    import json
    import re
    import subprocess
    import sys

    from parallax_nb.cluster.handle import Run
    from parallax_nb.launch import rank_environment
    from parallax_nb.runtime.checkpoint import latest_checkpoint, load

    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "parallax_nb", "run", "keras_model_cases:w2v_job", "--arch", "ps",
                           "--np", "2", "--steps", "3", "--output", str(out)], capture_output=True, text=True,
                          timeout=600, env=rank_environment(), cwd=os.path.dirname(__file__))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "warning: Keras cannot save the whole model" in proc.stderr and "model.load_weights(" in proc.stderr
    # the summary's predicted against measured step time (--arch plans from a quick profile)
    assert re.search(r"parallax_nb run: step time: predicted [\d.]+ ms, measured [\d.]+ ms \(median of steps 2-3\), "
                     r"[+-][\d.]+ % \[estimate of what ran on 2 machine\(s\) x 1 rank\(s\)", proc.stderr), proc.stderr[-3000:]
    names = {p.name for p in out.iterdir()}
    assert {"model.weights.h5", "run.json", "history.csv", "checkpoints"} <= names and "model.keras" not in names
    assert not [n for n in names if n.startswith(".tmp")], names  # no partial file left
    assert json.loads((out / "run.json").read_text())["model_file"] == "model.weights.h5"
    ckpt = load(latest_checkpoint(str(out / "checkpoints")))
    job = cases_module.w2v_job()
    model = job.build_model()
    model.load_weights(out / "model.weights.h5")
    assert type(model).__name__ == "Word2Vec"
    for v in model.variables:
        np.testing.assert_array_equal(v.numpy(), ckpt.weight(v.path))
    run = Run(job=job, steps=3, engines=2)
    run.finish(summary={}, weights={name: np.asarray(ckpt.weight(name)) for name in ckpt.weight_names})
    assert type(run.model).__name__ == "Word2Vec"
    for v in run.model.variables:
        np.testing.assert_array_equal(v.numpy(), ckpt.weight(v.path))


def test_a_lazy_model_that_cannot_take_the_data_is_a_job_error():
    """Building on a zero example of the data fails in the user's terms (no mpirun needed)."""
    import keras

    from parallax_nb.errors import ConfigError, JobError

    def wants_two_inputs():
        class TwoTowers(keras.Model):
            def call(self, x):
                return x["left"] + x["right"]

        return TwoTowers(name="two_towers")

    job = cases_module.make_job("lazy_sequential").replace(model=wants_two_inputs)
    with pytest.raises(JobError, match="'two_towers' is built on its first call.*zero example"):
        job.build_model()
    with pytest.raises(ConfigError, match="sync_batch_norm must be True or False, got 'yes'"):
        job.replace(sync_batch_norm="yes")


def test_loss_scale_optimizer_is_refused_by_name():
    """Mixed-precision loss scaling wraps the optimizer; refused before any rank trains."""
    import keras

    from parallax_nb.errors import JobError
    from parallax_nb.runtime.optimizer import check_supported

    with pytest.raises(JobError, match="LossScaleOptimizer"):
        check_supported(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)))
    check_supported(keras.optimizers.SGD(0.1, global_clipnorm=1.0))  # clipping is carried across ranks
