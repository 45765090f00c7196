"""Named, registered SandboxAdapter components that are not tied to one env: a generic serializer, the
`action->text_v1` action renderer, reward specs and metadata specs. Env plug-ins add their own
(e.g. poker's `envstate->chat_prompt_v2`) through `SandboxPlugin.components()`.

Components are resolved by name in a worker process too, so a component must be importable there: a
built-in name, a name an installed env plug-in ships, or a "package.module:attr" reference.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from echo2sdk.adapters.contracts import Observation, ParsedAction

__all__ = [
    "TextSerializer",
    "AnswerTagRenderer",
    "episodic_return",
    "per_step_mean",
    "GRPOMetadata",
    "BUILTIN",
    "KINDS",
]

KINDS = ("serializer", "action_renderer", "reward_spec", "metadata_spec")


class TextSerializer:
    """`state->text_v1`: a generic rendering. The state's "text" field (e.g. an ansi board) verbatim,
    then its other scalar fields as `key: value` lines, then the legal actions."""

    def __init__(self, rules: str = ""):
        self.rules = rules

    def system(self, env: str) -> str:
        base = f"You are playing {env}. Each turn you see the state and the legal actions; reply with one action."
        return f"{base} {self.rules}".strip()

    def user(self, observation: Observation, turn: int) -> str:
        state = dict(observation.state)
        lines = [f"Turn {turn}."]
        text = state.pop("text", None)
        if text:
            lines.append(str(text).rstrip())
        for key, value in state.items():
            if isinstance(value, (str, int, float, bool)) or value is None:
                lines.append(f"{key}: {value}")
            else:
                lines.append(f"{key}: {json.dumps(value, default=str)}")
        lines.append("Legal actions: " + ", ".join(observation.legal) + ".")
        return "\n".join(lines)


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_OPEN_ANSWER = re.compile(r"<answer>\s*([^<\n]*)", re.IGNORECASE)


def _norm(text: str) -> str:
    return re.sub(r"[\s\-]+", "_", text.strip().strip(".!\"'`*").strip().lower())


class AnswerTagRenderer:
    """`action->text_v1`: the model answers `<answer>ACTION</answer>` (the paper's F.4 format) with one of the
    legal action names. Parsing never raises:

    - "ok": the last `<answer>...</answer>` (or, failing that, the whole reply, or an unclosed
      `<answer>` cut off by the token limit) names a legal action, compared case-insensitively with
      spaces and hyphens read as underscores;
    - "illegal": an answer was given but names no legal action;
    - "unparsable": no answer could be found (empty reply, no tag and not an action name).
    """

    def instructions(self, legal: Sequence[str]) -> str:
        """The paper's F.4 format line. It names no particular action on purpose: an example action in every
        prompt (it used to be legal[0], "fold" in poker) is a bias a small model can copy."""
        return "Always output exactly one of the legal actions as <answer>ACTION</answer>."

    def answer(self, action: str) -> str:
        """A reply naming `action` in this format (a worked example's answer)."""
        return f"<answer>{action}</answer>"

    def parse(self, text: str, legal: Sequence[str]) -> ParsedAction:
        if not isinstance(text, str):
            return ParsedAction(None, "unparsable")
        by_norm = {_norm(a): a for a in legal}
        tags = _ANSWER.findall(text)
        if tags:
            answer = tags[-1]
        elif _norm(text) in by_norm:
            answer = text
        elif m := _OPEN_ANSWER.search(text):
            answer = m.group(1)
        else:
            return ParsedAction(None, "unparsable", text.strip()[:40])
        key = _norm(answer)
        if not key:
            return ParsedAction(None, "unparsable", "")
        if key in by_norm:
            return ParsedAction(by_norm[key], "ok", answer.strip()[:40])
        return ParsedAction(None, "illegal", answer.strip()[:40])


def episodic_return(step_rewards: Sequence[float]) -> float:
    """R_i = sum_t r_{i,t} (paper F.5.2): the episode return, e.g. the net chip change of a hand."""
    return float(sum(step_rewards))


def per_step_mean(step_rewards: Sequence[float]) -> float:
    """R_i = (1/T_i) sum_t r_{i,t}: the mean reward per decision, for long episodes with dense step rewards."""
    return float(sum(step_rewards)) / max(1, len(step_rewards))


@dataclass(frozen=True)
class GRPOMetadata:
    """`grpo:turn_mask+adv_norm`: loss only on assistant tokens (turn-aware mask m^loss), group-normalized
    advantages A_i = (R_i - mean_G)/(std_G + eps) with G the episodes of one initial state ("state": the
    n episodes of a group replay one seed) or of one batch ("batch", suffix `@batch`: n seeds, one group)."""

    turn_mask: bool = True
    adv_norm: bool = True
    grouping: Literal["state", "batch"] = "state"


BUILTIN: dict[str, Mapping[str, Any]] = {
    "serializer": {"state->text_v1": TextSerializer()},
    "action_renderer": {"action->text_v1": AnswerTagRenderer()},
    "reward_spec": {"episodic_return": episodic_return, "per_step_mean": per_step_mean},
    "metadata_spec": {
        "grpo:turn_mask+adv_norm": GRPOMetadata(grouping="state"),
        "grpo:turn_mask+adv_norm@state": GRPOMetadata(grouping="state"),
        "grpo:turn_mask+adv_norm@batch": GRPOMetadata(grouping="batch"),
    },
}
