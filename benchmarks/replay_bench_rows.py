"""Rebuild a rollout's report with another bench's rows of one kernel family (no GPU).

What would the rollout have predicted had its bench step timed a kernel family another way?
Copies the rollout run directory, puts the rows whose kernel starts with PREFIX from a
`python -m kernels.bench --json` document in place of that family's rows in the copy's
bench record, and runs `ops report` on the copy (from records alone, as every report).
Usage, project root:
    python3 benchmarks/replay_bench_rows.py RUN_DIR BENCH_JSON OUT_DIR [--kernel row_attention]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("bench_json", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--kernel", default="row_attention", help="kernel name prefix to replace")
    args = ap.parse_args()
    bench_rec = args.run_dir / "02-bench" / "record.json"
    if not bench_rec.is_file() or not args.bench_json.is_file():
        print(f"error: needs {bench_rec} and {args.bench_json}", file=sys.stderr)
        return 2
    if args.out_dir.exists():
        print(f"error: {args.out_dir} exists", file=sys.stderr)
        return 2
    try:  # both inputs read and checked before anything is written
        rec = json.loads(bench_rec.read_text())
        old = rec["bench"]["rows"]
        doc = json.loads(args.bench_json.read_text())
        new = [r for r in doc["results"] if str(r.get("kernel", "")).startswith(args.kernel)]
        if not isinstance(old, list) or not all(isinstance(r, dict) for r in old):
            raise TypeError("bench.rows is not a list of rows")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"error: {bench_rec} or {args.bench_json}: not a bench record / a kernels.bench "
              f"--json document ({type(exc).__name__}: {exc})", file=sys.stderr)  # fmt: skip
        return 2
    run = args.out_dir / "run"
    shutil.copytree(args.run_dir, run)
    rec["bench"]["rows"] = [r for r in old if not str(r.get("kernel", "")).startswith(args.kernel)]
    print(f"{len(old) - len(rec['bench']['rows'])} {args.kernel}* rows replaced by {len(new)}")
    rec["bench"]["rows"] += new
    (run / "02-bench" / "record.json").write_text(json.dumps(rec, indent=1))
    cmd = [sys.executable, "-m", "ops", "report", str(run), "--out", str(args.out_dir)]
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    raise SystemExit(main())
