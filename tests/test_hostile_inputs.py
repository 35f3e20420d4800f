"""Hostile inputs to the real `ops` CLI (and the data-plane checks it runs on the host) are one
`error:` line and exit 2, never a hang, an unbounded read or raw HTML passed on:

- `deploy --allow-dirty` from a source whose `checks/` is a symlink to a directory outside it
  is refused (dry run and real deploy), and nothing of the outside directory reaches the host;
- a FIFO, `/dev/zero` or an oversized file given as the golden set (to `ops healthcheck` and to
  `checks.identity` on the host), the inventory, a playbook or a record for `ops report` is
  refused as "not a regular file" / over its size limit, before it is read (each run under a
  1 GiB address-space limit, so an unbounded read fails the test instead of the machine);
- a loadtest shape over the service's context length (the reference engine's 512 tokens) or,
  where the service reports none, over the hard cap, is refused before a prompt is made;
- a playbook number that is not finite (`timeout: .inf`, `--set load.timeout=.nan`) is refused
  naming the field, and a load shape over the loadtest's limits (`--set
  load.input_len=100000000000`) is refused at load, before any step runs;
- a golden set, an inventory or a `--set` value nested 200000 deep is "nested too deeply"
  (exit 2), not a RecursionError (exit 4, "internal error");
- record text like `<script>` or `<img onerror=...>` reaches report.md escaped.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FAKE_SERVICE
from helpers.cli import run_ops
from helpers.deploy import git
from helpers.local import Ops, end_services
from helpers.sshd import free_port

REPO = Path(__file__).resolve().parent.parent
RECORDS = REPO / "tests" / "fixtures" / "records"
MEM = 2**30  # address space of each hostile run: far above what ops needs, far below a runaway
SECRET = "SECRET: outside the repository, never to be shipped"
SELFTEST = 'import json\nprint(json.dumps({"ok": True, "gpu": "skipped: stand-in", "ops": []}))\n'


def limited(
    *args: str, env: dict[str, str], timeout: float = 60, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """`args` run with at most MEM bytes of address space (children inherit the limit): a read
    without end is a MemoryError there, not an OOM-killed test machine; `timeout` ends a hang."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEM, MEM))

    return subprocess.run(
        list(args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        preexec_fn=cap,
    )


def ops_limited(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`python -m ops ARGS` under `limited`."""
    return limited(sys.executable, "-m", "ops", *args, env=env, timeout=timeout)


def one_error(res: subprocess.CompletedProcess[str], *words: str) -> str:
    """Exit 2 and one `error:` line holding every word (and no traceback); the line."""
    assert res.returncode == 2, (res.returncode, res.stdout[-2000:], res.stderr[-2000:])
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, res.stderr
    for w in words:
        assert w in errors[0], (w, errors[0])
    return errors[0]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)  # nobody ever writes to it: a blocking open of it never returns
    return path


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {**os.environ, "OPS_RUNS_DIR": str(tmp_path / "runs"), "COLUMNS": "200"}
    e.pop("OPS_INVENTORY", None)
    return e


# -- 1. --allow-dirty never ships a file from outside the source tree --------------------------


def _source(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """A committed data-plane source (src), a root, a directory outside the source holding
    SECRET files named as the tracked checks/ files, and an inventory for `local` there."""
    src, root, outside = tmp_path / "src", tmp_path / "root", tmp_path / "outside"
    for d in ("engine", "kernels", "checks"):
        (src / d).mkdir(parents=True)
    shutil.copy2(FAKE_SERVICE, src / "engine" / "svc.py")
    (src / "engine" / "__main__.py").write_text("raise SystemExit('stand-in')\n")
    (src / "kernels" / "__init__.py").write_text("")
    (src / "kernels" / "selftest.py").write_text(SELFTEST)
    (src / "checks" / "__init__.py").write_text("")
    (src / "checks" / "health.py").write_text("OK = True\n")
    git(src, "init", "-q", "-b", "main")
    git(src, "add", "-A")
    git(src, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "first")
    outside.mkdir()  # the same names as the tracked files, so git lists them through the link
    for name in ("__init__.py", "health.py"):
        (outside / name).write_text(f"# {SECRET}\n")
    inv = tmp_path / "ops.toml"
    inv.write_text(
        "[targets.local]\n"
        f"remote_root = '{root}'\n"
        "[targets.local.service]\n"
        f"url = 'http://127.0.0.1:{free_port()}'\n"
        "command = '{python} engine/svc.py --port {port}'\n"
        "stop_timeout = 2\n"
    )
    return src, root, outside, inv


def _deploy(
    src: Path, inv: Path, env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess[str]:
    return run_ops(
        "deploy",
        "local",
        "--source",
        str(src),
        "--max-tokens",
        "3",
        *extra,
        inventory=inv,
        env=env,
        timeout=120,
    )


def test_allow_dirty_refuses_a_package_dir_symlinked_outside_the_repo(
    tmp_path: Path, env: dict[str, str]
) -> None:
    src, root, outside, inv = _source(tmp_path)
    shutil.rmtree(src / "checks")
    (src / "checks").symlink_to(outside, target_is_directory=True)
    try:
        for extra in (("--dry-run",), ("--bootstrap",)):  # --bootstrap: no pre-flight first
            res = _deploy(src, inv, env, "--allow-dirty", *extra)
            line = one_error(res, str(src.resolve() / "checks"), "symlink")
            assert str(outside.resolve()) in line  # says where the link points
            shipped = [p for p in root.rglob("*") if p.is_file() and SECRET in _text(p)]
            assert shipped == [], shipped
    finally:
        end_services(root)


@pytest.mark.parametrize("where", ["work-tree", "commit"])
def test_a_data_plane_file_that_is_a_symlink_is_refused_not_dropped(
    tmp_path: Path, env: dict[str, str], where: str
) -> None:
    """probe37t T10 (low): a tracked file replaced by a symlink to a file out of the repo was
    left out of the release in silence (`--allow-dirty`), as a committed symlink was: the
    release lacked a file its source has. Either is refused in one line naming the file."""
    src, root, outside, inv = _source(tmp_path)
    (src / "checks" / "health.py").unlink()
    (src / "checks" / "health.py").symlink_to(outside / "health.py")
    extra: tuple[str, ...] = ("--allow-dirty",)
    if where == "commit":
        git(src, "add", "-A")
        git(src, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "link")
        extra = ()
    try:
        for more in (("--dry-run",), ("--bootstrap",)):
            line = one_error(_deploy(src, inv, env, *extra, *more), "checks/health.py", "symlink")
            assert str(outside / "health.py") in line, line
            assert not (root / "releases").exists() or not any((root / "releases").iterdir())
    finally:
        end_services(root)


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


# -- 2. bounded reads: golden set, inventory, records --------------------------------------------


@pytest.fixture
def fake(tmp_path: Path):
    o = Ops(tmp_path)
    o.configure()
    assert o.json("service", "start", "local")[0] == 0
    yield o
    o.stop()


def test_golden_file_not_regular_too_big_or_too_deep_is_refused_before_reading(
    fake: Ops, fifo: Path
) -> None:
    big = fake.tmp / "big-golden.json"
    with big.open("wb") as f:
        f.truncate(17 * 2**20)  # sparse: 17 MiB of zeros, over the 16 MiB limit
    deep = fake.tmp / "deep-golden.json"
    deep.write_text("[" * 200000)  # was exit 4: RecursionError in json
    noise = fake.tmp / "noise-golden.json"  # random bytes: brackets by chance, no text at all
    noise.write_bytes(random.Random(37).randbytes(4 << 20))  # (probe37au L2: "nested too deeply")
    cases = (
        (str(noise), "not UTF-8 text"),
        ("/dev/zero", "not a regular file (a character device)"),
        (str(fifo), "not a regular file (a FIFO)"),
        (str(fake.tmp), "not a regular file (a directory)"),
        (str(big), "over the 16 MiB limit"),
        (str(deep), "nested too deeply"),
    )
    for path, why in cases:
        res = ops_limited(
            "healthcheck",
            "local",
            "--golden",
            path,
            "--inventory",
            str(fake.inventory),
            env=fake.env,
        )
        one_error(res, f"golden file {path}", why)


def test_identity_check_on_the_host_bounds_its_golden_file(tmp_path: Path, fifo: Path) -> None:
    """checks.identity (stdlib only, run on the host) refuses a golden path that is not a
    regular file before any request: its own bounded read."""
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: no request is made first
    for path, why in (("/dev/zero", "a character device"), (str(fifo), "a FIFO")):
        res = limited(
            sys.executable,
            "-m",
            "checks.identity",
            "--json",
            "--url",
            url,
            "--golden",
            path,
            env=dict(os.environ),
            timeout=30,
        )
        assert res.returncode == 2, (res.returncode, res.stdout[-500:], res.stderr[-1000:])
        doc = json.loads(res.stdout)
        assert doc["error"] == "bad_golden"
        assert doc["message"] == f"{path}: not a regular file ({why})"


def test_inventory_not_regular_or_too_big_is_refused(
    tmp_path: Path, env: dict[str, str], fifo: Path
) -> None:
    big = tmp_path / "big.toml"
    with big.open("wb") as f:
        f.truncate(5 * 2**20)
    cases = (
        ("/dev/zero", "not a regular file (a character device)"),
        (str(fifo), "not a regular file (a FIFO)"),
        (str(big), "over the 4 MiB limit"),
    )
    for path, why in cases:
        one_error(ops_limited("hosts", "--inventory", path, env=env), path, why)


def test_inventory_nested_too_deeply_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    """Deep TOML arrays and inline tables (tomllib recurses per level: was exit 4); brackets in
    strings and comments are no nesting."""
    cases = {
        "arrays.toml": "x = " + "[" * 50000 + "]" * 50000 + "\n",
        "tables.toml": "x = " + "{a = " * 20000 + "1" + "}" * 20000 + "\n",
        "unclosed.toml": "[targets.local]\nx = " + "[" * 200000 + "\n",
    }
    for name, text in cases.items():
        inv = tmp_path / name
        inv.write_text(text)
        one_error(
            ops_limited("hosts", "--inventory", str(inv), env=env), str(inv), "nested too deeply"
        )
    inv = local_inventory(tmp_path)
    brackets = "[" * 300
    inv.write_text(f"# {brackets}\n{inv.read_text()}model = '{brackets}'\n")  # the service's
    res = ops_limited("hosts", "--inventory", str(inv), env=env)
    assert res.returncode == 0, res.stderr


def test_report_record_not_regular_is_refused(
    tmp_path: Path, env: dict[str, str], fifo: Path
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "record.json")
    out = str(tmp_path / "out")
    cases = (
        ("/dev/zero", "/dev/zero", "a character device"),
        (str(run), str(run / "record.json"), "a FIFO"),
        (str(fifo), str(fifo), "a FIFO"),
    )
    for arg, named, kind in cases:
        res = ops_limited("report", arg, "--out", out, env=env)
        one_error(res, named, f"not a regular file ({kind})")


# -- 2. loadtest shapes are checked against the service's context length ------------------------


def test_loadtest_over_the_engines_context_length_is_refused(tmp_path: Path) -> None:
    """The reference engine (tiny preset: 512 tokens) says its context length in /v1/models: a
    shape over it is refused with that number, before a prompt is made (the old way: every
    request a 400, or a 100M-token prompt built next to the service)."""
    ops = Ops(tmp_path)
    ops.configure_service(None)  # the built-in reference-engine command
    try:
        assert ops.json("service", "start", "local", "--wait", "120")[0] == 0
        for n in ("600", "100000000"):
            res = ops_limited(
                "loadtest",
                "local",
                "-c",
                "1",
                "--requests",
                "1",
                "--input-len",
                n,
                "--output-len",
                "8",
                "--inventory",
                str(ops.inventory),
                env=ops.env,
            )
            one_error(res, f"--input-len {n}", "context length of 512 tokens", "/v1/models")
        code, rep = ops.json(
            "loadtest",
            "local",
            "-c",
            "1",
            "--requests",
            "2",
            "--input-len",
            "500",
            "--output-len",
            "12",
        )
        assert code == 0 and rep["levels"][0]["completed"] == 2, rep  # 512 exactly still runs
    finally:
        ops.stop()


def test_loadtest_where_the_service_reports_no_context_length_has_a_hard_cap(
    fake: Ops,
) -> None:
    res = ops_limited(
        "loadtest",
        "local",
        "-c",
        "1",
        "--requests",
        "1",
        "--input-len",
        "100000000",
        "--inventory",
        str(fake.inventory),
        env=fake.env,
    )
    one_error(res, "--input-len 100000000", "over 1048576 tokens", "reports no context length")


# -- 3., 4. playbooks: not a regular file; numbers that are not finite --------------------------


def local_inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "ops.toml"
    inv.write_text(
        "[targets.local]\n"
        f"remote_root = '{tmp_path / 'root'}'\n"
        "[targets.local.service]\n"
        f"url = 'http://127.0.0.1:{free_port()}'\n"
    )
    return inv


def test_playbook_that_is_not_a_regular_file_says_so(
    tmp_path: Path, env: dict[str, str], fifo: Path
) -> None:
    inv = str(local_inventory(tmp_path))
    for path, kind in (("/dev/zero", "a character device"), (str(fifo), "a FIFO")):
        res = ops_limited("rollout", "local", "--playbook", path, "--inventory", inv, env=env)
        line = one_error(res, path, "--playbook", f"not a regular file ({kind})")
        assert "no such file" not in line


def test_playbook_numbers_must_be_finite(tmp_path: Path, env: dict[str, str]) -> None:
    inv = str(local_inventory(tmp_path))
    pb = tmp_path / "inf.yaml"
    pb.write_text(
        "name: inf\n"
        "steps:\n"
        "  - {step: healthcheck, name: preflight, timeout: .inf}\n"
        "  - {step: report}\n"
    )
    res = ops_limited("rollout", "local", "--playbook", str(pb), "--inventory", inv, env=env)
    one_error(res, "step 1 'preflight'", "timeout:", "finite number", "inf")
    res = ops_limited("rollout", "local", "--set", "load.timeout=.nan", "--inventory", inv, env=env)
    one_error(res, "load.timeout:", "finite number", "nan", "(from --set)")


def test_timeouts_and_request_counts_are_bounded(tmp_path: Path, env: dict[str, str]) -> None:
    """probe37k K5, K6: `--timeout 1e12` reached the host's checks and came back as their
    traceback (OverflowError in settimeout), exit 2 with Python's words; `--requests 10**12`
    was accepted and grew the host's loadtest without bound. Both are refused before anything
    runs, on the command line and in a playbook (a step's timeout 1e308 passed as finite)."""
    inv = str(local_inventory(tmp_path))
    for cmd in (
        ("healthcheck", "local", "--timeout", "1e12"),
        ("loadtest", "local", "--timeout", "9999999999"),
        ("profile", "local", "--timeout", "1e308"),
        ("bench", "local", "--timeout", "1e308"),
        ("loadtest", "local", "--requests", "1000000000000"),
    ):
        res = ops_limited(*cmd, "--inventory", inv, env=env)
        one_error(res, f"Invalid value for '{cmd[2]}'", "less than or equal to")
    steps = (
        "{step: healthcheck, name: preflight, timeout: 1e308}",
        "{step: bench, timeout: 1e308}",
        "{step: deploy, max_tokens: 100000000}",
        "{step: deploy, keep: 100000000}",
        "{step: deploy, wait_s: 1e308}",
    )
    for n, step in enumerate(steps):
        pb = tmp_path / f"big{n}.yaml"
        change = "{component: tree_build, baseline: reference, candidate: cuda}"
        pb.write_text(f"name: big\nchange: {change}\nsteps:\n  - {step}\n")
        res = ops_limited("rollout", "local", "--playbook", str(pb), "--inventory", inv, env=env)
        one_error(res, "less than or equal to")
    for cmd in (  # probe37m M1: the derived path's tree shape (4.4 GB on the host at 40000)
        ("profile", "local", "--depth", "40000"),
        ("profile", "local", "--topk", "100000000"),
        ("profile", "local", "--budget", "100000000"),
    ):
        res = ops_limited(*cmd, "--inventory", inv, env=env)
        one_error(res, f"Invalid value for '{cmd[2]}'", "less than or equal to")
    for item in ("profile.depth=40000", "profile.topk=1000000", "profile.budget=1000000"):
        res = ops_limited("rollout", "local", "--set", item, "--inventory", inv, env=env)
        one_error(res, item.split("=")[0].split(".")[1] + ":", "less than or equal to")
    for item in ("load.timeout=1e12", "load.requests=1000000000000"):
        res = ops_limited("rollout", "local", "--set", item, "--inventory", inv, env=env)
        one_error(res, item.split("=")[0] + ":", "less than or equal to")
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made


def test_the_profiles_tree_shape_limits_are_the_tree_builders() -> None:
    """ops.measure.profile bounds the derived path's shape by the CUDA tree builder's limits,
    kept as its own numbers (the control plane imports no torch): they stay equal."""
    from kernels import cuda
    from ops.measure import profile

    assert (profile.MAX_BUDGET, profile.MAX_TOPK, profile.MAX_DEPTH) == (
        cuda.MAX_BUDGET,
        cuda.MAX_TOPK,
        cuda.MAX_DEPTH,
    )


def test_playbook_load_shape_over_the_loadtests_limits_is_refused_before_any_step(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """The loadtest's caps (1 Mi tokens a request, concurrency 1..4096: ops.measure.loadtest,
    the host's own cap beside it) hold at playbook load: was a HOLD (exit 3) after the
    pre-flight and the bench had run."""
    from checks.loadtest import MAX_TOKENS_UNREPORTED
    from ops.measure.loadtest import MAX_TOKENS

    assert MAX_TOKENS == MAX_TOKENS_UNREPORTED  # the host's cap and ops's are one limit
    inv = str(local_inventory(tmp_path))
    cases = (
        ("load.input_len=100000000000", "load.input_len:", "1048576"),
        ("load.input_len=1048570", "load:", "input_len + output_len = 1048602 tokens"),
        ("load.output_len=2000000", "load.output_len:", "1048576"),
        ("load.concurrency=1,5000", "load.concurrency.1:", "4096"),
        ("load.concurrency=" + "[" * 100000, "--set", "nested too deeply"),
    )
    for item, *words in cases:
        res = ops_limited("rollout", "local", "--set", item, "--inventory", inv, env=env)
        one_error(res, *words)
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made


# -- 5. report.md: record text is escaped -----------------------------------------------------


def test_report_md_escapes_html_from_records(tmp_path: Path, env: dict[str, str]) -> None:
    script, img = "<script>alert(1)</script>", "<img src=x onerror=alert(2)>"
    recs = tmp_path / "records"
    for name in ("preflight_ok", "bench_tree", "profile_tree", "rollout_tree"):
        shutil.copytree(RECORDS / name, recs / name)
    pre = recs / "preflight_ok" / "record.json"
    doc = json.loads(pre.read_text())
    doc["healthcheck"]["checks"][0]["detail"] = f"service ok {script}"
    pre.write_text(json.dumps(doc))
    bench = recs / "bench_tree" / "record.json"
    doc = json.loads(bench.read_text())
    doc["bench"]["environment"]["gpu"] = f"NVIDIA H200 {img}"
    bench.write_text(json.dumps(doc))
    out = tmp_path / "out"
    res = run_ops("report", *(str(p) for p in sorted(recs.iterdir())), "--out", str(out), env=env)
    assert res.returncode in (0, 1, 3), res.stderr
    md = (out / "report.md").read_text()
    assert "<script" not in md and "<img" not in md
    assert "service ok &lt;script>alert(1)&lt;/script>" in md  # shown, as text
    assert "gpu: NVIDIA H200 &lt;img src=x onerror=alert(2)>" in md
    html = (out / "report.html").read_text()
    assert "<script>alert" not in html and "<img src=x" not in html


def test_a_process_service_without_a_command_is_refused_before_anything_is_sent(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """probe37x L1 (low): a `manager = "process"` target with no service.command passed `ops
    hosts`; its deploy failed only at the restart, after send, self-test and finalize, leaving
    an unproven release per attempt. Refused in one line before the host is touched."""
    src, root, _, _ = _source(tmp_path)
    inv = tmp_path / "box.toml"
    inv.write_text(
        f"[targets.box]\naddress = '127.0.0.1'\nport = {free_port()}\nremote_root = '{root}'\n"
    )
    res = run_ops("deploy", "box", "--source", str(src), inventory=inv, env=env, timeout=60)
    line = one_error(res, "service.command is required")
    assert "box" in line and not root.exists(), line


def test_an_empty_concurrency_level_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    """probe37ae L1 (low): `ops loadtest -c 1,,2` ran levels 1 and 2, the empty one dropped
    in silence, where `-c 0` is refused. A typo'd level list is refused in one line."""
    inv = str(local_inventory(tmp_path))
    for levels in ("1,,2", "1,2,", ","):
        res = ops_limited("loadtest", "local", "-c", levels, "--inventory", inv, env=env)
        one_error(res, "--concurrency takes integers like 1,10,64", repr(levels))
