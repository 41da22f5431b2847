#!/usr/bin/env bash
# Docs command: build the offline wheel set of the GPU machine into .whl/ (--help: the options).
# The logic is tools/build_gpu_wheels.py, run on the machine's python3 (standard library only).
set -euo pipefail
exec "$(command -v python3 || echo python)" "$(dirname "${BASH_SOURCE[0]}")/build_gpu_wheels.py" "$@"
