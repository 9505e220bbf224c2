#!/usr/bin/env bash
# Idempotent set-up of everything parallax_nb needs, sourced by scripts/quickstart.sh and
# scripts/test.sh. A second run on a set-up machine takes seconds: the virtual environment
# is kept while requirements.txt is unchanged, and the Horovod wheel (built from source,
# ~3.5 min on 2 cores) is cached outside the clone in $PX_CACHE.
#
#   PX_VENV    virtual environment            (default: <repo>/.venv)
#   PX_CACHE   wheel cache, outside the clone (default: ~/.cache/parallax_nb)
#   PX_PYTHON  interpreter for the venv       (default: python3.11, else python3)
#   PX_GPU     1: a GPU host. tensorflow[and-cuda] at requirements.txt's tensorflow-cpu version
#              instead of tensorflow-cpu, and Horovod built against it, with NCCL when nvcc is
#              on PATH (its own cached wheel). A venv keeps the mode it was made with.
#              resolve: only check that those requirements resolve here (pip install --dry-run;
#              pip downloads every wheel it resolves, 2.6 GB: 33-91 s measured). Default: the venv's mode.
set -euo pipefail

PX_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PX_VENV="${PX_VENV:-$PX_ROOT/.venv}"
PX_CACHE="${PX_CACHE:-$HOME/.cache/parallax_nb}"
HOROVOD_VERSION=0.28.1
MPI4PY_VERSION=4.1.1
TF_VERSION="$(sed -n 's/^tensorflow-cpu==//p' "$PX_ROOT/requirements.txt")"
PX_GPU="${PX_GPU:-}"

say() { printf '[parallax_nb setup] %s\n' "$*" >&2; }
die() { printf '[parallax_nb setup] ERROR: %s\n' "$*" >&2; exit 1; }

# pip, minus the warnings some machines' pip configuration prints for absent local indexes.
pip_run() {
  "$PX_VENV/bin/python" -m pip "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else die "need root to run: $* (install those Debian packages by hand, then re-run)"; fi
}

install_debian_packages() {
  local wanted=(openmpi-bin libopenmpi-dev cmake iproute2 "$@") missing=()
  local pkg
  if ! command -v dpkg >/dev/null 2>&1; then
    # Not Debian (e.g. a conda environment): the tools must already be on PATH.
    for pkg in mpirun mpicc cmake; do
      command -v "$pkg" >/dev/null 2>&1 || die "$pkg not found: install Open MPI 4.1 (with mpicc) and cmake, then re-run"
    done
    return 0
  fi
  for pkg in "${wanted[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 || die "missing system packages ${missing[*]} and no apt-get: install Open MPI 4.1 (with headers) and cmake, then re-run"
  say "installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

make_venv() {
  local python="${PX_PYTHON:-}"
  if [ -z "$python" ]; then
    python="$(command -v python3.11 || command -v python3 || true)"
  fi
  [ -n "$python" ] || die "no python3 found; parallax_nb needs Python 3.11"
  "$python" -c 'import sys; sys.exit(0 if sys.version_info[:2] in ((3, 10), (3, 11), (3, 12)) else 1)' \
    || die "$python is Python $("$python" -c 'import platform; print(platform.python_version())'); TensorFlow $TF_VERSION needs 3.10 to 3.12 (3.11 recommended). Set PX_PYTHON."
  if [ ! -x "$PX_VENV/bin/python" ]; then
    say "creating virtual environment $PX_VENV"
    "$python" -m venv "$PX_VENV"
    pip_run install -q --upgrade pip setuptools wheel
  fi
}

# requirements.txt for a GPU host: tensorflow[and-cuda] at the version of tensorflow-cpu.
gpu_requirements() {
  sed 's/^tensorflow-cpu==/tensorflow[and-cuda]==/' "$PX_ROOT/requirements.txt"
}

# PX_GPU unset: the venv's mode (the marker .parallax_gpu), else CPU. A venv never changes mode:
# tensorflow-cpu and tensorflow both provide the `tensorflow` module.
select_mode() {
  local marker="$PX_VENV/.parallax_gpu"
  if [ -z "$PX_GPU" ]; then
    PX_GPU=0; [ -f "$marker" ] && PX_GPU=1
  elif [ "$PX_GPU" = 1 ] && [ -x "$PX_VENV/bin/python" ] && [ ! -f "$marker" ]; then
    die "$PX_VENV was set up for CPU hosts (tensorflow-cpu); set up the GPU environment in another one: PX_GPU=1 PX_VENV=$PX_ROOT/.venv-gpu bash scripts/setup.sh"
  elif [ "$PX_GPU" = 0 ] && [ -f "$marker" ]; then
    die "$PX_VENV was set up for GPU hosts (PX_GPU=1); use another PX_VENV for the CPU set-up"
  elif [ "$PX_GPU" != 0 ] && [ "$PX_GPU" != 1 ]; then
    die "PX_GPU must be 0, 1 or resolve, got '$PX_GPU'"
  fi
  return 0
}

install_requirements() {
  local stamp="$PX_VENV/.parallax_requirements" want requirements="$PX_ROOT/requirements.txt"
  if [ "$PX_GPU" = 1 ]; then
    touch "$PX_VENV/.parallax_gpu"
    requirements="$PX_VENV/requirements-gpu.txt"
    gpu_requirements > "$requirements"
  fi
  want="$(sha256sum "$requirements" | cut -d' ' -f1)"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "installing pinned Python dependencies ($(basename "$requirements"))"
    pip_run install -q -r "$requirements"
    echo "$want" > "$stamp"
  fi
}

# PX_GPU=resolve: do the GPU requirements resolve from this machine's indexes? Installs nothing;
# resolves in a throwaway venv, so that the clone's own venv keeps its mode.
resolve_gpu_requirements() {
  local tmp t0=$SECONDS
  tmp="$(mktemp -d)"
  local PX_VENV="$tmp/venv"
  make_venv
  gpu_requirements > "$tmp/requirements-gpu.txt"
  say "resolving the GPU requirements: tensorflow[and-cuda]==$TF_VERSION (pip install --dry-run; pip downloads every wheel it resolves, ~2.6 GB)"
  if ! pip_run install --dry-run -r "$tmp/requirements-gpu.txt" | grep '^Would install'; then
    rm -rf "$tmp"
    die "the GPU requirements do not resolve (see pip's message above)"
  fi
  rm -rf "$tmp"
  say "the GPU requirements resolve ($((SECONDS - t0)) s)"
}

# Horovod's build settings (HOROVOD_ENV) and its cache key (HOROVOD_KEY). On a GPU host with the
# CUDA toolkit, GPU collectives use NCCL: the NCCL of the nvidia-nccl-cu12 wheel that
# tensorflow[and-cuda] installs, unless HOROVOD_NCCL_HOME names another one.
horovod_build_settings() {
  HOROVOD_KEY="tf$TF_VERSION-$(uname -m)"
  HOROVOD_ENV=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1
               HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1 MAKEFLAGS="-j$(nproc)")
  [ "$PX_GPU" = 1 ] || return 0
  local nvcc cuda nccl
  nvcc="$(command -v nvcc || true)"
  if [ -z "$nvcc" ]; then
    say "no nvcc on PATH: Horovod is built without NCCL (GPU tensors go through host memory and MPI); install the CUDA toolkit and re-run for NCCL"
    HOROVOD_KEY="$HOROVOD_KEY-gpu-nonccl"
    return 0
  fi
  cuda="$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')"
  HOROVOD_KEY="$HOROVOD_KEY-gpu-cuda$cuda-nccl"
  HOROVOD_ENV+=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED HOROVOD_CUDA_HOME="$(dirname "$(dirname "$nvcc")")")
  [ -n "${HOROVOD_NCCL_HOME:-}" ] && return 0
  nccl="$("$PX_VENV/bin/python" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)"
  [ -f "$nccl/include/nccl.h" ] || die "NCCL not found: tensorflow[and-cuda] should have installed nvidia-nccl-cu12; or set HOROVOD_NCCL_HOME to an NCCL installation"
  # CMake's find_library wants libnccl.so; the wheel ships libnccl.so.2 only.
  mkdir -p "$PX_CACHE/nccl-lib"
  ln -sf "$nccl/lib/libnccl.so.2" "$PX_CACHE/nccl-lib/libnccl.so"
  HOROVOD_ENV+=(HOROVOD_NCCL_INCLUDE="$nccl/include" HOROVOD_NCCL_LIB="$PX_CACHE/nccl-lib"
                LDFLAGS="-Wl,-rpath,$nccl/lib")
}

# Build $1==$2 from source into the cache once; later set-ups install the cached wheel.
# $4 is "isolated" to build in pip's isolated build environment, anything else to build
# against the venv (Horovod must see the installed TensorFlow); the rest is VAR=value env.
cached_source_wheel() {
  local name="$1" version="$2" key="$3" isolation="$4"; shift 4
  local isolation_flag=--no-build-isolation
  [ "$isolation" = isolated ] && isolation_flag=''

  local dir="$PX_CACHE/wheels/$name-$version-$key"
  if ! ls "$dir"/*.whl >/dev/null 2>&1; then
    say "building $name $version from source (cached in $dir)"
    mkdir -p "$dir.partial"
    env "$@" "$PX_VENV/bin/python" -m pip wheel -q --no-deps $isolation_flag --no-binary "$name" \
      --no-cache-dir -w "$dir.partial" "$name==$version" \
      || { rm -rf "$dir.partial"; die "building $name $version failed (see the compiler output above)"; }
    rm -rf "$dir" && mv "$dir.partial" "$dir"
  fi
  ls "$dir"/*.whl
}

install_horovod() {
  if "$PX_VENV/bin/python" -c "import horovod, sys; sys.exit(0 if horovod.__version__ == '$HOROVOD_VERSION' else 1)" 2>/dev/null \
     && [ -f "$PX_VENV/.parallax_horovod_ok" ]; then
    return 0
  fi
  local wheel
  horovod_build_settings
  wheel="$(cached_source_wheel horovod "$HOROVOD_VERSION" "$HOROVOD_KEY" venv "${HOROVOD_ENV[@]}")"
  pip_run install -q "$wheel"
  local report
  report="$("$PX_VENV/bin/horovodrun" --check-build 2>&1)" || die "horovodrun --check-build failed:
$report"
  if ! grep -q '\[X\] TensorFlow' <<<"$report" || ! grep -q '\[X\] MPI' <<<"$report"; then
    rm -rf "$PX_CACHE/wheels/horovod-$HOROVOD_VERSION-$HOROVOD_KEY"
    die "Horovod was built without TensorFlow or MPI support (cached wheel removed; re-run to rebuild):
$report"
  fi
  if [[ "$HOROVOD_KEY" == *-nccl ]] && ! grep -q '\[X\] NCCL' <<<"$report"; then
    rm -rf "$PX_CACHE/wheels/horovod-$HOROVOD_VERSION-$HOROVOD_KEY"
    die "Horovod was built without NCCL although nvcc is on PATH (cached wheel removed; re-run to rebuild):
$report"
  fi
  touch "$PX_VENV/.parallax_horovod_ok"
}

install_mpi4py() {
  "$PX_VENV/bin/python" -c "import mpi4py" 2>/dev/null && return 0
  local wheel
  wheel="$(cached_source_wheel mpi4py "$MPI4PY_VERSION" "$(uname -m)-py$("$PX_VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')" isolated)"
  pip_run install -q "$wheel"
}

install_package() {
  # Checked from / so that the clone's own folder on sys.path cannot fake an install.
  local installed
  installed="$(cd / && "$PX_VENV/bin/python" -c 'import os, parallax_nb; print(os.path.dirname(os.path.dirname(parallax_nb.__file__)))' 2>/dev/null || true)"
  [ "$installed" = "$PX_ROOT" ] && return 0
  say "installing parallax_nb (editable)"
  pip_run install -q --no-deps --no-build-isolation -e "$PX_ROOT"
}

# JupyterLab in this environment saves widget state with the notebook by default, so a notebook
# reopened after its kernel is gone shows parallax_nb's views instead of "model not found".
# An app-level override (the user's own Settings still win); other overrides are kept.
install_lab_settings() {
  local dir="$PX_VENV/share/jupyter/lab/settings"
  mkdir -p "$dir"
  "$PX_VENV/bin/python" - "$dir/overrides.json" <<'PY'
import json, os, sys
path = sys.argv[1]
try:
    with open(path) as f:
        settings = json.load(f)
except FileNotFoundError:
    settings = {}
plugin = settings.setdefault("@jupyter-widgets/jupyterlab-manager:plugin", {})
if plugin.get("saveState") is not True:
    plugin["saveState"] = True
    with open(path + ".partial", "w") as f:
        json.dump(settings, f, indent=2)
    os.replace(path + ".partial", path)
PY
}

px_bootstrap() {
  local t0=$SECONDS
  if [ "$PX_GPU" = resolve ]; then
    resolve_gpu_requirements
    return 0
  fi
  select_mode
  install_debian_packages "$@"
  make_venv
  install_requirements
  install_mpi4py
  install_horovod
  install_package
  install_lab_settings
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export PATH="$PX_VENV/bin:$PATH"
  export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
  say "environment ready in $((SECONDS - t0)) s ($PX_VENV)"
}
