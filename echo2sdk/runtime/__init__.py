"""What runs: the paper's roles as processes and sockets, one folder each.

    learner/     the learning plane: the Trainer recipe (setup -> run -> save -> close) and its components
                 (publication of v_t, the audit replay, metrics, calibration, console), checkpoints, the FSDP2
                 ranks, the live scheduler loop and the status page
    coordinator/ the learner's side of the rollout plane: registry, handshake, intake, dispatch, snapshots
    worker/      the rollout worker process (`echo2 worker`)
    broadcast/   snapshot dissemination (paper §4.2): deliveries, chain broadcast, relay, bootstrap
    protocol/    frames, typed messages and the sealed channel both ends speak
    trust/       handshake, TLS, admission, the relay gate, credentials, plug-in policy
    providers/   machines a run starts (local processes; entry-point group echo2sdk.providers)
    sinks/       metrics sinks (jsonl, TensorBoard, W&B, MLflow)
    files.py     small files written whole or not at all (summary.json, published.json, config.json)

The runtime turns the pure mechanisms of :mod:`echo2sdk.core` into processes and sockets. protocol/ and trust/
import nothing from learner/, worker/ or broadcast/ (tests/test_layers.py).
"""
