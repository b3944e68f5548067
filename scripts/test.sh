#!/usr/bin/env bash
# Install (if needed) and run the test suite. Extra arguments go to pytest after our own:
# two pytest-xdist workers running whole files, longest first (tests/conftest.py says how);
# `-n 0` runs serially, e.g. for one test.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The playground's browser tests drive Debian's chromium (Playwright's own browser
# download is not used). Installed once, when missing and we may, beside the Python install;
# without it they skip.
chromium_install=""
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[omnistage] installing chromium for the playground's browser tests"
    ( apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null ) \
      >/dev/null 2>&1 &
    chromium_install=$!
  else
    echo "[omnistage] no chromium (and no root apt-get to install it): the browser tests will skip" >&2
  fi
fi
bash "$ROOT/scripts/setup_env.sh"
if [ -n "$chromium_install" ] && ! wait "$chromium_install"; then
  echo "[omnistage] could not install chromium: the browser tests will skip" >&2
fi
cd "$ROOT"
set +e
"$ROOT/.venv/bin/python" -m pytest -n 2 --dist loadfile "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "[omnistage] pytest collected no tests: treating as a failure" >&2
  exit 1
fi
exit "$rc"
