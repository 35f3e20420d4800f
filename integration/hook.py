"""Import hook: swap the SGLang fork's DDTree functions (the tree builder, the accept walk, the
GPU accept walk) for ours at import time, and count and time every call of them (the service's
stage clock).

A release's `site/sitecustomize.py` calls `install()` at interpreter start. With
`DDTREE_OPS_SGLANG` unset (or empty) nothing happens at all. `DDTREE_OPS_SGLANG=off` logs one
line and records "off". Otherwise the setting is comma-separated items (`parse_setting`):

- `COMPONENT=KIND`: serve that component by a drop-in (`reference` = keep the stock function),
  e.g. `tree_build=cpp,accept=cpp` or `gpu_accept=cuda`;
- `shadow:COMPONENT=KIND[/N]`: keep the stock function serving and run KIND beside it on the
  same inputs, one call in N (default every call), comparing the answers and timing both
  (`integration.shadow`; KIND a drop-in kind or `module.path:function`);
- `measure`: nothing replaced (the same as an empty list of replacements).

The hook's table, one entry per component (`COMPONENTS`; the kinds from checks.vocabulary's
HOOK_BACKENDS) and one per known version of a function's signature (`CONTRACTS`):

- `tree_build`: `build_ddtree_tree_from_topk` of `dflash_ddtree_utils`; kinds `cpp`, `cuda`;
  versions 6d9866b3 (three parameters) and 807ab0e4 (with `workspace=None`);
- `accept`: `follow_verified_tree` of `dflash_ddtree_utils` (imported by name in
  `dflash_ddtree_info`); kind `cpp`; version 6d9866b3;
- `gpu_accept`: `_compute_ddtree_accept_triton_unchecked` of `triton_ops.ddtree` (imported by
  name in `dflash_ddtree_info`), the newer fork's Triton walk of the verified trees, outputs
  written in place; kind `cuda` (`integration.gpu_accept`: the project's CUDA kernel, the stock
  function its fallback); version 4b08d3cc;

(modules under `sglang.srt.speculative`; drop-ins made by `integration.sglang_dropins.make`
and `integration.gpu_accept.make`). A new version of a signature is one CONTRACTS entry; a new
function is one COMPONENTS entry and its contract.

A meta-path finder waits for the modules of the table. When one is first imported, its code
runs as usual and then, before the import returns to anyone, the functions it defines that the
setting names are replaced by drop-ins, each holding the function it replaced (its fallback
for the inputs it does not take), all of that module's or none; a module that imports one of
them by name (`from ... import f`, as `dflash_ddtree_info` does) gets the replacement when it
imports it after the defining module was patched, and is patched itself where it holds the
stock function. A function is recognised by its signature (names, kinds, defaults). A bad
setting, a missing module, a missing function, a signature of no entry, or a drop-in (or a
shadow's candidate) that cannot load (`gpu_accept=cuda` where torch sees no CUDA device)
change nothing of what serves: one line on stderr says why, and the service runs the stock
function.

Whatever the setting (but `off`), once a module is imported the functions of the table it
defines, the stock ones or the drop-ins that serve, are counted and timed per process in a
memory-mapped counters file, `<run>/hook-counters/<pid>.bin` (`integration.counters`; read by
`python -m checks.hook_counters`), with no I/O on the call path; <run> is the directory of the
status file. The clock reads the host's time around the call: for the GPU accept walk that is
its launch (and whatever the function waits for), not the kernel's time on the GPU.

Every outcome logs one line per module (`ddtree-ops hook: ...`, with the release id from
`DDTREE_RELEASE_ID`) and writes a status JSON (atomically, `checks.atomic`: the release's own
`checks`, standard library only) to `$DDTREE_OPS_HOOK_STATUS`, default
`<release>/run/hook-status.json` (<release> = the directory holding the `integration` package):
`active` (everything the setting asked for is in place), `asked` {function: item}, `replaced`
{function: setting}, `shadowed` {function: item}, `contracts` {function: fork version},
`modules` {function: the module it was patched in}, `reason`, `module_found` (false: this
service has no fork module, nothing to act on), `counters` (the file, or why none), and in
plain words `in_use` {function: "stock builder in use because <reason>" or "drop-in ... in use
(...)"}, for every function whose module is loaded or that the setting names, and `summary`
(those sentences joined) for the healthcheck to print as they are. `python -m integration.hook
--json [--status PATH]` prints that status for the healthcheck. Until a module of the table is
imported, this module and what it imports are the standard library only.
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
from typing import Any, NamedTuple

from checks.atomic import write_atomic
from checks.vocabulary import HOOK_BACKENDS

ENV_SPEC, ENV_STATUS = "DDTREE_OPS_SGLANG", "DDTREE_OPS_HOOK_STATUS"
ENV_RELEASE = "DDTREE_RELEASE_ID"
PACKAGE = "sglang.srt.speculative"
MODULE = f"{PACKAGE}.dflash_ddtree_utils"  # the fork's builder and walk (its main module)
GPU_MODULE = f"{PACKAGE}.triton_ops.ddtree"  # the newer fork's GPU accept walk
INFO_MODULE = f"{PACKAGE}.dflash_ddtree_info"  # its verify step: imports both walks by name
KEEP = "reference"  # the stock function stays
SHADOW = "shadow:"  # an item's prefix: the stock serves, the kind runs beside it
MAX_EVERY = 1_000_000
REQUIRED = "<required>"  # a parameter without a default, in a signature's description


def _swaps(component: str) -> tuple[str, ...]:
    """The kinds that replace the fork's function (checks.vocabulary; `reference` keeps it)."""
    return tuple(k for k in HOOK_BACKENDS[component] if k != KEEP)


class Component(NamedTuple):
    """One function of the fork the hook can count, replace or shadow.

    `function` is defined in `module`; `callers` import it by name. `factory` is
    "module:function" of the drop-ins' maker, `(component, kind, stock, passive) -> drop-in`,
    which raises when the kind cannot run here. `outputs`: the parameters the function writes
    in place (its answer, with what it returns, for the shadow's comparison)."""

    function: str
    what: str  # in a sentence
    kinds: tuple[str, ...]  # what can take its place
    module: str
    callers: tuple[str, ...] = ()
    factory: str = "integration.sglang_dropins:make"
    outputs: tuple[str, ...] = ()


# The hook's component table: a new function of the fork is one entry here (and its contract).
COMPONENTS: dict[str, Component] = {
    "tree_build": Component("build_ddtree_tree_from_topk", "builder", _swaps("tree_build"), MODULE),
    "accept": Component(
        "follow_verified_tree", "accept walk", _swaps("accept"), MODULE, (INFO_MODULE,)
    ),
    "gpu_accept": Component(
        "_compute_ddtree_accept_triton_unchecked",
        "GPU accept walk",
        _swaps("gpu_accept"),
        GPU_MODULE,
        (INFO_MODULE,),
        factory="integration.gpu_accept:make",
        outputs=("next_token_ids_out", "commit_lens_out", "accept_index_out"),
    ),
}
# every module the finder waits for: where the functions are defined, then their callers
WATCHED = tuple(
    dict.fromkeys(
        [c.module for c in COMPONENTS.values()]
        + [m for c in COMPONENTS.values() for m in c.callers]
    )
)
RELEASE_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Contract:
    """One version of a function of the fork that the drop-ins serve, known by its signature.

    `params`: (name, kind, default) per parameter as `describe` gives them (kind as in
    inspect.Parameter, default its repr or REQUIRED). `passive`: parameter -> the class in the
    function's module whose instances (or the default) leave the answer unchanged; the drop-in
    accepts and ignores them (integration.sglang_dropins says why for the workspace)."""

    component: str
    version: str
    params: tuple[tuple[str, str, str], ...]
    passive: tuple[tuple[str, str], ...] = ()

    @property
    def core(self) -> tuple[str, ...]:
        """The parameters that make the answer (the shadow's inputs): all but the passive."""
        skip = {name for name, _ in self.passive}
        return tuple(p[0] for p in self.params if p[0] not in skip)


def _p(name: str, default: str = REQUIRED) -> tuple[str, str, str]:
    return (name, "POSITIONAL_OR_KEYWORD", default)


# A new version of a fork's signature is one entry here (kept as a table: one entry a version).
CONTRACTS: tuple[Contract, ...] = (
    Contract("tree_build", "fork 6d9866b3",
             (_p("top_log_probs"), _p("top_token_ids"), _p("budget"))),
    Contract("tree_build", "fork 807ab0e4",
             (_p("top_log_probs"), _p("top_token_ids"), _p("budget"), _p("workspace", "None")),
             passive=(("workspace", "DFlashDDTreeBuildWorkspace"),)),
    Contract("accept", "fork 6d9866b3", (_p("child_maps"), _p("posterior"))),
    Contract("gpu_accept", "fork 4b08d3cc",
             (_p("candidates"), _p("target_top1"), _p("retrieve_next_token"),
              _p("retrieve_next_sibling"), _p("next_token_ids_out"), _p("commit_lens_out"),
              _p("accept_index_out"))),
)  # fmt: skip


class Refused(Exception):
    """Why the hook leaves the module as it is."""


@dataclass
class Setting:
    """`DDTREE_OPS_SGLANG` parsed: component -> drop-in kind, component -> (candidate, N)."""

    replace: dict[str, str] = field(default_factory=dict)
    shadow: dict[str, tuple[str, int]] = field(default_factory=dict)

    def asked(self) -> dict[str, str]:
        """Per function of the fork, the item that asked for something to change."""
        out = {COMPONENTS[c].function: f"{c}={k}" for c, k in self.replace.items()}
        for c, (kind, every) in self.shadow.items():
            out[COMPONENTS[c].function] = shadow_item(c, kind, every)
        return out

    def components(self) -> set[str]:
        return set(self.replace) | set(self.shadow)


def shadow_item(component: str, kind: str, every: int) -> str:
    return f"shadow:{component}={kind}" + (f"/{every}" if every > 1 else "")


def _known() -> str:
    kinds = "; ".join(f"{c}={'|'.join((KEEP, *v.kinds))}" for c, v in COMPONENTS.items())
    return (
        f"known: {kinds}; shadow:COMPONENT=KIND[/N] with KIND a drop-in kind or "
        "module.path:function; measure"
    )


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
            ok = kind in COMPONENTS[comp].kinds or _import_path(kind)
        elif ok:
            ok = kind in (KEEP, *COMPONENTS[comp].kinds)
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


def load_factory(component: str) -> Any:
    """The drop-ins' maker of `component` (COMPONENTS' `factory`), imported."""
    mod, _, name = COMPONENTS[component].factory.partition(":")
    return getattr(importlib.import_module(mod), name)


def status_path(environ: dict[str, str] | os._Environ = os.environ) -> Path:
    return Path(environ.get(ENV_STATUS) or RELEASE_ROOT / "run" / "hook-status.json")


class Hook(importlib.abc.MetaPathFinder):
    """Waits for the modules of the table on sys.meta_path; patches each once its own code has
    run. What it did so far (over every module patched) is in its status."""

    def __init__(self, spec: str, setting: Setting | None = None, environ: Any = os.environ):
        self.spec_text, self.setting = spec, setting or Setting()
        self.release_id = environ.get(ENV_RELEASE) or "unknown"
        self.status_file = status_path(environ)
        self.run_dir = self.status_file.parent  # the counters and a shadow's saved cases
        self.stock: dict[str, Any] = {}  # the functions the hook wrapped or replaced, by name
        self.serving: dict[str, Any] = {}  # by name: what the hook put in the stock's place
        self.counters: Any = None  # integration.counters.Counters, once a module is patched
        self.counters_error: str | None = None
        self.replaced: dict[str, str] = {}
        self.shadowed: dict[str, str] = {}
        self.contracts: dict[str, str] = {}
        self.modules: dict[str, str] = {}  # function -> the module it was patched in
        self.loaded: set[str] = set()  # the modules of the table imported so far
        self.reasons: dict[str, str] = {}  # component -> why it is not in place
        self.status: dict[str, Any] = {}

    @property
    def chosen(self) -> dict[str, str]:
        """The drop-ins asked for, {component: kind}."""
        return self.setting.replace

    # -- the finder and its loader ---------------------------------------------------
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in WATCHED:
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
            for comp, c in COMPONENTS.items():
                if c.module == fullname:
                    self.reasons.setdefault(comp, f"{fullname}: its loader cannot be wrapped")
            self.report(fullname, "its loader cannot be wrapped; nothing replaced")
            return spec
        spec.loader = _PatchingLoader(spec.loader, self)
        return spec

    def patch(self, module: Any) -> None:
        """Patch `module` (a module of the table): replace the chosen functions it defines
        (all or none), arm the shadows, count every call of its functions, hand the
        replacements to a caller that holds the stock; never raises."""
        name = module.__name__
        self.loaded.add(name)
        here = [c for c, v in COMPONENTS.items() if v.module == name]
        reason, news, shadows = None, {}, {}
        try:
            news, shadows = self._dropins(module, here)
        except Refused as exc:
            reason = str(exc)
        except Exception as exc:  # our own bug or an unloadable drop-in: the service still starts
            reason = f"drop-ins not loaded: {type(exc).__name__}: {exc}"
        if reason is not None:
            news, shadows = {}, {}
            for comp in here:
                if comp in self.setting.components():
                    self.reasons[comp] = reason
        counted = self._count(module, here, news, shadows)
        for fn, (stock, new, _, _) in news.items():
            self.stock[fn] = stock
            self.serving[fn] = counted.get(fn, new)
            setattr(module, fn, self.serving[fn])
        for fn, (_, _, what, version) in news.items():
            self.replaced[fn], self.contracts[fn], self.modules[fn] = what, version, name
        for fn, (_, item, version) in shadows.items():
            self.shadowed[fn], self.contracts[fn], self.modules[fn] = item, version, name
        for fn in counted:
            self.modules.setdefault(fn, name)
        handed = self._callers(module)
        if here:
            self.report(name, reason=reason, news=news, shadows=shadows)
        elif handed:
            self.report(name, handed=handed)
        else:
            self._write(None)

    def _callers(self, module: Any) -> list[str]:
        """Where `module` imported a function of the table by name and holds the stock one,
        the function that serves in its place; returns the names set."""
        out = []
        for c in COMPONENTS.values():
            if module.__name__ not in c.callers or c.function not in self.serving:
                continue
            if getattr(module, c.function, None) is self.stock.get(c.function):
                setattr(module, c.function, self.serving[c.function])
                out.append(c.function)
        return out

    def _dropins(self, module: Any, here: list[str]) -> tuple[dict[str, tuple], dict[str, tuple]]:
        """The drop-ins {name: (stock, new, setting, version)} and shadow candidates {name:
        (candidate, item, version)} the setting asks for among the components `module`
        defines; Refused when any cannot be made."""
        news, shadows = {}, {}
        wanted = [(c, k, 0) for c, k in self.setting.replace.items() if c in here]
        wanted += [(c, k, n) for c, (k, n) in self.setting.shadow.items() if c in here]
        for comp, kind, every in wanted:
            name = COMPONENTS[comp].function
            stock = getattr(module, name, None)
            if not callable(stock):
                raise Refused(f"{module.__name__} has no function {name}")
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
                new = load_factory(comp)(comp, kind, stock, passive)
            except Exception as exc:
                raise Refused(f"{comp}={kind} cannot run here: {exc}") from exc
            if describe(new) != contract.params:  # our own bug: never serve a wrong shape
                raise Refused(f"drop-in {name}{render(describe(new))} is not {contract}")
            news[name] = (stock, new, f"{comp}={kind}", contract.version)
        return news, shadows

    def _count(self, module: Any, here: list[str], news: dict, shadows: dict) -> dict[str, Any]:
        """The functions of the table `module` defines, counted and timed (the drop-in where
        one serves, else the stock, with its shadow where one is armed); set on the module for
        the stock ones, returned by name. Nothing when the counters cannot be made."""
        out: dict[str, Any] = {}
        try:
            from integration import counters as hc

            if self.counters is None:
                self.counters = hc.Counters(self.run_dir)
            for comp in here:
                name = COMPONENTS[comp].function
                stock = getattr(module, name, None)
                if not callable(stock):
                    continue
                if name in shadows:
                    from integration import shadow

                    cand, item, _ = shadows[name]
                    kind, every = self.setting.shadow[comp]
                    save = shadow.saver(self.run_dir, comp, kind, self.release_id)
                    out[name] = shadow.shadowed(stock, cand, self.counters, comp, every, save)
                else:
                    serving = news[name][1] if name in news else stock
                    out[name] = hc.timed(serving, self.counters, comp)
            for name, fn in out.items():
                if name not in news:
                    self.stock[name] = getattr(module, name)
                    self.serving[name] = fn
                    setattr(module, name, fn)
        except Exception as exc:  # the clock is never worth the service: it serves uncounted
            self.counters = None
            self.counters_error = f"calls not counted: {type(exc).__name__}: {exc}"
            return {}
        return out

    # -- the outcome: one log line and the status file --------------------------------
    def report(
        self,
        module: str,
        reason: str | None = None,
        news: dict | None = None,
        shadows: dict | None = None,
        handed: list[str] | None = None,
    ) -> None:
        """One log line about `module`, and the status (everything so far) written."""
        replaced = {n: what for n, (_, _, what, _) in (news or {}).items()}
        shadowed = {n: item for n, (_, item, _) in (shadows or {}).items()}
        if handed:
            line = f"handed {', '.join(handed)} to {module} (it imported the stock by name)"
        elif reason is not None:
            line = f"nothing replaced: {reason}"
        elif replaced or shadowed:
            parts = [
                f"{verb} " + ", ".join(f"{n} ({w})" for n, w in done.items())
                for verb, done in (("replaced", replaced), ("shadowed", shadowed))
                if done
            ]
            line = f"{'; '.join(parts)} in {module}"
        else:
            line = f"nothing replaced, calls counted in {module} ({self.spec_text})"
        self._write(line)

    def refuse(self, reason: str, module_found: bool = True) -> None:
        """Nothing installed: the status says why (one log line)."""
        for comp in self.setting.components() or COMPONENTS:
            self.reasons.setdefault(comp, reason)
        self.loaded = {MODULE}  # the sentences speak of the fork's main module
        self._write(f"nothing replaced: {reason}", reason, module_found)

    def _write(
        self, line: str | None, reason: str | None = None, module_found: bool = True
    ) -> None:
        asked = self.setting.components()
        reasons = dict.fromkeys(r for c, r in self.reasons.items() if c in asked or not asked)
        reason = reason or ("; ".join(reasons) if reasons else None)
        missing = [c for c in asked if COMPONENTS[c].function not in self.replaced | self.shadowed]
        active = reason is None and not missing and module_found
        why = dict(self.reasons)
        for comp in missing:
            module = COMPONENTS[comp].module
            if comp not in why and module not in self.loaded:
                why[comp] = f"{module} is not imported (yet)"
        in_use = in_use_lines(
            self.replaced, reason, self.contracts, self.shadowed, self._shown(), why
        )
        c = self.counters
        counters = self.counters_error if c is None else str(c.path) if c.path else c.error
        self.status = {
            "active": active,
            "module": MODULE,
            "spec": self.spec_text,
            "asked": self.setting.asked(),
            "replaced": dict(self.replaced),
            "shadowed": dict(self.shadowed),
            "contracts": dict(self.contracts),
            "modules": dict(self.modules),
            "reason": reason,
            "module_found": module_found,
            "in_use": in_use,
            "summary": "; ".join(in_use.values()),
            "counters": counters,
            "release_id": self.release_id,
            "pid": os.getpid(),
            "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "hook": str(Path(__file__).resolve()),
        }
        written = write_status(self.status_file, self.status)
        if line is not None:
            log(f"release {self.release_id}: {line}{written}")

    def _shown(self) -> list[str]:
        """The components the sentences speak of: those whose module is loaded or that the
        setting names."""
        asked = self.setting.components()
        return [c for c, v in COMPONENTS.items() if v.module in self.loaded or c in asked]


def in_use_lines(
    replaced: dict[str, str],
    reason: str | None,
    contracts: dict[str, str],
    shadowed: dict[str, str] | None = None,
    shown: list[str] | None = None,
    reasons: dict[str, str] | None = None,
) -> dict[str, str]:
    """Per function of the fork (of the components `shown`, default the fork's main module's),
    one plain sentence: which one serves the service, and why."""
    out = {}
    shadowed, reasons = shadowed or {}, reasons or {}
    if shown is None:
        shown = [c for c, v in COMPONENTS.items() if v.module == MODULE]
    for comp in shown:
        name, what = COMPONENTS[comp].function, COMPONENTS[comp].what
        if name in replaced:
            out[name] = f"drop-in {what} in use ({replaced[name]}, {contracts.get(name)} contract)"
        elif name in shadowed:
            out[name] = f"stock {what} in use, shadowed ({shadowed[name]}: compared, never serving)"
        elif comp in reasons:
            out[name] = f"stock {what} in use because {reasons[comp]}"
        elif reason is not None:
            out[name] = f"stock {what} in use because {reason}"
        else:
            out[name] = f"stock {what} in use because {ENV_SPEC} keeps it ({comp} not replaced)"
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
    raise Refused(f"{COMPONENTS[component].module}.{name}{render(got)} is not the expected {alts}")


def _passive(module: Any, contract: Contract, stock: Any) -> tuple[tuple[str, Any, type], ...]:
    """(parameter, its default in `stock`, the class of `module` it names) per passive one."""
    out = []
    defaults = inspect.signature(stock).parameters
    for param, cls_name in contract.passive:
        cls = getattr(module, cls_name, None)
        if not isinstance(cls, type):
            raise Refused(f"{module.__name__} has no class {cls_name} (the type of {param})")
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
        early = [m for m in WATCHED if m in sys.modules]
        if early:
            raise Refused(f"{early[0]} was imported before the hook could be installed")
        missing = _module_location(MODULE)
        if missing:
            hook.refuse(f"{MODULE} not found: {missing}", module_found=False)
            return None
        for comp in hook.setting.components():  # asked for a function this fork does not have
            module = COMPONENTS[comp].module
            gone = module != MODULE and _module_location(module)
            if gone:
                hook.reasons[comp] = f"{module} not found: {gone}"
    except Refused as exc:
        hook.refuse(str(exc))
        return None
    except Exception as exc:
        hook.refuse(f"hook not installed: {type(exc).__name__}: {exc}")
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
    ap.add_argument(
        "--status",
        type=Path,
        help=f"status file (default: ${ENV_STATUS} or <release>/run/hook-status.json)",
    )
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
