"""Discrete-event simulator of an ECHO-2 deployment at paper scale, on a virtual clock.

- :mod:`~echo2sdk.sim.network`  the flow-level dissemination model (chains, star, T_bcast)
- :mod:`~echo2sdk.sim.repair`   the same for a chain whose relay fails mid-broadcast
- :mod:`~echo2sdk.sim.inputs`   SimWorker, SimConfig; :mod:`~echo2sdk.sim.faults` Fault and the worker a role names
- :mod:`~echo2sdk.sim.engine`   the simulation: the event loop over the real core (learner, workers, scheduler)
- :mod:`~echo2sdk.sim.broadcast`  its publications (install events, relay scores, chain repair)
- :mod:`~echo2sdk.sim.accounting`, :mod:`~echo2sdk.sim.results`  its costs and logs, and SimResult
- :mod:`~echo2sdk.sim.clock`, :mod:`~echo2sdk.sim.workers`  the event queue; each worker's state
- :mod:`~echo2sdk.sim.paper`    the paper's experiments (`echo2 simulate paper`)
- :mod:`~echo2sdk.sim.launch`   launch latency x spot preemptions x early activation (`echo2 simulate launch`)
- :mod:`~echo2sdk.sim.filtering`  dynamic sampling's filter rate x provisioning basis x prompt skip rate
  (`echo2 simulate filter`)
"""

from echo2sdk.sim.engine import Fault, SimConfig, SimResult, Simulation, SimWorker, provision, simulate
from echo2sdk.sim.network import (
    GB,
    MBIT,
    MiB,
    Network,
    chain_install_times,
    install_times,
    measure_t_bcast,
    star_install_times,
    t_bcast_quantile,
)

__all__ = [
    "MBIT",
    "GB",
    "MiB",
    "Network",
    "SimWorker",
    "Fault",
    "SimConfig",
    "SimResult",
    "Simulation",
    "simulate",
    "star_install_times",
    "chain_install_times",
    "install_times",
    "t_bcast_quantile",
    "measure_t_bcast",
    "provision",
]
