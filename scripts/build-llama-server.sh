#!/usr/bin/env bash
# Build llama.cpp's `llama-server` once and cache the binary; print its path.
#
# Source: the llama.cpp that the `llama-cpp-python` sdist (MIT) vendors under vendor/llama.cpp,
# fetched from PyPI with the venv's pip, so the build needs no git clone and no other registry.
# Only the server target is built (plus what it links: ggml, llama, common, mtmd), natively for
# this CPU, without the web UI download, OpenSSL or libcurl.
#
# Cache: ${UNIAGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/uniagent}/llama-server/<key>/llama-server
# where <key> = the pinned version + a hash of the cmake options, the compiler and this CPU's
# flags (GGML_NATIVE builds for the CPU it runs on). `current` beside the keys links to the last
# binary this script produced or found; `uniagent.models.remote.llama_server.find_binary()` reads
# it (UNIAGENT_LLAMA_SERVER=/path overrides both). A second run only checks that the file exists.
#
# Usage: scripts/build-llama-server.sh [--print-key]
#   PY=path/to/python  the Python whose pip downloads the sdist (default .venv/bin/python)
#   JOBS=N             parallel compile jobs (default: all cores)
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
ROOT="${UNIAGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/uniagent}/llama-server"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$HERE/.venv/bin/python}"
JOBS="${JOBS:-$(nproc)}"

# What the server does not need is off: tests, examples, the other tools' binaries, the unified
# app, the web UI (its prebuilt assets would be downloaded from Hugging Face at build time),
# OpenSSL (loopback HTTP only), libcurl (no model downloads), shared libraries (one relocatable
# binary). LLAMA_BUILD_TOOLS stays on: tools/ holds the server and mtmd, which the server links.
CMAKE_OPTIONS=(
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_NATIVE=ON
  -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_BUILD_COMMON=ON
  -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_ALL_WARNINGS=OFF
)

cpu_flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -m)"
compiler="$( (c++ --version 2>/dev/null || echo none) | head -1)"
key_hash="$(printf '%s\n' "${CMAKE_OPTIONS[*]}" "$compiler" "$cpu_flags" | sha256sum | cut -c1-12)"
KEY="${LLAMA_CPP_PYTHON_VERSION}-${key_hash}"
if [[ "${1:-}" == "--print-key" ]]; then
  echo "$KEY"
  exit 0
fi
DEST="$ROOT/$KEY"
BIN="$DEST/llama-server"

link_current() {
  ln -sfn "$KEY" "$ROOT/.current.$$" && mv -Tf "$ROOT/.current.$$" "$ROOT/current"
}

if [[ -x "$BIN" ]]; then
  [[ "$(readlink "$ROOT/current" 2>/dev/null)" == "$KEY" ]] || link_current
  echo "$BIN"
  exit 0
fi

for tool in cmake c++; do
  command -v "$tool" >/dev/null || {
    echo "build-llama-server: '$tool' is missing (apt-get install cmake g++)" >&2
    exit 1
  }
done
mkdir -p "$ROOT"
# One build at a time per cache (two `make test` started together wait for each other).
exec 9>"$ROOT/.lock"
flock 9
if [[ -x "$BIN" ]]; then
  link_current
  echo "$BIN"
  exit 0
fi

# The work folder survives a failed or interrupted build, so the next run resumes it (ninja only
# compiles what is missing); it is removed once the binary is installed.
WORK="$ROOT/.work-$KEY"
SRC="$WORK/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
start=$(date +%s)
if [[ ! -f "$WORK/.extracted" ]]; then
  rm -rf "$WORK"
  mkdir -p "$WORK"
  echo "build-llama-server: downloading the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist" >&2
  "$PY" -m pip --disable-pip-version-check -q download --no-deps --no-binary :all: \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$WORK" >&2
  tar -xzf "$WORK/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$WORK"
  rm -f "$WORK/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
  touch "$WORK/.extracted"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
ccache=(-DGGML_CCACHE=OFF)
command -v ccache >/dev/null && ccache=(-DGGML_CCACHE=ON)
echo "build-llama-server: building $KEY with $JOBS jobs (several minutes on 2 cores)" >&2
cmake -S "$SRC" -B "$WORK/build" "${generator[@]}" "${CMAKE_OPTIONS[@]}" "${ccache[@]}" \
  >"$WORK/cmake.log" 2>&1 || { tail -40 "$WORK/cmake.log" >&2; exit 1; }
cmake --build "$WORK/build" --target llama-server -j "$JOBS" >"$WORK/build.log" 2>&1 ||
  { tail -40 "$WORK/build.log" >&2; exit 1; }

"$WORK/build/bin/llama-server" --version >/dev/null 2>&1 || {
  echo "build-llama-server: the built binary does not run" >&2
  exit 1
}
mkdir -p "$DEST"
cp "$WORK/build/bin/llama-server" "$DEST/.llama-server.tmp"
cp "$SRC/LICENSE" "$DEST/LICENSE"
mv -f "$DEST/.llama-server.tmp" "$BIN"
link_current
rm -rf "$WORK"
echo "build-llama-server: built in $(($(date +%s) - start)) s" >&2
echo "$BIN"
