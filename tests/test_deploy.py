"""`ops deploy` / `ops releases` / `ops rollback` over a real sshd on loopback, with the reference
engine as the service under ops's `process` manager, deployed from a real git checkout.

The releases come from a temporary git repository holding a copy of the project's data plane,
so a test can commit a change (a different weight seed, a broken kernel) and deploy it.

What needs the engine (its bootstrap, and a changed model caught by token identity and rolled
back) runs on a host of its own. The release machinery (failed builds and self-tests, a
redeploy, the releases table and rollback, a killed deploy) runs against the stand-in service on
ONE host bootstrapped once for the module (`shared`): each of those tests starts from release
r1 current and serving and the source at r1's commit (`on_r1` puts the host back there if a
test before it left it elsewhere), in this order: failed build/self-test (changes nothing, as it
asserts), redeploy + rollback (ends back on r1), killed deploy (last: ends on a new release).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.deploy import (
    FAKE_CMD,
    TOKENS,
    Deploy,
    commit_change,
    git,
    make_source,
    steps,
    trim_golden,
)
from helpers.sshd import Sshd, free_port


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return make_source(tmp_path)


@pytest.fixture
def one(tmp_path: Path, sshd: Sshd, src: Path, cpp_cache: Path):
    """The loop target with the reference engine as its service."""
    host = {"sshd": sshd, "root": tmp_path / "root", "port": free_port()}
    d = Deploy(tmp_path, {"loop": host}, src, cache=cpp_cache)
    yield d
    d.stop_all()


@pytest.fixture
def quick(tmp_path: Path, sshd: Sshd, src: Path, cpp_cache: Path):
    """The loop target with tests/helpers/fake_service.py as its service (answers at once), for
    the tests whose point is the release machinery rather than the engine's output."""
    host = {"sshd": sshd, "root": tmp_path / "root", "port": free_port(), "command": FAKE_CMD}
    d = Deploy(tmp_path, {"loop": host}, src, cache=cpp_cache)
    yield d
    d.stop_all()


class Shared(Deploy):
    r1: str  # the bootstrap's release
    r1_sha: str  # its commit


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, sshd: Sshd, cpp_cache: Path
) -> Iterator[Shared]:
    """`quick`'s host, bootstrapped once for the tests below that need a deployed host."""
    tmp = tmp_path_factory.mktemp("shared")
    host = {"sshd": sshd, "root": tmp / "root", "port": free_port(), "command": FAKE_CMD}
    d = Shared(tmp, {"loop": host}, make_source(tmp), cache=cpp_cache)
    try:
        code, doc, err = d.deploy("loop", "--bootstrap")
        assert code == 0 and doc["results"][0]["outcome"] == "deployed", err
        d.r1, d.r1_sha = d.current("loop") or "", git(d.src, "rev-parse", "HEAD").strip()
        yield d
    finally:
        d.stop_all()


@pytest.fixture
def on_r1(shared: Shared) -> Shared:
    """The shared host as each test using it starts: r1 current and serving, the source at r1's
    commit, no GPU in the inventory. A test that ends elsewhere is undone here (a rollback to
    r1), so a test's outcome never depends on which ran before it."""
    d = shared
    git(d.src, "checkout", "-q", "-B", "main", d.r1_sha)
    d.hosts["loop"].update(gpus=0, cuda_arch=None)
    d.write()
    if d.current("loop") != d.r1:
        code, _, err = d("rollback", "loop", "--to", d.r1, "--max-tokens", TOKENS)
        assert code == 0, err
    code, st, _ = d("service", "status", "loop")
    assert code == 0 and st["state"] == "active" and d.current("loop") == d.r1, st
    return d


def identity_of(d: Deploy, name: str) -> dict:
    code, doc, err = d("healthcheck", name, "--max-tokens", TOKENS)
    assert code == 0, (doc, err)
    (check,) = [c for c in doc["checks"] if c["name"] == "identity"]
    return check


def test_bootstrap_and_identity_guard_on_the_engine(one: Deploy) -> None:
    d, root = one, Path(one.hosts["loop"]["root"])
    # dry run: the plan, nothing touched
    code, doc, _ = d.deploy("loop", "--bootstrap", "--dry-run")
    assert code == 0 and doc["results"][0]["outcome"] == "dry-run"
    assert not (root / "releases").exists()
    # first install
    code, doc, err = d.deploy("loop", "--bootstrap")
    r1 = doc["results"][0]["release"]
    assert code == 0 and doc["results"][0]["outcome"] == "deployed", err
    assert steps(doc) == {
        "package": "ok",
        "current": "ok",
        "lock": "ok",
        "send": "ok",
        "build": "skip",
        "selftest": "ok",
        "finalize": "ok",
        "switch": "ok",
        "restart": "ok",
        "postflight": "ok",
        "prune": "ok",
    }
    assert d.current("loop") == r1 and (root / "golden" / "golden.json").is_file()
    manifest = json.loads((root / "releases" / r1 / "release.json").read_text())
    assert manifest["git_sha"] == git(d.src, "rev-parse", "HEAD").strip()
    assert manifest["files"]["engine/__main__.py"] and manifest["selftest"]["ok"] is True
    assert "PYTHONPATH=" in (root / "releases" / r1 / "service.env").read_text()
    # the bootstrap recorded every golden prompt; from here on the engine's pre- and
    # post-flights check the first 6 (a changed model diverges on each of them)
    prompts = json.loads((d.src / "checks" / "data" / "golden_prompts.json").read_text())
    full = json.loads((root / "golden" / "golden.json").read_text())
    assert len(full["prompts"]) == len(prompts["prompts"]) > 6
    url = f"http://127.0.0.1:{d.hosts['loop']['port']}"
    assert len(trim_golden(url, root, 6)["prompts"]) == 6
    # the same commit again: nothing to do
    code, doc, _ = d.deploy("loop")
    assert code == 0 and doc["results"][0]["outcome"] == "already-current"
    # a commit that changes the model's greedy output is rolled back by itself
    commit_change(d.src, "engine/weights.py", "manual_seed(seed)", "manual_seed(seed + 1)")
    code, doc, err = d.deploy("loop")
    res = doc["results"][0]
    assert code == 1 and res["outcome"] == "rolled-back", err
    assert steps(doc)["preflight"] == "ok"
    assert res["failed_step"] == "postflight" and steps(doc)["rollback"] == "ok"
    (post,) = [s for s in res["steps"] if s["name"] == "postflight"]
    assert any("first divergent token" in line or "diverge" in line for line in post["evidence"])
    assert d.current("loop") == r1
    assert identity_of(d, "loop")["status"] == "pass"  # answers the golden set exactly again
    # rollback refusals: an unknown release, a path
    code, _, err = d("rollback", "loop", "--to", "20990101T000000Z-deadbeef00")
    assert code == 2 and "no release" in err
    code, _, err = d("rollback", "loop", "--to", "../../etc")
    assert code == 2 and "no release" in err


def test_second_deploy_is_refused_naming_the_holder(quick: Deploy) -> None:
    from ops.hosts.inventory import load_inventory
    from ops.hosts.remote import open_host

    target = load_inventory(quick.inventory).target("loop")
    with open_host(target) as host, host.lock("deploy by someone else"):
        code, doc, err = quick.deploy("loop", "--bootstrap")
    assert code == 2 and "host lock held by" in err and "deploy by someone else" in err
    assert quick.current("loop") is None


def releases(d: Deploy) -> list[str]:
    """The release directories on the host, oldest first (ids start with their UTC time)."""
    return sorted(p.name for p in (Path(d.hosts["loop"]["root"]) / "releases").iterdir())


def test_failed_build_or_selftest_leaves_current_and_service_alone(on_r1: Shared) -> None:
    d = on_r1
    r1, pid, before = d.r1, d("service", "status", "loop")[1]["pid"], releases(d)
    # a C++ builder that breaks ties the wrong way: the CPU self-test catches it
    commit_change(
        d.src,
        "kernels/csrc/cpu_tree_build.cpp",
        "if (ra != rb) return ra < rb;",
        "if (ra != rb) return ra > rb;",
    )
    code, doc, err = d.deploy("loop")
    res = doc["results"][0]
    assert code == 1 and res["failed_step"] == "selftest", err
    assert d.current("loop") == r1 and d("service", "status", "loop")[1]["pid"] == pid
    assert releases(d) == before  # nothing left behind
    # a GPU target whose kernels do not compile fails at the build, before anything switches
    d.hosts["loop"].update(gpus=1, cuda_arch="sm_90")
    d.write()
    commit_change(d.src, "kernels/csrc/greedy_accept.cu", "#include", "#error broken\n#include")
    code, doc, err = d.deploy("loop", "--force")
    res = doc["results"][0]
    assert code == 1 and res["failed_step"] == "build", err
    assert d.current("loop") == r1 and d("service", "status", "loop")[1]["pid"] == pid
    assert releases(d) == before


def test_redeploy_releases_and_rollback(on_r1: Shared) -> None:
    d, r1, before = on_r1, on_r1.r1, releases(on_r1)
    # a new commit that keeps the output: deployed, with pre- and post-flight
    commit_change(d.src, "engine/golden.py", '"""', '"""Release two. ')
    code, doc, err = d.deploy("loop")
    r2 = doc["results"][0]["release"]
    assert code == 0 and doc["results"][0]["outcome"] == "deployed", err
    assert steps(doc)["preflight"] == "ok" and steps(doc)["postflight"] == "ok"
    assert d.current("loop") == r2
    code, rel, _ = d("releases", "loop")
    assert [r["id"] for r in rel["releases"]] == [*before, r2]  # every release, oldest first
    assert (rel["current"], rel["previous"]) == (r2, r1)
    # rollback: to the previous release
    code, doc, err = d("rollback", "loop", "--max-tokens", TOKENS)
    assert code == 0 and d.current("loop") == r1, err
    assert identity_of(d, "loop")["status"] == "pass"


def test_killed_deploy_leaves_the_previous_release_serving(on_r1: Shared) -> None:
    """ops dies mid post-flight (SIGKILL: no cleanup of its own, as a lost connection): the
    guard on the host switches back and restarts; a half-sent release is cleaned up later."""
    d, root, r1 = on_r1, Path(on_r1.hosts["loop"]["root"]), on_r1.r1
    commit_change(d.src, "engine/golden.py", '"""', '"""Release two. ')
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ops",
            "deploy",
            "loop",
            "--source",
            str(d.src),
            "--max-tokens",
            TOKENS,
            "--inventory",
            str(d.inventory),
        ],
        env=d.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = ""
    deadline = time.monotonic() + 120
    assert proc.stderr is not None
    while "postflight ..." not in seen and time.monotonic() < deadline:
        seen += proc.stderr.readline()
    assert "postflight ..." in seen, seen
    proc.kill()
    proc.wait()
    proc.stderr.close()
    for _ in range(200):
        if d.current("loop") == r1 and not (root / "deploy.pending").exists():
            break
        time.sleep(0.1)
    assert d.current("loop") == r1 and not (root / "deploy.pending").exists()
    for _ in range(100):
        code, st, _ = d("service", "status", "loop")
        if st["state"] == "active":
            break
        time.sleep(0.3)
    assert st["state"] == "active"
    assert identity_of(d, "loop")["status"] == "pass"
    # what the guard did is on the host for the operator who finds it put back
    said = (root / "logs" / "guard.log").read_text()
    assert "ops went away before its switch was proven: current was switched back" in said
    assert '"started": true' in said, said
    # its restart waits for no /health (ops asks it itself), and says so, not "unhealthy"
    # (probe37q Q9: every entry read as a failed restart)
    assert "not waited for" in said or '"ok": true' in said, said
    assert said.endswith("\n"), said  # the next entry starts a line of its own
    # a half-sent release (a dead deploy's staging dir) is removed by the next deploy
    (root / "releases" / ".staging-20990101T000000Z-abcdef0123").mkdir()
    code, doc, err = d.deploy("loop")
    assert code == 0, err
    (send,) = [s for s in doc["results"][0]["steps"] if s["name"] == "send"]
    assert send["data"]["cleaned"] == [".staging-20990101T000000Z-abcdef0123"]
