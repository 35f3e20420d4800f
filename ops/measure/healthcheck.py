"""`ops healthcheck`: the pre- and post-flight of a service, gathered from checks run on its host.

In order: the service manager's state; `checks.health` (/health, /health_generate, models,
a smoke completion, server info); `checks.identity` (greedy token identity against the golden
set, or recording it); `checks.gpus` (nvidia-smi inventory and sanity). The data-plane checks
run on the host next to the service (`python -m checks.<name> --json`), from the project
checkout on `local` and from `<remote_root>/current` elsewhere. Every failure keeps its
evidence: HTTP status and body excerpt, journal or log lines, the first divergent token.

A damaged golden set on the host (cut short, not a golden set, prompts that are not prompts,
a max_tokens that is no count) is read and judged here before `checks.identity` runs, and
is never an exception: it is a failed `identity` check saying what is wrong and how to
re-record it (`ops healthcheck TARGET --record-golden`). Run by an ops that holds the host's
lock (a deploy's post-flight, a rollback, a deploy's own rollback: the host is mid-change),
it is a skip that says loudly that identity was NOT CHECKED: a golden set that cannot judge
never undoes a change nor blocks an emergency rollback; a deploy's pre-flight (before the
lock) fails on it, and `--force` passes it there.
"""

from __future__ import annotations

import json
import os
import posixpath
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, cast

from checks.atomic import write_atomic
from checks.docs import GpusDoc, HealthDoc, IdentityDoc
from checks.identity import keep_previous, not_replaceable, parse_golden
from ops.errors import HostError, OpsError
from ops.files import MIB, read_bytes_bounded
from ops.hosts.dataplane import data_plane_dir, run_check
from ops.hosts.remote import Host, shell_path
from ops.hostside.release_files import shown_name
from ops.sections.health import Check, HealthReport
from ops.service.managers import manager_for

GOLDEN_MAX_BYTES = 16 * MIB  # a golden set of ~40 prompts is ~100 KB
IDENTITY_TIMEOUT_S = 1800  # checks.identity as a whole (run_check's default)


def golden_on_host(host: Host) -> str:
    """The golden set's default place on the host."""
    return f"{host.target.remote_root}/golden/golden.json"


def aa_runs_text(n: int) -> str:
    """ "1 A/A run", "2 A/A runs": how the healthcheck and the report count A/A runs."""
    return f"{n} A/A run{'' if n == 1 else 's'}"


def golden_damaged_check(
    host: Host,
    path: str,
    why: str,
    status: Literal["fail", "skip"],
    linked: str | None = None,
) -> tuple[Check, IdentityDoc]:
    """The identity check when the golden set at `path` cannot judge: one line, what is wrong
    and how to fix it; the module's document as `checks.identity` gives it (bad_golden).
    `linked`: where its directory, a symlink made by hand, points (nothing is read through it)."""
    fix = (
        f"re-record it from a release you trust: ops healthcheck {host.name} --record-golden "
        f"(the damaged file is kept beside it as {Path(path).name}.N)"
    )
    lead = "is damaged"
    if linked is not None:  # (probe37bo M1: read through it, and a re-record named, refused)
        where = posixpath.dirname(path)
        lead, why = (
            "is not read",
            (
                f"{where} is a symlink (to {linked}), made by hand: ops reads and writes no "
                "golden set through it"
            ),
        )
        fix = (
            f"make {where} a directory (move the link aside), then record: ops healthcheck "
            f"{host.name} --record-golden"
        )
    doc = cast(
        IdentityDoc,
        {
            "ok": False,
            "module": "checks.identity",
            "error": "bad_golden",
            "message": f"{path}: {why}",
        },
    )
    if status == "skip":
        detail = (
            f"NOT CHECKED: the golden set {path} {lead} ({why}), so token identity cannot "
            f"be judged; the host is mid-change (this ops holds its lock), so this does not "
            f"undo it; {fix}"
        )
    else:
        detail = f"the golden set {path} {lead}: {why}; {fix}"
    return Check(name="identity", status=status, detail=detail, evidence=[doc["message"]]), doc


def identity_check(data: IdentityDoc, recorded: bool) -> Check:
    if data.get("error") == "request_failed":
        return Check(
            name="identity",
            status="fail",
            detail="a golden prompt got no answer",
            evidence=[data.get("evidence", "")],
        )
    if data.get("error") and "prompts" not in data:  # any other answer that compared nothing
        said = f"{data.get('error')}: {data.get('message', '')}"
        return Check(name="identity", status="fail", detail=f"token identity not checked ({said})")
    if recorded:
        detail = f"recorded {data['recorded']} prompts to {data['path']}"
        if data.get("kept"):
            detail += f"; the previous golden set is kept as {data['kept']}"
        return Check(name="identity", status="pass", detail=detail)
    rows = {r["id"]: r for r in data["prompts"]}
    evidence = []
    for pid in data["mismatched"]:
        r = rows[pid]
        unit = "token" if r["compared"] == "ids" else "character"
        evidence.append(
            f"{pid}: first divergence at {unit} {r['first_divergence']}: "
            f"golden {r['golden_continuation']!r} got {r['got_continuation']!r}"
        )
    for pid in data["nondeterministic"]:
        evidence.append(f"{pid}: the service disagrees with itself (A/A); not blamed on the change")
    detail = (
        f"{data['matched']}/{data['total']} prompts token-identical ({data['identity_pct']}%) "
        f"at concurrency 1"
    )
    if data["aa_runs"]:
        nondet = data["nondeterministic"]
        detail += f"; {len(nondet)} nondeterministic in {aa_runs_text(data['aa_runs'])}"
        if nondet:
            more = f" (+{len(nondet) - 5} more)" if len(nondet) > 5 else ""
            detail += ": " + ", ".join(nondet[:5]) + more
    evidence += data.get("warnings", [])
    return Check(
        name="identity", status="pass" if data["ok"] else "fail", detail=detail, evidence=evidence
    )


def run_healthcheck(
    host: Host,
    *,
    golden: Path | None = None,
    record_golden: bool = False,
    aa_runs: int = 0,
    timeout: float = 30.0,
    max_tokens: int = 32,
    progress: Callable[[str], None] = lambda step: None,
    damaged_golden: Literal["fail", "skip"] | None = None,
) -> HealthReport:
    """The healthcheck. `damaged_golden`: how a golden set on the host that cannot be read as
    one counts: "fail", "skip" (identity NOT CHECKED, said in its detail), or None: "skip"
    when this ops holds the host's lock (a post-flight or rollback of its own), else "fail"."""
    target = host.target
    url = target.service.url
    out: list[Check] = []
    modules: dict[str, Any] = {}

    progress("service state")
    st = manager_for(host).status()
    out.append(
        Check(
            name="service",
            status="pass" if st.active else "fail",
            # (a service not answering whose command changed since: why, probe37ba M1)
            detail=f"{st.manager}: {st.state}: {st.detail}"
            + (f"; {st.untried}" if st.untried and not st.active else ""),
            evidence=st.evidence[-20:],
        )
    )

    progress("health, smoke completion")
    if "is stopped (SIG" in st.detail:  # a stopped process answers nothing: not waited for
        # (probe37u U7: a deploy's pre-flight waited 61 s on one, then advised a start)
        why = f"not asked: {st.detail}"
        health = cast(HealthDoc, {"checks": [{"name": "health", "status": "fail", "detail": why}]})
    else:
        health = cast(
            HealthDoc,
            run_check(host, "checks.health", ["--url", url, "--timeout", str(timeout)]).data,
        )
    modules["health"] = health
    for c in health["checks"]:
        ev = [c["evidence"]] if c.get("evidence") else []
        out.append(Check(name=c["name"], status=c["status"], detail=c["detail"], evidence=ev))
    healthy = all(c["status"] != "fail" for c in health["checks"] if c["name"] == "health")
    # a request left unanswered (timed out): identity's requests would only wait as long
    mute = next((c for c in health["checks"] if _unanswered(c)), None)

    progress("token identity")
    if record_golden and not st.active:  # (probe37be H1: another program on its port answered,
        # and what "correct" is was recorded from it while this check said the service is down)
        why = (
            f"NOT RECORDED: the service is {st.state}, so what answers on its port is not known "
            "to be it; a golden set is recorded only from the service running"
        )
        check, data = Check(name="identity", status="fail", detail=why), None
    elif healthy and mute is None:
        check, data = _identity(
            host, golden, record_golden, aa_runs, timeout, max_tokens, damaged_golden
        )
    elif mute is not None and healthy:
        why = f"not tried: {mute['name']} got no answer ({mute['http'].get('error')})"
        check, data = Check(name="identity", status="skip", detail=why), None
    else:
        check, data = Check(name="identity", status="skip", detail="service not healthy"), None
    out.append(check)
    modules["identity"] = data

    progress("GPUs")
    gpu_args = ["--expect", str(target.gpus)] if target.gpus else []
    gpus = cast(GpusDoc, run_check(host, "checks.gpus", gpu_args).data)
    modules["gpus"] = gpus
    if not gpus.get("available"):
        out.append(Check(name="gpus", status="skip", detail=gpus.get("reason", "no nvidia-smi")))
    else:
        n = len(gpus.get("gpus", []))
        out.append(
            Check(
                name="gpus",
                status="pass" if gpus["ok"] else "fail",
                detail=f"{n} GPUs" + ("" if gpus["ok"] else ": problems"),
                evidence=gpus.get("problems", []),
            )
        )
    progress("integration hook")
    out.append(hook_check(host))
    golden_label = str(golden) if golden else golden_on_host(host)
    return HealthReport(
        target=target.name, url=url, checks=out, golden=golden_label, modules=modules
    )


def no_link_at_golden(host: Host, on_host: str) -> None:
    """Refuse a `golden/` under the remote root that is a symlink, before a golden set is
    recorded there (an operator's --record-golden, a --bootstrap deploy's): ops writes nothing
    through a link made by hand (probe37ac L2: the set went wherever the link named)."""
    where = posixpath.dirname(on_host)
    res = host.run_script(
        f"[ -L {shell_path(where)} ] && readlink {shell_path(where)} | head -c 300; true",
        step="golden",
    )
    if res.stdout.strip():
        raise HostError(
            f"{where} is a symlink (to {res.stdout.strip()}), made by hand: the golden set is "
            "not written through it",
            target=host.name,
            step="golden",
            hint=f"make {where} a directory (move the link aside), then record",
        )


def _identity(
    host: Host,
    golden: Path | None,
    record_golden: bool,
    aa_runs: int,
    timeout: float,
    max_tokens: int,
    damaged: Literal["fail", "skip"] | None = None,
) -> tuple[Check, IdentityDoc | None]:
    """Record the golden set (on the host, or into the local file `golden`) or compare with it."""
    base = ["--url", host.target.service.url, "--timeout", str(timeout)]
    on_host = golden_on_host(host)
    if record_golden:
        if not golden:
            no_link_at_golden(host, on_host)
        elif why := not_replaceable(golden, junk_aside=False):  # before any request
            raise OpsError(
                f"golden file {golden} is {why}: --record-golden writes a regular file there, "
                "and never over anything else",
                hint="name a new file, or a golden set recorded before",
            )
        where = "-" if golden else on_host
        res = run_check(
            host,
            "checks.identity",
            [*base, "--record-golden", where, "--max-tokens", str(max_tokens)],
        )
        data = cast(IdentityDoc, res.data)
        if res.rc != 0 and data.get("error") == "write_failed":  # a full or read-only root:
            # the host's trouble, one line, exit 2 (probe37al M1: an internal error, exit 4)
            raise HostError(
                str(data.get("message")),
                target=host.name,
                step="record golden",
                hint="free space in the remote root (or make it writable), then record again; "
                "the service was not touched",
            )
        if golden and res.rc == 0:
            doc = json.dumps(data["golden"], ensure_ascii=False, indent=1) + "\n"
            try:
                kept = keep_previous(golden, junk_aside=False)
                write_atomic(golden, doc.encode())
            except ValueError as exc:  # (made so since the look before the recording)
                raise OpsError(f"golden file {exc}") from None
            except OSError as exc:
                raise OpsError(f"cannot write golden file {golden}: {exc.strerror}") from None
            data["path"] = str(golden)
            data["kept"] = str(kept) if kept else None
        return identity_check(data, recorded=res.rc == 0), data
    stdin = None
    if golden:
        try:
            stdin = read_bytes_bounded(golden, max_bytes=GOLDEN_MAX_BYTES, what="golden file")
        except OSError as exc:
            raise OpsError(f"cannot read golden file {golden}: {exc.strerror}") from None
        try:  # checked here too, so the message names the file, not the module's stdin
            parse_golden(stdin.decode("utf-8"))
        except ValueError as exc:
            raise OpsError(f"golden file {golden}: {exc}") from None
        args = [*base, "--golden", "-", "--aa-runs", str(aa_runs)]
        data = cast(IdentityDoc, run_check(host, "checks.identity", args, stdin).data)
        return identity_check(data, recorded=False), data
    found, why, locked, linked = _golden_on_host(host, on_host)
    status = damaged or ("skip" if locked else "fail")
    if linked is not None:
        return golden_damaged_check(host, on_host, "", status, linked=linked)
    if not found:
        detail = f"no golden set at {on_host} (record one with --record-golden)"
        return Check(name="identity", status="skip", detail=detail), None
    if why is not None:
        return golden_damaged_check(host, on_host, why, status)
    args = [*base, "--golden", on_host, "--aa-runs", str(aa_runs)]
    res = host.run_module(
        "checks.identity",
        args,
        cwd=data_plane_dir(host),
        timeout=IDENTITY_TIMEOUT_S,
        stdlib_only=True,
    )
    data = cast(IdentityDoc, res.data)
    if res.rc == 2:  # what this side could not see (bytes that are not UTF-8), or its own bad input
        message = str(data.get("message") or "bad input")
        if data.get("error") != "bad_golden":
            raise OpsError(f"{host.name}: checks.identity: {message}")
        return golden_damaged_check(host, on_host, message.removeprefix(f"{on_host}: "), status)
    return identity_check(data, recorded=False), data


def _golden_on_host(host: Host, path: str) -> tuple[bool, str | None, bool, str | None]:
    """The host's golden set, read (at most GOLDEN_MAX_BYTES) and judged in one round trip:
    (there is one, why it cannot judge or None, whether this ops holds the host's lock, where
    its directory points where it is a symlink: then nothing is read)."""
    root = shell_path(host.target.remote_root)
    script = (
        f"root={root}; f={shell_path(path)}; "
        'h="$root/lock.holder"; '
        'printf \'%s\\n\' "$([ -f "$h" ] && head -c 4096 "$h" 2>/dev/null | head -n 1)"; '
        'd=${f%/*}; if [ -L "$d" ]; then readlink -- "$d" | head -c 300; exit 6; fi; '
        '{ [ -e "$f" ] || [ -L "$f" ]; } || exit 3; [ -f "$f" ] || exit 5; '
        'n=$(wc -c < "$f") || exit 4; echo "$n"; '
        f'[ "$n" -le {GOLDEN_MAX_BYTES} ] || exit 0; cat -- "$f"'
    )
    res = host.run_script(script, step="golden set")
    holder, _, rest = res.stdout.partition("\n")
    locked = _held_by_us(holder)
    if res.rc == 6:
        return True, None, locked, shown_name(rest.strip()) or "?"
    if res.rc == 3:
        return False, None, locked, None
    if res.rc == 5:  # a FIFO, a directory, a device, a dangling link: never read
        why = "not a regular file (a FIFO, a directory, a device or a dangling link)"
        return True, why, locked, None
    size, _, text = rest.partition("\n")
    if res.rc != 0 or not size.strip().isdigit():
        return True, f"cannot be read ({res.tail(n=1) or f'exit {res.rc}'})", locked, None
    if int(size) > GOLDEN_MAX_BYTES or len(text) > GOLDEN_MAX_BYTES:
        why = f"more than {GOLDEN_MAX_BYTES // MIB} MiB, the limit for a golden set"
        return True, why, locked, None
    try:
        parse_golden(text)
    except ValueError as exc:
        return True, str(exc), locked, None
    return True, None, locked, None


def _held_by_us(note: str) -> bool:
    """Whether the host lock's note (`lock.holder`, see Host.lock) names this ops process."""
    try:
        info = json.loads(note)
    except (ValueError, RecursionError):  # (JSONDecodeError; an integer too long)
        return False
    return (
        isinstance(info, dict)
        and info.get("pid") == os.getpid()
        and info.get("host") == socket.gethostname()
    )


def hook_check(host: Host) -> Check:
    """What the release's SGLang import hook did in the running service, and what its shadow
    found (`checks.hook_counters` on `<remote_root>/current/run`: the hook's status, written at
    the service's start by integration/hook.py, the live processes' counters, the shadow's
    saved mismatching cases).

    fail: the setting asked for a drop-in, a shadow or a measure and it is not in place ("stock
    builder in use because ..."), the calls are not counted in a file (its directory could not
    be written), or a shadow's candidate answered otherwise than the stock (naming the saved
    cases); pass: `off`, or everything asked for is in place (its summary);
    skip: no status (no release, or no process ran the hook), or a service without the fork's
    module (nothing to replace: the reference engine)."""
    run = f"{host.target.remote_root}/current/run"
    try:
        doc = dict(run_check(host, "checks.hook_counters", ["--run", run]).data)
    except OpsError:  # a release from before the hook's clock: its status alone
        doc = _hook_status_only(host)
    st = doc.get("status")
    if not isinstance(st, dict):
        return Check(name="hook", status="skip", detail="no hook status (no release, or not run)")
    rel = st.get("release_id") or "?"
    current = doc.get("release") or ""
    stale = "" if rel == current else f" (status of release {rel}: not restarted since?)"
    evidence = [f"{k}: {v}" for k, v in (st.get("in_use") or {}).items()]
    cases = doc.get("mismatch_cases") or []
    files = doc.get("mismatch_files") or []
    if files or doc.get("mismatched"):
        named = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        first = cases[0] if cases else {}
        detail = (
            f"the shadow's candidate answered otherwise than the stock: {doc.get('mismatched', 0)}"
            f" mismatched calls in the live processes; saved cases in {run}: {named or 'none'}"
            + (
                f"; first: {first.get('component')} {first.get('candidate')}: "
                f"{first.get('difference')}"
                if first
                else ""
            )
            + f"; replay: python -m integration.shadow --replay {run}/<case> (release {rel})"
        )
        evidence += [f"{c.get('file')}: {c.get('difference')}" for c in cases]
        return Check(name="hook", status="fail", detail=detail + stale, evidence=evidence)
    reason = st.get("reason") or ""
    if not st.get("active") and reason.endswith("=off"):
        return Check(
            name="hook", status="pass", detail=f"stock functions: {reason} (release {rel}){stale}"
        )
    found = st.get("module_found", "not found:" not in reason)
    if not st.get("active") and not found:
        return Check(
            name="hook",
            status="skip",
            evidence=evidence,
            detail=f"the service has no fork module to act on: {reason} (release {rel}){stale}",
        )
    if not st.get("active"):
        return Check(
            name="hook",
            status="fail",
            evidence=evidence,
            detail=f"{st.get('summary') or 'stock functions in use because ' + reason}"
            f" ({_hook_setting(st)}, release {rel}){stale}",
        )
    counters = st.get("counters")
    if counters and not str(counters).endswith(".bin"):  # every setting but off asks to count
        return Check(
            name="hook",
            status="fail",
            evidence=evidence,
            detail=f"{st.get('summary')}; but calls are NOT counted where ops can read "
            f"them: {counters} ({_hook_setting(st)}, release {rel}){stale}",
        )
    replaced = st.get("replaced") or {}
    counting = f"; calls counted in {doc['live']} live processes" if doc.get("live") else ""
    what = ", ".join(f"{k} ({v})" for k, v in replaced.items())
    head = f"replaced {what}; " if what else ""
    return Check(
        name="hook",
        status="pass",
        evidence=evidence,
        detail=f"{head}{st.get('summary')}{counting} (release {rel}){stale}",
    )


def _unanswered(check: Any) -> bool:
    """A check of checks.health whose request got no HTTP answer at all (timed out, refused)."""
    http = check.get("http") if isinstance(check, dict) else None
    return isinstance(http, dict) and http.get("status") is None


def _hook_setting(st: dict[str, Any]) -> str:
    return f"DDTREE_OPS_SGLANG={st.get('spec')!r}"


def _hook_status_only(host: Host) -> dict[str, Any]:
    """The hook's status without checks.hook_counters (an older release on the host): the
    status file and the current release's id, as checks.hook_counters reports them."""
    root = host.target.remote_root
    script = (
        f"cur={shell_path(root + '/current')}; "
        'readlink "$cur" 2>/dev/null | sed "s#.*/##"; echo; '
        # a regular file only (a FIFO would hang the read), at most 1 MiB
        'f="$cur/run/hook-status.json"; [ -f "$f" ] && head -c 1048576 "$f" 2>/dev/null'
    )
    res = host.run_script(script, step="hook status")
    current, _, text = res.stdout.partition("\n")
    try:
        st = json.loads(text) if text.strip() else None
    except (ValueError, RecursionError):  # (nested too deep, an integer too long)
        st = None
    return {"release": current.strip(), "status": st if isinstance(st, dict) else None}
