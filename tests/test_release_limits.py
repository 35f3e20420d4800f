"""A release carries code, not weights or data (probe37 P74): `ops deploy` refuses a data-plane
file over 64 MiB, or a data plane over 256 MiB in all, in one `error:` line naming the file
and its size, before it reads the file (ops's own memory stays flat: a 1 GiB file left in
`engine/` once made ops's RSS reach 1 GiB); a commit is read from `git archive` as a stream
(a large file the release leaves out is skipped, never held), and every file is hashed in
chunks, the hashes in release.json still those of the files on the host.

Real parts throughout: the `ops` CLI as a subprocess, a real git source, the `local` target
with the stand-in service (tests/helpers/deploy_ops.py's `Ops`). The large files are sparse
(`truncate`), so nothing here writes or reads a gigabyte.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO
from helpers.deploy import git
from helpers.deploy_ops import Ops, one_error_line
from helpers.local import end_services

MIB = 2**20
# runs ARGV and reports the peak RSS of its process tree (the largest of them), in KiB
PEAK_RSS = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:]).returncode\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "print(f'peak_rss_kib={peak}', file=sys.stderr)\n"
    "sys.exit(rc)\n"
)
SMALL_RSS_KIB = 400 * 1024  # ops's start-up is ~100 MB; a file read whole would be ~1 GiB


@pytest.fixture
def ops(tmp_path: Path):
    o = Ops(tmp_path)
    yield o
    end_services(o.root)


def sparse(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.truncate(size)
    return path


def deploy_measured(ops: Ops, *extra: str) -> tuple[subprocess.CompletedProcess[str], int, float]:
    """`ops deploy local --source SRC ...`: its result, its peak RSS (KiB), its seconds."""
    argv = ops.argv("deploy", "local", "--source", str(ops.src), "--max-tokens", "3", *extra)
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, *argv],
        capture_output=True,
        text=True,
        env=ops.env,
        cwd=REPO,
        timeout=180,
    )
    seconds = time.monotonic() - t0
    last = res.stderr.rstrip().splitlines()[-1]
    assert last.startswith("peak_rss_kib="), res.stderr
    return res, int(last.split("=")[1]), seconds


def commit_all(src: Path, message: str) -> None:
    git(src, "add", "-A")
    git(src, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", message)


def test_untracked_weights_file_is_refused_before_it_is_read(ops: Ops) -> None:
    sparse(ops.src / "engine" / "weights.bin", 2**30)
    res, peak_kib, seconds = deploy_measured(ops, "--allow-dirty", "--dry-run")
    line = one_error_line(res)
    assert "engine/weights.bin is 1.0 GiB" in line, line
    assert "over the 64.0 MiB a release file may be" in line
    assert "a release carries code, not weights or data" in line
    assert "git-ignore it" in line
    assert peak_kib < SMALL_RSS_KIB, f"peak RSS {peak_kib} KiB"
    assert seconds < 60
    assert not (ops.root / "releases").exists()  # nothing reached the host


def test_data_plane_over_the_total_is_refused_naming_the_largest(ops: Ops) -> None:
    for i in range(5):  # each under the per-file limit, 270 MiB in all
        sparse(ops.src / "engine" / "data" / f"shard{i}.bin", (50 + 2 * i) * MIB)
    res, peak_kib, _ = deploy_measured(ops, "--allow-dirty", "--dry-run")
    line = one_error_line(res)
    assert "the data plane is over 256.0 MiB" in line, line
    assert "(largest: engine/data/shard4.bin (58.0 MiB), engine/data/shard3.bin" in line
    assert "a release carries code, not weights or data" in line
    assert "remove them from the work tree or git-ignore them" in line
    assert peak_kib < SMALL_RSS_KIB, f"peak RSS {peak_kib} KiB"


def test_committed_large_file_is_refused_from_its_tar_header(ops: Ops) -> None:
    sparse(ops.src / "engine" / "weights.bin", 70 * MIB)
    commit_all(ops.src, "weights in the engine")
    res, peak_kib, _ = deploy_measured(ops, "--dry-run")
    line = one_error_line(res)
    assert "engine/weights.bin is 70.0 MiB" in line, line
    assert "remove it from the commit" in line
    assert not (ops.root / "releases").exists()


def test_large_file_the_release_leaves_out_is_streamed_past(ops: Ops) -> None:
    """A committed 70 MiB `.so` (which a release never carries) is skipped as `git archive`
    streams it: the deploy goes on, and ops never holds the archive."""
    sparse(ops.src / "kernels" / "prebuilt.so", 70 * MIB)
    commit_all(ops.src, "a prebuilt library")
    res, peak_kib, _ = deploy_measured(ops, "--bootstrap")
    assert res.returncode == 0, res.stdout + res.stderr
    release = ops.root / "releases" / str(ops.current())
    manifest = json.loads((release / "release.json").read_text())
    assert "kernels/prebuilt.so" not in manifest["files"]
    assert not (release / "kernels" / "prebuilt.so").exists()
    # ops itself (and git, which holds the blob) stay well under what the archive whole
    # in memory, next to its copy, would take
    assert peak_kib < SMALL_RSS_KIB, f"peak RSS {peak_kib} KiB"


def test_hashes_in_chunks_are_the_files_hashes(ops: Ops) -> None:
    """release.json's sha256 of every file (hashed in chunks) and the dirty diff's sha256
    (streamed from git) are those of the files and the diff themselves."""
    svc = ops.src / "engine" / "svc.py"
    svc.write_text(svc.read_text() + "\n# a local edit\n")
    sparse(ops.src / "engine" / "table.bin", 3 * MIB + 5)  # several chunks, an odd tail
    res = ops.deploy("--bootstrap", "--allow-dirty")
    assert res.returncode == 0, res.stdout + res.stderr
    release = ops.root / "releases" / str(ops.current())
    manifest = json.loads((release / "release.json").read_text())
    assert manifest["dirty"] is True
    assert "engine/table.bin" in manifest["files"]
    for rel, digest in manifest["files"].items():
        assert hashlib.sha256((release / rel).read_bytes()).hexdigest() == digest, rel
    diff = subprocess.run(
        ["git", "-C", str(ops.src), "diff", "HEAD", "--binary"], capture_output=True, check=True
    ).stdout
    status = git(ops.src, "status", "--porcelain", "--untracked-files=all").strip()
    want = hashlib.sha256(diff + status.encode()).hexdigest()
    assert manifest["dirty_diff_sha256"] == want


def test_a_whole_archive_is_never_read_as_a_failed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """probe37h L1: ops stopped reading `git archive` at the tar's end marker and closed the
    pipe while git could still be writing its last block; git died of SIGPIPE and a deploy
    failed at package ('git archive ... failed'), about 1 in 70 under load (when the end
    marker starts in the next-to-last record). A stand-in `git` makes that certain: after the
    archive, a pause, then one more record of zeros (padding a tar reader never needs). ops
    reads to the end now."""
    import shutil

    from helpers.deploy_ops import make_source

    from ops.deploy.release import _extract_commit

    real = shutil.which("git")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(
        "#!/bin/bash\n"
        'if [ "$3" = archive ]; then\n'
        f'  t=$(mktemp); {real} "$@" >"$t" || exit $?\n'
        '  cat "$t"; sleep 0.3\n'
        "  head -c 10240 /dev/zero || exit 141\n"
        "  exit 0\n"
        "fi\n"
        f'exec {real} "$@"\n'
    )
    (bin_dir / "git").chmod(0o755)
    src = make_source(tmp_path)
    sha = git(src, "rev-parse", "HEAD").strip()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    dest = tmp_path / "x"
    dest.mkdir()
    _extract_commit(src, sha, dest)
    assert (dest / "engine" / "svc.py").is_file()


@pytest.mark.parametrize("how", ["committed", "dirty"])
def test_a_file_name_that_is_not_utf8_is_refused(ops: Ops, how: str) -> None:
    """probe37ay L2 (low): a data-plane file whose name is not UTF-8 was left out of a
    `--allow-dirty` release in silence, and a committed one was listed in release.json under a
    name with U+FFFD in it, which no file on the host has. Refused in one line, naming it, and
    nothing reaches the host; a name outside the data plane is none of the release's."""
    bad = os.path.join(os.fsencode(ops.src / "checks"), b"bad\xff\xfe.py")
    os.makedirs(os.path.dirname(bad), exist_ok=True)
    with open(bad, "wb") as f:
        f.write(b"x = 1\n")
    with open(os.path.join(os.fsencode(ops.src), b"notes\xff.txt"), "wb") as f:
        f.write(b"not carried\n")
    if how == "committed":
        commit_all(ops.src, "a file whose name is not UTF-8")
    res = ops.deploy("--bootstrap", *(["--allow-dirty"] if how == "dirty" else []))
    line = one_error_line(res)
    assert "checks/bad\\xff\\xfe.py: a file name that is not UTF-8" in line, line
    assert "notes" not in line, line
    assert not (ops.root / "releases").exists() or not any((ops.root / "releases").iterdir())
    os.unlink(bad)  # the rest of the tree deploys
    if how == "committed":
        commit_all(ops.src, "renamed")
    res = ops.deploy("--bootstrap", *(["--allow-dirty"] if how == "dirty" else []))
    assert res.returncode == 0, res.stdout + res.stderr
