"""`envstate->chat_prompt_v2`: the acting player's view of a hold'em table as a short chat prompt.

Only what that seat may know: its own two cards, the board, the pot, the stacks and chips in front of
every seat, who has folded, the betting so far and the legal actions. Other seats' hole cards are
never in the state the sandbox hands over, so they can never reach a prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ChatPromptV2"]


class ChatPromptV2:
    """The table's worked turns (`PokerSandbox.example_turns`, shown before the first state: a 135M model
    follows a shown answer format far better than a described one) are rendered with `user` like every state."""

    def system(self, env: str) -> str:
        return (
            "You play no-limit Texas hold'em for chips. Blinds 1/2, stacks 100. Each turn you see your cards, "
            "the board, the pot and the betting, and choose one legal action. Win chips."
        )

    def user(self, observation: Any, turn: int) -> str:
        s: Mapping[str, Any] = observation.state
        lines = [
            f"{s['stage'].capitalize()}. You are {s['you']} ({s['position']}).",
            f"Your cards: {' '.join(s['hand'])}. Board: {' '.join(s['board']) or '-'}.",
            f"Pot {s['pot']}, to call {s['to_call']}, your stack {s['stack']}.",
        ]
        if "hand_strength" in s:  # env_options.describe_hand: after the cards line
            lines.insert(2, f"You hold: {s['hand_strength']}.")
        others = [
            f"{o['seat']} {'folded' if o['folded'] else 'stack ' + str(o['stack'])}" for o in s["opponents"]
        ]
        lines.append("Others: " + ", ".join(others) + ".")
        if s["history"]:
            lines.append("Betting: " + "; ".join(s["history"][-8:]) + ".")
        lines.append("Legal: " + ", ".join(observation.legal) + ".")
        return "\n".join(lines)
