"""The base of every profile model: unknown keys are errors, numbers are finite (no YAML .inf or
.nan) and not booleans, values are frozen."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_another_type(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML's true and false are not numbers: pydantic's lax mode reads them as 1 and 0, so
        ``num_layers: true`` was a model of one layer and ``nodes: true`` a cluster of one node."""
        if isinstance(value, bool) and info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            if annotation is not bool and bool not in get_args(annotation) and annotation is not Any:
                raise PydanticCustomError("boolean", "expected {kind}, not true or false", {"kind": _kind(annotation)})
        return value


def _kind(annotation: Any) -> str:
    """What a field holds, as an error names it."""
    return {int: "an integer", float: "a number", str: "a name"}.get(annotation, "a value of its type")
