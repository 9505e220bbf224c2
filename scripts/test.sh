#!/usr/bin/env bash
# The whole test suite: sets up what it needs (idempotent), then runs pytest.
#   bash scripts/test.sh                 # everything (what CI runs)
#   bash scripts/test.sh -k cost -x      # extra arguments go to pytest
#   bash scripts/test.sh tests/test_cost.py -x   # test paths given replace the default `tests`
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
px_bootstrap chromium
cd "$PX_ROOT"
# Test paths given on the command line replace the default `tests`; options alone keep it.
targets=(tests)
for arg in "$@"; do
  if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then targets=(); break; fi
done
# pytest exits non-zero on any failure and with 5 when no test ran: both fail the run.
exec python -m pytest "${targets[@]}" -q -ra -p no:cacheprovider --timeout=900 "$@"
