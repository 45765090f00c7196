"""Setting a Learner up: its knobs checked, its process's rank and device, pi_theta and pi_ref loaded in fp32
(with gradient checkpointing set up), their unit forwards sharded with FSDP2, and the tied-weight aliases."""

from __future__ import annotations

import copy

import torch

from echo2sdk.core import grpo, lr_schedule
from echo2sdk.core.forward import UnitForward

__all__ = ["check_knobs", "rank_world", "learner_device", "load_policy", "unit_forwards", "tied_aliases", "shard",
           "adamw", "KERNEL_KEYS"]

#: AdamW's param-group options that choose how the update runs, not what it computes: a learner keeps its own
#: when it loads a saved optimizer state (Learner.load_optimizer_state)
KERNEL_KEYS = ("fused", "foreach", "capturable")


def check_knobs(
    loss_type: str, max_completion_length: int | None, lr_scheduler: str, total_steps: int, warmup_steps: int,
    updates_per_step: int, token_budget: int | None,
) -> None:
    """ValueError naming a bad knob, at construction rather than at step 1."""
    grpo.sequence_weights([1.0], loss_type, max_completion_length)  # a bad loss type fails here, not at step 1
    lr_schedule.lr_factor(lr_scheduler, 0, total_steps, warmup_steps)
    if updates_per_step < 1:
        raise ValueError(f"updates_per_step must be >= 1, got {updates_per_step!r}")
    if token_budget is not None and token_budget < 1:
        raise ValueError(f"token_budget must be >= 1 or None, got {token_budget!r}")


def rank_world(distributed: bool) -> tuple[int, int]:
    """(this process's rank, the world size): (0, 1) unless `distributed`."""
    if not distributed:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("Learner(distributed=True) needs a torch.distributed process group (start under torchrun)")
    return dist.get_rank(), dist.get_world_size()


def learner_device(device: str | None) -> torch.device:
    """`device`; by default the current CUDA device when there is one, else the CPU."""
    cuda = torch.cuda.is_available() and device in (None, "cuda")
    return torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device(device or "cpu")


def load_policy(
    model_path: str, weights_from: str | None, device: torch.device, *, reference: bool, gradient_checkpointing: bool,
    token_budget: int | None, trust_remote_code: bool = False,
) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """(pi_theta, pi_ref): the policy in fp32 on `device` from `weights_from` (else `model_path`), in training
    mode without a KV cache; with `reference`, a frozen copy of `model_path`'s weights. Gradient checkpointing
    is set up on the policy when `gradient_checkpointing` (always on) or `token_budget` (off until a long row
    switches it on, UnitForward). `trust_remote_code`: transformers' flag, False unless the operator set
    model.trust_remote_code."""
    from transformers import AutoModelForCausalLM

    def load(p: str) -> torch.nn.Module:  # never a model folder's own code unless the operator said so
        return AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32, trust_remote_code=trust_remote_code).to(device)

    model = load(weights_from or model_path)
    model.train()
    model.config.use_cache = False
    ref = None
    if reference:
        ref = (load(model_path) if weights_from else copy.deepcopy(model)).eval()
        ref.requires_grad_(False)
    if gradient_checkpointing or token_budget is not None:  # token_budget: switched on per long row (UnitForward)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if not gradient_checkpointing:  # off until a long row switches it on (gradient_checkpointing_disable
            for m in model.modules():  # would also swap the checkpoint function for torch's default)
                if hasattr(m, "_gradient_checkpointing_func"):
                    m.gradient_checkpointing = False
            model.disable_input_require_grads()  # the hook enable() adds; trained embeddings need none
    return model, ref


def unit_forwards(
    model: torch.nn.Module, ref: torch.nn.Module | None, *, gradient_checkpointing: bool, distributed: bool
) -> tuple[UnitForward, UnitForward | None]:
    """The forwards of pi_theta and pi_ref (None without a reference), sharded with FSDP2 when `distributed`."""
    fwd = UnitForward(model, shared_prefix=not gradient_checkpointing)
    ref_fwd = UnitForward(ref) if ref is not None else None
    if distributed:
        shard(fwd, model)
        if ref_fwd is not None:
            shard(ref_fwd, ref)
    return fwd, ref_fwd


def tied_aliases(model: torch.nn.Module) -> set[str]:
    """State-dict names that are the same tensor as an earlier name (tied weights), e.g. lm_head.weight."""
    seen: set[int] = set()
    aliases = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            aliases.add(name)
        seen.add(id(p))
    return aliases


def shard(fwd: UnitForward, model: torch.nn.Module) -> None:
    """FSDP2: every decoder layer is its own unit; the forward module holds the rest (embeddings, final norm,
    head; tied weights stay in one unit)."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.get_decoder().layers:
        fully_shard(layer)
    fully_shard(fwd)


def adamw(model: torch.nn.Module, lr: float, weight_decay: float, distributed: bool) -> torch.optim.AdamW:
    """The learner's AdamW: torch's fused kernel (one pass over each parameter per step) where it applies, one
    process with every parameter a floating tensor on the CPU or a CUDA device; else the per-parameter loop (FSDP's
    sharded DTensors). On 2 CPU cores, SmolLM2-135M's shape, gradient clipping and the step take 0.16 s against
    0.36 s (`bench/learner_device.py --optimizers loop,fused`); the two agree to float rounding
    (tests/core/test_learner.py).
    TRL's GRPOTrainer uses the fused kernel too (transformers' default optimizer with torch >= 2.8)."""
    params = list(model.parameters())
    fused = not distributed and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)
