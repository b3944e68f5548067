#!/usr/bin/env bash
# Create or reuse .venv in the repo root and install omnistage into it.
# Sourced by serve.sh and test.sh; safe to run again (skips work when nothing changed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[omnistage] creating virtualenv at $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q -U pip
fi

# Reinstall only when the dependency list or this recipe changed.
STAMP="$VENV/.omnistage-install-stamp"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/setup_env.sh" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    # No CUDA here: a bare `torch` requirement would pull a multi-GB CUDA build.
    echo "[omnistage] no CUDA found: installing the CPU build torch==2.13.0"
    "$VENV/bin/pip" install -q torch==2.13.0
  fi
  echo "[omnistage] installing omnistage (editable) with dev extras"
  # uv resolves and installs the ~120 dependencies in seconds where pip takes minutes; it keeps
  # the torch installed above (every requirement admits it). pip remains the fallback.
  if "$VENV/bin/pip" install -q uv; then
    "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" -e "$ROOT[dev]"
  else
    "$VENV/bin/pip" install -q -e "$ROOT[dev]"
  fi
  # The CPU paged-attention kernel (omnistage/ar/kernels/paged_attention.cpp), compiled once now into
  # the user's cache so that an AR stage's first request does not wait for the compiler. Without a
  # C++ compiler it does not build, and AR stages gather their KV blocks instead (paged_attention: auto).
  echo "[omnistage] building the CPU paged-attention kernel"
  "$VENV/bin/python" -c "import torch; from omnistage.ar.paged_attention import kernel_for; kernel_for(torch.device('cpu'))" \
    || echo "[omnistage] the CPU paged-attention kernel did not build: AR stages will gather their KV blocks"
  # Byte-compile what is installed (uv writes no .pyc files): where Python may not write them
  # (PYTHONDONTWRITEBYTECODE, a read-only venv) every process would otherwise compile each module it
  # imports from source, every time: ~2 s of CPU for torch + transformers + diffusers alone on the
  # 2-core machine, paid by every server, rank, Ray worker and test worker. Files that are up to
  # date are skipped; the few vendored ones that do not compile are left as source, as pip leaves them.
  echo "[omnistage] byte-compiling the installed packages"
  "$VENV/bin/python" -m compileall -qq -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
  echo "$WANT" > "$STAMP"
fi
