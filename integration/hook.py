"""Import hook: swap the SGLang fork's DDTree tree builder / accept walk for ours at import time.

A release's `site/sitecustomize.py` calls `install()` at interpreter start. With
`DDTREE_OPS_SGLANG` unset (or empty) nothing happens at all. `DDTREE_OPS_SGLANG=off` logs one
line and records "off". Otherwise (e.g. `tree_build=cpp,accept=cpp`; kinds `cpp`, `cuda` for
the tree build, `cpp` for the walk, `reference` = keep the stock function) a meta-path finder
waits for `sglang.srt.speculative.dflash_ddtree_utils`; when the module is first imported, its
code runs as usual and then, before the import returns to anyone, the named functions are
replaced by the drop-ins of `integration.sglang_dropins`. A bad setting, a missing module, a
missing function, a signature other than the contract's, or drop-ins that cannot load change
nothing: one line on stderr says why, and the service starts as it would without the hook.

Every outcome logs one line (`ddtree-ops hook: ...`, with the release id from
`DDTREE_RELEASE_ID`) and writes a status JSON (atomically, `checks.atomic`: the release's own
`checks`, standard library only) to `$DDTREE_OPS_HOOK_STATUS`, default
`<release>/run/hook-status.json` (<release> = the directory holding the `integration` package).
`python -m integration.hook --json [--status PATH]` prints that status for the healthcheck.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

from checks.atomic import write_atomic

ENV_SPEC, ENV_STATUS = "DDTREE_OPS_SGLANG", "DDTREE_OPS_HOOK_STATUS"
ENV_RELEASE = "DDTREE_RELEASE_ID"
MODULE = "sglang.srt.speculative.dflash_ddtree_utils"
KEEP = "reference"  # the stock function stays
# component -> (function in MODULE, its parameters, the kinds we can put in its place)
COMPONENTS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "tree_build": ("build_ddtree_tree_from_topk", ("top_log_probs", "top_token_ids", "budget"),
                   ("cpp", "cuda")),
    "accept": ("follow_verified_tree", ("child_maps", "posterior"), ("cpp",)),
}  # fmt: skip
RELEASE_ROOT = Path(__file__).resolve().parent.parent


class Refused(Exception):
    """Why the hook leaves the module as it is."""


def parse_spec(text: str) -> dict[str, str]:
    """'tree_build=cpp,accept=cpp' -> {component: kind} (kinds other than `reference`)."""
    chosen: dict[str, str] = {}
    for item in (s.strip() for s in text.split(",")):
        comp, sep, kind = (x.strip() for x in item.partition("="))
        if not item:
            continue
        if not sep or comp not in COMPONENTS or kind not in (KEEP, *COMPONENTS[comp][2]):
            known = "; ".join(f"{c}={'|'.join((KEEP, *v[2]))}" for c, v in COMPONENTS.items())
            raise Refused(f"{ENV_SPEC}={text!r}: bad item {item!r} (known: {known})")
        if kind != KEEP:
            chosen[comp] = kind
    return chosen


def status_path(environ: dict[str, str] | os._Environ = os.environ) -> Path:
    return Path(environ.get(ENV_STATUS) or RELEASE_ROOT / "run" / "hook-status.json")


class Hook(importlib.abc.MetaPathFinder):
    """Waits for MODULE on sys.meta_path; patches it once its own code has run."""

    def __init__(self, spec: str, chosen: dict[str, str], environ: Any = os.environ) -> None:
        self.spec_text, self.chosen = spec, chosen
        self.release_id = environ.get(ENV_RELEASE) or "unknown"
        self.status_file = status_path(environ)
        self.stock: dict[str, Any] = {}  # the replaced functions, by name
        self.status: dict[str, Any] = {}

    # -- the finder and its loader ---------------------------------------------------
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None  # the import fails as it would without us
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            self.report(False, {}, f"{MODULE}: its loader cannot be wrapped; nothing replaced")
            return spec
        spec.loader = _PatchingLoader(spec.loader, self)
        return spec

    def patch(self, module: Any) -> None:
        """Replace the chosen functions, all or none; never raises."""
        try:
            from integration import sglang_dropins as dropins

            news = {}
            for comp, kind in self.chosen.items():
                name, params, _ = COMPONENTS[comp]
                stock = getattr(module, name, None)
                if not callable(stock):
                    raise Refused(f"{MODULE} has no function {name}")
                want, got = expected_signature(params), describe(stock)
                if got != want:
                    raise Refused(f"{MODULE}.{name}{render(got)} is not the expected "
                                  f"{name}{render(want)}")  # fmt: skip
                try:
                    dropins.check_backend(comp, kind)
                except Exception as exc:
                    raise Refused(f"{comp}={kind} cannot run here: {exc}") from exc
                make = dropins.make_build if comp == "tree_build" else dropins.make_accept
                news[name] = (stock, make(kind), f"{comp}={kind}")
        except Refused as exc:
            self.report(False, {}, str(exc))
            return
        except Exception as exc:  # our own bug or an unloadable drop-in: the service still starts
            self.report(False, {}, f"drop-ins not loaded: {type(exc).__name__}: {exc}")
            return
        for name, (stock, new, _) in news.items():
            self.stock[name] = stock
            setattr(module, name, new)
        self.report(True, {name: what for name, (_, _, what) in news.items()}, None)

    # -- the outcome: one log line and the status file --------------------------------
    def report(self, active: bool, replaced: dict[str, str], reason: str | None) -> None:
        self.status = {
            "active": active, "module": MODULE, "spec": self.spec_text, "replaced": replaced,
            "reason": reason, "release_id": self.release_id, "pid": os.getpid(),
            "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "hook": str(Path(__file__).resolve()),
        }  # fmt: skip
        if active:
            what = ", ".join(f"{n} ({w})" for n, w in replaced.items())
            line = f"replaced {what} in {MODULE}"
        else:
            line = f"nothing replaced: {reason}"
        log(f"release {self.release_id}: {line}{write_status(self.status_file, self.status)}")


class _PatchingLoader(importlib.abc.Loader):
    """The module's own loader; after its code has run, the hook patches the module."""

    def __init__(self, loader: Any, hook: Hook) -> None:
        self._loader, self._hook = loader, hook

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)  # the module's own errors are its own
        self._hook.patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ...
        return getattr(self._loader, name)


def describe(fn: Any) -> tuple[tuple[str, str, bool], ...] | str:
    """A signature as (name, kind, has default) per parameter (annotations ignored)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return "(signature unreadable)"
    return tuple((p.name, p.kind.name, p.default is not p.empty) for p in params)


def render(desc: tuple[tuple[str, str, bool], ...] | str) -> str:
    """('a', 'POSITIONAL_OR_KEYWORD', False), ... -> '(a, *, b=...)'-like text for the log."""
    if isinstance(desc, str):
        return desc
    marks = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**", "KEYWORD_ONLY": "kw:"}
    parts = [
        marks.get(kind, "") + name + ("=..." if default else "") for name, kind, default in desc
    ]
    return "(" + ", ".join(parts) + ")"


def expected_signature(names: tuple[str, ...]) -> tuple[tuple[str, str, bool], ...]:
    """The contract's parameters: plain positional-or-keyword, no defaults."""
    return tuple((n, "POSITIONAL_OR_KEYWORD", False) for n in names)


def log(msg: str) -> None:
    try:
        sys.stderr.write(f"ddtree-ops hook: {msg}\n")
        sys.stderr.flush()
    except Exception:  # a closed stderr must not stop the service
        pass


def write_status(path: Path, status: dict[str, Any]) -> str:
    """Write atomically; returns '' or ' (status not written: why)' for the log line."""
    try:
        write_atomic(path, json.dumps({**status, "status_file": str(path)}, indent=1).encode())
        return ""
    except Exception as exc:
        return f" (status not written: {exc})"


def _module_location(name: str) -> str | None:
    """Why `name` cannot be imported here, or None if a file for it exists (nothing imported)."""
    top, *rest = name.split(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level lookup imports nothing
    except (ImportError, ValueError) as exc:
        return f"no module named {top!r} ({exc})"
    if spec is None:
        return f"no module named {top!r} on sys.path"
    found, locations = top, spec.submodule_search_locations
    for part in rest:
        if locations is None:
            return f"{found} is not a package"
        found += "." + part
        spec = importlib.machinery.PathFinder.find_spec(found, list(locations))
        if spec is None:
            return f"no module named {found!r} under {list(locations)}"
        locations = spec.submodule_search_locations
    return None


def install(environ: Any = None) -> Hook | None:
    """Install the hook as `environ` asks; None when it does nothing. Never raises."""
    environ = os.environ if environ is None else environ
    text = (environ.get(ENV_SPEC) or "").strip()
    if not text:
        return None
    for finder in sys.meta_path:
        if isinstance(finder, Hook):
            return finder  # installed already (one finder per process)
    hook = Hook(text, {}, environ)
    try:
        if text.lower() == "off":
            raise Refused(f"{ENV_SPEC}=off")
        hook.chosen = parse_spec(text)
        if not hook.chosen:
            raise Refused(f"{ENV_SPEC}={text!r} keeps every stock function")
        if MODULE in sys.modules:
            raise Refused(f"{MODULE} was imported before the hook could be installed")
        missing = _module_location(MODULE)
        if missing:
            raise Refused(f"{MODULE} not found: {missing}")
    except Refused as exc:
        hook.report(False, {}, str(exc))
        return None
    except Exception as exc:
        hook.report(False, {}, f"hook not installed: {type(exc).__name__}: {exc}")
        return None
    sys.meta_path.insert(0, hook)
    return hook


def uninstall(hook: Hook) -> None:
    """Take the finder off sys.meta_path (a patched module stays patched)."""
    if hook in sys.meta_path:
        sys.meta_path.remove(hook)


def main(argv: list[str] | None = None) -> int:
    desc = "Print the import hook's status (what it replaced, for the healthcheck)."
    ap = argparse.ArgumentParser(prog="python -m integration.hook", description=desc)
    ap.add_argument("--json", action="store_true", help="print one JSON document (always on)")
    ap.add_argument("--status", type=Path, help=f"status file (default: ${ENV_STATUS} or "
                    "<release>/run/hook-status.json)")  # fmt: skip
    args = ap.parse_args(argv)
    path = args.status or status_path()
    doc: dict[str, Any] = {"ok": True, "path": str(path), "present": path.is_file(), "status": None}
    if doc["present"]:
        try:
            doc["status"] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            doc.update(ok=False, error=f"{path}: unreadable status ({exc})")
    print(json.dumps(doc))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
