"""A host python older than the data plane needs is said in one line (probe37c C6).

The target's `python` is a stand-in that says it is 3.8.18 (or 2.7.18) and fails every real
command as such a python does (a TypeError traceback, a SyntaxError). `ops healthcheck` and
`ops deploy` used to print the host's traceback; now one line names the interpreter, its
version and the 3.10 the data plane needs, and the hint names the inventory's `python`;
`ops facts` warns of it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.deploy_ops import Ops, one_error_line
from helpers.local import end_services

FAILS = {
    "3.8.18": "Traceback (most recent call last):\n"
    '  File "checks/identity.py", line 80, in <module>\n'
    "TypeError: zip() takes no keyword arguments",
    "2.7.18": '  File "<string>", line 1\n    from __future__ import annotations\n'
    "SyntaxError: future feature annotations is not defined",
}


def fake_python(tmp: Path, version: str) -> Path:
    py = tmp / f"python{version}"
    py.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *version_info*) printf %s {version}; exit 0;; esac\n'
        f'[ "$*" = --version ] && {{ echo "Python {version}" >&2; exit 0; }}\n'
        f"cat >&2 <<'X'\n{FAILS[version]}\nX\n"
        "exit 1\n"
    )
    py.chmod(0o755)
    return py


@pytest.fixture
def ops(tmp_path: Path):
    o = Ops(tmp_path)
    yield o
    end_services(o.root)


def _use_python(ops: Ops, py: Path) -> None:
    text = ops.inventory.read_text()
    ops.inventory.write_text(
        text.replace("[targets.local]\n", f"[targets.local]\npython = '{py}'\n", 1)
    )


@pytest.mark.parametrize("version", ["3.8.18", "2.7.18"])
def test_an_old_host_python_is_one_line_naming_it(ops: Ops, tmp_path: Path, version: str) -> None:
    py = fake_python(tmp_path, version)
    _use_python(ops, py)
    res = ops("healthcheck", "local")
    line = one_error_line(res)
    assert str(py) in line and f"Python {version}" in line and "3.10" in line, line
    assert "zip()" not in res.stderr and "SyntaxError" not in res.stderr
    assert "`python` under [targets.local]" in res.stderr

    res = ops.deploy("--bootstrap")
    line = one_error_line(res)
    assert str(py) in line and f"Python {version}" in line, line
    assert ops.current() is None

    res = ops("facts", "local")
    said = " ".join(res.stderr.split())  # (wrapped at 80 columns where the path is long)
    assert f"is {version}" in said and "3.10+" in said, res.stderr


def test_a_good_host_python_gets_no_warning(ops: Ops) -> None:
    res = ops("facts", "local")
    assert res.returncode == 0 and "data plane needs" not in res.stderr, res.stderr
