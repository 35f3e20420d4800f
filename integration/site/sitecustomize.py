"""ddtree-ops release `site/`: Python runs this at start when PYTHONPATH names this directory.

The deploy copies it to `<release>/site/` and the release's service.env sets
`PYTHONPATH=<release>/site:<release>`. With `DDTREE_OPS_SGLANG` unset or empty it imports
nothing and does nothing; otherwise it installs `integration.hook` (from the release root on
sys.path), which never raises. Then it runs the sitecustomize this file shadows (the next one
on sys.path, e.g. a distribution's), as Python would have without us.
"""

import os as _os
import sys as _sys


def _ddtree_ops_install() -> None:
    if not (_os.environ.get("DDTREE_OPS_SGLANG") or "").strip():
        return
    try:
        from integration import hook
    except Exception as exc:  # no release root on sys.path: say so, start anyway
        _sys.stderr.write(f"ddtree-ops hook: not installed: cannot import integration ({exc})\n")
        return
    hook.install()


def _run_shadowed_sitecustomize() -> None:
    """Execute the next `sitecustomize` on sys.path after this file's directory, if any."""
    import importlib.machinery
    import importlib.util

    here = _os.path.dirname(_os.path.realpath(__file__))
    entries = [p for p in _sys.path if _os.path.realpath(p or ".") != here]
    spec = None
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", entries)
        if spec is None or spec.loader is None or spec.origin is None:
            return
        if _os.path.realpath(spec.origin) == _os.path.realpath(__file__):
            return
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as exc:  # as site.py treats a failing sitecustomize: report, go on
        origin = getattr(spec, "origin", "?")
        _sys.stderr.write(f"Error in shadowed sitecustomize {origin}: {exc}\n")


_ddtree_ops_install()
_run_shadowed_sitecustomize()
