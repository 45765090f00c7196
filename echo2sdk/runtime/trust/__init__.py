"""Who may talk to whom (docs/security.md): `session` (the token handshake and session keys), `tls`, `admission`
(handshakes and failed logins per IP), `gate` (the relay port's MAC-before-decode gate), `credentials` (run
tokens), `worker_keys` (per-worker credentials, revocation), `plugin_policy` (what a worker may load). Imports
nothing from learner/, worker/ or broadcast/."""
