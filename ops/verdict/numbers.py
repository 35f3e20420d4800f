"""Number fields that refuse true/false: pydantic's lax mode takes YAML's or TOML's `true` as 1.

`NoBoolNumbers` is the base of the playbook's and the inventory's models: every field typed
int or float (optional, or a list or mapping of them) refuses a bool with "takes a number, not
true/false", so `gpus = true` or `repeats: true` is a named mistake, not a quiet 1.
"""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ValidationInfo, field_validator


def is_numeric(annotation: Any) -> bool:
    """int / float, optional or in a list or a dict's values (bool is never a number here)."""
    args = get_args(annotation)
    if args:
        return any(is_numeric(a) for a in args)
    return annotation in (int, float)


class NoBoolNumbers(BaseModel):
    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None or field.annotation is bool or not is_numeric(field.annotation):
            return v
        items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else [v]
        if any(isinstance(x, bool) for x in items):  # e.g. change.shape: {B: true}
            raise ValueError("takes a number, not true/false")
        return v
