"""Peer-assisted pipelined chain broadcast of policy snapshots (paper §4.2, appendix C.3), the pure part.

- ``planner``  relay scores and chain assembly
- ``manifest`` chunked snapshot format, signed by the learner

What runs it is in ``echo2sdk.runtime.broadcast``: the learner's ChainBroadcast delivery (``chain``) and the
relay port and fetcher every worker runs (``relay``).
"""
