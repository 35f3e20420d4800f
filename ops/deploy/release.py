"""A release, made on the operator's machine: the data plane at one git commit, staged for sending.

`stage_release` exports `kernels/`, `checks/`, `engine/`, `integration/` and `pyproject.toml`
from a git checkout at a ref (or, with `allow_dirty`, the work tree as it is) into a local
directory, adds the release's `site/` (from `integration/site/`), and describes it in a
`ReleaseManifest`: git sha, the sha256 of every file, who made it from where. The id is
`<utc>-<shortsha>` (`-dirty` when the work tree was taken as it is). A work-tree file reached
through a symlinked directory, or resolving outside the source tree, and a data-plane file that
is itself a symlink (in the work tree or the commit) are refused (one line): a release holds the
source tree's own files, never what a link points at.

A release carries code, not weights or data: a data-plane file over `MAX_FILE_BYTES` (64 MiB),
or a data plane over `MAX_TOTAL_BYTES` (256 MiB) in all, is refused (one line naming the
file and its size) before it is read: from its size on disk (`--allow-dirty`) or from its tar
header as `git archive` streams it (a commit). Nothing is held whole in memory here: the
archive is read as a stream, every file is hashed in chunks.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import re
import shutil
import socket
import subprocess
import tarfile
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from checks.vocabulary import HOOK_BACKENDS
from ops.errors import OpsError
from ops.hostside.release_files import shown_name

DATA_PLANE = ("kernels", "checks", "engine", "integration", "pyproject.toml")
SITE_SOURCE = "integration/site"
SKIP_PARTS = {"__pycache__", "_build", ".pytest_cache"}
MIB = 2**20
MAX_FILE_BYTES = 64 * MIB  # one data-plane file (the largest source file in use is ~100 KB)
MAX_TOTAL_BYTES = 256 * MIB  # the whole data plane (~2 MB in use)
HASH_CHUNK = MIB
ID_TIME = "%Y%m%dT%H%M%SZ"  # a release id starts with its creation time: <time>-<sha[:10]>[-dirty]
ID_TIME_RE = re.compile(r"^(\d{8}T\d{6}Z)-")


def release_time(rid: str) -> str | None:
    """When release `rid` was made, as its id says (sortable text; None: not an id ops makes)."""
    m = ID_TIME_RE.match(rid)
    return m.group(1) if m else None


class ReleaseManifest(BaseModel):
    """`release.json`: what a release is and where it came from (build and self-test added on
    the host before the release is moved into place)."""

    id: str
    git_sha: str
    ref: str
    dirty: bool = False
    dirty_diff_sha256: str | None = None
    created: str
    deployed_by: str
    source: str
    target: str
    cuda_arch: str | None = None
    components: dict[str, str] = Field(default_factory=dict)
    hook: str | None = None  # the inventory's hook setting (None: from the components)
    files: dict[str, str] = Field(default_factory=dict)
    service_env_sha256: str | None = None  # what service.env held when installed (utf-8)
    build: dict[str, Any] | None = None
    selftest: dict[str, Any] | None = None


def default_source() -> Path:
    """The checkout ops itself runs from."""
    return Path(__file__).resolve().parents[2]


class GitFailed(OpsError):
    """A git command exited non-zero (its last line of stderr is the message)."""


def _git(source: Path, *args: str, binary: bool = False) -> Any:
    try:
        res = subprocess.run(
            ["git", "-C", str(source), *args], capture_output=True, timeout=120, check=False
        )
    except FileNotFoundError:
        raise OpsError("git is not installed (a release is made from a git checkout)") from None
    if res.returncode != 0:
        msg = res.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GitFailed(f"git {' '.join(args[:2])} in {source}: {msg[-1] if msg else 'failed'}")
    return res.stdout if binary else res.stdout.decode("utf-8", "replace")


def _shown(value: str) -> str:
    """A user's value as an error message shows it: quoted when odd (a byte that is no UTF-8
    as that byte, `\\xff`), cut when long."""
    text = value
    if not value.isprintable() or value.startswith("-"):
        text = "'" + shown_name(value.replace("\\", "\\\\")).replace("'", "\\'") + "'"
    return text if len(text) <= 80 else text[:77] + "..."


def _sha256_file(path: Path) -> str:
    """The sha256 of a file, read in chunks (memory stays flat whatever its size)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _size(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n} bytes"


class _Budget:
    """The release's size limits, checked file by file before each file is read."""

    def __init__(self, how: str) -> None:
        self.how = how  # what the user can do about a file that is too big ({it}: it, them)
        self.total = 0
        self.largest: list[tuple[int, str]] = []

    def add(self, rel: str, size: int) -> None:
        why = "a release carries code, not weights or data"
        if size > MAX_FILE_BYTES:
            raise OpsError(
                f"{rel} is {_size(size)}, over the {_size(MAX_FILE_BYTES)} a release file may "
                f"be: {why}; {self.how.format(it='it')}"
            )
        self.total += size
        self.largest = sorted([*self.largest, (size, rel)], reverse=True)[:3]
        if self.total > MAX_TOTAL_BYTES:
            big = ", ".join(f"{r} ({_size(n)})" for n, r in self.largest)
            raise OpsError(
                f"the data plane is over {_size(MAX_TOTAL_BYTES)}, the most a release may be "
                f"(largest: {big}): {why}; {self.how.format(it='them')}"
            )


def _keep(rel: str) -> bool:
    parts = Path(rel).parts
    if not parts or parts[0] not in DATA_PLANE:
        return False
    return not any(p in SKIP_PARTS or p.endswith((".pyc", ".so", ".egg-info")) for p in parts)


def stage_release(
    dest: Path,
    *,
    source: Path | None,
    ref: str | None,
    allow_dirty: bool,
    target: str,
    cuda_arch: str | None,
    components: dict[str, str],
    hook: str | None = None,
) -> ReleaseManifest:
    """Write the release's files under `dest` (which must not exist) and return its manifest."""
    src = (source or default_source()).resolve()
    if not src.is_dir():
        raise OpsError(f"--source {src}: not a directory")
    if ref is not None and (not ref or ref.startswith("-") or any(c.isspace() for c in ref)):
        raise OpsError(f"--ref {_shown(ref)}: not a git revision")
    try:
        top = Path(_git(src, "rev-parse", "--show-toplevel").strip())
    except GitFailed:
        raise OpsError(
            f"--source {src}: not a git checkout (a release is made from a git commit)"
        ) from None
    try:
        sha = _git(top, "rev-parse", "--verify", "--quiet", f"{ref or 'HEAD'}^{{commit}}").strip()
    except GitFailed:
        what = f"--ref {_shown(ref)}: no such commit" if ref else "HEAD: no commit yet"
        raise OpsError(f"{what} in {top}") from None
    # only what a release carries counts: an ops.toml or notes beside the data plane do not
    status = _git(top, "status", "--porcelain", "--untracked-files=all", "--", *DATA_PLANE)
    dirty_files = status.strip()
    dirty = ref is None and bool(dirty_files)
    diff_sha = None
    if dirty and not allow_dirty:
        first = dirty_files.splitlines()[0].strip()
        raise OpsError(
            f"{top} has uncommitted changes ({first}, ...)",
            hint="commit them, deploy a commit with --ref, or pass --allow-dirty",
        )
    files: dict[str, str] = {}
    if dirty:
        raw = _git(top, "ls-files", "-z", "--cached", "--others", "--exclude-standard", binary=True)
        root = top.resolve()
        budget = _Budget("remove {it} from the work tree or git-ignore {it}")
        taken: list[tuple[str, Path]] = []
        names = {os.fsdecode(name) for name in raw.split(b"\0") if name}
        for rel in sorted(names):
            if not _keep(rel):
                continue
            _utf8_name(os.fsencode(rel))
            path = _inside(root, rel)
            if path.is_symlink():
                raise _no_links(str(path), rel, path.readlink())
            if path.is_file():
                budget.add(rel, path.stat().st_size)  # refused before a byte of it is read
                taken.append((rel, path))
        diff_sha = _diff_sha256(top, dirty_files)
        dest.mkdir(parents=True)
        for rel, path in taken:
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, out)
    else:
        dest.mkdir(parents=True)
        _extract_commit(top, sha, dest)
    site = dest / SITE_SOURCE
    if site.is_dir():
        shutil.copytree(site, dest / "site")
    for path in sorted(dest.rglob("*")):
        if path.is_file():
            rel = path.relative_to(dest).as_posix()
            _utf8_name(os.fsencode(rel))  # (a committed one: extracted as it is named)
            files[rel] = _sha256_file(path)
    if "engine/__main__.py" not in files:
        raise OpsError(f"{top} at {sha[:12]} has no data plane (engine/, kernels/, checks/)")
    now = datetime.now(UTC)
    rid = f"{now.strftime(ID_TIME)}-{sha[:10]}" + ("-dirty" if dirty else "")
    return ReleaseManifest(
        id=rid,
        git_sha=sha,
        ref=ref or "HEAD",
        dirty=dirty,
        dirty_diff_sha256=diff_sha,
        created=now.isoformat(timespec="seconds"),
        deployed_by=f"{getpass.getuser()}@{socket.gethostname()}",
        source=str(top),
        target=target,
        cuda_arch=cuda_arch,
        components=components,
        hook=hook,
        files=files,
    )


def _utf8_name(name: bytes) -> str:
    """A file's name in the source tree, refused where it is not UTF-8: release.json lists
    each file by name (probe37ay L2: such a file was left out in silence, or listed under a
    name with U+FFFD in it, which no file on the host has)."""
    try:
        return name.decode("utf-8")
    except UnicodeDecodeError:
        shown = name.decode("utf-8", "backslashreplace")
        raise OpsError(
            f"{shown}: a file name that is not UTF-8 (a release lists its files by name)",
            hint="rename it, or remove it from the data plane",
        ) from None


def _no_links(shown: str, rel: str, dest: object) -> OpsError:
    """A data-plane file that is a symlink: refused, never left out in silence (probe37t T10: a
    tracked file replaced by a link out of the repo vanished from the release)."""
    return OpsError(
        f"{shown}: a symlink to {dest} (a release carries the tree's own files, no symlinks)",
        hint=f"put the file or directory itself at {rel}",
    )


def _inside(root: Path, rel: str) -> Path:
    """`root / rel`, refused when the file is not really under `root`: a directory on its way
    that is a symlink (`checks -> /elsewhere`), or a path that resolves outside the source
    tree. A release holds the source tree's own files, never what a link points at (a file that
    is itself a symlink is refused by the caller)."""
    here = root
    for part in Path(rel).parts[:-1]:
        here = here / part
        if here.is_symlink():
            raise OpsError(
                f"{here}: a symlink to {here.resolve()} (a release takes no file through a "
                f"symlinked directory: {rel})",
                hint="put the directory itself there: a release takes only the tree's own files",
            )
    path = root / rel
    if not path.is_symlink() and not path.resolve().is_relative_to(root):
        raise OpsError(f"{path}: resolves outside the source tree {root}")
    return path


def _diff_sha256(top: Path, dirty_files: str) -> str:
    """The sha256 of the work tree's difference from HEAD (`git diff --binary`, then the
    status lines), streamed from git: a large changed file is never held whole in memory."""
    digest = hashlib.sha256()
    with tempfile.TemporaryFile() as errs:
        try:
            proc = subprocess.Popen(
                ["git", "-C", str(top), "diff", "HEAD", "--binary"],
                stdout=subprocess.PIPE,
                stderr=errs,
            )
        except FileNotFoundError:
            raise OpsError("git is not installed (a release is made from a git checkout)") from None
        assert proc.stdout is not None
        with proc:
            while chunk := proc.stdout.read(HASH_CHUNK):
                digest.update(chunk)
        _git_done(proc, errs, top, "diff HEAD")
    digest.update(dirty_files.encode())
    return digest.hexdigest()


def _extract_commit(top: Path, sha: str, dest: Path) -> None:
    """The commit's data-plane files into `dest`, read as `git archive` streams them: each
    member's size (its tar header) is checked before its data is read, and what a release
    leaves out (`_keep`) is skipped without being held."""
    budget = _Budget("remove {it} from the commit")
    argv = ["git", "-C", str(top), "archive", "--format=tar", sha, "--", *_present(top, sha)]
    with tempfile.TemporaryFile() as errs:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errs)
        assert proc.stdout is not None
        unreadable: tarfile.TarError | None = None
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                for member in tar:
                    if member.issym() and _keep(member.name):
                        at = f"{member.name} at {sha[:12]}"
                        raise _no_links(at, member.name, member.linkname)
                    if member.isfile() and _keep(member.name):
                        budget.add(member.name, member.size)  # before its data is read
                        tar.extract(member, dest, filter="data")
            # the tar ends before git's last write (its padding blocks): read to the end, or
            # git dies of SIGPIPE and a whole archive reads as a failed one (probe37h L1)
            while proc.stdout.read(65536):
                pass
        except tarfile.TarError as exc:  # git's own failure (below) says more, if it failed
            unreadable = exc
        except BaseException:  # refused (too big), interrupted: git goes at once
            proc.kill()
            proc.wait()
            proc.stdout.close()
            raise
        proc.stdout.close()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
        _git_done(proc, errs, top, "archive")
        if unreadable is not None:
            raise OpsError(f"git archive in {top}: unreadable output ({unreadable})")


def _git_done(proc: subprocess.Popen[bytes], errs: Any, top: Path, what: str) -> None:
    """A streamed git command's end: its exit status, its last line of stderr as the message."""
    rc = proc.wait()
    if rc != 0:
        errs.seek(0)
        msg = errs.read(65536).decode("utf-8", "replace").strip().splitlines()
        raise GitFailed(f"git {what} in {top}: {msg[-1] if msg else 'failed'}")


def _present(top: Path, sha: str) -> list[str]:
    """The data-plane paths that exist at `sha` (git archive fails on a missing pathspec)."""
    names = _git(top, "ls-tree", "--name-only", sha).split()
    return [n for n in DATA_PLANE if n in names]


HOOK_KINDS = HOOK_BACKENDS  # what the SGLang hook can swap (checks.vocabulary)


def hook_setting(components: dict[str, str]) -> str:
    """`DDTREE_OPS_SGLANG` for the SGLang import hook: only what it can switch, else `off`."""
    pairs = [f"{k}={v}" for k, v in sorted(components.items()) if v in HOOK_KINDS.get(k, ())]
    return ",".join(pairs) or "off"


def service_env(release_dir: str, manifest: ReleaseManifest) -> str:
    """The service's environment for this release: code and configuration switch together."""
    comps = manifest.components
    lines = [
        "# written by ops deploy: the service's environment for this release",
        f"DDTREE_RELEASE_ID={manifest.id}",
        f"DDTREE_ENGINE_BACKENDS={','.join(f'{k}={v}' for k, v in sorted(comps.items()))}",
        f"DDTREE_OPS_SGLANG={manifest.hook or hook_setting(comps)}",
        f"DDTREE_OPS_HOOK_STATUS={release_dir}/run/hook-status.json",
        f"DDTREE_CACHE={release_dir.rsplit('/releases/', 1)[0]}/cache",
        f"PYTHONPATH={release_dir}/site:{release_dir}",
        # no bytecode written into the release: a short write on a full disk leaves a .pyc
        # that breaks every later import of its module (probe37t T3)
        "PYTHONDONTWRITEBYTECODE=1",
    ]
    if manifest.build and manifest.build.get("library"):
        lines.append(f"DDTREE_KERNELS_LIB={release_dir}/build/libddtree_kernels.so")
    return "\n".join(lines) + "\n"
