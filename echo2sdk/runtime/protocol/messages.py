"""Typed wire messages: one frozen model per message type, with bounds on every field.

Every header a peer sends is parsed into one of these before anything reads it (`parse`), and every
header we send is built from one (`to_header`). A header that names an unexpected type, lacks a field,
carries an unknown key, a wrong type or a value out of bounds raises ProtocolError naming the message
type, the field and the value. Bulk bytes (snapshots, chunks) travel in the frame's payload, never in a
header (frames: `wire.py`).

Coordinator <-> worker: Challenge, Hello, Refused, Welcome (carries WorkerConfig and BroadcastInfo),
GetTasks, Tasks, Trajectories, Ack, Heartbeat, Snapshot, SnapshotPlan, SnapshotInStore (take it from the run's
snapshot store: runtime/broadcast/store.py), Received, Installed, SnapshotRejected, Shutdown, GetBase, BaseFiles
(a worker without the model: runtime/broadcast/bootstrap.py).
Relay <-> fetcher: Challenge, Fetch, Refused, Unavailable, Wait, Chunk.

Models are strict: no coercion ("3" is not an int, True is not a count, a str is not bytes; an int is
taken where a float is due). They accept a list where they hold a tuple: msgpack decodes arrays to
tuples (records.unpack) while senders build lists.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from echo2sdk.core.broadcast.manifest import MAX_CHUNKS, MIN_CHUNK_BYTES
from echo2sdk.core.checks import shown
from echo2sdk.core.failures import MAX_REASONS
from echo2sdk.errors import ConfigError, ProtocolError
from echo2sdk.runtime.protocol.groups import MAX_PUSH_BYTES, MAX_RECORDS, Push
from echo2sdk.runtime.protocol.wire import DEFAULT_MAX_PAYLOAD, digest

__all__ = [
    "WireMessage", "WorkerConfig", "Sampling", "BroadcastInfo", "StoreInfo", "WireTask", "WireManifest", "Repair",
    "Challenge", "Hello", "Refused", "Welcome", "GetTasks", "Tasks", "Trajectories", "Ack", "Heartbeat",
    "Snapshot", "SnapshotPlan", "SnapshotInStore", "Received", "Installed", "SnapshotRejected", "Shutdown", "GetBase", "BaseFile",
    "BaseFiles",
    "Fetch", "Unavailable", "Wait", "Chunk",
    "parse", "to_header", "clip", "shown", "MAX_REPORT", "MAX_ID", "MAX_REASON", "MAX_REASONS", "MAX_RELAY_KEYS",
]

# -- bounds -----------------------------------------------------------------------------------------
MAX_ID = 128  # worker, node, session and batch ids
MAX_NAME = 256  # plug-in names ("pkg.mod:Class"), task ids
MAX_PATH = 4096  # model names and paths
MAX_REASON = 1024  # why something was refused or repaired (senders `clip` theirs)
MAX_TEXT = 1 << 20  # one chat message's content, a task's answer
MAX_BATCH = 1024  # tasks per request, groups per push
MAX_ENTRIES = 256  # keys of an options or info map, messages of one task
MAX_PEERS = 4096  # nodes of an upstream list
MAX_REPORT = 16  # repairs, and parents' rates, one fetch reports (relay.FetchReport.to_wire keeps the first)
# MAX_REASONS (core.failures): distinct reasons of a counter a peer reports (adapter failures)
MAX_INT = (1 << 63) - 1  # versions, counts, request ids
MAX_RATE = 1e6  # rollouts per second one worker claims (the scheduler's calibration averages them)
MAX_PRICE = 1e6  # $ per hour a worker announces
MAX_SNAPSHOT_BYTES = 1 << 40  # a chunked snapshot
MAX_BASE_FILES = 32  # files of a model's base (config, tokenizer, generation config)
MAX_BASE_BYTES = 256 << 20  # their bytes together (one file: bootstrap.MAX_FILE_BYTES)

T = TypeVar("T")


def _as_tuple(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


Seq = Annotated[tuple[T, ...], BeforeValidator(_as_tuple)]
Id = Annotated[str, Field(max_length=MAX_ID)]
# the id a worker asks for: it reaches log lines, metrics and relay plans, so no whitespace or control character
WorkerId = Annotated[str, Field(max_length=MAX_ID, pattern=r"^[^\s\x00-\x1f\x7f-\x9f]*$")]
Name = Annotated[str, Field(max_length=MAX_NAME)]
Reason = Annotated[str, Field(max_length=MAX_REASON)]
Text = Annotated[str, Field(max_length=MAX_TEXT)]
Count = Annotated[int, Field(ge=0, le=MAX_INT)]  # versions, counts, request ids
NonNeg = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]  # rates, durations, prices
Port = Annotated[int, Field(ge=1, le=65535)]
Bytes32 = Annotated[bytes, Field(min_length=32, max_length=32)]  # nonces, HMAC-SHA256 MACs, digests, keys
ChunkIndex = Annotated[int, Field(ge=0, lt=MAX_CHUNKS)]
Options = Annotated[dict[Id, Any], Field(max_length=MAX_ENTRIES)]


def _fingerprint(value: bytes) -> bytes:
    if len(value) not in (0, 32):
        raise ValueError(f"a certificate fingerprint is 32 bytes (SHA-256), or empty without TLS; got {len(value)}")
    return value


Fingerprint = Annotated[bytes, AfterValidator(_fingerprint)]  # SHA-256 of a TLS certificate; b"": plaintext
# id, host, port, the relay's certificate fingerprint (pinned by the fetcher)
Hop = Annotated[tuple[Id, Annotated[str, Field(max_length=255)], Port, Fingerprint], BeforeValidator(_as_tuple)]
# (version, K_relay(version)): the root of relay handshakes for that snapshot (runtime/trust/worker_keys.py)
MAX_RELAY_KEYS = 65  # relay keys of one welcome or plan: a version's and its next kappa <= 64 versions'
RelayKeys = Annotated[Seq[Annotated[tuple[Count, Bytes32], BeforeValidator(_as_tuple)]], Field(max_length=MAX_RELAY_KEYS)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class WireMessage(_Model):
    """A frame header. Subclasses set `type`, the discriminator `parse` dispatches on."""

    type: str


# -- what the welcome carries -------------------------------------------------------------------------
class Sampling(_Model):
    """echo2sdk.core.contracts.SamplingParams, on the wire."""

    max_new_tokens: int = Field(128, ge=1, le=1 << 20)
    temperature: float = Field(1.0, ge=0.0, le=1000.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=1 << 24, description="0: off")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="0: off")
    seed: Count | None = None


class WorkerConfig(_Model):
    """What a worker needs to roll out: the trainer's worker config plus the coordinator's heartbeat period
    and staleness bound. Every field has a default, so a relay-only fleet may be given an empty config."""

    model: str = Field("", max_length=MAX_PATH, description="policy model name (used when model_path is absent)")
    model_path: str = Field("", max_length=MAX_PATH, description="local model folder, when the worker sees it")
    adapter: Name = Field("", description="task adapter to load")
    adapter_options: Options = Field(default_factory=dict)
    backend: Name = Field("", description="inference backend to load")
    backend_options: Options = Field(default_factory=dict)
    group_size: int = Field(4, ge=1, le=MAX_BATCH, description="n: samples per prompt")
    tasks_per_request: int = Field(2, ge=1, le=MAX_BATCH, description="prompts per get_tasks")
    sampling: Sampling = Field(default_factory=Sampling)
    max_len: int | None = Field(None, ge=1, le=1 << 24, description="the learner's prompt + response limit")
    max_prompt_length: int | None = Field(None, ge=1, le=1 << 24, description="longer prompts keep their last tokens")
    heartbeat_s: float = Field(1.0, gt=0.0, le=3600.0, description="how often the worker reports")
    staleness: int | None = Field(None, ge=0, le=1 << 20, description="S of the learner's buffer")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | WorkerConfig, **fields: Any) -> WorkerConfig:
        """Validate a config built as a plain mapping (the trainer's), plus `fields`; ConfigError if bad."""
        base = mapping.model_dump() if isinstance(mapping, WorkerConfig) else dict(mapping)
        try:
            return cls.model_validate({**base, **fields})
        except ValidationError as e:
            raise ConfigError(f"worker config: {_first_error(e)}") from None


class StoreInfo(_Model):
    """Where the run's snapshot store is (runtime/broadcast/store.py): its URL and non-secret options (endpoint,
    region, ...). Credentials never travel: a worker reads with its own (the AWS_* environment, an instance role)."""

    url: Annotated[str, Field(min_length=1, max_length=MAX_PATH)]
    options: Annotated[dict[Id, Annotated[str, Field(max_length=MAX_PATH)]], Field(max_length=64)] = Field(
        default_factory=dict)


class BroadcastInfo(_Model):
    """Chain broadcast at join time: the key that signs every manifest, and when a fetcher repairs."""

    public_key: Bytes32
    stall_timeout_s: float | None = Field(None, gt=0.0, le=3600.0)
    min_relay_bps: float | None = Field(None, gt=0.0, le=1e12)  # the slowest parent a fetcher waits for
    relay_keys: RelayKeys = ()  # the relay keys of the newest published version and of the next publication
    deltas: bool = False  # publications may be delta snapshots: keep the installed snapshot as the next base
    store: StoreInfo | None = None  # the run's snapshot store: SnapshotInStore points there


class WireTask(_Model):
    """echo2sdk.core.contracts.Task, on the wire."""

    id: Name
    messages: Annotated[Seq[Annotated[dict[Id, Text], Field(max_length=8)]], Field(max_length=MAX_ENTRIES)]
    answer: Text = ""
    info: Options = Field(default_factory=dict)


class WireManifest(_Model):
    """echo2sdk.core.broadcast.manifest.Manifest.to_wire(); `Manifest.from_wire` checks its consistency."""

    algo: Literal["blake3"] = "blake3"  # manifest.ALGO
    version: Count
    total_bytes: int = Field(ge=0, le=MAX_SNAPSHOT_BYTES)
    chunk_bytes: int = Field(ge=MIN_CHUNK_BYTES, le=1 << 32)
    chunks: Annotated[Seq[Bytes32], Field(max_length=MAX_CHUNKS)]
    digest: Bytes32
    signature: bytes = Field(min_length=64, max_length=64)  # Ed25519
    kind: Literal["full", "delta"] = "full"  # manifest.KINDS
    base_version: Count = 0
    base_root: bytes = Field(b"", max_length=32)
    root: bytes = Field(b"", max_length=32)


class Repair(_Model):
    """One parent a fetch gave up on (relay.FetchReport.repairs)."""

    parent: Id
    reason: Reason
    chunk: Count
    repair_s: NonNeg | None = None  # absent when no later parent delivered a chunk


# -- coordinator <-> worker ------------------------------------------------------------------------------
class Challenge(WireMessage):
    type: Literal["challenge"] = "challenge"
    nonce: Bytes32


class Hello(WireMessage):
    """Sealed with the hello key (echo2sdk.runtime.trust.session): a hello that verifies proves the token."""

    type: Literal["hello"] = "hello"
    nonce: Bytes32  # the worker's half of the session key
    worker_id: WorkerId = ""  # "": the coordinator names it
    session: Id = ""
    price_per_hour: Annotated[float, Field(ge=0.0, le=MAX_PRICE, allow_inf_nan=False)] = 0.0
    relay_port: Port | None = None
    relay_fingerprint: Fingerprint = b""  # its relay port's TLS certificate (b"": plaintext)
    version: Count = 0
    backend: Name = ""


class Refused(WireMessage):
    type: Literal["refused"] = "refused"
    reason: Reason


class Welcome(WireMessage):
    type: Literal["welcome"] = "welcome"
    worker_id: Id = Field(min_length=1)
    config: WorkerConfig
    version: Count = 0  # the newest published snapshot
    broadcast: BroadcastInfo | None = None


class GetTasks(WireMessage):
    type: Literal["get_tasks"] = "get_tasks"
    n: int = Field(ge=1, le=MAX_BATCH)
    rid: Count | None = None


class Tasks(WireMessage):
    type: Literal["tasks"] = "tasks"
    rid: Count | None = None
    tasks: Annotated[Seq[WireTask], Field(max_length=MAX_BATCH)]


class Trajectories(WireMessage):
    """A push of GRPO groups; the payload holds the records one after the other (runtime/protocol/groups.py)."""

    type: Literal["trajectories"] = "trajectories"
    rid: Count | None = None
    batch: Id | None = None  # the worker's id for this push: a re-sent push is acknowledged, not re-admitted
    groups: Annotated[Seq[Annotated[int, Field(ge=0, le=MAX_BATCH)]], Field(max_length=MAX_BATCH)]  # records each
    # each record's byte length as a packed u32 (little-endian): a header array of 16,384 numbers would let a
    # worker's header declare arrays that large, which msgpack allocates before their items arrive
    sizes: bytes = Field(b"", max_length=4 * MAX_RECORDS)
    sha256: str = Field("", pattern=r"^([0-9a-f]{64})?$")  # of the payload ("": no records)

    @model_validator(mode="after")
    def _records_add_up(self) -> Trajectories:
        if len(self.sizes) % 4:
            raise ValueError(f"sizes holds {len(self.sizes)} bytes, not a whole number of u32")
        if sum(self.groups) != len(self.sizes) // 4:
            raise ValueError(f"groups hold {sum(self.groups)} records, sizes name {len(self.sizes) // 4}")
        if self.nbytes > MAX_PUSH_BYTES:
            raise ValueError(f"records of {self.nbytes} bytes, more than a push's {MAX_PUSH_BYTES}")
        return self

    @property
    def record_sizes(self) -> tuple[int, ...]:
        """Each record's byte length."""
        return struct.unpack(f"<{len(self.sizes) // 4}I", self.sizes)

    @property
    def nbytes(self) -> int:
        """The payload's length."""
        return sum(self.record_sizes)

    @classmethod
    def of(cls, push: Push, *, batch: str | None = None, rid: int | None = None) -> Trajectories:
        """The header that carries `push` (groups.encode_groups, groups.split_pushes); its payload is push.payload."""
        return cls(rid=rid, batch=batch, groups=push.groups, sizes=struct.pack(f"<{len(push.sizes)}I", *push.sizes),
                   sha256=digest(push.payload) if push.payload else "")


class Ack(WireMessage):
    type: Literal["ack"] = "ack"
    rid: Count | None = None
    accepted: Count
    rejected: Annotated[Seq[Id], Field(max_length=MAX_BATCH)] = ()  # one reason per dropped group
    duplicate: bool = False


class Heartbeat(WireMessage):
    type: Literal["heartbeat"] = "heartbeat"
    version: Count
    rollouts: Count = 0
    rollouts_per_s: Annotated[float, Field(ge=0.0, le=MAX_RATE, allow_inf_nan=False)] = 0.0
    # the worker's adapter failures so far (score raised, NaN, not a number), by reason, and the groups it
    # dropped for them: totals, so a lost heartbeat loses nothing
    failures: Annotated[dict[Id, Count], Field(max_length=MAX_REASONS)] = Field(default_factory=dict)
    groups_dropped: Count = 0


class Snapshot(WireMessage):
    """A direct push; the payload is the safetensors bytes."""

    type: Literal["snapshot"] = "snapshot"
    version: Count
    nbytes: int = Field(ge=0, le=DEFAULT_MAX_PAYLOAD)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class SnapshotInStore(WireMessage):
    """Snapshot `version` (or a newer one) is in the run's snapshot store: rebuild it from there, from the newest
    anchor or from the snapshot this worker holds (a joiner, or a worker that lacks a delta's base)."""

    type: Literal["snapshot_in_store"] = "snapshot_in_store"
    version: Count


class SnapshotPlan(WireMessage):
    """Chain broadcast: the signed manifest and where to fetch the chunks, parent first, learner last."""

    type: Literal["snapshot_plan"] = "snapshot_plan"
    manifest: WireManifest
    upstream: Annotated[Seq[Hop], Field(min_length=1, max_length=MAX_PEERS)]  # (node, host, port, fingerprint)
    relay_keys: RelayKeys = ()  # this version's relay key and the next publication's


class Received(WireMessage):
    """relay.FetchReport: how a chain-broadcast fetch went."""

    type: Literal["received"] = "received"
    version: Count
    ok: bool = False
    seconds: NonNeg = 0.0
    parent: Id = ""  # who delivered the last chunk
    served_bps: Annotated[dict[Id, NonNeg], Field(max_length=MAX_REPORT)] = Field(default_factory=dict)
    repairs: Annotated[Seq[Repair], Field(max_length=MAX_REPORT)] = ()
    bad_chunks: Count = 0


class Installed(WireMessage):
    type: Literal["installed"] = "installed"
    version: Count
    install_s: NonNeg = 0.0


class SnapshotRejected(WireMessage):
    type: Literal["snapshot_rejected"] = "snapshot_rejected"
    version: Count | None = None
    reason: Reason
    from_store: bool = False  # it could not be taken from the run's snapshot store (SnapshotInStore)


class Shutdown(WireMessage):
    type: Literal["shutdown"] = "shutdown"


class GetBase(WireMessage):
    """A worker without the model asks for its non-weight files; the weights follow as a snapshot."""

    type: Literal["get_base"] = "get_base"


class BaseFile(_Model):
    """One file of a BaseFiles payload; the worker checks the name against its allow-list (bootstrap.py)."""

    name: Name
    nbytes: int = Field(ge=0, le=MAX_BASE_BYTES)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class BaseFiles(WireMessage):
    """The model's non-weight files; the payload is their bytes, one after the other in `files` order.
    No files and a `reason`: this coordinator serves no base."""

    type: Literal["base_files"] = "base_files"
    files: Annotated[Seq[BaseFile], Field(max_length=MAX_BASE_FILES)] = ()
    reason: Reason = ""


# -- relay <-> fetcher ----------------------------------------------------------------------------------
class Fetch(WireMessage):
    """Sealed with the relay's hello key (echo2sdk.runtime.trust.session)."""

    type: Literal["fetch"] = "fetch"
    node_id: Id
    nonce: Bytes32
    version: Count
    start: int = Field(ge=0, le=MAX_CHUNKS)  # the first chunk the fetcher lacks


class Unavailable(WireMessage):
    type: Literal["unavailable"] = "unavailable"
    version: Count


class Wait(WireMessage):
    """Keep-alive while the serving node repairs its own feed."""

    type: Literal["wait"] = "wait"


class Chunk(WireMessage):
    """Chunk `i`; the payload is its bytes."""

    type: Literal["chunk"] = "chunk"
    i: ChunkIndex


# -- parsing and sending ---------------------------------------------------------------------------------
M = TypeVar("M", bound=WireMessage)


def parse(header: object, allowed: tuple[type[M], ...]) -> M:
    """Validate a received header as one of the `allowed` messages; ProtocolError on any violation."""
    kind = header.get("type") if isinstance(header, dict) else None
    cls = next((c for c in allowed if c.model_fields["type"].default == kind), None) if isinstance(kind, str) else None
    if cls is None:
        expected = ", ".join(c.model_fields["type"].default for c in allowed)
        what = f"type {shown(kind)}" if isinstance(kind, str) else f"without a string 'type': {shown(header)}"
        raise ProtocolError(f"unexpected message {what} (expected {expected})")
    try:
        return cls.model_validate(header)
    except ValidationError as e:
        raise ProtocolError(f"{kind} message: {_first_error(e)}") from None


def to_header(msg: WireMessage) -> dict[str, Any]:
    """The msgpack map to send for `msg`."""
    return msg.model_dump()


def clip(text: str, limit: int = MAX_REASON) -> str:
    """`text` cut to fit a bounded field (reasons built from exceptions can be long)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or "<header>"
    value = "missing" if err["type"] == "missing" else f"= {shown(err.get('input'))}"
    return f"field {field!r} {value}: {err['msg']}"
