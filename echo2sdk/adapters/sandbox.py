"""SandboxAdapter: an interactive environment as an ECHO-2 data-plane adapter (paper appendix F).

    adapter = SandboxAdapter(
        env="poker://nlhe_6max_v1",              # the URL scheme picks the sandbox plug-in
        serializer="envstate->chat_prompt_v2",   # env state -> chat prompt
        action_renderer="action->text_v1",       # model text -> env action (fallback + penalty if malformed)
        reward_spec="episodic_return",           # step rewards -> the record's reward R_i
        metadata_spec="grpo:turn_mask+adv_norm", # Omega -> learner signals (turn masks, grouping)
    )
    echo.set(dataset=adapter.stream(mode="offline_or_live"))

Phase 1 (F.3), sandbox interaction: a rollout worker calls `start(task, i)` and drives the `Episode`:
each decision point is serialized as a user message, the model's reply is parsed by the action
renderer, the env (with its opponents) advances, and the step reward r_{i,t} is kept. Phase 2 (F.4):
the messages are (system, user state, assistant action, user state, ...). Phase 3 (F.5): the worker
(echo2sdk.core.episodes) tokenizes with the chat template, masks all but the assistant tokens, and
emits one record with R_i = reward_spec(r_{i,1..T}); the learner normalizes R_i within its group.

Offline logs: JSONL, one episode a line, `{"messages": [...], "reward": R}` (or `"rewards": [r_1..r_T]`,
optional `"group"`), e.g. written by `write_episode_log` from earlier records or by any other player.
They replay through the same worker path into the same records, flagged off-policy.

The adapter object is cheap and picklable-free: it keeps names and options only, and is rebuilt from
`spec()` in every worker process; the env plug-in and its sandboxes load lazily there.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from echo2sdk.adapters.contracts import Observation, Sandbox, StepResult
from echo2sdk.adapters.registry import load_env_plugin, parse_env, resolve_component
from echo2sdk.core import checks
from echo2sdk.core.contracts import Score, Task
from echo2sdk.errors import AdapterError, ConfigError

log = logging.getLogger(__name__)

__all__ = ["SandboxAdapter", "SandboxEpisode", "OfflineEpisode", "AdapterStream", "write_episode_log", "read_episode_log"]

MODES = ("live", "offline", "offline_or_live")


def _int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    return checks.integer(f"SandboxAdapter {name}", value, lo=lo, hi=hi, error=ConfigError)


class SandboxAdapter:
    """An env URL plus named components -> an EpisodicTaskAdapter (see the module docstring).

    env:               "scheme://id" (poker://nlhe_headsup_v1, gym://FrozenLake-v1, pettingzoo://tictactoe_v3)
    serializer:        env state -> chat prompt; default: the env plug-in's own
    action_renderer:   model text -> action name
    reward_spec:       "episodic_return" (sum of step rewards) or "per_step_mean"
    metadata_spec:     "grpo:turn_mask+adv_norm" (group by initial state) or "...@batch" (group by batch)
    env_options:       keyword options for the env plug-in (e.g. poker's opponent)
    max_turns:         decisions per episode before it is ended with the sandbox's forfeit outcome
    max_action_tokens: cap on tokens generated per decision (keeps episodes short and cheap)
    penalty:           subtracted from the step reward when the reply is malformed or illegal (the
                       sandbox's fallback action is played instead); default: the env plug-in's
    mode:              "live" (rollout workers play), "offline" (replay `logs`), "offline_or_live"
                       (replay `logs` first, if given, then play live)
    logs:              offline episode logs (JSONL paths)
    offline_group_size: episodes per group for log lines without a "group" field
    """

    def __init__(
        self,
        env: str,
        serializer: str | None = None,
        action_renderer: str = "action->text_v1",
        reward_spec: str = "episodic_return",
        metadata_spec: str = "grpo:turn_mask+adv_norm",
        *,
        env_options: Mapping[str, Any] | None = None,
        max_turns: int = 16,
        max_action_tokens: int | None = 16,
        penalty: float | None = None,
        mode: str = "live",
        logs: str | Sequence[str] | None = None,
        offline_group_size: int = 4,
    ):
        self.scheme, self.env_id = parse_env(env)
        self.env = env
        if env_options is not None and not isinstance(env_options, Mapping):
            raise ConfigError(f"SandboxAdapter: env_options = {env_options!r} must be a table of options")
        self.env_options = dict(env_options or {})
        self.plugin = load_env_plugin(self.scheme)
        self.plugin.check(self.env_id, self.env_options)
        self.serializer_name = serializer or self.plugin.default_serializer
        self.serializer = resolve_component("serializer", self.serializer_name, self.plugin)
        self.action_renderer_name = action_renderer
        self.renderer = resolve_component("action_renderer", action_renderer, self.plugin)
        self.reward_spec_name = reward_spec
        self.reward_spec = resolve_component("reward_spec", reward_spec, self.plugin)
        self.metadata_spec_name = metadata_spec
        self.metadata = resolve_component("metadata_spec", metadata_spec, self.plugin)
        self.warned_no_answer = False  # logged once: example turns the renderer cannot format
        for kind, obj, need in (
            ("serializer", self.serializer, ("system", "user")),
            ("action_renderer", self.renderer, ("instructions", "parse")),
        ):
            if missing := [m for m in need if not callable(getattr(obj, m, None))]:
                raise ConfigError(f"SandboxAdapter: {kind} {obj!r} lacks {missing}")
        if not callable(self.reward_spec):
            raise ConfigError(f"SandboxAdapter: reward_spec {reward_spec!r} is not callable")
        if getattr(self.metadata, "grouping", None) not in ("state", "batch"):
            raise ConfigError(f"SandboxAdapter: metadata_spec {metadata_spec!r} has no grouping 'state' or 'batch'")
        self.max_turns = _int("max_turns", max_turns, 1, 1024)
        self.max_action_tokens = None if max_action_tokens is None else _int("max_action_tokens", max_action_tokens, 1)
        if penalty is None:
            penalty = float(self.plugin.default_penalty)
        self.penalty = checks.real("SandboxAdapter penalty", penalty, lo=0, error=ConfigError)
        if mode not in MODES:
            raise ConfigError(f"SandboxAdapter: mode = {mode!r} must be one of {', '.join(MODES)}")
        self.mode = mode
        if isinstance(logs, (str, Path)):
            logs = [str(logs)]
        if logs is not None and (not isinstance(logs, (list, tuple)) or not all(isinstance(p, (str, Path)) for p in logs)):
            raise ConfigError(f"SandboxAdapter: logs = {logs!r} must be a path or a list of paths")
        self.logs = [str(p) for p in logs] if logs else None
        if mode == "offline" and not self.logs:
            raise ConfigError("SandboxAdapter: mode = 'offline' needs logs = [paths of JSONL episode logs]")
        self.offline_group_size = _int("offline_group_size", offline_group_size, 1)

    # -- identity: rebuilt from (name, options) in every worker process ---------------------------
    def options(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "serializer": self.serializer_name,
            "action_renderer": self.action_renderer_name,
            "reward_spec": self.reward_spec_name,
            "metadata_spec": self.metadata_spec_name,
            "env_options": dict(self.env_options),
            "max_turns": self.max_turns,
            "max_action_tokens": self.max_action_tokens,
            "penalty": self.penalty,
            "mode": self.mode,
            "logs": self.logs,
            "offline_group_size": self.offline_group_size,
        }

    def spec(self) -> tuple[str, dict[str, Any]]:
        """(adapter name, options) that rebuild an equal adapter: `load_adapter(*adapter.spec())`."""
        return "sandbox", self.options()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SandboxAdapter) and self.options() == other.options()

    def __repr__(self) -> str:
        return f"SandboxAdapter(env={self.env!r}, serializer={self.serializer_name!r}, mode={self.mode!r})"

    def stream(self, mode: str = "offline_or_live") -> AdapterStream:
        """The dataset handed to `Echo2.set(dataset=...)`: live episodes, replayed logs, or logs then live."""
        return AdapterStream(SandboxAdapter(**{**self.options(), "mode": mode}))

    # -- learner side: one Task per GRPO group --------------------------------------------------------
    def tasks(self, seed: int) -> Iterator[Task]:
        """Offline groups first (modes offline / offline_or_live with logs), then live groups (modes live /
        offline_or_live), endless. A live task carries the episode seed; its id is the group id."""
        offline: Iterable[Task] = ()
        if self.mode in ("offline", "offline_or_live") and self.logs:
            offline = self._offline_tasks(seed)
        live: Iterable[Task] = self._live_tasks(seed) if self.mode != "offline" else ()
        return itertools.chain(offline, live)

    def _live_tasks(self, seed: int) -> Iterator[Task]:
        rng = random.Random(f"{self.env}|{seed}")
        for index in itertools.count():
            info = {"env": self.env, "seed": rng.randrange(2**31), "grouping": self.metadata.grouping}
            yield Task(id=f"{self.scheme}-{seed}-{index}", messages=(), info=info)

    def _offline_tasks(self, seed: int) -> Iterator[Task]:
        groups: dict[str, list[dict[str, Any]]] = {}
        k = 0
        for path in self.logs or ():
            for where, ep in read_episode_log(path):
                tag = ep.get("group")
                if tag is None:
                    tag = f"{Path(path).name}#{k // self.offline_group_size}"
                    k += 1
                groups.setdefault(str(tag), []).append({"messages": ep["messages"], "rewards": ep["rewards"], "where": where})
        for index, (tag, episodes) in enumerate(groups.items()):
            yield Task(id=f"offline-{seed}-{index}", messages=(), info={"env": self.env, "offline": episodes, "group": tag})

    # -- worker side: one live episode ----------------------------------------------------------------
    def make_sandbox(self) -> Sandbox:
        return self.plugin.make(self.env_id, self.env_options)

    def episode_seed(self, task: Task, index: int) -> int:
        seed = int(task.info["seed"])
        if self.metadata.grouping == "batch":  # n different initial states share one group
            seed = random.Random(f"{seed}|{index}").randrange(2**31)
        return seed

    def start(self, task: Task, index: int) -> SandboxEpisode | OfflineEpisode:
        if "offline" in task.info:
            episodes = task.info["offline"]
            if index >= len(episodes):
                raise AdapterError(
                    f"offline group {task.info.get('group')!r} holds {len(episodes)} episodes; episode {index} was asked "
                    "for (set offline_group_size, or a 'group' field, to rollout.group_size episodes per group)"
                )
            return OfflineEpisode(self, episodes[index])
        return SandboxEpisode(self, self.make_sandbox(), self.episode_seed(task, index))


class SandboxEpisode:
    """A live episode: serializer -> model -> action renderer -> sandbox, with fallback and penalty."""

    def __init__(self, adapter: SandboxAdapter, sandbox: Sandbox, seed: int):
        self.adapter, self.sandbox, self.seed = adapter, sandbox, seed
        self.rewards: list[float] = []
        self.counts = {"illegal": 0, "unparsable": 0}
        self.turn = 1
        self.done = False
        self.aborted: str | None = None
        try:
            self.obs: Observation = sandbox.reset(seed)
            self._messages = (
                {"role": "system", "content": adapter.serializer.system(adapter.env)},
                *self._examples(),
                {"role": "user", "content": self._user(self.obs)},
            )
        except Exception:
            sandbox.close()
            raise

    def _examples(self) -> list[dict[str, str]]:
        """Optional worked turns (few-shot) before the first state: the serializer's own, else the sandbox's
        `example_turns()` ((Observation, action) pairs in its view under its options) rendered like every
        state, answered in the renderer's `answer(action)` format."""
        examples = getattr(self.adapter.serializer, "examples", None)
        if callable(examples):
            return examples(self.adapter.renderer)
        turns, answer = getattr(self.sandbox, "example_turns", None), getattr(self.adapter.renderer, "answer", None)
        if not callable(turns):
            return []
        if not callable(answer):
            if not self.adapter.warned_no_answer:
                self.adapter.warned_no_answer = True
                log.warning("%s: the env offers worked example turns but the action renderer %s has no answer(action) "
                            "to format them in: the prompt shows none", self.adapter.env,
                            type(self.adapter.renderer).__name__)
            return []
        out = []
        for obs, action in turns():
            out += [{"role": "user", "content": self._user(obs)}, {"role": "assistant", "content": answer(action)}]
        return out

    def _user(self, obs: Observation) -> str:
        return self.adapter.serializer.user(obs, self.turn) + "\n" + self.adapter.renderer.instructions(obs.legal)

    @property
    def messages(self) -> tuple[dict[str, str], ...]:
        return self._messages

    def step(self, response: str) -> StepResult:
        if self.done:
            raise AdapterError("step() on a finished episode")
        parsed = self.adapter.renderer.parse(response, self.obs.legal)
        action, penalty = parsed.action, 0.0
        if parsed.status != "ok" or action not in self.obs.legal:
            self.counts["illegal" if parsed.status == "illegal" else "unparsable"] += 1
            action, penalty = self.sandbox.fallback(self.obs), self.adapter.penalty
        tr = self.sandbox.step(action)
        reward = float(tr.reward) - penalty
        self.rewards.append(reward)
        info = {"action": action, "status": parsed.status, "answer": parsed.answer}
        if tr.observation is None:
            self.done = True
            return StepResult(None, reward, True, info)
        self.obs = tr.observation
        self.turn += 1
        return StepResult(self._user(self.obs), reward, False, info)

    def abort(self, reason: str) -> None:
        if not self.done:
            self.rewards.append(float(self.sandbox.forfeit()))
            self.done, self.aborted = True, reason

    def result(self) -> Score:
        ret = self.adapter.reward_spec(self.rewards)
        info: dict[str, Any] = dict(self.sandbox.summary())
        info.update(
            {
                "return": float(sum(self.rewards)),
                "illegal": self.counts["illegal"],
                "unparsable": self.counts["unparsable"],
                "fallbacks": self.counts["illegal"] + self.counts["unparsable"],
                "seed": self.seed,
            }
        )
        won = info.get("won")
        return Score(reward=float(ret), correct=bool(won) if isinstance(won, bool) else None, info=info)

    def close(self) -> None:
        self.sandbox.close()


class OfflineEpisode:
    """A logged episode replayed through the same worker path (its assistant turns are given, not sampled)."""

    def __init__(self, adapter: SandboxAdapter, episode: Mapping[str, Any]):
        self.adapter = adapter
        msgs = list(episode["messages"])
        start = 2 if msgs[0]["role"] == "system" else 1
        self._messages = tuple(msgs[:start])
        self._rest = msgs[start:]  # assistant, user, assistant, ...
        self._rewards = list(episode["rewards"])
        self._t = 0

    @property
    def messages(self) -> tuple[dict[str, str], ...]:
        return self._messages

    def next_response(self) -> str:
        return self._rest[2 * self._t]["content"]

    def step(self, response: str) -> StepResult:
        nxt = 2 * self._t + 1
        self._t += 1
        if nxt >= len(self._rest):
            return StepResult(None, 0.0, True)
        return StepResult(self._rest[nxt]["content"], 0.0, False)

    def abort(self, reason: str) -> None:
        pass

    def result(self) -> Score:
        return Score(reward=float(self.adapter.reward_spec(self._rewards)), info={"offline": True, "return": float(sum(self._rewards))})

    def close(self) -> None:
        pass


class AdapterStream:
    """What `SandboxAdapter.stream(mode)` returns: an adapter plus the spec that rebuilds it in workers.
    Iterating yields its tasks for seed 0 (one Task per GRPO group)."""

    def __init__(self, adapter: SandboxAdapter):
        self.adapter = adapter
        self.mode = adapter.mode

    def spec(self) -> tuple[str, dict[str, Any]]:
        return self.adapter.spec()

    def __iter__(self) -> Iterator[Task]:
        return self.adapter.tasks(0)

    def __repr__(self) -> str:
        return f"AdapterStream({self.adapter!r})"


# -- offline episode logs -----------------------------------------------------------------------------
def read_episode_log(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(file:line, {"messages", "rewards", "group"}) per episode; AdapterError naming file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise AdapterError(f"episode log {str(path)!r} does not exist or is not a file")
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise AdapterError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
            yield where, _episode(obj, where)


def _episode(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise AdapterError(f"{where}: expected a JSON object with 'messages' and 'reward', got {type(obj).__name__}")
    msgs = obj.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise AdapterError(f"{where}: field 'messages' = {msgs!r:.80} must be a non-empty list of chat messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or not isinstance(m.get("content"), str):
            raise AdapterError(f"{where}: messages[{i}] = {m!r:.80} must be {{'role': system|user|assistant, 'content': str}}")
    body = msgs[1:] if msgs[0]["role"] == "system" else msgs
    want = ["user" if i % 2 == 0 else "assistant" for i in range(len(body))]
    if [m["role"] for m in body] != want or len(body) < 2 or body[-1]["role"] != "assistant":
        raise AdapterError(
            f"{where}: field 'messages' must be [system], user, assistant, user, ..., assistant; got roles "
            f"{[m['role'] for m in msgs]}"
        )
    turns = len(body) // 2
    if "rewards" in obj:
        rewards = obj["rewards"]
        if not isinstance(rewards, list) or len(rewards) != turns or not all(checks.is_real(r) for r in rewards):
            raise AdapterError(f"{where}: field 'rewards' = {rewards!r:.80} must be {turns} finite numbers (one per turn)")
    elif "reward" in obj:
        if not checks.is_real(obj["reward"]):
            raise AdapterError(f"{where}: field 'reward' = {obj['reward']!r} must be a finite number")
        rewards = [0.0] * (turns - 1) + [float(obj["reward"])]
    else:
        raise AdapterError(f"{where}: missing field 'reward' (or 'rewards', one per turn)")
    return {"messages": msgs, "rewards": [float(r) for r in rewards], "group": obj.get("group")}


def write_episode_log(records: Iterable[Any], path: str | Path) -> int:
    """Append records (Trajectory objects of multi-turn episodes) to a JSONL episode log; returns the count.
    Failed episodes are skipped. The log replays with `SandboxAdapter(..., mode="offline", logs=[path])`."""
    n = 0
    with Path(path).open("a", encoding="utf-8") as fh:
        for t in records:
            if t.meta.extra.get("failed") or isinstance(t.prompt, str):
                continue
            msgs = [{"role": m.role, "content": m.content} for m in t.prompt]
            while msgs and msgs[-1]["role"] == "user":  # an episode cut at a limit ends on a state
                msgs.pop()
            if not any(m["role"] == "assistant" for m in msgs):
                continue
            fh.write(json.dumps({"group": t.meta.group_id, "messages": msgs, "reward": t.reward, "extra": t.meta.extra}) + "\n")
            n += 1
    return n
