#!/usr/bin/env bash
# Reproduce every table in benchmarks/RESULTS.md on this machine (about 15 minutes on
# 2 idle cores). Each script measures its own baseline in the same run and rewrites only
# its own section of RESULTS.md. Extra arguments are ignored; run a script by hand for options.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
PY="$ROOT/.venv/bin/python"
cd "$ROOT/benchmarks"
for script in bench_diffusion.py bench_stepwise.py bench_ar.py bench_ar_paged.py bench_omni.py bench_qwen3_omni.py \
              bench_tts.py bench_http.py bench_responses.py bench_cache.py bench_memory.py bench_parallel.py bench_ray.py; do
  [ -f "$script" ] || continue
  echo "== $script"
  start=$(date +%s)
  "$PY" "$script"
  echo "== $script took $(( $(date +%s) - start )) s"
done
