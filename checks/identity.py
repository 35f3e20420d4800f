"""`python -m checks.identity --json --url URL (--record-golden PATH | --golden PATH|-)`.

Greedy token identity against a recorded golden set, at concurrency 1 (one request at a time).

- `--record-golden PATH`: run every golden prompt greedily and store, per prompt, the output
  token ids (the text where the service gives no ids) with the service's model and config;
  written atomically; the document is also printed. A golden set already at PATH is kept as
  PATH.1 (PATH.2 the next time, ...), named under `kept`. The set records its prompt count
  and a digest of its prompts (`digest`): one edited or cut down by hand afterwards is damaged
  (exit 2), never a verdict on the service.
- `--golden PATH` (or `-` for stdin): run the same prompts with the golden's settings and
  report per prompt: match, the first divergent position, both continuations from there.
- `--aa-runs N`: first run the prompts N more times and compare the service with itself; a
  prompt it answers differently on its own is reported as `nondeterministic` and its golden
  mismatch is not blamed on the change.
Exit 0 when every deterministic prompt matches, 1 otherwise, 2 for a bad golden file.

Prints (`checks.docs.IdentityDoc`):
    ok                 bool  every deterministic prompt matches (recording: it was written)
    recorded, path     int, str   --record-golden: prompts recorded and where
    kept, golden       str|None, dict   the previous set's new name; the golden set itself
    total, matched     int   --golden: prompts compared, and how many are identical
    identity_pct       float matched / total in percent
    mismatched         list  prompt ids that differ (deterministic ones only)
    nondeterministic   list  prompt ids the service answers differently on its own (A/A)
    aa_runs, warnings  int, list
    golden_model, service   the golden's model, and what the service says it serves
    prompts            list  one `PromptRow` per prompt: id, compared (ids/text), match,
                             first_divergence, golden_continuation, got_continuation,
                             self_consistent
    error, message, evidence   a request got no answer (error "request_failed", exit 1)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from checks.atomic import write_atomic
from checks.http import completion_ids, get, post
from checks.module import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS, exit_json, parser
from checks.vocabulary import MAX_TOKENS

SCHEMA = "ddtree-ops/golden/v1"
PROMPTS = Path(__file__).parent / "data" / "golden_prompts.json"
CONTEXT = 8  # tokens (or characters) of each continuation shown at a divergence
MAX_FILE = 16 * 2**20  # bytes of a golden set or a prompt set read here (~100 KB in use)


class RunError(Exception):
    """A request that got no usable answer: this is a failed check, with evidence."""


def service_identity(url: str, timeout: float) -> dict[str, Any]:
    """The model and config a golden set is recorded from (whatever the service tells)."""
    models = get(url, "/v1/models", timeout=timeout)
    data = models.json.get("data") if isinstance(models.json, dict) else None
    model = data[0].get("id") if isinstance(data, list) and data else None
    info = get(url, "/get_server_info", timeout=timeout)
    config: dict[str, Any] = {}
    if info.ok and isinstance(info.json, dict):
        skip = {"internal_states", "uptime_s", "stats"}
        config = {k: v for k, v in info.json.items() if k not in skip}
    return {"model": model, "config": config}


_NATIVE: dict[str, bool] = {}  # url -> does SGLang's native /generate give output ids?


def native_ids(url: str, prompt: str, max_tokens: int, timeout: float) -> list[int] | None:
    """Output ids from SGLang's native `/generate`, for services whose completions carry none."""
    if _NATIVE.get(url) is False:
        return None
    body = {"text": prompt, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0}}
    res = post(url, "/generate", body, timeout=timeout)
    ids = res.json.get("output_ids") if res.ok and isinstance(res.json, dict) else None
    valid = isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    _NATIVE[url] = valid
    return list(ids) if valid else None


def generate(url: str, model: str | None, prompt: str, max_tokens: int, timeout: float) -> dict:
    """One greedy completion: token ids where the service gives them, else its text."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if model:
        body["model"] = model
    res = post(url, "/v1/completions", body, timeout=timeout)
    if not res.ok:
        raise RunError(res.evidence())
    ids, text = completion_ids(res.json)
    if text is None and ids is None:
        raise RunError(f"no completion choice in the answer: {res.evidence()}")
    if ids is None:
        ids = native_ids(url, prompt, max_tokens, timeout)
    return {"token_ids": ids, "text": text}


def run_all(url: str, model: str | None, prompts: list[dict], max_tokens: int, timeout: float):
    return {p["id"]: generate(url, model, p["prompt"], max_tokens, timeout) for p in prompts}


def first_divergence(a: list[Any] | str, b: list[Any] | str) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_one(golden: dict, got: dict) -> dict[str, Any]:
    kind = (
        "ids"
        if golden.get("token_ids") is not None and got.get("token_ids") is not None
        else "text"
    )
    want = golden["token_ids"] if kind == "ids" else (golden.get("text") or "")
    have = got["token_ids"] if kind == "ids" else (got.get("text") or "")
    pos = first_divergence(want, have)
    out: dict[str, Any] = {"compared": kind, "match": pos is None, "first_divergence": pos}
    if pos is not None:
        out["golden_continuation"] = want[pos : pos + CONTEXT]
        out["got_continuation"] = have[pos : pos + CONTEXT]
    return out


def parse_golden(text: str) -> dict[str, Any]:
    """A golden set from its JSON text; ValueError saying in one line what is wrong with it
    (a truncated file, prompts that are not prompts, a max_tokens that is no count): whatever
    `compare` reads is checked here, so a damaged set is never a traceback."""
    try:
        doc = json.loads(text)
    except ValueError as exc:  # JSONDecodeError; an integer too long to convert
        raise ValueError(f"not JSON ({exc}): damaged or cut short") from None
    except RecursionError:
        raise ValueError("not a golden set (JSON nested too deeply)") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not doc.get("prompts"):
        raise ValueError(f"not a golden set ({SCHEMA})")
    prompts = doc["prompts"]
    if not isinstance(prompts, list):
        raise ValueError(f"prompts is {_json_kind(prompts)}, not a list")
    seen: set[str] = set()
    for i, p in enumerate(prompts):
        where = f"prompts[{i}]"
        if not isinstance(p, dict):
            raise ValueError(f"{where} is {_json_kind(p)}, not a prompt object")
        pid = p.get("id")
        if not isinstance(pid, str) or not pid:
            raise ValueError(f"{where} has no id (a string)")
        shown = repr(pid) if len(pid) <= 40 else repr(pid[:37]) + "..."
        if pid in seen:
            raise ValueError(f"{where}: id {shown} is there twice")
        seen.add(pid)
        where = f"{where} ({shown})"
        if not isinstance(p.get("prompt"), str):
            raise ValueError(f"{where} has no prompt text")
        ids = p.get("token_ids")
        if ids is not None and not (
            isinstance(ids, list) and all(type(t) is int for t in ids)  # not a bool
        ):
            raise ValueError(f"{where}: token_ids is not a list of token ids")
        for key in ("text", "kind"):
            if p.get(key) is not None and not isinstance(p[key], str):
                raise ValueError(f"{where}: {key} is {_json_kind(p[key])}, not a string")
    count = doc.get("count")  # (recorded since probe37bd M5: 1 of 34 prompts left by hand
    # passed as a whole identity check)
    if count is not None and (type(count) is not int or count != len(prompts)):
        if type(count) is int and len(repr(count)) <= 40:
            said = f"it holds {len(prompts)} of the {count} prompts it was recorded with"
        else:  # (probe37bj L3: "of the a number prompts")
            shown = repr(count) if len(repr(count)) <= 40 else f"{_json_kind(count)} too long"
            said = f"it holds {len(prompts)} prompts, and its count is {shown}, no count of them"
        raise ValueError(said)
    sealed = doc.get("digest")  # (recorded since probe37bf M2: one token edited by hand
    # failed a good release, and the rollback to a proven one, on the golden set's word)
    if sealed is not None and sealed != digest(prompts):
        raise ValueError(
            "its prompts were changed after it was recorded (they do not match its digest)"
        )
    max_tokens = doc.get("max_tokens")
    if max_tokens is not None and (
        type(max_tokens) is not int or not 1 <= max_tokens <= MAX_TOKENS
    ):
        shown = repr(max_tokens) if len(repr(max_tokens)) <= 40 else _json_kind(max_tokens)
        raise ValueError(f"max_tokens {shown} is not a whole number from 1 to {MAX_TOKENS}")
    return doc


def digest(prompts: list[Any]) -> str:
    """The sha256 of a golden set's prompts (ids, texts and the outputs recorded), as their
    canonical JSON: what a set recorded with one is checked against when it is read."""
    text = json.dumps(prompts, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _json_kind(value: Any) -> str:
    """What a JSON value is, in words (for a message about a damaged golden set)."""
    for kind, name in (
        (bool, "a boolean"),
        (int, "a number"),
        (float, "a number"),
        (str, "a string"),
        (list, "a list"),
        (dict, "a mapping"),
    ):
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


def read_bounded(path: str, what: str, max_bytes: int = MAX_FILE) -> str:
    """The UTF-8 text of `path` (`-`: stdin), at most `max_bytes`: ValueError for a path that
    is not a regular file (a FIFO, /dev/zero, a directory) or is larger; OSError as reading
    raises it. (checks/ is stdlib-only: ops.files's bounded read, in small, for the host.)"""
    limit = f"more than {max_bytes // 2**20} MiB, the limit for this {what}"
    if path == "-":
        data = sys.stdin.buffer.read(max_bytes + 1)
    else:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"not a regular file ({_kind(mode)})")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"not a regular file ({_kind(st.st_mode)})")
            if st.st_size > max_bytes:
                raise ValueError(limit)
            data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(limit)
    return data.decode("utf-8")


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"


def load_golden(path: str) -> dict[str, Any]:
    return parse_golden(read_bounded(path, "golden file"))


def not_replaceable(path: Path, junk_aside: bool) -> str | None:
    """Why what is at `path` is never replaced by a golden set, or None. A regular file is
    kept beside it (`keep_previous`); in the host's own golden/ (`junk_aside`) so is a FIFO,
    a socket or a link, put there by hand. A directory or a device is nobody's golden set
    (probe37bg H1: `--golden /dev/full` moved the device aside, `--golden ROOT` a whole
    remote root); anywhere else, neither is anything that is not a regular file."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:  # nothing there (or no directory above it: the write says so)
        return None
    if stat.S_ISREG(mode):
        return None
    if junk_aside and (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISLNK(mode)):
        return None
    return "a symbolic link" if stat.S_ISLNK(mode) else _kind(mode)


def keep_previous(path: Path, junk_aside: bool = True) -> Path | None:
    """Before a golden set at `path` is replaced, keep it as `path`.N (one above the highest N);
    with `junk_aside`, a FIFO, a socket or a link there is moved there. ValueError for what is
    never replaced (`not_replaceable`)."""
    why = not_replaceable(path, junk_aside)
    if why:
        raise ValueError(f"{path} is {why}: no golden set is written over it")
    if not os.path.lexists(path):
        return None
    pattern = re.compile(re.escape(path.name) + r"\.(\d+)")
    taken = [int(m.group(1)) for f in path.parent.iterdir() if (m := pattern.fullmatch(f.name))]
    n = max(taken, default=0) + 1
    while not path.is_file() or path.is_symlink():  # kept as it is, never opened
        dest = path.with_name(f"{path.name}.{n}")
        if not os.path.lexists(dest):
            os.rename(path, dest)
            return dest
        n += 1
    while True:
        dest = path.with_name(f"{path.name}.{n}")
        try:
            os.link(path, dest)  # the old file stays whole under both names until replaced
            return dest
        except FileExistsError:
            n += 1
        except OSError:  # no hard links here: copy, never over an existing file
            try:
                with dest.open("xb") as f:
                    f.write(path.read_bytes())
                return dest
            except FileExistsError:
                n += 1


def unkeep(path: Path, kept: Path | None) -> None:
    """Undo `keep_previous` after the new golden set was not written: a kept copy of the set
    still at `path` is removed; what was moved aside (a FIFO, a link) goes back."""
    if kept is None:
        return
    with contextlib.suppress(OSError):
        if not os.path.lexists(path):
            os.rename(kept, path)
        elif path.is_file() and kept.is_file() and kept.read_bytes() == path.read_bytes():
            kept.unlink()


def record(args: Any) -> None:
    try:
        prompts = json.loads(read_bounded(args.prompts, "prompt set"))["prompts"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        exit_json(
            {
                "ok": False,
                "module": "checks.identity",
                "error": "bad_input",
                "message": f"--prompts {args.prompts}: {exc}",
            },
            EXIT_BAD_INPUT,
        )
    if args.limit:
        prompts = prompts[: args.limit]
    why = None if args.record_golden == "-" else not_replaceable(Path(args.record_golden), True)
    if why:  # said before any request
        exit_json(
            {
                "ok": False,
                "module": "checks.identity",
                "error": "bad_input",
                "message": f"--record-golden {args.record_golden} is {why}: no golden set is "
                "written over it",
            },
            EXIT_BAD_INPUT,
        )
    ident = service_identity(args.url, args.timeout)
    outputs = run_all(args.url, ident["model"], prompts, args.max_tokens, args.timeout)
    doc = {
        "schema": SCHEMA,
        "recorded": datetime.now(timezone.utc).isoformat(),
        "url": args.url,
        "max_tokens": args.max_tokens,
        **ident,
        "count": len(prompts),  # a set cut down by hand is then told from a whole one
        "prompts": [{**p, **outputs[p["id"]]} for p in prompts],
    }
    doc["digest"] = digest(doc["prompts"])  # and one edited by hand from one recorded
    kept = None
    if args.record_golden != "-":
        text = json.dumps(doc, ensure_ascii=False, indent=1)
        try:
            kept = keep_previous(Path(args.record_golden))
            try:
                write_atomic(Path(args.record_golden), text.encode("utf-8"))
            except OSError:  # nothing replaced: nothing kept (probe37bm L3: a golden.json.N
                unkeep(Path(args.record_golden), kept)  # per failed try on a full disk)
                raise
        except ValueError as exc:  # made a directory or a device since the look above
            said = {"ok": False, "module": "checks.identity", "error": "bad_input"}
            exit_json({**said, "message": str(exc)}, EXIT_BAD_INPUT)
        except OSError as exc:  # a full or read-only disk: one document, not a traceback
            where = exc.filename or args.record_golden  # (probe37v V1)
            exit_json(
                {
                    "ok": False,
                    "module": "checks.identity",
                    "error": "write_failed",
                    "message": f"the golden set could not be written ({where}: {exc.strerror})",
                },
                EXIT_FAIL,
            )
    exit_json(
        {
            "ok": True,
            "module": "checks.identity",
            "recorded": len(prompts),
            "path": args.record_golden,
            "kept": str(kept) if kept else None,
            "golden": doc,
        }
    )


def compare(args: Any, golden: dict[str, Any]) -> None:
    prompts = golden["prompts"]
    max_tokens = int(golden.get("max_tokens") or args.max_tokens)
    ident = service_identity(args.url, args.timeout)
    aa = [
        run_all(args.url, ident["model"], prompts, max_tokens, args.timeout)
        for _ in range(args.aa_runs)
    ]
    now = run_all(args.url, ident["model"], prompts, max_tokens, args.timeout)
    per_prompt, mismatched, nondet = [], [], []
    for p in prompts:
        pid = p["id"]
        row = {"id": pid, "kind": p.get("kind"), **compare_one(p, now[pid])}
        row["self_consistent"] = all(compare_one(now[pid], run[pid])["match"] for run in aa)
        if not row["self_consistent"]:
            nondet.append(pid)
        elif not row["match"]:
            mismatched.append(pid)
        per_prompt.append(row)
    matched = sum(r["match"] for r in per_prompt)
    warnings = []
    if any(r["compared"] == "text" for r in per_prompt):
        warnings.append("the service gives no token ids (completions nor /generate): compared text")
    if golden.get("model") and ident["model"] and golden["model"] != ident["model"]:
        warnings.append(
            f"golden recorded from model {golden['model']!r}, service serves {ident['model']!r}"
        )
    exit_json(
        {
            "ok": not mismatched,
            "module": "checks.identity",
            "concurrency": 1,
            "total": len(prompts),
            "matched": matched,
            "identity_pct": round(100.0 * matched / len(prompts), 3),
            "mismatched": mismatched,
            "nondeterministic": nondet,
            "aa_runs": args.aa_runs,
            "golden_model": golden.get("model"),
            "service": ident,
            "warnings": warnings,
            "prompts": per_prompt,
        },
        EXIT_FAIL if mismatched else EXIT_PASS,
    )


def main(argv: list[str] | None = None) -> None:
    p = parser("checks.identity", "Greedy token identity against a golden set.")
    p.add_argument("--url", required=True)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record-golden", metavar="PATH", help="record a golden set to PATH")
    mode.add_argument("--golden", metavar="PATH", help="compare with PATH ('-': stdin)")
    p.add_argument("--prompts", default=str(PROMPTS), help="prompt set (for --record-golden)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--limit", type=int, default=0, help="only the first N prompts (recording)")
    p.add_argument("--aa-runs", type=int, default=0, help="extra runs to measure self-noise")
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args(argv)
    if not 1 <= args.max_tokens <= MAX_TOKENS or args.aa_runs < 0 or args.limit < 0:
        p.error(f"--max-tokens must be 1 to {MAX_TOKENS}, --aa-runs and --limit >= 0")
    try:
        if args.record_golden:
            record(args)
        try:
            golden = load_golden(args.golden)
        except (OSError, ValueError) as exc:
            exit_json(
                {
                    "ok": False,
                    "module": "checks.identity",
                    "error": "bad_golden",
                    "message": f"{args.golden}: {exc}",
                },
                EXIT_BAD_INPUT,
            )
        compare(args, golden)
    except RunError as exc:
        exit_json(
            {
                "ok": False,
                "module": "checks.identity",
                "error": "request_failed",
                "message": str(exc),
                "evidence": str(exc),
            },
            EXIT_FAIL,
        )


if __name__ == "__main__":
    main()
