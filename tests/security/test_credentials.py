"""Per-worker credentials (NAME:KEY derived from the run token) and their revocation (docs/security.md,
"Per-worker credentials"): a real worker logs in with one and trains the run; A's credential does not log in
as B; a forged one is refused; revoking a connected worker drops it and refuses its re-join; the token goes
on working for ordinary workers; relay keys are per version."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from _peers import TOKEN, Client, finish, make_coordinator, wait

from echo2sdk.errors import ConfigError
from echo2sdk.runtime.trust import session
from echo2sdk.runtime.trust.credentials import new_token
from echo2sdk.runtime.trust.worker_keys import Revocations, given_credential, issue, parse_credential

STRONG = new_token()  # never starts with '-', which argv would read as an option


def test_a_credential_is_the_name_and_a_key_bound_to_it():
    alice, bob = issue(TOKEN, "alice"), issue(TOKEN, "bob")
    assert str(alice).startswith("alice:") and len(str(alice)) == len("alice:") + 64
    assert parse_credential(f" {alice}\n", "test") == alice
    assert alice.key != bob.key and alice.key != issue(STRONG, "alice").key  # bound to the name and to the token
    assert alice.key == session.worker_key(session.token_key(TOKEN), "alice")
    for garbled in ("alice", f"alice:{alice.key.hex()[:-1]}", f"alice:{alice.key.hex().upper()}", f"a b:{alice.key.hex()}"):
        with pytest.raises(ConfigError) as e:
            parse_credential(garbled, "$ECHO2_CREDENTIAL")
        assert alice.key.hex()[:16] not in str(e.value)
    assert given_credential(None, {"ECHO2_CREDENTIAL": str(alice)}) == alice and given_credential(None, {}) is None
    with pytest.raises(ConfigError, match="worker name 'x y'"):
        issue(TOKEN, "x y")


def test_revocations_reread_the_file_when_it_changes_and_only_accumulate(tmp_path):
    path = tmp_path / "revoked"
    r = Revocations(["fixed"], path)  # the file does not exist yet: nothing more is revoked
    assert "fixed" in r and "alice" not in r and not r.refresh()
    path.write_text("alice  # lost laptop\n\n# a comment\n")
    assert r.refresh() and "alice" in r and not r.refresh()
    path.write_text("bob\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # a change the stamp sees whatever the clock
    assert r.refresh() and all(n in r for n in ("fixed", "alice", "bob"))  # alice stays revoked


def test_credentials_log_in_as_their_name_only_and_revocation_drops_and_refuses(loop, tmp_path):
    revoked = tmp_path / "revoked"
    c = make_coordinator(revoked=Revocations((), revoked))
    alice = issue(TOKEN, "alice")
    try:
        a = loop.run(Client.join(c.port, alice.key, worker_id="alice", relay_port=9))
        assert a.answer["type"] == "welcome" and a.answer["worker_id"] == "alice"
        assert c.workers["alice"].credential == "alice"
        as_bob = loop.run(Client.join(c.port, alice.key, worker_id="bob"))
        forged = loop.run(Client.join(c.port, os.urandom(32), worker_id="carol"))
        for refused in (as_bob, forged):
            assert refused.answer["type"] == "refused" and "authentication failed" in refused.answer["reason"]
            assert not refused.sealed  # the hello did not verify: no session key to seal with
        assert set(c.workers) == {"alice"}
        t = loop.run(Client.join(c.port, TOKEN, worker_id="ordinary"))  # the run token still works
        assert t.answer["type"] == "welcome" and c.workers["ordinary"].credential == ""

        revoked.write_text("alice\n")
        assert wait(lambda: not c.workers["alice"].alive, 5)  # the monitor re-reads the file every second
        again = loop.run(Client.join(c.port, alice.key, worker_id="alice"))
        assert again.answer == {"type": "refused", "reason": "worker alice is revoked"}
        assert c.stats()["refused_revoked"] == 1 and c.workers["ordinary"].alive
        for client in (a, as_bob, forged, t, again):
            loop.run(client.close())
    finally:
        c.stop()


def test_quarantine_holds_the_credential_not_just_the_id_it_lied_under(loop):
    """A credential holder with two connections gets its name and `NAME-N`; quarantining the liar's `NAME-N` must
    keep the credential out, not let it come back as `NAME-M` while its decoy holds `NAME`."""
    c = make_coordinator()
    alice = issue(TOKEN, "alice")
    clients = []
    try:
        decoy = loop.run(Client.join(c.port, alice.key, worker_id="alice", session="s1"))
        liar = loop.run(Client.join(c.port, alice.key, worker_id="alice", session="s2"))
        clients += [decoy, liar]
        assert decoy.answer["worker_id"] == "alice" and liar.answer["worker_id"] != "alice"
        c.quarantine(liar.answer["worker_id"], "a record claims version 7, which it never reported installed")
        again = loop.run(Client.join(c.port, alice.key, worker_id="alice", session="s3"))
        clients.append(again)
        assert again.answer["type"] == "refused" and "quarantined" in again.answer["reason"], again.answer
        assert again.sealed  # the hello verified: the refusal is sealed, so the worker can take it as final
        assert wait(lambda: not any(w.alive for w in c.workers.values()), 5)  # the decoy is dropped too
        ordinary = loop.run(Client.join(c.port, TOKEN, worker_id="bob"))  # nobody else is affected
        clients.append(ordinary)
        assert ordinary.answer["type"] == "welcome"
    finally:
        for client in clients:
            loop.run(client.close())
        c.stop()


def test_a_renamed_id_never_takes_a_registered_id_or_a_credential_name(loop):
    """A second process asking for a taken id is renamed; the new id must be free (not overwrite the registry
    entry of the worker already under it) and no credential's name (the quarantine and revocation of the renamed
    worker would then hit that credential)."""
    from echo2sdk.runtime.trust.worker_keys import check_name

    c = make_coordinator()
    clients = []
    try:
        first = loop.run(Client.join(c.port, TOKEN, worker_id="gpu", session="a"))
        clients.append(first)
        nxt = next(c.registry.ids) + 1  # the counter the coordinator draws suffixes from (a peer can guess it)
        squatter = loop.run(Client.join(c.port, TOKEN, worker_id=f"gpu-{nxt}", session="b"))
        clients.append(squatter)
        renamed = loop.run(Client.join(c.port, TOKEN, worker_id="gpu", session="c"))
        clients.append(renamed)
        new_id = renamed.answer["worker_id"]
        assert new_id not in ("gpu", f"gpu-{nxt}") and c.workers[f"gpu-{nxt}"].session == "b"
        with pytest.raises(ConfigError):
            check_name(new_id)  # no credential can be named so
    finally:
        for client in clients:
            loop.run(client.close())
        c.stop()


@pytest.mark.integration
def test_a_real_worker_with_a_credential_trains_the_run_and_is_revoked(tmp_path):
    """A run with no local worker: every trajectory comes from one `echo2 worker --credential-file` process,
    which fetches its snapshots over the chain broadcast with the relay keys its plans carry. Revoking it
    after the run drops it; its re-join is refused and it exits 2."""
    from echo2sdk.config import load_config
    from echo2sdk.runtime.learner.recipe import Trainer
    from echo2sdk.runtime.providers.local import worker_command

    revoked = tmp_path / "revoked"
    cfg = load_config(None, [
        'model.policy="tiny-random"', "rollout.workers=0", "rollout.group_size=2", "rollout.max_new_tokens=8",
        "learner.steps=2", "learner.trajectories_per_step=4", "learner.staleness=2", "learner.data_timeout_s=120",
        "learner.filter_zero_variance=false", "run.progress=false", "run.heartbeat_s=0.5",
        f'run.revoked_file="{revoked}"', f'run.out="{tmp_path / "run"}"',
    ])
    tr = Trainer(cfg)
    proc = None
    try:
        tr.setup()
        c = tr.coordinator
        cred = tmp_path / "alice.credential"
        cred.write_text(str(issue(c.token, "alice")) + "\n")
        env = {k: v for k, v in os.environ.items() if k not in ("ECHO2_TOKEN", "ECHO2_CREDENTIAL")}
        cmd = [*worker_command(c.host, c.port, "alice", 0), "--credential-file", str(cred), "--reconnect-s", "30"]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tr.run()
        alice = c.workers["alice"]
        assert alice.credential == "alice" and alice.trajectories >= 8  # both steps trained on its records
        assert wait(lambda: alice.version == tr.version, 60)  # it installed what the chain broadcast delivered
        revoked.write_text("alice\n")
        code, out = finish(proc, 60)
        assert code == 2 and "worker alice is revoked" in out, out
        assert c.stats()["refused_revoked"] >= 1 and not alice.alive
    finally:
        tr.close()
        if proc is not None:
            finish(proc, 10)
    assert [r["step"] for r in tr.rows] == [1, 2]


def test_relay_keys_are_per_version_so_a_revoked_worker_fetches_no_later_snapshot(caplog):
    """Nodes without the token relay with the per-version keys their plans hand them: a token-less child fetches
    v1 from a token-less parent; a node that kept only v1's and v2's keys (revoked since) is refused v3 by every
    peer and by the learner, and fetches v2, the one key it still holds."""
    from echo2sdk.core.broadcast.manifest import Signer, build_manifest
    from echo2sdk.runtime.broadcast.chain import ChainBroadcast
    from echo2sdk.runtime.broadcast.relay import RelayNode, Upstream

    bcast = ChainBroadcast(TOKEN, tls=False, relay_key_lookahead=1, stall_timeout_s=2.0)
    src, signer = bcast.source, Signer()
    parent, child, revoked = (RelayNode(None, node_id=n, tls=False, stall_timeout_s=2.0) for n in ("p", "c", "r"))

    def up(n: RelayNode) -> Upstream:
        return Upstream(n.node_id, n.host, n.port, n.fingerprint)

    try:
        data = {v: os.urandom(64 << 10) for v in (1, 2, 3)}
        snaps = {v: build_manifest(d, v, 16 << 10, signer) for v, d in data.items()}
        src.publish(snaps[1], data[1])  # the learner keeps 2 versions: each is published when it is fetched
        k = session.token_key(TOKEN)
        assert bcast.relay_keys(1) == ((1, session.relay_key(k, 1)), (2, session.relay_key(k, 2)))
        revoked.add_relay_keys(bcast.relay_keys(1))  # its last plan before revocation: v1's and v2's keys
        for node in (parent, child):
            node.add_relay_keys(bcast.relay_keys(1))
        assert parent.fetch(snaps[1], [up(src)]).ok
        r = child.fetch(snaps[1], [up(parent), up(src)])
        assert r.ok and r.parent == "p" and not r.repairs  # token-less to token-less, with v1's key
        for node in (parent, child):
            node.add_relay_keys(bcast.relay_keys(3))  # the plan of v3, which the revoked worker never gets
        src.publish(snaps[3], data[3])
        assert parent.fetch(snaps[3], [up(src)]).ok
        r = revoked.fetch(snaps[3], [up(parent), up(src)])
        assert not r.ok and [x["reason"] for x in r.repairs] == ["authentication"] * 2  # the kind travels
        assert "authentication: no relay key for version 3" in caplog.text  # the details stay in the node's log
        revoked.add_relay_keys([(3, session.relay_key(k, 2))])  # a key it holds, passed off as v3's
        r = revoked.fetch(snaps[3], [up(parent), up(src)])
        assert not r.ok and [x["reason"] for x in r.repairs] == ["refused"] * 2
        assert parent.refused == 1 and src.refused == 1
        src.publish(snaps[2], data[2])
        assert revoked.fetch(snaps[2], [up(src)]).ok  # the next publication's key it was handed: documented
    finally:
        for n in (parent, child, revoked):
            n.close()
        bcast.close()


def test_one_credential_holds_at_most_four_connections_and_a_rejoin_is_not_counted(loop):
    from echo2sdk.runtime.coordinator import MAX_CONNS_PER_CREDENTIAL

    c = make_coordinator()
    alice = issue(TOKEN, "alice")
    clients = []
    try:
        for i in range(MAX_CONNS_PER_CREDENTIAL):
            clients.append(loop.run(Client.join(c.port, alice.key, worker_id="alice", session=f"s{i}")))
            assert clients[-1].answer["type"] == "welcome", clients[-1].answer
        over = loop.run(Client.join(c.port, alice.key, worker_id="alice", session="s9"))
        clients.append(over)
        assert over.answer["type"] == "refused" and "already holds 4 connections" in over.answer["reason"]
        assert over.sealed
        rejoin = loop.run(Client.join(c.port, alice.key, worker_id="alice", session="s0"))  # replaces its own
        clients.append(rejoin)
        assert rejoin.answer["type"] == "welcome" and rejoin.answer["worker_id"] == "alice"
        renamed = loop.run(Client.join(c.port, alice.key, worker_id="alice", session="s1"))  # s1 holds alice~N:
        clients.append(renamed)  # a hello with its session replaces nothing, so it counts
        assert renamed.answer["type"] == "refused", renamed.answer
        assert c.refused == 2  # each refusal counted once (the cap's used to count twice)
        for token in (TOKEN, issue(TOKEN, "bob").key):  # the run token and other credentials are not affected
            clients.append(loop.run(Client.join(c.port, token, worker_id="bob")))
            assert clients[-1].answer["type"] == "welcome"
    finally:
        for client in clients:
            loop.run(client.close())
        c.stop()


def test_only_published_versions_count_as_installed():
    """With kappa > 1 the versions between publications never leave the learner: a worker reporting one
    installed gets nothing recorded, so a record claiming it quarantines it (and could never be replayed).
    Versions below the first this coordinator published (from before a resume) are taken as they come; one
    claimed before that first publication (a resumed run's orphan re-joining early) is kept until the publication
    settles it: below it stays, from it on is dropped."""
    from types import SimpleNamespace

    c = make_coordinator()
    try:
        conn = SimpleNamespace(worker_id="orphan", info=SimpleNamespace(installed=set(), alive=False, active=False))
        c.publications.note_installed(conn, 0)  # the base is never a claim
        c.publications.note_installed(conn, 1)
        c.publications.note_installed(conn, 11)
        assert conn.info.installed == {1, 11}  # nothing published yet: kept, unsettled
        c.publications.registry.conns["orphan"] = conn  # a known connection (not alive: sent nothing)
        for v in (10, 12):
            c.publish(v, b"snapshot")
        assert wait(lambda: c.publications.latest is not None and c.publications.latest[0] == 12, 5)
        assert conn.info.installed == {1}  # 11 is not below the first publication (10) and was never published
        for v in (8, 10, 11, 12, 13):
            c.publications.note_installed(conn, v)
        assert conn.info.installed == {1, 8, 10, 12}
    finally:
        c.stop()

