"""The discrete-event simulation of one training iteration (docs/design.md section 4.3).

Data flow: :mod:`~simulator.des.topology` (the cluster as links) -> :mod:`~simulator.des.flows`
(collectives as flows) -> :mod:`~simulator.des.transfers` (transfer classes on the engine) ->
:mod:`~simulator.des.program` (the iteration's task graph, from :mod:`simulator.cost`'s rules
and :mod:`~simulator.des.passes`) -> :mod:`~simulator.des.engine` + :mod:`~simulator.des.network`
(run it) -> :mod:`~simulator.des.memtimeline` and :mod:`~simulator.des.attribution` (memory
peak, time breakdown) -> :mod:`~simulator.des.trace` and :mod:`~simulator.des.plot` (pictures).
"""

from simulator.des.simulate import des_record, simulate_des

__all__ = ["des_record", "simulate_des"]
