"""`python -m checks.hook_counters --json [--run DIR]`: the SGLang import hook's stage clock, read.

Every process of a service started with the release's import hook (`integration.hook`, any
`DDTREE_OPS_SGLANG` but `off`) keeps one small counters file, `<run>/hook-counters/<pid>.bin`
(<run>: the release's `run/`, the directory of its hook-status.json), memory-mapped and updated
in place on every call of the fork's tree builder, accept walk and GPU accept walk (FUNCTIONS):
no I/O on the call path (`integration.counters` writes it). This module is the file's one
definition (the writer imports LAYOUT from here) and its reader. Standard library only.

The file: int64 words in the host's byte order. A header of HEADER_WORDS (magic, version,
pid, the process's start time in clock ticks after boot (/proc/<pid>/stat field 22: a pid
reused by another process is told apart), its creation in unix ns, the number of components,
the ring's length, the words of a block), then one block per component (COMPONENTS order):
FIELDS, then a ring of RING shadow pairs (stock ns, candidate ns). Each word is written whole
(an aligned 8-byte store); the words of a block are not one atomic update, so a snapshot may
see a call counted whose time is not added yet (one call per function per process at most).
In the ring, pair i sits at slot i % RING; pair i ran the stock first when i is even and the
candidate first when it is odd (the hook alternates, so the order's effect cancels).

Prints (`checks.docs.HookCountersDoc`): ok, module, run_dir, release (the directory `run_dir`
belongs to), at (unix time of the read), files (counters files found), live (read), dead
(skipped: the pid is gone, or is another process now), unreadable [{file, why}], processes
(one per live file: pid, file, created, components {name: {calls, seconds, errors, shadow}}
where shadow is null without one, else every (1 call in N compared), compared, mismatched,
stock_s, cand_s (over the compared calls), cand_errors, overhead_s (the shadow's own time:
candidate, copies, comparison), saved (cases written), pairs (written in all), and with
--pairs the ring's pairs still held, [index, stock_ns, cand_ns] oldest first), mismatched (over
the live processes), mismatch_files (the saved cases in run_dir,
`hook-mismatch-<pid>-<component>-<n>.json`, every one whatever process wrote it),
mismatch_cases (the first MAX_CASES of them read: file, component, candidate, difference),
status (the hook's hook-status.json, or null).
Exit 0; 1 when a file is unreadable or any mismatch was seen (counted, or a case saved);
2 bad input.

`--loadtest -- ARGS` runs `checks.loadtest ARGS` with this reading added to each of its
`--counters` snapshots (key `hook`, with the pairs), taken at the same instants as the
service's own counters: right before the first measured request and right after the last one
completed, so the difference of the two is the hook's clock over exactly the measured window
(`ops profile` on a service with the hook). It prints checks.loadtest's document.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

from checks.module import EXIT_FAIL, EXIT_PASS, exit_json, parser
from checks.vocabulary import HOOK_BACKENDS

MAGIC = 0x4B4F4F48_45455254  # "TREEHOOK" as a little-endian word
VERSION = 2  # 2: a third block, the GPU accept walk (gpu_accept)
COMPONENTS = tuple(HOOK_BACKENDS)  # what the hook counts (checks.vocabulary)
FUNCTIONS = {
    "tree_build": "build_ddtree_tree_from_topk",
    "accept": "follow_verified_tree",
    "gpu_accept": "_compute_ddtree_accept_triton_unchecked",
}
HEADER = ("magic", "version", "pid", "start_ticks", "created_ns", "components", "ring", "block")
HEADER_WORDS = 8
FIELDS = (
    "calls",
    "ns",
    "errors",
    "shadow_every",
    "compared",
    "mismatched",
    "stock_ns",
    "cand_ns",
    "cand_errors",
    "overhead_ns",
    "saved",
    "pairs",
)
FIELD_WORDS = 16  # FIELDS, then spare words
RING = 1024
BLOCK_WORDS = FIELD_WORDS + 2 * RING
WORDS = HEADER_WORDS + len(COMPONENTS) * BLOCK_WORDS
SIZE = 8 * WORDS
COUNTERS_DIR = "hook-counters"
STATUS_FILE = "hook-status.json"
MISMATCH_GLOB = "hook-mismatch-*.json"
MAX_CASES = 5  # saved cases summarised in the document


def field(component: str, name: str) -> int:
    """The word index of `name` in `component`'s block."""
    return HEADER_WORDS + COMPONENTS.index(component) * BLOCK_WORDS + FIELDS.index(name)


def ring_index(component: str, pair: int) -> int:
    """The word index of pair number `pair` (its stock ns; the candidate's is the next word)."""
    block = HEADER_WORDS + COMPONENTS.index(component) * BLOCK_WORDS
    return block + FIELD_WORDS + 2 * (pair % RING)


def header_words(pid: int, start_ticks: int, created_ns: int) -> list[int]:
    return [MAGIC, VERSION, pid, start_ticks, created_ns, len(COMPONENTS), RING, BLOCK_WORDS]


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (the process's start after boot, clock ticks), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096)
    except OSError:
        return None
    try:  # the command name may hold spaces and parentheses: fields count from the last ')'
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def alive(pid: int, ticks: int) -> bool:
    """Whether `pid` still runs and is the process that wrote the file (its start time)."""
    now = start_ticks(pid)
    if now is not None:
        return now == ticks or ticks == 0
    if os.path.isdir("/proc/self"):
        return False  # a /proc without the pid: gone
    try:  # no /proc on this system: the pid alone
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Unreadable(ValueError):
    """A counters file that is not one (cut short, another magic or version)."""


def parse(data: bytes, pairs: bool = False) -> dict[str, Any]:
    """One counters file's bytes -> {pid, start_ticks, created, components}."""
    if len(data) < SIZE:
        raise Unreadable(f"{len(data)} bytes, not {SIZE}")
    words = memoryview(data[:SIZE]).cast("q")
    head = dict(zip(HEADER, words[:HEADER_WORDS], strict=True))
    if head["magic"] != MAGIC or head["version"] != VERSION:
        raise Unreadable(f"magic {head['magic']:#x} version {head['version']}: not this layout")
    if (head["components"], head["ring"], head["block"]) != (len(COMPONENTS), RING, BLOCK_WORDS):
        raise Unreadable("another layout of the same version")
    comps = {}
    for comp in COMPONENTS:
        base = field(comp, "calls")
        v = dict(zip(FIELDS, words[base : base + len(FIELDS)], strict=True))
        row: dict[str, Any] = {"calls": v["calls"], "seconds": v["ns"] / 1e9, "errors": v["errors"]}
        row["shadow"] = None
        if v["shadow_every"] > 0:
            sh: dict[str, Any] = {
                "every": v["shadow_every"],
                "compared": v["compared"],
                "mismatched": v["mismatched"],
                "stock_s": v["stock_ns"] / 1e9,
                "cand_s": v["cand_ns"] / 1e9,
                "cand_errors": v["cand_errors"],
                "overhead_s": v["overhead_ns"] / 1e9,
                "saved": v["saved"],
                "pairs": v["pairs"],
            }
            if pairs:
                first = max(0, v["pairs"] - RING)
                sh["ring"] = [
                    [i, words[ring_index(comp, i)], words[ring_index(comp, i) + 1]]
                    for i in range(first, v["pairs"])
                ]
            row["shadow"] = sh
        comps[comp] = row
    return {
        "pid": head["pid"],
        "start_ticks": head["start_ticks"],
        "created": head["created_ns"] / 1e9,
        "components": comps,
    }


def read_run(run_dir: Path, pairs: bool = False) -> dict[str, Any]:
    """Every counters file under `run_dir` (live processes read, dead ones counted), the saved
    mismatch cases and the hook's status: the document's fields but ok and module."""
    cdir = run_dir / COUNTERS_DIR
    doc: dict[str, Any] = {
        "run_dir": str(run_dir),
        "release": run_dir.resolve().parent.name,
        "at": time.time(),
        "files": 0,
        "live": 0,
        "dead": 0,
        "unreadable": [],
        "processes": [],
        "mismatched": 0,
        "mismatch_files": sorted(p.name for p in run_dir.glob(MISMATCH_GLOB)),
        "status": _status(run_dir / STATUS_FILE),
    }
    doc["mismatch_cases"] = [_case(run_dir, name) for name in doc["mismatch_files"][:MAX_CASES]]
    try:
        names = sorted(
            (n for n in os.listdir(cdir) if n.endswith(".bin") and n[:-4].isdigit()),
            key=lambda n: int(n[:-4]),
        )
    except FileNotFoundError:
        names = []
    except OSError as exc:
        doc["unreadable"].append({"file": str(cdir), "why": exc.strerror or str(exc)})
        names = []
    for name in names:
        path = cdir / name
        try:
            data = read_regular(path, SIZE)  # the layout is SIZE bytes: no more is read
        except FileNotFoundError:
            continue  # its process's successor removed it (dead) between the listing and now
        except OSError as exc:
            doc["unreadable"].append({"file": name, "why": exc.strerror or str(exc)})
            continue
        doc["files"] += 1
        try:
            proc = parse(data, pairs)
        except Unreadable as exc:
            doc["unreadable"].append({"file": name, "why": str(exc)})
            continue
        if not alive(proc["pid"], proc["start_ticks"]):
            doc["dead"] += 1
            continue
        doc["live"] += 1
        doc["processes"].append({"file": name, **proc})
        doc["mismatched"] += sum(
            (c["shadow"] or {}).get("mismatched", 0) for c in proc["components"].values()
        )
    return doc


def _case(run_dir: Path, name: str) -> dict[str, Any]:
    """A saved case in a few words: which function, which candidate, the first difference."""
    case = _status(run_dir / name, 64 << 20) or {}
    return {
        "file": name,
        "component": case.get("component"),
        "candidate": case.get("candidate"),
        "difference": str(case.get("difference"))[:500],
    }


def read_regular(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file; OSError for anything else (a FIFO there is
    never waited on, a device never read without end)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path.name} is not a regular file")
        return f.read(limit)


def _status(path: Path, limit: int = 1 << 20) -> dict[str, Any] | None:
    """A JSON object from a regular file, at most `limit` bytes of it; None for anything else."""
    try:
        st = json.loads(read_regular(path, limit))
    except (OSError, ValueError, RecursionError):
        return None
    return st if isinstance(st, dict) else None


def default_run() -> Path:
    """The run/ of the release this module runs from (`<remote_root>/current` on a host)."""
    return Path(__file__).resolve().parent.parent / "run"


def _loadtest(run_dir: Path, argv: list[str]) -> None:
    """checks.loadtest with the hook's reading in each of its --counters snapshots."""
    from checks import loadtest, probe

    def counters(url: str, timeout: float) -> Any:
        snap = probe.counters(url, timeout)
        snap["hook"] = read_run(run_dir, pairs=True)  # type: ignore[typeddict-unknown-key]
        return snap

    loadtest.counters = counters  # the name its snapshots are taken by (a test holds it)
    loadtest.main(argv)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    rest: list[str] | None = None
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1 :]
    p = parser("checks.hook_counters", "Read the import hook's per-process call counters.")
    p.add_argument("--run", type=Path, default=None, help="the release's run/ (default: ours)")
    p.add_argument("--pairs", action="store_true", help="include the shadow's ring of pairs")
    p.add_argument(
        "--loadtest", action="store_true", help="run checks.loadtest with the ARGS after --"
    )
    args = p.parse_args(argv)
    if args.loadtest != (rest is not None):
        p.error("--loadtest takes checks.loadtest's arguments after --, and only with it")
    run_dir = args.run or default_run()
    if args.loadtest:
        _loadtest(run_dir, ["--json", *(rest or [])])
        return
    doc = read_run(run_dir, args.pairs)
    ok = not doc["unreadable"] and not doc["mismatched"] and not doc["mismatch_files"]
    exit_json({"ok": ok, "module": "checks.hook_counters", **doc}, EXIT_PASS if ok else EXIT_FAIL)


if __name__ == "__main__":
    main()
