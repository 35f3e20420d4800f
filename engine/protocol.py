"""OpenAI-style request validation and error bodies for the completions endpoint.

Every client mistake is a `BadRequest` (a 400 with a JSON error body), never a 500: bodies that
are not JSON, nest too deeply, carry NaN / Infinity or integers too long to convert, prompts
over the per-request cap, and out-of-range fields.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from engine.tokenizer import ByteTokenizer


class BadRequest(Exception):
    """A client error: becomes a 400 with an OpenAI-style error body."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def error_body(
    message: str,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclass
class Completion:
    prompts: list[list[int]]
    max_tokens: int
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    ignore_eos: bool
    temperature: float = 0.0
    seed: int | None = None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def load_json(raw: bytes) -> Any:
    """Parse a request body (strict JSON: no NaN / Infinity); BadRequest if it is not."""
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise BadRequest("invalid JSON body: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int over 4300 digits
        raise BadRequest(f"invalid JSON body: {exc}") from None


def _short(x: Any, limit: int = 40) -> str:
    text = repr(x) if not (_is_int(x) and x.bit_length() > 128) else f"<{x.bit_length()}-bit int>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _prompts(prompt: Any, tok: ByteTokenizer) -> list[list[int]]:
    if isinstance(prompt, str):
        return [tok.encode(prompt)]
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return [list(prompt)]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return [tok.encode(p) for p in prompt]
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt)
    ):
        return [list(p) for p in prompt]
    raise BadRequest(
        "prompt must be a string, a non-empty list of token ids, or a non-empty list of either",
        "prompt",
    )


def _checked_prompts(
    body: dict, tok: ByteTokenizer, vocab: int, max_prompts: int
) -> list[list[int]]:
    """The request's prompts as token ids: present, at most `max_prompts`, ids in the vocab."""
    if "prompt" not in body or body["prompt"] is None:
        raise BadRequest("missing required field 'prompt'", "prompt", "missing_required_parameter")
    prompts = _prompts(body["prompt"], tok)
    if len(prompts) > max_prompts:
        raise BadRequest(
            f"at most {max_prompts} prompts per request, got {len(prompts)}",
            "prompt",
            "too_many_prompts",
        )
    for p in prompts:
        if any(not 0 <= t < vocab for t in p):
            raise BadRequest(f"token ids must lie in [0, {vocab})", "prompt")
    return prompts


def _max_tokens(body: dict, max_new: int) -> int:
    max_tokens = body.get("max_tokens", 16)
    if max_tokens is None:
        max_tokens = 16
    if not _is_int(max_tokens) or not 1 <= max_tokens <= max_new:
        raise BadRequest(
            f"max_tokens must be an integer in [1, {max_new}], got {_short(max_tokens)}",
            "max_tokens",
        )
    return max_tokens


def _sampling(body: dict, mode: str) -> tuple[float, int | None]:
    """temperature (0 in ddtree mode: greedy only) and seed."""
    temperature = body.get("temperature", 0.0)
    if temperature is None:
        temperature = 0.0
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise BadRequest("temperature must be a number", "temperature")
    if isinstance(temperature, float) and not math.isfinite(temperature):
        raise BadRequest("temperature must be a finite number", "temperature")
    if temperature < 0:
        raise BadRequest("temperature must be >= 0", "temperature")
    if temperature > 0 and mode == "ddtree":
        raise BadRequest(
            "temperature must be 0 in ddtree mode: DDTree verification here is exact for greedy "
            "decoding only (sampling is offered in ar mode)",
            "temperature",
        )
    if temperature > 100:
        raise BadRequest("temperature must be <= 100", "temperature")
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
        raise BadRequest("seed must be a non-negative integer", "seed")
    return float(temperature), seed


def _refuse_unsupported(body: dict) -> None:
    """n > 1, echo and logprobs are not offered."""
    n = body.get("n", 1)
    if n not in (None, 1):
        raise BadRequest("only n = 1 is supported", "n")
    if body.get("echo"):
        raise BadRequest("echo is not supported", "echo")
    if body.get("logprobs") not in (None, 0, False):
        raise BadRequest("logprobs are not supported", "logprobs")


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if (
        not isinstance(stop, list)
        or len(stop) > 16
        or any(not isinstance(s, str) or not s for s in stop)
    ):
        raise BadRequest("stop must be a non-empty string or a list of up to 16 of them", "stop")
    return tuple(stop)


def _streaming(body: dict, n_prompts: int) -> tuple[bool, bool]:
    """stream (a single prompt only) and stream_options.include_usage."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise BadRequest("stream_options must be an object", "stream_options")
    if stream and n_prompts > 1:
        raise BadRequest("streaming takes a single prompt", "prompt")
    return stream, bool(opts.get("include_usage", False))


def _check_context(prompts: list[list[int]], max_tokens: int, max_seq_len: int) -> None:
    """Each prompt, and it with max_tokens more, fits the model's context."""
    for p in prompts:
        if len(p) >= max_seq_len:
            raise BadRequest(
                f"prompt too long: {len(p)} tokens; this model's maximum context length is "
                f"{max_seq_len} tokens",
                "prompt",
                "context_length_exceeded",
            )
        if len(p) + max_tokens > max_seq_len:
            raise BadRequest(
                f"this model's maximum context length is {max_seq_len} tokens, but "
                f"{len(p)} prompt tokens + max_tokens {max_tokens} exceed it",
                "max_tokens",
                "context_length_exceeded",
            )


def parse_completion(
    body: Any,
    *,
    mode: str,
    vocab: int,
    max_seq_len: int,
    max_new: int,
    tok: ByteTokenizer,
    max_prompts: int = 64,
) -> Completion:
    """Validate a /v1/completions body; BadRequest says what is wrong and with which field
    (the fields checked in this order: the first mistake is the one reported)."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    prompts = _checked_prompts(body, tok, vocab, max_prompts)
    max_tokens = _max_tokens(body, max_new)
    temperature, seed = _sampling(body, mode)
    _refuse_unsupported(body)
    stop = _stop(body)
    stream, include_usage = _streaming(body, len(prompts))
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest("ignore_eos must be a boolean", "ignore_eos")
    _check_context(prompts, max_tokens, max_seq_len)
    return Completion(
        prompts, max_tokens, stop, stream, include_usage, ignore_eos, temperature, seed
    )


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """Text up to (excluding) the earliest stop string, and whether one was found."""
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)
