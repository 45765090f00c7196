"""Peer-assisted pipelined chain broadcast of policy snapshots (paper §4.2, appendix C.3).

- ``planner``  relay scores and chain assembly (pure)
- ``manifest`` chunked snapshot format, signed by the learner
- ``relay``    the chunk server every node runs and the fetcher that pulls, verifies and forwards
- ``delivery`` the coordinator-side SnapshotDelivery that plans chains and hands out fetch orders
"""
