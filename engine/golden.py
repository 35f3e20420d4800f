"""Golden prompts, and `python -m engine.golden`: AR vs DDTree identity and mean accept length.

    python -m engine.golden [--prompts FILE] [--preset tiny] [--device cpu] [--max-tokens 64]

prints one JSON document: whether every DDTree output equals the AR output (batched), and the
mean tokens committed per request per step (accepted drafts + bonus) over the golden prompts:
the project's `checks/data/golden_prompts.json` (schema ddtree-ops/prompts/v1) by default,
else `GOLDEN_PROMPTS` below.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

PROJECT_PROMPTS = Path(__file__).resolve().parent.parent / "checks" / "data" / "golden_prompts.json"

GOLDEN_PROMPTS: tuple[str, ...] = (
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):",
    "",
    "a",
    "Speculative decoding with trees",
    "Once upon a time",
    "SELECT * FROM users WHERE id = 1;",
    "日本語のテキスト",
    "1, 2, 3, 5, 8, 13,",
    "The capital of France is",
    "<html><body>",
)


def load_prompts(path: Path | None = None) -> list[str]:
    """Prompt texts of a ddtree-ops/prompts/v1 file (default: the project's, if present)."""
    path = path or PROJECT_PROMPTS
    if not path.is_file():
        return list(GOLDEN_PROMPTS)
    return [p["prompt"] for p in json.loads(path.read_text())["prompts"]]


def main(argv: list[str] | None = None) -> int:
    import torch

    from engine.device import DeviceError, check_device
    from engine.runtime import EngineSpec, build_decoder, generate
    from engine.tokenizer import ByteTokenizer

    p = argparse.ArgumentParser(prog="python -m engine.golden")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--backend", action="append", default=[])
    p.add_argument("--prompts", type=Path, help="a ddtree-ops/prompts/v1 JSON file")
    args = p.parse_args(argv)
    try:
        check_device(args.device)
    except DeviceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.device == "cpu":
        torch.set_num_threads(1)
    tok = ByteTokenizer()
    prompts = [tok.encode(s) for s in load_prompts(args.prompts)]
    out = {}
    for mode in ("ar", "ddtree"):
        spec = EngineSpec(args.preset, mode, args.device, tuple(args.backend))
        _, dec = build_decoder(spec)
        t0 = time.perf_counter()
        outs, accept = generate(dec, prompts, args.max_tokens)
        out[mode] = {
            "outputs": outs,
            "seconds": time.perf_counter() - t0,
            "mean_accept_length": sum(accept) / len(accept),
        }
    same = out["ar"]["outputs"] == out["ddtree"]["outputs"]
    report = {
        "preset": args.preset,
        "device": args.device,
        "max_tokens": args.max_tokens,
        "prompts": len(prompts),
        "ddtree_equals_ar": same,
        "mean_accept_length": out["ddtree"]["mean_accept_length"],
        "seconds": {m: out[m]["seconds"] for m in out},
    }
    print(json.dumps(report, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
