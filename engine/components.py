"""DDTree component names, their backend kinds, and parsing a choice of backends.

`--backend COMPONENT=KIND` flags and $DDTREE_ENGINE_BACKENDS (comma-separated COMPONENT=KIND,
as a release's service.env sets it) name backends; `resolve_backends` merges them (a flag
overrides the variable for its component) and says where each came from. No torch here, so
the engine's command line refuses a bad value at once; `engine.backends` binds the names to
implementations.
"""

from __future__ import annotations

from checks.vocabulary import COMPONENTS, DEFAULT_BACKENDS

DEFAULTS = DEFAULT_BACKENDS


def parse_backends(specs: list[str], device: str, what: str = "--backend") -> dict[str, str]:
    """`["topk=cuda", ...]` over the defaults (the references and torch attention on every
    device, so a rollout swaps exactly the components it names); ValueError on a bad pair,
    naming it as `what` (the flag or the variable it came from)."""
    chosen = dict(DEFAULTS)
    for spec in specs:
        comp, sep, kind = spec.partition("=")
        if not sep or comp not in COMPONENTS or kind not in COMPONENTS[comp]:
            known = ", ".join(f"{c}={'|'.join(k)}" for c, k in COMPONENTS.items())
            raise ValueError(f"bad {what} {spec!r}; expected one of {known}")
        if kind == "cuda" and not device.startswith("cuda"):
            raise ValueError(f"{what} {spec} needs --device cuda")
        chosen[comp] = kind
    return chosen


ENV_VAR = "DDTREE_ENGINE_BACKENDS"


def resolve_backends(
    env_value: str | None, cli_specs: list[str], device: str
) -> tuple[dict[str, str], dict[str, str]]:
    """The effective backends and where each came from ("default" | "env" | "cli").

    `env_value` is DDTREE_ENGINE_BACKENDS (comma-separated COMPONENT=KIND, the deploy's
    defaults); each `--backend` on the command line overrides its component. ValueError on a
    bad pair, naming the variable or the flag.
    """
    env_specs = [s.strip() for s in (env_value or "").split(",") if s.strip()]
    from_env = parse_backends(env_specs, device, f"{ENV_VAR} entry")
    from_cli = parse_backends(cli_specs, device)
    env_comps = {s.partition("=")[0] for s in env_specs}
    cli_comps = {s.partition("=")[0] for s in cli_specs}
    names, sources = {}, {}
    for comp in COMPONENTS:
        if comp in cli_comps:
            names[comp], sources[comp] = from_cli[comp], "cli"
        elif comp in env_comps:
            names[comp], sources[comp] = from_env[comp], "env"
        else:
            names[comp], sources[comp] = DEFAULTS[comp], "default"
    return names, sources
