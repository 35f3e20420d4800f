"""`python -m engine`: run the reference engine's OpenAI-compatible server in the foreground.

    python -m engine --host 127.0.0.1 --port 30000 --preset tiny --mode ddtree \
        [--device cpu|cuda[:N]] [--backend tree_build=cpp --backend attention=cuda ...] [--check]

Component backends default to $DDTREE_ENGINE_BACKENDS (comma-separated COMPONENT=KIND, as a
release's service.env sets it); each --backend overrides its component. Every user mistake
(a bad flag or value, a device this torch cannot use, a bad backend, a port in use) is one line
on stderr and exit 2, before the port is bound or the model is loaded. `--check` stops after
those checks and prints one JSON document (exit 0 ok, 2 bad input): `ops serve` runs it first.
HTTP is served by a spawned child process (engine.engine_proc; `--frontend thread`: a thread in
this one); the model, the scheduler and the GPU stay in this process, whose pid is the service's.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import signal
import socket
import sys
from typing import Any, NoReturn

from engine.components import COMPONENTS, ENV_VAR, resolve_backends
from engine.config import MATMUL, MAX_BUDGET, PRESETS, SEED_RANGE

# --max-batch-size, --threads and --load-delay are capped as well (1024, 1024, 3600 s): past
# 2**63 the KV cache, torch.set_num_threads or the loader's sleep raised once the port was bound


class UsageError(Exception):
    """A user mistake: one line on stderr, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        raise UsageError(message)


def _number(kind: type, low: float, high: float = float("inf")) -> Any:
    """An argparse type: a finite `kind` (int or float) in [low, high]."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes a number, got {text!r}") from None
        if not low <= value <= high or value == float("inf"):  # NaN fails the first test
            bound = f"in [{low}, {high}]" if high < float("inf") else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    return parse


def _add_model_args(p: argparse.ArgumentParser) -> None:
    """Where it listens, what it runs and on which device, its component backends."""
    kinds = "; ".join(f"{c}={'|'.join(k)}" for c, k in COMPONENTS.items())
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_number(int, 1, 65535), default=30000)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--mode", choices=("ar", "ddtree"), default="ddtree")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument(
        "--backend",
        action="append",
        nargs="+",
        default=[],
        metavar="COMPONENT=KIND",
        help=f"swap one DDTree component (repeatable; overrides ${ENV_VAR}): {kinds}",
    )


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    """The weights and the engine's settings: batch, tree budgets, CUDA graphs, matmuls."""
    p.add_argument("--weights", help="safetensors file written by engine.weights.save_weights")
    p.add_argument(
        "--seed",
        type=_number(int, SEED_RANGE[0], SEED_RANGE[1]),  # past it torch's generator overflowed
        default=0,
        help="weight seed when --weights is not given",
    )
    p.add_argument("--max-batch-size", type=_number(int, 1, 1024))  # KV cache
    p.add_argument(
        "--budget",
        type=_number(int, 1, MAX_BUDGET),
        help="DDTree nodes per request per step",
    )
    p.add_argument(
        "--max-budget",
        type=_number(int, 0, MAX_BUDGET),
        help="grow each tree up to this many nodes while the step's batch leaves the forward "
        "chunk room (EngineConfig.max_budget; 0: every step at --budget)",
    )
    p.add_argument(
        "--no-cuda-graphs",
        dest="cuda_graphs",
        action="store_false",
        default=os.environ.get("DDTREE_ENGINE_CUDA_GRAPHS", "1") not in ("0", "false", "no"),
        help="run the forward eagerly on a GPU (default: its segments are captured as CUDA "
        "graphs; $DDTREE_ENGINE_CUDA_GRAPHS=0 also turns them off)",
    )
    p.add_argument(
        "--matmul",
        choices=MATMUL,
        default=os.environ.get("DDTREE_ENGINE_MATMUL", MATMUL[0]),
        help="float32 matmuls on a GPU: tf32 tensor cores (default) or full fp32 "
        "($DDTREE_ENGINE_MATMUL); a CPU always computes fp32",
    )
    p.add_argument(
        "--mem-fraction",
        type=_number(float, 0.01, 0.95),
        help="on a GPU, hold this fraction of its total memory from the start, as SGLang's "
        "--mem-fraction-static reserves its KV cache (what a bench beside the service finds "
        "free); default: only what the engine allocates",
    )


def _add_process_args(p: argparse.ArgumentParser) -> None:
    """The served name, CPU threads, where HTTP is served, logging, the load delay."""
    p.add_argument("--model-name", default="ddtree-reference")
    p.add_argument(
        "--threads",
        type=_number(int, 1, 1024),
        default=1,
        help="torch CPU threads",
    )
    p.add_argument(
        "--frontend",
        choices=("thread", "process"),
        default=os.environ.get("DDTREE_ENGINE_FRONTEND", "process"),
        help="where HTTP is served: a child process of its own (default), so request parsing "
        "and streaming never take the step's GIL, or a thread beside the scheduler "
        "($DDTREE_ENGINE_FRONTEND)",
    )
    p.add_argument(
        "--log-level",
        type=str.lower,
        default="info",
        choices=("debug", "info", "warning", "error", "critical"),
    )
    p.add_argument(
        "--load-delay",
        type=_number(float, 0, 3600),
        default=0.0,
        help="seconds to wait before loading (tests observe /health's 503)",
    )


def _add_limit_args(p: argparse.ArgumentParser) -> None:
    """The bounded inputs (engine.limits), in a group of their own."""
    limits = p.add_argument_group("limits (bounded inputs)")
    limits.add_argument(
        "--max-body-bytes",
        type=_number(int, 1),
        default=1 << 20,
        help="larger request bodies get 413 (default 1 MiB)",
    )
    limits.add_argument(
        "--max-prompts-per-request",
        type=_number(int, 1),
        default=64,
        help="more prompts in one request get 400 (default 64)",
    )
    limits.add_argument(
        "--max-connections",
        type=_number(int, 1),
        help="open connections; beyond it the oldest idle one is closed (default: 1000, "
        "fewer under a low fd limit)",
    )
    limits.add_argument(
        "--request-read-timeout",
        type=_number(float, 0.01),
        default=10.0,
        help="seconds a client has to send a whole request (head and body); then dropped",
    )
    limits.add_argument(
        "--keep-alive-timeout",
        type=_number(float, 0.01),
        default=5.0,
        help="seconds an idle keep-alive connection stays open",
    )


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m engine", description=__doc__.splitlines()[0])
    _add_model_args(p)
    _add_engine_args(p)
    _add_process_args(p)
    _add_limit_args(p)
    p.add_argument(
        "--check",
        action="store_true",
        help="validate the arguments, the device and the port, print one JSON document, exit",
    )
    return p


def check_device(device: str) -> None:
    """UsageError unless this torch can run on `device` (engine.device)."""
    from engine.device import DeviceError
    from engine.device import check_device as check

    try:
        check(device)
    except DeviceError as exc:
        raise UsageError(str(exc)) from None


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound now so that a busy port is a one-line error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(
                f"port {port} on {host} is in use (address already in use); stop what listens "
                "there or pick another --port"
            ) from None
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def validate(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, str]]:
    """Every check that needs no model: backends (env and flags), weights, device."""
    flags = [b for group in args.backend for b in group]
    try:
        names, sources = resolve_backends(os.environ.get(ENV_VAR), flags, args.device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.weights and not os.path.isfile(args.weights):
        raise UsageError(f"--weights {args.weights}: no such file")
    if args.frontend not in ("thread", "process"):  # an env default argparse does not check
        raise UsageError(f"$DDTREE_ENGINE_FRONTEND={args.frontend!r}: expected thread or process")
    if args.matmul not in MATMUL:  # argparse checks a flag's value, not an env default
        raise UsageError(f"$DDTREE_ENGINE_MATMUL={args.matmul!r}: expected tf32 or fp32")
    check_device(args.device)
    return names, sources


def run(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    names, sources = validate(args)
    sock = bind(args.host, args.port)
    if args.check:
        sock.close()
        doc = {"ok": True, "preset": args.preset, "mode": args.mode, "device": args.device}
        doc["cuda_graphs"] = args.cuda_graphs
        doc["matmul"] = args.matmul
        doc["frontend"] = args.frontend
        doc |= {"backends": names, "backend_sources": sources}
        doc |= {"url": f"http://{args.host}:{args.port}"}
        print(json.dumps(doc))
        return 0
    from engine.engine_proc import LOG_FORMAT  # torch-free, as the front end's logging
    from engine.limits import BackoffSocket, Limits

    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    limits = Limits(
        max_body_bytes=args.max_body_bytes,
        max_prompts_per_request=args.max_prompts_per_request,
        request_read_timeout=args.request_read_timeout,
        keep_alive_timeout=args.keep_alive_timeout,
        **({"max_connections": args.max_connections} if args.max_connections else {}),
    )
    # Until the server's own handlers are in place (importing torch, building the state), a TERM
    # or a Ctrl-C is only noted, and the process then stops quietly with exit 0 before it serves
    # (taking a spawned front end along), not a traceback or a death by signal. Raising from the
    # handler instead would land inside whatever import was running: numpy's turns it into an
    # ImportError traceback, and one swallowed inside torch's went on to load and serve
    stops: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: stops.append(signum))
    # The front end starts first: its imports run while this process imports torch and loads
    frontend = start_frontend_process(sock, args, limits) if args.frontend == "process" else None
    import torch

    from engine.engine_state import EngineState
    from engine.runtime import EngineSpec

    torch.set_num_threads(args.threads)
    spec = EngineSpec(
        args.preset,
        args.mode,
        args.device,
        tuple(f"{c}={k}" for c, k in names.items()),
        args.weights,
        args.seed,
        args.max_batch_size,
        args.budget,
        max_budget=args.max_budget,
        cuda_graphs=args.cuda_graphs,
        matmul=args.matmul,
        backend_sources=sources,
        mem_fraction=args.mem_fraction,
    )
    state = EngineState(spec, args.model_name, args.load_delay, limits)
    log = logging.getLogger("engine")
    if frontend is not None:  # its front end has been serving (/health 503) since its own line
        log.info(
            "engine pid %d loading; its front end (pid %d) serves http://%s:%d",
            os.getpid(),
            frontend[0].pid,
            args.host,
            args.port,
        )
        rc = serve_with_frontend_process(state, *frontend, stops)
    else:
        log.info(
            "engine listening on http://%s:%d (pid %d, front end: thread)",
            args.host,
            args.port,
            os.getpid(),
        )
        from engine.server import build_server, create_app

        # uvicorn takes the signals and raises a caught one again into these once it has stopped
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if stops:  # a stop while starting: end before serving
            return 0
        server = build_server(
            create_app(state, limits), args.host, args.port, args.log_level, limits
        )
        state.on_load_failed = lambda: setattr(server, "should_exit", True)  # a graceful stop
        # uvicorn stops gracefully on Ctrl-C, then raises it again: no traceback for a stop
        with contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=[BackoffSocket.wrap(sock)])
        rc = 0
    if state.load_error:
        print(f"error: the model failed to load: {state.load_error}", file=sys.stderr)
        return 1
    return rc


def start_frontend_process(sock: socket.socket, args: argparse.Namespace, limits: Any) -> tuple:
    """Spawn the HTTP front end (engine.engine_proc.frontend_main) on the listening socket, which
    this process then closes; returns (the child, this side of the pipe). The child is a daemon:
    should this process end before it serves (a signal or an error while loading), its exit
    terminates the front end instead of waiting on it (it would wait on this pipe: a hang)."""
    import multiprocessing

    from engine.engine_proc import frontend_main

    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe(duplex=True)
    child = ctx.Process(
        target=frontend_main,
        args=(
            theirs,
            sock,
            args.model_name,
            args.mode,
            limits,
            args.host,
            args.port,
            args.log_level,
        ),
        name="engine-frontend",
        daemon=True,
    )
    child.start()
    theirs.close()
    sock.close()
    return child, ours


def serve_with_frontend_process(state: Any, child: Any, ours: Any, stops: list[int]) -> int:
    """The engine here, HTTP in the spawned child (start_frontend_process); a TERM drains the
    child, whose closed pipe then stops the engine's side. `stops`: the signals noted while
    starting (any: the front end is stopped and nothing is served)."""
    from engine.engine_proc import serve_engine

    state.frontend = "process"
    stopping = []

    def stop(signum: int, frame: Any) -> None:
        """The first TERM or INT stops the front end as uvicorn stops (no new connections, the
        requests in flight run to their end), and the engine serves until its pipe closes;
        a second one stops the engine at once (what is in flight is aborted)."""
        stopping.append(signum)
        if len(stopping) == 1 and child.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)
            return
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if stops:  # a stop while starting (noted before these handlers): end before serving
        child.terminate()
        child.join(timeout=15)
        return 0
    try:
        rc = serve_engine(state, ours)
    except SystemExit:
        rc = 0
    finally:
        ours.close()
    child.join(timeout=15)
    if child.is_alive():
        child.terminate()
        child.join(timeout=5)
    if rc == 0 and not stopping and child.exitcode != 0:  # the front end died under us
        print(f"error: the HTTP front end exited with {child.exitcode}", file=sys.stderr)
        rc = 1
    return rc


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        given = sys.argv[1:] if argv is None else argv
        # argparse takes any unique prefix (--ch, --che, --chec) as --check too
        if any(a.startswith("--ch") and "--check".startswith(a) for a in given):
            print(json.dumps({"ok": False, "error": str(exc)}))
        return 2


if __name__ == "__main__":
    sys.exit(main())
