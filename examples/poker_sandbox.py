"""The paper's appendix-F script, as written: a poker sandbox adapter plus Echo2(...).run().

    python examples/poker_sandbox.py                       # SmolLM2-135M-Instruct, 6-max, a few steps on CPU
    python examples/poker_sandbox.py --policy tiny-random --steps 2 --out runs/poker_sandbox_smoke

Switching task is configuration only: env="moba://lane_1v1_v1" with serializer="moba_obs->prompt_v2"
(the echo2-moba package in contrib/moba; see docs/adapters.md).
"""

from __future__ import annotations

import argparse
import json

from echo2sdk import Echo2, SandboxAdapter

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--policy", default="smollm2-135m", help="model name or HF folder (pi_theta; pi_ref is its frozen copy)")
p.add_argument("--steps", type=int, default=6, help="learner steps")
p.add_argument("--out", default="runs/poker_sandbox")
p.add_argument("--workers", type=int, default=2, help="local rollout-worker processes")
p.add_argument("--nice", type=lambda v: v if v == "idle" else int(v), default="idle",
               help="CPU priority of the local workers: idle (only on cores the learner leaves idle), or a niceness 0-19")
p.add_argument("--worker-timeout", type=float, default=15.0, help="seconds a silent worker is kept (raise on a loaded machine)")
args = p.parse_args()
pi_theta = pi_ref = args.policy

# -- appendix F, as written ------------------------------------------------------------------------
adapter = SandboxAdapter(
    env="poker://nlhe_6max_v1",  # or "moba://lane_1v1_v1", "moba://5v5_v1"
    serializer="envstate->chat_prompt_v2",
    action_renderer="action->text_v1",
    reward_spec="episodic_return",
    metadata_spec="grpo:turn_mask+adv_norm",
)
echo = Echo2(policy=pi_theta, reference=pi_ref)
echo.set(dataset=adapter.stream(mode="offline_or_live"))
echo.set(staleness=3)
# -- small-budget settings for a CPU machine (not part of the paper's snippet) ---------------------
echo.set(steps=args.steps, R=8, group_size=4, workers=args.workers, out=args.out, **{"rollout.max_new_tokens": 12, "rollout.nice": args.nice, "run.worker_timeout_s": args.worker_timeout, "run.progress": False})
echo.warmup()
summary = echo.run()
print(json.dumps({k: summary[k] for k in ("steps", "wall_s", "reward_first5", "reward_last5", "staleness_max")}, indent=2))
