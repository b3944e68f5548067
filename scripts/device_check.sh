#!/usr/bin/env bash
# The one script a session with a lent GPU machine runs (the device tool; see
# /work/.library/device/README.md). GPU tests, the CPU parity tests under the machine's
# own torch, and the benchmarks on CUDA in fp32 and bf16, in under 9 minutes; logs and
# RESULTS.md land in $OUT.
#
# How the environment gets there. The device machine reaches no package registry, so
# scripts/setup_env.sh cannot run there: with nvidia-smi present it skips the CPU torch pin
# (right on an online CUDA machine: `pip install -e .[dev]` then pulls the CUDA torch), but
# offline that install fails. A carried .venv is no help either: it is built here, for this
# machine's Python and CPU torch. What works: the machine's python3 (3.12, CUDA torch 2.11
# and most of our dependencies, see KINDS.md) plus the packages it lacks or has too old,
# carried as wheels in .whl/ (ignored by git) and installed with --no-index into /tmp/site.
# A venv made from that python3 would not see its torch (that python3 is itself a venv), so
# the script puts /tmp/site and the repo on PYTHONPATH instead.
#
#   1. Here, once (needs pip and the registry; writes .whl/, about 25 MB):
#        echo /.whl/ >> .git/info/exclude
#        bash scripts/device_check.sh prepare
#   2. Through the device tool, one call (the wheels travel with `carry`):
#        run(command="bash scripts/device_check.sh", carry=[".whl"], timeout_s=570)
#      The files come back from $OUT: env.txt, setup.log, gpu_tests.log, gpu_metrics.jsonl,
#      parity.log, bench.log, RESULTS.md (7 of the 8 files the tool returns).
#
# Time budget (each step has its own `timeout`; about 11 minutes at most, far less in practice):
#   setup 60 s, GPU tests 180 s, CPU parity tests 90 s, benchmarks 4 x 45 s, memory options 60 s,
#   step caches 60 s, AR CUDA graphs 45 s.
# Without $OUT (a run by hand) the files go to ./device-out.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WHL="$ROOT/.whl"
# What the device image lacks or holds at a version outside our pins (KINDS.md lists it).
PACKAGES=(diffusers transformers huggingface-hub tokenizers pydantic pydantic-core annotated-types
          typing-inspection soundfile cffi pycparser torchao peft cache-dit)

if [ "${1:-}" = "prepare" ]; then
  set -e
  PY="$ROOT/.venv/bin/python"
  mkdir -p "$WHL"
  for name in "${PACKAGES[@]}"; do
    version="$("$PY" -c "import importlib.metadata as m; print(m.version('$name'))")"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d "$WHL" "$name==$version"
  done
  du -sh "$WHL"
  exit 0
fi

OUT="${OUT:-$ROOT/device-out}"
mkdir -p "$OUT"
PY=python3
status=0
step() {  # step NAME SECONDS LOG CMD...: run CMD under a timeout, log it, remember a failure
  local name=$1 secs=$2 log=$3
  shift 3
  echo "== $name (limit ${secs}s)" | tee -a "$log"
  local start=$SECONDS
  timeout "$secs" "$@" >>"$log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - start)) s" | tee -a "$log"
  [ "$rc" -eq 0 ] || status=1
}

# -- 0. the machine ------------------------------------------------------------------------
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; $PY -V; } >"$OUT/env.txt" 2>&1

# -- 1. environment: carried wheels over the image's packages ------------------------------
if ls "$WHL"/*.whl >/dev/null 2>&1; then
  step "install carried wheels" 60 "$OUT/setup.log" \
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl
else
  echo "no .whl/ carried: run 'bash scripts/device_check.sh prepare' here and carry .whl" | tee -a "$OUT/setup.log"
fi
export PYTHONPATH="/tmp/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
$PY - >>"$OUT/env.txt" 2>&1 <<'PYEOF'
import torch, diffusers, transformers, omnistage
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("diffusers", diffusers.__version__, "transformers", transformers.__version__, "omnistage", omnistage.__file__)
PYEOF
cat "$OUT/env.txt"

# -- 2. GPU tests (zoo checkpoints build on first use into .omnistage-cache) ---------------
# tests/gpu/test_parallel_cuda.py holds the parallel-diffusion equality checks over nccl
# (Ulysses, ring, CFG + VAE patch parallel); nccl takes one GPU per rank, so it needs two.
# tests/gpu/test_ar_cuda_graphs.py: AR `compile: true` (CUDA graphs of the decode step) gives the
# eager engine's greedy tokens.
export OMNISTAGE_GPU_REPORT="$OUT/gpu_metrics.jsonl"
step "pytest -m gpu tests/gpu" 180 "$OUT/gpu_tests.log" $PY -m pytest -m gpu tests/gpu -q -rA -p no:cacheprovider

# -- 3. the CPU parity tests under the image's torch (what CI checks, on other versions) ---
step "parity tests (CPU)" 90 "$OUT/parity.log" $PY -m pytest -q -x -p no:cacheprovider \
  tests/diffusion/test_parity_z_image.py tests/diffusion/test_parity_qwen_image.py \
  tests/diffusion/test_parity_flux.py tests/ar/test_ar_parity.py tests/diffusion/test_offload.py

# -- 4. benchmarks on CUDA, ours and the baseline on the same device and dtype -------------
cd "$ROOT/benchmarks"
for dtype in float32 bfloat16; do
  step "bench_diffusion cuda $dtype" 45 "$OUT/bench.log" $PY bench_diffusion.py --models z-image qwen-image \
    --sizes tiny --repeats 2 --no-memory --no-write --device cuda --dtype "$dtype"
  step "bench_ar cuda $dtype" 45 "$OUT/bench.log" $PY bench_ar.py --sizes tiny small --repeats 2 --no-write \
    --device cuda --dtype "$dtype"
done
# Memory and kernel options (issue 15): speed, weight bytes, peak CUDA memory and PSNR vs plain.
step "bench_memory cuda bfloat16" 60 "$OUT/bench.log" $PY bench_memory.py --models z-image --size small \
  --repeats 2 --no-write --device cuda --dtype bfloat16
# AR `compile: true`: decode steps replayed from CUDA graphs vs the same engine eager, bf16
# (tests/gpu/test_ar_cuda_graphs.py checks their tokens in fp32).
step "bench_ar_cuda_graphs cuda bfloat16" 45 "$OUT/bench.log" $PY bench_ar_cuda_graphs.py --sizes tiny small \
  --repeats 2 --no-write --device cuda --dtype bfloat16
# Step caches: ours and cache-dit on diffusers at two thresholds, small Qwen-Image and
# Z-Image, 50 steps, bf16 (benchmarks/bench_cache.py measures the same on CPU).
step "bench_cache cuda bfloat16" 60 "$OUT/bench.log" $PY bench_cache.py --models qwen-image z-image \
  --grid 0.2 0.8 --steps 50 --no-write --device cuda --dtype bfloat16
cd "$ROOT"

# -- 5. RESULTS.md: the tables the benchmarks printed, and the GPU test numbers ------------
{
  echo "# Device check $(date -u +%Y-%m-%dT%H:%MZ)"
  echo; echo '```'; cat "$OUT/env.txt"; echo '```'
  echo; echo "## Benchmarks (CUDA)"; echo
  grep -E '^(== bench|\||[0-9]+ requests)' "$OUT/bench.log"
  echo; echo "## GPU test numbers"; echo; echo '```'; cat "$OUT/gpu_metrics.jsonl" 2>/dev/null; echo '```'
  echo; echo "## Test summaries"; echo
  grep -hE '^(== |FAILED|ERROR|[0-9]+ (passed|failed))|passed|failed' "$OUT/gpu_tests.log" "$OUT/parity.log" | tail -40
} >"$OUT/RESULTS.md"
tail -30 "$OUT/RESULTS.md"
exit "$status"
