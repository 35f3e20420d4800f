"""The user's pages stay true to the code: docs/commands.md is exactly what
`python -m ops.cli.reference` prints (at any terminal width), every GO / NO-GO / HOLD reason
code that ops.verdict.decide's docstring lists is explained in docs/concepts.md under its
verdict, every inventory field is in docs/inventory.md, and every relative link in README.md
and docs/*.md points to a file that exists."""

from __future__ import annotations

import ast
import difflib
import os
import re
import subprocess
import sys

import pytest
from helpers import REPO

DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


def test_commands_md_is_the_generators_output() -> None:
    from ops.cli.reference import REGENERATE

    res = subprocess.run(
        [sys.executable, "-m", "ops.cli.reference"],
        capture_output=True,
        text=True,
        cwd=REPO,
        # a narrow terminal and no inventory: neither may change a byte
        env={**os.environ, "COLUMNS": "37", "OPS_INVENTORY": "/nonexistent/ops.toml"},
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    committed = (DOCS / "commands.md").read_text(encoding="utf-8")
    if committed != res.stdout:
        diff = "".join(
            difflib.unified_diff(
                committed.splitlines(keepends=True),
                res.stdout.splitlines(keepends=True),
                "docs/commands.md (committed)",
                "python -m ops.cli.reference",
                n=1,
            )
        )
        pytest.fail(
            f"docs/commands.md is stale: the CLI changed. Regenerate it from the project root "
            f"with `{REGENERATE}` and commit it.\n{diff[:4000]}"
        )


def test_the_reference_names_every_command_and_option() -> None:
    import typer

    from ops.cli import app
    from ops.cli.reference import render

    text = render()
    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="ops")
    seen = 0
    for name in root.list_commands(ctx):
        cmd = root.get_command(ctx, name)
        subs = getattr(cmd, "commands", {}) or {}
        for path, c in [((name,), cmd)] + [((name, s), sc) for s, sc in subs.items()]:
            assert f"ops {' '.join(path)}\n" in text, path
            for p in c.params:
                for opt in p.opts if p.param_type_name == "option" else []:
                    assert f"`{opt}" in text or f", {opt}" in text, (path, opt)
            seen += 1
    assert seen >= 17  # 13 commands and the service group's 4


def _decide_codes() -> dict[str, list[str]]:
    """The reason codes ops.verdict.decide's docstring lists, by verdict ("NO-GO", "HOLD")."""
    doc = ast.get_docstring(ast.parse((REPO / "ops/verdict/decide.py").read_text("utf-8")))
    assert doc
    block = "\n".join(line for line in doc.splitlines() if line.startswith("    "))
    while re.search(r"\([^()]*\)", block):  # remarks in parentheses, innermost first
        block = re.sub(r"\([^()]*\)", "", block)
    parts = re.split(r"^\s*(NO-GO|HOLD)\s", block, flags=re.M)
    codes: dict[str, list[str]] = {}
    for verdict, text in zip(parts[1::2], parts[2::2], strict=True):
        codes[verdict] = [c.strip() for c in text.replace("\n", " ").split(",") if c.strip()]
    return codes


def test_every_reason_code_in_decide_is_explained_in_concepts() -> None:
    codes = _decide_codes()
    assert set(codes) == {"NO-GO", "HOLD"}, codes
    everything = [c for cs in codes.values() for c in cs]
    assert len(everything) >= 20 and all(re.fullmatch(r"[a-z][a-z_]*", c) for c in everything)
    text = (DOCS / "concepts.md").read_text(encoding="utf-8")
    sections = dict(
        (m.group(1), m.group(2))
        for m in re.finditer(r"^## (NO-GO|HOLD) reasons\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    )
    for verdict, cs in codes.items():
        section = sections.get(verdict, "")
        missing = [c for c in cs if not re.search(rf"^- `{c}`: \S", section, re.M)]
        assert not missing, (
            f"docs/concepts.md, '## {verdict} reasons', has no '- `code`: what to do' line for "
            f"{missing} (ops/verdict/decide.py's docstring lists them)"
        )


def test_every_inventory_field_is_in_inventory_md() -> None:
    from ops.hosts.inventory import Service, Target

    text = (DOCS / "inventory.md").read_text(encoding="utf-8")
    fields = [f for f in Target.model_fields if f != "name"] + list(Service.model_fields)
    missing = [f for f in fields if not re.search(rf"\b{f}\b", text)]
    assert not missing, f"docs/inventory.md does not mention the inventory fields {missing}"


_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _links(text: str) -> list[str]:
    """Inline link targets outside fenced code blocks and code spans."""
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return _LINK.findall(text)


def test_links_in_readme_and_docs_point_to_files_that_exist() -> None:
    broken = []
    for page in PAGES:
        for target in _links(page.read_text(encoding="utf-8")):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
                continue  # http:, mailto:, an anchor on the same page
            path = target.split("#", 1)[0].split("?", 1)[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_the_link_finder_finds_links() -> None:
    found = _links("see [a](docs/a.md#x), `[b](no.md)`, [c](https://x.y)\n```\n[d](e.md)\n```\n")
    assert found == ["docs/a.md#x", "https://x.y"]
    readme = _links((REPO / "README.md").read_text(encoding="utf-8"))
    assert any(t.startswith("docs/") for t in readme)


def test_readme_keeps_the_quickstart_and_stays_short() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    ci = (REPO / ".ci/run").read_text(encoding="utf-8")
    assert "python3 -m pytest -n 2 --dist loadfile" in ci
    assert "\npython3 -m pytest -n 2 --dist loadfile\n" in text  # the command .ci/run runs
    assert "\nops service start local && ops rollout local\n" in text
    assert len(text.splitlines()) <= 160
    assert max(len(line) for line in text.splitlines()) <= 120
