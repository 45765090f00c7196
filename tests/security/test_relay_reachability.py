"""A worker whose relay port cannot be reached (behind a NAT that admits no inbound connection) still joins and
trains: the coordinator probes the port at join, and without an answer the worker has no relay address, so the
chain planner places it at a chain's tail (it fetches, never serves)."""

from __future__ import annotations

import socket

from _peers import TOKEN, Client, make_coordinator

from echo2sdk.core.broadcast.planner import plan_chains


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens on it once the socket is closed


def test_an_unreachable_relay_port_joins_as_a_chain_tail(loop):
    c = make_coordinator()
    listening = socket.create_server(("127.0.0.1", 0))
    try:
        open_ = loop.run(Client.join(c.port, TOKEN, worker_id="open", relay_port=listening.getsockname()[1]))
        natted = loop.run(Client.join(c.port, TOKEN, worker_id="natted", relay_port=_closed_port()))
        plain = loop.run(Client.join(c.port, TOKEN, worker_id="no-relay"))
        for client in (open_, natted, plain):
            assert client.answer["type"] == "welcome"  # all three are in the run
        w = c.workers
        assert w["open"].relay_addr == ("127.0.0.1", listening.getsockname()[1]) and w["open"].relay_reachable
        assert w["natted"].relay_addr is None and w["natted"].relay_reachable is False
        assert w["no-relay"].relay_addr is None and w["no-relay"].relay_reachable is None
        # what the chain broadcast does with those addresses (runtime/broadcast/chain.py): only a relay forwards
        leaves = {n for n, i in w.items() if i.relay_addr is None}
        plan = plan_chains(["natted", "no-relay", "open"], 2, leaves)
        assert plan.chains == (("open",),) and dict(plan.leaves) == {"natted": "open", "no-relay": "open"}
        for client in (open_, natted, plain):
            loop.run(client.close())
    finally:
        listening.close()
        c.stop()


def test_a_tls_relay_counts_only_when_it_presents_its_own_certificate(loop):
    from echo2sdk.runtime.broadcast.relay import RelayNode

    c = make_coordinator()
    relay = RelayNode(TOKEN, node_id="real", host="127.0.0.1", tls=True)
    try:
        real = loop.run(Client.join(c.port, TOKEN, worker_id="real", relay_port=relay.port,
                                    relay_fingerprint=relay.fingerprint))
        # another TLS service at the address the worker names (here the coordinator's own port): not its relay
        posing = loop.run(Client.join(c.port, TOKEN, worker_id="posing", relay_port=c.port,
                                      relay_fingerprint=relay.fingerprint))
        assert c.workers["real"].relay_addr == ("127.0.0.1", relay.port) and c.workers["real"].relay_reachable
        assert c.workers["posing"].relay_addr is None and c.workers["posing"].relay_reachable is False
        assert relay.refused == 0  # the probe is no failed login at the relay
        for client in (real, posing):
            loop.run(client.close())
    finally:
        relay.close()
        c.stop()
