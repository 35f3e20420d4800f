"""The benchmark scripts as modules, and the shape of a user mistake's message.

`load_benchmark("engine_steps")` imports benchmarks/engine_steps.py (not a package) so a test
can call its `main(argv)` in process; `one_line(err)` asserts stderr is one `error: ...` line
with no traceback, and returns it.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

from . import REPO


def load_benchmark(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]
