"""`textarena://GAME`: offline TextArena games as sandboxes.

    SandboxAdapter(env="textarena://TicTacToe-v0", env_options={"seat": 0, "opponent": "random"})

The model plays one seat (`seat`, default 0). Its prompt each turn is what the game told that seat since
its last move, in TextArena's words and as its training wrapper arranges them: the rules (first turn),
the game's messages (what each player did), then the current board. Its reply is the action: a move in square
brackets as the game asks (`[4]`, `[col 3]`, `[0 2]`; the last bracketed move counts; a short reply
without brackets, or `<answer>4</answer>`, is read as the move, as TextArena's ActionFormattingWrapper
does). A move is matched to the legal moves by its numbers (`[4]` and `[col 4]` are the same Connect
Four move). A reply naming no legal move plays the first legal move and costs `penalty` (default 0.1),
counted as a fallback. The other seat plays `opponent`: "random" (a seeded uniform choice among the
legal moves) or "first" (the first legal move: a fixed, scripted reply). Other `env_options` go to the
game's constructor (e.g. GuessTheNumber's `min_number`, `max_number`, `max_turns`).

The episode's reward for the seat is the game's: 0 until it ends, then the seat's TextArena reward
(two-player games: +1 win, -1 loss, 0 draw; GuessTheNumber: 1 when guessed, else how close the last
guess was). An episode cut at max_turns or the context limit forfeits with 0. Games run on their own
copy of Python's global `random` state (TextArena seeds and draws from the global one), so the same seed
gives the same game and the rest of the process is left alone.

Bridged games (each has a legal-move table here): GuessTheNumber-v0 (and -hardcore), one player;
TicTacToe-v0, ConnectFour-v0 (and -large), Nim-v0 (and -medium, -large), two players. Games that need
the network (NLTK corpus downloads, LLM judges or game masters over OpenRouter) are refused by name.
"""

from __future__ import annotations

import inspect
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from echo2sdk.adapters.contracts import Observation, ParsedAction, Transition
from echo2sdk.core import checks
from echo2sdk.errors import ConfigError, DependencyNotInstalled, NameNotFound
from echo2sdk.plugins import import_reference

__all__ = ["TextArenaPlugin", "TextArenaSandbox", "TextArenaSerializer", "BracketMoveRenderer", "GAMES", "NEEDS_NETWORK"]

OPPONENTS = ("random", "first")
INSTALL = 'pip install "echo2sdk[bridges]"'


class _Missing(DependencyNotInstalled):
    def __init__(self, package: str):
        Exception.__init__(self, f"{package} is not installed: run  {INSTALL}")
        self.package, self.extra = package, "bridges"


def _textarena() -> Any:
    try:
        import textarena
    except ImportError as e:
        raise _Missing(getattr(e, "name", None) or "textarena") from e
    return textarena


# -- legal moves per game (read from the unwrapped TextArena env) ----------------------------------------
def _guess_moves(env: Any) -> list[str]:
    return [f"[{n}]" for n in range(env.min_number, env.max_number + 1) if n not in env.guessed_numbers]


def _tictactoe_moves(env: Any) -> list[str]:
    board = env.state.game_state["board"]
    return [f"[{r * 3 + c}]" for r in range(3) for c in range(3) if board[r][c] == ""]


def _connect_four_moves(env: Any) -> list[str]:
    top = env.state.game_state["board"][0]
    return [f"[col {c}]" for c in range(env.num_cols) if top[c] == "."]


def _nim_moves(env: Any) -> list[str]:
    piles = env.state.game_state["piles"]
    return [f"[{i} {q}]" for i, n in enumerate(piles) for q in range(1, n + 1)]


@dataclass(frozen=True)
class Game:
    """A bridged TextArena game: its player count, its legal moves, and whether the prompt lists them
    (TicTacToe's board text already does; GuessTheNumber's prompt states the range)."""

    players: int
    moves: Callable[[Any], list[str]]
    list_moves: bool


GAMES: dict[str, Game] = {
    "GuessTheNumber-v0": Game(1, _guess_moves, False),
    "GuessTheNumber-v0-hardcore": Game(1, _guess_moves, False),
    "TicTacToe-v0": Game(2, _tictactoe_moves, False),
    "ConnectFour-v0": Game(2, _connect_four_moves, True),
    "ConnectFour-v0-large": Game(2, _connect_four_moves, True),
    "Nim-v0": Game(2, _nim_moves, True),
    "Nim-v0-medium": Game(2, _nim_moves, True),
    "Nim-v0-large": Game(2, _nim_moves, True),
}

_NLTK = "downloads NLTK corpora (nltk.download) when it is built"
_JURY = "its judge is an LLM jury called over OpenRouter"
_MASTER = "its game master is an LLM called over OpenRouter"
#: TextArena game families that cannot run offline, and why
NEEDS_NETWORK: dict[str, str] = {
    **dict.fromkeys(
        ("Wordle", "Hangman", "WordLadder", "WordChains", "WordSearch", "SpellingBee", "LetterAuction", "DontSayIt", "Codenames"),
        _NLTK,
    ),
    **dict.fromkeys(("Debate", "ScenarioPlanning"), _JURY),
    **dict.fromkeys(("TwentyQuestions", "GuessWho"), _MASTER),
}


def _family(game_id: str) -> str:
    return game_id.split("-v")[0]


# -- text in, move out ----------------------------------------------------------------------------------
class TextArenaSerializer:
    """`textarena_obs->text_v1`: the game's own words for the seat (state "text"), plus the legal moves
    when the game does not list them itself (state "moves")."""

    def system(self, env: str) -> str:
        return (
            f"You are playing the TextArena game {env.split('://')[-1]}. Each turn you get the game's messages; "
            "reply with your move in square brackets."
        )

    def user(self, observation: Observation, turn: int) -> str:
        text = str(observation.state.get("text", "")).strip()
        if observation.state.get("moves"):
            text += "\nLegal moves: " + ", ".join(observation.legal) + "."
        return text


_BRACKET = re.compile(r"\[([^\[\]\n]{1,40})\]")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_INT = re.compile(r"-?\d+")


def _key(move: str) -> tuple[int, ...]:
    return tuple(int(x) for x in _INT.findall(move))


class BracketMoveRenderer:
    """`textarena_action->text_v1` (also the plug-in's `action->text_v1`): the last `[...]` move of the reply,
    else an `<answer>` tag, else a short bare reply; matched to a legal move by its numbers. Never raises."""

    def instructions(self, legal: Sequence[str]) -> str:
        return "Reply with exactly one legal move in square brackets, as the game asks."

    def parse(self, text: str, legal: Sequence[str]) -> ParsedAction:
        if not isinstance(text, str):
            return ParsedAction(None, "unparsable")
        found = _BRACKET.findall(text)
        answer = found[-1] if found else None
        if answer is None and (tags := _ANSWER.findall(text)):
            answer = tags[-1].strip().strip("[]")
        if answer is None and 0 < len(text.strip()) <= 24:
            answer = text.strip()
        if answer is None or not _key(answer):
            return ParsedAction(None, "unparsable", (answer or text.strip())[:40])
        by_key = {_key(m): m for m in legal}
        move = by_key.get(_key(answer))
        return ParsedAction(move, "ok" if move is not None else "illegal", answer.strip()[:40])


# -- the sandbox ------------------------------------------------------------------------------------------
def _unwrap(env: Any) -> Any:
    """The game under TextArena's default wrappers: its observations come one message at a time."""
    while isinstance(env, _textarena().Wrapper):
        env = env.env
    return env


class TextArenaSandbox:
    """One TextArena game from the model seat's side; the other seat moves inside reset/step."""

    def __init__(self, game_id: str, options: Mapping[str, Any]):
        opts = dict(options)
        self.seat = int(opts.pop("seat", 0))
        self.opponent = opts.pop("opponent", "random")
        self.game_id, self.game = game_id, GAMES[game_id]
        self.env = _unwrap(_textarena().make(game_id, **opts))
        self.rng = random.Random(0)
        self._random: Any = None  # the game's own copy of the global random state
        self.total, self.steps, self.over, self.outcome = 0.0, 0, False, "running"

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run TextArena code on the game's copy of the global random state (TextArena seeds and draws
        from `random` itself); the process's own state is put back afterwards."""
        outer = random.getstate()
        if self._random is not None:
            random.setstate(self._random)
        try:
            return fn(*args)
        finally:
            self._random = random.getstate()
            random.setstate(outer)

    def reset(self, seed: int) -> Observation:
        self.rng, self._random = random.Random(seed), None
        self._call(self.env.reset, self.game.players, seed)
        self.total, self.steps, self.over, self.outcome = 0.0, 0, False, "running"
        obs = self._advance()
        if obs is None:
            raise ConfigError(f"textarena://{self.game_id}: the game ended before seat {self.seat} could move")
        return obs

    def _advance(self) -> Observation | None:
        """The other seat moves until the model's seat must decide (its Observation), or the game is over."""
        while not self.over:
            player, messages = self.env.get_observation()
            if player == self.seat:
                legal = tuple(self.game.moves(self.env))
                state = {"text": self._text(messages), "player": self.seat, "moves": self.game.list_moves}
                return Observation(state=state, legal=legal)
            moves = self.game.moves(self.env)
            move = moves[0] if self.opponent == "first" else self.rng.choice(moves)
            self.over, _ = self._call(self.env.step, move)
        return None

    def _text(self, messages: Sequence[tuple[int, str, Any]]) -> str:
        """The seat's new messages as TextArena's training wrapper (GameMessagesAndCurrentBoard) shows them: the
        rules (first turn), the game's messages (what each player did), then the current board; echoed player
        actions and admin notes are left out."""
        kinds = _textarena().ObservationType
        rules, said, board = [], [], None
        for _, message, kind in messages:
            text = str(message).strip()
            if kind == kinds.PROMPT:
                rules.append(text)
            elif kind == kinds.GAME_BOARD:
                board = text
            elif kind not in (kinds.PLAYER_ACTION, kinds.GAME_ADMIN) and text:
                said.append(text)
        return "\n\n".join([*rules, *said, *([board] if board else [])])

    def step(self, action: str) -> Transition:
        self.over, _ = self._call(self.env.step, action)
        self.steps += 1
        obs = self._advance()
        if obs is not None:
            return Transition(obs, 0.0)
        rewards = self.env.state.rewards or {}
        reward = float(rewards.get(self.seat, 0.0))
        self.total += reward
        self.outcome = str(self.env.state.game_info.get(self.seat, {}).get("reason", "over"))
        return Transition(None, reward)

    def fallback(self, observation: Observation) -> str:
        return observation.legal[0]

    def forfeit(self) -> float:
        self.outcome = "forfeit"
        return 0.0

    def summary(self) -> dict[str, Any]:
        return {"env_return": self.total, "env_steps": self.steps, "outcome": self.outcome[:200], "won": self.total >= 1.0}

    def close(self) -> None:
        self.env = None


class TextArenaPlugin:
    """The `textarena` scheme (entry point `echo2sdk.envs: textarena`)."""

    scheme = "textarena"
    default_serializer = "textarena_obs->text_v1"
    default_penalty = 0.1

    def env_ids(self) -> Sequence[str]:
        return sorted(GAMES)

    def check(self, env_id: str, options: Mapping[str, Any]) -> None:
        if (why := NEEDS_NETWORK.get(_family(env_id))) is not None:
            offline = ", ".join(GAMES)
            raise ConfigError(f"env = 'textarena://{env_id}' needs the network ({why}); the bridge plays offline games: {offline}")
        if env_id not in GAMES:
            ta = _textarena()
            if env_id in ta.envs.registration.ENV_REGISTRY:
                raise ConfigError(
                    f"env = 'textarena://{env_id}' is a TextArena game the bridge has no legal-move table for; "
                    f"bridged games: {', '.join(GAMES)}"
                )
            raise NameNotFound("textarena game", env_id, GAMES)
        self._check_options(env_id, dict(options))

    def _check_options(self, env_id: str, opts: dict[str, Any]) -> None:
        game, where = GAMES[env_id], f"textarena://{env_id} env_options"
        checks.integer(f"{where}.seat", opts.pop("seat", 0), lo=0, hi=game.players - 1, error=ConfigError)
        opponent = opts.pop("opponent", None)
        if opponent is not None and game.players == 1:
            raise ConfigError(f"{where}.opponent = {opponent!r}: {env_id} is a one-player game")
        if opponent is not None and opponent not in OPPONENTS:
            raise ConfigError(f"{where}.opponent = {opponent!r} must be one of {OPPONENTS}")
        spec = _textarena().envs.registration.ENV_REGISTRY[env_id]
        cls = import_reference(spec.entry_point)
        try:
            inspect.signature(cls).bind(**{**spec.kwargs, **opts})
        except TypeError as e:
            raise ConfigError(f"{where} = {opts!r} do not fit {cls.__name__}{inspect.signature(cls)}: {e}") from None

    def make(self, env_id: str, options: Mapping[str, Any]) -> TextArenaSandbox:
        return TextArenaSandbox(env_id, options)

    def components(self) -> Mapping[str, Mapping[str, Any]]:
        return _COMPONENTS


_RENDERER = BracketMoveRenderer()
_COMPONENTS: dict[str, Mapping[str, Any]] = {
    "serializer": {"textarena_obs->text_v1": TextArenaSerializer()},
    "action_renderer": {"action->text_v1": _RENDERER, "textarena_action->text_v1": _RENDERER},
}
