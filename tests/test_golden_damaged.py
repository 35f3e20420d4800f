"""A damaged golden set on the host (probe37 P83) is a failed `identity` check that says what is
wrong and how to re-record it, never a traceback: `ops healthcheck` fails on it (exit 1); a
deploy's pre-flight fails on it and `--force` passes it; a deploy's post-flight and
`ops rollback` (run while ops holds the host's lock: the host is mid-change) skip identity
with a loud NOT CHECKED instead of undoing the change; `ops healthcheck --record-golden`
repairs it, keeping the damaged file beside it. `checks.identity` itself refuses every such
set before any request (exit 2, one JSON document); `--golden` with a JSON nested 200000
deep is exit 2, not an internal error (P84).

Real parts: the `ops` CLI as a subprocess, the stand-in service under ops's process manager
(helpers/local.py's `Ops` for the healthchecks, tests/helpers/deploy_ops.py's `Ops` for the
deploys and the rollback, its releases from a real git source), `checks.identity` run as
`python -m`.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import FAKE_SERVICE, REPO
from helpers.deploy import commit_change
from helpers.deploy_ops import Ops as DeployOps
from helpers.deploy_ops import one_error_line, steps
from helpers.local import Ops as ServiceOps
from helpers.sshd import free_port

SCHEMA = "ddtree-ops/golden/v1"
FIX = "ops healthcheck local --record-golden"
GOOD_PROMPT = {"id": "p0", "prompt": "2+2=", "token_ids": [1, 2, 3], "text": "abc"}


def golden_doc(**changes: object) -> bytes:
    doc = {"schema": SCHEMA, "max_tokens": 3, "model": "fake", "prompts": [GOOD_PROMPT]}
    doc.update(changes)
    return json.dumps(doc).encode()


# (what the file holds, what the one line says is wrong)
DAMAGES = {
    "truncated": (None, "): damaged or cut short"),  # not JSON (the decoder's own words)
    # cut down by hand to its first prompt (probe37bd M5: passed as a whole identity check)
    "cut": (None, "it holds 1 of the "),
    # one prompt's tokens edited by hand (probe37bf M2: a good release rejected for it)
    "edited": (None, "its prompts were changed after it was recorded"),
    "numbers": (golden_doc(prompts=[1, 2]), "prompts[0] is a number, not a prompt object"),
    "no_prompt": (golden_doc(prompts=[{"id": "p0", "token_ids": [1]}]), "has no prompt text"),
    "max_tokens_x": (golden_doc(max_tokens="x"), "max_tokens 'x' is not a whole number from 1"),
    "max_tokens_huge": (
        golden_doc().replace(b'"max_tokens": 3', b'"max_tokens": 1e400'),
        "max_tokens inf is not a whole number from 1",
    ),
    "max_tokens_many": (golden_doc(max_tokens=10**9), "not a whole number from 1 to 4096"),
    "mapping": (golden_doc(prompts={"p0": GOOD_PROMPT}), "prompts is a mapping, not a list"),
    "token_ids": (
        golden_doc(prompts=[{**GOOD_PROMPT, "token_ids": "123"}]),
        "token_ids is not a list of token ids",
    ),
    "twice": (golden_doc(prompts=[GOOD_PROMPT, GOOD_PROMPT]), "id 'p0' is there twice"),
    # (probe37bj L3: "it holds 1 of the a number prompts")
    "count_huge": (golden_doc(count=10**400), "it holds 1 prompts, and its count is a number too"),
    "count_text": (golden_doc(count="1"), "it holds 1 prompts, and its count is '1', no count"),
    "deep": (b"[" * 200_000, "nested too deeply"),
    # bytes that are not UTF-8: only the host's own read of the file can tell
    "not_utf8": (golden_doc(prompts=[{**GOOD_PROMPT, "prompt": "2+2=\udcff"}]), "utf-8"),
}


def damage(golden: Path, kind: str) -> None:
    content, _ = DAMAGES[kind]
    if kind == "truncated":
        content = golden.read_bytes()[:300]
    elif kind == "cut":
        doc = json.loads(golden.read_bytes())
        assert doc["count"] == len(doc["prompts"]) > 1, doc.get("count")
        content = json.dumps({**doc, "prompts": doc["prompts"][:1]}).encode()
    elif kind == "edited":
        doc = json.loads(golden.read_bytes())
        assert doc["digest"].startswith("sha256:"), doc.get("digest")
        doc["prompts"][0]["token_ids"] = [1, 2, 3]
        content = json.dumps(doc).encode()
    elif kind == "not_utf8":
        assert content is not None
        content = content.replace(b"\\udcff", b"\xff")
    assert content is not None
    golden.write_bytes(content)


def no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text and "internal error" not in text, text[-3000:]


def identity(doc: dict) -> dict:
    (check,) = [c for c in doc["checks"] if c["name"] == "identity"]
    return check


@pytest.fixture
def svc(tmp_path: Path):
    o = ServiceOps(tmp_path)
    o.configure()
    yield o
    o.stop()


def test_healthcheck_fails_a_damaged_golden_set_in_one_line(svc: ServiceOps) -> None:
    assert svc.json("service", "start", "local")[0] == 0
    assert svc.json("healthcheck", "local", "--record-golden", "--max-tokens", "4")[0] == 0
    golden = svc.tmp / "root" / "golden" / "golden.json"
    recorded = golden.read_bytes()
    for kind, (_, why) in DAMAGES.items():
        golden.write_bytes(recorded)
        damage(golden, kind)
        res = svc("healthcheck", "local", "--json")
        no_traceback(res.stdout, res.stderr)
        assert res.returncode == 1, (kind, res.stdout[-2000:], res.stderr[-2000:])
        doc = json.loads(res.stdout)
        assert doc["failed"] == ["identity"], (kind, doc["failed"])
        check = identity(doc)
        assert check["status"] == "fail"
        assert check["detail"].startswith(f"the golden set {golden} is damaged: "), check
        assert why in check["detail"], (kind, check["detail"])
        assert FIX in check["detail"] and "\n" not in check["detail"]
        module = doc["modules"]["identity"]
        assert module["ok"] is False and module["error"] == "bad_golden", module
    res = svc("healthcheck", "local")  # the human view: the failed module, its one line
    no_traceback(res.stdout, res.stderr)
    assert res.returncode == 1 and "FAIL (identity)" in res.stdout, res.stdout
    assert "damaged" in res.stdout
    # the fix it names works, and keeps the damaged set beside the new one
    damaged = golden.read_bytes()
    code, rec = svc.json("healthcheck", "local", "--record-golden", "--max-tokens", "4")
    assert code == 0, rec
    assert (golden.parent / "golden.json.1").read_bytes() == damaged
    code, doc = svc.json("healthcheck", "local")
    assert code == 0 and identity(doc)["status"] == "pass", doc["failed"]


def test_local_golden_file_nested_deep_is_bad_input(svc: ServiceOps) -> None:
    """P84: `ops healthcheck --golden FILE` of 200000 nested `[` is exit 2, one line naming the
    file (the bounded read in ops/files.py, or parse_golden after it, says it is too deep)."""
    assert svc.json("service", "start", "local")[0] == 0
    deep = svc.tmp / "deep.json"
    deep.write_bytes(b"[" * 200_000)
    line = one_error_line(svc("healthcheck", "local", "--golden", str(deep)))
    assert f"golden file {deep}: " in line and "nested" in line, line


@pytest.mark.parametrize(
    "kind",
    ["numbers", "no_prompt", "max_tokens_huge", "mapping", "deep", "count_huge", "count_text"],
)
def test_identity_module_refuses_a_damaged_golden_set_before_any_request(
    tmp_path: Path, kind: str
) -> None:
    golden = tmp_path / "golden.json"
    golden.write_bytes(golden_doc())
    damage(golden, kind)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: no request is made first
    res = subprocess.run(
        [sys.executable, "-m", "checks.identity", "--json", "--url", url, "--golden", str(golden)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    no_traceback(res.stderr)
    assert res.returncode == 2, (res.stdout, res.stderr[-2000:])
    doc = json.loads(res.stdout)
    assert doc["error"] == "bad_golden" and doc["message"].startswith(f"{golden}: ")
    assert DAMAGES[kind][1] in doc["message"], doc["message"]


def test_deploy_force_and_rollback_are_not_blocked_by_a_damaged_golden_set(ops: DeployOps) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    golden = ops.root / "golden" / "golden.json"
    assert golden.is_file()
    damage(golden, "numbers")
    why = DAMAGES["numbers"][1]
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')

    # the pre-flight fails on it, in one line with the fix, and nothing changes
    res = ops.deploy()
    no_traceback(res.stdout, res.stderr)
    assert res.returncode == 1, res.stdout + res.stderr
    result = ops.record("deploy")["results"][0]
    assert result["failed_step"] == "preflight" and ops.current() == r1
    (pre,) = [s for s in result["steps"] if s["name"] == "preflight"]
    assert any(why in line and FIX in line for line in pre["evidence"]), pre
    # the line blames the golden set and names its fix, not the service and --force (G6)
    assert pre["detail"].startswith("the golden set on the host is damaged"), pre["detail"]
    assert FIX in pre["detail"] and "--force" not in pre["detail"], pre["detail"]

    # --force passes it; the post-flight (under the lock) does not undo the deploy for it
    res = ops.deploy("--force")
    no_traceback(res.stdout, res.stderr)
    assert res.returncode == 0, res.stdout + res.stderr
    result = ops.record("deploy")["results"][0]
    assert result["outcome"] == "deployed", result["message"]
    assert steps(result)["postflight"] == "ok" and "rollback" not in steps(result)
    r2 = ops.current()
    assert r2 != r1 and ops.serving() == r2
    (post,) = [s for s in result["steps"] if s["name"] == "postflight"]
    check = identity(post["data"]["report"])
    assert check["status"] == "skip" and check["detail"].startswith("NOT CHECKED: "), check
    assert why in check["detail"] and FIX in check["detail"]
    assert "healthy; token identity NOT CHECKED" in post["detail"], post  # said, not hidden
    # never marked proven for it: a later rollback must not take it for checked (probe37ah L4)
    assert f"so {r2} was not marked proven" in result["message"], result["message"]
    assert not (ops.root / "releases" / r2 / "proven.json").exists()
    # nor is the golden set recorded from r2 while r1 passed one (probe37as L3)
    held = golden.read_bytes()
    res = ops("healthcheck", "local", "--record-golden", "--max-tokens", "3")
    line = one_error_line(res)
    assert f"current ({r2}) never passed a post-flight" in line, line
    assert f"ops rollback local --to {r1} makes the newest proven release" in res.stderr
    assert golden.read_bytes() == held

    # an emergency rollback is not blocked: it switches, restarts, and stays
    res = ops("rollback", "local")
    no_traceback(res.stdout, res.stderr)
    assert res.returncode == 0, res.stdout + res.stderr
    assert ops.current() == r1 and ops.serving() == r1
    result = ops.record("rollback")["results"][0]
    assert result["outcome"] == "switched", result
    (post,) = [s for s in result["steps"] if s["name"] == "postflight"]
    assert identity(post["data"]["report"])["detail"].startswith("NOT CHECKED: ")
    assert not (ops.root / "deploy.pending").exists()

    # outside a deploy, the same set still fails a healthcheck
    code, doc = ops.json("healthcheck", "local", "--max-tokens", "3")
    assert code == 1 and doc["failed"] == ["identity"], doc.get("failed")
    assert os.path.exists(golden)


def test_a_golden_set_that_is_no_regular_file_is_damaged_not_absent(svc: ServiceOps) -> None:
    """A FIFO at the golden set's path was read as "no golden set" and the healthcheck passed
    with identity skipped (probe37e E8): it is a damaged golden set, and the fix it names
    (recording anew) works without hanging on the FIFO."""
    assert svc.json("service", "start", "local")[0] == 0
    golden = svc.tmp / "root" / "golden" / "golden.json"
    golden.parent.mkdir(parents=True)
    os.mkfifo(golden)
    res = svc("healthcheck", "local", "--json")
    no_traceback(res.stdout, res.stderr)
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and doc["failed"] == ["identity"], doc["failed"]
    assert "not a regular file" in identity(doc)["detail"], identity(doc)
    code, rec = svc.json("healthcheck", "local", "--record-golden", "--max-tokens", "4")
    assert code == 0, rec
    assert golden.is_file() and not golden.is_symlink()
    # kept beside it as the message says (probe37h L2: a FIFO was replaced, not kept)
    assert stat.S_ISFIFO((golden.parent / "golden.json.1").lstat().st_mode)
    code, doc = svc.json("healthcheck", "local")
    assert code == 0 and identity(doc)["status"] == "pass", doc["failed"]


def test_a_golden_set_that_cannot_be_recorded_on_the_host_is_one_line(svc: ServiceOps) -> None:
    """probe37al M1 (medium): `ops healthcheck --record-golden` on a full root with no golden
    set yet was an internal error (KeyError, exit 4, "a bug in ops"). The host's trouble is
    one line, exit 2; here the write fails as a full disk's would (golden/ is a file)."""
    assert svc.json("service", "start", "local")[0] == 0
    (svc.tmp / "root" / "golden").write_text("")  # golden/golden.json cannot be made
    res = svc("healthcheck", "local", "--record-golden", "--max-tokens", "3")
    no_traceback(res.stdout, res.stderr)
    assert res.returncode == 2 and "internal error" not in res.stderr, res.stderr
    assert "record golden: the golden set could not be written" in res.stderr, res.stderr
    code, doc = svc.json("healthcheck", "local", "--record-golden", "--max-tokens", "3")
    assert code == 2 and doc["ok"] is False and "internal" not in doc, doc


def test_a_deploy_never_records_over_a_golden_set_that_is_no_regular_file(ops: DeployOps) -> None:
    """probe37g G6: the pre-flight took a FIFO at the golden set's path for no golden set and
    recorded a fresh one over it, unsaid. It is a damaged golden set: refused, named, kept."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    golden = ops.root / "golden" / "golden.json"
    golden.unlink()
    os.mkfifo(golden)
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    res = ops.deploy()
    no_traceback(res.stdout, res.stderr)
    assert res.returncode == 1 and ops.current() == r1, res.stdout + res.stderr
    (pre,) = [s for s in ops.record("deploy")["results"][0]["steps"] if s["name"] == "preflight"]
    assert pre["detail"].startswith("the golden set on the host is damaged"), pre
    assert any("not a regular file" in line for line in pre["evidence"]), pre
    assert stat.S_ISFIFO(golden.lstat().st_mode)  # kept as it was


def test_a_golden_set_that_cannot_be_written_is_one_document(tmp_path: Path) -> None:
    """probe37v V1 (medium): a full disk when the golden set was recorded (a deploy's
    pre-flight on a target with none yet): `checks.identity` died with a traceback of
    OSError, and the deploy printed it. It answers one JSON document (exit 1) naming the
    file and the error. Here the write fails as a full disk's would (its directory is a file)."""
    port = free_port()
    svc = subprocess.Popen([sys.executable, str(FAKE_SERVICE), "--port", str(port)])
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            time.sleep(0.1)
        (tmp_path / "a-file").write_text("")
        target = tmp_path / "a-file" / "golden.json"  # its directory cannot be made
        res = subprocess.run(
            [sys.executable, "-m", "checks.identity", "--json", "--url", url, "--limit", "1"]
            + ["--max-tokens", "2", "--record-golden", str(target)],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
    finally:
        svc.kill()
        svc.wait()
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["error"] == "write_failed" and str(target.parent) in doc["message"], doc


def test_a_golden_set_not_written_leaves_no_kept_copy(tmp_path: Path) -> None:
    """probe37bm L3 (low): each `--record-golden` that failed to write (a full disk) left one
    more `golden.json.N`, a kept "previous set" of a replacement that never happened. The set
    stays as it was and nothing is added beside it. The write fails here as on a full disk:
    the recorder may write no file past 64 bytes (RLIMIT_FSIZE; python ignores SIGXFSZ, so
    write(2) fails with EFBIG), while the kept hard link takes no room."""
    port = free_port()
    svc = subprocess.Popen([sys.executable, str(FAKE_SERVICE), "--port", str(port)])
    golden = tmp_path / "golden" / "golden.json"
    golden.parent.mkdir()
    golden.write_bytes(b'{"an": "earlier set"}')

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

    try:
        wait_answering(port)
        for _ in range(2):
            res = subprocess.run(
                [sys.executable, "-m", "checks.identity", "--json", "--url"]
                + [f"http://127.0.0.1:{port}", "--limit", "1", "--max-tokens", "2"]
                + ["--record-golden", str(golden)],
                capture_output=True,
                text=True,
                cwd=REPO,
                timeout=120,
                preexec_fn=small_files,
            )
            assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
            doc = json.loads(res.stdout.strip().splitlines()[-1])
            assert doc["error"] == "write_failed", doc
    finally:
        svc.kill()
        svc.wait()
    assert sorted(p.name for p in golden.parent.iterdir()) == ["golden.json"]
    assert golden.read_bytes() == b'{"an": "earlier set"}'


def test_a_post_flight_with_no_golden_set_proves_nothing(ops: DeployOps) -> None:
    """probe37ax H1 (high): the golden set gone (removed by hand) under a deploy of a release
    answering other tokens: its post-flight skipped token identity, said "token-identical" and
    marked it proven; the next deploy's pre-flight recorded a golden set from it, which then
    rejected the good release and undid the rollback to the proven one. A post-flight with no
    golden set says NOT CHECKED and marks nothing proven, and no pre-flight records a golden
    set from a `current` that never passed a post-flight while a proven release exists."""
    assert ops.deploy("--bootstrap").returncode == 0
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    assert ops.deploy().returncode == 0
    r2 = ops.current()
    golden = ops.root / "golden" / "golden.json"
    golden.unlink()
    ops.stop()  # (--force: no pre-flight records one first)
    commit_change(
        ops.src, "engine/svc.py", "        salt = self.salt\n", "        salt = self.salt + 'x'\n"
    )
    res = ops.deploy("--force")
    text = " ".join((res.stdout + res.stderr).split())
    no_traceback(res.stdout, res.stderr)
    assert res.returncode == 0 and "token-identical" not in text, text
    assert "token identity NOT CHECKED (no golden set" in text, text
    r3 = ops.current()
    assert r3 != r2 and not (ops.root / "releases" / r3 / "proven.json").exists()
    commit_change(
        ops.src, "engine/svc.py", "        salt = self.salt + 'x'\n", "        salt = self.salt\n"
    )
    res = ops.deploy()
    text = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 1 and "preflight: FAIL" in text, text
    assert f"ops rollback local --to {r2} goes to the newest proven release" in text, text
    assert not golden.exists() and ops.current() == r3


def test_a_bootstrap_over_proven_releases_records_no_golden_set(ops: DeployOps) -> None:
    """probe37ba H1 (high): `current` and the golden set removed by hand, the service stopped,
    proven releases still in releases/: `ops deploy --bootstrap` of a release answering other
    tokens recorded the golden set from it, said "token-identical" and marked it proven; the
    rollback to a good proven release then failed identity on every prompt and was undone. A
    bootstrap records no golden set from a new release where proven ones are on the host: its
    post-flight says NOT CHECKED, nothing is marked proven, and the result names the way: the
    rollback to the newest proven release, then the golden set recorded from it."""
    r1, r2 = ops.two_releases()
    golden = ops.root / "golden" / "golden.json"
    golden.unlink()
    ops.stop()
    (ops.root / "current").unlink()
    commit_change(
        ops.src, "engine/svc.py", "        salt = self.salt\n", "        salt = self.salt + 'x'\n"
    )
    res = ops.deploy("--bootstrap")
    text = " ".join((res.stdout + res.stderr).split())
    no_traceback(res.stdout, res.stderr)
    assert res.returncode == 0 and "token-identical" not in text, text
    r3 = ops.current()
    assert r3 not in (r1, r2) and not (ops.root / "releases" / r3 / "proven.json").exists()
    assert not golden.exists(), "a golden set was recorded from the new release"
    assert f"ops rollback local --to {r2}, ops healthcheck local --record-golden" in text, text
    # the way named: back to the proven release, its golden set, and the deploy judged by it
    assert ops("rollback", "local", "--to", r2, "--max-tokens", "3").returncode == 0
    res = ops("healthcheck", "local", "--record-golden", "--max-tokens", "3")
    assert res.returncode == 0 and golden.is_file(), res.stdout + res.stderr
    res = ops.deploy()
    text = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 1 and "postflight: FAIL" in text, text  # its other tokens, seen
    assert ops.current() == r2 and ops.serving() == r2


def wait_answering(port: int, seconds: float = 20) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise AssertionError(f"nothing answers on port {port}")


def test_a_golden_set_is_never_recorded_from_what_answers_on_a_stopped_services_port(
    svc: ServiceOps,
) -> None:
    """probe37be H1 (high): the service stopped, another program answering on its port: `ops
    healthcheck --record-golden` said the service is down (FAIL), yet replaced the golden set
    with that program's tokens (so did a deploy's pre-flight with no golden set). Every later
    check of the real service then failed identity. Nothing is recorded while the service is
    not running; the golden set stays as it was."""
    assert svc.json("service", "start", "local")[0] == 0
    assert svc.json("healthcheck", "local", "--record-golden", "--max-tokens", "4")[0] == 0
    golden = svc.tmp / "root" / "golden" / "golden.json"
    recorded = golden.read_bytes()
    assert svc.json("service", "stop", "local")[0] == 0
    other = subprocess.Popen(  # another program on its port, answering other tokens
        [sys.executable, str(FAKE_SERVICE), "--port", str(svc.port), "--salt", "other"],
        cwd="/",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_answering(svc.port)
        code, doc = svc.json("healthcheck", "local", "--record-golden", "--max-tokens", "4")
        assert code == 1 and "service" in doc["failed"], doc["failed"]
        assert identity(doc)["detail"].startswith("NOT RECORDED: the service is inactive"), doc
        assert golden.read_bytes() == recorded and not golden.with_name("golden.json.1").exists()
    finally:
        other.terminate()
        other.wait(10)
    assert svc.json("service", "start", "local")[0] == 0
    code, doc = svc.json("healthcheck", "local")
    assert code == 0 and identity(doc)["status"] == "pass", doc["failed"]


def test_a_golden_set_is_recorded_only_from_current_as_the_service_runs_it(
    ops: DeployOps,
) -> None:
    """probe37be H2 (high): current switched by hand to a rejected release, the service
    restarted on it with --force, current switched back to a proven one: `--record-golden`
    recorded the rejected release's tokens. It is refused while the service runs another
    release than current, and where current is rejected; the ways named work."""
    assert ops.deploy("--bootstrap").returncode == 0
    good = ops.current()
    commit_change(ops.src, "engine/svc.py", 'default=""', 'default="bad"')
    assert ops.deploy().returncode == 1  # it fails identity: rejected, the host back on good
    bad = next(p.name for p in (ops.root / "releases").iterdir() if p.name != good)
    assert (ops.root / "releases" / bad / "rejected.json").exists()
    golden = ops.root / "golden" / "golden.json"
    recorded = golden.read_bytes()
    link = ops.root / "current"
    link.unlink()
    link.symlink_to(f"releases/{bad}")
    res = ops("healthcheck", "local", "--record-golden", "--max-tokens", "3")
    text = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 2 and f"current ({bad}) failed a post-flight (rejected)" in text
    assert ops("service", "restart", "local", "--force").returncode == 0
    link.unlink()
    link.symlink_to(f"releases/{good}")
    res = ops("healthcheck", "local", "--record-golden", "--max-tokens", "3")
    text = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 2 and f"the service runs {bad}, not current ({good})" in text, text
    assert golden.read_bytes() == recorded
    assert ops("service", "restart", "local").returncode == 0  # the way named
    res = ops("healthcheck", "local", "--record-golden", "--max-tokens", "3")
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_way_named_after_a_no_restart_install_is_one_that_works(ops: DeployOps) -> None:
    """probe37bm M1 (medium): after `deploy --no-restart`, `--record-golden` was refused (the
    service runs the proven release, not current) naming `ops service restart`, which is
    refused too (current never passed a post-flight). It names the rollback that makes what
    runs current, with no restart; followed, the set is recorded."""
    r1, r2 = ops.two_releases()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    assert ops.deploy("--no-restart").returncode == 0
    res = ops("healthcheck", "local", "--record-golden", "--max-tokens", "3")
    text = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 2 and f"the service runs {r2}, not current" in text, text
    assert f"ops rollback local --to {r2} makes what the service runs current" in text, text
    assert "ops service restart local runs current" not in text, text
    assert ops("rollback", "local", "--to", r2, "--max-tokens", "3").returncode == 0
    res = ops("healthcheck", "local", "--record-golden", "--max-tokens", "3")
    assert res.returncode == 0, res.stdout + res.stderr


def test_record_golden_never_writes_over_what_is_no_regular_file(svc: ServiceOps) -> None:
    """probe37bh H1 (high): `--record-golden --golden PATH` moved whatever was at PATH aside (a
    device node, a FIFO, a link, a whole directory: the remote root itself) and passed. It is
    refused before any request, in one line, and what is there stays."""
    assert svc.json("service", "start", "local")[0] == 0
    places: dict[str, Path] = {"directory": svc.tmp / "root"}
    fifo = svc.tmp / "fifo"
    os.mkfifo(fifo)
    places["FIFO"] = fifo
    link = svc.tmp / "link"
    link.symlink_to(svc.tmp / "elsewhere.json")
    places["symbolic link"] = link
    node = svc.tmp / "node"
    with contextlib.suppress(OSError):  # (root only: a character device of our own)
        os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        places["character device"] = node
    for kind, path in places.items():
        before = path.lstat()
        res = svc("healthcheck", "local", "--record-golden", "--golden", str(path))
        no_traceback(res.stdout, res.stderr)
        assert res.returncode == 2 and f"golden file {path} is a {kind}" in res.stderr, (
            kind,
            res.stderr,
        )
        after = path.lstat()
        assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode), kind
        assert not path.with_name(path.name + ".1").exists(), kind
