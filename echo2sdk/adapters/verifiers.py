"""`verifiers://ENV`: an installed environment of the `verifiers` library as a task adapter.

    adapter = verifiers_adapter(env="verifiers://vf-echo2-arith", env_args={"num_problems": 64})
    # config: task.adapter = "verifiers", task.options = { env = "verifiers://vf-echo2-arith" }

The environment is what `verifiers.load_environment(ENV, **env_args)` returns (the module named after the
id, `vf-echo2-arith` -> `vf_echo2_arith`, with a `load_environment` function; the classic API of
verifiers 0.2: `SingleTurnEnv`, `MultiTurnEnv`, `Rubric`). Its dataset (`split` "train" or "eval") gives
the tasks, cycled with a fresh seeded shuffle each epoch; its rubric is the reward.

- A `SingleTurnEnv` becomes a single-turn `TaskAdapter`: a task's messages are the row's prompt;
  `score(task, response)` plays the env's own rollout with `response` as the model's reply and returns
  the rubric's weighted reward (`Score.correct`: reward >= the env's `pass_threshold`).
- A `MultiTurnEnv` becomes an `EpisodicTaskAdapter`: `start(task, i)` runs the env's rollout on a private
  event loop and pauses it wherever the env asks the model; each `step(reply)` resumes it, so the env's
  `env_response`, stop conditions (`is_completed`) and cleanup run exactly as verifiers runs them. The
  episode's reward is the rubric's, given at the last step. An episode cut short (turn or context limit)
  ends as verifiers ends a rollout whose prompt overflowed (`prompt_too_long`) and is scored as it stands.

Replies are free text: there is no action parsing, fallback or penalty here (the rubric judges the text).
Text chat only: environments with tools or group-level reward functions are refused with a ConfigError.
An opening prompt without a system message gets a one-line one (episodes open with system, then user).
Building an environment installs no signal handlers (verifiers would install SIGINT/SIGTERM handlers,
which fails outside the main thread, where rollout workers build their adapters).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import inspect
import itertools
import json
import random
import signal
import time
import types
from collections.abc import Iterator, Mapping
from typing import Any

from echo2sdk.adapters.registry import parse_env
from echo2sdk.core import checks
from echo2sdk.core.contracts import Score, StepResult, Task
from echo2sdk.errors import AdapterError, ConfigError, DependencyNotInstalled, NameNotFound

__all__ = ["verifiers_adapter", "VerifiersTaskAdapter", "VerifiersEpisodicAdapter", "VerifiersEpisode", "SCHEME"]

SCHEME = "verifiers"
#: verifiers 0.2.1's full requirements pin mcp<2, which vLLM (mcp>=2) rejects: its runtime needs are in the extra
INSTALL = 'pip install "echo2sdk[bridges]" && pip install --no-deps "verifiers==0.2.1"'
SPLITS = ("train", "eval")
MODEL = "echo2sdk"  # the model name verifiers records in a rollout's state


class _Missing(DependencyNotInstalled):
    def __init__(self, package: str, pip: str):
        Exception.__init__(self, f"{package} is not installed: run  {pip}")
        self.package, self.extra = package, "bridges"


def _verifiers() -> Any:
    try:
        import verifiers
    except ImportError as e:
        raise _Missing(getattr(e, "name", None) or "verifiers", INSTALL) from e
    try:
        verifiers.MultiTurnEnv, verifiers.SingleTurnEnv, verifiers.load_environment  # noqa: B018
    except AttributeError as e:  # 0.3 moved the classic API to verifiers.legacy, 0.4 dropped it
        raise _Missing(f"verifiers with SingleTurnEnv/MultiTurnEnv (found {verifiers.__version__}: {e})", INSTALL) from e
    return verifiers


def env_id(env: object) -> str:
    """'verifiers://vf-echo2-arith' (or a bare 'vf-echo2-arith') -> 'vf-echo2-arith'; ConfigError otherwise."""
    if isinstance(env, str) and "://" in env:
        scheme, ident = parse_env(env)
        if scheme == SCHEME:
            return ident
    elif isinstance(env, str) and env:
        return parse_env(f"{SCHEME}://{env}")[1]
    raise ConfigError(f"verifiers adapter: env = {env!r} must be 'verifiers://ENV_ID', e.g. 'verifiers://vf-echo2-arith'")


def installed_envs() -> list[str]:
    """Names of installed distributions that depend on verifiers (verifiers environment packages)."""
    from importlib.metadata import distributions

    names = set()
    for dist in distributions():
        if any(r.split(";")[0].strip().lower().startswith("verifiers") for r in dist.requires or ()):
            names.add(dist.metadata["Name"])
    return sorted(names)


# -- loading -------------------------------------------------------------------------------------------
_LOADED: dict[str, Any] = {}


@contextlib.contextmanager
def _no_signal_handlers() -> Iterator[None]:
    """verifiers' Environment.__post_init__ calls signal.signal(SIGINT/SIGTERM, ...): make that a no-op while
    an environment is built, so the process keeps its own handlers (and a non-main thread can build one)."""
    try:
        from verifiers.envs import environment as module
    except ImportError:
        yield
        return
    real = module.signal
    module.signal = types.SimpleNamespace(
        signal=lambda signum, handler: signal.getsignal(signum),
        SIGINT=signal.SIGINT,
        SIGTERM=signal.SIGTERM,
        default_int_handler=signal.default_int_handler,
    )
    try:
        yield
    finally:
        module.signal = real


def _network_cause(error: BaseException | None) -> BaseException | None:
    """The first error in the chain that says a download failed (no network here)."""
    seen = 0
    while error is not None and seen < 20:
        names = {c.__name__ for c in type(error).__mro__}
        if isinstance(error, ConnectionError | TimeoutError) or names & {
            "ConnectionError", "ConnectError", "ConnectTimeout", "ReadTimeout", "gaierror", "URLError",
            "OfflineModeIsEnabled", "LocalEntryNotFoundError", "HfHubHTTPError",
        }:
            return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def load_env(ident: str, env_args: Mapping[str, Any]) -> Any:
    """`verifiers.load_environment(ident, **env_args)`, once per process and arguments, with clear errors."""
    key = json.dumps([ident, dict(env_args)], sort_keys=True, default=repr)
    if key in _LOADED:
        return _LOADED[key]
    vf = _verifiers()
    name = ident.replace("-", "_").split("/")[-1]
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise _Missing(e.name or name, f"pip install {e.name}  (needed by verifiers environment {ident!r})") from e
        kind = f"verifiers environment (no module {name!r}: pip install the environment's package)"
        raise NameNotFound(kind, ident, installed_envs()) from None
    load = getattr(module, "load_environment", None)
    if not callable(load):
        raise ConfigError(f"env = 'verifiers://{ident}': module {name!r} has no load_environment()")
    try:
        inspect.signature(load).bind(**env_args)
    except TypeError as e:
        signature = f"{name}.load_environment{inspect.signature(load)}"
        raise ConfigError(f"verifiers://{ident}: env_args = {dict(env_args)!r} do not fit {signature}: {e}") from None
    try:
        with _no_signal_handlers():
            env = vf.load_environment(ident, **env_args)
    except Exception as e:  # noqa: BLE001 - verifiers wraps every failure in ValueError/RuntimeError
        if (cause := _network_cause(e)) is not None:
            raise ConfigError(
                f"env = 'verifiers://{ident}' needs the network to load ({type(cause).__name__}: {cause}); the bridge runs "
                "offline: use an environment whose dataset is built in memory or shipped with its package"
            ) from e
        raise AdapterError(f"verifiers://{ident}: load_environment failed: {type(e).__name__}: {e}") from e
    _check_env(vf, ident, env)
    _LOADED[key] = env
    return env


def _check_env(vf: Any, ident: str, env: Any) -> None:
    if not isinstance(env, vf.MultiTurnEnv):
        kind = type(env).__name__
        raise ConfigError(f"verifiers://{ident} is a {kind}; the bridge plays SingleTurnEnv and MultiTurnEnv environments")
    if env.tool_defs:
        names = [t.name for t in env.tool_defs]
        raise ConfigError(f"verifiers://{ident} calls tools {names}; the bridge plays text chat environments only")
    if env.rubric.has_group_rewards:
        raise ConfigError(f"verifiers://{ident}: its rubric has group reward functions; the bridge scores each rollout alone")


# -- one rollout, driven reply by reply ----------------------------------------------------------------
def _text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") if isinstance(p, Mapping) else getattr(p, "text", None) for p in content]
        return "\n".join(p for p in parts if isinstance(p, str))
    return "" if content is None else str(content)


def _chat(messages: Any) -> tuple[dict[str, str], ...]:
    """verifiers messages (dicts or pydantic models) -> echo2sdk chat messages {"role", "content"}."""
    out = []
    for m in messages:
        role = m.get("role") if isinstance(m, Mapping) else getattr(m, "role", None)
        content = m.get("content") if isinstance(m, Mapping) else getattr(m, "content", None)
        out.append({"role": str(role), "content": _text(content)})
    return tuple(out)


class _Turns:
    """`env.rollout(row)` (then its rubric) on a private event loop, paused wherever the env asks the model."""

    def __init__(self, env: Any, row: Mapping[str, Any]):
        self.env = env
        self.loop = asyncio.new_event_loop()
        self.asked: asyncio.Future = self.loop.create_future()
        self.reply: asyncio.Future | None = None
        self.rollout = self.loop.create_task(self._play(dict(row)))

    async def _play(self, row: dict[str, Any]) -> Any:
        state = await self.env.rollout(row, _client_class()(self._ask), MODEL)
        await self.env.rubric.score_rollout(state)
        await self.env.rubric.cleanup(state)
        return state

    async def _ask(self, prompt: Any) -> str:
        self.reply = self.loop.create_future()
        self.asked.set_result(prompt)
        return await self.reply

    def prompt(self) -> Any | None:
        """Run until the env asks the model (its prompt messages) or the rollout is scored (None)."""
        self.loop.run_until_complete(asyncio.wait([self.asked, self.rollout], return_when=asyncio.FIRST_COMPLETED))
        if not self.asked.done():
            return None
        prompt, self.asked = self.asked.result(), self.loop.create_future()
        return prompt

    def answer(self, text: str) -> Any | None:
        """Hand the model's reply to the waiting env; the env's next prompt, or None when the rollout is over."""
        assert self.reply is not None and not self.reply.done()
        self.reply.set_result(text)
        return self.prompt()

    def truncate(self) -> None:
        """End a rollout that waits for a reply as verifiers ends one whose prompt overflowed, and score it."""
        if self.reply is not None and not self.reply.done() and not self.rollout.done():
            self.reply.set_exception(_verifiers().OverlongPromptError("echo2sdk: the episode was cut at a turn or context limit"))
            self.prompt()

    def state(self) -> Any:
        if not self.rollout.done():
            raise AdapterError("verifiers rollout is still running: result() before the episode ended")
        return self.rollout.result()

    def close(self) -> None:
        if self.loop.is_closed():
            return
        if not self.rollout.done():
            self.rollout.cancel()
            self.loop.run_until_complete(asyncio.gather(self.rollout, return_exceptions=True))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


@functools.cache
def _client_class() -> type:
    """A verifiers Client whose "model" is `ask(prompt) -> reply text`: the echo2sdk worker, reply by reply."""
    from verifiers.clients.client import Client
    from verifiers.types import Response, ResponseMessage

    class StepClient(Client):
        def __init__(self, ask: Any):
            super().__init__(None)
            self.ask = ask

        def setup_client(self, config: Any) -> None:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
            return messages, {}

        async def get_native_response(self, prompt: Any, model: str, sampling_args: Any, tools: Any = None, **kw: Any) -> str:
            return await self.ask(prompt)

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: str) -> Any:
            message = ResponseMessage(content=response, finish_reason="stop", is_truncated=False)
            return Response(id=f"echo2sdk-{time.monotonic_ns()}", created=int(time.time()), model=MODEL, message=message)

        async def close(self) -> None:
            return None

    return StepClient


def _score(env: Any, state: Any, **extra: Any) -> Score:
    reward = float(state.get("reward") or 0.0)
    metrics = (state.get("metrics") or {}).items()
    info: dict[str, Any] = {f"metric.{k}": float(v) for k, v in metrics if checks.is_real(v)}
    info.update(stop_condition=str(state.get("stop_condition")), truncated=bool(state.get("is_truncated")), **extra)
    if state.get("error") is not None:
        info["env_error"] = f"{type(state['error']).__name__}: {state['error']}"[:300]
    return Score(reward=reward, correct=reward >= float(env.pass_threshold), info=info)


# -- the adapters -----------------------------------------------------------------------------------------
class _Source:
    """The loaded env, its dataset, and the options that rebuild it (shared by both adapter kinds)."""

    def __init__(self, env: str, env_args: Mapping[str, Any] | None, split: str):
        self.id = env_id(env)
        self.url = f"{SCHEME}://{self.id}"
        if env_args is not None and not isinstance(env_args, Mapping):
            raise ConfigError(f"verifiers://{self.id}: env_args = {env_args!r} must be a table of load_environment arguments")
        self.env_args = dict(env_args or {})
        if split not in SPLITS:
            raise ConfigError(f"verifiers://{self.id}: split = {split!r} must be one of {SPLITS}")
        self.split = split
        self.env = load_env(self.id, self.env_args)
        try:
            self.dataset = self.env.get_dataset() if split == "train" else self.env.get_eval_dataset()
        except ValueError as e:
            raise ConfigError(f"verifiers://{self.id}: split = {split!r} has no dataset ({e})") from None
        if len(self.dataset) == 0:
            raise ConfigError(f"verifiers://{self.id}: the {split} dataset is empty")

    def options(self) -> dict[str, Any]:
        return {"env": self.url, "env_args": dict(self.env_args), "split": self.split}

    def tasks(self, seed: int, opening: Any) -> Iterator[Task]:
        """The dataset cycled with a fresh seeded shuffle each epoch; ids f"{seed}-{index}", info["row"] the row."""
        rng = random.Random(f"{self.url}|{seed}")
        index = itertools.count()
        for epoch in itertools.count():
            order = list(range(len(self.dataset)))
            rng.shuffle(order)
            for k in order:
                row = self.dataset[k]
                info = {"env": self.url, "row": k, "example_id": row.get("example_id", k), "epoch": epoch}
                answer = "" if row.get("answer") is None else str(row["answer"])
                yield Task(id=f"{seed}-{next(index)}", messages=opening(row), answer=answer, info=info)

    def row(self, task: Task) -> dict[str, Any]:
        k = task.info.get("row") if isinstance(task.info, Mapping) else None
        if not isinstance(k, int) or not 0 <= k < len(self.dataset):
            raise AdapterError(f"{self.url}: task {task.id!r} has info.row = {k!r}, not a row of the {self.split} dataset")
        return dict(self.dataset[k])

    def prompt(self, row: Mapping[str, Any]) -> tuple[dict[str, str], ...]:
        return _chat(row.get("prompt") or ())


class VerifiersTaskAdapter:
    """A verifiers SingleTurnEnv as a single-turn TaskAdapter (see the module docstring)."""

    def __init__(self, env: str, env_args: Mapping[str, Any] | None = None, split: str = "train"):
        self.source = _Source(env, env_args, split)
        if not isinstance(self.source.env, _verifiers().SingleTurnEnv):
            kind = type(self.source.env).__name__
            raise ConfigError(f"{self.source.url} is multi-turn ({kind}): use verifiers_adapter() or VerifiersEpisodicAdapter")

    def spec(self) -> tuple[str, dict[str, Any]]:
        return SCHEME, self.source.options()

    def __repr__(self) -> str:
        return f"VerifiersTaskAdapter(env={self.source.url!r})"

    def tasks(self, seed: int) -> Iterator[Task]:
        return self.source.tasks(seed, self.source.prompt)

    def score(self, task: Task, response: str) -> Score:
        """The env's own rollout with `response` as the reply, scored by its rubric. Never raises on the reply."""
        turns = _Turns(self.source.env, self.source.row(task))
        try:
            if turns.prompt() is not None:
                turns.answer(response if isinstance(response, str) else "")
            return _score(self.source.env, turns.state())
        finally:
            turns.close()


class VerifiersEpisodicAdapter:
    """A verifiers MultiTurnEnv as an EpisodicTaskAdapter: one Task per dataset row and GRPO group."""

    def __init__(
        self,
        env: str,
        env_args: Mapping[str, Any] | None = None,
        split: str = "train",
        max_turns: int | None = None,
        max_action_tokens: int | None = None,
    ):
        self.source = _Source(env, env_args, split)
        own = int(getattr(self.source.env, "max_turns", -1) or -1)
        if max_turns is None:
            max_turns = own if own > 0 else 16
        self.max_turns = checks.integer(f"{self.source.url} max_turns", max_turns, lo=1, hi=1024, error=ConfigError)
        self.max_action_tokens = None
        if max_action_tokens is not None:
            where = f"{self.source.url} max_action_tokens"
            self.max_action_tokens = checks.integer(where, max_action_tokens, lo=1, error=ConfigError)

    def spec(self) -> tuple[str, dict[str, Any]]:
        return SCHEME, {**self.source.options(), "max_turns": self.max_turns, "max_action_tokens": self.max_action_tokens}

    def __repr__(self) -> str:
        return f"VerifiersEpisodicAdapter(env={self.source.url!r}, max_turns={self.max_turns})"

    def tasks(self, seed: int) -> Iterator[Task]:
        return self.source.tasks(seed, self.opening)

    def opening(self, row: Mapping[str, Any]) -> tuple[dict[str, str], ...]:
        """The row's prompt, with a one-line system message first when it has none."""
        msgs = self.source.prompt(row)
        if not msgs or msgs[0]["role"] != "system":
            default = f"You are in the verifiers environment {self.source.id!r}. Reply to each message."
            line = self.source.env.system_prompt or default
            msgs = ({"role": "system", "content": line}, *msgs)
        return msgs

    def start(self, task: Task, index: int) -> VerifiersEpisode:
        return VerifiersEpisode(self, self.source.row(task))


class VerifiersEpisode:
    """One MultiTurnEnv rollout, driven by the worker reply by reply (see `_Turns`)."""

    def __init__(self, adapter: VerifiersEpisodicAdapter, row: Mapping[str, Any]):
        self.env = adapter.source.env
        self._messages = adapter.opening(row)
        self._turns = _Turns(self.env, row)
        self.done = self._turns.prompt() is None  # an env may end before the model speaks
        self.steps = 0

    @property
    def messages(self) -> tuple[dict[str, str], ...]:
        return self._messages

    def step(self, response: str) -> StepResult:
        if self.done:
            raise AdapterError("step() on a finished verifiers episode")
        self.steps += 1
        prompt = self._turns.answer(response if isinstance(response, str) else "")
        if prompt is None:
            self.done = True
            return StepResult(None, float(self._turns.state().get("reward") or 0.0), True)
        msgs = _chat(prompt)
        last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=-1)
        text = "\n\n".join(m["content"] for m in msgs[last + 1 :]) or "(no reply from the environment)"
        return StepResult(text, 0.0, False)

    def abort(self, reason: str) -> None:
        if not self.done:
            self._turns.truncate()
            self.done = True

    def result(self) -> Score:
        return _score(self.env, self._turns.state(), turns=self.steps)

    def close(self) -> None:
        self._turns.close()


def verifiers_adapter(env: str, env_args: Mapping[str, Any] | None = None, split: str = "train", **options: Any) -> Any:
    """The adapter for `verifiers://ENV` (entry point `echo2sdk.adapters: verifiers`): a VerifiersTaskAdapter
    for a SingleTurnEnv, a VerifiersEpisodicAdapter (options max_turns, max_action_tokens) for a MultiTurnEnv."""
    if env_args is not None and not isinstance(env_args, Mapping):
        raise ConfigError(f"{SCHEME}://{env_id(env)}: env_args = {env_args!r} must be a table of load_environment arguments")
    if isinstance(load_env(env_id(env), dict(env_args or {})), _verifiers().SingleTurnEnv):
        if options:
            raise ConfigError(f"{SCHEME}://{env_id(env)} is single-turn: options {sorted(options)} apply to multi-turn ones only")
        return VerifiersTaskAdapter(env, env_args, split)
    unknown = sorted(set(options) - {"max_turns", "max_action_tokens"})
    if unknown:
        known = "env, env_args, split, max_turns, max_action_tokens"
        raise ConfigError(f"{SCHEME}://{env_id(env)}: unknown options {unknown}; known: {known}")
    return VerifiersEpisodicAdapter(env, env_args, split, **options)
