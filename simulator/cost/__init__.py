"""Pure cost functions: the single home of every rule the analytic estimate, the DES and the
layer partitioner share (docs/design.md section 4.1).

* :mod:`~simulator.cost.workload` -- the ops of a layer, the embedding and the head (FLOPs, bytes, shapes)
* :mod:`~simulator.cost.ops` -- time of an op on a GPU (roofline, GEMM efficiency, host overhead)
* :mod:`~simulator.cost.params` -- parameter counts per rank
* :mod:`~simulator.cost.memory` -- model states, activations, buffers, the stage memory model
* :mod:`~simulator.cost.collectives` -- closed-form collective times of a placed group
* :mod:`~simulator.cost.schedules` -- pipeline pass orders
* :mod:`~simulator.cost.layout` -- rank layout (Megatron order) and group placement
* :mod:`~simulator.cost.stage` -- per-layer block times and per-stage costs
* :mod:`~simulator.cost.step` -- the step's orchestration rules: pipeline sends, ZeRO volumes,
  offload, optimizer, step-end synchronisation
* :mod:`~simulator.cost.rank_view` -- a context- or expert-parallel plan as one rank sees it
* :mod:`~simulator.cost.context` -- context parallelism's K/V ring
* :mod:`~simulator.cost.experts` -- a mixture of experts' layer and its token all-to-alls
"""
