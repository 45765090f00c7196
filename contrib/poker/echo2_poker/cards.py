"""Cards as text ("Ah", "Td") and a small hand evaluator for the rule-based opponents.

rlcard writes a card suit first ("HJ" = jack of hearts, "DT" = ten of diamonds); we show rank first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

__all__ = ["card_text", "RANKS", "hand_category", "preflop_strength", "CATEGORY_NAMES", "describe_hand", "preflop_band"]

RANKS = "23456789TJQKA"
CATEGORY_NAMES = (
    "high card", "pair", "two pair", "three of a kind", "straight", "flush", "full house", "four of a kind",
    "straight flush",
)


def card_text(card: str) -> str:
    """'HJ' -> 'Jh'."""
    return card[1:] + card[0].lower()


def _rank(card: str) -> int:
    return RANKS.index(card[0]) + 2  # rank-first text, e.g. 'Jh' -> 11


def _straight_high(ranks: set[int]) -> int:
    if 14 in ranks:
        ranks = ranks | {1}
    best = 0
    for hi in range(5, 15):
        if all(r in ranks for r in range(hi - 4, hi + 1)):
            best = hi
    return best


def hand_category(cards: Sequence[str]) -> int:
    """Best category among rank-first cards ('Ah', 'Td', ...): 0 high card ... 8 straight flush."""
    ranks = [_rank(c) for c in cards]
    suits = Counter(c[-1] for c in cards)
    counts = sorted(Counter(ranks).values(), reverse=True)
    flush_suit = next((s for s, k in suits.items() if k >= 5), None)
    if flush_suit and _straight_high({_rank(c) for c in cards if c[-1] == flush_suit}):
        return 8
    if counts[0] == 4:
        return 7
    if counts[0] == 3 and len(counts) > 1 and counts[1] >= 2:
        return 6
    if flush_suit:
        return 5
    if _straight_high(set(ranks)):
        return 4
    if counts[0] == 3:
        return 3
    if counts[0] == 2 and len(counts) > 1 and counts[1] == 2:
        return 2
    return 1 if counts[0] == 2 else 0


def preflop_strength(hand: Sequence[str]) -> float:
    """A 0..1 score of two hole cards: pairs high, big cards, suitedness and connectedness count."""
    a, b = sorted((_rank(c) for c in hand), reverse=True)
    if a == b:
        return min(1.0, 0.5 + a / 28)
    score = (a + b) / 40
    if hand[0][-1] == hand[1][-1]:
        score += 0.06
    if a - b == 1:
        score += 0.04
    return min(score, 0.95)


#: preflop_strength bands, strongest first (tight_aggressive raises "premium" and plays "strong")
_PREFLOP_BANDS = ((0.75, "premium"), (0.55, "strong"), (0.4, "playable"), (0.0, "weak"))


def preflop_band(hand: Sequence[str]) -> str:
    """The starting hand's band: premium, strong, playable or weak."""
    return next(name for lo, name in _PREFLOP_BANDS if preflop_strength(hand) >= lo)


def describe_hand(hand: Sequence[str], board: Sequence[str]) -> str:
    """The seat's own hand in words: preflop its starting-hand band, after the flop its best category with the
    board (e.g. "weak starting hand", "pair"; "pair on the board only" when the board alone makes it). Derived
    from the seat's cards and the board only."""
    if not board:
        return f"{preflop_band(hand)} starting hand"
    made = hand_category(list(hand) + list(board))
    if made and made == hand_category(board):  # the board alone makes it: every seat holds as much
        return f"{CATEGORY_NAMES[made]} on the board only"
    return CATEGORY_NAMES[made]
