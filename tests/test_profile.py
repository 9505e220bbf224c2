"""The profiler on the tiny LM, checked against numpy computed independently from the batches,
plus JSON round-trip, the command line, and the errors a user can cause."""
import json
import re
import os
import subprocess
import sys

import numpy as np
import pytest

from parallax_nb.errors import ConfigError, JobError, ProfileError
from parallax_nb.types import Kind, Profile
from parallax_nb.workloads import lm_job
from parallax_nb.workloads.lm import LMConfig, lm_corpus

STEPS, WARMUP = 12, 2
SPARSE_LM = {"embedding/embeddings", "softmax/softmax_w", "softmax/softmax_b"}


@pytest.fixture(scope="module")
def lm():
    from parallax_nb.profile import profile_job

    job = lm_job("tiny")
    return job, profile_job(job, steps=STEPS, warmup=WARMUP)


def _lm_batches(job, count):
    """Batches straight from the corpus array: batch s is examples s*b .. (s+1)*b - 1 (one shard)."""
    config = LMConfig(**{k: v for k, v in job.metadata.items() if k != "workload"})
    corpus = lm_corpus(config)
    b = job.batch_size
    return config, [(corpus[s * b:(s + 1) * b, :-1], corpus[s * b:(s + 1) * b, 1:]) for s in range(count)]


def _sampled_candidates(job, steps):
    """The softmax's candidates at each step, drawn by a fresh copy of the layer with its step counter set."""
    model = job.build_model()
    layer = model.get_layer("softmax")
    out = []
    for s in range(steps):
        layer.sample_step.assign(s)
        out.append(layer.sample_candidates().numpy())
    return out


def _union_means(sets, max_g):
    return [np.mean([np.unique(np.concatenate(sets[i:i + g])).size for i in range(len(sets) - g + 1)])
            for g in range(1, max_g + 1)]


def test_lm_kinds(lm):
    _, prof = lm
    assert {v.name for v in prof.variables if v.kind is Kind.SPARSE} == SPARSE_LM
    assert all(v.kind is Kind.DENSE for v in prof.variables if v.name not in SPARSE_LM)
    assert len(prof.variables) == 8
    for v in prof.variables:
        if not v.is_sparse:
            assert v.alpha_mean == v.alpha_max == 1.0
            assert v.grad_bytes_per_step == v.size_bytes
            assert v.union_rows_by_workers == (v.rows,) * 8


def test_lm_batches_match_the_dataset(lm):
    job, _ = lm
    _, batches = _lm_batches(job, 3)
    for (tokens, targets), (x, y) in zip(batches, job.dataset(0, 1).take(3)):
        np.testing.assert_array_equal(tokens, x["tokens"].numpy())
        np.testing.assert_array_equal(targets, y.numpy())


def test_embedding_alpha_and_union_match_numpy(lm):
    job, prof = lm
    config, batches = _lm_batches(job, WARMUP + STEPS)
    sets = [np.unique(tokens) for tokens, _ in batches[WARMUP:]]
    alphas = np.array([s.size for s in sets]) / config.vocab_size
    v = prof["embedding/embeddings"]
    assert v.shape == (config.vocab_size, config.embedding_dim)
    assert v.size_bytes == config.vocab_size * config.embedding_dim * 4
    assert v.alpha_mean == pytest.approx(alphas.mean(), rel=1e-12)
    assert v.alpha_p50 == pytest.approx(np.percentile(alphas, 50), rel=1e-12)
    assert v.alpha_p95 == pytest.approx(np.percentile(alphas, 95), rel=1e-12)
    assert v.alpha_max == pytest.approx(alphas.max(), rel=1e-12)
    assert v.rows_touched_mean == pytest.approx(np.mean([s.size for s in sets]))
    assert 0 < v.alpha_mean < 0.5
    lookups = job.batch_size * config.seq_len
    # the gradient's indices are the tokens as the data holds them: int32, 4 bytes each
    width = batches[0][0].dtype.itemsize
    assert v.index_bytes == width == 4
    assert v.grad_bytes_per_step == pytest.approx(lookups * (config.embedding_dim * 4 + width))
    assert v.union_rows_by_workers == pytest.approx(_union_means(sets, 8), rel=1e-12)
    assert v.union_rows_by_workers[7] > v.union_rows_by_workers[0]  # more workers, more rows


def test_softmax_alpha_and_union_match_targets_and_candidates(lm):
    job, prof = lm
    config, batches = _lm_batches(job, WARMUP + STEPS)
    candidates = _sampled_candidates(job, WARMUP + STEPS)
    sets = [np.unique(np.concatenate([targets.ravel(), candidates[s]]))
            for s, (_, targets) in enumerate(batches)][WARMUP:]
    alphas = np.array([s.size for s in sets]) / config.vocab_size
    # G workers of one step share its candidates: batches i..i+G-1's targets plus step i's candidates
    targets = [t.ravel() for _, t in batches[WARMUP:]]
    shared = [np.mean([np.unique(np.concatenate(targets[i:i + g] + [candidates[WARMUP + i]])).size
                       for i in range(STEPS - g + 1)]) for g in range(1, 9)]
    for name in ("softmax/softmax_w", "softmax/softmax_b"):
        v = prof[name]
        assert v.alpha_mean == pytest.approx(alphas.mean(), rel=1e-12), name
        assert v.alpha_p95 == pytest.approx(np.percentile(alphas, 95), rel=1e-12), name
        assert v.alpha_max == pytest.approx(alphas.max(), rel=1e-12), name
        assert v.union_rows_by_workers == pytest.approx(shared, rel=1e-12), name
    # counted once, the candidates leave fewer rows than G steps' candidates would
    assert prof["softmax/softmax_w"].union_rows_by_workers[7] < _union_means(sets, 8)[7]
    # the candidates really matter: targets alone give a smaller alpha
    targets_only = np.mean([np.unique(t).size for _, t in batches[WARMUP:]]) / config.vocab_size
    assert prof["softmax/softmax_w"].alpha_mean > targets_only


def test_step_time_memory_environment(lm):
    _, prof = lm
    assert prof.steps == STEPS and prof.batch_size == 8 and prof.model_name == "lm-tiny"
    assert 0 < prof.step_time_s < 5
    assert prof.peak_memory_bytes >= 0
    env = prof.environment
    assert env["tensorflow"].startswith("2.") and env["keras"].startswith("3.")
    assert "peak RSS growth" in env["memory_measure"] or "get_memory_info" in env["memory_measure"]
    assert env["device"]
    assert env["profiled_steps_wall_s"] >= prof.step_time_s * STEPS / 2  # the median is one of the steps
    assert env["profiled_batches"] == f"{WARMUP}..{WARMUP + STEPS - 1} of job.dataset(0, 1)"


def test_the_step_time_counts_taking_each_batch_from_the_data():
    """A training loop takes every step's batch from the job's data: the profile's step time
    counts it, as the calibration's compute does. Here each example takes 5 ms to make (40 ms a
    batch of 8), far longer than the tiny LM's step itself."""
    import time

    import tensorflow as tf

    base = lm_job("tiny")

    def wait(y):
        time.sleep(0.005)
        return y

    def slow(x, y):
        made = tf.py_function(wait, [y], y.dtype)
        made.set_shape(y.shape)
        return x, made

    prof = _profile(base.replace(data=lambda: base.examples(0, 1).map(slow)), steps=3, warmup=1)
    take = prof.environment["batch_take_s"]
    assert take >= 0.03, take
    assert prof.step_time_s > take, (prof.step_time_s, take)   # the step itself besides
    assert "take a batch" in prof.environment["step_time_measure"]


def test_json_round_trip(lm, tmp_path):
    _, prof = lm
    path = tmp_path / "profile.json"
    prof.to_json(str(path))
    again = Profile.from_json(str(path))
    assert again == prof
    data = json.loads(path.read_text())
    by_name = {v["name"]: v for v in data["variables"]}
    assert by_name["embedding/embeddings"]["kind"] == "sparse"
    assert by_name["lstm/lstm_cell/kernel"]["kind"] == "dense"
    assert "alpha_mean" in by_name["softmax/softmax_w"]


def test_lookups_made_together_are_recorded(lm, tmp_path):
    """The sampled softmax looks its weights and biases up at the same ids in one
    ``embedding_lookups`` call: the profile says so (the runtime serves them in one exchange).
    A profile written before the field loads without it; one naming a variable that is not
    another sparse variable of the profile is refused, naming both."""
    _, prof = lm
    assert {v.name: v.lookup_shared_with for v in prof.variables if v.lookup_shared_with} == {
        "softmax/softmax_b": "softmax/softmax_w"}
    data = json.loads(prof.to_json())
    for v in data["variables"]:
        del v["lookup_shared_with"]
    assert all(not v.lookup_shared_with for v in Profile.from_dict(data).variables)
    for bad in ("softmax/softmax_x", "lstm/lstm_cell/kernel", "softmax/softmax_b"):
        data = json.loads(prof.to_json())
        next(v for v in data["variables"] if v["name"] == "softmax/softmax_b")["lookup_shared_with"] = bad
        with pytest.raises(ProfileError, match=f"'softmax/softmax_b' is said to be looked up together with '{bad}'"):
            Profile.from_dict(data)


def test_fewer_steps_than_workers_measures_only_what_it_can():
    from parallax_nb.profile import profile_job

    prof = profile_job(lm_job("tiny"), steps=3, warmup=0)
    assert len(prof["embedding/embeddings"].union_rows_by_workers) == 3
    assert 0 < prof["embedding/embeddings"].alpha_for_workers(8) <= 1


def test_cli_profile_writes_json_and_prints_table(tmp_path):
    out = tmp_path / "profile.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "parallax_nb", "profile", "parallax_nb.workloads:lm_tiny",
                           "--steps", "4", "--warmup", "1", "--batch-size", "4", "-o", str(out)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "embedding/embeddings" in proc.stdout and "sparse" in proc.stdout
    prof = Profile.from_json(str(out))
    assert prof.steps == 4 and prof.batch_size == 4
    assert {v.name for v in prof.variables if v.is_sparse} == SPARSE_LM

    bad = subprocess.run([sys.executable, "-m", "parallax_nb", "profile", "parallax_nb.workloads:lm_tiny",
                          "--steps", "0", "-o", str(tmp_path / "never.json")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode != 0
    assert "--steps must be a whole number >= 1, got 0" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "never.json").exists()


@pytest.mark.parametrize("flag,value,least", [("--warmup", -1, 0), ("--batch-size", 0, 1), ("--max-workers", 0, 1)])
def test_cli_profile_names_a_count_out_of_range_by_its_flag(flag, value, least, tmp_path, capsys):
    from parallax_nb.__main__ import main

    assert main(["profile", "parallax_nb.workloads:lm_tiny", flag, str(value), "-o", str(tmp_path / "p.json")]) == 2
    assert f"{flag} must be a whole number >= {least}, got {value}" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


# ---- errors a user can cause --------------------------------------------------------------------

def _lm_data(tokens, targets=None, labels=None):
    import tensorflow as tf

    targets = tokens if targets is None else targets
    labels = targets if labels is None else labels
    return lambda: tf.data.Dataset.from_tensor_slices(({"tokens": tokens, "targets": targets}, labels))


def _ids(high=1003, shape=(32, 8), dtype=np.int32):
    return np.random.default_rng(0).integers(0, high, shape).astype(dtype)


def _profile(job, **kw):
    from parallax_nb.profile import profile_job

    return profile_job(job, **{"steps": 2, "warmup": 0, **kw})


def test_model_builder_returning_non_keras_object():
    with pytest.raises(JobError, match=r"keras\.Model.*str"):
        _profile(lm_job("tiny").replace(model=lambda: "a model"))


def test_model_without_trainable_variables():
    base = lm_job("tiny")

    def frozen():
        model = base.model()
        model.trainable = False
        return model

    with pytest.raises(ProfileError, match="no trainable variables"):
        _profile(base.replace(model=frozen))


def test_data_that_is_not_pairs():
    import tensorflow as tf

    job = lm_job("tiny").replace(data=lambda: tf.data.Dataset.from_tensor_slices({"tokens": _ids()}))
    with pytest.raises(ProfileError, match=r"\(x, y\) pairs.*tokens: int32\[8, 8\]"):
        _profile(job)


def test_data_missing_an_input():
    import tensorflow as tf

    job = lm_job("tiny").replace(data=lambda: tf.data.Dataset.from_tensor_slices(({"tokens": _ids()}, _ids())))
    with pytest.raises(ProfileError, match=r"no features for model inputs \['targets'\]"):
        _profile(job)


def test_data_with_the_wrong_shape():
    job = lm_job("tiny").replace(data=_lm_data(_ids(shape=(32, 5))))
    with pytest.raises(ProfileError) as err:
        _profile(job)
    text = str(err.value)
    assert "the model takes" in text and "int32[None, 8]" in text and "int32[4, 5]" not in text
    assert "[8, 5]" in text  # the batch the data gave: batch_size 8, sequence length 5
    assert "Traceback" not in text


def test_non_integer_ids():
    job = lm_job("tiny").replace(data=_lm_data(_ids(dtype=np.float32) + 0.5, _ids()))
    with pytest.raises(ProfileError, match=r"'tokens' takes integer ids.*float32"):
        _profile(job)


@pytest.mark.parametrize("where, bad, message", [
    ("tokens", 5000, r"id 5000 is out of range for 'embedding/embeddings'.*0\.\.1002 \(1003 rows\)"),
    ("targets", 1003, r"id 1003 is out of range for 'softmax/softmax_(w|b)'.*0\.\.1002 \(1003 rows\)"),
    ("tokens", -3, r"id -3 in input 'tokens' is out of range: ids must be >= 0"),  # Keras would wrap it
])
def test_ids_out_of_range(where, bad, message):
    tokens, targets = _ids(), _ids()
    (tokens if where == "tokens" else targets)[5, 3] = bad
    job = lm_job("tiny").replace(data=_lm_data(tokens, targets))
    with pytest.raises(ProfileError, match=message):
        _profile(job)


def test_bad_counts():
    job = lm_job("tiny")
    for kw, value in (("steps", 0), ("steps", 2.5), ("warmup", -1), ("max_workers", 0)):
        with pytest.raises(ProfileError, match=rf"{kw} must be a whole number.*{value}"):
            _profile(job, **{kw: value})
    with pytest.raises(ConfigError, match="batch_size must be positive, got 0"):
        job.replace(batch_size=0)
    with pytest.raises(JobError, match="needs a parallax_nb.Job"):
        _profile("lm")


def test_data_without_examples():
    job = lm_job("tiny").replace(data=_lm_data(_ids(shape=(0, 8))))
    with pytest.raises(ProfileError, match="yields no examples"):
        _profile(job)


# ---- user models written without parallax_nb in mind ---------------------------------------------

def _user_job(build, id_dtype=np.int32):
    import keras
    import tensorflow as tf

    from parallax_nb import Job

    ids = np.random.default_rng(1).integers(0, 50, (64, 4)).astype(id_dtype)
    labels = (ids[:, 0] % 2).astype(np.float32)[:, None]
    return Job(model=build, loss=lambda y, p: keras.losses.binary_crossentropy(y, p, from_logits=True),
               optimizer=lambda: keras.optimizers.SGD(0.1), batch_size=8,
               data=lambda: tf.data.Dataset.from_tensor_slices((ids, labels))), ids


def _sequential():
    import keras

    return keras.Sequential([keras.layers.Embedding(50, 4, name="emb"), keras.layers.GlobalAveragePooling1D(),
                             keras.layers.Dense(1, name="out")], name="seq")


def _tied():
    """The table is gathered *and* multiplied densely (tied weights): its gradient is a dense tensor."""
    import keras
    import tensorflow as tf

    from parallax_nb.ops import embedding_lookup

    class Tied(keras.Model):
        def build(self, input_shape):
            self.table = self.add_weight(name="table", shape=(50, 4))

        def call(self, x):
            h = tf.reduce_mean(embedding_lookup(self.table, x), 1)
            return tf.reduce_mean(tf.matmul(h, self.table, transpose_b=True), 1, keepdims=True)

    return Tied(name="tied")


def test_lazily_built_sequential_model():
    from parallax_nb.profile import profile_job

    job, ids = _user_job(_sequential)
    prof = profile_job(job, steps=4, warmup=1)
    assert [v.name for v in prof.variables if v.is_sparse] == ["seq/emb/embeddings"]
    expected = [np.unique(ids[s * 8:(s + 1) * 8]).size / 50 for s in range(1, 5)]
    assert prof["seq/emb/embeddings"].alpha_mean == pytest.approx(np.mean(expected), rel=1e-12)


@pytest.mark.parametrize("id_dtype, width", [(np.int32, 4), (np.int64, 8)])
def test_the_gradient_indices_width_follows_the_ids(id_dtype, width):
    """A Keras ``Embedding`` fed int32 ids makes a gradient with int32 indices, fed int64 ids
    int64 ones; plain Horovod allgathers them as they are, so the profile records the width,
    counts it in the gradient's bytes, and the baseline's index bytes follow it."""
    from parallax_nb.cost.methods import horovod_slices
    from parallax_nb.profile import profile_job

    def build():
        import keras

        tokens = keras.Input((4,), dtype=np.dtype(id_dtype).name)
        pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(50, 4, name="emb")(tokens))
        return keras.Model(tokens, keras.layers.Dense(1, name="out")(pooled), name="seq")

    job, ids = _user_job(build, id_dtype)
    prof = profile_job(job, steps=2, warmup=0)
    table = prof["emb/embeddings"]
    lookups = 8 * ids.shape[1]   # every id of a batch of 8 is one row of the gradient
    assert table.index_bytes == width
    assert table.grad_bytes_per_step == pytest.approx(lookups * (4 * 4 + width))
    values, index = horovod_slices(table)
    assert (values, index) == pytest.approx((lookups * 16, lookups * width))
    assert Profile.from_json(prof.to_json())["emb/embeddings"].index_bytes == width


def test_a_profile_without_the_index_width_reads_int64_and_a_bad_width_is_named(lm):
    """Profiles written before the width was recorded counted 8 bytes an index: they read 8.
    A width TensorFlow does not make is refused, naming the variable and the value."""
    _, prof = lm
    data = json.loads(prof.to_json())
    for v in data["variables"]:
        del v["index_bytes"]
    assert all(v.index_bytes == 8 for v in Profile.from_dict(data).variables)
    for bad in (3, "4", True, None):
        data = json.loads(prof.to_json())
        data["variables"][0]["index_bytes"] = bad
        with pytest.raises(ProfileError, match=r"variable 'embedding/embeddings': index_bytes must be 4 "
                                               r"\(int32 row ids\) or 8 \(int64 row ids\), got " + re.escape(repr(bad))):
            Profile.from_dict(data)


def test_tied_table_is_dense():
    from parallax_nb.profile import profile_job

    job, _ = _user_job(_tied)
    prof = profile_job(job, steps=2, warmup=0)
    assert prof["tied/table"].kind is Kind.DENSE and prof["tied/table"].alpha_mean == 1.0


def test_union_statistics_against_brute_force():
    """Windows of batches at one state: rows shared by a window's batches (one state's
    candidates) count once; the last, shorter windows only count for the G they reach."""
    from parallax_nb.profile.stats import union_rows_by_workers

    rng = np.random.default_rng(0)
    for _ in range(30):
        k, rows = int(rng.integers(1, 20)), int(rng.integers(1, 2000))
        batch_rows = [rng.integers(0, rows, int(rng.integers(0, 150))) for _ in range(k)]
        state_rows = [rng.integers(0, rows, 40) for _ in range(k)]
        windows = [[np.unique(np.concatenate([batch_rows[j], state_rows[i]])) for j in range(i, min(i + 8, k))]
                   for i in range(k)]
        expected = [np.mean([np.unique(np.concatenate(batch_rows[i:i + g] + [state_rows[i]])).size
                             for i in range(k - g + 1)]) for g in range(1, min(8, k) + 1)]
        assert union_rows_by_workers(windows, 8) == pytest.approx(expected, rel=1e-12)
        # the same rows taken at successive states count every state's rows
        consecutive = [np.unique(np.concatenate([batch_rows[i], state_rows[i]])) for i in range(k)]
        assert union_rows_by_workers([consecutive[i:i + 8] for i in range(k)], 8) == \
            pytest.approx(_union_means(consecutive, min(8, k)), rel=1e-12)


def test_window_passes_only_where_a_step_changes_state(lm):
    """The LM's step counter changes every step: its windows are read at one state (untimed
    passes); the recommender's steps change no non-trainable variable: no pass, its windows
    are its consecutive steps."""
    from parallax_nb.profile import profile_job
    from parallax_nb.workloads import recommender_job

    _, prof = lm
    assert prof.environment["window_rows_wall_s"] > 0
    rec = profile_job(recommender_job("tiny"), steps=4, warmup=1)
    assert rec.environment["window_rows_wall_s"] == 0
    sparse = [v for v in rec.variables if v.is_sparse]
    assert sparse and all(len(v.union_rows_by_workers) == 4 and v.union_rows_by_workers[3] >= v.union_rows_by_workers[0]
                          for v in sparse)


def test_a_large_profiles_text_lists_its_largest_variables_and_counts_the_rest():
    from test_cost import dense_var
    from parallax_nb.types import Profile, format_bytes

    prof = Profile("wide", 32, 20, 0.01, 0, tuple(dense_var(f"layer_{i:03d}", ((i * 37) % 100 + 1, 8))
                                                  for i in range(100)))
    text = prof.summary()
    largest = sorted(prof.variables, key=lambda v: -v.size_bytes)[:40]
    assert [line.split()[0] for line in text.splitlines()[2:42]] == [v.name for v in prof.variables if v in largest]
    rest = sum(v.size_bytes for v in prof.variables if v not in largest)
    assert text.splitlines()[-1].startswith(f"  ... and 60 more variables, {format_bytes(rest)} in all")
    assert len(prof.summary(limit=None).splitlines()) == 102
