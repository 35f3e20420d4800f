"""Reading a playbook: a file or a name in playbooks/, the `--set KEY=VALUE` overrides written
into its document, then the whole of it validated (ops.rollout.playbook.validate_playbook).

Override keys: `change.component|baseline|candidate`, `change.shape.KEY`, `threshold`,
`target_concurrency`, `load.concurrency|requests|input_len|output_len|timeout`, `name`,
`description`, and `STEP.FIELD` for any field of the step named STEP (its kind where it has no
name). Values are YAML (`true`, `8`, `[1, 8]`); `load.concurrency` and `bench.batches` also
take `1,8,32`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ops.files import MIB, FileRefused, not_regular, read_text_bounded
from ops.rollout.playbook import Playbook, PlaybookError, validate_playbook

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
PLAYBOOK_MAX_BYTES = 1 * MIB  # the shipped playbooks are ~2 KB each
TOP_SET = ("name", "description", "change", "threshold", "target_concurrency", "load")


def resolve_path(name: str | None) -> Path:
    """A playbook file, or the name of one in playbooks/ (`bench-only`); default: rollout."""
    p = Path(name or PLAYBOOKS / "rollout.yaml")
    if p.is_file():
        return p
    if p.is_dir():
        raise PlaybookError(str(p), "--playbook", "is a directory, not a playbook file")
    if p.exists():  # a FIFO, /dev/zero, a socket: there, but not a file to read a playbook from
        raise PlaybookError(str(p), "--playbook", not_regular(p) or "not a regular file")
    named = PLAYBOOKS / f"{name}.yaml"
    if name and "/" not in name and named.is_file():
        return named
    known = ", ".join(sorted(f.stem for f in PLAYBOOKS.glob("*.yaml")))
    raise PlaybookError(str(p), "--playbook", f"no such file (playbooks here: {known})")


def parse_sets(items: list[str]) -> list[tuple[list[str], Any, str]]:
    out = []
    for item in items:
        key, eq, value = item.partition("=")
        path = key.strip().split(".")
        if not eq or not all(path):
            raise PlaybookError("--set", item, "expected KEY=VALUE, e.g. change.component=accept")
        try:
            parsed = yaml.safe_load(value) if value.strip() else ""
        except (yaml.YAMLError, ValueError):  # (ValueError: an integer too long to convert)
            parsed = value
        except RecursionError:
            raise PlaybookError("--set", key[:60], "the value is nested too deeply") from None
        out.append((path, parsed, item))
    return out


def apply_sets(raw: dict[str, Any], sets: list[tuple[list[str], Any, str]]) -> set[tuple]:
    """Put each override into the raw document; returns the (step, field) pairs they touched."""
    touched: set[tuple] = set()
    steps = raw.get("steps") if isinstance(raw.get("steps"), list) else []
    by_name = {
        key: s
        for s in steps
        if isinstance(s, dict) and isinstance(key := s.get("name") or s.get("step"), str)
    }  # a step is addressed by its name (its kind where it has none)
    for path, value, item in sets:
        head, rest = path[0], path[1:]
        if head in TOP_SET:
            node = raw
            for key in path[:-1]:
                if node.get(key) is None:
                    node[key] = {}
                if not isinstance(node[key], dict):
                    raise PlaybookError("--set", item, f"{key} is not a table")
                node = node[key]
            node[path[-1]] = value
            touched.add((None, ".".join(path)))
        elif head in by_name and len(rest) == 1 and rest[0] not in ("step", "name"):
            by_name[head][rest[0]] = value
            touched.add((head, rest[0]))
        elif head in by_name and len(rest) == 1:
            raise PlaybookError("--set", item, f"a step's {rest[0]} is the playbook's to say", head)
        elif head in by_name:
            raise PlaybookError("--set", item, "takes STEP.FIELD (one field)", head)
        else:
            names = ", ".join([*TOP_SET, *by_name])
            raise PlaybookError("--set", item, f"no playbook field or step {head!r} ({names})")
    return touched


def load_playbook(name: str | None = None, sets: list[str] | None = None) -> Playbook:
    """Read, override, and validate a playbook whole; PlaybookError names the step and field."""
    path = resolve_path(name)
    where = f"playbook {path}"
    parsed_sets = parse_sets(sets or [])
    try:
        raw = yaml.safe_load(read_text_bounded(path, max_bytes=PLAYBOOK_MAX_BYTES, what="playbook"))
    except FileRefused as exc:
        raise PlaybookError(where, "(file)", exc.problem) from None
    except OSError as exc:
        raise PlaybookError(where, "(file)", exc.strerror or str(exc)) from None
    except UnicodeDecodeError as exc:
        raise PlaybookError(where, "(file)", f"not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise PlaybookError(where, "(document)", "nested too deeply") from None
    except yaml.YAMLError as exc:
        raise PlaybookError(where, "(document)", _yaml_problem(exc)) from None
    except ValueError as exc:  # an integer too long to convert (probe37az M2's kin)
        raise PlaybookError(where, "(document)", str(exc).split(";")[0]) from None
    if not isinstance(raw, dict):
        raise PlaybookError(where, "(document)", "must be a mapping with `steps`")
    touched = apply_sets(raw, parsed_sets)
    return validate_playbook({**raw, "path": str(path)}, where, touched)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a YAML error: where, and what the parser found (an undefined alias, a
    `!!python/...` tag, which is never constructed)."""
    mark = getattr(exc, "problem_mark", None)
    at = f" at line {mark.line + 1}" if mark else ""
    problem = " ".join(str(getattr(exc, "problem", None) or "").split())[:160]
    if isinstance(exc, yaml.constructor.ConstructorError):
        return f"a YAML tag a playbook may not use{at}: {problem}"
    return f"not YAML{at}: {problem}" if problem else f"not YAML{at}"
