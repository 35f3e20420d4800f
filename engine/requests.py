"""A generation request and its updates: what the scheduler, the server and the front-end pipe
share (no torch here, so a front-end process can import it without the model's libraries).

`GenRequest` is one sequence to generate (its prompt, limits, stop strings, sampling, fairness
group) and `take` turns committed tokens into an `Update` (new token ids, and once finished
the reason). A request's updates go to its `sink`; `deliver` calls the sinks of one batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.tokenizer import EOS_ID, StreamDecoder

if TYPE_CHECKING:
    from engine.decode import Sequence

log = logging.getLogger("engine.scheduler")


@dataclass
class Update:
    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "error" | "abort"
    error: str | None = None


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int
    sink: Callable[[Update], None]
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    temperature: float = 0.0
    seed: int | None = None
    group: Hashable | None = None  # requests of one group share fairly; None: a group alone
    rid: int = 0  # its id across a process boundary (engine.engine_proc), else unused
    output: list[int] = field(default_factory=list)
    cancelled: bool = False
    seq: Sequence | None = None
    text: str = ""
    _decoder: StreamDecoder = field(default_factory=StreamDecoder)

    @property
    def key(self) -> Hashable:
        return self.group if self.group is not None else id(self)

    def take(self, new: list[int]) -> Update:
        """Append committed tokens one by one, stopping at EOS, a stop string or max_tokens."""
        taken: list[int] = []
        for t in new:
            if t == EOS_ID and not self.ignore_eos:
                return Update(taken, True, "stop")
            taken.append(t)
            self.output.append(t)
            if self.stop:
                self.text += self._decoder.feed([t])
                if any(s in self.text for s in self.stop):
                    return Update(taken, True, "stop")
            if len(self.output) >= self.max_tokens:
                return Update(taken, True, "length")
        return Update(taken)


Sink = Callable[[Update], None]
Dispatch = Callable[[list[tuple[Sink, Update]]], None]


def deliver(batch: list[tuple[Sink, Update]]) -> None:
    """Call each sink with its update; a broken sink (client gone) never stops the others."""
    for sink, update in batch:
        try:
            sink(update)
        except Exception:
            log.exception("request sink failed")
