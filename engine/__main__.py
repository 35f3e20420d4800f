"""`python -m engine`: run the reference engine's OpenAI-compatible server in the foreground.

    python -m engine --host 127.0.0.1 --port 30000 --preset tiny --mode ddtree \
        [--device cpu|cuda] [--backend tree_build=cpp --backend attention=cuda ...]
"""

from __future__ import annotations

import argparse
import logging
import sys

from engine.backends import COMPONENTS, parse_backends
from engine.config import PRESETS


def parser() -> argparse.ArgumentParser:
    kinds = "; ".join(f"{c}={'|'.join(k)}" for c, k in COMPONENTS.items())
    p = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--mode", choices=("ar", "ddtree"), default="ddtree")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument(
        "--backend",
        action="append",
        nargs="+",
        default=[],
        metavar="COMPONENT=KIND",
        help=f"swap one DDTree component (repeatable): {kinds}",
    )
    p.add_argument("--weights", help="safetensors file written by engine.weights.save_weights")
    p.add_argument("--seed", type=int, default=0, help="weight seed when --weights is not given")
    p.add_argument("--max-batch-size", type=int)
    p.add_argument("--budget", type=int, help="DDTree nodes per request per step")
    p.add_argument("--model-name", default="ddtree-reference")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: per-row ops)")
    p.add_argument("--log-level", default="info")
    p.add_argument(
        "--load-delay",
        type=float,
        default=0.0,
        help="seconds to wait before loading (tests observe /health's 503)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    backends = [b for group in args.backend for b in group]
    try:
        parse_backends(backends, args.device)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    import torch
    import uvicorn

    from engine.runtime import EngineSpec
    from engine.server import create_app

    torch.set_num_threads(args.threads)
    spec = EngineSpec(
        args.preset,
        args.mode,
        args.device,
        tuple(backends),
        args.weights,
        args.seed,
        args.max_batch_size,
        args.budget,
    )
    app = create_app(spec, args.model_name, load_delay=args.load_delay)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower())
    return 0


if __name__ == "__main__":
    sys.exit(main())
