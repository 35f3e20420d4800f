"""Host side of releases: list, put in place, switch, revert and prune, inside `remote_root` only.

Sent to the host and run as `python -c <this file> ACTION ROOT ...` (stdlib only); prints one
JSON document, exits 0, or 2 with {"error": ...} for a refused request. Every path it writes
or deletes is checked to resolve inside ROOT, and release ids must look like ids, so no input
can reach outside the root.

    prepare ROOT [WAIT_S]        wait (up to WAIT_S, 300) for a dead deploy's guard to finish
                                 putting the host back (it holds deploy.guard); put back a switch
                                 that neither a deploy nor its guard settled (deploy.pending);
                                 remove what dead deploys left (.incoming.*, .staging-*)
    finalize ROOT STAGING ID     stdin {"release_json", "service_env"}: write them, then rename
                                 STAGING to releases/ID (a reader never sees half a release)
    switch ROOT ID [PENDING]     current -> releases/ID by one rename(2); previous -> the old one;
                                 with PENDING, write deploy.pending so the guard can revert
    commit ROOT                  the switch is final: remove deploy.pending
    revert ROOT [settle]         if deploy.pending exists: switch back to its previous, remove it;
                                 with settle, keep deploy.pending as "settled" (the guard still
                                 restarts the service if ops goes away before `commit`)
    list ROOT                    every release with its manifest summary, size, current/previous
    remove ROOT ID               delete one release (never current or previous)
    reject ROOT ID               stdin {"step", "detail", "at"}: the release failed its deploy after
                                 the switch and was rolled back (releases/ID/rejected.json)
    prune ROOT KEEP              keep the newest KEEP releases (and always current and previous)
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import sys
import time

ID_RE = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{7,40}(-dirty)?$")
STAGING_RE = re.compile(r"^\.staging-[A-Za-z0-9_.-]+$")


class Refused(Exception):
    pass


def inside(root: str, path: str) -> str:
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real_root == "/" or not real.startswith(real_root + os.sep):
        raise Refused(f"{path} is not inside {root}")
    return path


def rid(value: str) -> str:
    if not ID_RE.match(value):
        raise Refused(f"not a release id: {value!r}")
    return value


def link_target(root: str, name: str) -> str | None:
    try:
        dest = os.readlink(os.path.join(root, name))
    except OSError:
        return None
    base = os.path.basename(dest.rstrip("/"))
    return base if ID_RE.match(base) else None


def set_link(root: str, name: str, release: str) -> None:
    """root/name -> releases/<release>, replaced by one rename(2) of a fresh symlink."""
    tmp = inside(root, os.path.join(root, f".{name}.new-{os.getpid()}"))
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(os.path.join("releases", release), tmp)
    os.replace(tmp, os.path.join(root, name))


def rmtree(root: str, path: str) -> None:
    inside(root, path)
    if os.path.islink(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def wait_for_guard(root: str, wait_s: float) -> float:
    """Wait until no guard holds deploy.guard (a guard holds it for its whole life, so one
    whose deploy died is done putting the host back once it is free); the seconds waited."""
    os.makedirs(root, exist_ok=True)
    fd = os.open(os.path.join(root, "deploy.guard"), os.O_RDWR | os.O_CREAT, 0o644)
    t0 = time.time()
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() - t0 >= wait_s:
                    raise Refused(
                        "the guard of an earlier deploy is still putting the host back "
                        f"(deploy.guard held for {wait_s:g} s); try again when it is done"
                    ) from None
                time.sleep(0.1)
    finally:
        os.close(fd)
    return round(time.time() - t0, 3)


def prepare(root: str, wait_s: float = 300.0) -> dict:
    waited = wait_for_guard(root, wait_s)
    rel = os.path.join(root, "releases")
    os.makedirs(rel, exist_ok=True)
    before = link_target(root, "current")
    put_back = None
    if os.path.exists(os.path.join(root, "deploy.pending")):  # its deploy and guard are gone
        doc = revert(root)
        if doc.get("reverted"):
            put_back = {"from": before, "to": doc.get("current")}
    removed = []
    for name in sorted(os.listdir(rel)):
        if name.startswith(".incoming.") or STAGING_RE.match(name):
            rmtree(root, os.path.join(rel, name))
            removed.append(name)
    return {"removed": removed, "guard_waited_s": waited, "put_back": put_back}


def finalize(root: str, staging: str, release: str) -> dict:
    rid(release)
    path = os.path.join(root, "releases", staging)
    if not STAGING_RE.match(staging) or not os.path.isdir(inside(root, path)):
        raise Refused(f"no staging directory {staging}")
    dest = os.path.join(root, "releases", release)
    if os.path.lexists(dest):
        raise Refused(f"release {release} already exists")
    doc = json.loads(sys.stdin.read())
    for name, text in (("release.json", doc["release_json"]), ("service.env", doc["service_env"])):
        with open(os.path.join(path, name), "w") as f:
            f.write(text)
    os.rename(path, inside(root, dest))
    return {"release": release}


def switch(root: str, release: str, pending: bool) -> dict:
    rid(release)
    if not os.path.isdir(inside(root, os.path.join(root, "releases", release))):
        raise Refused(f"no release {release}")
    previous = link_target(root, "current")
    if pending:
        before = {
            "previous": previous,
            "new": release,
            "old_previous": link_target(root, "previous"),
        }
        with open(os.path.join(root, "deploy.pending"), "w") as f:
            json.dump(before, f)
    set_link(root, "current", release)
    if previous and previous != release:
        set_link(root, "previous", previous)
    return {"previous": previous, "current": release}


def commit(root: str) -> dict:
    try:
        os.unlink(os.path.join(root, "deploy.pending"))
    except FileNotFoundError:
        return {"pending": False}
    return {"pending": True}


def revert(root: str, settle: bool = False) -> dict:
    path = os.path.join(root, "deploy.pending")
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return {"reverted": False}
    if not isinstance(doc, dict):
        doc = {}
    if doc.get("settled"):  # switched back already; the service still needs its restart
        if not settle:
            os.unlink(path)
        return {"reverted": True, "current": link_target(root, "current")}
    previous, old_previous = doc.get("previous"), doc.get("old_previous")
    if (
        previous
        and ID_RE.match(previous)
        and os.path.isdir(os.path.join(root, "releases", previous))
    ):
        set_link(root, "current", previous)
        if old_previous and ID_RE.match(old_previous):
            set_link(root, "previous", old_previous)
    elif previous is None:
        try:
            os.unlink(os.path.join(root, "current"))
        except FileNotFoundError:
            pass
    if settle:
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump({"settled": True, "current": previous}, f)
        os.replace(tmp, path)
    else:
        os.unlink(path)
    return {"reverted": True, "current": previous}


def du(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def listing(root: str) -> dict:
    rel = os.path.join(root, "releases")
    current, previous = link_target(root, "current"), link_target(root, "previous")
    out = []
    names = sorted(n for n in os.listdir(rel) if ID_RE.match(n)) if os.path.isdir(rel) else []
    for name in names:
        try:
            with open(os.path.join(rel, name, "release.json")) as f:
                man = json.load(f)
        except (OSError, ValueError):
            man = {}
        selftest = man.get("selftest") or {}
        try:
            with open(os.path.join(rel, name, "rejected.json")) as f:
                rejected = json.load(f)
        except (OSError, ValueError):
            rejected = None
        out.append(
            {
                "id": name,
                "git_sha": man.get("git_sha"),
                "created": man.get("created"),
                "cuda_arch": man.get("cuda_arch"),
                "components": man.get("components") or {},
                "selftest_ok": selftest.get("ok"),
                "selftest_gpu": selftest.get("gpu"),
                "size_bytes": du(os.path.join(rel, name)),
                "current": name == current,
                "previous": name == previous,
                "rejected": rejected if isinstance(rejected, dict) else None,
            }
        )
    pending = os.path.exists(os.path.join(root, "deploy.pending"))
    return {"releases": out, "current": current, "previous": previous, "pending": pending}


def reject(root: str, release: str) -> dict:
    rid(release)
    path = os.path.join(root, "releases", release)
    if not os.path.isdir(inside(root, path)):
        raise Refused(f"no release {release}")
    doc = json.loads(sys.stdin.read() or "{}")
    why = {k: str(doc.get(k, ""))[:2000] for k in ("step", "detail", "at")}
    with open(os.path.join(path, "rejected.json"), "w") as f:
        json.dump(why, f)
    return {"rejected": release}


def remove(root: str, release: str) -> dict:
    rid(release)
    if release in (link_target(root, "current"), link_target(root, "previous")):
        raise Refused(f"release {release} is current or previous")
    rmtree(root, os.path.join(root, "releases", release))
    return {"removed": [release]}


def prune(root: str, keep: int) -> dict:
    keep_ids = {link_target(root, "current"), link_target(root, "previous")}
    names = [r["id"] for r in listing(root)["releases"]]
    removed = []
    for name in names[: max(0, len(names) - keep)]:
        if name not in keep_ids:
            rmtree(root, os.path.join(root, "releases", name))
            removed.append(name)
    return {"removed": removed}


def main(argv: list[str]) -> dict:
    action, root = argv[0], argv[1]
    if not os.path.isabs(root) or os.path.realpath(root) == "/":
        raise Refused(f"remote root {root!r} must be absolute and not /")
    if action == "prepare":
        return prepare(root, float(argv[2]) if len(argv) > 2 else 300.0)
    if action == "finalize":
        return finalize(root, argv[2], argv[3])
    if action == "switch":
        return switch(root, argv[2], len(argv) > 3 and argv[3] == "pending")
    if action == "commit":
        return commit(root)
    if action == "revert":
        return revert(root, len(argv) > 2 and argv[2] == "settle")
    if action == "list":
        return listing(root)
    if action == "remove":
        return remove(root, argv[2])
    if action == "reject":
        return reject(root, argv[2])
    if action == "prune":
        return prune(root, int(argv[2]))
    raise Refused(f"unknown action {action!r}")


if __name__ == "__main__":
    try:
        print(json.dumps(main(sys.argv[1:])))
    except Refused as exc:
        print(json.dumps({"error": str(exc)}))
        sys.exit(2)
