"""What every record section shares: the open model base, `Value` (one number with its spread
and provenance), the stage and component names (from checks.vocabulary) and the checks on
times. Imported by the other section modules; imports none of them.

- `Value`: one number with its spread and provenance: value (median), p25, p75, n, samples,
  source ("measured" | "derived" | "hook": measured inside the service by the release's
  SGLang import hook, integration.hook), note (how it was derived).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from checks.vocabulary import COMPONENTS as VOCAB_COMPONENTS
from checks.vocabulary import STEP_STAGES

# hook: measured by the SGLang import hook's clock in the service's own processes (a measured
# number: the verdict uses it as it uses "measured"; ops.measure.counters.hook_level)
Source = Literal["measured", "derived", "hook"]
COMPONENTS = tuple(VOCAB_COMPONENTS)  # checks.vocabulary says them once
STAGES = STEP_STAGES  # the stages that add up to a step (attention is inside verify)


class OpenModel(BaseModel):
    model_config = ConfigDict(extra="allow")

    def record(self) -> dict[str, Any]:
        """The section as its run record keeps it: every field of the model (None included),
        in JSON types, and the extras its producer added."""
        return self.model_dump(mode="json")


Ms = Field(ge=0, allow_inf_nan=False)  # a latency: a finite number of ms >= 0


class Value(OpenModel):
    value: float
    p25: float | None = None
    p75: float | None = None
    n: int | None = None
    samples: list[float] = Field(default_factory=list)
    source: Source = "measured"
    note: str = ""

    @property
    def lo(self) -> float:
        return self.p25 if self.p25 is not None else self.value

    @property
    def hi(self) -> float:
        return self.p75 if self.p75 is not None else self.value


def check_value(t: Value, ok: Callable[[float], bool], what: str, where: str = "") -> None:
    """`t`'s value and its spread each pass `ok`, or a ValueError saying `what` it must be."""
    for key in ("value", "p25", "p75"):
        x = getattr(t, key)
        if x is not None and not ok(x):
            raise ValueError(f"{where}{key}: {what}, got {x!r}")


def check_seconds(where: str, t: Value) -> None:
    """A time is a finite number >= 0 (its spread too): a negative one would make f negative."""
    check_value(t, lambda x: math.isfinite(x) and x >= 0, "a time is a number >= 0", where)
