"""Rollout playbooks: the shipped ones are valid; a bad playbook or `--set` is one line naming the
step and the field (PlaybookError, exit 2 through the real CLI) before anything runs: `true` is no
number (measure.cycles and repeats, change.shape, bench.probe_interval), measure.cycles needs
the after phase with recheck, and load.run_seconds a profile step before the measure."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers.cli import run_ops

from ops.rollout.playbook import DeployStep, HealthcheckStep, PlaybookError
from ops.rollout.playbook_load import PLAYBOOKS, load_playbook

BASE = """\
change: {component: tree_build, baseline: reference, candidate: cuda}
steps:
"""


def write(tmp: Path, steps: str, head: str = BASE) -> str:
    path = tmp / "pb.yaml"
    path.write_text(head + steps)
    return str(path)


def fails(name: str, sets: list[str] | None = None) -> PlaybookError:
    with pytest.raises(PlaybookError) as info:
        load_playbook(name, sets)
    assert "\n" not in info.value.message
    return info.value


def test_shipped_playbooks_are_valid() -> None:
    assert sorted(p.stem for p in PLAYBOOKS.glob("*.yaml")) == [
        "bench-only",
        "healthcheck-only",
        "rollout",
        "rollout-attention",
    ]
    pb = load_playbook(None)
    assert pb.path.endswith("playbooks/rollout.yaml") and pb.change is not None
    assert pb.change.label == "tree_build: reference -> cuda" and pb.threshold == 0.03
    steps = [(s.name, s.step, s.when) for s in pb.step_list()]
    assert steps == [
        ("preflight", "healthcheck", "always"),
        ("bench", "bench", "always"),
        ("profile", "profile", "always"),
        ("decide", "decide", "always"),
        ("baseline", "measure", "go"),
        ("deploy", "deploy", "go"),
        ("postflight", "healthcheck", "deployed"),
        ("measure", "measure", "deployed"),
        ("report", "report", "always"),
    ]
    roles = [s.role for s in pb.step_list() if isinstance(s, HealthcheckStep)]
    assert roles == ["preflight", "postflight"]
    assert [s.step for s in load_playbook("bench-only").step_list()] == [
        "healthcheck",
        "bench",
        "healthcheck",
    ]
    only = load_playbook("healthcheck-only")
    assert only.change is None and [s.step for s in only.step_list()] == ["healthcheck"]


def test_set_overrides_values_of_the_playbook_and_of_steps() -> None:
    pb = load_playbook(
        None,
        [
            "change.component=attention",
            "change.baseline=torch",
            "change.shape.budget=16",
            "load.concurrency=1,4",
            "load.input_len=2048",
            "threshold=0.05",
            "deploy.allow_dirty=true",
            "bench.gpu=3",
            "measure.repeats=3",
        ],
    )
    assert pb.change is not None and pb.change.label == "attention: torch -> cuda"
    assert pb.change.shape == {"budget": 16} and pb.change.to_change().bench_map()[0] == "attn"
    assert pb.load.concurrency == [1, 4] and pb.load.input_len == 2048 and pb.threshold == 0.05
    by = {s.name: s for s in pb.step_list()}
    assert isinstance(by["deploy"], DeployStep) and by["deploy"].allow_dirty is True
    assert by["bench"].gpu == 3 and by["measure"].repeats == 3  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("steps", "step", "field", "words"),
    [
        (
            "  - {step: healthcheck, name: preflight}\n  - {step: benchh}\n",
            "benchh",
            "step",
            "step 2 'benchh': step: unknown step 'benchh'",
        ),
        ("  - {name: x}\n", "x", "step", "step 1 'x': step: missing"),
        (
            "  - {step: decide}\n  - {step: deploy, when: sometimes}\n",
            "deploy",
            "when",
            "step 2 'deploy': when: Input should be 'always', 'go' or 'deployed'",
        ),
        (
            "  - {step: deploy, when: go}\n",
            "deploy",
            "when",
            "'go' needs a decide step before this one",
        ),
        (
            "  - {step: healthcheck, name: postflight, when: deployed}\n",
            "postflight",
            "when",
            "'deployed' needs a deploy step",
        ),
        ("  - {step: bench, gpu: -1}\n", "bench", "gpu", "greater than or equal to 0 (got -1)"),
        ("  - {step: bench, suites: [tree, warp]}\n", "bench", "suites.1", "(got 'warp')"),
        ("  - {step: measure}\n", "measure", "phase", "step 1 'measure': phase: Field required"),
        ("  - {step: measure, phase: after}\n", "measure", "phase", "'before' earlier"),
        (
            "  - {step: measure, phase: before, recheck: true}\n",
            "measure",
            "recheck",
            "only a measure step of phase 'after' can recheck",
        ),
        (
            "  - {step: measure, phase: before}\n  - {step: measure, name: m2, phase: after, "
            "cycles: 3}\n",
            "m2",
            "cycles",
            "it needs recheck: true",
        ),
        (
            "  - {step: measure, phase: before}\n  - {step: measure, name: m2, phase: after, "
            "recheck: true, cycles: 11}\n",
            "m2",
            "cycles",
            "less than or equal to 10",
        ),
        (
            "  - {step: measure, phase: before}\n  - {step: measure, name: m2, phase: after, "
            "precision: 0.03, max_cycles: 4}\n",
            "m2",
            "precision",
            "it needs recheck: true",
        ),
        (
            "  - {step: measure, phase: before}\n  - {step: measure, name: m2, phase: after, "
            "recheck: true, precision: 0.03}\n",
            "m2",
            "max_cycles",
            "precision needs max_cycles",
        ),
        (
            "  - {step: measure, phase: before}\n  - {step: measure, name: m2, phase: after, "
            "recheck: true, max_cycles: 4}\n",
            "m2",
            "max_cycles",
            "set precision",
        ),
        (
            "  - {step: measure, phase: before}\n  - {step: measure, name: m2, phase: after, "
            "recheck: true, cycles: 3, precision: 0.03, max_cycles: 2}\n",
            "m2",
            "max_cycles",
            "2 is below cycles (3)",
        ),
        (
            "  - {step: measure, phase: before}\n  - {step: measure, name: m2, phase: after, "
            "recheck: true, precision: 1, max_cycles: 4}\n",
            "m2",
            "precision",
            "less than 1",
        ),
        (
            "  - {step: measure, phase: before}\n  - {step: measure, name: m2, phase: after, "
            "recheck: true, precision: .nan, max_cycles: 4}\n",
            "m2",
            "precision",
            "a finite number",
        ),
        (
            "  - {step: measure, phase: before}\n  - {step: measure, name: m2, phase: after, "
            "recheck: true, precision: 0.03, max_cycles: 51}\n",
            "m2",
            "max_cycles",
            "less than or equal to 50",
        ),
        ("  - {step: report}\n  - {step: bench}\n", "report", "step", "must be the last step"),
        ("  - {step: bench}\n  - {step: bench}\n", "bench", "name", "used by step 1"),
        (
            "  - {step: healthcheck, name: check1}\n",
            "check1",
            "role",
            "step 1 'check1': role: a healthcheck step needs role: preflight | postflight, "
            "or a name containing 'preflight' or 'postflight'",
        ),
        ("  - {step: deploy, colour: red}\n", "deploy", "colour", "unknown field"),
        ("  - {step: profile, budget: many}\n", "profile", "budget", "valid integer"),
    ],
)
def test_bad_steps_name_the_step_and_the_field(
    tmp_path: Path, steps: str, step: str, field: str, words: str
) -> None:
    e = fails(write(tmp_path, steps))
    assert (e.step, e.field) == (step, field)
    assert words in e.message and str(tmp_path / "pb.yaml") in e.message


PRE = "steps:\n  - {step: healthcheck, name: preflight}\n"


@pytest.mark.parametrize(
    ("doc", "field", "words"),
    [
        (
            "change: {component: tree_build, baseline: reference, candidate: cuda}\n"
            "threshold: 3\n" + PRE,
            "threshold",
            "less than 1 (got 3)",
        ),
        (
            "change: {component: attention, baseline: reference, candidate: cuda}\n" + PRE,
            "change",
            "attention has no backend 'reference' (torch | cuda)",
        ),
        (
            "change: {component: accept, baseline: cpp, candidate: cpp}\n" + PRE,
            "change",
            "the same as the baseline",
        ),
        (
            "change: {component: warp, baseline: cpp, candidate: cuda}\n" + PRE,
            "change.component",
            "(got 'warp')",
        ),
        ("load: {concurrency: [0]}\n" + PRE, "load.concurrency.0", "greater than or equal to 1"),
        (
            "load: {concurrency: [1, 8]}\ntarget_concurrency: 4\n" + PRE,
            "target_concurrency",
            "4 is not one of load.concurrency (1, 8): only those are profiled",
        ),
        ("steps:\n  - {step: deploy}\n", "change", "needs the playbook's `change`"),
        ("steps: []\n", "steps", "at least 1 item"),
    ],
)
def test_bad_playbook_values(tmp_path: Path, doc: str, field: str, words: str) -> None:
    e = fails(write(tmp_path, "", doc))
    assert e.field == field and words in e.message


def test_bad_documents(tmp_path: Path) -> None:
    assert "not YAML at line" in fails(write(tmp_path, "  - [unclosed\n")).message
    undefined = fails(write(tmp_path, "", "a1: [*a0, *a0]\n")).message
    assert undefined.endswith("not YAML at line 1: found undefined alias 'a0'")
    tag = fails(write(tmp_path, "", "!!python/object/apply:os.system [true]\n")).message
    assert "a YAML tag a playbook may not use at line 1" in tag and "python/object" in tag
    assert "mapping with `steps`" in fails(write(tmp_path, "", "- 1\n")).message
    assert "steps: Field required" in fails(write(tmp_path, "", "name: x\n")).message
    e = fails(str(tmp_path / "missing.yaml"))
    assert e.field == "--playbook" and "rollout" in e.message


@pytest.mark.parametrize(
    ("sets", "step", "field", "words"),
    [
        (["foo"], None, "foo", "expected KEY=VALUE"),
        (["=1"], None, "=1", "expected KEY=VALUE"),
        (["benhc.gpu=1"], None, "benhc.gpu=1", "no playbook field or step 'benhc'"),
        (["bench=1"], "bench", "bench=1", "takes STEP.FIELD"),
        (["deploy.step=bench"], "deploy", "deploy.step=bench", "the playbook's to say"),
        (["bench.gpux=1"], "bench", "gpux", "step 2 'bench': gpux: unknown field (from --set)"),
        (["bench.gpu=minus"], "bench", "gpu", "valid integer"),
        (["deploy.when=later"], "deploy", "when", "(got 'later') (from --set)"),
        (["change.candidate=rocm"], None, "change", "no backend 'rocm'"),
        (["load.concurrency=1,x"], None, "load.concurrency", "integers like 1,8,32"),
        (["threshold.x=1"], None, "threshold.x=1", "threshold is not a table"),
        (
            ["target_concurrency=7"],
            None,
            "target_concurrency",
            "7 is not one of load.concurrency (1, 8, 32): only those are profiled (from --set)",
        ),
        (
            ["target_concurrency=8", "load.concurrency=1,4"],
            None,
            "target_concurrency",
            "8 is not one of load.concurrency (1, 4)",
        ),
    ],
)
def test_bad_set_names_the_step_and_the_field(
    sets: list[str], step: str | None, field: str, words: str
) -> None:
    e = fails(None, sets)
    assert (e.step, e.field) == (step, field)
    assert words in e.message


@pytest.mark.parametrize(
    ("setting", "step", "field"),
    [
        ("threshold=true", None, "threshold"),
        ("load.requests=true", None, "load.requests"),
        ("load.concurrency=[true]", None, "load.concurrency"),
        ("load.run_seconds=false", None, "load.run_seconds"),
        ("bench.gpu=true", "bench", "gpu"),
        ("bench.probe_threshold=true", "bench", "probe_threshold"),
        ("preflight.aa_runs=true", "preflight", "aa_runs"),
        ("deploy.keep=true", "deploy", "keep"),
        ("profile.budget=true", "profile", "budget"),
    ],
)
def test_true_is_not_a_number_in_any_number_field(setting: str, step: str | None, field: str):
    """YAML's true/false in a number field is a mistake, named with its step and field, in every
    number field of a playbook (it used to be taken as 1 wherever no field said otherwise);
    a bool field still takes it."""
    e = fails(None, [setting])
    assert (e.step, e.field) == (step, field) and "not true/false" in e.message
    assert load_playbook("rollout", ["bench.allow_shared=true"])


def run_cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPS_RUNS_DIR": str(tmp / "runs")}
    return run_ops("rollout", *args, env=env, timeout=60)


def test_cli_refuses_before_anything_runs(tmp_path: Path) -> None:
    bad = write(tmp_path, "  - {step: decide}\n  - {step: deploy, when: sometimes}\n")
    res = run_cli(tmp_path, "local", "--playbook", bad)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "step 2 'deploy': when:" in res.stderr and res.stderr.count("error:") == 1
    res = run_cli(tmp_path, "local", "--set", "target_concurrency=7")
    assert res.returncode == 2 and res.stderr.count("error:") == 1, res.stderr
    assert "target_concurrency: 7 is not one of load.concurrency (1, 8, 32)" in res.stderr
    assert load_playbook(None, ["target_concurrency=8"]).target_concurrency == 8
    res = run_cli(tmp_path, "local", "--set", "bench.gpux=1", "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 2 and (doc["step"], doc["field"]) == ("bench", "gpux")
    # the change must start from what the inventory says the service runs
    inv = tmp_path / "ops.toml"
    inv.write_text(
        f"[targets.local]\nremote_root = '{tmp_path / 'root'}'\n"
        "[targets.local.service.components]\ntree_build = 'cpp'\n"
    )
    res = run_cli(tmp_path, "local", "--inventory", str(inv))
    assert res.returncode == 2 and "change.baseline: 'reference'" in res.stderr
    assert "runs tree_build = 'cpp'" in res.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "root").exists()


def test_an_integer_too_long_to_read_is_one_line(tmp_path: Path) -> None:
    """probe37az M2's kin: a playbook (or a --set) holding an integer of 5000 digits (past the
    4300 Python converts) was an internal error, exit 4: one line, exit 2, naming the file."""
    big = "9" * 5000
    bad = write(tmp_path, f"  - {{step: bench, gpu: {big}}}\n")
    res = run_cli(tmp_path, "local", "--playbook", bad)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stderr.count("error:") == 1 and "(4300 digits)" in res.stderr, res.stderr[-2000:]
    res = run_cli(tmp_path, "local", "--set", f"bench.gpu={big}")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stderr.count("error:") == 1 and "bench" in res.stderr, res.stderr[-2000:]
    assert not (tmp_path / "runs").exists()


def _measure(tmp: Path, after: str, before: str = "") -> PlaybookError:
    path = tmp / "pb.yaml"
    path.write_text(
        "change: {component: tree_build, baseline: reference, candidate: cuda}\nsteps:\n"
        "  - step: profile\n"
        f"  - step: measure\n    phase: before\n{before}"
        "  - step: deploy\n"
        f"  - step: measure\n    phase: after\n{after}"
        "  - step: report\n"
    )
    with pytest.raises(PlaybookError) as info:
        load_playbook(str(path))
    assert "\n" not in info.value.message
    return info.value


def test_measure_cycles_refuses_true_and_the_before_phase(tmp_path: Path) -> None:
    e = _measure(tmp_path, "    recheck: true\n    cycles: true\n")
    assert e.field == "cycles" and "not true/false" in e.message
    e = _measure(tmp_path, "", before="    cycles: 2\n")
    assert e.field == "cycles" and "phase 'after'" in e.message
    e = _measure(tmp_path, "    cycles: 2\n")
    assert e.field == "cycles" and "recheck: true" in e.message
    e = _measure(tmp_path, "    repeats: false\n")
    assert e.field == "repeats" and "not true/false" in e.message
    with pytest.raises(PlaybookError) as info:
        load_playbook("rollout", ["measure.recheck=true", "measure.cycles=true"])
    assert "not true/false" in info.value.message and "(from --set)" in info.value.message
    with pytest.raises(PlaybookError) as info:
        load_playbook("rollout", ["bench.probe_interval=true"])
    assert info.value.field == "probe_interval" and "not true/false" in info.value.message
    good = load_playbook("rollout", ["measure.recheck=true", "measure.cycles=2"])
    assert [s.cycles for s in good.steps if s.step == "measure"][-1] == 2


@pytest.mark.parametrize("value", ["true", "false"])
def test_change_shape_refuses_true_false_from_set(value: str) -> None:
    with pytest.raises(PlaybookError, match="shape.*takes a number, not true/false"):
        load_playbook("rollout-attention", [f"change.shape.B={value}"])


def test_change_shape_still_takes_numbers_and_strings() -> None:
    pb = load_playbook("rollout-attention", ["change.shape.B=8", "change.shape.dtype=fp32"])
    assert pb.change is not None
    assert pb.change.shape == {"T": 17, "L": 1024, "B": 8, "dtype": "fp32"}


def test_run_seconds_without_a_profile_step_is_a_playbook_error(tmp_path: Path) -> None:
    path = tmp_path / "pb.yaml"
    path.write_text(
        "change: {component: tree_build, baseline: reference, candidate: cuda}\n"
        "load: {run_seconds: 30}\n"
        "steps:\n"
        "  - {step: healthcheck, name: preflight}\n"
        "  - {step: decide}\n"
        "  - {step: measure, name: baseline, phase: before}\n"
        "  - {step: report}\n"
    )
    with pytest.raises(PlaybookError) as info:
        load_playbook(str(path))
    err = info.value
    assert err.field == "load.run_seconds" and err.step == "baseline"
    assert "no profile step comes before this one" in err.message
    assert "\n" not in err.message
    # the same playbook with a profile step first, or without run_seconds, is fine
    load_playbook(str(path), ["load.run_seconds=0"])
    text = path.read_text().replace("  - {step: decide}", "  - {step: profile}\n  - {step: decide}")
    path.write_text(text)
    assert load_playbook(str(path)).load.run_seconds == 30


def test_the_shipped_playbooks_take_run_seconds() -> None:
    for name in ("rollout", "rollout-attention"):
        assert load_playbook(name, ["load.run_seconds=20"]).load.run_seconds == 20
        # a run (and a sized profile window) is one loadtest call, which may last an hour
        with pytest.raises(PlaybookError) as info:
            load_playbook(name, ["load.run_seconds=1801"])
        assert info.value.field == "load.run_seconds", info.value
