"""The stable core: pure mechanisms, no sockets, processes or config (tests/test_layers.py checks it).

records (tau = (x, y, r, v, Omega)), buffer (admit v >= v_t - S), capacity (mu_min, kappa, Delta_max, N_ch, the
bubble), provisioning and scheduler (cost-aware activation; throughput: the workers' heartbeat statistics), learner
and grpo (the GRPO update; its parts units, forward, audit_sums, learner_setup), audit (the lying-worker
statistics), rollout and episodes (one group of samples, or multi-turn episodes), contracts (the TaskAdapter and
InferenceBackend Protocols), broadcast/ (chain planning, signed manifests), snapshot, tokens, verdict (the filter
rate and the capacity verdict), prompt_filter (pre-rollout prompt skipping), bill (what a point of accuracy cost).
Imports nothing from runtime/, adapters/ or backends/; the runtime turns it into processes and sockets.
"""
