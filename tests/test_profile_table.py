"""`ops profile`'s table at any terminal width: no number is ever split over two lines, and a
stage inside another (attention inside verify) is shown as part of it, not beside it (#39).

The printer runs in a real `ops` process per width (COLUMNS), on committed profile records."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "records"
PRINT = (
    "import json, sys; from ops.cli.measure import _print_profile; "
    "from ops.sections.profile import ProfileSection as P; "
    "_print_profile(P.model_validate(json.load(open(sys.argv[1]))['profile']))"
)


def render(record: Path, columns: int) -> str:
    env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1", "TERM": "dumb"}
    res = subprocess.run(
        [sys.executable, "-c", PRINT, str(record)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.parametrize("columns", [40, 60, 80, 120])
@pytest.mark.parametrize("name", ["profile_attn_wall", "profile_tree", "profile_attn_wide"])
def test_no_number_is_split_at_any_width(name: str, columns: int) -> None:
    record = FIXTURES / name / "record.json"
    text = render(record, columns)
    lines = text.splitlines()
    for lv in json.loads(record.read_text())["profile"]["levels"]:
        step = lv["step_ms"]["value"]
        assert any(f"step={step:.2f}ms" in ln for ln in lines), text
        for stage, v in lv["stage_ms"].items():
            want = [f"{v['value']:.3g}", f"{v['value'] / step:.1%}"]
            row = [ln for ln in lines if re.search(rf"(^|\s){stage}(\s|$)", ln)]
            assert any(all(w in ln for w in want) for ln in row), (stage, want, text)
    for ln in lines:  # no cell broken: a line never starts with a digit fragment or "%"
        assert not re.match(r"^\s*%", ln), text


def test_attention_is_shown_inside_verify() -> None:
    text = render(FIXTURES / "profile_attn_wall" / "record.json", 80)
    lines = text.splitlines()
    verify = next(i for i, ln in enumerate(lines) if re.match(r"\s*verify\s", ln))
    assert re.match(r"^\s{2,}attention\s", lines[verify + 1]), text  # indented under verify
    assert "attention is part of verify" in text, text


def test_a_level_above_the_services_batch_cap_says_so(tmp_path: Path) -> None:
    """`local`'s c=32 runs at batch 8 (the tiny preset's cap): the level line says it is capped,
    a level at or below the cap says nothing (#39 item 6)."""
    doc = json.loads((FIXTURES / "profile_tree" / "record.json").read_text())
    doc["profile"]["service"]["engine"] = {"max_batch_size": 8}
    for lv in doc["profile"]["levels"]:
        lv["batch"] = min(lv["concurrency"], 8)
    record = tmp_path / "record.json"
    record.write_text(json.dumps(doc))
    lines = render(record, 80).splitlines()
    capped = [ln for ln in lines if ln.startswith("c=32 ")]
    assert capped and "capped: the service batches at most 8" in capped[0], lines
    assert not any("capped" in ln for ln in lines if ln.startswith(("c=1 ", "c=8 "))), lines


def test_the_report_says_when_the_target_level_ran_at_the_batch_cap(tmp_path: Path) -> None:
    """The verdict's target concurrency above the service's batch cap says which batch that
    level really ran at (#39 item 6: `local` at c=32 runs batch 8)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "rollout_attn", run)
    prof = run / "03-profile" / "record.json"
    doc = json.loads(prof.read_text())
    top = max(lv["concurrency"] for lv in doc["profile"]["levels"])
    cap = max(1, top // 4)
    doc["profile"].setdefault("service", {})["engine"] = {"max_batch_size": cap}
    prof.write_text(json.dumps(doc))
    res = subprocess.run(
        [sys.executable, "-m", "ops", "report", str(run), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode in (0, 1, 3), res.stderr
    md = (tmp_path / "out" / "report.md").read_text()
    assert f"the service batches at most {cap}: this level ran at batch {cap}" in md, md[:400]
