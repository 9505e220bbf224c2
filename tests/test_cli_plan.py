"""`python -m parallax_nb plan` end to end, in a subprocess, on a profile.json written by Profile.to_json."""
import json
import os
import subprocess
import sys

import pytest

from parallax_nb.plan import Plan
from parallax_nb.types import Method

from conftest import REPO
from test_cost import lm_profile


def run_cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "parallax_nb", "plan", *map(str, args)], cwd=cwd or REPO,
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def profile_json(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "profile.json"
    lm_profile().to_json(str(path))
    return path


def test_plan_command_prints_tables_and_writes_the_plan(profile_json, tmp_path):
    out = tmp_path / "sub" / "plan.json"
    result = run_cli(profile_json, "--machines", 8, "--workers-per-machine", 2, "--bandwidth", "10Gbit/s",
                     "--latency-us", 5, "--arch", "auto", "-o", out)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "Plan for lm_like (auto) on 8 machine(s) x 2 worker(s), 10Gbit/s, latency 5 us" in text
    for name in ("embedding", "softmax_w", "softmax_b", "lstm/kernel", "lstm/bias", "projection/kernel"):
        assert name in text
    for arch in ("ar", "ps", "hybrid", "auto", "sparse_as_dense", "this plan (auto)"):
        assert f"\n  {arch} " in text
    plan = Plan.from_json(str(out))
    assert plan.cluster.machines == 8 and plan.cluster.workers_per_machine == 2
    assert plan.cluster.latency_s == pytest.approx(5e-6)
    assert plan.method("embedding") is Method.PS and plan.method("lstm/kernel") is Method.AR
    assert plan.partitions("embedding") == 16
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".tmp-")]  # atomic write left nothing


def test_plan_command_options(profile_json, tmp_path):
    out = tmp_path / "plan.json"
    result = run_cli(profile_json, "--machines", 4, "--workers-per-machine", 2, "--no-local-aggregation",
                     "--arch", "ps", "--partitions", 3, "-o", out)
    assert result.returncode == 0, result.stderr
    d = json.loads(out.read_text())
    assert d["architecture"] == "ps" and d["local_aggregation"] is False
    assert {v["method"] for v in d["variables"]} == {"ps"} and {v["partitions"] for v in d["variables"]} == {3}


@pytest.mark.parametrize("args, message", [
    (["--machines", 0], "ClusterSpec.machines must be a whole number >= 1, got 0"),
    (["--machines", 2, "--bandwidth", "fast"], "unparsable bandwidth 'fast'"),
    (["--machines", 2, "--arch", "fastest"], "unknown architecture 'fastest'"),
    (["--machines", 2, "--partitions", 0], "must be >= 1, got 0"),
    (["--machines", 2, "--latency-us", -1], "--latency-us must be a finite number of microseconds >= 0, got -1"),
    (["--machines", 2, "--latency-us", "nan"], "--latency-us must be a finite number of microseconds >= 0, got nan"),
])
def test_bad_arguments_exit_2_with_one_clear_message(profile_json, args, message):
    result = run_cli(profile_json, *args)
    assert result.returncode == 2
    assert result.stderr.startswith("parallax_nb plan: error: ") and message in result.stderr
    assert "Traceback" not in result.stderr


def test_an_output_that_cannot_be_a_file_exits_2_and_leaves_nothing(profile_json, tmp_path):
    """``-o`` naming a folder, or a path under a file: one message naming the path, no
    traceback, no temporary file left beside it."""
    folder = tmp_path / "plans"
    folder.mkdir()
    result = run_cli(profile_json, "--machines", 2, "-o", folder)
    assert result.returncode == 2 and f"cannot write '{folder}': it is a folder" in result.stderr, result.stderr
    blocked = tmp_path / "plan.json"
    blocked.write_text("{}")
    result = run_cli(profile_json, "--machines", 2, "-o", blocked / "x.json")
    assert result.returncode == 2 and "a file is in the way of its folder" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not list(folder.iterdir()) and blocked.read_text() == "{}"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_missing_and_corrupted_profiles_exit_2(tmp_path, profile_json):
    result = run_cli(tmp_path / "missing.json", "--machines", 2)
    assert result.returncode == 2 and "profile file not found" in result.stderr
    corrupted = tmp_path / "corrupted.json"
    corrupted.write_text(profile_json.read_text()[:300])
    result = run_cli(corrupted, "--machines", 2)
    assert result.returncode == 2 and "is not valid JSON" in result.stderr and "Traceback" not in result.stderr
    wrong_shape = tmp_path / "wrong_shape.json"
    d = json.loads(profile_json.read_text())
    d["variables"] = [1]
    wrong_shape.write_text(json.dumps(d))
    result = run_cli(wrong_shape, "--machines", 2)
    assert result.returncode == 2 and "wrong_shape.json: profile 'variables' must be a list of objects, got [1]" \
        in result.stderr and "Traceback" not in result.stderr
    not_a_profile = tmp_path / "plan_not_profile.json"
    not_a_profile.write_text(json.dumps({"schema": "parallax_nb.plan"}))
    result = run_cli(not_a_profile, "--machines", 2)
    assert result.returncode == 2 and "not a parallax_nb profile" in result.stderr


def _sparse(d):
    return next(v for v in d["variables"] if v["kind"] == "sparse")


@pytest.mark.parametrize("change, words", [
    (lambda d: _sparse(d).update(alpha_mean=float("inf")), "alpha_mean must be between 0 and 1, got inf"),
    (lambda d: _sparse(d).update(alpha_p95=-0.5), "alpha_p95 must be between 0 and 1, got -0.5"),
    (lambda d: _sparse(d).update(union_rows_by_workers=[float("nan")] * 2),
     "union_rows_by_workers must be a list of numbers >= 0, got [nan, nan]"),
    (lambda d: _sparse(d).update(size_bytes=1e400), "size_bytes must be a finite number >= 0, got inf"),
    (lambda d: _sparse(d).update(grad_bytes_per_step=-1), "grad_bytes_per_step must be a finite number >= 0, got -1"),
    (lambda d: _sparse(d).update(shape=[-5, 16]), "shape must be a list of whole numbers >= 0, got [-5, 16]"),
    (lambda d: _sparse(d).update(kind="fuzzy"), "kind must be 'dense' or 'sparse', got 'fuzzy'"),
    (lambda d: d.update(step_time_s=float("nan")), "step_time_s must be a finite number of seconds >= 0, got nan"),
    (lambda d: d.update(batch_size=0), "batch_size must be a whole number >= 1, got 0"),
    (lambda d: d.update(batch_size="64"), "batch_size must be a whole number >= 1, got '64'"),
    (lambda d: d.update(variables=[]), "lists no variables"),
    (lambda d: d["variables"].append(dict(d["variables"][0])), "more than once"),
])
def test_a_profile_with_a_figure_out_of_range_is_refused_naming_the_file_variable_and_value(
        tmp_path, profile_json, change, words):
    """A profile file edited or corrupted into a NaN, an infinity, a negative count or a
    fraction above 1 was planned as if measured (an alpha of inf read as 1, NaN unions as every
    row). Each is refused on reading, the message naming the file, the variable and the value."""
    from parallax_nb.errors import ProfileError
    from parallax_nb.types import Profile

    d = json.loads(profile_json.read_text())
    change(d)
    bad = tmp_path / "edited.json"
    bad.write_text(json.dumps(d))
    with pytest.raises(ProfileError) as err:
        Profile.from_json(str(bad))
    assert str(err.value).startswith(f"{bad}: ") and words in str(err.value), str(err.value)
    assert "px.profile(job)" in err.value.hint


def test_the_plan_command_refuses_a_profile_with_an_infinite_alpha(tmp_path, profile_json):
    d = json.loads(profile_json.read_text())
    name = _sparse(d)["name"]
    _sparse(d)["alpha_mean"] = float("inf")
    bad = tmp_path / "edited.json"
    bad.write_text(json.dumps(d))
    out = tmp_path / "plan.json"
    result = run_cli(bad, "--machines", 2, "-o", out)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"edited.json: variable {name!r}: alpha_mean must be between 0 and 1, got inf" in result.stderr
    assert not out.exists()


def test_plan_command_lists_the_largest_forty_unless_all(tmp_path):
    from test_cost import dense_var
    from parallax_nb.types import Profile

    path = tmp_path / "wide.json"
    wide = Profile("wide", 32, 20, 0.01, 0, tuple(dense_var(f"layer_{i:03d}", (i + 1, 256)) for i in range(100)))
    wide.to_json(str(path))
    short = run_cli(path, "--machines", 4, "--workers-per-machine", 2, "-o", tmp_path / "a.json")
    every = run_cli(path, "--machines", 4, "--workers-per-machine", 2, "--all", "-o", tmp_path / "b.json")
    assert short.returncode == 0 and every.returncode == 0, short.stderr + every.stderr
    assert "  ... and 60 more variables" in short.stdout
    assert "layer_099" in short.stdout and "layer_000 " not in short.stdout
    assert "more variables" not in every.stdout and all(f"layer_{i:03d} " in every.stdout for i in range(100))
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()
