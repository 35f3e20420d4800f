"""The deploy.pending record's rules, one copy for both host scripts: a release id's shape,
whether a record can be read whole, and who made its switch.

`releases` (which writes, reverts and sets aside records) and `procman` (whose start, restart
and status say what a record there means) must read one record one way (probe37aq L3: status
called a record a rollback that died; the revert called it unreadable). Stdlib only, as they
are: `ops.hostside.source` sends it to the host in front of either script, registered as
this module, so their `from ops.hostside.pending import ...` works there as here.
"""

from __future__ import annotations

import os
import re

ID_RE = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{7,40}(-dirty)?\Z")
PENDING_KEYS = ("previous", "new", "old_previous")  # a pending record without them is not whole
KINDS = ("release", "foreign", "directory", "file", "none")
ASIDE_RE = re.compile(r"^(current|previous)\.before-[0-9]{8}T[0-9]{6}Z\Z")


def not_whole(doc: object) -> str | None:
    """Why a deploy.pending cannot be trusted (None: it is whole)."""
    if not isinstance(doc, dict):
        return "not a JSON object (unreadable, empty or not JSON)"
    missing = [k for k in PENDING_KEYS if k not in doc]
    if missing:
        return f"missing {', '.join(missing)}"
    if not isinstance(doc["new"], str) or not ID_RE.match(doc["new"]):
        return "its new release is not a release id"
    for key in ("previous", "old_previous"):
        if doc[key] is not None and not (isinstance(doc[key], str) and ID_RE.match(doc[key])):
            return f"its {key} is not a release id"
    for key in ("current_before", "previous_before"):
        state = doc.get(key)
        if state is None and doc.get("version") is None:
            continue  # written by an ops before version 2: previous / old_previous say it
        if not isinstance(state, dict) or state.get("kind") not in KINDS:
            return f"its {key} is not a state"
        if state["kind"] in ("release", "foreign") and not isinstance(state.get("link"), str):
            return f"its {key} has no link"
        if state["kind"] == "release" and not (
            isinstance(state.get("id"), str) and ID_RE.match(state["id"])
        ):
            return f"its {key} names no release id"
    before = doc.get("current_before") or {}
    if before.get("kind") in ("directory", "file") and not isinstance(doc.get("aside"), str):
        return "it names no place current was moved aside to"
    for key, name in (("aside", "current"), ("previous_aside", "previous")):
        # only where a switch moves them: <root>/current.before-<utc>, previous.before-<utc>
        if doc.get(key) is not None and not aside_name(doc[key], name):
            return f"its {key} is not a {name}.before-<utc> of the root"
    return None


def aside_name(path: object, name: str) -> bool:
    """`path` is where a switch moves a hand-made `name` aside: <root>/<name>.before-<utc>."""
    if not isinstance(path, str):
        return False
    m = ASIDE_RE.match(os.path.basename(path))
    return bool(m) and m.group(1) == name


def switched_by(doc: dict) -> str:
    """Who made a pending switch: "rollback", or "deploy" (also a record from before `by`)."""
    return "rollback" if doc.get("by") == "rollback" else "deploy"
