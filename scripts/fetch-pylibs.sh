#!/usr/bin/env bash
# Fetch the source distributions of small pure-Python libraries whose sdists ship their tests, for
# the tests of `uniagent tasks make` (real repositories, not toy fixtures); print the cache's path.
#
# Each sdist is pinned by version and sha256 (a changed upload is refused) and unpacked into
# <cache>/<name>-<version>/. `pip download` fetches them from PyPI (or the index pip is set up for).
#
# Cache: ${UNIAGENT_PYLIBS:-<repo>/.cache/pylibs} (ignored by git); `.pins` records what was fetched,
# so a second run with the same pins is a no-op. Exits 3 when PyPI cannot be reached.
#
# Usage: scripts/fetch-pylibs.sh
set -euo pipefail

# name version sha256 of <name>-<version>.tar.gz
PINNED="
inflection 0.5.1 1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417
isodate 0.7.2 4cd1aa0f43ca76f4a6c6c0292a85f40b35ec2e43e315b59f06e6d32171a953e6
toolz 1.0.0 2c86e3d9a04798ac556793bced838816296a2f085017664e4995cb40a1047a02
"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${UNIAGENT_PYLIBS:-$HERE/.cache/pylibs}"
STAMP="$(echo "$PINNED" | md5sum | cut -c1-12)"
PY="${PYTHON:-$HERE/.venv/bin/python}"
[ -x "$PY" ] || PY=python3

if [ -f "$DEST/.pins" ] && [ "$(cat "$DEST/.pins")" = "$STAMP" ]; then
  echo "$DEST"
  exit 0
fi
mkdir -p "$DEST"
rm -f "$DEST/.pins"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "$PINNED" | while read -r name version sha; do
  [ -n "$name" ] || continue
  if ! "$PY" -m pip download --disable-pip-version-check -q --no-deps --no-binary :all: \
      -d "$WORK" "$name==$version" >"$WORK/pip.log" 2>&1; then
    echo "cannot fetch $name==$version from PyPI: $(tail -1 "$WORK/pip.log")" >&2
    exit 3
  fi
  tgz="$WORK/$name-$version.tar.gz"
  got="$(sha256sum "$tgz" | cut -d' ' -f1)"
  if [ "$got" != "$sha" ]; then
    echo "$name-$version.tar.gz: sha256 $got, pinned $sha; refusing it" >&2
    exit 1
  fi
  rm -rf "$DEST/$name-$version"
  tar xzf "$tgz" -C "$DEST"
  rm -f "$tgz"
done
echo "$STAMP" >"$DEST/.pins"
echo "$DEST"
