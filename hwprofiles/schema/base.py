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
    def _a_number_is_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """A number field takes a number: pydantic's lax mode read YAML's true and false as 1 and 0
        (``num_layers: true`` was a model of one layer, ``nodes: true`` a cluster of one node),
        the text "32" as 32 and 32.0 as the integer 32 (a quoted or mistyped figure passed without
        a word)."""
        if info.field_name is None:
            return value
        annotation = cls.model_fields[info.field_name].annotation
        kinds = {annotation, *get_args(annotation)}
        if Any in kinds:
            return value
        if isinstance(value, bool) and bool not in kinds:
            raise PydanticCustomError("boolean", "expected {kind}, not true or false", {"kind": _kind(annotation)})
        if isinstance(value, str) and str not in kinds and kinds & {int, float}:
            raise PydanticCustomError("text", "expected {kind}, not text", {"kind": _kind(annotation)})
        if isinstance(value, float) and int in kinds and float not in kinds:
            raise PydanticCustomError("decimal", "expected an integer, not a decimal number")
        return value


def _kind(annotation: Any) -> str:
    """What a field holds, as an error names it."""
    kinds = {annotation, *get_args(annotation)}
    return next((word for kind, word in _KINDS if kind in kinds), "a value of its type")


#: the words for what a field holds, the widest number first (a float field takes an integer too)
_KINDS = ((float, "a number"), (int, "an integer"), (str, "a name"))
