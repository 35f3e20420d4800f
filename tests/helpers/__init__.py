"""What the tests share and are not tests themselves: a real sshd on loopback (`sshd`), a
misbehaving HTTP service (`fake_service`, also run as a script), a reference-engine process
(`engine_server`), the Python model of the level-synchronous tree build (`tree_levels_model`),
the one way tests run the `ops` CLI and the shape of a one-line user error (`cli`), the
release fixtures (`deploy`), and the real `ops deploy` on `local` with a stand-in release that
deploys in seconds (`deploy_ops`).

Test modules import it as `helpers.X` (pytest puts tests/ on sys.path, as for any test folder
without an `__init__.py`).
"""

from __future__ import annotations

from pathlib import Path

HELPERS = Path(__file__).resolve().parent
TESTS = HELPERS.parent
REPO = TESTS.parent
FAKE_SERVICE = HELPERS / "fake_service.py"  # run as a script: `python FAKE_SERVICE --port N`
