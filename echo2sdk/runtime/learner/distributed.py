"""The distributed learner: one learner sharded over the ranks of a torchrun job (FSDP2).

Rank 0 is the learner the rest of the system sees: it runs the coordinator, the buffer, publication,
checkpoints and metrics. The other ranks hold shards of the policy and of the optimizer state and follow
rank 0 in lock step: before every learner call that is a collective (an update, a gathered snapshot, a
gathered checkpoint) rank 0 announces it with one broadcast (`Lockstep`), and the followers (`follow`)
make the same call. An update's sampled groups travel inside that announcement as msgpack bytes
(the records' wire form, re-validated on arrival; no pickle), through a tensor broadcast on the job's
backend: NCCL on GPUs, gloo on CPUs.

    echo2 run CONFIG --nproc-per-node N                       one machine: re-executes under torchrun
    torchrun --nnodes M --nproc-per-node N --rdzv-endpoint HOST:PORT -m echo2sdk.cli run CONFIG   several
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import astuple, dataclass
from datetime import timedelta
from typing import Any, NamedTuple, NoReturn

from echo2sdk.core.audit import Screen
from echo2sdk.core.records import Trajectory, pack, unpack
from echo2sdk.errors import ConfigError

__all__ = ["Topology", "Lockstep", "Followed", "follow", "from_env", "init", "shutdown", "leave", "launch_argv", "TIMEOUT"]

log = logging.getLogger("echo2sdk.distributed")

#: How long a rank waits in one collective. Followers wait in a broadcast while rank 0 waits for
#: trajectories (up to learner.data_timeout_s without progress, and longer while the pool is slow);
#: a rank that dies is noticed by torchrun, which stops the job, so a long timeout costs nothing.
TIMEOUT = timedelta(hours=6)


@dataclass(frozen=True)
class Topology:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def leader(self) -> bool:
        return self.rank == 0


def from_env() -> Topology:
    """The rank layout torchrun put in the environment (RANK, WORLD_SIZE, LOCAL_RANK); one process without it."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError as e:
        raise ConfigError(f"torchrun environment: {e}") from None
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"torchrun environment: RANK={rank} WORLD_SIZE={world}")
    return Topology(rank, world, local)


def init(topo: Topology) -> None:
    """Join the process group (NCCL on CUDA, one GPU per local rank; gloo on CPUs). A no-op for one process."""
    if topo.world == 1:
        return
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(topo.local_rank)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, timeout=TIMEOUT)
    log.info("rank %d of %d joined (%s)", topo.rank, topo.world, backend)


def shutdown(clean: bool = False) -> None:
    """Leave the process group. After a `clean` finish every rank first meets at a barrier (which also waits
    for the rank's pending collectives), so no rank leaves while a peer still has work on the group. After a
    failure no barrier: a dead peer would hold it for TIMEOUT, and torchrun stops the others anyway. A
    follower's `clean` must include rank 0's (`Followed.clean`): otherwise it would wait at a barrier rank 0 never
    reaches. (The process then ends with `leave`: the abort CI saw came from the interpreter's teardown.)"""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if clean:
            try:
                dist.barrier()
            except Exception as e:  # a peer gone after all: leave anyway, the run's result stands
                log.warning("leaving the process group without the other ranks (%s: %s)", type(e).__name__, e)
        dist.destroy_process_group()


def leave(code: int) -> NoReturn:
    """End a torchrun rank's process without the interpreter's teardown: flush the log handlers and the standard
    streams, then os._exit(code). Destroying gloo's objects while the interpreter finalizes aborts a rank now and
    then ("terminate called without an active exception" after every atexit handler has run, about once in 20
    runs of tests/runtime/learner/test_distributed.py here), and torchrun then reports the whole job failed."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _broadcast_bytes(data: bytes | None) -> bytes:
    """Rank 0's `data` on every rank, as a length and a uint8 tensor (on the GPU under NCCL)."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if data
           else torch.empty(int(size.item()), dtype=torch.uint8, device=device))
    if buf.numel():
        dist.broadcast(buf, src=0)
    return bytes(buf.cpu().numpy().tobytes())


class Lockstep:
    """Rank 0's handle on the learner: each collective call is announced to the followers first. With one
    process (`world == 1`) it is the learner itself, with nothing announced."""

    def __init__(self, learner: Any, world: int):
        self.learner, self.world = learner, world

    def _announce(self, op: str, **args: Any) -> None:
        if self.world > 1:
            _broadcast_bytes(pack({"op": op, **args}))

    def step(self, groups: list[list[Trajectory]], screen: Screen | None = None, lr_scale: float = 1.0) -> Any:
        self._announce("step", groups=[[t.to_wire() for t in g] for g in groups],
                       screen=list(astuple(screen)) if screen is not None else None, lr_scale=lr_scale)
        return self.learner.step(groups, screen, lr_scale)

    def replay_sums(self, records: list[Trajectory], states: dict[int, dict[str, Any]]) -> list[Any]:
        """The audit's replay runs on rank 0 alone (Learner.replay_sums): nothing to announce."""
        return self.learner.replay_sums(records, states)

    def snapshot_state(self, dtype: str) -> dict[str, Any]:
        self._announce("snapshot", dtype=dtype)
        return self.learner.snapshot_state(dtype)

    def model_state(self) -> dict[str, Any]:
        self._announce("model_state")
        return self.learner.model_state()

    def optimizer_state(self) -> dict[str, Any]:
        self._announce("optimizer_state")
        return self.learner.optimizer_state()

    def stop(self, clean: bool = True) -> None:
        """The followers leave `follow`; `clean`: rank 0 finished without an error (they then meet it at the
        barrier of `shutdown(clean=True)`; after a failure nobody waits there)."""
        self._announce("stop", clean=clean)


class Followed(NamedTuple):
    steps: int  # updates made
    clean: bool  # rank 0 stopped after a clean finish (Lockstep.stop)


def follow(learner: Any) -> Followed:
    """A follower rank's life: make every call rank 0 announces until it says stop."""
    steps = 0
    while True:
        msg = unpack(_broadcast_bytes(None))
        op = msg.get("op") if isinstance(msg, dict) else None
        if op == "step":
            try:
                screen = Screen(*msg["screen"]) if msg.get("screen") is not None else None
                learner.step([[Trajectory.from_wire(t) for t in g] for g in msg["groups"]], screen,
                             float(msg.get("lr_scale", 1.0)))
                steps += 1
            except (ValueError, RuntimeError) as e:  # rank 0 drops the same batch (Trainer._learn) and goes on
                log.warning("rank %d: learner step failed (%s: %s); batch dropped", learner.rank, type(e).__name__, e)
        elif op == "snapshot":
            learner.snapshot_state(msg["dtype"])
        elif op == "model_state":
            learner.model_state()
        elif op == "optimizer_state":
            learner.optimizer_state()
        elif op == "stop":
            return Followed(steps, bool(msg.get("clean", False)))
        else:
            raise RuntimeError(f"rank 0 announced an unknown learner call {op!r}")


def launch_argv(nproc: int, argv: list[str]) -> list[str]:
    """The command that runs `echo2 ARGV` on `nproc` local ranks under torchrun (one machine)."""
    if nproc < 1:
        raise ConfigError(f"--nproc-per-node must be >= 1, got {nproc}")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "echo2sdk.cli", *argv]
