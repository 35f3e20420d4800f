"""Stand-ins for the SGLang fork's `sglang.srt.speculative.dflash_ddtree_utils`, two versions.

Each version directory is a PYTHONPATH root holding an importable `sglang` package (written for
ddtree-ops from the contract, not copied from the fork):

- `v1_6d9866b3/`: the three-parameter builder `(top_log_probs, top_token_ids, budget)`;
- `v2_807ab0e4/`: the builder with `workspace: DFlashDDTreeBuildWorkspace | None = None`.

`release(root)` lays out a release as the deploy makes it (code at the root, `site/` with the
sitecustomize beside it) and `start(...)` runs a Python script the way the service starts:
from `current/`, with the environment of the release's `service.env` (PYTHONPATH to the
release's `site/` and root, then the stand-in's directory; `DDTREE_OPS_SGLANG` set);
`popen(...)` starts it the same way and leaves it running (a service the tests read the
counters of while it lives). `CANDIDATES` is a PYTHONPATH root with candidates for the hook's
shadow that must never serve (`ddtree_test_candidates`: a builder that breaks ties the other
way, one that raises, a wrong walk).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from .. import REPO

HERE = Path(__file__).resolve().parent
V1 = HERE / "v1_6d9866b3"
V2 = HERE / "v2_807ab0e4"
CANDIDATES = HERE / "candidates"
VERSIONS = {"6d9866b3": V1, "807ab0e4": V2}
MODULE_FILE = Path("sglang", "srt", "speculative", "dflash_ddtree_utils.py")


def load_copy(root: Path, name: str) -> ModuleType:
    """A private copy of a stand-in's module (not `sglang...`: the hook never sees it)."""
    spec = importlib.util.spec_from_file_location(name, root / MODULE_FILE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def release(root: Path) -> Path:
    """`root/releases/<id>` with integration, kernels, checks and site/; returns `root/current`."""
    rel = root / "releases" / "20270101T000000Z-f0rk5ta"
    for pkg in ("integration", "kernels", "checks"):
        shutil.copytree(REPO / pkg, rel / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "integration" / "site", rel / "site")
    manifest = {  # a release says what it is (ops service start refuses a `current` without one)
        "id": rel.name,
        "git_sha": "f0rk5ta" + "0" * 33,
        "ref": "stand-in",
        "created": "2027-01-01T00:00:00Z",
        "deployed_by": "tests",
        "source": str(REPO),
        "target": "local",
    }
    (rel / "release.json").write_text(json.dumps(manifest))
    (root / "current").symlink_to(rel)
    return root / "current"


def service_env(current: Path, spec: str, *paths: Path) -> dict[str, str]:
    """Write the release's `service.env` for `spec` (PYTHONPATH: its site/ and root, then
    `paths`) and return the environment a service started from it gets."""
    rel = current.resolve()
    extra = "".join(f":{p}" for p in paths)
    (rel / "service.env").write_text(
        f"DDTREE_OPS_SGLANG={spec}\nDDTREE_RELEASE_ID={rel.name}\n"
        f"PYTHONPATH={current}/site:{current}{extra}\n"
    )
    env = {k: os.environ[k] for k in ("PATH", "HOME", "DDTREE_CACHE") if k in os.environ}
    for line in (current / "service.env").read_text().splitlines():
        key, _, value = line.partition("=")
        env[key] = value
    return env


def start(
    current: Path, spec: str, standin: Path, script: str, *args: str, timeout: float = 180
) -> subprocess.CompletedProcess:
    """Write `service.env` for `spec` and run `python -c script args` as the service would be."""
    env = service_env(current, spec, standin)
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=current,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def popen(current: Path, spec: str, paths: tuple[Path, ...], script: str, *args: str):
    """`start`, left running: stdin, stdout and stderr are pipes (text)."""
    env = service_env(current, spec, *paths)
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=current,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def status_file(current: Path) -> Path:
    return current.resolve() / "run" / "hook-status.json"
