"""`--device` of the engine's commands: whether this torch can run on it, as one line.

`check_device(device)` raises `DeviceError` (a ValueError) with a sentence a user can act on
(no CUDA in this torch, no such GPU, a malformed name); `python -m engine`, `engine.golden` and
`engine.bench` print it and exit 2 before building anything.
"""

from __future__ import annotations


class DeviceError(ValueError):
    """The device cannot be used by this torch on this host."""


def check_device(device: str) -> None:
    """DeviceError unless this torch can run on `device` (cpu, cuda, cuda:N)."""
    if device == "cpu":
        return  # no torch import: `--check` of a CPU engine stays fast
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise DeviceError(f"bad --device {device!r}: expected cpu, cuda or cuda:N")
    if dev.type == "cpu":
        return
    if not torch.cuda.is_available():
        built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise DeviceError(
            f"--device {device}: CUDA is not available to this torch {torch.__version__} "
            f"({built}); use --device cpu, or a CUDA torch on a host with a GPU"
        )
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise DeviceError(f"--device {device}: this host has {count} CUDA device(s)")
