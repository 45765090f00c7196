"""What runs: the trainer recipe, the coordinator and rollout workers over TCP, snapshot deliveries
(direct push and the chain-broadcast relay), the live scheduler loop and machine providers.

The runtime turns the pure mechanisms of :mod:`echo2sdk.core` into processes and sockets.
"""
