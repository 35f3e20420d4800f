"""Shared fixtures (a real sshd on loopback) and the `gpu` marker (skipped without a CUDA GPU)."""

from __future__ import annotations

import pytest


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


# -- real sshd on loopback ---------------------------------------------------------------
import sys  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

from sshd import Sshd, start_sshd  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """One OpenSSH server for the whole session; torn down at the end."""
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


def write_inventory(path: Path, server: Sshd, remote_root: Path, **overrides: object) -> Path:
    """An ops.toml with target `loop` (the sshd) and `local`, both rooted under tmp dirs."""
    fields = {
        "address": "127.0.0.1",
        "port": server.port,
        "user": server.user,
        "ssh_key": str(server.user_key),
        "known_hosts": str(server.known_hosts),
        "connect_timeout": 5,
        "python": sys.executable,
        "remote_root": str(remote_root / "loop"),
        "gpus": 0,
    }
    fields.update(overrides)
    lines = ["[targets.loop]"]
    lines += [f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}" for k, v in fields.items()]
    lines += ["", "[targets.local]", f"remote_root = {str(remote_root / 'local')!r}"]
    lines += ["", "[groups]", 'both = ["local", "loop"]', ""]
    path.write_text("\n".join(lines))
    return path


@pytest.fixture
def inventory_file(tmp_path: Path, sshd: Sshd) -> Path:
    return write_inventory(tmp_path / "ops.toml", sshd, tmp_path / "roots")
