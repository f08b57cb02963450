"""The base of every profile model: unknown keys are errors, numbers are finite (no YAML .inf or
.nan), values are frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
