"""Drive the engine's continuous-batching scheduler in waves: requests joining mid-run.

`run_waves(decoder, prompts, max_tokens, waves)` submits `waves[0]` requests at once, and each
later wave as soon as the first tokens of the previous wave have arrived, so later requests
join a batch that is already decoding (and earlier ones leave while later ones run). It
returns each request's tokens and the batch sizes the scheduler ran.
"""

from __future__ import annotations

import threading

from engine.decode import Decoder
from engine.scheduler import GenRequest, Scheduler, Update


def run_waves(
    decoder: Decoder,
    prompts: list[list[int]],
    max_tokens: int,
    waves: list[int],
    timeout: float = 300.0,
) -> tuple[list[list[int]], set[int]]:
    assert sum(waves) == len(prompts)
    sched = Scheduler(decoder)
    outs: list[list[int]] = [[] for _ in prompts]
    finished = threading.Event()
    started = [threading.Event() for _ in waves]
    lock = threading.Lock()
    left = [len(prompts)]

    def sink(i: int, wave: int):
        def put(u: Update) -> None:
            with lock:
                outs[i].extend(u.token_ids)
                if u.token_ids:
                    started[wave].set()
                if u.finished:
                    assert u.finish_reason == "length", u
                    left[0] -= 1
                    if left[0] == 0:
                        finished.set()

        return put

    sched.start()
    try:
        i = 0
        for w, count in enumerate(waves):
            if w:
                assert started[w - 1].wait(timeout)
            for _ in range(count):
                sched.submit(GenRequest(prompts[i], max_tokens, sink(i, w), ignore_eos=True))
                i += 1
        assert finished.wait(timeout)
    finally:
        sched.shutdown()
    return outs, set(sched.stats.steps_by_batch)
