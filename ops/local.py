"""LocalHost: the two Host primitives as subprocesses of ops (the target `local`)."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import time

from ops.remote import TIMEOUT_RC, Host, Proc


class _LocalProc(Proc):
    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._p = popen
        self._buf = b""

    def read_line(self, timeout: float) -> str | None:
        assert self._p.stdout is not None
        fd = self._p.stdout.fileno()
        end = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            self._buf += chunk
        if not self._buf:
            return None
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("utf-8", "replace")

    def finish(self, timeout: float) -> int:
        if self._p.stdin:
            with contextlib.suppress(OSError):
                self._p.stdin.close()
        try:
            return self._p.wait(timeout)
        except subprocess.TimeoutExpired:
            self._p.kill()
            return self._p.wait()
        finally:
            if self._p.stdout:
                self._p.stdout.close()


class LocalHost(Host):
    """This machine: commands are bash subprocesses of ops."""

    def _exec(
        self, command: str, *, stdin: bytes | None, deadline_s: float
    ) -> tuple[int, bytes, bytes]:
        proc = subprocess.Popen(
            ["bash", "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(stdin or b"", timeout=deadline_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            out, err = proc.communicate()
            return TIMEOUT_RC, out, err
        return proc.returncode, out, err

    def _spawn(self, command: str) -> Proc:
        popen = subprocess.Popen(
            ["bash", "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return _LocalProc(popen)
