#!/usr/bin/env bash
# Build llama.cpp's `llama-server` for this CPU once, smoke-test it, cache it; print its path.
#
# The work is `uniagent.models.remote.llama_build` (its docstring has the whole rule): variants
# native -> native without AMX -> portable, the first that builds and generates tokens here wins;
# a cached binary is re-tested on a CPU it has not run on. `current` in the cache links to it.
#
# Usage: scripts/build-llama-server.sh [--print-key] [--variant NAME]
#   PY=path/to/python  the venv's Python (default .venv/bin/python)
#   JOBS=N             parallel compile jobs (default: all cores)
set -euo pipefail
HERE="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$HERE/.venv/bin/python}"
exec "$PY" -m uniagent.models.remote.llama_build "$@"
