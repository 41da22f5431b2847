#!/usr/bin/env bash
# A tested stack beside the pinned one, set up and then its tests run (tools/stack_tests.py).
# usage: bash tools/test_stack.sh oldest|newest [--venv DIR] [pytest args...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "$(command -v python3 || echo "${PYTHON:-python}")" tools/stack_tests.py "$@"
