"""The worker audit's sums on the learner's side (core/audit.py TokenSums): noted per row at pi_old in a step,
gathered over the ranks, and recomputed in the replay under the weights of the version a record claims.

    d_t = log pi(y_t) - log pi_sampler(y_t)        over a record's loss tokens
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import astuple
from typing import Any

import torch

from echo2sdk.core.audit import TokenSums
from echo2sdk.core.forward import UnitForward
from echo2sdk.core.records import Trajectory
from echo2sdk.core.units import ONE_PASS, SHARED, Row, units_of

__all__ = ["note_audit_sums", "row_audit", "AuditReplay"]


def note_audit_sums(rows: Sequence[Row], logp_old: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor) -> None:
    """Keep on each on-policy row the audit's sums over its loss tokens (core/audit.py TokenSums): their count,
    the sums of |d|, d and d^2 for d = log pi_old - log pi_sampler, and of log pi_old and its square."""
    sizes = [len(r.mask) for r in rows]
    m = mask.double()
    d, lp = (logp_old.double() - sampler.double()) * m, logp_old.double() * m
    per = torch.stack([torch.stack([mm.sum(), dd.abs().sum(), dd.sum(), (dd * dd).sum(), ll.sum(), (ll * ll).sum()])
                       for dd, ll, mm in zip(d.split(sizes), lp.split(sizes), m.split(sizes))]).tolist()  # one sync
    for r, v in zip(rows, per):
        if not r.off_policy:
            r.sums = TokenSums(*v)


def row_audit(rows: Sequence[Row], device: torch.device | None) -> tuple[list[TokenSums], list[bool]]:
    """Each row's audit sums and withheld flag. `device`: sum the ranks' partial rows there (distributed: every
    row was run on one rank, the others hold zeros for it)."""
    t = torch.tensor([[*astuple(r.sums), float(r.withheld)] for r in rows], dtype=torch.float64).reshape(len(rows), 7)
    if device is not None:
        import torch.distributed as dist

        t = t.to(device)
        dist.all_reduce(t)
        t = t.cpu()
    return [TokenSums(*v[:6]) for v in t.tolist()], [v[6] > 0 for v in t.tolist()]


class AuditReplay:
    """Learner.replay_sums' model: a frozen copy of `policy` (unsharded: from its config when `distributed`),
    made at the first replay, into which each claimed version's weights are copied in turn."""

    def __init__(self, policy: torch.nn.Module, distributed: bool, device: torch.device):
        self._policy, self._distributed, self._device = policy, distributed, device
        self._replay: tuple[UnitForward, dict, list] | None = None  # forward, its tensors, version loaded

    def _model(self) -> tuple[UnitForward, dict[str, torch.Tensor], list]:
        """The replay's model (forward, its state-dict tensors, [the version loaded]), made once: a copy of the
        policy (unsharded: from its config under FSDP), frozen."""
        if self._replay is None:
            if self._distributed:
                from transformers import AutoModelForCausalLM

                net = AutoModelForCausalLM.from_config(self._policy.config, dtype=torch.float32).to(self._device)
            else:
                net = copy.deepcopy(self._policy)
            net.eval().requires_grad_(False)
            for p in net.parameters():
                p.grad = None
            self._replay = (UnitForward(net), net.state_dict(), [None])
        return self._replay

    def sums(
        self,
        records: Sequence[Trajectory],
        states: dict[int, dict[str, Any]],
        *,
        rows_of: Callable[[Sequence[Sequence[Trajectory]]], list[Row]],
        logprobs: Callable[[torch.nn.Module, Sequence[Row], str], torch.Tensor],
        micro_batch: int,
        token_budget: int | None,
    ) -> list[TokenSums]:
        """Each record's TokenSums under `states[record.version]` (see Learner.replay_sums), without gradients;
        `rows_of` builds the rows of groups, `logprobs(forward, unit rows, mode)` runs one unit, and the
        records of a version run in units as a step's are (`micro_batch`, `token_budget`). TokenSums() (n = 0)
        for a record not replayed."""
        out = [TokenSums()] * len(records)
        by_version: dict[int, list[int]] = {}
        for i, t in enumerate(records):
            if t.version in states and not t.meta.off_policy:
                by_version.setdefault(t.version, []).append(i)
        if not by_version:
            return out
        fwd, targets, loaded = self._model()
        with torch.no_grad():
            for version, idx in sorted(by_version.items()):
                rows = rows_of([[records[i]] for i in idx])
                units = units_of(rows, micro_batch, token_budget)  # bounded as a step's units are
                if not units:  # no loss token in any of them
                    continue
                if loaded[0] != version:
                    for name, tensor in states[version].items():
                        targets[name].copy_(tensor)  # casts; tied weights are one tensor, named once
                    loaded[0] = version
                for unit in units:
                    mb = [rows[j] for j in unit]
                    logp = logprobs(fwd, mb, ONE_PASS if len(mb) == 1 else SHARED)
                    sampler = torch.tensor([lp for r in mb for lp in r.sampler_logprobs], device=self._device)
                    mask = torch.tensor([m for r in mb for m in r.mask], device=self._device)
                    note_audit_sums(mb, logp, sampler, mask)
                    for j in unit:
                        out[idx[j]] = rows[j].sums
        return out
