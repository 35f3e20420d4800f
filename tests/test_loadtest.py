"""`ops loadtest` through the real CLI against real HTTP services started by the process manager."""

from __future__ import annotations

import pytest
from helpers.local import Ops


@pytest.fixture
def ops(tmp_path):
    o = Ops(tmp_path)
    yield o
    o.stop()


def test_sweep_reports_every_level(ops: Ops) -> None:
    ops.configure()
    assert ops.json("service", "start", "local")[0] == 0
    code, rep = ops.json(
        "loadtest",
        "local",
        "-c",
        "1,4",
        "--requests",
        "12",
        "--output-len",
        "8",
        "--input-len",
        "16",
    )
    assert code == 0, rep
    assert [lv["concurrency"] for lv in rep["levels"]] == [1, 4]
    for lv in rep["levels"]:
        assert (lv["completed"], lv["failed"], lv["output_tokens"]) == (12, 0, 96)
        assert lv["request_per_s"] > 0 and lv["output_tok_per_s"] > 0
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            assert lv[key]["p50"] is not None and lv[key]["p50"] <= lv[key]["p99"]
        assert lv["ttft_ms"]["p50"] <= lv["e2e_ms"]["p50"]
        assert lv["accept_length"] == {"value": None, "source": "not reported by the service"}
    assert rep["settings"]["ignore_eos"] is True


def test_failing_service_is_exit_1_with_errors(ops: Ops) -> None:
    ops.configure(mode="500")
    ops("service", "start", "local", "--wait", "2")
    code, rep = ops.json("loadtest", "local", "-c", "2", "--requests", "4")
    assert code == 1
    # the service's own words ride along with the status (#39 item 4: a cause never lost)
    assert rep["levels"][0]["failed"] == 4
    assert rep["levels"][0]["errors"] == {"HTTP 500: internal error": 4}
    res = ops("loadtest", "local", "-c", "2", "--requests", "4")
    assert "c=2: 4 x HTTP 500: internal error" in " ".join(res.stderr.split()), res.stderr


def test_hung_service_times_out(ops: Ops) -> None:
    ops.configure(mode="hang")
    assert ops.json("service", "start", "local")[0] == 0
    code, rep = ops.json("loadtest", "local", "-c", "2", "--requests", "2", "--timeout", "1")
    assert code == 1 and rep["levels"][0]["errors"] == {"timeout after 1s": 2}


def test_bad_levels_exit_2(ops: Ops) -> None:
    ops.configure()
    for bad in ("0", "1,x", ""):
        res = ops("loadtest", "local", "-c", bad)
        assert res.returncode == 2 and "Traceback" not in res.stderr


def test_a_service_that_does_not_answer_is_one_line_and_no_level(ops: Ops) -> None:
    """Nothing serves on the port: one line that says so, exit 1, no level run (each would
    otherwise wait out its requests), in text mode and with --json (the document says why)."""
    ops.configure()  # not started
    res = ops("loadtest", "local", "-c", "1,4", "--requests", "2")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "did not answer (connection refused); no level was run. Is it running?" in (
        res.stderr
    ), res.stderr
    assert "out tok/s" not in res.stdout  # no empty tables
    code, rep = ops.json("loadtest", "local", "-c", "1,4", "--requests", "2")
    assert code == 1 and rep["ok"] is False
    assert rep["service_down"] == "connection refused" and rep["levels"] == []
    assert rep["planned"] == [1, 4]
