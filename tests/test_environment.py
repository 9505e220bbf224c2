"""A bad environment gets a clear message, not a traceback.

The decisions are pure functions of facts, so bad facts (an unsupported TensorFlow, Horovod
built without TensorFlow or MPI, no mpirun) are fed to them directly; the doctor itself runs
for real in a subprocess, once on this machine as set up and once with mpirun taken off PATH.

GPU rows: this machine has no GPU, so the GPU host's report (GPUs, CUDA/cuDNN of the
TensorFlow build, Horovod's NCCL) is simulated: facts as a GPU host's probe would gather them,
fed to the same pure checks. The set-up's GPU mode (scripts/bootstrap.sh) is tested through its
bash functions; its CUDA toolkit is a stand-in ``nvcc`` script for the same reason.
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
    tensorflow_cuda_build=False, horovod_nccl_code=0,
)
SIMULATED_GPU_HOST = dataclasses.replace(
    GOOD, gpus=("GPU:0 NVIDIA H100 80GB HBM3 (compute 9.0)", "GPU:1 NVIDIA H100 80GB HBM3 (compute 9.0)"),
    nvidia_driver="550.54.15", tensorflow_cuda_build=True, tensorflow_cuda_version="12.5.1",
    tensorflow_cudnn_version="9", horovod_nccl_code=22105, nvcc_path="/usr/local/cuda/bin/nvcc")
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
    for name in ("tensorflow", "mpirun", "horovod", "horovod+tensorflow", "horovod+mpi", "gpus", "cuda",
                 "horovod+nccl"):
        assert any(line.strip().startswith("[  ok] " + name) for line in proc.stdout.splitlines()), proc.stdout
    assert "all required checks passed" in proc.stdout
    assert "no GPU: a CPU host" in proc.stdout and "TensorFlow is a CPU build (no CUDA)" in proc.stdout


def test_doctor_without_mpirun_exits_nonzero_with_clear_message(tmp_path):
    proc = _doctor(str(tmp_path))  # an empty folder: no mpirun anywhere on PATH
    assert proc.returncode == 1
    assert "[FAIL] mpirun" in proc.stdout and "mpirun not found on PATH" in proc.stdout
    assert "apt-get install openmpi-bin libopenmpi-dev" in proc.stdout
    assert "1 problem(s): mpirun" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_require_distributed_passes_in_process():
    env.require_distributed()  # this machine is set up: no SetupError


def _gpu_rows(facts) -> dict:
    return {c.name: c for c in env.evaluate(facts) if c.name in ("gpus", "cuda", "horovod+nccl")}


def test_cpu_host_report():
    rows = _gpu_rows(GOOD)
    assert all(c.ok and not c.required for c in rows.values()), rows
    assert rows["gpus"].detail == "no GPU: a CPU host (training runs on the CPU)"
    assert rows["cuda"].detail == "TensorFlow is a CPU build (no CUDA)"
    assert rows["horovod+nccl"].detail == "not needed on a CPU host (Horovod: no NCCL)"


def test_simulated_gpu_host_report():
    """Simulated: the facts a probe of a 2 x H100 host with tensorflow[and-cuda] would gather."""
    rows = _gpu_rows(SIMULATED_GPU_HOST)
    assert all(c.ok for c in rows.values()), rows
    assert rows["gpus"].detail == ("2 GPU(s): GPU:0 NVIDIA H100 80GB HBM3 (compute 9.0); "
                                   "GPU:1 NVIDIA H100 80GB HBM3 (compute 9.0)")
    assert rows["cuda"].detail == "TensorFlow built with CUDA 12.5.1, cuDNN 9"
    assert rows["horovod+nccl"].detail == "Horovod built with NCCL 2.21.5"
    table = env.format_table(env.evaluate(SIMULATED_GPU_HOST))
    assert "[  ok] gpus" in table and "to fix" not in table


def test_simulated_gpu_host_with_cpu_tensorflow():
    facts = dataclasses.replace(GOOD, nvidia_driver="550.54.15")
    gpus = _gpu_rows(facts)["gpus"]
    assert not gpus.ok and not gpus.required
    assert "NVIDIA driver 550.54.15 is loaded but TensorFlow is the CPU build" in gpus.detail
    assert "PX_GPU=1" in gpus.hint and "scripts/setup.sh" in gpus.hint
    assert env.setup_error(env.evaluate(facts)) is None  # it still trains, on the CPU
    assert "[warn] gpus" in env.format_table(env.evaluate(facts))


def test_simulated_cuda_build_without_a_visible_gpu():
    facts = dataclasses.replace(SIMULATED_GPU_HOST, gpus=(), nvidia_driver=None, cuda_visible_devices="")
    gpus = _gpu_rows(facts)["gpus"]
    assert not gpus.ok
    assert "CUDA build but lists no GPU" in gpus.detail and "no NVIDIA driver is loaded" in gpus.detail
    assert "CUDA_VISIBLE_DEVICES=''" in gpus.detail and "nvidia-smi" in gpus.hint


@pytest.mark.parametrize("nvcc, fragment", [
    ("/usr/local/cuda/bin/nvcc", "nvcc is at /usr/local/cuda/bin/nvcc: re-run `PX_GPU=1 bash scripts/setup.sh`"),
    (None, "install the CUDA toolkit 12.5.1 so that nvcc is on PATH"),
])
def test_simulated_gpu_host_with_horovod_without_nccl(nvcc, fragment):
    row = _gpu_rows(dataclasses.replace(SIMULATED_GPU_HOST, horovod_nccl_code=0, nvcc_path=nvcc))["horovod+nccl"]
    assert not row.ok and not row.required and "built without NCCL" in row.detail
    assert fragment in row.hint and "HOROVOD_GPU_OPERATIONS=NCCL" in row.hint


@pytest.mark.parametrize("code, version", [(22105, "2.21.5"), (21805, "2.18.5"), (2708, "2.7.8"), (2804, "2.8.4")])
def test_nccl_version_codes(code, version):
    assert env.nccl_version(code) == version


def _bootstrap(script: str, venv, **environ) -> subprocess.CompletedProcess:
    """Run ``script`` after sourcing scripts/bootstrap.sh (its functions only; nothing is installed)."""
    full = dict(os.environ, PX_VENV=str(venv), PX_CACHE=str(venv / "cache"), **environ)
    return subprocess.run(["bash", "-c", f'source scripts/bootstrap.sh; {script}'], capture_output=True, text=True,
                          env=full, cwd=REPO, timeout=60)


def test_gpu_requirements_differ_only_in_tensorflow(tmp_path):
    proc = _bootstrap("gpu_requirements", tmp_path)
    cpu = open(os.path.join(REPO, "requirements.txt")).read().splitlines()
    gpu = proc.stdout.splitlines()
    pinned = [line for line in cpu if line.startswith("tensorflow-cpu==")]
    assert len(pinned) == 1 and len(gpu) == len(cpu)
    version = pinned[0].split("==")[1]
    assert [g for g, c in zip(gpu, cpu) if g != c] == [f"tensorflow[and-cuda]=={version}"]


def test_a_venv_keeps_its_mode(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")
    (venv / "bin" / "python").chmod(0o755)
    cpu_to_gpu = _bootstrap("select_mode", venv, PX_GPU="1")
    assert cpu_to_gpu.returncode == 1 and "was set up for CPU hosts" in cpu_to_gpu.stderr
    assert "PX_VENV=" in cpu_to_gpu.stderr and ".venv-gpu" in cpu_to_gpu.stderr
    assert _bootstrap('select_mode; echo "mode=$PX_GPU"', venv).stdout.strip() == "mode=0"
    (venv / ".parallax_gpu").touch()
    assert _bootstrap('select_mode; echo "mode=$PX_GPU"', venv).stdout.strip() == "mode=1"
    gpu_to_cpu = _bootstrap("select_mode", venv, PX_GPU="0")
    assert gpu_to_cpu.returncode == 1 and "was set up for GPU hosts" in gpu_to_cpu.stderr
    assert "PX_GPU must be 0, 1 or resolve, got 'yes'" in _bootstrap("select_mode", venv, PX_GPU="yes").stderr


def test_horovod_build_settings_per_mode(tmp_path):
    """The CUDA toolkit here is a stand-in ``nvcc`` printing its release line (no CUDA on this machine)."""
    show = 'horovod_build_settings; echo "$HOROVOD_KEY"; printf "%s\\n" "${HOROVOD_ENV[@]}"'
    cpu = _bootstrap(show, tmp_path, PX_GPU="0").stdout.splitlines()
    assert cpu[0].startswith("tf2.") and cpu[0].endswith(os.uname().machine)  # the CPU key, as before
    assert "HOROVOD_WITH_TENSORFLOW=1" in cpu and not any("NCCL" in line for line in cpu)

    no_toolkit = _bootstrap(show, tmp_path, PX_GPU="1", PATH="/usr/bin:/bin")
    assert no_toolkit.stdout.splitlines()[0] == cpu[0] + "-gpu-nonccl"
    assert "no nvcc on PATH: Horovod is built without NCCL" in no_toolkit.stderr

    cuda = tmp_path / "cuda" / "bin"
    cuda.mkdir(parents=True)
    (cuda / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.5, V12.5.82'\n")
    (cuda / "nvcc").chmod(0o755)
    gpu = _bootstrap(show, tmp_path, PX_GPU="1", PATH=f"{cuda}:/usr/bin:/bin", HOROVOD_NCCL_HOME="/opt/nccl")
    lines = gpu.stdout.splitlines()
    assert lines[0] == cpu[0] + "-gpu-cuda12.5-nccl"
    assert {"HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_NCCL_LINK=SHARED",
            f"HOROVOD_CUDA_HOME={tmp_path / 'cuda'}"} <= set(lines)
    missing = _bootstrap(show, tmp_path, PX_GPU="1", PATH=f"{cuda}:/usr/bin:/bin")
    assert missing.returncode == 1 and "NCCL not found" in missing.stderr and "HOROVOD_NCCL_HOME" in missing.stderr
