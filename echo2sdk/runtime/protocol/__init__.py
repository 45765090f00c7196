"""The wire between learner and workers: `wire` (frames, plain and sealed), `messages` (one frozen, bounded model
per message), `channel` (the sealed framed channel both ends use after the handshake). Imports nothing from
learner/, worker/ or broadcast/."""
