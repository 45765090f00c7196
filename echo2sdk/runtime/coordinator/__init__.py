"""Learner-side service: worker registry, heartbeats, task hand-out, trajectory intake, snapshot push.

It runs an asyncio server on its own thread so the learner's update loop never blocks on the network.
Every message a worker sends is validated; a bad trajectory is rejected, counted and logged with the
field and value; a worker with a wrong token is refused; a dead worker is dropped, never waited for.
Trajectory intake (validation and buffering) runs on a thread of the loop's executor, so a large push
delays no other worker's messages; what a worker reports is bounded (its recent batch ids, the repairs
kept for the run's record, its adapter-failure counts).

Messages (echo2sdk.runtime.protocol.messages; worker -> coordinator): hello, get_tasks, trajectories, heartbeat,
received, installed, snapshot_rejected, get_base. Messages (coordinator -> worker): challenge, welcome |
refused, tasks, ack, snapshot_plan (chain broadcast) or snapshot (direct push), base_files, shutdown.

    service.py      Coordinator: the parts below, composed; what the trainer, tests and benches call
    registry.py     who joined, is connected, active, quarantined or revoked; the worker table
    worker_info.py  WorkerInfo: one worker's record
    intake.py       pushed groups: once per batch id, validated, attributed, counted; lying claims quarantine
    publications.py publications and who has them (T_bcast, installed versions, repairs); the base for bootstrap
    handshake.py    TLS, challenge, hello, refusals; the registered worker's sealed channel
    connection.py   one worker's connection (delivery.Peer): sends over its SealedChannel, the write timeout
    server.py       the asyncio loop on its thread: connections, dispatch of worker messages, liveness

A constant lives in the module that uses it: patch it there (e.g. registry.KEEP_DEPARTED); the ones below are
re-exported for reading.
"""

from echo2sdk.runtime.coordinator.handshake import MAX_CONNS_PER_CREDENTIAL
from echo2sdk.runtime.coordinator.registry import KEEP_QUARANTINED
from echo2sdk.runtime.coordinator.server import FROM_WORKER
from echo2sdk.runtime.coordinator.service import Coordinator
from echo2sdk.runtime.coordinator.worker_info import WorkerInfo

__all__ = ["Coordinator", "WorkerInfo", "FROM_WORKER", "KEEP_QUARANTINED", "MAX_CONNS_PER_CREDENTIAL"]
