"""The control plane stays light and the tree draws the architecture: importing every `ops`
module (subpackages included) pulls in neither torch nor the engine; no module of the project
imports another in a circle; the kernels import no other package of the project; `ops/` has no
flat list of more than about 12 modules; every package says its job in a docstring; no product
module imports the CLI layer."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from helpers import REPO

PACKAGES = ("ops", "kernels", "engine", "checks", "integration")


def test_ops_never_imports_torch_or_engine() -> None:
    code = (
        "import sys, pkgutil, importlib, ops\n"
        "for m in pkgutil.walk_packages(ops.__path__, 'ops.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "heavy = ('torch', 'engine', 'kernels')\n"
        "bad = sorted(k for k in sys.modules if k.split('.')[0] in heavy)\n"
        "print(bad)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _top_level_imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Modules of the project that `name` imports when it is imported (module level, outside
    `if TYPE_CHECKING:`; an import inside a function runs later and closes no circle)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = name if is_pkg else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}".strip(".")
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)

    visit(tree.body)
    deps = set()
    for mod in found:
        while mod and mod not in known:
            mod = mod.rpartition(".")[0]
        # a submodule reaching its own package's __init__ is how Python loads it, not a circle
        if mod and mod != name and not name.startswith(mod + "."):
            deps.add(mod)
    return deps


def test_no_import_circle_anywhere() -> None:
    mods = _modules()
    graph = {m: _top_level_imports(p, m, set(mods)) for m, p in mods.items()}
    circles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                circles.append(stack[stack.index(d) :] + [d])
            elif d not in state:
                walk(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            walk(m)
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_kernels_sit_below_the_engine_and_the_integration() -> None:
    """No module of `kernels/` imports `engine`, `integration`, `checks` or `ops` when it is
    imported: the bench's registry names the engine's and the integration's suites as text
    (`kernels.bench.registry`), and they import `kernels.bench.config`."""
    mods = _modules()
    bad = {
        m: sorted(d for d in _top_level_imports(p, m, set(mods)) if d.split(".")[0] != "kernels")
        for m, p in mods.items()
        if m.split(".")[0] == "kernels"
    }
    assert not {m: d for m, d in bad.items() if d}


def test_no_product_module_imports_the_cli() -> None:
    mods = _modules()
    bad = []
    for m, p in mods.items():
        if m.startswith("ops.cli") or m == "ops.__main__":
            continue
        text = p.read_text(encoding="utf-8")
        if "from ops.cli" in text or "import ops.cli" in text:
            bad.append(m)
    assert not bad, bad


def test_ops_is_a_few_parts_each_saying_its_job() -> None:
    flat = sorted(p.name for p in (REPO / "ops").glob("*.py"))
    assert len(flat) <= 12, flat
    for init in [REPO / p / "__init__.py" for p in PACKAGES] + list(
        (REPO / "ops").glob("*/__init__.py")
    ):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and len(doc.split()) >= 12, f"{init.relative_to(REPO)} says nothing of its job"
