#!/usr/bin/env bash
# The one check a GPU machine runs when one is lent for a few minutes: imports, GPU tests,
# parity tests, then benchmarks on CUDA in bf16, in at most 420 s. Logs and RESULTS.md land
# in $OUT (default ./device-out), written after every step and again on exit, so a run cut
# short still leaves its table.
#
#   bash scripts/device_check.sh prepare   # here, with the registry: carried wheels into .whl/
#   bash scripts/device_check.sh rehearse  # here, on CPU: the same steps, limits and install
#   bash scripts/device_check.sh           # on the GPU machine, with .whl/ copied along
#
# The GPU machine reaches no package registry. It has Python 3.12 whose python3 holds a CUDA
# torch and most of our dependencies (DEVICE_IMAGE below: the image's packages as documented
# for that machine, with versions where known). What it lacks or holds outside our pins
# travels as wheels (CARRIED) and is installed with --no-index into a scratch target that
# goes first on PYTHONPATH. So every carried wheel must import over the image's packages:
# huggingface-hub is not carried (our 2.x imports httpx2, which the image lacks; the image's
# 1.33 meets transformers' and diffusers' pins).
#
# `rehearse` proves the script before a GPU is lent: a clean virtual environment
# (.device-rehearse/venv, no site packages) holds DEVICE_IMAGE with the CPU torch, the same
# CARRIED names and versions are downloaded for its Python and installed the same way into a
# scratch target, and every step runs with the device swapped to cpu under the same limits.
# The GPU tests are collected there and skip (no CUDA).
#
# Time limits (seconds, 420 in all; most informative first): install 30, imports 40 (the
# first import compiles every module: the install is --no-compile), GPU tests 140, parity
# tests 50, bench_diffusion 30, bench_ar 30, bench_memory 70, bench_ar_cuda_graphs 30.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODE="${1:-gpu}"

# What the device image lacks or holds at a version outside our pins.
CARRIED=(diffusers transformers tokenizers pydantic pydantic-core annotated-types typing-inspection
         soundfile cffi pycparser torchao peft cache-dit)
# The device image's packages that omnistage, its tests and benchmarks use (pinned where the
# image's version is documented; torch is the CPU build of this machine's pin in a rehearsal).
DEVICE_IMAGE=(numpy accelerate==1.15.0 huggingface-hub==1.33.0 safetensors==0.8.0 tokenizers==0.23.2
              transformers==5.17.0 sentencepiece==0.2.2 tiktoken==0.14.0 filelock fsspec hf-xet httpx httpcore
              h11 anyio idna certifi jinja2 markupsafe packaging pillow psutil pyyaml regex requests tqdm typer
              click rich typing-extensions prometheus-client pytest pytest-timeout msgpack cloudpickle einops
              scipy matplotlib
              triton)  # 3.6 in the image, beside its torch 2.11; unpinned here, where the rehearsal's torch picks it
REHEARSE_DIR="$ROOT/.device-rehearse"

download_wheels() {  # download_wheels PYTHON_VERSION DEST: CARRIED at this checkout's versions
  local pyver=$1 dest=$2 src_py="${PYTHON:-$ROOT/.venv/bin/python}" name version
  mkdir -p "$dest"
  for name in "${CARRIED[@]}"; do
    version="$("$src_py" -c "import importlib.metadata as m; print(m.version('$name'))")" || return 1
    ls "$dest"/*.whl 2>/dev/null | grep -qi "/$(echo "$name" | tr - _)-$version-" && continue
    "$src_py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d "$dest" "$name==$version" \
      || return 1
  done
}

case "$MODE" in
  prepare)
    download_wheels 3.12 "$ROOT/.whl" || exit 1
    du -sh "$ROOT/.whl"
    exit 0 ;;
  rehearse)
    VENV="$REHEARSE_DIR/venv"
    WANT="$(printf '%s\n' "${DEVICE_IMAGE[@]}" | sha256sum | cut -d' ' -f1)"
    if [ "$(cat "$VENV/.image-stamp" 2>/dev/null)" != "$WANT" ]; then
      rm -rf "$VENV"
      python3 -m venv "$VENV" || exit 1
      torch_pin="$("${PYTHON:-$ROOT/.venv/bin/python}" -c "import torch; print(torch.__version__.split('+')[0])")"
      "$VENV/bin/pip" install -q "torch==$torch_pin" "${DEVICE_IMAGE[@]}" || exit 1
      echo "$WANT" >"$VENV/.image-stamp"
    fi
    PY="$VENV/bin/python"
    WHL="$REHEARSE_DIR/whl"
    download_wheels "$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')" "$WHL" || exit 1
    SITE="$(mktemp -d)"
    DEVICE=cpu
    OUT="${OUT:-$ROOT/device-out-rehearse}" ;;
  gpu)
    PY=python3
    WHL="$ROOT/.whl"
    SITE=/tmp/site
    DEVICE=cuda
    OUT="${OUT:-$ROOT/device-out}" ;;
  *)
    echo "usage: bash scripts/device_check.sh [prepare|rehearse]" >&2
    exit 2 ;;
esac

mkdir -p "$OUT"
rm -f "$OUT"/{setup,gpu_tests,parity,bench}.log "$OUT/gpu_metrics.jsonl"
STARTED=$SECONDS
status=0

results() {  # RESULTS.md from whatever the logs hold so far
  {
    echo "# Device check ($MODE, device $DEVICE) $(date -u +%Y-%m-%dT%H:%MZ), $((SECONDS - STARTED)) s"
    echo; echo '```'; cat "$OUT/env.txt" 2>/dev/null; echo '```'
    echo; echo "## Steps"; echo
    grep -h '^== .*: rc=' "$OUT"/setup.log "$OUT"/gpu_tests.log "$OUT"/parity.log "$OUT"/bench.log 2>/dev/null
    echo; echo "## Benchmarks ($DEVICE, bfloat16)"; echo
    grep -E '^(== bench|\||[0-9]+ requests)' "$OUT/bench.log" 2>/dev/null
    echo; echo "## GPU test numbers"; echo; echo '```'; cat "$OUT/gpu_metrics.jsonl" 2>/dev/null; echo '```'
    echo; echo "## Test summaries"; echo
    grep -hE '^(FAILED|ERROR)|[0-9]+ (passed|failed|skipped)' "$OUT/gpu_tests.log" "$OUT/parity.log" 2>/dev/null | tail -40
  } >"$OUT/RESULTS.md"
}
finish() {
  trap - EXIT INT TERM
  results
  [ "$MODE" = rehearse ] && rm -rf "$SITE"
  tail -40 "$OUT/RESULTS.md"
  exit "$status"
}
trap finish EXIT
trap 'status=143; finish' INT TERM

# LIMIT_SCALE stretches every limit, for a rehearsal on a host too loaded to match the GPU
# machine's pace (its imports alone take 20 s of CPU); a real run leaves it at 1.
LIMIT_SCALE="${LIMIT_SCALE:-1}"
step() {  # step NAME SECONDS LOG CMD...: run CMD under a timeout, log it, remember a failure
  local name=$1 secs=$(($2 * LIMIT_SCALE)) log=$3
  shift 3
  echo "== $name (limit ${secs}s)" | tee -a "$log"
  local start=$SECONDS
  timeout "$secs" "$@" >>"$log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - start)) s" | tee -a "$log"
  [ "$rc" -eq 0 ] || status=1
  results
  return "$rc"
}

# -- 0. the machine ------------------------------------------------------------------------
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || echo "no nvidia-smi"
  "$PY" -V; } >"$OUT/env.txt" 2>&1

# -- 1. environment: carried wheels over the image's packages; stop if they do not import --
if ! ls "$WHL"/*.whl >/dev/null 2>&1; then
  echo "no wheels in $WHL: run 'bash scripts/device_check.sh prepare' and copy .whl along" | tee -a "$OUT/setup.log"
  status=1
  exit
fi
step "install carried wheels" 30 "$OUT/setup.log" "$PY" -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target "$SITE" "$WHL"/*.whl || exit
export PYTHONPATH="$SITE:$ROOT" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMNISTAGE_GPU_REPORT="$OUT/gpu_metrics.jsonl"
step "imports" 40 "$OUT/setup.log" "$PY" -c "
import torch, diffusers, transformers, huggingface_hub, pydantic, torchao, peft, cache_dit, soundfile
import omnistage, omnistage.diffusion.engine, omnistage.ar.engine, omnistage.entrypoints.omni
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())
print('diffusers', diffusers.__version__, 'transformers', transformers.__version__,
      'huggingface_hub', huggingface_hub.__version__, 'omnistage', omnistage.__file__)
" || exit
grep -E '^(torch|diffusers) ' "$OUT/setup.log" >>"$OUT/env.txt"

# -- 2. GPU tests (zoo checkpoints build on first use into .omnistage-cache) ---------------
# tests/gpu/test_parallel_cuda.py needs two GPUs (nccl takes one per rank) and skips on one;
# tests/gpu/test_paged_attention_cuda.py compiles the Triton paged kernel (AR stages on CUDA
# run it by default, so most AR GPU tests do too).
step "GPU tests" 140 "$OUT/gpu_tests.log" "$PY" -m pytest -m gpu tests/gpu -q -rA -p no:cacheprovider

# -- 3. parity tests under the image's torch (test_offload places weights on CUDA there, and
# test_ring_kernel checks ring attention's CUDA kernel) -------------------------------------
step "parity tests" 50 "$OUT/parity.log" "$PY" -m pytest -q -x -p no:cacheprovider tests/diffusion/test_ring_kernel.py \
  tests/ar/test_ar_parity.py tests/diffusion/test_parity_z_image.py tests/diffusion/test_offload.py

# -- 4. benchmarks, ours and the baseline on the same device, bf16 -------------------------
cd "$ROOT/benchmarks"
step "bench_diffusion" 30 "$OUT/bench.log" "$PY" bench_diffusion.py --models z-image --sizes tiny --repeats 2 \
  --no-memory --no-write --device "$DEVICE" --dtype bfloat16
step "bench_ar" 30 "$OUT/bench.log" "$PY" bench_ar.py --sizes tiny small --repeats 2 --no-write \
  --device "$DEVICE" --dtype bfloat16
# Offload and quantization, each engine alone on the device (peak memory above what was
# allocated before it was built), so their savings show.
# The dynamic quantization modes (activations too) only on CUDA: fp8_dynamic is refused on a
# CPU, and int8_dynamic there runs torchao's int32 fallback, far past this step's limit.
QUANT_OPTIONS=("quantization: int8")
[ "$DEVICE" = cuda ] && QUANT_OPTIONS+=("quantization: int8_dynamic" "quantization: fp8_dynamic")
step "bench_memory" 70 "$OUT/bench.log" "$PY" bench_memory.py --models z-image --size small --repeats 2 \
  --options "offload: model" "offload: layerwise" "${QUANT_OPTIONS[@]}" --no-write --device "$DEVICE" --dtype bfloat16
if [ "$DEVICE" = cuda ]; then  # CUDA graphs exist only on CUDA
  step "bench_ar_cuda_graphs" 30 "$OUT/bench.log" "$PY" bench_ar_cuda_graphs.py --sizes tiny small --repeats 2 \
    --no-write --device "$DEVICE" --dtype bfloat16
else
  step "bench_ar_cuda_graphs (arguments only)" 30 "$OUT/bench.log" "$PY" bench_ar_cuda_graphs.py --help
fi
cd "$ROOT"
