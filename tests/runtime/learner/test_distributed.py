"""The distributed learner: FSDP2 over gloo ranks on loopback (torchrun), driven the way the trainer drives
it (rank 0 announces each collective call through `Lockstep`, the others `follow`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from echo2sdk.core.audit import Screen  # noqa: E402
from echo2sdk.core.learner import Learner  # noqa: E402
from echo2sdk.runtime.learner import distributed  # noqa: E402
from echo2sdk.weights import resolve_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # test_checkpoint (CONFIG), as the rank script does

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Runs on every rank, once per case (one torchrun for all of them): rank 0 steps through Lockstep (the batch
#: reaches rank 1 as msgpack bytes) and gathers the policy and the optimizer state while rank 1 follows; then both
#: gather the gradients. Each case has a fresh learner and its own output folder; the process group stays.
RANK_SCRIPT = textwrap.dedent('''
    import json, os, sys, time
    import torch
    from safetensors.torch import save_file
    sys.path.insert(0, sys.argv[2])
    from test_distributed import CASES, KW, LR_SCALE, SCREEN, batch
    from echo2sdk.core.learner import Learner
    from echo2sdk.runtime.learner import distributed
    from echo2sdk.weights import resolve_model

    topo = distributed.from_env()
    distributed.init(topo)
    for name, checkpointing, token_budget in CASES:
        learner = Learner(resolve_model("tiny-random"), distributed=True, gradient_checkpointing=checkpointing,
                          token_budget=token_budget, **KW)
        if topo.leader:
            ops = distributed.Lockstep(learner, topo.world)
            t0 = time.perf_counter()
            st = ops.step(batch(), SCREEN, lr_scale=LR_SCALE)
            step_s = time.perf_counter() - t0
            params = ops.model_state()
            opt = ops.optimizer_state()
            ops.stop()
            grads = {n: p.grad.full_tensor() for n, p in learner.model.named_parameters() if p.grad is not None}
            out = os.path.join(sys.argv[1], name)
            os.makedirs(out)
            save_file({k: v.contiguous() for k, v in params.items()}, out + "/params.safetensors")
            save_file({k: v.contiguous() for k, v in grads.items()}, out + "/grads.safetensors")
            with open(out + "/stats.json", "w") as fh:
                json.dump({"loss": st.loss, "kl": st.kl, "grad_norm": st.grad_norm, "tokens": st.tokens,
                           "step_s": step_s, "opt_params": sorted(opt["state"]), "withheld": st.withheld}, fh)
        else:
            assert distributed.follow(learner) == (1, True)  # the step, the gathered model and optimizer states, stop
            grads = [p.grad.full_tensor() for p in learner.model.parameters() if p.grad is not None]  # as rank 0
        del learner
    distributed.shutdown(clean=True)
    distributed.leave(0)  # as echo2 run's ranks do: no interpreter teardown
''')

#: (id, gradient checkpointing, token budget). Token budget 12: units of one and two rows, rows over 12 tokens
#: recomputed; per slot (pass_plan) one-row units on both ranks run in one pass, a slot with a two-row unit shares
#: the prompt on both, and a slot with a recomputed row recomputes on both (a dummy unit's included)
CASES = [("shared-prefix", False, 2048), ("gradient-checkpointing", True, 2048), ("token-budget", False, 12)]

KW = dict(lr=1e-3, precision="fp32", beta=0.1, micro_batch=3, threads=1, device="cpu",  # gloo ranks: CPU
          updates_per_step=2, loss_type="grpo")  # the second update runs no reference forward: nor may a dummy unit
#: the worker audit's screen: group 0's claimed log-probs (-60) are far from the policy's (~ -7.6), the others'
#: (-3.0) within the threshold: its rows are withheld on whichever rank runs them
SCREEN = Screen(v_t=0, gap_threshold=10.0, var_threshold=0.5)
#: a partial batch's rate (learner.partial_lr): announced with the step, so a follower's shards move as rank 0's
LR_SCALE = 0.5


def batch() -> list:
    """Four GRPO groups of four with ragged responses (1-5 tokens): five units of at most 3 rows, which two
    ranks split 3 + 2 (rank 1 runs one zero-weight unit)."""
    import random

    from echo2sdk.core.records import Meta, Trajectory

    rnd = random.Random(0)
    out = []
    for g in range(4):
        prompt = tuple(rnd.randrange(10, 2000) for _ in range(5 + g))
        group = []
        for _ in range(4 if g else 3):
            resp = tuple(rnd.randrange(10, 2000) for _ in range(1 + rnd.randrange(5)))
            meta = Meta(group_id=f"g{g}", prompt_ids=prompt, response_ids=resp,
                        logprobs=(-60.0 if g == 0 else -3.0,) * len(resp), worker=f"w{g}")
            group.append(Trajectory(prompt="p", response="y", reward=rnd.random(), version=0, meta=meta))
        out.append(group)
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Path:
    """The CASES on two gloo ranks, one torchrun: returns the folder holding a subfolder of outputs per case."""
    out = tmp_path_factory.mktemp("ranks")
    script = out / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script),
           str(out), str(Path(__file__).parent)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.mark.parametrize(("case", "checkpointing", "token_budget"), CASES, ids=[c[0] for c in CASES])
def test_two_gloo_ranks_take_the_same_step_as_one_process(ranks, case, checkpointing, token_budget):
    from safetensors.torch import load_file

    one = Learner(resolve_model("tiny-random"), gradient_checkpointing=checkpointing, token_budget=token_budget, **KW)
    t0 = time.perf_counter()
    want = one.step(batch(), SCREEN, lr_scale=LR_SCALE)
    one_s = time.perf_counter() - t0
    folder = ranks / case
    got = json.loads((folder / "stats.json").read_text())

    assert got["tokens"] == want.tokens
    assert got["withheld"] == want.withheld == [True] * 3 + [False] * 12
    assert got["loss"] == pytest.approx(want.loss, rel=1e-6, abs=1e-9)
    assert got["kl"] == pytest.approx(want.kl, rel=1e-5, abs=1e-9)
    assert got["grad_norm"] == pytest.approx(want.grad_norm, rel=1e-5)
    grads = load_file(str(folder / "grads.safetensors"))
    scale = max(p.grad.abs().max().item() for p in one.model.parameters())
    for name, p in one.model.named_parameters():
        assert (grads[name] - p.grad).abs().max().item() <= 1e-5 * scale, name
    params, mine = load_file(str(folder / "params.safetensors")), one.model_state()
    assert set(params) == set(mine) and "lm_head.weight" not in params  # the tied head is stored once
    diff = max((params[k] - mine[k]).abs().max().item() for k in mine)
    assert diff < 1e-5
    assert got["opt_params"] == sorted(one.optimizer_state()["state"])
    print(json.dumps({"max_abs_param_diff": diff, "step_s_1rank": round(one_s, 3),
                      "step_s_2rank": round(got["step_s"], 3), "checkpointing": checkpointing,
                      "token_budget": token_budget}))


#: Rank 0 stops its follower as after a failure and lingers; the follower must leave at once (no barrier).
STOP_SCRIPT = textwrap.dedent('''
    import json, sys, time
    from echo2sdk.core.learner import Learner
    from echo2sdk.runtime.learner import distributed
    from echo2sdk.weights import resolve_model

    topo = distributed.from_env()
    distributed.init(topo)
    learner = Learner(resolve_model("tiny-random"), distributed=True, lr=1e-3, precision="fp32", threads=1, device="cpu")
    if topo.leader:
        distributed.Lockstep(learner, topo.world).stop(clean=sys.argv[2] == "1")
        time.sleep(float(sys.argv[3]))  # a failed rank 0 never reaches the barrier; a clean one gets there late
        distributed.shutdown(clean=sys.argv[2] == "1")
    else:
        t0 = time.perf_counter()
        followed = distributed.follow(learner)
        distributed.shutdown(clean=followed.clean)
        with open(sys.argv[1] + "/follower.json", "w") as fh:
            json.dump({"clean": followed.clean, "left_s": time.perf_counter() - t0}, fh)
    distributed.leave(0)
''')


@pytest.mark.parametrize("clean", [True, False])
def test_a_follower_waits_for_rank_0_at_the_barrier_only_after_a_clean_finish(tmp_path, clean):
    script = tmp_path / "stop.py"
    script.write_text(STOP_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script),
                           str(tmp_path), "1" if clean else "0", "6"], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    follower = json.loads((tmp_path / "follower.json").read_text())
    assert follower["clean"] is clean
    if clean:
        assert follower["left_s"] >= 5.5  # it met rank 0 at the barrier after rank 0's 6 s
    else:
        assert follower["left_s"] < 4  # a barrier here would hold it until rank 0 leaves (6 s)


def test_launch_argv_reexecutes_the_cli_under_torchrun():
    argv = distributed.launch_argv(4, ["run", "c.toml", "--out", "o"])
    assert argv[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", "-m", "echo2sdk.cli",
                        "run", "c.toml", "--out", "o"]
    from echo2sdk.cli import _run_argv, build_parser

    args = build_parser().parse_args(["run", "c.toml", "--nproc-per-node", "2", "--set", "a.b=1", "--resume", "d"])
    assert _run_argv(args) == ["run", "c.toml", "--set", "a.b=1", "--resume", "d"]


def test_topology_from_the_torchrun_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    topo = distributed.from_env()
    assert (topo.rank, topo.world, topo.local_rank, topo.leader) == (2, 4, 0, False)
    monkeypatch.setenv("RANK", "4")
    from echo2sdk.errors import ConfigError

    with pytest.raises(ConfigError, match="RANK=4"):
        distributed.from_env()


def test_echo2_run_on_two_ranks_and_its_checkpoint_on_one(tmp_path):
    """`echo2 run --nproc-per-node 2`: rank 0 runs the coordinator, a local worker and the metrics; the
    checkpoint it gathers is a plain one that a single process resumes from."""
    from echo2sdk.runtime.learner import checkpoint
    from test_checkpoint import CONFIG

    cfg, out = tmp_path / "tiny.toml", tmp_path / "run"
    cfg.write_text(CONFIG.format(steps=3).replace('precision = "fp32"', 'precision = "fp32"\nbeta = 0.05'))
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")  # gloo here; NCCL: bench/gpu_check.sh
    done = subprocess.run([sys.executable, "-m", "echo2sdk.cli", "run", str(cfg), "--out", str(out), "--nproc-per-node",
                           "2"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
                          start_new_session=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["version"] for r in rows] == [1, 2, 3]
    assert json.loads((out / "summary.json").read_text())["learner_ranks"] == 2
    ckpt = checkpoint.load(out)
    assert ckpt.step == 3 and ckpt.state["world_size"] == 2
    one = Learner(resolve_model("tiny-random"), weights_from=str(ckpt.path), **KW)
    one.load_optimizer_state(ckpt.optimizer())
    assert one.step(batch()).tokens > 0
