"""A golden set the releases that passed against it no longer match is blamed, not the release
being deployed (probe37bf M2: one token of the set edited by hand; the pre-flight named
`--force`, the forced deploy marked a good release rejected, and the `ops rollback` it named
failed the same way twice more).

- A set edited by hand after it was recorded no longer matches its digest: it is damaged, and
  the pre-flight names re-recording it, as for any damaged set.
- A set whole by its digest that a proven release now answers differently (recorded from
  another model, or the model's files changed under the service): the pre-flight names the
  golden set and its re-recording, not --force; a forced deploy whose release and the proven
  one gone back to differ from it the same way says the golden set is the likely cause, does
  not name `ops rollback`, and leaves the new release unrejected.

Real processes: the `ops` CLI, the host-side scripts, the stand-in service of
tests/helpers/deploy_ops.py on its own root and port.
"""

from __future__ import annotations

import json
import py_compile
import shutil
import sys
import time

import pytest
from helpers.deploy import commit_change
from helpers.deploy_ops import Ops, steps

from checks.identity import digest


def flat(text: str) -> str:
    return " ".join(text.split())


def rejected(ops: Ops) -> dict[str, object]:
    code, doc = ops.json("releases", "local")
    assert code == 0, doc
    return {r["id"]: r["rejected"] for r in doc["releases"]}


def test_a_golden_set_edited_by_hand_is_damaged_not_a_verdict(ops: Ops) -> None:
    r1, r2 = ops.two_releases()
    golden = ops.root / "golden" / "golden.json"
    doc = json.loads(golden.read_text())
    doc["prompts"][0]["token_ids"] = [1, 2, 3]  # the tester's edit
    golden.write_text(json.dumps(doc))
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')

    res = ops.deploy()
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 1 and ops.current() == r2, said
    assert "the golden set on the host is damaged" in said, said
    assert "its prompts were changed after it was recorded" in said, said

    res = ops.deploy("--force")  # judged by nothing: deployed, said NOT CHECKED, not proven
    said = flat(res.stdout + res.stderr)
    r3 = ops.current()
    assert res.returncode == 0 and r3 not in (r1, r2), said
    assert "token identity NOT CHECKED" in said, said
    assert all(why is None for why in rejected(ops).values())


def test_a_golden_set_no_proven_release_matches_is_blamed_not_the_release(ops: Ops) -> None:
    r1, r2 = ops.two_releases()
    golden = ops.root / "golden" / "golden.json"
    doc = json.loads(golden.read_text())
    for prompt in doc["prompts"][:2]:  # as if recorded from another model: whole by its digest
        prompt["token_ids"] = [t + 1 for t in prompt["token_ids"]]
    doc["digest"] = digest(doc["prompts"])
    golden.write_text(json.dumps(doc))
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')

    res = ops.deploy()
    pre = {s["name"]: s for s in ops.record("deploy")["results"][0]["steps"]}["preflight"]
    assert res.returncode == 1 and pre["status"] == "fail", flat(res.stderr)
    blamed = f"current ({r2}) passed a post-flight before and now fails token identity alone"
    assert blamed in pre["detail"], pre
    assert "--record-golden" in pre["detail"] and "--force" not in pre["detail"], pre

    res = ops.deploy("--force")
    result = ops.record("deploy")["results"][0]
    msg = flat(result["message"])
    r3 = result["release"]
    assert res.returncode == 1 and steps(result)["postflight"] == "fail", msg
    assert f"{r2}, which passed a post-flight before, now differs from the golden set" in msg, msg
    assert "on the same 2 prompts the same way as" in msg, msg
    assert (
        f"the golden set is the likely cause (edited, or recorded from another model), not {r3}"
        in msg
    )
    assert f"{r3} was not marked rejected for it" in msg and "ops rollback local" not in msg, msg
    assert rejected(ops)[r3] is None and ops.current() == r2 and ops.serving() == r2

    # the way it names: re-record from the service as it answers, then deploy
    code, rec = ops.json("healthcheck", "local", "--record-golden", "--max-tokens", "3")
    assert code == 0, rec
    res = ops.deploy()
    assert res.returncode == 0 and ops.current() not in (r1, r2), flat(res.stdout + res.stderr)


@pytest.mark.parametrize("edit", ["source", "bytecode"])
def test_no_golden_set_is_recorded_from_code_edited_since_it_was_installed(
    ops: Ops, edit: str
) -> None:
    """probe37bi H1 (high): current's code edited by hand and the service restarted on it:
    `--record-golden` (and a pre-flight with no golden set) recorded the edit's tokens, and
    the next correct release failed identity and was marked rejected. Refused, naming the
    files, until they are as installed. probe37bj H1 (high): the same through a .pyc put in a
    release's `__pycache__` (Python runs it in place of its unchanged source), which was
    never looked at: nothing ops starts writes bytecode into a release."""
    r1, r2 = ops.two_releases()
    time.sleep(2.5)  # (an edit is one made a while after the install: ctimes are coarse)
    code = ops.root / "releases" / r2 / "engine" / "svc.py"
    installed = code.read_text()
    cache = code.parent / "__pycache__"
    if edit == "source":
        code.write_text(installed + "# edited by hand\n")
        named = "engine/svc.py"
    else:
        cache.mkdir()
        tag = sys.implementation.cache_tag
        py_compile.compile(str(code), cfile=str(cache / f"svc.{tag}.pyc"), doraise=True)
        named = f"engine/__pycache__/svc.{tag}.pyc (added)"
    assert ops("service", "restart", "local").returncode == 0
    code_, doc = ops.json("releases", "local")
    edited = {r["id"]: r["code_edited"] for r in doc["releases"]}
    assert edited == {r1: [], r2: [named]}, edited
    golden = ops.root / "golden" / "golden.json"
    golden.unlink()
    code_, doc = ops.json("healthcheck", "local", "--record-golden", "--max-tokens", "3")
    assert code_ == 2 and "files were changed since it was installed" in doc["message"], doc
    assert named in doc["message"] and not golden.exists(), doc
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    res = ops.deploy()
    pre = {s["name"]: s for s in ops.record("deploy")["results"][0]["steps"]}["preflight"]
    assert res.returncode == 1 and pre["status"] == "fail", flat(res.stderr)
    assert f"files were changed since it was installed (by hand?): {named}" in pre["detail"], pre
    assert not golden.exists() and ops.current() == r2
    code.write_text(installed)  # as installed again: recorded
    shutil.rmtree(cache, ignore_errors=True)
    code_, doc = ops.json("healthcheck", "local", "--record-golden", "--max-tokens", "3")
    assert code_ == 0 and golden.exists(), doc
