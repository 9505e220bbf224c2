#!/usr/bin/env bash
# Set up the environment only (the quickstart and test scripts do this themselves).
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
px_bootstrap "$@"
