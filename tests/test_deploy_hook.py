"""Issue 18 through the release: a deploy with `tree_build = "cpp"` makes the SGLang service's
tree builder ours (the release's sitecustomize hook), a rollback undoes it, and the
healthcheck reports both. The service is a stand-in SGLang process (tests/fixtures/
sglang_service.py) that imports the fork's module from the stand-in package at start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sshd import free_port
from test_deploy import commit_change, make_source

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_deploy_switches_the_hook_and_rollback_undoes_it(tmp_path: Path) -> None:
    src = make_source(tmp_path)
    port, root, inv = free_port(), tmp_path / "root", tmp_path / "ops.toml"
    command = f"{{python}} {FIXTURES / 'sglang_service.py'} --port {{port}}"

    def write(components: str) -> None:
        inv.write_text(
            f"[targets.local]\nremote_root = '{root}'\n[targets.local.service]\n"
            f"url = 'http://127.0.0.1:{port}'\ncommand = {json.dumps(command)}\n"
            f"components = {{ {components} }}\n"
        )

    env = {
        **os.environ,
        "OPS_RUNS_DIR": str(tmp_path / "runs"),
        "PYTHONPATH": str(FIXTURES / "sglang_stub"),  # the service host's own sglang
    }

    def ops(*args: str) -> tuple[int, dict, str]:
        res = subprocess.run(
            [sys.executable, "-m", "ops", *args, "--inventory", str(inv), "--json"],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        return res.returncode, json.loads(res.stdout), res.stderr

    def hook() -> dict:
        code, doc, err = ops("healthcheck", "local", "--max-tokens", "4")
        assert code == 0, (doc, err)
        (check,) = [c for c in doc["checks"] if c["name"] == "hook"]
        return check

    def current() -> str:
        return os.readlink(root / "current").rsplit("/", 1)[-1]

    try:
        write("")
        code, doc, err = ops(
            "deploy", "local", "--source", str(src), "--bootstrap", "--max-tokens", "4"
        )
        assert code == 0, err
        first = current()
        check = hook()
        assert check["status"] == "pass" and "DDTREE_OPS_SGLANG=off" in check["detail"]
        assert first in check["detail"]
        # switch the tree builder to the compiled C++ drop-in through a release
        write('tree_build = "cpp"')
        commit_change(src, "engine/golden.py", '"""', '"""Release two. ')
        code, doc, err = ops("deploy", "local", "--source", str(src), "--max-tokens", "4")
        assert code == 0, err
        second = current()
        assert "DDTREE_OPS_SGLANG=tree_build=cpp" in (root / "current/service.env").read_text()
        check = hook()
        assert check["status"] == "pass", check
        assert "replaced build_ddtree_tree_from_topk (tree_build=cpp)" in check["detail"], check
        assert second in check["detail"]
        log = (root / "logs" / "ddtree-engine.log").read_text()
        assert "ddtree functions: integration.sglang_dropins" in log
        # and back: the rollback restores the stock function
        code, doc, err = ops("rollback", "local", "--max-tokens", "4")
        assert code == 0 and current() == first, err
        check = hook()
        assert check["status"] == "pass" and "DDTREE_OPS_SGLANG=off" in check["detail"]
        assert first in check["detail"]
    finally:
        ops("service", "stop", "local")
