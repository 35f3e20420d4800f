"""The control plane stays light: importing every `ops` module pulls in neither torch nor the
engine, so `ops` runs on an operator's laptop with only its base dependencies."""

from __future__ import annotations

import subprocess
import sys


def test_ops_never_imports_torch_or_engine() -> None:
    code = (
        "import sys, pkgutil, importlib, ops\n"
        "for m in pkgutil.iter_modules(ops.__path__):\n"
        "    if m.name != '__main__':\n"
        "        importlib.import_module('ops.' + m.name)\n"
        "heavy = ('torch', 'engine', 'kernels')\n"
        "bad = sorted(k for k in sys.modules if k.split('.')[0] in heavy)\n"
        "print(bad)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
