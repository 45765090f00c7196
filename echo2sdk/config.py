"""Run configuration: pydantic models loaded from TOML. Unknown keys are errors that name the key."""

from __future__ import annotations

import difflib
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from echo2sdk.core import checks
from echo2sdk.core.tokens import check_token
from echo2sdk.errors import CapacityError, ConfigError

__all__ = [
    "Config",
    "ModelConfig",
    "TaskConfig",
    "RolloutConfig",
    "LearnerConfig",
    "SchedulerConfig",
    "ProvisioningConfig",
    "RunConfig",
    "load_config",
    "key_values",
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Section):
    policy: str = Field(
        "smollm2-135m", description="model name (smollm2-135m, tiny-random), local HF folder, or hub id org/name"
        "[@revision] (from the Hugging Face cache; downloaded unless HF_HUB_OFFLINE=1)"
    )
    reference: bool = Field(True, description="keep a frozen reference policy for the KL term (used when beta > 0)")
    trust_remote_code: bool = Field(
        False, description="let the learner run the model folder's own Python (its config's auto_map); workers "
        "decide for themselves (echo2 worker --allow-plugin trust_remote_code)"
    )


class TaskConfig(_Section):
    """`[task]`: one adapter and its options, or `[[task.mix]]` tables (adapter, weight, options, name): a mixture
    drawn by weight per task (echo2sdk.adapters.mixture), which is `adapter = "mixture"` with `options.mix`."""

    adapter: str = Field(
        "math", description="data-plane adapter: a registered name (math, mixture, ...), a URL "
        "(reasoning-gym://NAME, dataset://PATH, poker://ID, ...) or 'pkg.mod:Class'"
    )
    options: dict[str, Any] = Field(default_factory=dict, description="keyword options for the adapter")

    @model_validator(mode="before")
    @classmethod
    def _mix(cls, data: Any) -> Any:
        """[[task.mix]] -> adapter = "mixture", options = {mix = [...]} (what a dumped config holds)."""
        if not isinstance(data, dict) or "mix" not in data:
            return data
        data = dict(data)
        mix = data.pop("mix")
        if data.get("adapter", "mixture") != "mixture" or data.get("options"):
            raise ValueError(f"task.mix is a mixture of adapters: it replaces task.adapter ({data.get('adapter')!r}) "
                             f"and task.options; give each component's adapter and options in its [[task.mix]] table")
        return {**data, "adapter": "mixture", "options": {"mix": mix}}


class RolloutConfig(_Section):
    backend: str = Field(
        "hf", description="inference backend registered in group echo2sdk.backends: hf, vllm, sglang, openai"
    )
    backend_options: dict[str, Any] = Field(default_factory=dict, description="keyword options for the backend")
    workers: int = Field(2, ge=0, description="local worker processes the run starts (0: only remote workers)")
    group_size: int = Field(4, ge=2, description="n: samples per prompt (one GRPO group)")
    tasks_per_request: int = Field(2, ge=1, description="prompts a worker pulls and generates in one batch")
    max_new_tokens: int = Field(96, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="sample among the k most likely tokens only (0: off)")
    min_p: float = Field(
        0.0, ge=0, le=1, description="drop tokens less likely than min_p times the most likely one (0: off)"
    )
    max_prompt_length: int | None = Field(
        None, ge=1, description="prompts longer than this many tokens are truncated from the left at the worker "
        "(TRL's rule) and counted (task.prompt_truncated in the metrics); None: never"
    )
    threads: int = Field(1, ge=1, description="torch threads per local worker process")
    nice: int | Literal["idle"] = Field(
        "idle",
        description="CPU priority of local workers beside the learner: 'idle' (Linux SCHED_IDLE: a worker runs only "
        "on cores the learner leaves idle, so its update runs at full speed; nice 19 where there is none), or a "
        "niceness 0-19 (0 = equal priority; runtime/worker/priority.py)",
    )

    @field_validator("nice", mode="before")
    @classmethod
    def _check_nice(cls, v: object) -> int | str:
        try:
            return checks.nice(v)
        except ValueError as e:
            raise ValueError(f"rollout.{e}") from None

    @model_validator(mode="after")
    def _check_backend(self) -> RolloutConfig:
        from echo2sdk.backends import backend_problem

        if (problem := backend_problem(self.backend, self.workers)) is not None:
            raise ValueError(problem)
        return self


class LearnerConfig(_Section):
    steps: int = Field(40, ge=1, description="learner updates to run")
    trajectories_per_step: int = Field(32, ge=2, description="R: trajectories consumed per learner step")
    staleness: int = Field(3, ge=2, description="S: admit only v >= v_t - S")
    kappa: int | None = Field(None, ge=1, description="publish every kappa steps (default S - 1)")
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    beta: float = Field(0.0, ge=0, description="KL coefficient to the reference policy")
    loss_type: Literal["grpo", "dr_grpo", "dapo"] = Field(
        "dapo", description="how per-token losses are averaged (docs/recipes.md): grpo: per sequence, then over "
        "sequences; dr_grpo: sum / (sequences * rollout.max_new_tokens); dapo: over every loss token of the batch"
    )
    epsilon: float = Field(0.2, gt=0, description="eps_low: the clipped ratio's lower bound is 1 - epsilon")
    epsilon_high: float | None = Field(
        None, gt=0, description="eps_high: the upper bound is 1 + epsilon_high (DAPO's clip-higher; default epsilon)"
    )
    updates_per_step: int = Field(
        2, ge=1, description="optimizer updates per learner step on its batch, all against the step's pi_old "
        "(the paper: two), so the clip acts from the second on"
    )
    scale_rewards: bool | None = Field(
        None, description="divide group advantages by the group's reward std (default: true, false for dr_grpo)"
    )
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="learning-rate schedule over learner.steps (after the warm-up)"
    )
    warmup_steps: int = Field(0, ge=0, description="learner steps of linear warm-up (overrides warmup_ratio)")
    warmup_ratio: float = Field(0.0, ge=0, le=1, description="warm-up as a fraction of learner.steps")
    filter_zero_variance: bool = Field(
        True, description="dynamic sampling (DAPO): a group whose members all got the same reward (no advantage) "
        "is not trained on; the step waits for informative groups (groups_filtered in metrics.jsonl)"
    )
    filter_patience: int = Field(
        4, ge=0, description="a step that has seen filter_patience x R/n zero-variance groups filtered while it "
        "waits fills its batch with the newest of them (0: wait for informative groups only; "
        "learner.data_timeout_s ends a run that gets none)"
    )
    prompt_skip: bool = Field(
        False, description="pre-rollout prompt skipping (docs/recipes.md, 'Prompt skipping'): a prompt whose "
        "recent groups were all one reward is skipped before it is handed out, with probability 1 - p_explore ** "
        "(its streak of such groups); p_explore adapts toward learner.prompt_skip_target"
    )
    prompt_skip_target: float = Field(
        0.25, ge=0, le=1, description="the share of zero-variance groups among those generated that prompt skipping "
        "steers toward (lower: skip more)"
    )
    prompt_skip_explore: float = Field(0.5, gt=0, le=1, description="p_explore at the start of the run")
    prompt_skip_min_explore: float = Field(
        0.05, gt=0, le=1, description="p_explore never goes below this: a prompt with a streak z is still handed out "
        "with probability at least this ** z"
    )
    prompt_skip_eta: float = Field(0.02, ge=0, le=1, description="p_explore's step per group observed")
    prompt_skip_memory: int = Field(
        100_000, ge=1, description="prompts whose history is kept (the least recently seen forgotten first)"
    )
    max_wait_s: float | None = Field(
        None, gt=0, description="a step that has waited this long for its R/n informative groups trains on the "
        "ones it has (at least learner.min_groups; with loss_type dapo the loss is a mean over loss tokens, so a "
        "smaller batch keeps its scale); none: wait for R (the paper's Algorithm 1)"
    )
    min_groups: int = Field(1, ge=1, description="the fewest groups a step trains on after learner.max_wait_s")
    partial_lr: Literal["sqrt", "linear", "none"] = Field(
        "sqrt", description="the learning rate of a step on m of its k = R/n groups (learner.max_wait_s): lr x "
        "sqrt(m/k) (after Adam's square-root scaling rule), lr x m/k (linear) or lr (none)"
    )
    is_cap: float = Field(2.0, gt=0, description="C: truncation of min(pi_old / pi_sampler, C)")
    importance_weight: bool = Field(
        True, description="multiply each token's loss by w_t = min(pi_old / pi_sampler, C), the correction for "
        "the sampler's staleness; false: w_t = 1 (an ablation, bench/staleness.py)"
    )
    adv_eps: float = Field(1e-4, gt=0, description="eps in (R_i - mean_G) / (std_G + eps)")
    grad_clip: float = Field(1.0, gt=0)
    micro_batch: int = Field(8, ge=1, description="sequences per forward/backward (gradient accumulation)")
    precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto",
        description="bf16 autocast for forward/backward; auto = on CUDA, and on CPUs with native bf16 "
        "(AVX512-BF16/AMX). On AVX2-only CPUs bf16 backward is ~20x slower than fp32 (measured), so auto picks fp32",
    )
    threads: int | None = Field(None, ge=1, description="torch threads in the learner (default: all cores)")
    max_len: int = Field(1024, ge=8, description="longest prompt + response admitted, in tokens")
    order: Literal["fifo", "freshest"] = Field("fifo", description="which admissible groups are sampled first")
    snapshot_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    data_timeout_s: float = Field(600.0, gt=0, description="give up if no admissible data arrives for this long")
    reward_bound: float = Field(
        1e6, gt=0, allow_inf_nan=False, description="intake rejects a trajectory whose |reward| exceeds this "
        "(reason reward_out_of_range): no worker can push a reward that overflows the advantage statistics"
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in the backward pass: less memory, ~1/3 more compute (the "
        "prompt then runs once per response instead of once per group)"
    )
    token_budget: int = Field(
        2048, ge=0, description="most tokens one forward/backward unit runs through the model (its prompt once, "
        "each response padded to the unit's longest): a group's rows are cut into units that fit, and a longer row "
        "(a long multi-turn episode) runs with gradient checkpointing, so the activations a unit keeps stay bounded "
        "(docs/recipes.md, 'Learner memory'); 0: no limit, units of micro_batch rows whatever their length"
    )
    lie_threshold: float = Field(
        0.5, ge=0, allow_inf_nan=False, description="worker audit (docs/security.md): a worker whose records' mean "
        "|log pi_old - log pi_sampler| per token, divided by 1 + lag, exceeds this is over: its rows are withheld "
        "from the update, and over in 2 consecutive learner steps it contributed to it is quarantined (0: the "
        "audit is off)"
    )
    lie_var_threshold: float = Field(
        0.5, ge=0, allow_inf_nan=False, description="worker audit: the same for the fraction of the variance of "
        "log pi its claimed log-probs leave unexplained, taken only against the version a record claims (at lag 0 "
        "and in the replay; constant or made-up log-probs: ~1 or more; honest SmolLM2: <= 0.002) (0: this check "
        "is off)"
    )
    audit_replay: int = Field(
        2, ge=0, description="worker audit: records of each worker per step, drawn at random among its records "
        "generated under an older version, recomputed under the snapshot of the version they claim (the learner "
        "keeps the published snapshots of the last S versions and one more copy of the model; docs/security.md) "
        "(0: no replay)"
    )

    @model_validator(mode="after")
    def _check(self) -> LearnerConfig:
        from echo2sdk.core.capacity import publication_period

        try:
            publication_period(self.staleness, self.kappa)
        except CapacityError as e:
            raise ValueError(str(e)) from None
        if self.epsilon >= 1:
            raise ValueError(f"learner.epsilon={self.epsilon}: the ratio's lower bound 1 - epsilon must stay > 0")
        if self.prompt_skip_explore < self.prompt_skip_min_explore:
            raise ValueError(f"learner.prompt_skip_explore={self.prompt_skip_explore} is below "
                             f"learner.prompt_skip_min_explore={self.prompt_skip_min_explore}")
        return self

    @property
    def advantages_scaled(self) -> bool:
        """scale_rewards as given, else true except for dr_grpo (Dr. GRPO drops the std normalisation)."""
        return self.scale_rewards if self.scale_rewards is not None else self.loss_type != "dr_grpo"


_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\])"
_URL = rf"https?://{_HOST}(?::[0-9]{{1,5}})?/?"  # scheme, host and port: no user, path, query or fragment
_BOOL = r"(?i:true|false)"
_DURATION = r"[0-9]{1,9}(?:\.[0-9]{1,9})?\s?[a-z]{0,7}"  # obstore's duration strings: "30s", "30min", "1.5h"
#: broadcast.store_options that name where and how to connect, never a secret: the only ones a run sends its
#: workers (obstore's config keys; credentials stay in each machine's environment), each with the form its value
#: must have. obstore builds host names from some of them (https://s3.{region}.amazonaws.com,
#: https://{account}.blob.core.windows.net): a region of "x@host/" would send the signed request elsewhere.
STORE_OPTION_VALUES = {
    "endpoint": _URL, "aws_endpoint": _URL, "region": r"[a-z0-9-]{1,32}", "aws_region": r"[a-z0-9-]{1,32}",
    "default_region": r"[a-z0-9-]{1,32}", "allow_http": _BOOL, "timeout": _DURATION, "connect_timeout": _DURATION,
    "read_timeout": _DURATION, "virtual_hosted_style_request": _BOOL, "aws_virtual_hosted_style_request": _BOOL,
    "s3_express": _BOOL, "skip_signature": _BOOL, "unsigned_payload": _BOOL, "checksum_algorithm": r"[A-Za-z0-9]{1,16}",
    "account_name": r"[a-z0-9]{3,24}", "azure_storage_account_name": r"[a-z0-9]{3,24}", "use_emulator": _BOOL,
    "azure_storage_use_emulator": _BOOL, "use_fabric_endpoint": _BOOL, "project_id": r"[a-z0-9-]{1,63}",
}
SAFE_STORE_OPTIONS = frozenset(STORE_OPTION_VALUES)


def store_option_problem(name: str, value: object) -> str | None:
    """Why store option `name` = `value` is not one a run may send its workers, or None."""
    if name not in STORE_OPTION_VALUES:
        return "not one of the connection options (it may hold a secret, or name a file or an endpoint)"
    if not isinstance(value, str) or not re.fullmatch(STORE_OPTION_VALUES[name], value):
        return f"not of the form {STORE_OPTION_VALUES[name]!r}"
    return None


#: broadcast.store URL schemes (a plain path is a local folder, file://): the ones a worker reads too
STORE_SCHEMES = frozenset({"s3", "gs", "az", "file"})


class BroadcastConfig(_Section):
    """How snapshots reach the workers (paper §4.2): peer-assisted chains, a star, or a direct push."""

    topology: Literal["chain", "star", "direct"] = Field(
        "chain", description="chain: N_ch forwarding chains; star: every worker fetches from the learner; "
        "direct: in-band push over the control connection (workers that accept no inbound connection)"
    )
    chunk_mib: float = Field(
        0.5, gt=0, description="snapshot chunk size, MiB: the unit a relay verifies, then forwards (smaller: less "
        "pipeline lag per hop on shaped links; larger: less CPU per byte on fast unshaped ones)"
    )
    uplink_mbps: float | None = Field(None, gt=0, description="B0: learner uplink, Mbit/s")
    worker_mbps: float | None = Field(None, gt=0, description="Bw: per-worker link, Mbit/s")
    n_chains: int | None = Field(
        None, ge=1, description="N_ch (default floor(B0 / Bw) when both are given, else 1)"
    )
    stall_timeout_s: float = Field(5.0, gt=0, description="a parent silent this long is repaired around")
    min_relay_mbps: float = Field(
        1.0, gt=0, le=1e6, description="a relay parent that takes longer than stall_timeout_s + chunk / this rate "
        "over a chunk is repaired around (one trickling bytes inside the stall timeout cannot hold its chain); "
        "measured end to end, so keep it under worker_mbps; the learner, every fetcher's last resort, is exempt"
    )
    shape_uplink: bool = Field(False, description="pace the learner's sends at uplink_mbps (emulation)")
    delta: bool = Field(
        False, description="publish delta snapshots (core/delta.py): the bf16 words changed since the previous "
        "publication, zstd-compressed, installed only when the rebuilt snapshot's root is the signed one; a full "
        "snapshot every anchor_every publications, to late joiners and to workers that lack the previous one"
    )
    anchor_every: int = Field(10, ge=0, description="with delta: a full snapshot every this many publications "
                              "(0: only the first and when needed)")
    store: str = Field(
        "", description="snapshot store (runtime/broadcast/store.py): every publication is also written there with "
        "its signed manifest, and a joining or lagging worker rebuilds the newest snapshot from it instead of taking "
        "it from the learner: s3://bucket/prefix, gs://, az://, file:///path or a local folder; '' = none"
    )
    store_options: dict[str, str] = Field(
        default_factory=dict, description="non-secret store options, sent to workers too (endpoint, region, "
        "allow_http, ...); credentials come from each machine's environment (AWS_ACCESS_KEY_ID, ...)"
    )
    store_keep: int = Field(2, ge=1, description="anchor-to-tip chains the store keeps (the newest first)")
    store_metadata: bool = Field(
        False, description="let the storage library ask the cloud's instance-metadata service for credentials (an "
        "instance role) on the learner and the workers it starts; off: credentials from the environment only, and a "
        "store read without them is read unsigned"
    )

    @model_validator(mode="after")
    def _check_delta(self) -> BroadcastConfig:
        if self.delta and self.topology == "direct":
            raise ValueError("broadcast.delta = true needs broadcast.topology 'chain' or 'star' (the direct push "
                             "sends full snapshots)")
        if self.store and self.topology == "direct":
            raise ValueError(f"broadcast.store = {self.store!r} needs broadcast.topology 'chain' or 'star' (the "
                             "store's manifests are signed with the chain broadcast's key)")
        unsafe = sorted(set(self.store_options) - SAFE_STORE_OPTIONS)
        for name in sorted(set(self.store_options) & SAFE_STORE_OPTIONS):
            if problem := store_option_problem(name, self.store_options[name]):
                raise ValueError(f"broadcast.store_options.{name} = {self.store_options[name]!r}: {problem}")
        if unsafe:
            raise ValueError(f"broadcast.store_options {unsafe}: these options are sent to every worker, so only "
                             f"where and how to connect may be set here ({', '.join(sorted(SAFE_STORE_OPTIONS))}); give "
                             "each machine its credentials in its environment (AWS_ACCESS_KEY_ID, ...)")
        if "://" in self.store and self.store.partition("://")[0] not in STORE_SCHEMES:
            raise ValueError(f"broadcast.store = {self.store!r}: expected {', '.join(sorted(STORE_SCHEMES))} URLs "
                             "(s3://bucket/prefix, ...) or a local folder")
        if re.match(r"^\w+://[^/]*@", self.store) or "?" in self.store or "#" in self.store:
            raise ValueError(f"broadcast.store = {self.store!r}: no user, password or query in the URL (it is sent "
                             "to every worker and written to summary.json); credentials go in the environment")
        if len(self.store) > 1024 or len(self.store_options) > 32:
            raise ValueError("broadcast.store: at most 1024 characters, and at most 32 store_options")
        return self

    def chains(self) -> int:
        from echo2sdk.core.capacity import num_chains

        if self.n_chains is not None:
            return self.n_chains
        if self.uplink_mbps and self.worker_mbps:
            return num_chains(self.uplink_mbps, self.worker_mbps)
        return 1


class MachineType(_Section):
    """A machine type the provider may launch (``[[scheduler.machines]]``): `count` standby machines named
    NAME-0, NAME-1, ..., each at `price_per_hour` and, until measured, `mu` rollouts/s."""

    name: str = Field(pattern=r"^[a-z][a-z0-9]*$", description="type name, e.g. l4 (worker ids l4-0, l4-1, ...)")
    count: int = Field(1, ge=1, le=256, description="how many machines of this type the scheduler may run at once")
    price_per_hour: float = Field(ge=0, description="$/h of one machine (echo2 plan --catalog skypilot:... prices it)")
    mu: float | None = Field(None, gt=0, description="prior rollouts/s of one machine (default: the mean measured "
                             "at warm-up) until its heartbeats measure it")
    resources: dict[str, Any] = Field(default_factory=dict, description="the provider's launch options for this "
                                      "type (skypilot: accelerators, infra, region, use_spot, disk_size, ...)")

    def workers(self) -> list[str]:
        """The worker ids of this type's machines: NAME-0, NAME-1, ..."""
        return [f"{self.name}-{i}" for i in range(self.count)]


class SchedulerConfig(_Section):
    """Cost-aware closed-loop activation (paper §3.4, §4.3, C.2.1): echo2sdk.core.scheduler."""

    enabled: bool = Field(
        False, description="calibrate at warm-up (T_train, T_bcast, mu_i), activate the cheapest workers "
        "that reach mu_target (provisioning.solver), then keep mu_pool near it: replace failed workers, release surplus ones"
    )
    gamma: float = Field(1.1, ge=1.0, description="safety factor: mu_target = gamma * mu_min(kappa)")
    max_filter_rate: float = Field(
        0.75, ge=0, lt=1, description="the pool is sized on useful rollouts, R / (1 - f) a step, with the measured "
        "filter rate f capped here (0.75: at most 4x the rollouts): above it the task, not the pool, is the problem "
        "(almost every group has one reward for all), and a warning says so; 0: size on raw rollouts (the paper)"
    )
    window_s: float = Field(20.0, gt=0, description="sliding window of heartbeat statistics (mu_i, a_i)")
    sustain_s: float = Field(10.0, ge=0, description="act only after capacity has deviated this long")
    release_margin: float = Field(0.5, ge=0, description="release while mu_pool > mu_target * (1 + margin)")
    prices: dict[str, float] = Field(
        default_factory=dict, description="$/h per worker id (default: the price the worker registered with)"
    )
    provider: str = Field("local", description="machine provider, entry-point group echo2sdk.providers")
    provider_options: dict[str, Any] = Field(default_factory=dict, description="keyword options for the provider")
    standby: int = Field(0, ge=0, description="extra machines the provider may start on demand (standby-0, ...)")
    standby_price: float = Field(0.0, ge=0, description="$/h of a standby machine")
    machines: list[MachineType] = Field(
        default_factory=list, description="machine types the provider may launch, cheapest rho first "
        "([[scheduler.machines]]: name, count, price_per_hour, mu, resources); with the skypilot provider, the fleet"
    )

    boot_timeout_s: float = Field(900.0, gt=0, description="a launched machine that sends no heartbeat this long is a "
                                  "failed launch (cloud VMs take ~2-6 min)")
    launch_backoff_s: float = Field(600.0, ge=0, description="after a failed launch, skip that machine type this long "
                                    "(the retry goes to the next-cheapest type)")
    lead_prior_s: float = Field(0.0, ge=0, description="launch lead time L assumed until one is measured")
    preempt_per_hour: float = Field(0.0, ge=0, description="prior preemption rate lambda per machine-hour (spot), "
                                    "blended with the measured one")
    anticipate: bool = Field(True, description="activate early: keep mu_pool + mu_pending - lambda*L*mu_pool at "
                             "mu_target (spares launched before a preemption, not after)")
    initial_machines: int = Field(
        0, ge=0, description="machines of [[scheduler.machines]] launched before warm-up, cheapest rho (by their mu) "
        "first: the pool the warm-up calibrates on when the run has no local workers"
    )

    @field_validator("machines")
    @classmethod
    def _distinct_types(cls, v: list[MachineType]) -> list[MachineType]:
        names = [m.name for m in v]
        if dup := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"machine type names must be distinct, got {dup} more than once")
        return v

    @model_validator(mode="after")
    def _initial_machines(self) -> SchedulerConfig:
        if not self.initial_machines:
            return self
        total = sum(m.count for m in self.machines)
        if self.initial_machines > total:
            raise ValueError(f"initial_machines = {self.initial_machines} but [[scheduler.machines]] holds {total} "
                             "machines")
        if missing := [m.name for m in self.machines if m.mu is None]:
            raise ValueError(f"initial_machines = {self.initial_machines}: give mu (rollouts/s) for machine types "
                             f"{missing}: the initial ones are chosen by price / mu")
        return self
    stop_released: bool = Field(False, description="stop a released worker's machine (default: keep it registered, idle)")
    stop_failed_after_s: float = Field(
        60.0, ge=0, description="stop a failed worker's machine only if it has not re-joined within this long "
        "(workers re-dial a lost connection; its replacement is activated at once either way)"
    )


class ProvisioningConfig(_Section):
    """How the initial set of workers is chosen (paper §3.4): echo2sdk.core.provisioning."""

    solver: Literal["exact", "greedy"] = Field(
        "exact", description="exact: the minimum-cost set of workers reaching mu_target (HiGHS MILP); "
        "greedy: the paper's cheapest-rho prefix (can cost several times more on mixed catalogs)"
    )


class RunConfig(_Section):
    out: str = Field(
        "runs/latest",
        description="output folder: metrics.jsonl, summary.json, checkpoint/, checkpoints/ (from a file: "
        "runs/<file stem>)",
    )
    seed: int = 0
    host: str = Field("127.0.0.1", description="coordinator bind address")
    port: int = Field(0, ge=0, le=65535, description="coordinator port (0: pick a free one)")
    token: str | None = Field(
        None, description="shared worker token, at least 128 bits (22 url-safe base64 characters or 32 hex digits); "
        "default: run.token_file, else $ECHO2_TOKEN, else one drawn per run. Prefer token_file or the environment: "
        "a config file is easily shared, and --set puts the token on the command line"
    )
    token_file: str | None = Field(
        None, description="file holding the worker token (one line; keep it mode 0600); `echo2 run --token-file`"
    )
    tls: bool = Field(
        True, description="TLS on the coordinator's port and the learner's relay port (self-signed; workers authenticate "
        "it through the token handshake). false: plaintext, an explicit opt-in (authentication and MACs still run, "
        "confidentiality is lost): local workers get --plaintext, remote ones need `echo2 worker --plaintext`"
    )
    tls_dir: str | None = Field(
        None, description="the coordinator's certificate folder from `echo2 keys --out DIR`: a fingerprint that does "
        "not change between runs, for `echo2 worker --coordinator-fingerprint` (default: one made per run, kept "
        "in the checkpoints for --resume)"
    )
    revoked_workers: list[str] = Field(
        [], description="worker names refused for the whole run (credentials from `echo2 keys worker NAME`, or a "
        "token worker's --id); docs/security.md, 'Per-worker credentials'"
    )
    revoked_file: str | None = Field(
        None, description="file of revoked worker names, one a line ('#' comments); re-read when it changes (within "
        "about a second): a name added is refused and its connected worker dropped with its buffered records"
    )
    heartbeat_s: float = Field(1.0, gt=0)
    worker_timeout_s: float = Field(15.0, gt=0, description="a worker silent this long is dropped")
    progress: bool = Field(True, description="show a progress bar")
    save_every: int = Field(
        50, ge=0, description="write a checkpoint (model, optimizer, RNG, counters) to DIR/checkpoints every N "
        "learner steps (0: only after the last step); one is also written on SIGTERM/SIGINT"
    )
    keep_checkpoints: int = Field(2, ge=1, description="how many of the newest checkpoints to keep")
    log_to: list[str] = Field(
        ["jsonl"], description="metrics sinks (entry-point group echo2sdk.sinks, or 'pkg.mod:Class'): jsonl "
        "(config.json, metrics.jsonl; always first: --resume and echo2 plot read it), tensorboard, wandb (offline "
        "unless $WANDB_MODE), mlflow (DIR/mlruns unless $MLFLOW_TRACKING_URI). A sink whose package is missing "
        "is logged and skipped; see docs/observability.md"
    )
    log_samples_every: int = Field(
        10, ge=0, description="every N learner steps, log a table of sample completions (prompt, response, reward, "
        "task fields) to the sinks (0: never)"
    )
    log_samples: int = Field(8, ge=1, le=1024, description="completions per sample table (one per GRPO group first)")
    status_port: int | None = Field(
        None, ge=0, le=65535, description="serve the live status page (workers, chains, staleness, reward) on this "
        "port (0: pick a free one; None: off); the URL with its token is printed at start, see docs/observability.md"
    )
    status_host: str = Field("127.0.0.1", description="status page bind address (plain HTTP: keep it on loopback and "
                             "reach it through an SSH tunnel)")

    @field_validator("token")
    @classmethod
    def _strong_token(cls, v: str | None) -> str | None:
        return v if v is None else check_token(v, "run.token")

    @field_validator("log_to")
    @classmethod
    def _jsonl_first(cls, v: list[str]) -> list[str]:
        if not v or v[0] != "jsonl":
            raise ValueError(f"run.log_to = {v}: start it with 'jsonl' (metrics.jsonl is what --resume and echo2 "
                             f"plot read), e.g. ['jsonl', 'tensorboard']")
        return v


class Config(_Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    broadcast: BroadcastConfig = Field(default_factory=BroadcastConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    provisioning: ProvisioningConfig = Field(default_factory=ProvisioningConfig)
    run: RunConfig = Field(default_factory=RunConfig)

    @model_validator(mode="after")
    def _check(self) -> Config:
        R, n = self.learner.trajectories_per_step, self.rollout.group_size
        if R % n:
            raise ValueError(f"learner.trajectories_per_step={R} must be a multiple of rollout.group_size={n}")
        return self

    @property
    def kappa(self) -> int:
        from echo2sdk.core.capacity import publication_period

        return publication_period(self.learner.staleness, self.learner.kappa)


def key_values(items: list[str] | None, flag: str = "--set") -> list[tuple[str, Any]]:
    """KEY=VALUE items of a repeatable command-line flag as (key, value) pairs, each value read as TOML (a bare word
    is a string). ConfigError, naming `flag`, for an item without "=" or a key."""
    pairs = []
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} expects KEY=VALUE, got {item!r}")
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = text.strip()
        pairs.append((key.strip(), value))
    return pairs


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: {p!r} is not a table")
    node[parts[-1]] = value


def _known_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return list(model.model_fields)


def validate_config(data: dict[str, Any], source: str = "config") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                close = difflib.get_close_matches(str(err["loc"][-1]), _known_keys(Config, err["loc"]), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                lines.append(f"unknown key {key!r}{hint}")
            elif not key or err["type"] == "value_error":
                lines.append(err["msg"].removeprefix("Value error, "))
            else:
                lines.append(f"{key} = {err.get('input')!r}: {err['msg']}")
        raise ConfigError(f"{source}: " + "; ".join(lines)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load a TOML file (or defaults), apply `a.b=c` overrides (TOML values), validate."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {source!r} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{source}: invalid TOML: {e}") from None
        run = data.get("run")
        if isinstance(run, dict) and "out" not in run or "run" not in data:
            # one config, one output folder: examples/poker.toml writes runs/poker unless told otherwise
            data.setdefault("run", {})["out"] = f"runs/{Path(path).stem}"
    pairs = key_values(overrides)
    _drop_switched_options(data, pairs)
    for key, value in pairs:
        _set_dotted(data, key, value)
    return validate_config(data, source)


# A plug-in chosen by --set does not inherit the options the file wrote for the one it names.
_OPTIONS_OF = {("task", "adapter"): "options", ("rollout", "backend"): "backend_options"}


def _drop_switched_options(data: dict[str, Any], overrides: list[tuple[str, Any]]) -> None:
    """`--set task.adapter=X` (X other than the file's adapter) drops the file's task.options before the
    other overrides apply, so `--set task.options.k=v` still sets X's options; the same for rollout.backend."""
    for (section, choice), options in _OPTIONS_OF.items():
        table = data.get(section)
        switched = any(k == f"{section}.{choice}" and v != (table or {}).get(choice) for k, v in overrides)
        if switched and isinstance(table, dict):
            table.pop(options, None)
            if section == "task":
                table.pop("mix", None)  # the file's mixture, replaced by the adapter --set names
