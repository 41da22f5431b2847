#!/usr/bin/env bash
# The oldest tested stack: tools/test_stack.sh oldest (kept for the commands that name this script).
# usage: bash tools/test_oldest.sh [--venv DIR] [pytest args...]
exec bash "$(dirname "${BASH_SOURCE[0]}")/test_stack.sh" oldest "$@"
