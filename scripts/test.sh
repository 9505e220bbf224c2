#!/usr/bin/env bash
# The whole test suite: sets up what it needs (idempotent), then runs pytest.
#   bash scripts/test.sh                 # everything (what CI runs)
#   bash scripts/test.sh -k cost -x      # extra arguments go to pytest
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
px_bootstrap chromium
cd "$PX_ROOT"
# pytest exits non-zero on any failure and with 5 when no test ran: both fail the run.
exec python -m pytest tests -q -ra -p no:cacheprovider --timeout=900 "$@"
