"""DeepSpeed set-up for an autoplan plan: the pipeline module, recomputation and ``deepspeed.initialize``.

Written by ``autoplan emit`` next to ``ds_config.json``; checked against DeepSpeed 0.19.8.
What DeepSpeed reads from the config file is only half of a plan: the pipeline's stages, its
layer split and which layers recompute live in the ``PipelineModule`` the user builds
(``deepspeed/runtime/pipe/module.py``), and the data-parallel size that ``DeepSpeedConfig``
checks the batch against comes from the ``mpu`` given to ``deepspeed.initialize``
(``deepspeed/runtime/config.py``). This file supplies both, from the plan below.

Use it from the training script, which brings the data (DeepSpeed has no data pipeline of its own:
a ``DataLoader`` over your tokenized corpus, one microbatch per ``train_batch`` call)::

    import deepspeed_setup as planned
    model = planned.pipeline_module(layers, block_class=MyBlock, loss_fn=loss_fn)  # p > 1 (zbv: DualPipeV)
    planned.recompute_blocks(model.blocks)                                        # p = 1
    engine, optimizer, _, scheduler = planned.initialize(model)                   # ds_config.json's WarmupCosineLR
    for step in range(planned.resume(engine), planned.STEPS):
        engine.train_batch(data_iter)                                             # p > 1; else forward/backward/step
        planned.save_if_due(engine, step + 1)

ds_config.json logs the loss and learning rate of each step as CSV files (``logs/`` under the working directory).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

# ---- the plan (autoplan emit writes these values) ----
TENSOR = 1
PIPELINE = 1
DATA = 1
STAGE_LAYERS: tuple[int, ...] = (1,)
FULL_RECOMPUTE: tuple[int, ...] = (0,)
DUALPIPEV = False
TRAIN_ITERS = 1
# ---- end of the plan ----

CONFIG = Path(__file__).with_name("ds_config.json")
#: where checkpoints go and how often (environment overrides: CHECKPOINT_DIR, SAVE_INTERVAL, TRAIN_ITERS)
CHECKPOINT_DIR = Path(os.environ.get("CHECKPOINT_DIR", Path(__file__).with_name("checkpoints")))
SAVE_INTERVAL = int(os.environ.get("SAVE_INTERVAL", "1000"))
STEPS = int(os.environ.get("TRAIN_ITERS", str(TRAIN_ITERS)))


def _type_name(layer: Any) -> str:
    """The class name of a layer or a ``LayerSpec`` (its ``typename``)."""
    typename = getattr(layer, "typename", None)
    return typename.__name__ if isinstance(typename, type) else type(layer).__name__


def pipeline_module(
    layers: Sequence[Any], block_class: type | str, loss_fn: Callable[..., Any] | None = None, **kwargs: Any
) -> torch.nn.Module:
    """DeepSpeed's ``PipelineModule`` over ``layers`` with the plan's stages, layer split and recomputation.

    ``layers``: the model in order (embedding, the transformer blocks, final norm, head), as modules or
    ``LayerSpec``; the blocks are the layers whose class is ``block_class``. Stage s runs
    STAGE_LAYERS[s] blocks (stage 0 also the layers before the first block, the last stage the layers
    after the last), which no ``partition_method`` can express for an uneven split; the first
    FULL_RECOMPUTE[s] blocks of stage s are recomputed in backward, one block per checkpoint
    (``activation_checkpoint_interval`` alone recomputes every layer). Both are done by overriding
    ``PipelineModule._partition_layers`` and ``_is_checkpointable``, the hooks DeepSpeed's own
    ``DualPipeVModule`` overrides. Tensor parallelism (TENSOR > 1) must be inside the blocks
    themselves (Megatron-DeepSpeed's ``ParallelTransformerLayerPipe``): the topology only places them.

    DUALPIPEV (schedule=zbv): the module is DeepSpeed's ``DualPipeVModule``
    (``deepspeed/runtime/pipe/dualpipev.py``), whose engine ``deepspeed.initialize`` picks for it
    (``DualPipeVEngine``, the DualPipeV schedule): 2 x PIPELINE stages, rank r running stage r
    (phase 0) and stage 2 x PIPELINE - 1 - r (phase 1), as ``DualPipeVModule._partition_layers``
    places them; STAGE_LAYERS and FULL_RECOMPUTE then list the 2 x PIPELINE stages in model order.
    """
    from deepspeed.pipe import DualPipeVModule, PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    block = block_class if isinstance(block_class, str) else block_class.__name__
    base = DualPipeVModule if DUALPIPEV else PipelineModule

    class PlannedPipelineModule(base):  # type: ignore[valid-type,misc]
        def _partition_layers(self, method: str = "uniform") -> None:
            blocks = [i for i, layer in enumerate(self._layer_specs) if _type_name(layer) == block]
            if len(blocks) != sum(STAGE_LAYERS):
                raise ValueError(f"the plan splits {sum(STAGE_LAYERS)} {block} layers; the model has {len(blocks)}")
            starts = [blocks[sum(STAGE_LAYERS[:s])] for s in range(1, len(STAGE_LAYERS))]
            self.parts = [0, *starts, len(self._layer_specs)]
            stage = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])
            if DUALPIPEV:  # as DualPipeVModule._partition_layers: 2p stages, the second one mirrored
                self.num_stages *= 2
                mirror = self.num_stages - 1 - stage
                self.phase_bounds = [
                    (self.parts[stage], self.parts[stage + 1]),
                    (self.parts[mirror], self.parts[mirror + 1]),
                ]

        def _is_checkpointable(self, funcs: list[Any]) -> bool:
            local_blocks = [f for f in self.forward_funcs if _type_name(f) == block]
            phase = getattr(self, "active_phase", 0)  # DualPipeVModule.activate_phase
            chunk = 2 * PIPELINE - 1 - self.stage_id if DUALPIPEV and phase == 1 else self.stage_id
            recomputed = local_blocks[: FULL_RECOMPUTE[chunk]]
            return all(any(f is r for r in recomputed) for f in funcs)

    topology = PipeModelDataParallelTopology(num_pp=PIPELINE, num_mp=TENSOR, num_dp=DATA)
    return PlannedPipelineModule(
        layers=layers,
        topology=topology,
        loss_fn=loss_fn,
        partition_method="uniform",  # replaced by the plan's split (_partition_layers above)
        activation_checkpoint_interval=1 if any(FULL_RECOMPUTE) else 0,
        **kwargs,
    )


def recompute_blocks(blocks: Sequence[torch.nn.Module]) -> None:
    """Without a pipeline DeepSpeed recomputes nothing itself: wrap the first FULL_RECOMPUTE[0] of the
    model's transformer blocks in ``torch.utils.checkpoint`` (non-reentrant), as the plan does."""
    if len(blocks) != sum(STAGE_LAYERS):
        raise ValueError(f"the plan has {sum(STAGE_LAYERS)} transformer blocks; got {len(blocks)}")
    for b in blocks[: FULL_RECOMPUTE[0]]:
        b.forward = functools.partial(checkpoint, b.forward, use_reentrant=False)


class DataParallelSize:
    """The one thing ``DeepSpeedConfig`` asks an ``mpu``: the data-parallel size, which it checks
    ``train_batch_size`` against. Without it DeepSpeed counts every rank (TENSOR x DATA) as data
    parallel. With AutoTP the engine then builds its own tensor/data groups."""

    def get_data_parallel_world_size(self) -> int:
        return DATA


def initialize(model: torch.nn.Module, **kwargs: Any) -> Any:
    """``deepspeed.initialize`` with ds_config.json and the mpu the plan needs (a pipeline module
    brings its own: DeepSpeed refuses another one)."""
    import deepspeed

    mpu = DataParallelSize() if PIPELINE == 1 and TENSOR > 1 else None
    params = [p for p in model.parameters() if p.requires_grad]
    return deepspeed.initialize(model=model, model_parameters=params, config=str(CONFIG), mpu=mpu, **kwargs)


def resume(engine: Any) -> int:
    """Load the latest checkpoint in CHECKPOINT_DIR, if there is one (``engine.load_checkpoint``: the
    model, optimizer, scheduler and ZeRO shards); the step to continue from (0 on a fresh start)."""
    if not (CHECKPOINT_DIR / "latest").is_file():
        return 0
    _, client_state = engine.load_checkpoint(str(CHECKPOINT_DIR))
    return int((client_state or {}).get("step", 0))


def save_if_due(engine: Any, step: int) -> bool:
    """Save a checkpoint (``engine.save_checkpoint``, every rank) every SAVE_INTERVAL steps and at the
    last; whether it saved."""
    if step % SAVE_INTERVAL and step != STEPS:
        return False
    engine.save_checkpoint(str(CHECKPOINT_DIR), tag=f"step{step}", client_state={"step": step})
    return True
