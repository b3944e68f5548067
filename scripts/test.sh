#!/usr/bin/env bash
# Install (if needed) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
set +e
"$ROOT/.venv/bin/python" -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "[omnistage] pytest collected no tests: treating as a failure" >&2
  exit 1
fi
exit "$rc"
