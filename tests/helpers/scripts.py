"""The shape of a user mistake's message: `one_line(err)` asserts stderr is one `error: ...`
line with no traceback, and returns it."""

from __future__ import annotations


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]
