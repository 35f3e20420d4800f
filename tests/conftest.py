"""Shared fixtures (a real sshd on loopback) and the `gpu` marker (skipped without a CUDA GPU).

What the tests share besides fixtures lives in the `helpers` package (tests/helpers/).

Before the first test, the project's packages are byte-compiled into their `__pycache__`
(what Python does itself on first import unless PYTHONDONTWRITEBYTECODE is set, as it is on
some CI hosts): the suite starts the `ops` CLI, the engine and the checks as fresh processes
several hundred times, and without a .pyc each of them compiles its modules from source again
(~0.2 s per `ops` call). Only the cache is written; what runs is the same source.
"""

from __future__ import annotations

import compileall
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO
from helpers.deploy import build_cpp_cache
from helpers.deploy_ops import Ops
from helpers.local import end_services
from helpers.sshd import Sshd, start_sshd, write_inventory

PACKAGES = ("ops", "checks", "engine", "kernels", "integration")


def pytest_sessionstart(session: pytest.Session) -> None:
    # A suite started as a background job of a non-interactive shell inherits SIGINT ignored,
    # and so would every process it starts: the tests that stop `ops` with a Ctrl-C (SIGINT)
    # would see nothing happen. A handler here is reset to the default in every child at exec.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in PACKAGES:  # an up-to-date .pyc is left alone; a stale one is rewritten
        compileall.compile_dir(REPO / name, quiet=2)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run with -m gpu on the device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """One OpenSSH server for the whole session; torn down at the end."""
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture
def inventory_file(tmp_path: Path, sshd: Sshd) -> Path:
    """An inventory with `loop` (the session's sshd) and `local`, rooted under tmp_path."""
    return write_inventory(tmp_path / "ops.toml", sshd, tmp_path / "roots")


@pytest.fixture(scope="session")
def cpp_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C++ CPU baseline compiled once for the session, for `Deploy(cache=...)`."""
    return build_cpp_cache(tmp_path_factory.mktemp("cpp-cache"))


@pytest.fixture
def ops(tmp_path: Path):
    """The deploy tests' `Ops` (tests/helpers/deploy_ops.py) on its own root and port, its
    services ended after the test. A module that means another `ops` defines its own."""
    o = Ops(tmp_path)
    yield o
    end_services(o.root)
