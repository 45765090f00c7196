"""The policy's forward over one unit of a learner step (rows sharing a prompt, core/units.py), and the
log-probabilities of the unit's response tokens:

    log pi(y_t | x, y_<t) = logits[y_t] / T - logsumexp(logits / T)        (T: the sampling temperature)
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import torch

from echo2sdk.core.units import RECOMPUTE, SHARED, Row

__all__ = ["UnitForward", "unit_logprobs"]


class UnitForward(torch.nn.Module):
    """The policy's forward for one unit (rows sharing a prompt): logits at the selected response positions.

    A module of its own so that, under FSDP, the root's hooks wrap the whole computation (the all-gather of
    embeddings, final norm and head, and the reduce-scatter of their gradients). `mode` SHARED (with
    `shared_prefix`): the decoder runs the prompt once, keeps its KV cache with gradients, repeats it over the
    unit's rows and runs the responses on top (on the math task this cuts the tokens through the model by
    ~2.4x: n = 4, 74-token prompts, ~22-token responses). ONE_PASS: every row runs prompt + response in one
    causal pass (a unit of one row; and every unit under gradient checkpointing, which cannot keep a cache).
    RECOMPUTE: one pass with gradient checkpointing for this unit (a row over the learner's token_budget: its
    layers keep only their inputs, the rest is recomputed in the backward pass). The caller picks the mode
    alike on every FSDP rank (pass_plan), so all run the decoder the same number of times and issue the same
    collectives. Only selected positions go through the output head."""

    def __init__(self, model: torch.nn.Module, shared_prefix: bool = True):
        super().__init__()
        self.model, self.shared_prefix = model, shared_prefix
        # the layers model.gradient_checkpointing_enable() set up; their `gradient_checkpointing` flag switches it
        self._checkpointable = [m for m in model.modules() if hasattr(m, "_gradient_checkpointing_func")]

    def forward(
        self, prompt: torch.Tensor, resp_in: torch.Tensor, b_idx: torch.Tensor, t_idx: torch.Tensor,
        mode: str = SHARED,
    ):
        """`prompt` (1, P) ids; `resp_in` (n, W) the responses' input ids (each response but its last token,
        right-padded, W >= 1); position t of row b predicts response token t; returns logits at (b_idx, t_idx)."""
        decoder, head = self.model.get_decoder(), self.model.get_output_embeddings()
        (n, W), P = resp_in.shape, prompt.shape[1]
        if mode == SHARED and self.shared_prefix:
            pre = decoder(input_ids=prompt, use_cache=True)
            cache = pre.past_key_values
            cache.batch_repeat_interleave(n)
            pos = torch.arange(P, P + W, device=prompt.device).expand(n, -1)
            out = decoder(input_ids=resp_in, past_key_values=cache, position_ids=pos, use_cache=True)
            h = torch.cat([pre.last_hidden_state[:, -1:].expand(n, 1, -1), out.last_hidden_state], dim=1)
        else:
            switch = mode == RECOMPUTE and self.shared_prefix  # without shared_prefix, checkpointing is always on
            if switch and not self._checkpointable:
                raise RuntimeError("mode RECOMPUTE needs the model's gradient checkpointing set up (token_budget)")
            for m in self._checkpointable if switch else ():
                m.gradient_checkpointing = True
            try:
                out = decoder(input_ids=torch.cat([prompt.expand(n, -1), resp_in], dim=1), use_cache=False)
            finally:
                for m in self._checkpointable if switch else ():
                    m.gradient_checkpointing = False
            h = out.last_hidden_state[:, P - 1 :]
        return head(h[b_idx, t_idx])  # right padding: causal attention never lets it reach a real position


def unit_logprobs(
    fwd: torch.nn.Module, rows: Sequence[Row], mode: str, *, device: torch.device, autocast: bool, temperature: float
) -> torch.Tensor:
    """log pi(y_t | x, y_<t) for every response token of `rows` (one unit: they share a prompt),
    flattened in row order. Positions that carry no loss (user turns inside a multi-turn response)
    skip the output head and read 0.0, constant. `mode`: how UnitForward runs the unit;
    `autocast`: under bf16 autocast on `device`; the logits are divided by `temperature`."""
    P = rows[0].start
    resp = [r.ids[P:] for r in rows]
    ids = torch.zeros(len(rows), max(max(len(x) for x in resp) - 1, 1), dtype=torch.long)
    for b, x in enumerate(resp):
        ids[b, : len(x) - 1] = torch.tensor(x[:-1])
    sel = [(b, t) for b, x in enumerate(resp) for t in range(len(x)) if rows[b].mask[t] > 0]
    b_idx = torch.tensor([b for b, _ in sel], device=device)
    t_idx = torch.tensor([t for _, t in sel], device=device)
    ctx = torch.autocast(device.type, dtype=torch.bfloat16) if autocast else nullcontext()
    with ctx:
        prompt = torch.tensor([rows[0].ids[:P]], device=device)
        logits = fwd(prompt, ids.to(device), b_idx, t_idx, mode=mode)
    logits = logits.float() / temperature
    tgt = torch.tensor([resp[b][t] for b, t in sel], device=device)
    logp = logits.gather(-1, tgt[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    total = sum(len(x) for x in resp)
    if len(sel) == total:
        return logp
    offsets = [0]
    for x in resp[:-1]:
        offsets.append(offsets[-1] + len(x))
    flat = torch.tensor([offsets[b] + t for b, t in sel], device=device, dtype=torch.long)
    return torch.zeros(total, device=device, dtype=logp.dtype).index_put((flat,), logp)
