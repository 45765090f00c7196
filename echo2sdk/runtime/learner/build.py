"""Builders: a `Config` turned into the flat arguments each part of the run takes (torchtune: configs stay out
of classes). The recipe (recipe.py) calls them; tests bind them to the constructors they feed."""

from __future__ import annotations

from typing import Any

from echo2sdk.config import Config
from echo2sdk.core import lr_schedule
from echo2sdk.core.prompt_filter import PromptFilter
from echo2sdk.runtime.broadcast.delivery import DirectPush, SnapshotDelivery
from echo2sdk.runtime.broadcast.store import SnapshotStore, run_url
from echo2sdk.runtime.protocol.messages import StoreInfo, WorkerConfig
from echo2sdk.runtime.trust.credentials import check_token, given_token
from echo2sdk.runtime.trust.plugin_policy import allowances
from echo2sdk.runtime.trust.store_policy import store_allowances
from echo2sdk.runtime.trust.worker_keys import Revocations

__all__ = [
    "learner_args", "buffer_args", "worker_config", "coordinator_args", "delivery", "coordinator_tls", "run_token",
]


def learner_args(cfg: Config) -> dict[str, Any]:
    """Keyword arguments of `Learner(model_path, **learner_args(cfg))`."""
    L = cfg.learner
    return dict(
        trust_remote_code=cfg.model.trust_remote_code,
        lr=L.lr,
        beta=L.beta,
        epsilon=L.epsilon,
        epsilon_high=L.epsilon_high,
        is_cap=L.is_cap,
        importance_weight=L.importance_weight,
        loss_type=L.loss_type,
        scale_rewards=L.advantages_scaled,
        max_completion_length=cfg.rollout.max_new_tokens,
        updates_per_step=L.updates_per_step,
        lr_scheduler=L.lr_scheduler,
        warmup_steps=lr_schedule.warmup_steps(L.steps, L.warmup_steps, L.warmup_ratio),
        total_steps=L.steps,
        adv_eps=L.adv_eps,
        grad_clip=L.grad_clip,
        micro_batch=L.micro_batch,
        precision=L.precision,
        temperature=cfg.rollout.temperature,
        weight_decay=L.weight_decay,
        reference=cfg.model.reference,
        threads=L.threads,
        seed=cfg.run.seed,
        gradient_checkpointing=L.gradient_checkpointing,
        token_budget=L.token_budget or None,
    )


def mixture_names(adapter: str, options: dict[str, Any]) -> list[str]:
    """A mixture's component names as the metrics count them (adapters.mixture), without loading the components;
    [] for any other adapter (task names are then counted as they come, at most MAX_TASKS)."""
    from echo2sdk.adapters.mixture import MIXTURE, part_name

    mix = options.get("mix") if adapter == MIXTURE else None
    return [part_name(p) for p in mix if isinstance(p, dict) and isinstance(p.get("adapter"), str)] \
        if isinstance(mix, list) else []


def buffer_args(cfg: Config) -> dict[str, Any]:
    """Keyword arguments of `StalenessBuffer(**buffer_args(cfg))`: S, the group size n, the order, the
    intake's reward bound, dynamic sampling (zero-variance groups filtered; the fallback after patience x k),
    and the per-worker bounds: k x (S + 1) groups, what the learner can train on before they go stale, and as many
    max-length records' bytes; workers under the shared token hold at most max(4, local + standby workers) times
    that together (per-worker credentials each have their own)."""
    L = cfg.learner
    k = L.trajectories_per_step // cfg.rollout.group_size  # groups per step
    groups = k * (L.staleness + 1)
    per_worker = groups * cfg.rollout.group_size * record_budget(L.max_len)
    token_workers = max(4, cfg.rollout.workers + cfg.scheduler.standby)
    return dict(staleness=L.staleness, group_size=cfg.rollout.group_size, order=L.order, reward_bound=L.reward_bound,
                filter_zero_variance=L.filter_zero_variance, fallback_after=L.filter_patience * k,
                groups_per_worker=groups, bytes_per_worker=per_worker, bytes_per_pool=per_worker * token_workers,
                task_names=mixture_names(cfg.task.adapter, cfg.task.options))


def prompt_filter(cfg: Config) -> PromptFilter | None:
    """The pre-rollout prompt filter learner.prompt_skip asks for (core/prompt_filter.py), seeded from run.seed;
    None when off."""
    L = cfg.learner
    if not L.prompt_skip:
        return None
    return PromptFilter(target=L.prompt_skip_target, explore=L.prompt_skip_explore,
                        min_explore=L.prompt_skip_min_explore, eta=L.prompt_skip_eta, max_prompts=L.prompt_skip_memory,
                        seed=cfg.run.seed)


def record_budget(max_len: int) -> int:
    """Bytes one honest record of at most `max_len` tokens takes held (records.held_bytes): its ids and log-probs
    (36 + 32 bytes a token), ~8 characters of text a token in each of prompt and response, and the overhead;
    the per-worker byte budget is k x (S + 1) groups of such records (docs/security.md)."""
    return 96 * max_len + 2048


def worker_config(cfg: Config, model_path: str) -> WorkerConfig:
    """What the coordinator hands every worker that joins, typed and complete: model, task, backend, sampling,
    the learner's length limit, the heartbeat period and S (a worker that knows a snapshot more than S versions
    ahead of its own waits for it). The one place a worker's config is built."""
    ro = cfg.rollout
    return WorkerConfig.from_mapping({
        "model": cfg.model.policy,
        "model_path": model_path,
        "adapter": cfg.task.adapter,
        "adapter_options": cfg.task.options,
        "backend": ro.backend,
        "backend_options": ro.backend_options,
        "group_size": ro.group_size,
        "tasks_per_request": ro.tasks_per_request,
        "sampling": {"max_new_tokens": ro.max_new_tokens, "temperature": ro.temperature, "top_p": ro.top_p,
                     "top_k": ro.top_k, "min_p": ro.min_p},
        "max_prompt_length": ro.max_prompt_length,
        "max_len": cfg.learner.max_len,
        "heartbeat_s": cfg.run.heartbeat_s,
        "staleness": cfg.learner.staleness,  # S
    })


def coordinator_args(cfg: Config, token: str, signing_key: Any = None) -> dict[str, Any]:
    """The Coordinator's address, liveness and delivery arguments (setup adds buffer, tasks and the model's
    facts). `signing_key`: the Ed25519 private key of the chain broadcast's manifests (default: a new one)."""
    run = cfg.run
    sends = delivery(cfg, token, signing_key)
    return dict(
        max_len=cfg.learner.max_len,
        token=token,
        host=run.host,
        port=run.port,
        heartbeat_s=run.heartbeat_s,
        worker_timeout_s=run.worker_timeout_s,
        delivery=sends,
        revoked=Revocations(run.revoked_workers, run.revoked_file),
        store=snapshot_store(cfg, getattr(sends, "signer", None)),
    )


def snapshot_store(cfg: Config, signer: Any) -> SnapshotStore | None:
    """The run's snapshot store (broadcast.store), opened in the run's own folder (named by its signing key);
    None without one."""
    b = cfg.broadcast
    if not b.store:
        return None
    assert signer is not None  # config: a store needs the chain broadcast, whose key signs its manifests
    return SnapshotStore(run_url(b.store, signer.public_key), b.store_options, keep_chains=b.store_keep,
                         metadata=b.store_metadata)


def worker_allowances(cfg: Config, coordinator: Any) -> list[str]:
    """The `--allow-plugin` values the learner's own workers get: what its operator configured (the plug-ins and
    options of the worker config, the snapshot store's settings: runtime/trust/)."""
    b = cfg.broadcast
    # what a worker judges of the store is its scheme and options, not the run's folder under it (named by a key)
    store = StoreInfo(url=b.store if "://" in b.store else "file://" + b.store, options=b.store_options) if b.store else None
    return sorted({*allowances(coordinator.worker_config), *store_allowances(store, b.store_metadata)})


def delivery(cfg: Config, token: str, signing_key: Any = None) -> SnapshotDelivery:
    """The snapshot delivery the config asks for (paper §4.2): the direct push, or chain/star broadcast."""
    b = cfg.broadcast
    if b.topology == "direct":
        return DirectPush()
    from echo2sdk.core.broadcast.manifest import Signer
    from echo2sdk.runtime.broadcast.chain import ChainBroadcast

    uplink = b.uplink_mbps * 1e6 / 8 if b.shape_uplink and b.uplink_mbps else None
    return ChainBroadcast(
        token,
        topology=b.topology,
        n_chains=b.chains(),
        chunk_bytes=int(b.chunk_mib * (1 << 20)),
        host=cfg.run.host,
        uplink_bps=uplink,
        stall_timeout_s=b.stall_timeout_s,
        min_relay_bps=b.min_relay_mbps * 1e6 / 8,
        signer=Signer(signing_key) if signing_key is not None else None,
        tls=cfg.run.tls,  # the learner's relay port: TLS, or plaintext with run.tls = false
        relay_key_lookahead=cfg.kappa,  # the next publication's relay key goes out with each plan
        deltas=b.delta,
    )


def coordinator_tls(cfg: Config, kept: dict[str, bytes]) -> dict[str, Any]:
    """The Coordinator's `tls` argument: False with run.tls = false; the certificate of run.tls_dir; else the one
    a checkpoint kept (workers that pinned it re-join the resumed run); empty: one made for this run."""
    from echo2sdk.runtime.trust.tls import Identity

    if not cfg.run.tls:
        return {"tls": False}
    if cfg.run.tls_dir:
        return {"tls": Identity.load(cfg.run.tls_dir)}
    if "tls-key.pem" not in kept or "tls-cert.pem" not in kept:
        return {}
    return {"tls": Identity(kept["tls-cert.pem"], kept["tls-key.pem"])}


def run_token(cfg: Config) -> str | None:
    """The token the user gave the run (run.token, run.token_file, $ECHO2_TOKEN), at least 128 bits; None: none."""
    given = given_token(cfg.run.token, cfg.run.token_file)
    return check_token(*given) if given else None
