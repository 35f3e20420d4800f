"""`ops deploy` / `ops releases` / `ops rollback` over a real sshd on loopback, with the reference
engine as the service under ops's `process` manager, deployed from a real git checkout.

The releases come from a temporary git repository holding a copy of the project's data plane,
so a test can commit a change (a different weight seed, a broken kernel) and deploy it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sshd import Sshd, free_port

REPO = Path(__file__).resolve().parent.parent
DATA_PLANE = ("kernels", "checks", "engine", "integration", "pyproject.toml")
ENGINE_CMD = "{python} -m engine --host {host} --port {port} --preset tiny --mode ddtree"
TOKENS = "4"  # greedy tokens per golden prompt: enough to catch a changed model, and quick


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def make_source(tmp: Path) -> Path:
    """A git repository with a copy of the project's data plane, one commit."""
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "_build", "*.so", "*.egg-info")
    for name in DATA_PLANE:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        elif path.exists():
            shutil.copy2(path, src / name)
    git(src, "init", "-q", "-b", "main")
    git(src, "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A")
    git(src, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "first")
    return src


def commit_change(src: Path, path: str, old: str, new: str) -> str:
    f = src / path
    text = f.read_text()
    assert old in text, f"{old!r} not in {path}"
    f.write_text(text.replace(old, new, 1))
    git(src, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-am", f"change {path}")
    return git(src, "rev-parse", "HEAD").strip()


class Deploy:
    """The real `ops` CLI against one inventory naming SSH targets (and `local`)."""

    def __init__(self, tmp: Path, hosts: dict[str, dict], src: Path) -> None:
        self.tmp, self.src = tmp, src
        self.inventory = tmp / "ops.toml"
        self.env = {**os.environ, "OPS_RUNS_DIR": str(tmp / "runs")}
        self.hosts = hosts
        self.write()

    def write(self, groups: dict[str, list[str]] | None = None) -> None:
        lines = []
        for name, h in self.hosts.items():
            s: Sshd = h["sshd"]
            lines += [
                f"[targets.{name}]",
                "address = '127.0.0.1'",
                f"port = {s.port}",
                f"user = '{s.user}'",
                f"ssh_key = '{s.user_key}'",
                f"known_hosts = '{s.known_hosts}'",
                f"python = '{sys.executable}'",
                f"remote_root = '{h['root']}'",
                f"gpus = {h.get('gpus', 0)}",
            ]
            if h.get("cuda_arch"):
                lines.append(f"cuda_arch = '{h['cuda_arch']}'")
            lines += [
                f"[targets.{name}.service]",
                f"url = 'http://127.0.0.1:{h['port']}'",
                f"command = {json.dumps(h.get('command', ENGINE_CMD))}",
                "stop_timeout = 5",
            ]
            comps = h.get("components") or {}
            if comps:
                lines.append(f"[targets.{name}.service.components]")
                lines += [f"{k} = '{v}'" for k, v in comps.items()]
        if groups:
            lines.append("[groups]")
            lines += [f"{g} = {json.dumps(m)}" for g, m in groups.items()]
        self.inventory.write_text("\n".join(lines) + "\n")

    def __call__(self, *args: str, timeout: float = 300) -> tuple[int, dict, str]:
        res = subprocess.run(
            [sys.executable, "-m", "ops", *args, "--inventory", str(self.inventory), "--json"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
        )
        try:
            return res.returncode, json.loads(res.stdout), res.stderr
        except json.JSONDecodeError:
            raise AssertionError(f"exit {res.returncode}: {res.stdout}\n{res.stderr}") from None

    def deploy(self, target: str, *extra: str) -> tuple[int, dict, str]:
        return self("deploy", target, "--source", str(self.src), "--max-tokens", TOKENS, *extra)

    def current(self, name: str) -> str | None:
        link = Path(self.hosts[name]["root"]) / "current"
        return os.readlink(link).split("/")[-1] if link.is_symlink() else None

    def stop_all(self) -> None:
        for name in self.hosts:
            self("service", "stop", name)


def steps(doc: dict, host: int = 0) -> dict[str, str]:
    return {s["name"]: s["status"] for s in doc["results"][host]["steps"]}


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return make_source(tmp_path)


FAKE_CMD = f"{{python}} {Path(__file__).resolve().parent / 'fake_service.py'} --port {{port}}"


@pytest.fixture
def one(tmp_path: Path, sshd: Sshd, src: Path):
    """The loop target with the reference engine as its service."""
    d = Deploy(
        tmp_path, {"loop": {"sshd": sshd, "root": tmp_path / "root", "port": free_port()}}, src
    )
    yield d
    d.stop_all()


@pytest.fixture
def quick(tmp_path: Path, sshd: Sshd, src: Path):
    """The loop target with tests/fake_service.py as its service (answers at once), for the
    tests whose point is the release machinery rather than the engine's output."""
    host = {"sshd": sshd, "root": tmp_path / "root", "port": free_port(), "command": FAKE_CMD}
    d = Deploy(tmp_path, {"loop": host}, src)
    yield d
    d.stop_all()


def identity_of(d: Deploy, name: str) -> dict:
    code, doc, err = d("healthcheck", name, "--max-tokens", TOKENS)
    assert code == 0, (doc, err)
    (check,) = [c for c in doc["checks"] if c["name"] == "identity"]
    return check


def test_bootstrap_redeploy_releases_rollback_and_identity_guard(one: Deploy) -> None:
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
    # the same commit again: nothing to do
    code, doc, _ = d.deploy("loop")
    assert code == 0 and doc["results"][0]["outcome"] == "already-current"
    # a new commit that keeps the output: deployed, with pre- and post-flight
    commit_change(d.src, "engine/golden.py", '"""', '"""Release two. ')
    code, doc, err = d.deploy("loop")
    r2 = doc["results"][0]["release"]
    assert code == 0 and doc["results"][0]["outcome"] == "deployed", err
    assert steps(doc)["preflight"] == "ok" and d.current("loop") == r2
    code, rel, _ = d("releases", "loop")
    assert [r["id"] for r in rel["releases"]] == [r1, r2]
    assert (rel["current"], rel["previous"]) == (r2, r1)
    # a commit that changes the model's greedy output is rolled back by itself
    commit_change(d.src, "engine/weights.py", "manual_seed(seed)", "manual_seed(seed + 1)")
    code, doc, err = d.deploy("loop")
    res = doc["results"][0]
    assert code == 1 and res["outcome"] == "rolled-back", err
    assert res["failed_step"] == "postflight" and steps(doc)["rollback"] == "ok"
    (post,) = [s for s in res["steps"] if s["name"] == "postflight"]
    assert any("first divergent token" in line or "diverge" in line for line in post["evidence"])
    assert d.current("loop") == r2
    assert identity_of(d, "loop")["status"] == "pass"  # answers the golden set exactly again
    # rollback: to the previous release, then refusals
    code, doc, err = d("rollback", "loop", "--max-tokens", TOKENS)
    assert code == 0 and d.current("loop") == r1, err
    code, _, err = d("rollback", "loop", "--to", "20990101T000000Z-deadbeef00")
    assert code == 2 and "no release" in err
    code, _, err = d("rollback", "loop", "--to", "../../etc")
    assert code == 2 and "no release" in err


def test_failed_build_or_selftest_leaves_current_and_service_alone(quick: Deploy) -> None:
    d, root = quick, Path(quick.hosts["loop"]["root"])
    code, doc, err = d.deploy("loop", "--bootstrap")
    assert code == 0, err
    r1, pid = d.current("loop"), d("service", "status", "loop")[1]["pid"]
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
    assert not [p for p in (root / "releases").iterdir() if p.name != r1]
    # a GPU target whose kernels do not compile fails at the build, before anything switches
    d.hosts["loop"].update(gpus=1, cuda_arch="sm_90")
    d.write()
    commit_change(d.src, "kernels/csrc/greedy_accept.cu", "#include", "#error broken\n#include")
    code, doc, err = d.deploy("loop", "--force")
    res = doc["results"][0]
    assert code == 1 and res["failed_step"] == "build", err
    assert d.current("loop") == r1 and d("service", "status", "loop")[1]["pid"] == pid
    assert not [p for p in (root / "releases").iterdir() if p.name != r1]


def test_second_deploy_is_refused_naming_the_holder(quick: Deploy) -> None:
    from ops.inventory import load_inventory
    from ops.remote import open_host

    target = load_inventory(quick.inventory).target("loop")
    with open_host(target) as host, host.lock("deploy by someone else"):
        code, doc, err = quick.deploy("loop", "--bootstrap")
    assert code == 2 and "host lock held by" in err and "deploy by someone else" in err
    assert quick.current("loop") is None


def test_killed_deploy_leaves_the_previous_release_serving(quick: Deploy) -> None:
    """ops dies mid post-flight (SIGKILL: no cleanup of its own, as a lost connection): the
    guard on the host switches back and restarts; a half-sent release is cleaned up later."""
    d, root = quick, Path(quick.hosts["loop"]["root"])
    code, _, err = d.deploy("loop", "--bootstrap")
    assert code == 0, err
    r1 = d.current("loop")
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
    # a half-sent release (a dead deploy's staging dir) is removed by the next deploy
    (root / "releases" / ".staging-20990101T000000Z-abcdef0123").mkdir()
    code, doc, err = d.deploy("loop")
    assert code == 0, err
    (send,) = [s for s in doc["results"][0]["steps"] if s["name"] == "send"]
    assert send["data"]["cleaned"] == [".staging-20990101T000000Z-abcdef0123"]
