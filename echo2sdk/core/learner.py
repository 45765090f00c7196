"""Learning plane: one GRPO learner step per call, with KL to a frozen reference and truncated importance
sampling against the (possibly stale) sampler. The objective's maths are the pure functions of core/grpo.py
(formulas there and in docs/recipes.md):

    A_i      = (R_i - mean_G) / (std_G + eps)                      group-normalized advantage (scale_rewards)
    r_t      = pi_theta / pi_old                                    (pi_old = pi_theta at the step's start)
    w_t      = min(pi_old / pi_sampler, C)                          truncated importance weight (1 when off)
    l_t      = w_t * ( -min(r_t A, clip(r_t, 1-eps_low, 1+eps_high) A) + beta * KL_t(pi_theta || pi_ref) )
    L        = sum_i c_i sum_t l_t                                  c_i by loss_type: grpo, dr_grpo, dapo

A step runs `updates_per_step` optimizer updates on its batch (the paper: "a training step with two model
updates"); pi_old is fixed for all of them, so r_t = 1 on the first and the clip acts from the second on.
The learning rate follows `lr_scheduler` (core/lr_schedule.py), one value per step.

With `distributed=True` (a torch.distributed process group is up: torchrun, see runtime/learner/distributed.py)
the policy is sharded with FSDP2 (`fully_shard` on every decoder layer and on the unit forward). Every
rank holds the whole batch; the units (rows sharing a prompt, at most `micro_batch` of them and at most
`token_budget` tokens through the decoder) are dealt round-robin to the ranks, each rank scales its partial
token sum by the world size so that FSDP's mean reduce-scatter yields the same gradient as one process, and a
rank with fewer units runs zero-weight dummy units so that every rank issues the same collectives (a slot in
which some rank recomputes a long row, or runs a one-row unit in one pass, runs so on every rank, its dummy
units included: pass_plan).

Memory: a unit keeps its activations for the backward pass, about 1 MiB per token through the decoder for
SmolLM2-135M under bf16 autocast (docs/recipes.md, "Learner memory"), whether the token carries loss or is
an environment turn of a multi-turn episode; `token_budget` bounds the tokens of a unit, so a step's memory
does not grow with episodes x turns.

The parts: core/units.py (rows, units, unit_plan, pass_plan), core/forward.py (the unit forward and its
log-probs), core/audit_sums.py (the worker audit's sums and replay), core/learner_setup.py (knobs, device,
loading pi_theta and pi_ref, FSDP2 sharding); here the step, the schedule and the state for checkpoints.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from echo2sdk.core import grpo, isa, lr_schedule
from echo2sdk.core.audit import BatchWithheld, Screen, TokenSums
from echo2sdk.core.audit_sums import AuditReplay, note_audit_sums, row_audit
from echo2sdk.core.forward import unit_logprobs
from echo2sdk.core.grpo import group_advantages
from echo2sdk.core.learner_setup import (
    KERNEL_KEYS, adamw, check_knobs, learner_device, load_policy, rank_world, tied_aliases, unit_forwards,
)
from echo2sdk.core.records import Trajectory
from echo2sdk.core.units import ONE_PASS, RECOMPUTE, SHARED, pass_plan, rows_of, unit_plan, unit_tokens
from echo2sdk.core.units import Row as _Row

__all__ = [
    "group_advantages", "StepStats", "Learner", "NonFiniteUpdate", "BatchWithheld", "bf16_is_fast", "unit_plan",
    "pass_plan", "unit_tokens",
]


class NonFiniteUpdate(ValueError):
    """A step's loss or gradient norm was NaN or infinite: the gradients were discarded, the weights and the
    optimizer state are unchanged by that update (with updates_per_step > 1, the step's earlier updates stay
    applied) (`Learner.step` raises it; the trainer drops the batch)."""


def bf16_is_fast() -> bool:
    """True on CUDA, and on CPUs with native bf16 matmul (AVX512-BF16 or AMX); elsewhere bf16 autocast
    runs emulated kernels (measured on an AVX2 EPYC: 16x100-token step 289 s bf16 vs 14 s fp32)."""
    return torch.cuda.is_available() or isa.native_bf16(isa.cpu_flags())


@dataclass
class StepStats:
    """What one learner step measured: its loss terms and times, and per record its audit sums and screen."""

    loss: float
    kl: float
    clip_frac: float
    is_weight_mean: float
    is_truncated_frac: float
    tokens: int
    t_train_s: float  # T_train: wall time of the whole update
    t_forward_s: float
    t_backward_s: float
    t_optim_s: float
    grad_norm: float
    # per record of the batch (groups flattened, in order): the worker audit's sums over its loss tokens
    # (core/audit.py; empty when off-policy), and whether the step's screen withheld it from the update
    audit_sums: list[TokenSums] = field(default_factory=list)
    withheld: list[bool] = field(default_factory=list)
    lr: float = 0.0  # the learning rate of the step's updates (lr_scheduler)

    def metrics(self) -> dict[str, Any]:
        """The step's columns of its metrics row: T_train and its phases (seconds), the tokens trained on, the loss
        terms, the learning rate, and the records of the batch its screen withheld (not trained on)."""
        return {
            "t_train_s": round(self.t_train_s, 4), "t_forward_s": round(self.t_forward_s, 4),
            "t_backward_s": round(self.t_backward_s, 4), "t_optim_s": round(self.t_optim_s, 4),
            "tokens": self.tokens, "loss": self.loss, "kl": self.kl, "clip_frac": self.clip_frac,
            "is_weight_mean": self.is_weight_mean, "is_truncated_frac": self.is_truncated_frac,
            "grad_norm": self.grad_norm, "lr": self.lr, "records_withheld": sum(self.withheld),
        }


class Learner:
    """Holds pi_theta (trainable), pi_ref (frozen, only when beta > 0) and the optimizer."""

    def __init__(
        self, model_path: str, *, lr: float, beta: float = 0.0, epsilon: float = 0.2, epsilon_high: float | None = None,
        is_cap: float = 2.0, importance_weight: bool = True, adv_eps: float = 1e-4, loss_type: str = "dapo",
        scale_rewards: bool = True, max_completion_length: int | None = None, updates_per_step: int = 1,
        lr_scheduler: str = "constant", warmup_steps: int = 0, total_steps: int = 1, grad_clip: float = 1.0,
        micro_batch: int = 8, precision: str = "auto", temperature: float = 1.0, weight_decay: float = 0.0,
        reference: bool = True, threads: int | None = None, seed: int = 0, weights_from: str | None = None,
        distributed: bool = False, gradient_checkpointing: bool = False, token_budget: int | None = 2048,
        device: str | None = None, trust_remote_code: bool = False,
    ):
        """`model_path`: the initial policy (and the KL reference); `weights_from`: a Hugging Face folder whose
        weights the policy starts from instead (a checkpoint being resumed). `distributed`: shard with FSDP2
        over the process group that is up (torchrun). `gradient_checkpointing`: recompute activations in the
        backward pass (less memory, ~1/3 more compute; the prompt is then run once per row). `token_budget`:
        the most tokens one unit runs through the decoder (the prompt once, each response padded to the
        unit's longest), which bounds the activations a unit keeps for its backward pass: a prompt's rows are
        cut into units that fit, and a row longer than it alone (a long multi-turn episode) runs with gradient
        checkpointing; None: units of micro_batch rows whatever their length. `device`:
        default the current CUDA device when there is one, else the CPU. `trust_remote_code`: run the model
        folder's own Python (its config's `auto_map`); False refuses such a model at once instead of transformers
        asking on a terminal. The GRPO knobs (`loss_type`,
        `epsilon`, `epsilon_high`, `scale_rewards`, `max_completion_length`, `is_cap`, `importance_weight`:
        core/grpo.py) and the schedule
        (`updates_per_step` optimizer updates per step, `lr_scheduler` over `total_steps` steps with
        `warmup_steps`: core/lr_schedule.py) are described in docs/recipes.md."""
        check_knobs(loss_type, max_completion_length, lr_scheduler, total_steps, warmup_steps, updates_per_step,
                    token_budget)
        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.distributed = distributed
        self.rank, self.world = rank_world(distributed)
        self.device = learner_device(device)
        self.trust_remote_code = bool(trust_remote_code)
        self.model, self.ref = load_policy(model_path, weights_from, self.device, reference=beta > 0 and reference,
                                           gradient_checkpointing=gradient_checkpointing, token_budget=token_budget,
                                           trust_remote_code=self.trust_remote_code)
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])
        self._aliases = tied_aliases(self.model)  # e.g. lm_head.weight, the same tensor as the embeddings
        self._fwd, self._ref_fwd = unit_forwards(self.model, self.ref, gradient_checkpointing=gradient_checkpointing,
                                                 distributed=distributed)
        self.beta, self.epsilon, self.epsilon_high, self.is_cap = beta, epsilon, epsilon_high, is_cap
        self.importance_weight = importance_weight
        self.adv_eps, self.loss_type, self.scale_rewards = adv_eps, loss_type, scale_rewards
        self.max_completion_length, self.updates_per_step = max_completion_length, updates_per_step
        self.grad_clip, self.micro_batch, self.temperature = grad_clip, micro_batch, temperature
        self.token_budget = token_budget
        self.autocast = precision == "bf16" or (precision == "auto" and bf16_is_fast())
        self.opt = adamw(self.model, lr, weight_decay, distributed)
        self.lr, self.lr_scheduler, self.warmup_steps, self.total_steps = lr, lr_scheduler, warmup_steps, total_steps
        self.steps_done = 0  # learner steps taken: the schedule's position (checkpointed: schedule_state)
        self._screen: Screen | None = None  # the current step's (step(screen=...))
        self._replay = AuditReplay(self.model, distributed, self.device)  # replay_sums' model, made at its first call

    # -- batch building ---------------------------------------------------------------------------
    def _rows(self, groups: Sequence[Sequence[Trajectory]]) -> list[_Row]:
        """One row per record (core/units.py rows_of, with this learner's adv_eps and scale_rewards)."""
        return rows_of(groups, self.adv_eps, self.scale_rewards)

    def _unit_logprobs(self, fwd: torch.nn.Module, rows: Sequence[_Row], mode: str = SHARED) -> torch.Tensor:
        """log pi(y_t | x, y_<t) for every response token of `rows`, one unit (core/forward.py unit_logprobs)."""
        return unit_logprobs(fwd, rows, mode, device=self.device, autocast=self.autocast, temperature=self.temperature)

    def _token_logprobs(self, rows: Sequence[_Row], reference: bool = False) -> torch.Tensor:
        """log pi (or log pi_ref) for every response token of `rows`, flattened in row order; 0.0 for rows
        without a loss-carrying token. One process only (it runs every unit here)."""
        per_row: list[torch.Tensor] = [torch.zeros(len(r.mask), device=self.device) for r in rows]
        fwd = self._ref_fwd if reference else self._fwd
        for unit in unit_plan(rows, self.micro_batch, token_budget=self.token_budget):
            assert unit is not None
            mb = [rows[i] for i in unit]
            logp = self._unit_logprobs(fwd, mb, ONE_PASS if len(mb) == 1 else SHARED)
            parts = torch.split(logp, [len(r.mask) for r in mb])
            for i, part in zip(unit, parts):
                per_row[i] = part
        return torch.cat(per_row)

    # -- the update -------------------------------------------------------------------------------
    def _unit_loss(
        self, mb: Sequence[_Row], coef: torch.Tensor, cache: dict[int, Any], key: int, mode: str = SHARED
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The unit's share of L, sum of c_i * l_t over its tokens (`coef`: c_i per token, 0 off the loss mask;
        core/grpo.py), and its sums of (loss, kl, clipped, w, truncated, kept loss tokens) for the step's
        statistics. `cache[key]`
        keeps the unit's (log pi_old, log pi_ref) from the step's first update: pi_old is pi_theta at the step's
        start (that first forward, detached), pi_ref is frozen; later updates reuse both. On that first forward
        the unit's audit sums are noted and the step's screen may withhold rows (their loss is zero throughout).
        `mode`: how UnitForward runs the unit (pass_plan; the reference, without gradients, runs RECOMPUTE as
        ONE_PASS)."""
        logp = self._unit_logprobs(self._fwd, mb, mode)
        mask = torch.tensor([m for r in mb for m in r.mask], device=self.device)
        adv = torch.tensor([r.advantage for r in mb for _ in r.mask], device=self.device)
        sampler = torch.tensor([lp for r in mb for lp in r.sampler_logprobs], device=self.device)
        if key not in cache:
            ref_logp = None
            if self._ref_fwd is not None:
                with torch.no_grad():
                    ref_logp = self._unit_logprobs(self._ref_fwd, mb, ONE_PASS if mode == RECOMPUTE else mode)
            cache[key] = (logp.detach(), ref_logp)
            note_audit_sums(mb, logp.detach(), sampler, mask)
            if self._screen is not None:  # before this unit's first gradient: a withheld row never trains
                for r, w in zip(mb, self._screen.withhold([(r.worker, r.version, r.sums) for r in mb])):
                    r.withheld = w
        logp_old, ref_logp = cache[key]
        if any(r.off_policy for r in mb):  # logged responses have no sampler: take pi_sampler = pi_old
            off = torch.tensor([r.off_policy for r in mb for _ in r.mask], device=self.device)
            sampler = torch.where(off, logp_old, sampler)
        t = grpo.token_terms(logp, logp_old, sampler, adv, ref_logp, epsilon=self.epsilon,
                             epsilon_high=self.epsilon_high, is_cap=self.is_cap, beta=self.beta,
                             importance_weight=self.importance_weight)
        keep = torch.tensor([0.0 if r.withheld else 1.0 for r in mb for _ in r.mask], device=self.device)
        loss = (t.loss * coef * keep).sum()
        with torch.no_grad():
            sums = torch.stack([loss.detach(), *((x * mask).sum() for x in (t.kl, t.clipped, t.weight, t.truncated)),
                                (mask * keep).sum()])
        return loss, sums.double().cpu()

    def _dummy_loss(self, reference: bool, mode: str = SHARED) -> torch.Tensor:
        """A zero-weight unit: the same forward and backward collectives, in the same order, as a real one
        (the policy, in its slot's `mode`, then the reference when a real unit runs it: the step's first update),
        and no gradient."""
        one = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        zero = torch.zeros(1, dtype=torch.long, device=self.device)
        loss = self._fwd(one, one, zero, zero, mode=mode).float().sum() * 0.0
        if reference and self._ref_fwd is not None:
            with torch.no_grad():
                self._ref_fwd(one, one, zero, zero, mode=ONE_PASS if mode == RECOMPUTE else mode)
        return loss

    def step(self, groups: Sequence[Sequence[Trajectory]], screen: Screen | None = None,
             lr_scale: float = 1.0) -> StepStats:
        """One learner step on `groups`: `updates_per_step` optimizer updates, all against pi_old = pi_theta at
        the step's start, so the clip acts from the second on (under `distributed`, every rank passes the same
        whole batch). `screen` (the worker audit, core/audit.py): each unit's rows of a worker over its
        thresholds are withheld from every update of the step. `lr_scale` multiplies this step's scheduled rate
        (a partial batch: lr_schedule.partial_factor). ValueError for a batch without a loss-carrying
        token; BatchWithheld when the screen withheld every row (nothing applied); NonFiniteUpdate for a NaN/inf
        loss or gradient norm: that update is not applied, nor any after it (those before it were); all are
        decided alike on every rank, from the batch or from all-reduced values."""
        t0 = time.perf_counter()
        self._screen = screen
        rows = self._rows(groups)
        n_tok = sum(sum(r.mask) for r in rows)
        if n_tok <= 0:
            raise ValueError("batch has no response token that carries loss")
        c = grpo.sequence_weights([sum(r.mask) for r in rows], self.loss_type, self.max_completion_length)
        coef = [torch.tensor(r.mask) * c_i for r, c_i in zip(rows, c)]
        lr = self._set_lr(lr_scale)
        plan = unit_plan(rows, self.micro_batch, self.rank, self.world, self.token_budget)
        modes = pass_plan(rows, self.micro_batch, self.world, self.token_budget)
        cache: dict[int, Any] = {}
        done = [self._update(rows, coef, plan, modes, cache) for _ in range(self.updates_per_step)]
        self.steps_done += 1
        s = (sum(d[0] for d in done) / len(done)).tolist()  # statistics: the mean over the updates
        audit_sums, withheld = row_audit(rows, self.device if self.distributed else None)
        return StepStats(
            loss=s[0],
            kl=s[1] / n_tok,
            clip_frac=s[2] / n_tok,
            is_weight_mean=s[3] / n_tok,
            is_truncated_frac=s[4] / n_tok,
            tokens=int(n_tok),
            t_train_s=time.perf_counter() - t0,
            t_forward_s=sum(d[2] for d in done),
            t_backward_s=sum(d[3] for d in done),
            t_optim_s=sum(d[4] for d in done),
            grad_norm=sum(d[1] for d in done) / len(done),
            audit_sums=audit_sums,
            withheld=withheld,
            lr=lr,
        )

    def _update(
        self, rows: Sequence[_Row], coef: Sequence[torch.Tensor], plan: list[list[int] | None],
        modes: list[str], cache: dict[int, Any],
    ) -> tuple[torch.Tensor, float, float, float, float]:
        """One optimizer update over this rank's units (`modes`: per unit, how UnitForward runs it, pass_plan):
        (sums of the statistics, gradient norm, forward, backward and optimizer seconds)."""
        first = not cache
        t_fwd = t_bwd = 0.0
        sums = torch.zeros(6, dtype=torch.float64)
        self.opt.zero_grad(set_to_none=True)
        for key, (unit, mode) in enumerate(zip(plan, modes, strict=True)):
            ta = time.perf_counter()
            if unit is None:
                loss = self._dummy_loss(reference=first, mode=mode)
            else:
                unit_coef = torch.cat([coef[i] for i in unit]).to(self.device)
                loss, part = self._unit_loss([rows[i] for i in unit], unit_coef, cache, key, mode)
                sums += part
            tb = time.perf_counter()
            (loss * self.world).backward()  # FSDP's reduce-scatter averages over ranks; the sum is wanted
            t_fwd += tb - ta
            t_bwd += time.perf_counter() - tb
        if self.distributed:
            import torch.distributed as dist

            total = sums.to(self.device)  # NCCL reduces GPU tensors only
            dist.all_reduce(total)
            sums = total.cpu()
        if first and float(sums[5]) == 0:  # all-reduced: every rank decides alike
            self.opt.zero_grad(set_to_none=True)
            raise BatchWithheld(*row_audit(rows, self.device if self.distributed else None))
        if first and self._screen is not None:
            factor = self._reweigh(rows, coef)
            if factor != 1.0:
                for p in self.model.parameters():
                    if p.grad is not None:
                        p.grad.mul_(factor)
                sums[0] *= factor
        tc = time.perf_counter()
        gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        g = float(gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm)
        if not (math.isfinite(g) and math.isfinite(float(sums[0]))):  # all-reduced: every rank decides alike
            self.opt.zero_grad(set_to_none=True)
            raise NonFiniteUpdate(f"loss {float(sums[0])!r}, gradient norm {g!r}: the update was not applied")
        self.opt.step()
        return sums, g, t_fwd, t_bwd, time.perf_counter() - tc

    def _reweigh(self, rows: Sequence[_Row], coef: list[torch.Tensor]) -> float:
        """After the screen withheld rows: the factor c_i(kept rows) / c_i(all rows), the same for every kept
        row under each loss type (core/grpo.py), so that the step equals one on the kept rows alone; `coef` is
        scaled by it for the later updates (a collective when distributed: the flags are all-reduced)."""
        withheld = row_audit(rows, self.device if self.distributed else None)[1]
        if not any(withheld):
            return 1.0
        lengths = [sum(r.mask) for r in rows]
        before = grpo.sequence_weights(lengths, self.loss_type, self.max_completion_length)
        after = grpo.sequence_weights([0 if w else n for n, w in zip(lengths, withheld)], self.loss_type,
                                      self.max_completion_length)
        factor = next(a / b for a, b in zip(after, before) if a > 0)
        for i, (r, w) in enumerate(zip(rows, withheld)):
            r.withheld = w
            coef[i] = coef[i] * factor
        return factor

    # -- the learning-rate schedule ---------------------------------------------------------------
    def _set_lr(self, scale: float = 1.0) -> float:
        """lr * lr_factor at this step (core/lr_schedule.py) * scale on every parameter group; returns it."""
        lr = scale * self.lr * lr_schedule.lr_factor(self.lr_scheduler, self.steps_done, self.total_steps,
                                                     self.warmup_steps)
        for g in self.opt.param_groups:
            g["lr"] = lr
        return lr

    def schedule_state(self) -> dict[str, Any]:
        """The schedule's position, for a checkpoint (JSON)."""
        return {"lr_scheduler": self.lr_scheduler, "steps_done": self.steps_done}

    def load_schedule_state(self, state: dict[str, Any]) -> None:
        self.steps_done = int(state["steps_done"])

    @contextlib.contextmanager
    def offline(self) -> Iterator[Learner]:
        """Steps taken inside change nothing: learning rate 0, and the optimizer state and the schedule's
        position restored after (warm-up calibration times real steps with it)."""
        saved, done, lr = copy.deepcopy(self.opt.state_dict()), self.steps_done, self.lr
        self.lr = 0.0
        try:
            yield self
        finally:
            self.opt.load_state_dict(saved)
            self.steps_done, self.lr = done, lr

    # -- the audit's replay -------------------------------------------------------------------------
    def replay_sums(self, records: Sequence[Trajectory], states: dict[int, dict[str, Any]]) -> list[TokenSums]:
        """The worker audit's replay (core/audit.py): each record's TokenSums under the weights of the version
        it claims, `states[record.version]` (a published snapshot, as snapshot_state returns it), i.e. with
        d = log pi_v - log pi_sampler, which for an honest sampler is rounding whatever its lag. Runs in this
        process alone (rank 0 under FSDP), without gradients, on a second, unsharded copy of the architecture
        (made at the first call) into which each claimed version is copied in turn; records of one version run
        in units as a step's are (rows sharing a prompt, at most micro_batch rows and token_budget tokens).
        Records whose version has no state are not replayed (TokenSums() with n = 0), nor are off-policy ones
        and ones without a loss token."""
        return self._replay.sums(records, states, rows_of=self._rows, logprobs=self._unit_logprobs,
                                 micro_batch=self.micro_batch, token_budget=self.token_budget)

    # -- publication and checkpoints --------------------------------------------------------------
    def model_state(self) -> dict[str, Any]:
        """A copy of the full policy state dict on the CPU (tied aliases left out). Distributed: a collective;
        rank 0 gets the gathered tensors, the other ranks an empty dict."""
        if not self.distributed:
            state = self.model.state_dict()
            return {k: v.detach().to("cpu", copy=True) for k, v in state.items() if k not in self._aliases}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v for k, v in full.items() if k not in self._aliases}

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer's full state keyed by parameter name: {"state": {name: {key: tensor}}, "param_groups":
        [...]} (a collective when distributed: rank 0 gets it, the others an empty dict)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        """Restore what optimizer_state returned (every rank passes the whole of it). The moments and the step
        come from `state`; how the update runs (fused, foreach, capturable) stays this learner's: torch's
        load_state_dict would take those from the saved groups too (a checkpoint from before the fused AdamW, or
        one process's checkpoint resumed under torchrun)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        mine = {k: self.opt.defaults.get(k) for k in KERNEL_KEYS}
        state = {**state, "param_groups": [{**g, **mine} for g in state.get("param_groups", [])]}
        set_optimizer_state_dict(self.model, self.opt, state, options=StateDictOptions(full_state_dict=True))

    def snapshot_state(self, dtype: str = "bfloat16") -> dict:
        """A copy of the weights for publication; serialize it off the learner thread (snapshot_bytes).
        Distributed: a collective; rank 0 gets the gathered copy, the other ranks an empty dict."""
        from echo2sdk.core.snapshot import snapshot_state

        if not self.distributed:
            return snapshot_state(self.model, dtype=dtype)
        state = self.model_state()
        return snapshot_state(state, dtype=dtype) if state else {}

    def save(self, folder: str, tokenizer_from: str | None = None, state: dict[str, Any] | None = None) -> None:
        """Hugging Face format: loadable by transformers and vLLM as it is. Distributed: pass `state` (the
        gathered model_state) and call on rank 0 only."""
        if self.distributed and state is None:
            raise ValueError("a sharded learner saves a gathered state: save(folder, state=learner.model_state())")
        self.model.save_pretrained(folder, state_dict=state)
        if tokenizer_from:
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(tokenizer_from, trust_remote_code=self.trust_remote_code).save_pretrained(folder)
