#!/usr/bin/env bash
# The main job on its embedded default: sets up what it needs (idempotent), then executes
# notebooks/quickstart.ipynb headless (profile -> plan -> run on 2 MPI engines -> report on
# the LM reference workload) and leaves the executed notebook and the cost report in
# ${1:-quickstart-output}/.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
px_bootstrap
exec python -m parallax_nb quickstart -o "${1:-quickstart-output}"
