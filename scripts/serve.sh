#!/usr/bin/env bash
# Install (if needed) and start the server. With no arguments it serves the embedded
# tiny demo model on 127.0.0.1:8000; any arguments are passed to `omnistage serve`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
exec "$ROOT/.venv/bin/omnistage" serve --host 127.0.0.1 --port 8000 "$@"
