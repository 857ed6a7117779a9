#!/usr/bin/env bash
# det-launch ui's browser tests: Debian's chromium, driven by Playwright (the pip package, in
# the dev extra). `playwright install` downloads browsers and cannot work offline, so the
# tests point Playwright at /usr/bin/chromium instead. Run by `install.sh --dev`; idempotent.
set -euo pipefail
if command -v chromium >/dev/null; then
  exit 0
fi
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "install_ui.sh: no chromium and no root apt-get; the browser tests will be skipped" >&2
fi
