"""Issue 18 through the release, on the SSH test host: a deploy with `tree_build = "cpp"` makes
the SGLang service's tree builder ours (the release's sitecustomize hook), a rollback undoes
it, and the healthcheck reports both. The service is a stand-in SGLang process (tests/
fixtures/sglang_service.py) that imports the fork's module from the stand-in package (the
host's own `sglang`, after the release on its PYTHONPATH) at start."""

from __future__ import annotations

import os
from pathlib import Path

from helpers.deploy import Deploy, commit_change, make_source
from helpers.sshd import Sshd, free_port

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# the host's own sglang comes after the release's site/ and code on PYTHONPATH
COMMAND = (
    f'env PYTHONPATH="$PYTHONPATH:{FIXTURES / "sglang_stub"}" '
    f"{{python}} {FIXTURES / 'sglang_service.py'} --port {{port}}"
)


def test_deploy_switches_the_hook_and_rollback_undoes_it(
    tmp_path: Path, sshd: Sshd, cpp_cache: Path
) -> None:
    root = tmp_path / "root"
    host = {"sshd": sshd, "root": root, "port": free_port(), "command": COMMAND}
    d = Deploy(tmp_path, {"loop": host}, make_source(tmp_path), cache=cpp_cache)

    def hook() -> dict:
        code, doc, err = d("healthcheck", "loop", "--max-tokens", "4")
        assert code == 0, (doc, err)
        (check,) = [c for c in doc["checks"] if c["name"] == "hook"]
        return check

    try:
        code, _, err = d.deploy("loop", "--bootstrap")
        assert code == 0, err
        first = d.current("loop")
        check = hook()
        assert check["status"] == "pass" and "DDTREE_OPS_SGLANG=off" in check["detail"]
        assert first in check["detail"]
        # switch the tree builder to the compiled C++ drop-in through a release
        host["components"] = {"tree_build": "cpp"}
        d.write()
        commit_change(d.src, "engine/golden.py", '"""', '"""Release two. ')
        code, _, err = d.deploy("loop")
        assert code == 0, err
        second = d.current("loop")
        assert "DDTREE_OPS_SGLANG=tree_build=cpp" in (root / "current/service.env").read_text()
        check = hook()
        assert check["status"] == "pass", check
        assert "replaced build_ddtree_tree_from_topk (tree_build=cpp)" in check["detail"], check
        assert second in check["detail"]
        log = (root / "logs" / "ddtree-engine.log").read_text()
        assert "ddtree functions: integration.sglang_dropins" in log
        # and back: the rollback restores the stock function
        code, _, err = d("rollback", "loop", "--max-tokens", "4")
        assert code == 0 and d.current("loop") == first, err
        check = hook()
        assert check["status"] == "pass" and "DDTREE_OPS_SGLANG=off" in check["detail"]
        assert first in check["detail"]
        log = (root / "logs" / "ddtree-engine.log").read_text()
        last_start = log.rsplit("ops start:", 1)[-1]
        assert "ddtree functions: sglang.srt.speculative.dflash_ddtree_utils" in last_start
    finally:
        d.stop_all()
        assert not os.path.exists(root / "deploy.pending")
