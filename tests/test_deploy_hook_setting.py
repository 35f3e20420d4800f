"""The inventory's hook setting (`[targets.X.service] hook`, docs/real-service.md): `ops deploy`
writes it into the release's service.env as DDTREE_OPS_SGLANG (step 1 of the real service's
page: deploy with `measure` or `shadow:...`), a changed setting is a new release, and a
malformed one is one line, exit 2. Real parts: the `ops` CLI deploying the stand-in service
from a real git source to `local`."""

from __future__ import annotations

import pytest
from helpers.deploy_ops import Ops


def set_hook(ops: Ops, value: str) -> None:
    text = ops.inventory.read_text()
    lines = [ln for ln in text.splitlines() if not ln.startswith("hook = ")]
    at = lines.index("[targets.local.service]") + 1
    lines.insert(at, f"hook = '{value}'")
    ops.inventory.write_text("\n".join(lines) + "\n")


def env_of(ops: Ops) -> dict[str, str]:
    text = (ops.root / "current" / "service.env").read_text()
    return dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln and ln[0] != "#")


def test_the_hook_setting_rides_with_the_release(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    assert env_of(ops)["DDTREE_OPS_SGLANG"] == "off"  # no components, no setting
    first = ops.current()
    set_hook(ops, "shadow:tree_build=cpp/8")
    res = ops.deploy()
    assert res.returncode == 0, res.stdout + res.stderr
    assert ops.current() != first  # the same commit, another setting: a new release
    assert env_of(ops)["DDTREE_OPS_SGLANG"] == "shadow:tree_build=cpp/8"
    set_hook(ops, "measure")
    assert ops.deploy().returncode == 0 and env_of(ops)["DDTREE_OPS_SGLANG"] == "measure"


@pytest.mark.parametrize("bad", ["shadow", "shadow:tree_build", "measure; rm -rf /", "x=y/0"])
def test_a_malformed_hook_setting_is_one_line(ops: Ops, bad: str) -> None:
    set_hook(ops, bad)
    res = ops("hosts")
    assert res.returncode == 2 and "hook" in res.stderr and "shadow:COMPONENT=KIND" in res.stderr
    assert "Traceback" not in res.stderr
