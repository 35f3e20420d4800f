"""Releases for the deploy tests: a temporary git repository holding a copy of the project's
data plane (so a test can commit a change, a different weight seed or a broken kernel, and
deploy it), and `Deploy`, the real `ops` CLI against one inventory of SSH targets.

Two things keep the deploys quick without changing what they prove:
- `build_cpp_cache` compiles the C++ CPU baseline once (what a deploy's self-test builds into
  `<remote_root>/cache`, keyed by the sha256 of its source and flags) and `Deploy(cache=...)`
  copies it into each host's cache before the first deploy, as a host that has deployed
  before has it. A commit that changes the C++ source has another key and is compiled by its
  own self-test, as on any host.
- `trim_golden` re-records a host's golden set with only its first prompts, once the test has
  checked the full set its bootstrap recorded, so that later pre- and post-flights of a real
  engine check a few prompts instead of all 34 (a changed model diverges on every one).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import FAKE_SERVICE, REPO
from .cli import ops_json
from .local import end_services
from .sshd import Sshd

DATA_PLANE = ("kernels", "checks", "engine", "integration", "pyproject.toml")
ENGINE_CMD = "{python} -m engine --host {host} --port {port} --preset tiny --mode ddtree"
FAKE_CMD = f"{{python}} {FAKE_SERVICE} --port {{port}}"  # a service that answers at once
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
    """Replace `old` (which must be there) by `new` in one file and commit; the new sha."""
    f = src / path
    text = f.read_text()
    assert old in text, f"{old!r} not in {path}"
    f.write_text(text.replace(old, new, 1))
    git(src, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-am", f"change {path}")
    return git(src, "rev-parse", "HEAD").strip()


def build_cpp_cache(cache: Path) -> Path:
    """The C++ CPU baseline compiled into `cache` as `kernels.cpu` names it; `cache`."""
    subprocess.run(
        [sys.executable, "-c", "from kernels.cpu import library_path; library_path()"],
        check=True,
        capture_output=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "DDTREE_CACHE": str(cache)},
    )
    assert list(cache.glob("cpu_tree_build-*.so")), f"nothing built in {cache}"
    return cache


def trim_golden(url: str, root: Path, prompts: int) -> dict:
    """Re-record `<root>/golden/golden.json` from the service at `url` with its first
    `prompts` golden prompts (the previous set is kept as golden.json.1); the new document."""
    golden = root / "golden" / "golden.json"
    argv = ["--record-golden", str(golden), "--limit", str(prompts), "--max-tokens", TOKENS]
    subprocess.run(
        [sys.executable, "-m", "checks.identity", "--json", "--url", url, *argv],
        check=True,
        capture_output=True,
        timeout=120,
        cwd=REPO,
    )
    return json.loads(golden.read_text())


def steps(doc: dict, host: int = 0) -> dict[str, str]:
    """A deploy document's steps for one host: name -> status."""
    return {s["name"]: s["status"] for s in doc["results"][host]["steps"]}


class Deploy:
    """The real `ops` CLI against one inventory naming SSH targets (and `local`).

    `hosts` maps a target name to its sshd, remote root, service port and optionally its
    service command (default: the reference engine), gpus, cuda_arch and components."""

    def __init__(
        self, tmp: Path, hosts: dict[str, dict], src: Path, cache: Path | None = None
    ) -> None:
        self.tmp, self.src = tmp, src
        self.inventory = tmp / "ops.toml"
        self.env = {**os.environ, "OPS_RUNS_DIR": str(tmp / "runs")}
        self.hosts = hosts
        self.write()
        for h in hosts.values():  # what an earlier deploy's self-test left in the host's cache
            if cache is not None:
                shutil.copytree(cache, Path(h["root"]) / "cache", dirs_exist_ok=True)

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
        return ops_json(*args, inventory=self.inventory, env=self.env, timeout=timeout)

    def deploy(self, target: str, *extra: str) -> tuple[int, dict, str]:
        return self("deploy", target, "--source", str(self.src), "--max-tokens", TOKENS, *extra)

    def current(self, name: str) -> str | None:
        link = Path(self.hosts[name]["root"]) / "current"
        return os.readlink(link).split("/")[-1] if link.is_symlink() else None

    def stop_all(self) -> None:
        """A test's teardown: every host's service ends (`end_services`)."""
        for h in self.hosts.values():
            end_services(Path(h["root"]))
