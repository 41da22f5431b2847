#!/usr/bin/env bash
# README command: create or refresh .venv with the pinned stack (--help: the other stacks).
# The logic is tools/setup_env.py, run on the machine's python3 (standard library only).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "$(command -v python3 || echo "${PYTHON:-python}")" tools/setup_env.py "$@"
