#!/usr/bin/env bash
# Install the pinned harness CLIs (Claude Code, Codex) into the project's cache; print its path.
#
# They are optional extras of the `claude-code` and `codex` agents (uniagent/harness/claude_code.py,
# codex.py), which bind this directory read-only into each episode's sandbox. Both packages ship
# native binaries through npm optionalDependencies; only the npm registry is contacted (~658 MB,
# ~32 s the first time; npm's own cache, ~/.npm, makes a reinstall quick).
#
# Cache: ${UNIAGENT_NPM_CLIS:-<repo>/.cache/npm-clis} (ignored by git). `.pins` inside records what
# was installed: a second run with the same pins only checks that both binaries run.
#
# Usage: scripts/install-clis.sh   (needs node and npm; exits 3 without them)
set -euo pipefail

CLAUDE_CODE_VERSION=2.1.197
CODEX_VERSION=0.171.0
HERE="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${UNIAGENT_NPM_CLIS:-$HERE/.cache/npm-clis}"
PINS="@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION @openai/codex@$CODEX_VERSION"

if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
  echo "node and npm are needed for the harness CLIs (apt-get install nodejs npm)" >&2
  exit 3
fi

runs() {
  "$DEST/node_modules/.bin/claude" --version >/dev/null 2>&1 &&
    "$DEST/node_modules/.bin/codex" --version >/dev/null 2>&1
}

if [ -f "$DEST/.pins" ] && [ "$(cat "$DEST/.pins")" = "$PINS" ] && runs; then
  echo "$DEST"
  exit 0
fi

mkdir -p "$DEST"
rm -f "$DEST/.pins"
# --prefix keeps it out of any global npm tree; no audit/fund requests, no update notifier.
# shellcheck disable=SC2086
npm install --prefix "$DEST" --no-audit --no-fund --no-update-notifier --loglevel=error $PINS >&2
runs || { echo "the installed CLIs do not run (see $DEST)" >&2; exit 1; }
echo "$PINS" >"$DEST/.pins"
echo "$DEST"
