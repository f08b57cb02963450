"""The learning-rate schedule and length of the training job the exported files start: the model's
published recipe where there is one (``autoplan/emit/recipes.yaml``, each citing its paper), else
the training settings' peak rate with a generic warm-up and cosine decay, said so in the files.

Every tool gets the same schedule in its own terms (Megatron-LM's ``--lr-warmup-iters`` /
``--lr-decay-iters`` / ``--min-lr``, DeepSpeed's ``WarmupCosineLR``, torchtitan's
``LRSchedulersContainer``): a linear warm-up to ``lr`` over ``warmup_iters``, then a cosine decay to
``min_lr`` at ``decay_iters``, for ``train_iters`` iterations of the plan's global batch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from autoplan.runtime.config import TrainSettings
from simulator.specs import ModelSpec

#: without a published recipe: train this many iterations, warm up over this share of them, decay to this share of the peak
DEFAULT_TRAIN_ITERS = 10_000
DEFAULT_WARMUP_SHARE = 0.01
DEFAULT_MIN_LR_SHARE = 0.1


@dataclass(frozen=True)
class TrainingSchedule:
    """A training job's length and learning-rate schedule, in iterations of the global batch."""

    lr: float
    min_lr: float
    warmup_iters: int
    decay_iters: int
    train_iters: int
    source: str  # the recipe's citation, or what the defaults are

    @property
    def min_lr_share(self) -> float:
        """The final rate as a share of the peak (DeepSpeed's ``cos_min_ratio``, torchtitan's ``min_lr_factor``)."""
        return self.min_lr / self.lr


@functools.cache
def _recipes() -> dict[str, Any]:
    return yaml.safe_load(resources.files("autoplan.emit").joinpath("recipes.yaml").read_text())


def iterations(tokens: float, tokens_per_iter: int) -> int:
    """Iterations of ``tokens_per_iter`` tokens that cover ``tokens``: ceil(tokens / tokens_per_iter),
    at least 1."""
    return max(1, math.ceil(tokens / tokens_per_iter))


def training_schedule(model: ModelSpec, global_batch: int, train: TrainSettings) -> TrainingSchedule:
    """The schedule of ``model`` (module docstring) at ``global_batch`` sequences of its length."""
    per_iter = global_batch * model.seq_length
    recipe = _recipes().get(model.name)
    if recipe is None:
        warmup = max(1, round(DEFAULT_WARMUP_SHARE * DEFAULT_TRAIN_ITERS))
        return TrainingSchedule(
            train.lr,
            train.lr * DEFAULT_MIN_LR_SHARE,
            warmup,
            DEFAULT_TRAIN_ITERS,
            DEFAULT_TRAIN_ITERS,
            f"no published recipe for {model.name}: peak {train.lr:g}, {warmup} warm-up iterations, cosine decay to "
            f"{DEFAULT_MIN_LR_SHARE:g} of the peak over {DEFAULT_TRAIN_ITERS:,} iterations (set the length for your data)",
        )
    return TrainingSchedule(
        recipe["lr"],
        recipe["min_lr"],
        iterations(recipe["warmup_tokens"], per_iter),
        iterations(recipe["decay_tokens"], per_iter),
        iterations(recipe["train_tokens"], per_iter),
        recipe["source"],
    )
