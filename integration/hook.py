"""Import hook: swap the SGLang fork's DDTree tree builder / accept walk for ours at import time,
and count and time every call of them (the service's stage clock).

A release's `site/sitecustomize.py` calls `install()` at interpreter start. With
`DDTREE_OPS_SGLANG` unset (or empty) nothing happens at all. `DDTREE_OPS_SGLANG=off` logs one
line and records "off". Otherwise the setting is comma-separated items (`parse_setting`):

- `COMPONENT=KIND`: serve that component by a drop-in (kinds `cpp`, `cuda` for the tree build,
  `cpp` for the walk; `reference` = keep the stock function), e.g. `tree_build=cpp,accept=cpp`;
- `shadow:COMPONENT=KIND[/N]`: keep the stock function serving and run KIND beside it on the
  same inputs, one call in N (default every call), comparing the answers and timing both
  (`integration.shadow`; KIND a drop-in kind or `module.path:function`);
- `measure`: nothing replaced (the same as an empty list of replacements).

A meta-path finder waits for `sglang.srt.speculative.dflash_ddtree_utils`; when the module is
first imported, its code runs as usual and then, before the import returns to anyone, the
named functions are replaced by the drop-ins of `integration.sglang_dropins`, each holding the
function it replaced (its fallback for the inputs it does not take). A function is recognised
by its signature (names, kinds, defaults): `CONTRACTS` holds one entry per known version of the
fork (the 3-parameter builder of 6d9866b3, the one with `workspace=None` of 807ab0e4); a new
version is one entry there. A bad setting, a missing module, a missing function, a signature of
no entry, or drop-ins (or a shadow's candidate) that cannot load change nothing of what serves:
one line on stderr says why, and the service starts as it would without the hook.

Whatever the setting (but `off`), once the module is imported both functions, the stock ones or
the drop-ins that serve, are counted and timed per process in a memory-mapped counters file,
`<run>/hook-counters/<pid>.bin` (`integration.counters`; read by `python -m
checks.hook_counters`), with no I/O on the call path; <run> is the directory of the status file.

Every outcome logs one line (`ddtree-ops hook: ...`, with the release id from
`DDTREE_RELEASE_ID`) and writes a status JSON (atomically, `checks.atomic`: the release's own
`checks`, standard library only) to `$DDTREE_OPS_HOOK_STATUS`, default
`<release>/run/hook-status.json` (<release> = the directory holding the `integration` package):
`active` (everything the setting asked for is in place), `asked` {function: item}, `replaced`
{function: setting}, `shadowed` {function: item}, `contracts` {function: fork version},
`reason`, `module_found` (false: this service has no fork module, nothing to act on),
`counters` (the file, or why none), and in plain words `in_use` {function: "stock builder in
use because <reason>" or "drop-in ... in use (...)"} and `summary` (those sentences joined) for
the healthcheck to print as they are. `python -m integration.hook --json [--status PATH]`
prints that status for the healthcheck. Until the fork's module is imported, this module and
what it imports are the standard library only.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks.atomic import write_atomic
from checks.vocabulary import HOOK_BACKENDS

ENV_SPEC, ENV_STATUS = "DDTREE_OPS_SGLANG", "DDTREE_OPS_HOOK_STATUS"
ENV_RELEASE = "DDTREE_RELEASE_ID"
MODULE = "sglang.srt.speculative.dflash_ddtree_utils"
KEEP = "reference"  # the stock function stays
SHADOW = "shadow:"  # an item's prefix: the stock serves, the kind runs beside it
MAX_EVERY = 1_000_000
REQUIRED = "<required>"  # a parameter without a default, in a signature's description


def _swaps(component: str) -> tuple[str, ...]:
    """The kinds that replace the fork's function (checks.vocabulary; `reference` keeps it)."""
    return tuple(k for k in HOOK_BACKENDS[component] if k != KEEP)


# component -> (function in MODULE, what it is in a sentence, the kinds we can put in its place)
COMPONENTS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "tree_build": ("build_ddtree_tree_from_topk", "builder", _swaps("tree_build")),
    "accept": ("follow_verified_tree", "accept walk", _swaps("accept")),
}
RELEASE_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Contract:
    """One version of a function of MODULE that the drop-ins serve, known by its signature.

    `params`: (name, kind, default) per parameter as `describe` gives them (kind as in
    inspect.Parameter, default its repr or REQUIRED). `passive`: parameter -> the class in
    MODULE whose instances (or the default) leave the answer unchanged; the drop-in accepts
    and ignores them (integration.sglang_dropins says why for the workspace)."""

    component: str
    version: str
    params: tuple[tuple[str, str, str], ...]
    passive: tuple[tuple[str, str], ...] = ()


def _p(name: str, default: str = REQUIRED) -> tuple[str, str, str]:
    return (name, "POSITIONAL_OR_KEYWORD", default)


# A new version of the fork's signature is one entry here.
CONTRACTS: tuple[Contract, ...] = (
    Contract("tree_build", "fork 6d9866b3",
             (_p("top_log_probs"), _p("top_token_ids"), _p("budget"))),
    Contract("tree_build", "fork 807ab0e4",
             (_p("top_log_probs"), _p("top_token_ids"), _p("budget"), _p("workspace", "None")),
             passive=(("workspace", "DFlashDDTreeBuildWorkspace"),)),
    Contract("accept", "fork 6d9866b3", (_p("child_maps"), _p("posterior"))),
)  # fmt: skip


class Refused(Exception):
    """Why the hook leaves the module as it is."""


@dataclass
class Setting:
    """`DDTREE_OPS_SGLANG` parsed: component -> drop-in kind, component -> (candidate, N)."""

    replace: dict[str, str] = field(default_factory=dict)
    shadow: dict[str, tuple[str, int]] = field(default_factory=dict)

    def asked(self) -> dict[str, str]:
        """Per function of MODULE, the item that asked for something to change."""
        out = {COMPONENTS[c][0]: f"{c}={k}" for c, k in self.replace.items()}
        for c, (kind, every) in self.shadow.items():
            out[COMPONENTS[c][0]] = shadow_item(c, kind, every)
        return out


def shadow_item(component: str, kind: str, every: int) -> str:
    return f"shadow:{component}={kind}" + (f"/{every}" if every > 1 else "")


def _known() -> str:
    kinds = "; ".join(f"{c}={'|'.join((KEEP, *v[2]))}" for c, v in COMPONENTS.items())
    return (f"known: {kinds}; shadow:COMPONENT=KIND[/N] with KIND a drop-in kind or "
            "module.path:function; measure")  # fmt: skip


def parse_setting(text: str) -> Setting:
    """'tree_build=cpp,shadow:accept=cpp/8,measure' -> Setting; Refused when malformed."""
    out = Setting()
    for item in (s.strip() for s in text.split(",")):
        if not item or item == "measure":
            continue
        shadow = item.startswith(SHADOW)
        comp, sep, kind = (x.strip() for x in item.removeprefix(SHADOW).partition("="))
        every = 1
        if shadow and "/" in kind:
            kind, _, n = kind.rpartition("/")
            every = int(n) if n.isdigit() and 0 < int(n) <= MAX_EVERY else 0
        ok = sep and comp in COMPONENTS and every > 0
        if ok and shadow:
            ok = kind in COMPONENTS[comp][2] or _import_path(kind)
        elif ok:
            ok = kind in (KEEP, *COMPONENTS[comp][2])
        if not ok:
            raise Refused(f"{ENV_SPEC}={text!r}: bad item {item!r} ({_known()})")
        if comp in out.replace or comp in out.shadow:
            raise Refused(f"{ENV_SPEC}={text!r}: {comp} is named twice")
        if shadow:
            out.shadow[comp] = (kind, every)
        elif kind != KEEP:
            out.replace[comp] = kind
    return out


def parse_spec(text: str) -> dict[str, str]:
    """'tree_build=cpp,accept=cpp' -> {component: kind} (kinds other than `reference`)."""
    return parse_setting(text).replace


def _import_path(kind: str) -> bool:
    mod, sep, fn = kind.partition(":")
    return bool(sep) and all(p.isidentifier() for p in mod.split(".")) and fn.isidentifier()


def status_path(environ: dict[str, str] | os._Environ = os.environ) -> Path:
    return Path(environ.get(ENV_STATUS) or RELEASE_ROOT / "run" / "hook-status.json")


class Hook(importlib.abc.MetaPathFinder):
    """Waits for MODULE on sys.meta_path; patches it once its own code has run."""

    def __init__(self, spec: str, setting: Setting | None = None, environ: Any = os.environ):
        self.spec_text, self.setting = spec, setting or Setting()
        self.release_id = environ.get(ENV_RELEASE) or "unknown"
        self.status_file = status_path(environ)
        self.run_dir = self.status_file.parent  # the counters and a shadow's saved cases
        self.stock: dict[str, Any] = {}  # the functions the hook wrapped or replaced, by name
        self.counters: Any = None  # integration.counters.Counters, once the module is patched
        self.counters_error: str | None = None
        self.status: dict[str, Any] = {}

    @property
    def chosen(self) -> dict[str, str]:
        """The drop-ins asked for, {component: kind}."""
        return self.setting.replace

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
        """Replace the chosen functions (all or none), arm the shadows, count every call of
        both functions; never raises."""
        reason, news, shadows = None, {}, {}
        try:
            news, shadows = self._dropins(module)
        except Refused as exc:
            reason = str(exc)
        except Exception as exc:  # our own bug or an unloadable drop-in: the service still starts
            reason = f"drop-ins not loaded: {type(exc).__name__}: {exc}"
        if reason is not None:
            news, shadows = {}, {}
        counted = self._count(module, news, shadows)
        for name, (stock, new, _, _) in news.items():
            self.stock[name] = stock
            setattr(module, name, counted.get(name, new))
        replaced = {name: what for name, (_, _, what, _) in news.items()}
        contracts = {name: v for name, (_, _, _, v) in news.items()}
        contracts.update({name: v for name, (_, _, v) in shadows.items()})
        shadowed = {name: item for name, (_, item, _) in shadows.items()}
        self.report(reason is None, replaced, reason, contracts, shadowed)

    def _dropins(self, module: Any) -> tuple[dict[str, tuple], dict[str, tuple]]:
        """The drop-ins {name: (stock, new, setting, version)} and shadow candidates {name:
        (candidate, item, version)} the setting asks for; Refused when any cannot be made."""
        news, shadows = {}, {}
        wanted = [(c, k, 0) for c, k in self.setting.replace.items()]
        wanted += [(c, k, n) for c, (k, n) in self.setting.shadow.items()]
        if not wanted:
            return news, shadows
        from integration import sglang_dropins as dropins

        for comp, kind, every in wanted:
            name = COMPONENTS[comp][0]
            stock = getattr(module, name, None)
            if not callable(stock):
                raise Refused(f"{MODULE} has no function {name}")
            contract = match_contract(comp, stock)
            passive = _passive(module, contract, stock)
            if every:  # a shadow's candidate: made as it would serve, never serving here
                from integration import shadow

                try:
                    cand = shadow.make_candidate(comp, kind, stock, passive)
                except Exception as exc:
                    raise Refused(f"shadow candidate {comp}={kind} cannot run here: {exc}") from exc
                shadows[name] = (cand, shadow_item(comp, kind, every), contract.version)
                continue
            try:
                dropins.check_backend(comp, kind)
            except Exception as exc:
                raise Refused(f"{comp}={kind} cannot run here: {exc}") from exc
            if comp == "tree_build":
                new = dropins.make_build(kind, stock, passive)
            else:
                new = dropins.make_accept(kind, stock)
            if describe(new) != contract.params:  # our own bug: never serve a wrong shape
                raise Refused(f"drop-in {name}{render(describe(new))} is not {contract}")
            news[name] = (stock, new, f"{comp}={kind}", contract.version)
        return news, shadows

    def _count(self, module: Any, news: dict, shadows: dict) -> dict[str, Any]:
        """Both functions of MODULE that exist, counted and timed (the drop-in where one
        serves, else the stock, with its shadow where one is armed); set on the module for
        the stock ones, returned by name. Nothing when the counters cannot be made."""
        out: dict[str, Any] = {}
        try:
            from integration import counters as hc

            self.counters = hc.Counters(self.run_dir)
            for comp, (name, _, _) in COMPONENTS.items():
                stock = getattr(module, name, None)
                if not callable(stock):
                    continue
                if name in shadows:
                    from integration import shadow

                    cand, item, _ = shadows[name]
                    every = self.setting.shadow[comp][1]
                    kind = self.setting.shadow[comp][0]
                    save = shadow.saver(self.run_dir, comp, kind, self.release_id)
                    out[name] = shadow.shadowed(stock, cand, self.counters, comp, every, save)
                else:
                    serving = news[name][1] if name in news else stock
                    out[name] = hc.timed(serving, self.counters, comp)
            for name, fn in out.items():
                if name not in news:
                    self.stock[name] = getattr(module, name)
                    setattr(module, name, fn)
        except Exception as exc:  # the clock is never worth the service: it serves uncounted
            self.counters = None
            self.counters_error = f"calls not counted: {type(exc).__name__}: {exc}"
            return {}
        return out

    # -- the outcome: one log line and the status file --------------------------------
    def report(
        self,
        active: bool,
        replaced: dict[str, str],
        reason: str | None,
        contracts: dict[str, str] | None = None,
        shadowed: dict[str, str] | None = None,
        module_found: bool = True,
    ) -> None:
        shadowed = shadowed or {}
        in_use = in_use_lines(replaced, reason, contracts or {}, shadowed)
        c = self.counters
        counters = self.counters_error if c is None else str(c.path) if c.path else c.error
        self.status = {
            "active": active, "module": MODULE, "spec": self.spec_text,
            "asked": self.setting.asked(), "replaced": replaced, "shadowed": shadowed,
            "contracts": contracts or {}, "reason": reason, "module_found": module_found,
            "in_use": in_use, "summary": "; ".join(in_use.values()), "counters": counters,
            "release_id": self.release_id, "pid": os.getpid(),
            "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "hook": str(Path(__file__).resolve()),
        }  # fmt: skip
        if active and (replaced or shadowed):
            parts = [
                f"{verb} " + ", ".join(f"{n} ({w})" for n, w in done.items())
                for verb, done in (("replaced", replaced), ("shadowed", shadowed))
                if done
            ]
            line = f"{'; '.join(parts)} in {MODULE}"
        elif active:
            line = f"nothing replaced, calls counted in {MODULE} ({self.spec_text})"
        else:
            line = f"nothing replaced: {reason}"
        log(f"release {self.release_id}: {line}{write_status(self.status_file, self.status)}")


def in_use_lines(
    replaced: dict[str, str],
    reason: str | None,
    contracts: dict[str, str],
    shadowed: dict[str, str] | None = None,
) -> dict[str, str]:
    """Per function of MODULE, one plain sentence: which one serves the service, and why."""
    out = {}
    for comp, (name, what, _) in COMPONENTS.items():
        if name in replaced:
            out[name] = f"drop-in {what} in use ({replaced[name]}, {contracts.get(name)} contract)"
        elif shadowed and name in shadowed:
            out[name] = (f"stock {what} in use, shadowed ({shadowed[name]}: compared, never "
                         "serving)")  # fmt: skip
        elif reason is None:
            out[name] = f"stock {what} in use because {ENV_SPEC} keeps it ({comp} not replaced)"
        else:
            out[name] = f"stock {what} in use because {reason}"
    return out


def match_contract(component: str, stock: Any) -> Contract:
    """The contract whose signature `stock` has (names, kinds, defaults), or Refused."""
    got = describe(stock)
    known = [c for c in CONTRACTS if c.component == component]
    for contract in known:
        if got == contract.params:
            return contract
    name = COMPONENTS[component][0]
    alts = " or ".join(f"{name}{render(c.params)} ({c.version})" for c in known)
    raise Refused(f"{MODULE}.{name}{render(got)} is not the expected {alts}")


def _passive(module: Any, contract: Contract, stock: Any) -> tuple[tuple[str, Any, type], ...]:
    """(parameter, its default in `stock`, the class of MODULE it names) per passive one."""
    out = []
    defaults = inspect.signature(stock).parameters
    for param, cls_name in contract.passive:
        cls = getattr(module, cls_name, None)
        if not isinstance(cls, type):
            raise Refused(f"{MODULE} has no class {cls_name} (the type of {param})")
        out.append((param, defaults[param].default, cls))
    return tuple(out)


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


def describe(fn: Any) -> tuple[tuple[str, str, str], ...] | str:
    """A signature as (name, kind, default's repr or REQUIRED) per parameter (no annotations)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return "(signature unreadable)"
    return tuple(
        (p.name, p.kind.name, REQUIRED if p.default is p.empty else repr(p.default)) for p in params
    )


def render(desc: tuple[tuple[str, str, str], ...] | str) -> str:
    """('a', 'POSITIONAL_OR_KEYWORD', 'None'), ... -> '(a=None, ...)'-like text for the log."""
    if isinstance(desc, str):
        return desc
    marks = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**", "KEYWORD_ONLY": "kw:"}
    parts = [
        marks.get(kind, "") + name + ("" if default == REQUIRED else f"={default}")
        for name, kind, default in desc
    ]
    return "(" + ", ".join(parts) + ")"


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
    hook = Hook(text, None, environ)
    try:
        if text.lower() == "off":
            raise Refused(f"{ENV_SPEC}=off")
        hook.setting = parse_setting(text)
        if MODULE in sys.modules:
            raise Refused(f"{MODULE} was imported before the hook could be installed")
        missing = _module_location(MODULE)
        if missing:
            hook.report(False, {}, f"{MODULE} not found: {missing}", module_found=False)
            return None
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
