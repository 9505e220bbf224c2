"""Is this machine able to run parallax_nb's distributed training? Checks with clear answers.

Two halves, so that the decisions can be tested with bad values honestly:

- :func:`probe` gathers plain facts (version strings, import errors, flags, the path of
  ``mpirun``) into an :class:`EnvironmentFacts`; it never raises.
- :func:`evaluate` turns facts into :class:`Check` rows by pure functions of those facts.

:func:`check_environment` is both; :func:`require_distributed` raises :class:`SetupError`
naming every failed check and what to do. ``python -m parallax_nb doctor`` prints the table.

Supported: Python 3.10-3.12, TensorFlow 2.17.x or 2.18.x (Horovod 0.28.1, its last release,
does not build against 2.19+), Horovod built with TensorFlow and MPI, Open MPI's ``mpirun``,
and mpi4py (ipyparallel's MPI engines).

GPU hosts add three rows that never block a run (a GPU host whose TensorFlow cannot use its
GPUs still trains, on the CPU): the GPUs TensorFlow lists, the CUDA and cuDNN versions its
build was made with (``tf.sysconfig.get_build_info()``), and whether Horovod was built with
NCCL (``hvd.nccl_built()``); each says what to do when something is missing.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

from .errors import SetupError

SUPPORTED_TENSORFLOW = ((2, 17), (2, 18))
SUPPORTED_PYTHON = ((3, 10), (3, 11), (3, 12))
SETUP_HINT = "run `bash scripts/setup.sh` from the repository (it installs and verifies everything)"
MPI_HINT = ("install Open MPI: `apt-get install openmpi-bin libopenmpi-dev` (Debian/Ubuntu), "
            "or run `bash scripts/setup.sh`")
GPU_SETUP_HINT = ("set up a GPU environment: `PX_GPU=1 PX_VENV=.venv-gpu bash scripts/setup.sh` (installs "
                  "tensorflow[and-cuda] at the pinned version and builds Horovod against it, with NCCL when nvcc "
                  "is on PATH)")
NVIDIA_DRIVER_FILE = "/proc/driver/nvidia/version"
HOROVOD_BUILD_HINT = ("rebuild Horovod with TensorFlow and MPI after TensorFlow is installed: "
                      "HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 "
                      "pip install --no-build-isolation --no-cache-dir --force-reinstall horovod==0.28.1 "
                      "(or remove the cached wheel and run `bash scripts/setup.sh`)")


@dataclass(frozen=True)
class Check:
    """One line of the doctor's table. ``required``: distributed training cannot run without it."""

    name: str
    ok: bool
    detail: str
    hint: str = ""
    required: bool = True


@dataclass(frozen=True)
class EnvironmentFacts:
    """What :func:`probe` found. ``None`` means "not found"; ``*_error`` holds an import error's text."""

    python_version: str
    tensorflow_version: str | None
    tensorflow_error: str | None
    mpirun_path: str | None
    mpirun_version: str | None
    horovod_version: str | None
    horovod_error: str | None
    horovod_tensorflow_error: str | None
    horovod_mpi_built: bool | None
    mpi4py_version: str | None
    is_root: bool = False
    run_as_root_allowed: bool = True
    gpus: tuple[str, ...] = ()                  # as TensorFlow lists them, e.g. "GPU:0 NVIDIA H100 (compute 9.0)"
    nvidia_driver: str | None = None            # the loaded NVIDIA kernel driver's version; None: none loaded
    cuda_visible_devices: str | None = None     # the environment variable, None when unset
    tensorflow_cuda_build: bool | None = None   # tf.sysconfig.get_build_info()["is_cuda_build"]
    tensorflow_cuda_version: str | None = None
    tensorflow_cudnn_version: str | None = None
    horovod_nccl_code: int | None = None        # hvd.nccl_built(): NCCL_VERSION_CODE, 0 = built without NCCL
    nvcc_path: str | None = None                # the CUDA toolkit's compiler (Horovod's NCCL build needs it)


# ---- pure decisions -----------------------------------------------------------------------------

def _major_minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"\s*(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_python(version: str) -> Check:
    ok = _major_minor(version) in SUPPORTED_PYTHON
    return Check("python", ok, f"Python {version}",
                 "" if ok else f"use Python 3.10-3.12 (3.11 recommended): TensorFlow 2.18 has no wheels for {version}")


def check_tensorflow(version: str | None, error: str | None = None) -> Check:
    """TensorFlow must be 2.17.x or 2.18.x: Horovod 0.28.1 fails to build against 2.19 and later."""
    supported = ", ".join(f"{a}.{b}.x" for a, b in SUPPORTED_TENSORFLOW)
    if version is None:
        return Check("tensorflow", False, f"TensorFlow is not importable ({error or 'not installed'})",
                     f"pip install tensorflow-cpu==2.18.1, or {SETUP_HINT}")
    if _major_minor(version) not in SUPPORTED_TENSORFLOW:
        return Check("tensorflow", False,
                     f"TensorFlow {version} is not supported (supported: {supported}); Horovod 0.28.1 does not "
                     "build against TensorFlow 2.19 or later",
                     "pip install tensorflow-cpu==2.18.1, then rebuild Horovod against it "
                     f"({SETUP_HINT})")
    return Check("tensorflow", True, f"TensorFlow {version}")


def check_mpirun(path: str | None, version: str | None) -> Check:
    if path is None:
        return Check("mpirun", False, "mpirun not found on PATH: Open MPI is missing", MPI_HINT)
    if version is None:
        return Check("mpirun", False, f"{path} does not run (`mpirun --version` failed)", MPI_HINT)
    return Check("mpirun", True, f"{version} at {path}")


def check_horovod(version: str | None, error: str | None) -> Check:
    if version is None:
        return Check("horovod", False, f"Horovod is not importable ({error or 'not installed'})",
                     f"{SETUP_HINT}; by hand: {HOROVOD_BUILD_HINT}")
    ok = version == "0.28.1"
    return Check("horovod", ok, f"Horovod {version}",
                 "" if ok else f"parallax_nb is tested with Horovod 0.28.1; {HOROVOD_BUILD_HINT}")


def check_horovod_tensorflow(horovod_version: str | None, error: str | None) -> Check:
    """``import horovod.tensorflow`` fails when Horovod was built without TensorFlow (or against
    another TensorFlow: undefined symbols)."""
    if horovod_version is None:
        return Check("horovod+tensorflow", False, "Horovod is missing", HOROVOD_BUILD_HINT)
    if error is not None:
        return Check("horovod+tensorflow", False,
                     f"Horovod {horovod_version} was built without TensorFlow support, or against another "
                     f"TensorFlow (import horovod.tensorflow failed: {error})", HOROVOD_BUILD_HINT)
    return Check("horovod+tensorflow", True, "horovod.tensorflow imports")


def check_horovod_mpi(horovod_version: str | None, mpi_built: bool | None) -> Check:
    if horovod_version is None or mpi_built is None:
        return Check("horovod+mpi", False, "cannot tell whether Horovod has MPI (horovod.tensorflow unavailable)",
                     HOROVOD_BUILD_HINT)
    if not mpi_built:
        return Check("horovod+mpi", False, f"Horovod {horovod_version} was built without MPI (hvd.mpi_built() is "
                     "False)", f"install Open MPI first ({MPI_HINT}), then: {HOROVOD_BUILD_HINT}")
    return Check("horovod+mpi", True, "Horovod built with MPI")


def check_mpi4py(version: str | None) -> Check:
    if version is None:
        return Check("mpi4py", False, "mpi4py is not importable (ipyparallel's MPI engines need it)",
                     f"pip install mpi4py (needs libopenmpi-dev), or {SETUP_HINT}")
    return Check("mpi4py", True, f"mpi4py {version}")


def check_run_as_root(is_root: bool, allowed: bool) -> Check:
    """Open MPI refuses to start as root unless both OMPI_ALLOW_RUN_AS_ROOT variables are set.
    parallax_nb's launchers set them; a hand-typed ``mpirun`` needs them too."""
    if is_root and not allowed:
        return Check("mpirun as root", False, "running as root without OMPI_ALLOW_RUN_AS_ROOT=1 and "
                     "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "export OMPI_ALLOW_RUN_AS_ROOT=1 "
                     "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 before calling mpirun yourself", required=False)
    return Check("mpirun as root", True, "root with OMPI_ALLOW_RUN_AS_ROOT set" if is_root else "not root",
                 required=False)


def nccl_version(code: int) -> str:
    """NCCL's ``NCCL_VERSION_CODE`` as ``major.minor.patch``: ``X*10000 + Y*100 + Z`` since NCCL
    2.9, ``X*1000 + Y*100 + Z`` before."""
    major, rest = (code // 10000, code % 10000) if code >= 20900 else (code // 1000, code % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def check_gpus(gpus: tuple[str, ...], driver: str | None, cuda_build: bool | None, visible_env: str | None) -> Check:
    """The GPUs TensorFlow lists. No GPU and no NVIDIA driver is a CPU host (fine); a driver with a
    CPU build of TensorFlow, or a CUDA build that lists no GPU, trains on the CPU by mistake."""
    if gpus:
        return Check("gpus", True, f"{len(gpus)} GPU(s): {'; '.join(gpus)}", required=False)
    if cuda_build:
        where = f"NVIDIA driver {driver} is loaded" if driver else f"no NVIDIA driver is loaded ({NVIDIA_DRIVER_FILE} is missing)"
        return Check("gpus", False, f"TensorFlow is a CUDA build but lists no GPU; {where}; CUDA_VISIBLE_DEVICES="
                     f"{visible_env!r}", "install the NVIDIA driver (`nvidia-smi` must list the GPUs) and unset "
                     "CUDA_VISIBLE_DEVICES or name the GPUs in it; training runs on the CPU until then", required=False)
    if driver:
        return Check("gpus", False, f"NVIDIA driver {driver} is loaded but TensorFlow is the CPU build: training runs "
                     "on the CPU", GPU_SETUP_HINT, required=False)
    return Check("gpus", True, "no GPU: a CPU host (training runs on the CPU)", required=False)


def check_cuda(cuda_build: bool | None, cuda_version: str | None, cudnn_version: str | None) -> Check:
    """The CUDA and cuDNN versions TensorFlow was built with (its GPU kernels need a driver that
    supports that CUDA version)."""
    if cuda_build is None:
        return Check("cuda", False, "unknown: TensorFlow is not importable or its build information is not "
                     "readable", required=False)
    if not cuda_build:
        return Check("cuda", True, "TensorFlow is a CPU build (no CUDA)", required=False)
    return Check("cuda", True, f"TensorFlow built with CUDA {cuda_version or 'unknown'}, cuDNN "
                 f"{cudnn_version or 'unknown'}", required=False)


def check_horovod_nccl(nccl_code: int | None, gpus: tuple[str, ...], nvcc: str | None,
                       cuda_version: str | None) -> Check:
    """On a GPU host Horovod should reduce GPU tensors with NCCL; built without it, every collective
    copies them to host memory and goes through MPI."""
    if not gpus:
        built = "unknown" if nccl_code is None else (f"NCCL {nccl_version(nccl_code)}" if nccl_code else "no NCCL")
        return Check("horovod+nccl", True, f"not needed on a CPU host (Horovod: {built})", required=False)
    if nccl_code is None:
        return Check("horovod+nccl", False, "cannot tell whether Horovod has NCCL (horovod.tensorflow unavailable)",
                     GPU_SETUP_HINT, required=False)
    if nccl_code:
        return Check("horovod+nccl", True, f"Horovod built with NCCL {nccl_version(nccl_code)}", required=False)
    toolkit = (f"nvcc is at {nvcc}: re-run `PX_GPU=1 bash scripts/setup.sh`, which then builds Horovod with "
               "HOROVOD_GPU_OPERATIONS=NCCL" if nvcc else
               f"install the CUDA toolkit {cuda_version or 'that TensorFlow was built with'} so that nvcc is on "
               "PATH, then re-run `PX_GPU=1 bash scripts/setup.sh` (it builds Horovod with HOROVOD_GPU_OPERATIONS=NCCL)")
    return Check("horovod+nccl", False, "Horovod was built without NCCL: GPU tensors are copied to host memory "
                 "for every collective and go through MPI", toolkit, required=False)


def evaluate(facts: EnvironmentFacts) -> list[Check]:
    """The doctor's table for ``facts``; pure."""
    return [
        check_python(facts.python_version),
        check_tensorflow(facts.tensorflow_version, facts.tensorflow_error),
        check_mpirun(facts.mpirun_path, facts.mpirun_version),
        check_horovod(facts.horovod_version, facts.horovod_error),
        check_horovod_tensorflow(facts.horovod_version, facts.horovod_tensorflow_error),
        check_horovod_mpi(facts.horovod_version, facts.horovod_mpi_built),
        check_mpi4py(facts.mpi4py_version),
        check_run_as_root(facts.is_root, facts.run_as_root_allowed),
        check_gpus(facts.gpus, facts.nvidia_driver, facts.tensorflow_cuda_build, facts.cuda_visible_devices),
        check_cuda(facts.tensorflow_cuda_build, facts.tensorflow_cuda_version, facts.tensorflow_cudnn_version),
        check_horovod_nccl(facts.horovod_nccl_code, facts.gpus, facts.nvcc_path, facts.tensorflow_cuda_version),
    ]


def failures(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.required and not c.ok]


def setup_error(checks: list[Check]) -> SetupError | None:
    """One SetupError naming every failed required check, or None when all pass."""
    failed = failures(checks)
    if not failed:
        return None
    problems = "; ".join(f"{c.name}: {c.detail}" for c in failed)
    hints = " | ".join(dict.fromkeys(c.hint for c in failed if c.hint))
    return SetupError(f"this environment cannot run distributed training: {problems}", hint=hints or SETUP_HINT)


# ---- facts from this machine ----------------------------------------------------------------------

def _error_text(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]


def _mpirun_version(path: str) -> str | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    first = (out.stdout or out.stderr).strip().splitlines()
    return first[0].strip() if first else "mpirun"


def _nvidia_driver() -> str | None:
    """The loaded NVIDIA kernel module's version, from its ``/proc`` file (no ``nvidia-smi`` needed)."""
    try:
        with open(NVIDIA_DRIVER_FILE) as f:
            first = f.readline()
    except OSError:
        return None
    m = re.search(r"Kernel Module\s+(\S+)", first)
    return m.group(1) if m else first.strip() or "unknown version"


def _tensorflow_gpu_facts(tf) -> dict:
    """GPUs and CUDA build facts; listing physical devices does not start TensorFlow's runtime, so
    :mod:`parallax_nb.devices` can still choose a rank's GPU afterwards."""
    gpus = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        capability = details.get("compute_capability")
        gpus.append(" ".join(filter(None, [
            device.name.replace("/physical_device:", ""), details.get("device_name"),
            f"(compute {capability[0]}.{capability[1]})" if capability else None])))
    build = tf.sysconfig.get_build_info()
    cuda_build = bool(build.get("is_cuda_build"))
    return dict(gpus=tuple(gpus), tensorflow_cuda_build=cuda_build,
                tensorflow_cuda_version=str(build["cuda_version"]) if build.get("cuda_version") else None,
                tensorflow_cudnn_version=str(build["cudnn_version"]) if build.get("cudnn_version") else None)


def probe() -> EnvironmentFacts:
    """Look at this process's Python, TensorFlow, Horovod, mpi4py and ``mpirun``. Never raises."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tf_version = tf_error = None
    gpu_facts: dict = {}
    try:
        import tensorflow as tf

        tf_version = tf.__version__
    except Exception as e:  # a broken install must become a table row, not a traceback
        tf_error = _error_text(e)
    if tf_version is not None:
        try:
            gpu_facts = _tensorflow_gpu_facts(tf)
        except Exception:  # the GPU rows then say "unknown"
            gpu_facts = {}

    hvd_version = hvd_error = hvd_tf_error = None
    mpi_built = nccl_code = None
    try:
        import horovod

        hvd_version = horovod.__version__
    except Exception as e:
        hvd_error = _error_text(e)
    if hvd_version is not None:
        try:
            import horovod.tensorflow as hvd

            mpi_built = bool(hvd.mpi_built())
            nccl_code = int(hvd.nccl_built())
        except Exception as e:
            hvd_tf_error = _error_text(e)

    try:
        import mpi4py

        mpi4py_version = mpi4py.__version__
    except Exception:
        mpi4py_version = None

    mpirun = shutil.which("mpirun")
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    allowed = bool(os.environ.get("OMPI_ALLOW_RUN_AS_ROOT")) and bool(os.environ.get("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"))
    return EnvironmentFacts(
        python_version=".".join(map(str, sys.version_info[:3])),
        tensorflow_version=tf_version, tensorflow_error=tf_error,
        mpirun_path=mpirun, mpirun_version=_mpirun_version(mpirun) if mpirun else None,
        horovod_version=hvd_version, horovod_error=hvd_error, horovod_tensorflow_error=hvd_tf_error,
        horovod_mpi_built=mpi_built, mpi4py_version=mpi4py_version,
        is_root=is_root, run_as_root_allowed=allowed,
        nvidia_driver=_nvidia_driver(), cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        horovod_nccl_code=nccl_code, nvcc_path=shutil.which("nvcc"), **gpu_facts,
    )


def check_environment() -> list[Check]:
    """Every check for this machine, as a list of :class:`Check` rows."""
    return evaluate(probe())


def require_distributed() -> None:
    """Raise :class:`SetupError` (what is wrong, what to do) unless distributed training can run here."""
    error = setup_error(check_environment())
    if error is not None:
        raise error


def format_table(checks: list[Check]) -> str:
    """``status  name  detail`` lines, then the hints of what failed."""
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        status = "ok" if c.ok else ("FAIL" if c.required else "warn")
        lines.append(f"  [{status:>4}] {c.name:<{width}}  {c.detail}")
    hints = [c for c in checks if not c.ok and c.hint]
    if hints:
        lines.append("")
        lines.extend(f"  to fix {c.name}: {c.hint}" for c in hints)
    return "\n".join(lines)
