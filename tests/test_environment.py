"""A bad environment gets a clear message, not a traceback.

The decisions are pure functions of facts, so bad facts (an unsupported TensorFlow, Horovod
built without TensorFlow or MPI, no mpirun) are fed to them directly; the doctor itself runs
for real in a subprocess, once on this machine as set up and once with mpirun taken off PATH.
"""
import dataclasses
import os
import subprocess
import sys

import pytest

from parallax_nb import environment as env
from parallax_nb.errors import SetupError

GOOD = env.EnvironmentFacts(
    python_version="3.11.7", tensorflow_version="2.18.1", tensorflow_error=None,
    mpirun_path="/usr/bin/mpirun", mpirun_version="mpirun (Open MPI) 4.1.4",
    horovod_version="0.28.1", horovod_error=None, horovod_tensorflow_error=None, horovod_mpi_built=True,
    mpi4py_version="4.1.1", is_root=True, run_as_root_allowed=True,
)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _failed(facts):
    return {c.name: c for c in env.failures(env.evaluate(facts))}


def test_good_facts_pass():
    checks = env.evaluate(GOOD)
    assert all(c.ok for c in checks), checks
    assert env.setup_error(checks) is None


@pytest.mark.parametrize("version, ok", [
    ("2.17.1", True), ("2.18.1", True), ("2.18.0rc1", True),
    ("2.19.0", False), ("2.21.0", False), ("2.16.2", False), ("1.15.5", False), ("garbage", False),
])
def test_tensorflow_versions(version, ok):
    failed = _failed(dataclasses.replace(GOOD, tensorflow_version=version))
    assert ("tensorflow" not in failed) == ok
    if not ok:
        c = failed["tensorflow"]
        assert version in c.detail and "2.17.x, 2.18.x" in c.detail
        assert "tensorflow-cpu==2.18.1" in c.hint


def test_tensorflow_missing():
    c = _failed(dataclasses.replace(GOOD, tensorflow_version=None,
                                    tensorflow_error="No module named 'tensorflow'"))["tensorflow"]
    assert "No module named 'tensorflow'" in c.detail


def test_mpi_missing():
    failed = _failed(dataclasses.replace(GOOD, mpirun_path=None, mpirun_version=None))
    assert set(failed) == {"mpirun"}
    assert "mpirun not found" in failed["mpirun"].detail
    assert "apt-get install openmpi-bin libopenmpi-dev" in failed["mpirun"].hint
    assert "scripts/setup.sh" in failed["mpirun"].hint
    broken = _failed(dataclasses.replace(GOOD, mpirun_version=None))["mpirun"]
    assert "/usr/bin/mpirun does not run" in broken.detail


def test_horovod_missing():
    failed = _failed(dataclasses.replace(GOOD, horovod_version=None, horovod_error="No module named 'horovod'",
                                         horovod_mpi_built=None))
    assert {"horovod", "horovod+tensorflow", "horovod+mpi"} <= set(failed)
    assert "No module named 'horovod'" in failed["horovod"].detail


def test_horovod_without_tensorflow():
    error = "Extension horovod.tensorflow has not been built"
    failed = _failed(dataclasses.replace(GOOD, horovod_tensorflow_error=error, horovod_mpi_built=None))
    c = failed["horovod+tensorflow"]
    assert "built without TensorFlow" in c.detail and error in c.detail
    assert "HOROVOD_WITH_TENSORFLOW=1" in c.hint


def test_horovod_without_mpi():
    c = _failed(dataclasses.replace(GOOD, horovod_mpi_built=False))["horovod+mpi"]
    assert "built without MPI" in c.detail and "HOROVOD_WITH_MPI=1" in c.hint


def test_setup_error_names_every_problem():
    facts = dataclasses.replace(GOOD, tensorflow_version="2.19.0", mpirun_path=None, mpirun_version=None)
    error = env.setup_error(env.evaluate(facts))
    assert isinstance(error, SetupError)
    text = str(error)
    assert "TensorFlow 2.19.0 is not supported" in text and "mpirun not found" in text
    assert "apt-get install openmpi-bin" in text


def test_run_as_root_is_a_warning_not_a_failure():
    checks = env.evaluate(dataclasses.replace(GOOD, is_root=True, run_as_root_allowed=False))
    root = next(c for c in checks if c.name == "mpirun as root")
    assert not root.ok and not root.required and "OMPI_ALLOW_RUN_AS_ROOT=1" in root.hint
    assert env.setup_error(checks) is None
    assert "[warn] mpirun as root" in env.format_table(checks)


def _doctor(path_env):
    environ = dict(os.environ, PATH=path_env, TF_CPP_MIN_LOG_LEVEL="2",
                   PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "parallax_nb", "doctor"], capture_output=True, text=True,
                          env=environ, timeout=180, cwd=REPO)


def test_doctor_passes_on_this_machine():
    proc = _doctor(os.environ.get("PATH", ""))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("tensorflow", "mpirun", "horovod", "horovod+tensorflow", "horovod+mpi"):
        assert any(line.strip().startswith("[  ok] " + name) for line in proc.stdout.splitlines()), proc.stdout
    assert "all required checks passed" in proc.stdout


def test_doctor_without_mpirun_exits_nonzero_with_clear_message(tmp_path):
    proc = _doctor(str(tmp_path))  # an empty folder: no mpirun anywhere on PATH
    assert proc.returncode == 1
    assert "[FAIL] mpirun" in proc.stdout and "mpirun not found on PATH" in proc.stdout
    assert "apt-get install openmpi-bin libopenmpi-dev" in proc.stdout
    assert "1 problem(s): mpirun" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_require_distributed_passes_in_process():
    env.require_distributed()  # this machine is set up: no SetupError
