"""`ops deploy`: put a self-tested release on a host atomically, switch to it, roll back by itself.

Steps, each timed and recorded: package (locally) -> preflight -> lock -> send (into
`releases/.staging-<id>`) -> build (nvcc for the target's arch, GPU targets) -> selftest (the
GPU under the bench guard's CUDA_VISIBLE_DEVICES, or the CPU builds on a target without GPUs)
-> finalize (release.json + service.env, one rename into `releases/<id>`) -> switch (`current`
by one rename(2)) -> restart -> postflight (full healthcheck, token identity) -> prune.

A failed build or self-test removes the staging directory and touches nothing else. Between
the switch and a passed post-flight, a guard process on the host holds `deploy.pending`: if ops
goes away (Ctrl-C, kill, lost connection) the guard switches `current` back and restarts the
service, so the host is left on its previous release and serving. A failed post-flight is
rolled back here, with the evidence of the checks before and after.

The host may have been touched by hand. A `current` that is not a symlink into `releases/`
(a hand-made hotfix copy, a link outside the root, a real directory) is named in the `current`
step, and the deploy refuses it without --force; with --force, what `current` was is recorded
as it is and any revert returns exactly there. The host always ends on a runnable release it
was on, or on the new one: a first install that fails is unlinked only after its service is
stopped, and a pending record that cannot be read whole leaves `current` as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import posixpath
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ops.deploy.host_actions import (
    ASK_AFTER_INTERRUPT_S,
    DEPLOY_HOST_SOURCE,
    Guard,
    current_unstartable,
    disk_fix,
    edited_since_installed,
    guard_log,
    host_releases,
    interrupted_once,
    revert_guard,
    stopped_guards,
)
from ops.deploy.release import (
    ReleaseManifest,
    default_source,
    release_time,
    service_env,
    stage_release,
)
from ops.deploy.result import (
    DETAIL_SHOWN,
    DeployInterrupted,
    DeployOptions,
    DeployResult,
    Outcome,
    Status,
    Step,
    StepFailed,
    clip_line,
    clip_lines,
    utc_now,
)
from ops.errors import (
    CommandTimedOut,
    HostError,
    ModuleLinkLost,
    ModuleOutputError,
    OpsError,
    Unreachable,
    taken_signal,
)
from ops.hosts.remote import Host, SignalsHeld, nested_root, shell_path, still_runs
from ops.hostside.release_files import edited_by_hand
from ops.measure.healthcheck import golden_on_host, run_healthcheck
from ops.sections.health import HealthReport
from ops.service.managers import ProcessManager, SystemdManager, manager_for, since_last_start

__all__ = [
    "DEPLOY_HOST_SOURCE",
    "DeployInterrupted",
    "Deployer",
    "DeployOptions",
    "DeployResult",
    "Step",
    "StepFailed",
    "host_releases",
]

BUILD_TIMEOUT_S = 1800
REVERT_WAIT_S = DeployOptions.model_fields["wait_s"].default  # a revert waits at least this


# The steps that change the host under its lock before the switch: refused once it is lost.
UNDER_THE_LOCK = ("send", "build", "selftest", "finalize", "switch")


def shown_state(state: dict[str, Any] | None) -> str | None:
    """What the host's `current` is, as results name it: a release id, else what is there."""
    if not state or state.get("kind") in (None, "none"):
        return None
    if state["kind"] == "release":
        return str(state["id"])
    if state["kind"] == "foreign":
        if state.get("aside"):
            return f"{state.get('link')} (the hand-made current a switch moved aside)"
        if state.get("exists"):
            return f"{state.get('link')} (a symlink ops did not make)"
        if state.get("release"):
            return f"{state.get('link')} (release {state['release']}, whose directory is gone)"
        return f"{state.get('link')} (a symlink to nothing: {state.get('resolves')} does not exist)"
    return f"{state.get('path')} (a real {state['kind']}, not a symlink)"


def named_release(state: dict[str, Any] | None) -> str | None:
    """The release id a `current` state names: a release of ops's, or one whose directory is
    gone since ops linked it (None: it names no release)."""
    state = state or {}
    return state.get("id") or state.get("release")


ASK_NOW: Any = object()  # a service status not asked for yet: ask when it is needed


def newer_release(a: str, b: str) -> bool:
    """Release `a` was made after release `b` (both ids as ops makes them; else False)."""
    ta, tb = release_time(a), release_time(b)
    return bool(ta and tb and ta > tb)


def proven_whole(listing: dict[str, Any]) -> set[str]:
    """The releases a way back may go to: proven, whole, never rejected."""
    return {
        str(r["id"])
        for r in listing["releases"]
        if r.get("proven") and not r.get("damaged") and not r.get("rejected")
    }


def _diverged(step: Step) -> list[str]:
    """The divergences a step's health report found, where token identity alone failed."""
    rep = step.data.get("report") or {}
    checks = [c for c in rep.get("checks") or [] if isinstance(c, dict)]
    if [c.get("name") for c in checks if c.get("status") == "fail"] != ["identity"]:
        return []
    return next((list(c.get("evidence") or []) for c in checks if c["name"] == "identity"), [])


def newest_proven(listing: dict[str, Any], other_code: bool = False) -> str | None:
    """The newest release other than current that passed a post-flight and may be switched to
    (whole, self-tested, never rolled back): where a lost `previous` leaves a rollback to go.
    With `other_code`, one whose code is not current's is taken first (a plain rollback that
    restarted onto current's very commit changed nothing: probe37at L3)."""
    rels = listing.get("releases") or []
    cur = next((r for r in rels if r.get("current")), None)
    same = None
    for rel in reversed(rels):
        if (
            rel.get("proven")
            and not rel.get("current")
            and not rel.get("damaged")
            and not rel.get("rejected")
            and rel.get("selftest_ok") is True
        ):
            if not other_code or cur is None or code_of(rel) != code_of(cur):
                return str(rel["id"])
            same = same or str(rel["id"])
    return same


def code_of(rel: dict[str, Any]) -> tuple[Any, ...]:
    """What a listed release runs: its commit, its components and its hook setting."""
    return rel.get("git_sha"), rel.get("components"), rel.get("hook")


class Deployer:
    """One deploy to one host; `run()` never raises for a failed step, it reports it."""

    def __init__(
        self, host: Host, opts: DeployOptions, progress: Callable[[str, Step | None], None]
    ) -> None:
        self.host, self.opts, self.progress = host, opts, progress
        host.on_wait = self._still_runs
        self.target = host.target
        self._began = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # guard.log's clock
        self.root = host.target.remote_root
        self.steps: list[Step] = []
        self._running: str | None = None  # the step in progress (what an interrupt stopped)
        self._before: str | None = None  # current release before this deploy, once known
        self._before_state: dict[str, Any] | None = None  # what `current` is, as it is
        self._switched: str | None = None  # the release switched to (pending until proven)
        self._committed: str | None = None  # the release switched to and proven
        self._blocked: str | None = None  # the restart met a cause outside the release
        self._outlasted = False  # the restart's process still ran at the end of a short --wait
        self._settle_first = False  # a deploy.pending to settle first (the recover step)
        self._pending_left = False  # a deploy.pending on the host at the last look
        self._fallback: str | None = None  # the newest proven release other than current
        self._proven: set[str] = set()  # the releases that passed a post-flight (whole)
        self._unrevertible: str | None = None  # why a revert could not put current back
        self._instead: str | None = None  # why a rollback took it instead of `previous`
        self._current_proven = True  # current's release passed a post-flight (once known)
        self._rolling_back = False  # an `ops rollback` switching (undone: not "rolled back")
        self._adopted: str | None = None  # the current a rollback found unserved, replaced
        self._no_way_back: str | None = None  # why a rollback's switch is final at once
        self._unchecked = False  # the post-flight passed with token identity NOT CHECKED
        self._rollback_final = False  # a failed deploy's switch back was made final
        self._golden_withheld: str | None = None  # a bootstrap's golden set not recorded: the
        # newest proven release on the host, which it is to be recorded from
        self._lingered = ""  # a settled guard that did not end when let go, said
        self._guard: Guard | None = None  # the revert guard of the switch under way
        self._rejected_at: tuple[str, str] | None = None  # (release, "at") of our rejection
        self._golden_suspect: str | None = None  # why the golden set, not the release, failed
        self._reinstalled: str | None = None  # why the same commit as current was installed
        self._current_edited: list[str] = []  # current's files changed since it was installed
        if self.target.service.manager == "process":
            # a service with no command can never start: refused before anything is sent, not
            # after a release was sent and finalized (probe37x L1: one left per attempt)
            ProcessManager.render_command(self.target)

    # -- step bookkeeping --------------------------------------------------------------
    def step(self, name: str, fn: Callable[[], tuple[Status, str, dict[str, Any]]]) -> Step:
        self._running = name  # before the progress line: a signal right after it names the step
        self.progress(name, None)
        t0 = time.monotonic()
        if name in UNDER_THE_LOCK and self.host.lock_lost():
            fn = self._lock_lost
        status, detail, data = fn()
        self._running = None
        evidence = clip_lines(data.pop("evidence", []))
        svc = data.get("service")
        if isinstance(svc, dict) and isinstance(svc.get("evidence"), list):
            data["service"] = {**svc, "evidence": clip_lines(svc["evidence"])}
        st = Step(
            name=name,
            status=status,
            seconds=round(time.monotonic() - t0, 3),
            detail=clip_line(detail, DETAIL_SHOWN),
            evidence=evidence,
            data=data,
        )
        self.steps.append(st)
        self.progress(name, st)
        if status == "fail":
            raise StepFailed(st)
        return st

    def _still_runs(self, what: str, ran: float, bound: float) -> None:
        """A host command that runs long, said as its step (or as itself between steps)
        with its bound (probe37bd M4, probe37bf M1: a hung self-test, a hung host python and
        a restart onto a service that never answers were each silent for minutes)."""
        self.progress(still_runs(self._running or what, ran, bound), None)

    def _lock_lost(self) -> tuple[Status, str, dict[str, Any]]:
        """A step that would change the host, refused: the host lock this deploy took lost its
        holder on the host (killed: the OOM killer, a hand's kill -9), and another deploy or
        rollback may run now (probe37q Q11), and may have moved current (probe37s S4: the deploy
        said "current is still R2" of a host a rollback had put on R1): asked, not assumed."""
        now, asked = self._ask_current()
        by = "rollback" if self._rolling_back else "deploy"
        return (
            "fail",
            "the host lock was lost (its holder on the host ended, killed, or its SSH connection "
            "stopped answering), so another deploy "
            f"or rollback may run now; this {by} switched nothing; {asked} (asked of the host)",
            {"asked": True, "now": now},
        )

    def result(self, outcome: Outcome, **kw: Any) -> DeployResult:
        return DeployResult(target=self.target.name, outcome=outcome, steps=self.steps, **kw)

    def _finalized(self) -> bool:
        """The release is in releases/: its finalize step went through."""
        return any(s.name == "finalize" and s.status == "ok" for s in self.steps)

    def _interrupted(self) -> DeployResult:
        """The result of a deploy or rollback that Ctrl-C stopped: the guard has done its work
        by now (the `with` blocks have exited), so ask the host where it was left."""
        during = (
            f"during {self._running}"
            if self._running
            else f"after {self.steps[-1].name}"
            if self.steps
            else "at the start"
        )
        now: str | None = None
        state = ""
        serving: str | None = None
        in_place = False  # the release is in releases/ (a finalize cut short may have landed)
        try:
            listing = host_releases(self.host, "list", timeout=ASK_AFTER_INTERRUPT_S)
            now = shown_state(listing.get("current_state"))
            rid = getattr(self, "_rid", None)
            in_place = bool(rid) and any(r.get("id") == rid for r in listing["releases"])
            if (
                self._switched
                and now == self._switched
                and not listing.get("pending")
                and not self._no_way_back  # (a switch made final at once: never proven yet)
            ):
                self._committed = self._committed or now  # the commit landed, its answer not
            if self._switched and not self.opts.no_restart:
                st = manager_for(self.host).status()
                state = f"; service {st.state}" + (f" ({st.detail})" if st.detail else "")
                serving = st.runs_release
        except OpsError as exc:
            state = f"; could not ask the host where it is: {exc.message}"
        if self._committed:
            what = f"{self._committed} was proven and switched to before the interrupt"
        elif self._switched and now != self._switched:
            what = f"the host's guard switched current back to {now or '(none)'}"
            restarted = None if self.opts.no_restart else self._guard_restarted()
            if serving is not None and serving != now:  # its restart did not take (a full disk)
                what += f", but the service still runs {serving}"
                if restarted is None and not self.opts.no_restart and now:
                    # not yet: the guard's restart waits for the one under way, whose wait
                    # for /health outlives ops (probe37bh M2: said "activating", no way on)
                    name = self.target.name
                    what += (
                        f" (the restart under way waits up to {self.opts.wait_s:g} s for it to "
                        f"answer; the guard's restart of {now} comes after it: ops service "
                        f"status {name} tells when {now} serves; if it does not once that "
                        f"restart has ended, ops service restart {name} starts it)"
                    )
            elif restarted is False:  # (probe37r R10: said "and restarted" of a refused one)
                what += (
                    ", but its restart did not start the service (logs/guard.log says why); "
                    f"ops service status {self.target.name} tells what runs"
                )
            elif restarted == "kept":  # (probe37bl M1: it was restarted for nothing)
                what += "; the service already ran it and was not restarted"
            elif restarted:
                what += " and restarted the service"
            elif not self.opts.no_restart:
                what += " and restarts the service (logs/guard.log says how it went)"
        elif self._switched:
            what = f"current is still {self._switched} (switched, not proven)"
            if self._guard is not None and self._guard.ended:  # (probe37be M2: unsaid)
                what += (
                    "; the host's revert guard did not put it back in time and was ended "
                    f"(stopped?): ops rollback {self.target.name} puts the host back and proves it"
                )
            if self._no_way_back:
                what += f"; no way back: {self._no_way_back}"
        elif self._adopted:  # only the adopt step's switch, onto what the service runs
            had = (
                "there had been no current"
                if self._adopted == "(none)"
                else f"it had been {self._adopted}, never served"
            )
            what = (
                f"current is {now or '(none)'}: made the release the service runs ({had}); "
                "nothing else was switched"
            )
        else:
            what = f"nothing was switched: current is still {now or '(none)'}"
            if in_place or self._finalized():
                # (probe37ao L2: a finalize cut short after its rename was called half-sent)
                rel = getattr(self, "_rid", None)
                what += f"; release {rel} is in place, never switched to (prune removes it)"
            elif any(s.name == "send" for s in self.steps):
                what += "; the next deploy removes the half-sent release"
        by = f" ({sig})" if (sig := taken_signal()) else ""  # (probe37u U6: SIGHUP unnamed)
        detail = f"interrupted{by} {during}: {what}{state}"
        st = Step(name="interrupted", status="fail", detail=detail)
        self.steps.append(st)
        self.progress("interrupted", st)
        return self.result(
            "interrupted",
            release=getattr(self, "_rid", None),
            before=self._before,
            after=now,
            failed_step=self._running or "interrupted",
            message=st.detail,
        )

    # -- the deploy ---------------------------------------------------------------------
    def run(self) -> DeployResult:
        """The deploy; raises DeployInterrupted (a KeyboardInterrupt) on Ctrl-C."""
        with interrupted_once():
            try:
                return self._run()
            except KeyboardInterrupt:
                raise DeployInterrupted(self._interrupted()) from None

    def _run(self) -> DeployResult:
        with tempfile.TemporaryDirectory(prefix="ops-release-") as tmp:
            stage = Path(tmp) / "release"
            try:
                manifest = self._package(stage)
                same = self._already_current(manifest)  # reads the host; a dry run too
                if same is None and self._settle_first and not self.opts.dry_run:
                    with self.host.lock(f"ops deploy {manifest.id}"):
                        back = self._prepared(host_releases(self.host, *self._prepare_args()))
                        same = self._already_current(manifest, settled=True)
                        if same is not None:
                            return self._recovered_here(same, back)
                if same is not None:
                    return same
                self.step("current", self._current)
                if self.opts.dry_run:
                    return self._plan(manifest)
                # --bootstrap is for a first install: on a host that already has a current
                # release it is no way around the pre-flight (that is --force)
                if not self.opts.bootstrap or self._before is not None:
                    # another command at work on the host (a deploy's restart) is named, not
                    # measured as an unhealthy service (probe37af M2: "start it ... or --force")
                    with self.host.lock(f"ops deploy {manifest.id} (pre-flight)"):
                        pass
                    self.step("preflight", self._preflight)
                with self.host.lock(f"ops deploy {manifest.id}"):
                    return self._locked(manifest, stage)
            except StepFailed as exc:  # before the switch: the host is where it was
                after, message = self._unswitched(exc.step)
                return self.result(
                    "failed",
                    failed_step=exc.step.name,
                    message=message,
                    release=getattr(self, "_rid", None),
                    before=self._before,
                    after=after,
                )

    def _package(self, stage: Path) -> ReleaseManifest:
        holder: dict[str, ReleaseManifest] = {}

        def package() -> tuple[Status, str, dict[str, Any]]:
            t = self.target
            m = stage_release(
                stage,
                source=self.opts.source,
                ref=self.opts.ref,
                allow_dirty=self.opts.allow_dirty,
                target=t.name,
                cuda_arch=t.cuda_arch,
                components=dict(t.service.components),
                hook=t.service.hook,
            )
            holder["m"] = m
            self._rid = m.id
            return "ok", f"{m.id} ({len(m.files)} files, git {m.git_sha[:12]})", {}

        self.step("package", package)
        return holder["m"]

    def _already_current(self, m: ReleaseManifest, settled: bool = False) -> DeployResult | None:
        """The result for a release that is already current (same commit and configuration).
        A deploy.pending on the host is settled first (the recover step, under the lock, as
        every deploy does): None then, with `_settle_first` set, unless `settled`."""
        listing = host_releases(self.host, "list")
        if listing.get("nested"):  # as the lock refuses it; said by a --dry-run too
            top = listing["nested"]
            raise HostError(nested_root(self.root, top), target=self.target.name, step="lock")
        self._before_state = listing.get("current_state")
        self._unrevertible = listing.get("current_unrevertible")
        self._before = listing["current"] or shown_state(self._before_state)
        self._fallback = newest_proven(listing)
        self._proven = proven_whole(listing)
        current = next((r for r in listing["releases"] if r["current"]), None)
        self._current_proven = bool(current and current.get("proven"))
        self._current_edited = list((current or {}).get("code_edited") or [])
        self._downgrade = self._older_than(m, current)
        self._pending_left = bool(listing.get("pending"))
        if self._pending_left and not settled:  # the recover step first (probe37d F3), so
            # that `current` weighs the host as the recover step leaves it (probe37au L1: a
            # rollback's switch, its rollback and guard killed, was blamed on --no-restart)
            self._settle_first = True
            return None
        if (
            current is None
            or m.dirty
            or current["git_sha"] != m.git_sha
            or current["components"] != m.components
            or current.get("hook") != m.hook
        ):
            return None
        edited = current.get("code_edited") or []
        if edited:  # not the commit as built: installed anew, and said (a deploy of the same
            # commit said "nothing to do" of a current edited by hand)
            self._reinstalled = (
                f"{current['id']}, current, holds the same commit, but "
                + edited_by_hand("its", edited)
                + ": installed anew"
            )
            return None
        cur = current["id"]
        msg = f"release {cur} (git {m.git_sha[:12]}) is already current"
        down = None if self.opts.no_restart else self._not_serving(cur, current.get("proven"))
        if down is not None:  # said, and not exit 0; started only by the operator (see below)
            return self.result(
                "failed",
                failed_step="service",
                release=cur,
                before=cur,
                after=cur,
                message=f"{msg}, but {down}",
            )
        return self.result(
            "already-current", release=cur, before=cur, after=cur, message=f"{msg}; nothing to do"
        )

    def _runs_other(self, state: dict[str, Any]) -> str | None:
        """Why a deploy over current is refused where the service runs another release (current
        installed with --no-restart, or switched by hand without a restart): a failed deploy
        reverts to current and restarts the service there, on code that never served (probe37v
        V3: the service, healthy on the release it ran, was left down). None where it runs
        current, or where that cannot be told (not running, systemd, not a release of ours)."""
        if state.get("kind") != "release" or self.opts.no_restart:
            return None
        seen = self._service_now()
        runs = self._running_release(seen)
        name, cur = self.target.name, state["id"]
        gone = seen.release_gone if seen is not None and seen.active else None
        if runs is None and gone and not self._current_proven:
            # the release it runs is gone from releases/ (removed or moved by hand): a failed
            # deploy goes back to current, which never served (probe37ao H1: left down)
            return (
                f"the service runs {gone}, whose directory is gone from releases/ "
                f"({self._gone_where(seen)}), and current ({cur}) never passed a post-flight: "
                f"a failed deploy would go back to {cur} and restart the service on it, with no "
                f"way back to what serves; {self._keep_way(seen, cur, self._fallback)}"
            )
        down = seen is not None and seen.state in ("inactive", "failed")  # (not a start
        # under way, another deploy's restart: the lock names its holder)
        if runs is None and down and not self._current_proven:
            # nothing serves to vouch for current (probe37ar M1: after a maintenance stop, a
            # failed `deploy --force` went back to a --no-restart install and started it)
            back, last = self._fallback, seen.last_ran
            if last in self._proven and last != cur:  # (probe37at L2: as `service start` says)
                return (
                    f"the service is {seen.state}, and current ({cur}) never passed a "
                    f"post-flight: a failed deploy would go back to {cur} and start the service "
                    f"on code that never served; `ops rollback {name} --to {last}` makes the "
                    "release it last ran current and starts the service on it"
                )
            way = (
                f"`ops rollback {name} --to {back}` makes the newest proven release current and "
                "starts the service on it"
                if back
                else f"`ops rollback {name} --to ID` makes a proven release current"
            )
            return (
                f"the service is {seen.state}, and current ({cur}) never passed a post-flight: "
                f"a failed deploy would go back to {cur} and start the service on code that "
                f"never served; {way}, or `ops service start {name}` runs {cur} first"
            )
        if runs is None or runs == cur:
            return None
        if self._pending_left:  # (a dry run: a deploy settles the record first, said below)
            return None
        said = (
            f"the service runs {runs}, not current ({cur}, installed with --no-restart or "
            f"switched by hand?): a failed deploy would go back to {cur} and restart the service "
            "on it; "
        )
        if not self._current_proven:  # (probe37y M2: said, and the way back first)
            return said + (
                f"{cur} never passed a post-flight: `ops rollback {name} --to {runs}` makes "
                f"what runs current; `ops service restart {name} --force` would run {cur}, "
                "with no way back if it fails"
            )
        return said + (
            f"`ops service restart {name}` runs {cur} (then deploy), or "
            f"`ops rollback {name} --to {runs}` makes what runs current"
        )

    def _service_now(self) -> Any:
        """The service's status now (None: the host did not answer). A step that weighs several
        things about the service asks once and passes the answer on: one view, one round
        trip."""
        try:
            return manager_for(self.host).status()
        except HostError:
            return None

    def _running_release(self, seen: Any = ASK_NOW) -> str | None:
        """The release of this root the service runs, where it is active (None: not active,
        not run from a release, or that cannot be told: systemd, a host that did not answer).
        `seen`: a status already asked for (None: unknown); by default it is asked now."""
        st = self._service_now() if seen is ASK_NOW else seen
        return st.runs_release if st is not None and st.active else None

    def _edited(self, rid: str | None) -> str | None:
        """What of release `rid` was changed by hand since it was installed (None: nothing, or
        the host did not say)."""
        try:
            return edited_since_installed(host_releases(self.host, "list"), rid)
        except OpsError:
            return None

    def _untried(self, state: dict[str, Any]) -> str | None:
        """Why a deploy is refused where current's service.env or code changed after the
        service started on it: a failed deploy reverts to current and restarts the service with
        the change, which never ran (probe37au H1: an edited service.env did not start, and the
        host was left down). None otherwise, and for --no-restart (its revert restarts
        nothing)."""
        if self.opts.no_restart or state.get("kind") == "none":
            return None
        seen = self._service_now()
        if seen is None or not seen.lives or not seen.untried:
            return None
        return (
            f"{seen.untried}; a failed deploy would go back there: "
            f"{self._untried_mend(self.target.name)}, then deploy"
        )

    @staticmethod
    def _untried_mend(name: str) -> str:
        """The way on where current's service.env or code, or the service's command, changed
        after the service started."""
        return (
            "put back what changed as it was (current's service.env and files as installed: "
            "release.json records their sha256; the inventory's service.command); or try the "
            f"change first: ops service restart {name}, knowing that a failed start leaves no "
            "service"
        )

    def _current_lost(self, state: dict[str, Any]) -> str | None:
        """Why a deploy is refused where there is no `current` but the service runs a release
        of this root (`current` removed by hand): a deploy would take it for a first install,
        whose failure stops the service with no release to go back to (probe37af H1)."""
        if state.get("kind") != "none":
            return None
        runs = self._running_release()
        if runs is None:
            return None
        name = self.target.name
        return (
            f"there is no current, but the service runs release {runs} of this root (current "
            f"removed by hand?): a failed deploy would stop it with no release to go back to; "
            f"`ops rollback {name} --to {runs}` makes it current (no restart), then deploy"
        )

    def _not_serving(self, cur: str, proven: bool | None, seen: Any = ASK_NOW) -> str | None:
        """Why the service of a release that is already current does not serve (None: it
        does). A deploy that has nothing to install does not start it: it may have been stopped
        on purpose (`ops service stop` for maintenance), and a deploy with nothing to do must
        not undo that; but it does not exit 0 either, which says "current and serving" for
        every other deploy (probe37b: exit 0 "already current" over a stopped service).
        `seen`: a status already asked for (None: the host did not answer)."""
        if seen is ASK_NOW:
            try:
                seen = manager_for(self.host).status()
            except HostError as exc:
                return f"its service's state is unknown: the host did not answer ({exc.message})"
        if seen is None:
            return "its service's state is unknown: the host did not answer"
        st = seen
        name = self.target.name
        if st.active:  # and from current? (`--no-restart`, another inventory on this root)
            runs = st.runs_release
            if runs is None or runs == cur:
                return None
            if not proven:  # a restart has no way back: refused without --force
                return (
                    f"its service runs {runs}, not {cur}; {cur} never passed a post-flight: "
                    f"nothing was installed or restarted; `ops rollback {name} --to {runs}` "
                    f"makes what runs current, then `ops deploy {name}` proves this commit "
                    "with a way back"
                )
            return (
                f"its service runs {runs}, not {cur}: nothing was installed or "
                f"restarted; `ops service restart {name}` restarts it on {cur} "
                f"(`ops healthcheck {name}` then checks it)"
            )
        what = f"its service is {st.state}" + (f" ({st.detail})" if st.detail else "")
        how = "start" if st.state == "inactive" else "restart"
        return (
            f"{what}: nothing was installed or started; `ops service {how} {name}` starts it "
            f"(`ops healthcheck {name}` then checks it)"
        )

    def _older_than(self, m: ReleaseManifest, current: dict[str, Any] | None) -> str | None:
        """A notice when the commit deployed is an ancestor of the current release's commit
        (`--ref HEAD~1`, an old branch): a downgrade is allowed, but never silent."""
        cur = (current or {}).get("git_sha")
        if not cur or m.dirty or cur == m.git_sha:
            return None
        res = subprocess.run(
            [
                "git",
                "-C",
                str(self.opts.source or default_source()),
                "merge-base",
                "--is-ancestor",
                m.git_sha,
                cur,
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )
        if res.returncode != 0:
            return None  # newer, a side branch, or a commit this checkout does not have
        return f"a downgrade: git {m.git_sha[:12]} is older than the current release's {cur[:12]}"

    def _current(self) -> tuple[Status, str, dict[str, Any]]:
        """What `current` is on the host; one that ops did not put there is refused without
        --force (and with it, recorded as it is, so a revert returns exactly there). One that a
        revert could not bring back serving (it points at nothing, or its release could not be
        started again: no service.env) is refused, --force or not."""
        state = self._before_state or {"kind": "none"}
        data = {"state": state}
        if state["kind"] == "foreign" and not state.get("exists"):
            said = f"current is {shown_state(state)}"
            seen = self._service_now()
            if seen is not None and seen.active:  # it serves: a rollback would stop it with
                # no way back too (probe37as H1, probe37at M1)
                way = self._keep_way(seen, named_release(state), self._fallback)
                return "fail", f"{said}; a failed deploy could only revert to it: {way}", data
            fresh = f"remove {self.root}/current to deploy as a first install"
            return "fail", f"{said}; {self._no_revert(fresh)}", data
        if state["kind"] != "none":
            why = current_unstartable(self.host)
            if why:
                data["unstartable"] = why
                said = f"current ({shown_state(state)}) could not be started again: {why}"
                seen = self._service_now()
                if seen is not None and seen.active:  # a rollback would stop it with no way
                    # back too (probe37at H2): mend it, or stop knowingly first
                    way = self._keep_way(seen, named_release(state), self._fallback)
                    return "fail", f"{said}; a failed deploy could only revert to it: {way}", data
                return "fail", f"{said}; {self._no_revert('mend it, then deploy')}", data
        bad = self._unrevertible
        if bad:  # --force or not
            data["unrevertible"] = bad
            name, back = self.target.name, self._fallback
            copy = (
                f"mend releases/{state['id']} if it is good after all, then deploy"
                if state["kind"] == "release"
                else "make it a whole copy of a release (release.json, service.env) and --force"
            )
            fix = (
                f"ops rollback {name} --to {back} puts back the newest proven release; or {copy}"
                if back
                else f"{copy}, or remove {self.root}/current to deploy as a first install"
            )
            seen = self._service_now()
            if seen is not None and seen.active:  # it serves: a rollback would stop it with
                # no way back too (probe37as H1, probe37at H2)
                fix = self._keep_way(seen, named_release(state), back, mend=copy)
            said = f"current is {shown_state(state)}, which a failed deploy could not put back"
            return "fail", f"{said} ({bad}): {fix}", data
        edited = self._untried(state)
        if edited:  # --force or not: its revert would restart the service with an untried edit
            data["untried"] = edited
            return "fail", edited, data
        lost = self._current_lost(state)
        if lost:  # --force or not: its failure would stop the service, with nothing to go back to
            data["runs"] = lost
            return "fail", lost, data
        other = self._runs_other(state)
        if other:  # --force or not: its revert would restart the service on what never ran
            data["runs"] = other
            return "fail", other, data
        if state["kind"] in ("release", "none"):
            note = getattr(self, "_downgrade", None)
            if self._pending_left:  # (a dry run's look: a deploy settles the record first)
                note = (
                    "a deploy.pending is left by a deploy or rollback that died before it "
                    "settled: a deploy's recover step settles it first, then looks again"
                )
            if note:
                data["downgrade"] = note
            return (
                "ok",
                (self._before or "(none)")
                + (f"; {note}" if note else ""),  # no "current: current:"
                data,
            )
        what = f"current is {shown_state(state)}, not a release ops installed"
        if self.opts.force:
            data["forced"] = True
            return "ok", f"{what}; deploying anyway (--force): a revert returns it exactly", data
        return "fail", f"{what}; check it, then deploy with --force (a revert puts it back)", data

    def _back_on(self, rid: str, after: str | None) -> str:
        """Where a failed switch to `rid` left the host, put back on `after`: a deploy "rolled
        back"; an `ops rollback` was undone (it did not roll back: it is where it started)."""
        if self._rolling_back:
            return f"the rollback to {rid} was undone: {after}, where it started, is current again"
        return f"rolled back to {after}"

    @staticmethod
    def _gone_where(seen: Any) -> str:
        """Where the service runs from, its release's directory gone from releases/."""
        cwd = seen.runs_from or ""
        if cwd.endswith(" (deleted)") or not cwd:
            return "deleted under it"
        return f"moved by hand: it runs from {cwd}"

    def _keep_way(
        self, seen: Any, current: str | None, to: str | None, mend: str = "mend current first"
    ) -> str:
        """The way on where the service serves and nothing could start what it runs again (its
        release's directory gone from releases/, renamed there, or `current` not one a switch
        back returns to): a rollback, or a failed deploy's revert, that stops it has no way
        back (probe37as H1, probe37at H1, H2: the release rolled back to failed to start, and
        the host was left down). Put the directory back where it was moved or renamed (then
        make it current, where `current` names another release); or stop the service
        knowingly and roll back (`--to to`, where given)."""
        name, cwd = self.target.name, seen.runs_from or ""
        back = f" --to {to}" if to else ""
        stop = (
            f"ops service stop {name}, then ops rollback {name}{back}, knowing that a failed "
            "start then leaves no service"
        )
        if cwd.endswith(" (deleted)") or not cwd:
            return stop
        gone, dirname = seen.release_gone, seen.runs_release
        if not gone and dirname in self._proven and dirname != current:  # a whole release:
            # adopted, with a way back (current a link to nothing, a file: probe37f F2)
            return f"ops rollback {name} --to {dirname} makes what the service runs current"
        home = gone or (current if dirname and current and dirname != current else None)
        if home is None:  # (current damaged, or a copy of one: it cannot be put back here)
            return f"{mend}; or {stop}"
        adopt = (
            f", then ops rollback {name} --to {home} makes it current with no restart"
            if current != home
            else ""
        )
        dest = shlex.quote(f"{self.root}/releases/{home}")
        taken = self.host.run_script(f"[ -e {dest} ] || [ -L {dest} ]", step="way back").ok
        if taken:  # a bare mv would move it inside (probe37ax M1: two directories swapped)
            return (
                f"{dest} is taken by another directory (swapped by hand?): move that aside "
                f"first (mv -T {dest} {dest}.aside), then mv -T {shlex.quote(cwd)} {dest} puts "
                f"it back{adopt}; or {stop}"
            )
        return f"mv -T {shlex.quote(cwd)} {dest} puts it back{adopt}; or {stop}"

    def _no_revert(self, otherwise: str) -> str:
        """Why a deploy over a `current` that could not serve again is refused, and the fix: the
        exact rollback to the newest proven release (a plain one may take `previous`), else
        `otherwise`."""
        name, back = self.target.name, self._fallback
        fix = otherwise
        if back:
            fix = f"ops rollback {name} --to {back} puts back the newest proven release"
        return f"a failed deploy could only revert to it: {fix}"

    def _plan(self, m: ReleaseManifest) -> DeployResult:
        t, rel = self.target, f"{self.root}/releases/{m.id}"
        first = self.opts.bootstrap and self._before is None
        plan = [
            (
                "preflight",
                "skipped (--bootstrap, no current release)" if first else "ops healthcheck",
            ),
            ("lock", f"flock {self.root}/lock"),
            ("send", f"{len(m.files)} files -> {self.root}/releases/.staging-{m.id}"),
            (
                "build",
                f"python -m kernels.build --arch {t.cuda_arch} --out {rel}/build"
                if t.gpus
                else "skipped (no GPU on target)",
            ),
            (
                "selftest",
                "python -m kernels.selftest"
                + (f" on GPU {self._bench_gpu()}" if t.gpus else " (CPU builds only)"),
            ),
            ("finalize", f"release.json, service.env -> {rel}"),
            ("switch", f"{self.root}/current: {self._before or '(none)'} -> releases/{m.id}"),
            ("restart", "skipped (--no-restart)" if self.opts.no_restart else self._svc_desc()),
            ("postflight", "ops healthcheck (token identity against the golden set)"),
            ("prune", f"keep the newest {self.opts.keep} releases"),
        ]
        for name, what in plan:
            self.steps.append(Step(name=name, status="skip", detail=f"plan: {what}"))
        env = service_env(rel, m).strip().splitlines()[1:]
        return self.result(
            "dry-run",
            release=m.id,
            before=self._before,
            after=m.id,
            message="service.env: " + "; ".join(env),
        )

    def _svc_desc(self) -> str:
        svc = self.target.service
        if svc.manager == "systemd":
            return f"sudo -n systemctl restart {svc.name}"
        return f"process manager: {ProcessManager.render_command(self.target)} (from current/)"

    def _bench_gpu(self) -> int:
        return self.target.bench_gpu if self.target.bench_gpu is not None else 0

    def _health(self, record: bool) -> HealthReport:
        return run_healthcheck(
            self.host, record_golden=record, timeout=60, max_tokens=self.opts.max_tokens
        )

    def _golden_exists(self) -> bool:
        """Anything at the golden set's path (a FIFO or a directory too: the healthcheck calls
        it damaged, never replaced unsaid by a fresh recording)."""
        path = shlex.quote(golden_on_host(self.host))
        return self.host.run_script(f"[ -e {path} ] || [ -L {path} ]", step="golden set").ok

    def _preflight(self) -> tuple[Status, str, dict[str, Any]]:
        record = not self._golden_exists()
        if record and not self._current_proven and self._fallback:  # (probe37ax H1: a golden
            # set recorded from a release that never passed a post-flight judged the proven
            # ones by its tokens: the good release was rejected, the rollback to it undone)
            name = self.target.name
            return (
                "fail",
                f"there is no golden set on the host, and current ({self._before}) never passed "
                "a post-flight: a golden set recorded from it would judge every release by its "
                f"tokens; ops rollback {name} --to {self._fallback} goes to the newest proven "
                f"release, then ops healthcheck {name} --record-golden records one from it",
                {"recorded_golden": False},
            )
        if record and self._current_edited:  # (probe37bi H1: recorded from code edited by
            # hand, the golden set failed every correct release after it)
            name = self.target.name
            return (
                "fail",
                "there is no golden set on the host, and "
                + edited_by_hand(f"current ({self._before})'s", self._current_edited)
                + ": a golden set recorded from that code would judge every release by it; "
                "put the files back "
                f"(or deploy its commit anew), then ops healthcheck {name} --record-golden",
                {"recorded_golden": False},
            )
        rep = self._health(record)
        data = {"report": rep.model_dump(mode="json"), "recorded_golden": record}
        if rep.ok:
            return "ok", "healthy" + (" (golden recorded now)" if record else ""), data
        failed = ", ".join(rep.failed)
        if self.opts.bootstrap:
            failed += f"; --bootstrap does not skip it: {self._before} is current"
        if self.opts.force:
            data["forced"] = True
            data["evidence"] = [f"{c.name}: {c.detail}" for c in rep.checks if c.status == "fail"]
            return "ok", f"UNHEALTHY ({failed}), deploying anyway (--force)", data
        data["evidence"] = [f"{c.name}: {c.detail}" for c in rep.checks if c.status == "fail"]
        damaged = [c for c in rep.checks if c.status == "fail" and "is damaged" in c.detail]
        linked = [c for c in rep.checks if c.status == "fail" and " is not read: " in c.detail]
        if rep.failed == ["identity"] and linked:  # its directory a link (probe37bo M1)
            return "fail", f"{linked[0].detail}; then deploy", data
        if rep.failed == ["identity"] and damaged:  # the golden set's fault, not the service's
            return (
                "fail",
                "the golden set on the host is damaged, so token identity cannot be checked: "
                f"re-record it on the unchanged service (ops healthcheck {self.target.name} "
                "--record-golden), then deploy",
                data,
            )
        name = self.target.name
        if rep.failed == ["identity"] and self._current_proven and self._before:
            # (probe37bf M2: it named --force, and the forced deploy was judged by the same set)
            return (
                "fail",
                f"current ({self._before}) passed a post-flight before and now fails token "
                "identity alone: the service changed under it (its model's "
                f"files?) or the golden set did; ops healthcheck {name} shows where they "
                f"differ, and once the service's answers are trusted, ops healthcheck {name} "
                "--record-golden records a golden set from them; then deploy",
                data,
            )
        fix = (
            f"start it (ops service start {name}) and deploy again"
            if "service" in rep.failed
            else f"ops healthcheck {name} says why"
        )
        stopped = next(
            (c.detail for c in rep.checks if c.status == "fail" and "is stopped (SIG" in c.detail),
            None,
        )
        service = next((c.detail for c in rep.checks if c.name == "service"), "")
        if "not this service: a start would be refused" in service:  # (probe37bh L1)
            fix = (
                f"another program holds its port (ops service status {name} names it): stop "
                "it, or give the service a free port (docs/inventory.md), then deploy again"
            )
        elif stopped:  # a start would do nothing (probe37u U7): the service's own words
            fix = f"{stopped.split(': ', 1)[-1]}, then deploy again"
        elif ": activating: " in service:  # its process lives: a start does nothing
            fix = (
                f"its process runs but does not answer (ops service status {name} says what "
                f"it is; ops service restart {name} starts it again), then deploy again"
            )
        return "fail", f"service unhealthy before the deploy ({failed}): {fix}, or --force", data

    def _locked(self, m: ReleaseManifest, stage: Path) -> DeployResult:
        self.step("lock", lambda: ("ok", f"{self.root}/lock", {}))
        if self.opts.bootstrap and self.target.service.manager == "systemd":
            self.step("drop-in", self._dropin)
        prep = host_releases(self.host, *self._prepare_args())
        back = self._prepared(prep)  # said before an "already current" too (probe37d F3)
        same = self._already_current(m, settled=True)
        if same is not None:
            return self._recovered_here(same, back)
        if self._unrevertible or (
            (self._before_state or {}).get("kind") not in ("release", "none")
            and not self.opts.force
        ):
            self.step("current", self._current)  # changed by hand since the first look
        before = self._before
        staging = f".staging-{m.id}"
        staging_path = f"{self.root}/releases/{staging}"

        def send() -> tuple[Status, str, dict[str, Any]]:
            try:
                self.host.put_tree(stage, staging_path)
            except (Unreachable, CommandTimedOut):
                raise  # the link's trouble: the deploy says where the host was left
            except HostError as exc:  # the host's (a full disk): a failed step, nothing switched
                fix = disk_fix(exc.message, self.root)
                # one line: the console shows a step's first (probe37bd L2: only tar's "Wrote
                # only 9216 of 10240 bytes" was seen, the cause and the fix in the record)
                why = "; ".join(ln.strip() for ln in exc.message.splitlines() if ln.strip())
                said = f"could not send the release: {why}{fix}"
                return "fail", said, {"disk": True} if fix else {}
            cleaned = prep["removed"]
            note = f"; removed leftovers of dead deploys: {', '.join(cleaned)}" if cleaned else ""
            return "ok", f"{len(m.files)} files -> {staging_path}{note}", {"cleaned": cleaned}

        try:
            self.step("send", send)
            m.build = self.step("build", lambda: self._build(staging_path)).data.get("manifest")
            m.selftest = self.step("selftest", lambda: self._selftest(staging_path)).data
        except StepFailed:
            with contextlib.suppress(HostError):  # a lost link: the next deploy's prepare does it
                self.host.run(["rm", "-rf", "--", staging_path], warn=True, step="clean up")
            raise
        rel = f"{self.root}/releases/{m.id}"
        env = service_env(rel, m)
        m.service_env_sha256 = hashlib.sha256(env.encode("utf-8")).hexdigest()  # (an edit said)
        doc = {"release_json": m.model_dump_json(indent=1), "service_env": env}

        def finalize() -> tuple[Status, str, dict[str, Any]]:
            try:
                done = host_releases(
                    self.host, "finalize", staging, m.id, stdin=json.dumps(doc).encode()
                )
            except OpsError as exc:  # a full disk: the staging directory goes, nothing else
                self.host.run(["rm", "-rf", "--", staging_path], warn=True, step="clean up")
                disk = bool(disk_fix(exc.message, self.root))
                return "fail", f"finalize failed: {exc.message}", {"disk": True} if disk else {}
            return "ok", rel, done

        self.step("finalize", finalize)
        return self._switch_and_prove(m.id, before)

    def _prepare_args(self) -> tuple[str, ...]:
        """`prepare` waits up to 240 s for a dead deploy's guard; where this run restarts the
        service, a switch it puts back stays recorded (settled) until that restart is done."""
        return ("prepare", "240") if self.opts.no_restart else ("prepare", "240", "settle")

    def _prepared(self, prep: dict[str, Any]) -> dict[str, Any] | None:
        """Say what `prepare` found: a dead deploy's guard waited for, a switch put back. A
        switch put back means the service may still run the never-proven release (its deploy
        and guard both died): it is restarted on what `current` now says. Returns the put-back
        switch ({from, to}), if there was one."""
        back = prep.get("put_back")
        waited = prep.get("guard_waited_s") or 0
        mended = prep.get("mended") or []
        if not back and waited < 1 and not mended:
            return None
        moved = bool(back) and not back.get("note") and bool(back.get("restart"))

        def recover() -> tuple[Status, str, dict[str, Any]]:
            detail = f"waited {waited:g} s for an earlier deploy's guard" if waited >= 1 else ""
            if mended:
                detail += ("; " if detail else "") + "; ".join(mended)
            if back:
                detail += "; " if detail else ""
                who = "rollback" if back.get("by") == "rollback" else "deploy"
                went, to = back.get("from") or "(none)", back.get("to") or "(none)"
                detail += back.get("note") or (
                    f"put back a switch no {who} settled: current {went} -> {to}"
                    if went != to  # (settled: put back before, only its restart was due)
                    else f"a switch no {who} settled was already put back: current is {to}"
                )
            if not moved or self.opts.no_restart:
                return "ok", detail, dict(prep)
            seen = self._service_now()
            runs = self._serves(back.get("to"), seen)
            if runs is not None:  # its restart was done, or never due (probe37ae M2)
                try:
                    host_releases(self.host, "commit")
                except OpsError as exc:
                    detail += f"; deploy.pending could not be cleared: {exc.message}"
                back["restarted"] = False
                detail += f"; the service already runs it: not restarted ({runs.state})"
                return "ok", detail, {**prep, "service": runs.model_dump()}
            other = self._serves_other(back, seen)
            if other:  # (probe37ah H1: restarted onto code that never ran: down)
                try:
                    host_releases(self.host, "commit")
                except OpsError as exc:
                    detail += f"; deploy.pending could not be cleared: {exc.message}"
                back["restarted"], back["runs"] = False, other
                detail += (
                    f"; the service runs {other}, and {back.get('to')} never passed a "
                    "post-flight: the service was not restarted onto it"
                )
                return "ok", detail, dict(prep)
            held = SignalsHeld()  # the switch is back: a Ctrl-C waits for its restart
            try:
                st = manager_for(self.host).restart(self._revert_wait())
                if st.active:  # done: the record the next prepare would redo goes
                    host_releases(self.host, "commit")
            except (HostError, OpsError) as exc:
                held.release()
                said = f"{detail}; the service could not be restarted: {exc.message}"
                return "fail", said, dict(prep)
            held.release()
            detail += f"; service restarted on it: {st.state}"
            return ("ok" if st.active else "fail"), detail, {**prep, "service": st.model_dump()}

        self.step("recover", recover)
        return back if moved else None

    @staticmethod
    def _recovered_here(same: DeployResult, back: dict[str, Any] | None) -> DeployResult:
        """The "already current" result, said as the recover step's doing where that step moved
        the host here (probe37ap L1: "unchanged", "nothing to do", of a host whose current and
        service it had just moved)."""
        went = (back or {}).get("from")
        if went and same.outcome == "already-current" and went != same.after:
            same.before = went
            same.message = (
                f"the recover step put back a switch no deploy settled ({went} -> "
                f"{same.after}); {same.message.removesuffix('; nothing to do')}: nothing "
                "else to do"
            )
        return same

    def _serves_other(self, back: dict[str, Any], seen: Any) -> str | None:
        """The release the service runs where a switch put back onto `back["to"]` must not
        restart it: `to` never passed a post-flight (a --no-restart install) and the service
        serves a third release, neither `to` nor the one switched away from (which the put-back
        is there to undo), except a rollback's, whose `to` was always what served. None: restart
        as the put-back says."""
        to, went = back.get("to"), back.get("from")
        runs = self._running_release(seen)
        if runs is None or runs == to or (runs == went and back.get("by") != "rollback"):
            return None
        try:
            listing = host_releases(self.host, "list")
        except OpsError:
            return None
        rel = next((r for r in listing.get("releases") or [] if r["id"] == to), None)
        return runs if rel is not None and not rel.get("proven") else None

    def _serves(self, rid: str | None, seen: Any) -> Any:
        """`seen`, the service's status, where it is active and runs from releases/`rid` (None
        where it does not, or that cannot be told: systemd names no working directory, the host
        did not answer): a switch put back onto what the service runs needs no restart."""
        if not rid or seen is None:
            return None
        return seen if seen.active and seen.runs_release == rid else None

    def _dropin(self) -> tuple[Status, str, dict[str, Any]]:
        mgr = manager_for(self.host)
        assert isinstance(mgr, SystemdManager)
        path, body = mgr.install_dropin()
        return "ok", f"{path}: {body.strip().splitlines()[-1]}", {"path": path, "content": body}

    def _build(self, staging: str) -> tuple[Status, str, dict[str, Any]]:
        t = self.target
        if not t.gpus:
            return "skip", "no GPU on the target (gpus = 0): CUDA build skipped", {}
        if not t.cuda_arch:
            return "fail", f"target {t.name} has gpus = {t.gpus} but no cuda_arch", {}
        try:
            res = self.host.run_module(
                "kernels.build",
                ["--arch", t.cuda_arch, "--out", f"{staging}/build"],
                cwd=staging,
                timeout=BUILD_TIMEOUT_S,
            )
        except CommandTimedOut:
            return "fail", f"the build did not end in {BUILD_TIMEOUT_S} s: stopped", {}
        if res.rc != 0:
            tail = (res.data.get("compiler_tail") or "").splitlines()[-20:]
            return "fail", f"build failed: {res.data.get('error')}", {"evidence": tail}
        man = res.data.get("manifest", {})
        detail = f"{', '.join(man.get('arch', []))} in {man.get('build_seconds', '?')} s"
        return "ok", detail, {"manifest": man}

    def _selftest(self, staging: str) -> tuple[Status, str, dict[str, Any]]:
        t = self.target
        args: list[str] = []
        # the C++ baseline's build cache (content-keyed, so releases can share it): the
        # self-test builds it where the service will look for it
        # (and the library under test is the one named here, never one from the environment)
        env = {"DDTREE_CACHE": f"{self.root}/cache", "DDTREE_KERNELS_LIB": ""}
        if t.gpus:
            args += ["--lib", f"{staging}/build/libddtree_kernels.so"]
            env.update(CUDA_VISIBLE_DEVICES=str(self._bench_gpu()), CUDA_DEVICE_ORDER="PCI_BUS_ID")
        bound = t.selftest_timeout
        try:
            res = self.host.run_module(
                "kernels.selftest", args, cwd=staging, env=env, timeout=bound
            )
        except ModuleLinkLost as exc:  # the link's trouble, not the release's: exit 2, as a
            # restart's or a post-flight's (probe37bj L4: a frozen SSH session read exit 1)
            return "fail", f"self-test gave no result: {exc.message}", {"host": True}
        except ModuleOutputError as exc:  # no result (a crash)
            return "fail", f"self-test gave no result: {exc.message}", {}
        except CommandTimedOut:  # (probe37bd M4: a bare error, no step, its staging left)
            return (
                "fail",
                f"the self-test did not end in {bound:g} s (the target's selftest_timeout): "
                "stopped (a hung self-test?)",
                {},
            )
        data = dict(res.data)
        if res.rc != 0 or not data.get("ok"):
            bad = [
                f"{r.get('op')}: {r.get('mismatches')} mismatches; {r.get('first_mismatch')}"
                for r in data.get("results", [])
                if r.get("mismatches")
            ]
            why = data.get("error") or data.get("message") or "mismatches against the references"
            return "fail", f"self-test failed: {why}", {**data, "evidence": bad}
        results = data.get("results", [])
        cases = sum(int(r.get("cases") or 0) for r in results)
        gpu = data.get("gpu")
        where = (
            f"on {data.get('gpu_name')} {data.get('arch') or ''}".rstrip()
            if gpu == "ran"
            else f"CPU builds only; GPU {gpu}"
        )
        return "ok", f"passed {where}: {len(results)} op checks, {cases} cases", data

    def _switch_and_prove(self, rid: str, before: str | None, prune: bool = True) -> DeployResult:
        mgr = manager_for(self.host)
        restart = not self.opts.no_restart
        unfinal: Step | None = None  # the commit that failed: the switch not made final
        rolled: DeployResult | None = None  # the result of a rollback after a failed check
        with revert_guard(self.host, restart) as guard:
            guard.said = lambda text: self.progress(text, None)
            self._guard = guard

            def switch() -> tuple[Status, str, dict[str, Any]]:
                try:
                    by = "rollback" if self._rolling_back else "deploy"
                    pending = () if self._no_way_back else ("pending", by)
                    doc = host_releases(self.host, "switch", rid, *pending)
                except HostError as exc:  # its result lost: the host is asked, after the guard
                    return "fail", f"switch failed: {exc.message}", {"lost": True}
                except OpsError as exc:  # the host undid its half: current is where it was
                    # (a full or read-only disk: the host's, exit 2: probe37av L1; its fix is
                    # in the message already: probe37ax L1)
                    disk = bool(disk_fix(exc.message, self.root))
                    said = f"switch failed: {exc.message}; current is still {before or '(none)'}"
                    return "fail", said + self._unsent(rid, disk), {"disk": True} if disk else {}
                self._switched = rid
                said = f"current: {before or '(none)'} -> {rid}"
                if self._no_way_back:
                    said += f" (no way back: {self._no_way_back})"
                return "ok", said, doc

            self.step("switch", switch)
            if restart:
                try:
                    self.step("restart", lambda: self._restart(mgr))
                    record = self.opts.bootstrap and not self._golden_exists()
                    # never from a new release where proven ones are on the host (probe37ba H1:
                    # its golden set then judged them, and it was marked proven unchecked)
                    self._golden_withheld = self._fallback if record else None
                    record = record and not self._fallback
                    self.step("postflight", lambda: self._postflight(record))
                except StepFailed as exc:
                    if self._no_way_back:
                        return self._stays_on(rid, before, exc.step)
                    rolled = self._rollback(mgr, rid, before, exc.step)
                    # its switch back made final, the guard has nothing left to put back: let
                    # go as a settled one is (probe37bb M1: a stopped one held this deploy, and
                    # the host lock, minutes in silence)
                    guard.settled = self._rollback_final
            if rolled is None:
                # proven (prune keeps it) where it passed a post-flight; a step of its own
                # only where it failed (every deploy commits)
                done = self._commit(rid, proven=restart and not self._unchecked)
                guard.settled = done[0] != "fail"
                try:
                    if done[0] == "fail":
                        self.step("commit", lambda: done)
                except StepFailed as exc:
                    unfinal = exc.step
        if rolled is not None:
            if guard.lingered:  # (harmless: its switch back was final)
                self._lingered = self._lingered_note()
                rolled.message += self._lingered
            return rolled
        if unfinal is not None:  # the guard is done: the host is asked where it is
            res = self._not_final(rid, before, unfinal)
            if res is not None:
                return res
        if not restart:  # what the service runs, asked: not the current before, which it
            runs = self._running_release()  # may never have run (probe37az L1)
            self.step(
                "restart",
                lambda: (
                    "skip",
                    f"--no-restart: the service still runs {runs or 'what it ran'} until restarted",
                    {},
                ),
            )
        if prune:
            self._prune()
        outcome: Outcome = "deployed" if restart else "installed"
        said = (
            f"{rid} is current and healthy"
            if restart
            else "installed; the service was not restarted"
        )
        if self._reinstalled:
            said += f" ({self._reinstalled})"
        after = rid
        moved = done[2].get("current_state") if done[0] == "ok" else None
        if isinstance(moved, dict) and shown_state(moved) != rid:  # moved by hand meanwhile
            after = shown_state(moved) or "(none)"
            said = (
                f"{rid} passed its checks{' and serves' if restart else ''}, but current was "
                f"moved to {after} meanwhile (by hand?): a restart would run that; ops rollback "
                f"{self.target.name} --to {rid} makes {rid} current"
            )
        if restart and self._unchecked and self._golden_withheld:
            name, back = self.target.name, self._golden_withheld
            said += (
                f"; token identity was NOT CHECKED: there is no golden set, and none is "
                f"recorded from a new release where proven ones are on the host (the newest: "
                f"{back}), so {rid} was not marked proven; ops rollback {name} --to {back}, "
                f"ops healthcheck {name} --record-golden, then deploy proves it"
            )
        elif restart and self._unchecked:  # (a golden set damaged during the deploy)
            said += self._unchecked_note(f"so {rid} was not marked proven")
        if guard.lingered:  # harmless (its switch was final)
            self._lingered = self._lingered_note()
            said += self._lingered
        return self.result(outcome, release=rid, before=before, after=after, message=said)

    def _unsent(self, rid: str, disk: bool) -> str:
        """What a deploy whose switch its disk refused says of the release it finalized, never
        switched to: removed, its room given back (probe37ax L2: one left per retry on a full
        disk); "" where it is kept (a rollback's, another failure's: its evidence)."""
        if not disk or self._rolling_back or not self._finalized():
            return ""
        try:
            host_releases(self.host, "remove", rid)
        except OpsError as exc:
            return f"; {rid} is left in releases/, never switched to ({exc.message})"
        return f"; {rid}, never switched to, was removed (its room)"

    def _lingered_note(self) -> str:
        """What a result adds where its settled guard did not end when let go: whether one is
        still stopped (the next deploy or rollback is then refused) or it was ended (probe37ap
        L3: said to stay stopped, of a guard that was gone)."""
        pids = stopped_guards(self.host)
        said = "; its revert guard did not end when let go (stopped: SIGSTOP, a debugger?)"
        if pids == []:
            return f"{said} and was ended; its switch was final, nothing was undone"
        who = f" (pid {' '.join(map(str, pids))})" if pids else ""
        return (
            f"{said}{who}: while it stays so, the next deploy or rollback is refused, naming it "
            "and kill -CONT"
        )

    def _unchecked_note(self, so: str) -> str:
        """What a result adds where its post-flight could not check token identity."""
        return (
            f"; token identity was NOT CHECKED (the golden set on the host is damaged or gone), "
            f"{so}; ops healthcheck {self.target.name} says what is wrong with it"
        )

    def _commit(self, rid: str, proven: bool) -> tuple[Status, str, dict[str, Any]]:
        """The switch made final (deploy.pending removed); `proven`: the release passed its
        post-flight, and is marked so."""
        args = ("commit", rid) if proven else ("commit",)
        what = f"{rid} passed its post-flight, but" if proven else "the switch was made, but"
        try:
            doc = host_releases(self.host, *args)
        except HostError as exc:  # the link lost: whether it landed is the host's to say
            lost = f"{what} the answer of making it final was lost: {exc.message}"
            return "fail", lost, {"lost": True}
        except OpsError as exc:  # refused on the host (a read-only root): deploy.pending stays
            return "fail", f"{what} it could not be made final: {exc.message}", {}
        self._committed = rid
        detail = "deploy.pending removed" + (f"; {rid} marked proven" if proven else "")
        if proven and doc.get("proven") is False:
            why = doc.get("proven_error")
            detail = f"deploy.pending removed; {rid} could not be marked proven ({why})"
        return "ok", detail, doc

    def _not_final(self, rid: str, before: str | None, failed: Step) -> DeployResult | None:
        """The result where the switch to `rid` could not be made final (its commit failed or
        its answer was lost), asked of the host once the guard is done: the guard puts
        `before` back where deploy.pending stayed and it could. None where the host says the
        commit landed after all (its answer was lost, not its work)."""
        name, old = self.target.name, before or "the old current"
        try:
            listing = host_releases(self.host, "list")
        except OpsError as exc:
            after: str | None = "unknown (the host did not answer)"
            where = (
                f"current unknown: the host did not answer ({exc.message}); where the commit "
                f"did not land, the host's guard put {old} back; ops service status {name} "
                f"and ops releases {name} tell"
            )
        else:
            after = shown_state(listing.get("current_state"))
            if after == rid and not listing.get("pending"):
                self._committed = rid
                return None
            if after == rid:
                where = (
                    f"{rid} is current, but deploy.pending stays: the next deploy or rollback "
                    f"takes it for never proven and puts {old} back; once the host is mended, "
                    f"ops deploy {name} of this commit proves it again"
                )
            else:
                where = f"current is {after or '(none)'}: the host's guard put it back"
        return self.result(
            "failed",
            release=rid,
            before=before,
            after=after,
            failed_step="commit",
            message=f"{failed.detail}; {where}",
        )

    def _restart(self, mgr: Any) -> tuple[Status, str, dict[str, Any]]:
        try:
            st = mgr.restart(self.opts.wait_s)
        except HostError as exc:  # the host's trouble (a full disk, a lost link), not the release's
            self._blocked = "host"
            return "fail", f"restart failed on the host: {exc.message}", {"host": True}
        # the host's trouble (a port held, a full disk) is not the release's: not rejected for it
        self._blocked = st.blocked_by if st.blocked_by != "release" else None
        # still starting when a --wait shorter than the default ran out: not proven bad
        self._outlasted = (
            not st.active
            and st.blocked_by is None
            and self.opts.wait_s < REVERT_WAIT_S
            and " exited" not in st.detail
        )
        data = {
            "service": st.model_dump(),
            "evidence": since_last_start(st.evidence) if not st.active else [],
        }
        if self._blocked == "port" and not st.active:  # the host's, exit 2 (probe37aw L3: a
            data["host"] = True  # port another program took between the stop and the start)
        return ("ok" if st.active else "fail"), f"{st.state}: {st.detail}", data

    def _postflight(self, record: bool) -> tuple[Status, str, dict[str, Any]]:
        try:
            rep = self._health(record)
        except (Unreachable, ModuleLinkLost) as exc:  # the link's trouble (probe37ah M1)
            self._blocked = "host"
            return "fail", f"post-flight could not reach the host: {exc.message}", {"host": True}
        except HostError as exc:  # e.g. the release's own checks do not run: its fault
            return "fail", f"post-flight could not run: {exc.message}", {}
        data: dict[str, Any] = {"report": rep.model_dump(mode="json")}
        if rep.ok:
            unchecked = [c.detail for c in rep.checks if "NOT CHECKED" in (c.detail or "")]
            # no golden set (removed by hand: probe37ax H1, a release answering other tokens
            # was said "token-identical" and marked proven) judges nothing either
            unchecked += [
                f"NOT CHECKED ({c.detail})"
                for c in rep.checks
                if c.name == "identity" and c.status == "skip" and not record
            ]
            if unchecked:  # a damaged golden set cannot judge: said, never hidden in a pass
                self._unchecked = True  # and never marked proven for it (probe37ah L4)
                return "ok", f"healthy; token identity {unchecked[0]}", data
            return "ok", "healthy, token-identical" + (" (golden recorded)" if record else ""), data
        data["evidence"] = [
            line
            for c in rep.checks
            if c.status == "fail"
            for line in [f"{c.name}: {c.detail}", *c.evidence[:8]]
        ]
        return "fail", f"post-flight failed: {', '.join(rep.failed)}", data

    def _rollback(self, mgr: Any, rid: str, before: str | None, failed: Step) -> DeployResult:
        # rejected first: a rollback that is itself killed still leaves the release marked;
        # never for a cause outside the release (another program on the service's port)
        kept: list[str] = []
        unmarked = self._reject(rid, failed, kept)  # a mark not written must not stop it
        res = self._roll_back(mgr, rid, before, failed)
        retry = unmarked and not self._golden_suspect  # (a suspect golden set judged nothing)
        if retry and self._reject(rid, failed, kept, again=True):  # once the host is back
            res.message += (
                f"; {rid} could not be marked rejected ({unmarked}): `ops releases` shows it "
                "unproven, and `ops rollback --to` would take it"
            )
        if kept:  # a proven release stays open to `rollback --to`
            res.message += f"; {rid} was not marked rejected: {kept[0]}"
        return res

    def _stays_on(self, rid: str, before: str | None, failed: Step) -> DeployResult:
        """A rollback with no way back (`_nothing_to_go_back_to`) whose restart or checks
        failed: current stays on `rid`, marked rejected unless it passed a post-flight before;
        the result says where the service is and the way on."""
        kept: list[str] = []
        unmarked = self._reject(rid, failed, kept)
        name = self.target.name
        try:
            back = newest_proven(host_releases(self.host, "list"))
        except OpsError:
            back = None
        said = (
            f"{failed.name} failed ({failed.detail}); current stays {rid}: "
            f"{self._no_way_back}, so there was nothing to go back to; "
            + manager_for(self.host).state_now(starts=False)
        )
        if self._blocked == "port":  # no release's fault: another one, or a new commit, meets
            # the same port (probe37bj M2: "deploy a fixed commit" was named)
            said += (
                "; another program holds the service's port: stop it, or give the service a "
                f"free port (docs/inventory.md), then ops service start {name} starts {rid}"
            )
        elif back:
            said += f"; ops rollback {name} --to {back} goes to the newest proven release"
        else:
            said += "; deploy a fixed commit (ops deploy --ref)"
        if kept:
            said += f"; {rid} was not marked rejected: {kept[0]}"
        elif unmarked:
            said += f"; {rid} could not be marked rejected ({unmarked})"
        return self.result(
            "failed", release=rid, before=before, after=rid, failed_step=failed.name, message=said
        )

    def _revert_wait(self) -> float:
        """How long a revert's restart waits for /health: --wait, and never less than the
        default: the release it goes back to served before, and a --wait cut short for the new
        one must not fail the way back (probe37ac M1: both restarts failed a --wait 1, and the
        host, serving a second later, was said not to serve)."""
        return max(self.opts.wait_s, REVERT_WAIT_S)

    def _reject(self, rid: str, failed: Step, kept: list[str], again: bool = False) -> str | None:
        """Mark `rid` rejected for `failed` (not for a cause outside the release, nor a release
        that passed a post-flight: the host side keeps it, said into `kept`); why it could not
        be marked (a full disk), or None. `again`: a second try after this deploy's own
        rollback, which moved current itself (probe37be M1: read as moved under the checks,
        the mark was given up and the disk's refusal never said)."""
        if self._blocked:
            return None
        if self._outlasted and failed.name == "restart":  # (probe37ac M1: a good release)
            kept.append(
                f"it was still starting when --wait {self.opts.wait_s:g} s ran out; a longer "
                "--wait lets it prove itself"
            )
            return None
        if failed.name == "postflight" and not again:
            now, _ = self._ask_current()
            if now is not None and now != rid:  # moved under its checks (probe37am M1)
                kept.append(
                    f"current was moved to {now} while its post-flight ran (the host's guard, "
                    "once ops's link was lost?), so those checks did not judge it"
                )
                return None
            stopped = self._stopped_service()
            if stopped:  # (probe37bn L1: a release was rejected for a SIGSTOP from outside)
                kept.append(
                    f"its service (pid {stopped}) was stopped (SIGSTOP or a debugger) from "
                    "outside while its post-flight ran, so those checks did not judge it"
                )
                return None
        why = {"step": failed.name, "detail": failed.detail, "at": utc_now()}
        try:
            doc = host_releases(self.host, "reject", rid, stdin=json.dumps(why).encode())
        except OpsError as exc:
            return exc.message
        if doc.get("rejected"):
            self._rejected_at = (rid, why["at"])
        if doc.get("kept") and not kept:
            kept.append(str(doc["kept"]))
        return None

    def _stopped_service(self) -> int | None:
        """The service's pid where it is stopped now (SIGSTOP, a debugger), asked of the host."""
        try:
            st = manager_for(self.host).status()
        except OpsError:
            return None
        return st.pid if st.stopped else None

    def _roll_back(self, mgr: Any, rid: str, before: str | None, failed: Step) -> DeployResult:
        reverted: dict[str, Any] = {}

        def back() -> tuple[Status, str, dict[str, Any]]:
            # "settle": current goes back now, but deploy.pending stays until the service is
            # restarted on it, so the guard still restarts it if ops goes away meanwhile
            try:
                doc = host_releases(self.host, "revert", "settle")
            except OpsError as exc:  # deploy.pending stays: the guard tries again as ops leaves
                reverted["error"] = exc.message
                return "fail", f"could not switch back: {exc.message}; {self._where_now()}", {}
            reverted.update(doc)
            if doc.get("first_install"):  # stop the service first, then no current at all
                st = mgr.stop()
                done = host_releases(self.host, "retire", rid)
                detail = f"first install removed: current {done.get('current') or '(none)'}"
                return ("ok" if not st.active else "fail"), f"{detail}; service {st.state}", {}
            if not doc.get("reverted"):
                if doc.get("note"):
                    return "fail", doc["note"], {}
                # no switch was pending: the guard put it back already (ops's connection to it
                # was lost), or something else moved current; the host says which, not a guess
                return self._nothing_pending(mgr, rid, before, reverted)
            try:
                st = mgr.restart(self._revert_wait())
                # another program holds its port: checks would ask that program (probe37be L1:
                # one that never answers held them 60 s), and prove nothing of this release
                squatted = st.blocked_by == "port" and not st.active
                rep = None if squatted else self._health(False)
            except HostError as exc:
                if isinstance(exc, Unreachable):  # switched back; whether it serves is unknown
                    reverted["lost"] = exc.message
                detail = f"current: {rid} -> {doc.get('current')}; then {exc.message}"
                return "fail", detail, {}
            kept = False  # the restart could not happen, and need not: the old one still serves
            if "was not stopped" in st.detail:  # the restart could not happen: who serves?
                try:
                    serving = mgr.status().runs_release
                except HostError:
                    serving = None
                if serving is not None and serving != doc.get("current"):
                    reverted["still_serving"] = serving
                kept = serving is not None and serving == doc.get("current")
            ok = (st.active or kept) and rep is not None and rep.ok
            detail = f"current: {rid} -> {doc.get('current')}; "
            if kept and rep is not None and rep.ok:  # a full disk refused the new one's restart
                detail += (
                    f"restored: its service was never stopped, it still runs {serving} and is "
                    "healthy (no restart needed; none could happen)"
                )
            else:
                detail += f"service {st.state}"
                if reverted.get("still_serving"):
                    detail += f" (it still runs {reverted['still_serving']}: {st.detail})"
                elif kept:
                    detail += f" (it still runs {serving}: {st.detail})"
                elif not st.active and st.detail:  # why it did not start, said here
                    detail += f" ({clip_line(st.detail, 600)})"  # (probe37x L4: cut mid-word)
                detail += (
                    "; no checks run: another program holds its port"
                    if rep is None
                    else "; checks pass again"
                    if rep.ok
                    else f"; still failing: {rep.failed}"
                )
            data = {
                "service": st.model_dump(),
                "report": rep.model_dump(mode="json") if rep is not None else None,
            }
            return ("ok" if ok else "fail"), detail, data

        try:
            self.step("rollback", back)
            back_failed: Step | None = None
        except StepFailed as exc:
            back_failed = exc.step
        if reverted.get("reverted"):
            try:
                host_releases(self.host, "commit")
                self._rollback_final = True
            except OpsError:
                pass  # deploy.pending stays: the guard, as ops leaves, restarts the same release
        after = reverted.get("current") if reverted.get("reverted") else None
        outcome: Outcome = "rolled-back"
        if reverted.get("by_guard"):
            after = reverted["by_guard"]
            if back_failed is not None:  # the guard switched back; its service does not serve
                return self._down_after_rollback(rid, before, after, failed, back_failed)
            where = self._back_on(rid, after) + " (by the host's guard)"
        elif reverted.get("first_install"):
            # (kept in releases/, marked rejected: probe37bd L1 said it was removed)
            rejected = self._rejected_at is not None and self._rejected_at[0] == rid
            kept_as = (  # (probe37bg L1: said "rejected" of one a held port never judged)
                "kept as rejected" if rejected else "kept, not rejected: ops releases lists it"
            )
            where = f"the first install was undone (no release is current; it is {kept_as})"
        elif reverted.get("still_serving"):
            where = (
                f"current is back on {after}, but the service still runs "
                f"{reverted['still_serving']}: its restart could not happen (see the rollback step)"
            )
            if back_failed is not None:  # never "rolled back" while the new release serves
                # (probe37av M1: a stopped restart worker; once let go it starts the new one)
                outcome = "failed"
                where += (
                    f"; once that is over, ops service restart {self.target.name} runs {after}, "
                    "which current is on"
                )
        elif reverted.get("reverted") and back_failed is None:
            where = self._back_on(rid, after)
            if not self._rolling_back:  # (probe37av L3: a retry loop of failing deploys
                # filled the root, a release each, never pruned: this one is kept)
                self._prune(spare=rid)
        elif reverted.get("lost"):  # switched back; the link went before its restart's answer
            outcome = "failed"
            where = (
                f"current is back on {after}; whether its service serves is unknown: "
                f"{reverted['lost']} (the host's guard restarts it once ops is gone; "
                f"ops service status {self.target.name} tells)"
            )
        elif reverted.get("reverted"):  # switched back, but its service does not serve
            return self._down_after_rollback(rid, before, after, failed, back_failed)
        else:  # say where the host is, as it says, not where this deploy last put it
            after, asked = self._ask_current()
            where = f"could not roll back: {asked}"
            if reverted.get("error") and after == rid and before:  # the host refused the revert
                where = (
                    f"could not roll back ({reverted['error']}): {asked}; once that is mended, "
                    f"ops rollback {self.target.name} --to {before} puts it back"
                )
            if back_failed is not None:  # never "rolled back" where the rollback failed
                outcome = "failed"
                if after is None and asked.startswith("current unknown"):
                    after = "unknown (the host did not answer)"
            # and what the host says of its service (probe37ag M1: a restart killed on a root
            # gone read-only left none, and the line said nothing of it)
            where += "; " + manager_for(self.host).state_now(starts=False)
        return self.result(
            outcome,
            release=rid,
            before=before,
            after=after,
            failed_step=failed.name,
            message=f"{failed.name} failed ({failed.detail}); {where}",
        )

    def _down_after_rollback(
        self, rid: str, before: str | None, after: str | None, failed: Step, back: Step
    ) -> DeployResult:
        """The rollback switched `current` back to `after`, but the restart or the checks on it
        failed: the host is on `after`, never "rolled back" (probe37d F1); whether its service
        serves, it is asked."""
        name = self.target.name
        why = back.detail.split("; ", 1)[1] if back.detail.startswith("current: ") else back.detail
        cause = failed.detail.split(": ", 1)[-1]  # (its state word off: "failed: ...")
        if len(cause) > 40 and cause in why:  # the rollback's restart met the same (a port
            why = why.replace(cause, "the same cause")  # held: said once, probe37ay L3)
        asked = ""
        try:  # asked of the host, not inferred from the checks (probe37ab M1: a service that
            # answered a moment after a short --wait, or served but failed token identity)
            now = manager_for(self.host).status()
        except OpsError as exc:
            now, asked = None, exc.message
        if now is None:  # not told: never "does not serve" (probe37ax M2: it served all along)
            where = (
                f"current is back on {after}; whether its service serves could not be told "
                f"(the rollback failed: {why}; its status was not answered: {asked}); "
                f"`ops service status {name}` tells, `ops rollback {name}` switches to another "
                "release"
            )
        elif now.active and now.healthy:
            where = (
                f"current is back on {after} and its service runs (pid {now.pid}, /health ok "
                f"now), but it failed the rollback's checks ({why}); "
            )
            suspect = self._suspect_golden(rid, after, failed, back)
            if suspect:  # (probe37bf M2: `ops rollback` failed the same way, twice more)
                where += (
                    f"{suspect}: the golden set is the likely cause (edited, or recorded from "
                    f"another model), not {rid}; `ops healthcheck {name}` shows where they "
                    f"differ, and once the service's answers are trusted, `ops healthcheck "
                    f"{name} --record-golden` records a golden set from them"
                )
            else:
                where += (
                    f"`ops healthcheck {name}` says what fails now, `ops rollback {name}` "
                    "switches to another release"
                )
        elif now.state == "activating":  # alive, not answering yet
            where = (
                f"current is back on {after} and its service is still starting ({now.detail}); "
                f"the rollback's checks failed ({why}); `ops service status {name}` tells once "
                f"it is up, `ops rollback {name}` switches to another release"
            )
        else:
            where = (
                f"current is back on {after}, but its service does not serve (rollback failed: "
                f"{why}); once the cause is fixed, `ops service start {name}` starts it, or "
                f"`ops rollback {name}` switches to another release"
            )
            edited = self._edited(after)
            if edited:  # (probe37bd M3: edited during the deploy, the cause said by nothing)
                where += f"; {edited}: the cause?"
        return self.result(
            "failed",
            release=rid,
            before=before,
            after=after,
            failed_step=failed.name,  # what failed first; the rollback step says its own
            message=f"{failed.name} failed ({failed.detail}); {where}",
        )

    def _suspect_golden(self, rid: str, after: str | None, failed: Step, back: Step) -> str:
        """Why the golden set, not `rid`, is the likely cause of a failed post-flight: the
        release gone back to passed a post-flight before, and now fails token identity, and
        nothing else, on the same prompts the same way (probe37bf
        M2: one token edited by hand rejected a good release, and the `ops rollback` named
        failed the same way). `rid`'s rejection for it is taken back. "" where not so."""
        if failed.name != "postflight" or after is None or after not in self._proven:
            return ""
        new, old = _diverged(failed), _diverged(back)
        if not new or new != old:
            return ""
        n = sum(": first divergence at " in line for line in new)  # (its warnings aside)
        said = (
            f"{after}, which passed a post-flight before, now differs from the golden set on "
            f"the same {n} prompt{'s' if n != 1 else ''} the same way as {rid}"
        )
        self._golden_suspect = said
        if self._rejected_at and self._rejected_at[0] == rid:
            try:
                host_releases(self.host, "unreject", rid, self._rejected_at[1])
                said += f" ({rid} was not marked rejected for it)"
            except OpsError as exc:
                said += f" ({rid} stays marked rejected: {exc.message})"
        return said

    def _nothing_pending(
        self, mgr: Any, rid: str, before: str | None, reverted: dict[str, Any]
    ) -> tuple[Status, str, dict[str, Any]]:
        """The rollback found no switch pending: the step before lost its result (the link to
        the host broke) and the host's guard, left alone, put the host back. Asked of the host:
        where current is and, once the guard is done, whether the service serves."""
        now, asked = self._ask_current()
        if now is None and asked.startswith("current unknown"):
            return "fail", f"no switch pending to undo; {asked}", {}
        if now != before or before is None:
            what = "still the release that failed" if now == rid else "neither"
            return "fail", f"no switch pending to undo; {asked} ({what})", {}
        why = "the host's guard put it back (ops's link to it was lost)"
        try:
            self._guard_done()
            st = mgr.settled_status(self.opts.wait_s)  # its restart was not waited for
            rep = self._health(False)
        except HostError as exc:
            detail = f"current is {now}: {why}; service unknown: the host did not answer ({exc})"
            return "fail", detail, {}
        reverted["by_guard"] = now
        serving = st.runs_release
        ok = st.active and rep.ok and serving in (None, now)
        detail = f"current is {now}: {why}; service {st.state}"
        if serving is not None and serving != now:
            detail += f" (it still runs {serving})"
        detail += "; checks pass again" if rep.ok else f"; still failing: {rep.failed}"
        data = {"service": st.model_dump(), "report": rep.model_dump(mode="json")}
        return ("ok" if ok else "fail"), detail, data

    def _guard_done(self) -> None:
        """Wait until no guard holds `deploy.guard` (one putting the host back restarts the
        service, then exits); bounded by its own bound (the service's stop, then a start)."""
        limit = int(self.target.service.stop_timeout + self.opts.wait_s + 30)
        self.host.run(
            ["flock", "-w", str(limit), f"{self.root}/deploy.guard", "true"],
            warn=True,
            timeout=limit + 30,
            step="wait for the guard",
        )

    def _ask_current(self) -> tuple[str | None, str]:
        """Where `current` is, asked of the host after a step that failed half way: (what it
        shows, a phrase saying so)."""
        try:
            now = shown_state(host_releases(self.host, "list").get("current_state"))
        except OpsError as exc:
            return None, f"current unknown: the host did not answer ({exc.message})"
        return now, f"current is {now or '(none)'}"

    def _guard_restarted(self) -> bool | str | None:
        """Whether the guard's restart, after this deploy began, started the service, from
        what the guard wrote in logs/guard.log (None: no such entry, or no log to read; "kept":
        the service already ran what it put back, and was not restarted)."""
        log = shell_path(guard_log(self.target))
        logs = shell_path(posixpath.dirname(guard_log(self.target)))
        res = self.host.run_script(
            f"if [ -f {log} ] && [ ! -h {log} ] && [ ! -h {logs} ]; then tail -c 16384 {log}; fi",
            step="guard log",
        )
        mark = " ops went away before its switch was proven"
        entries = [line for line in res.stdout.splitlines() if mark in line] if res.ok else []
        if not entries or entries[-1].split(" ", 1)[0] < self._began:  # none, or an earlier's
            return None
        said = res.stdout[res.stdout.rindex(entries[-1]) :]  # its restart's answer
        if '"kept": true' in said:
            return "kept"
        if '"started": true' in said:
            return True
        if '"started": false' in said or '"error"' in said:
            return False
        return None

    def _recovered(self, undone: dict[str, Any]) -> DeployResult:
        """A plain rollback whose recover step already undid a never-proven switch: proven by
        a post-flight, not taken one release further back."""
        was, now = undone.get("from"), undone.get("to")
        try:
            self.step("postflight", lambda: self._postflight(False))
        except StepFailed as exc:
            return self.result(
                "failed", failed_step="postflight", message=exc.step.detail, before=was, after=now
            )
        said = f"rolled back: {now} is current and healthy (was {was}, never proven)"
        if was == now:  # current had been put back already (settled); only its restart was due
            # (probe37u U5: "(was X, never proven)" named the proven release it went back to)
            said = (
                f"rolled back: {now} is current and healthy (an earlier rollback or guard had "
                "switched current back to it and died before its restart, done now)"
            )
            if undone.get("restarted") is False:  # (probe37ae M2: it had been restarted)
                said = (
                    f"rolled back: {now} is current and healthy (an earlier rollback or guard "
                    "had switched current back to it; the service already ran it, and its "
                    "record was cleared)"
                )
        return self.result("switched", release=now, before=was, after=now, message=said)

    def _unswitched(self, failed: Step) -> tuple[str | None, str]:
        """A step failed before a switch was made: (where current is, the result's message).
        Where the switch's own result was lost (the link to the host broke), the host is asked,
        now that the guard is done, instead of assuming it never switched."""
        if failed.data.get("asked"):  # the step asked the host itself
            return failed.data.get("now"), failed.detail
        if not failed.data.get("lost"):
            return self._before, failed.detail
        now, asked = self._ask_current()
        return now, f"{failed.detail}; {asked} (asked of the host once its guard was done)"

    def _where_now(self) -> str:
        return self._ask_current()[1]

    def _prune(self, spare: str | None = None) -> None:
        """The prune step: keep --keep releases (`spare`, a release just rejected, is kept
        too: its evidence)."""

        def prune() -> tuple[Status, str, dict[str, Any]]:
            if self.host.lock_lost():  # probe37z L1: it pruned, and said nothing of the lock
                return (
                    "skip",
                    "not done: the host lock was lost (its holder on the host ended, killed, or "
                    "its SSH connection stopped answering), "
                    "so another deploy or rollback may run now; the next deploy prunes",
                    {"lock_lost": True},
                )
            try:
                doc = host_releases(self.host, "prune", str(self.opts.keep), *filter(None, [spare]))
            except OpsError as exc:  # a lost link, a read-only root: the release stands
                return "skip", f"not done ({exc.message}); the next deploy prunes", {}
            gone = doc.get("removed") or []
            shown = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
            detail = f"removed {shown}" if gone else "nothing to remove"
            held = doc.get("held") or []
            if held:  # (probe37bg H2: a mount in a release: kept, never descended into;
                # probe37bh M1: one that cannot be removed no longer stops the rest)
                detail += f"; {held[0]}" + (f" (+{len(held) - 1} more)" if held[1:] else "")
            return "ok", f"{detail} (keep {self.opts.keep})", doc

        self.step("prune", prune)

    # -- rollback to an earlier release ----------------------------------------------------
    def rollback(self, to: str | None, holder: str | None = None) -> DeployResult:
        """Switch to `to` (default: previous), restart, post-flight; undone if that fails.
        Prunes nothing. Raises DeployInterrupted on Ctrl-C. `holder`: what the host lock names
        as its holder to anyone refused meanwhile (default: `ops rollback <to>`; a rollout's
        measure switching releases says so)."""
        with interrupted_once():
            try:
                return self._rollback_to(to, holder or f"ops rollback {to or 'previous'}")
            except KeyboardInterrupt:
                raise DeployInterrupted(self._interrupted()) from None

    def _taken(self, rid: str) -> str:
        """What a plain rollback that could not take `previous` took instead (`rid`): the
        newest proven release of other code than current (probe37at L3: one of current's very
        commit was taken, and "rolled back" changed nothing), or, where none is, the newest
        proven one, said to run current's code."""
        try:
            listing = host_releases(self.host, "list")
        except OpsError:
            return "the newest proven release"
        rels = {str(r["id"]): r for r in listing.get("releases") or []}
        was = rels.get(str(self._before or ""))
        if was is None or rid not in rels:
            return "the newest proven release"
        if code_of(rels[rid]) == code_of(was):
            return "the newest proven release (it runs current's very commit: no other did)"
        skipped = any(
            i > rid and i != was["id"] and r.get("proven") and code_of(r) == code_of(was)
            for i, r in rels.items()
        )
        return (
            "the newest proven release of other code than current"
            if skipped
            else ("the newest proven release")
        )

    def _no_previous(self, listing: dict[str, Any]) -> str:
        """Where a plain rollback goes when `previous` names no release: a `previous` that is
        gone (a deleted release, no link at all) or names current itself gives way to the
        newest proven release, said in the result; one that exists but is no release of ops's
        (a hand-made directory) is the operator's to switch to, and the refusal names the
        proven release there is."""
        prev = listing.get("previous_state") or {}
        other = shown_state(prev)
        back = newest_proven(listing, other_code=True)
        same = prev.get("kind") == "release" and prev.get("id") == listing.get("current")
        if back and (same or prev.get("kind") in (None, "none") or not prev.get("exists", True)):
            self._instead = (
                "previous names current itself"
                if same
                else f"previous is {other}"
                if other
                else "no previous link"
            )
            return back
        name = self.target.name
        hint = f"ops releases {name} lists the releases; ops rollback {name} --to ID"
        if back:
            hint = f"the newest proven release is {back}: ops rollback {name} --to {back}"
        why = f" (previous is {other}, not a release ops installed)" if other else ""
        if prev.get("kind") == "foreign" and prev.get("exists") and not prev.get("aside"):
            # a switch away from a hand-made current keeps it as previous: ops made that link
            why = (
                f" (previous is {prev.get('link')}, not a release ops installed: a link made by "
                "hand, or a hand-made current that a deploy or a rollback switched away from; a "
                "plain rollback goes only to a release ops installed)"
            )
        if same:
            why = f" (previous names {other}, the current release itself)"
        raise OpsError(f"{name}: no previous release to roll back to{why}", hint=hint)

    def _drop_settled(self) -> bool:
        """Remove a settled deploy.pending (current already put back; only its restart, which
        just failed, was due), so that a rollback --to can switch on; False where there is
        none to drop, or it could not be."""
        try:
            listing = host_releases(self.host, "list")
            if not listing.get("pending"):
                return False
            return bool(host_releases(self.host, "commit").get("pending"))
        except OpsError:
            return False

    def _rollback_to(self, to: str | None, holder: str) -> DeployResult:
        with self.host.lock(holder):
            try:
                undone = self._prepared(host_releases(self.host, *self._prepare_args()))
            except StepFailed as exc:  # where it was and is: the put-back's (probe37p P1)
                back = exc.step.data.get("put_back") or {}
                if to is None or not self._drop_settled():
                    return self.result(
                        "failed",
                        failed_step="recover",
                        message=exc.step.detail,
                        before=back.get("from"),
                        after=back.get("to"),
                    )
                # --to names where the operator wants the host: a switch put back whose
                # restart failed must not block it (probe37v V7, V8: every rollback, --to
                # too, failed at its recover until deploy.pending was deleted by hand)
                undone = None
            # a dead deploy's never-proven release undone: that is the rollback. A dead
            # rollback's undone is where it started: it is made again, to where it was going
            # (its --to, not `previous`: probe37ae M1)
            if undone and not to and undone.get("by") != "rollback" and not undone.get("runs"):
                return self._recovered(undone)
            listing = host_releases(self.host, "list")
            redo = self._redo(undone, listing) if undone and not to else None
            if isinstance(redo, DeployResult):
                return redo
            self._before_state = listing.get("current_state")
            self._proven = proven_whole(listing)  # (what a refusal may name: probe37aw L2)
            before = self._before = listing["current"] or shown_state(self._before_state)
            want = to or redo or listing["previous"]
            if not to and want and want == listing["current"]:
                want = None  # previous names current itself: it names no release to go back to
            if not want:
                want = self._no_previous(listing)
            rel = next((r for r in listing["releases"] if r["id"] == want), None)
            rejected = not to and rel is not None and rel.get("rejected")
            back = newest_proven(listing, other_code=True) if rejected else None
            if back:  # a plain rollback: a rejected previous gives way (probe37y L5)
                self._instead = f"previous ({want}) was rejected"
                want, rel = back, next(r for r in listing["releases"] if r["id"] == back)
            if rel is None:
                known = ", ".join(r["id"] for r in listing["releases"]) or "none"
                shown = repr(want) if len(want) <= 80 else repr(want[:80]) + "..."
                odd = next((r for r in listing.get("not_releases") or [] if r["id"] == want), None)
                what = f": releases/{want} is {odd['kind']} (not one ops installed)" if odd else ""
                raise OpsError(f"{self.target.name}: no release {shown}{what} (releases: {known})")
            if rel.get("damaged"):
                raise OpsError(
                    f"{self.target.name}: release {want} is damaged ({rel['damaged']}); "
                    "it cannot be trusted to roll back to",
                    hint=f"ops releases {self.target.name} lists the others; "
                    f"ops rollback {self.target.name} --to ID",
                )
            if rel["selftest_ok"] is not True:
                raise OpsError(f"{self.target.name}: release {want} never passed its self-test")
            bad = rel.get("rejected")
            if bad and want != before:
                step, at, detail = (bad.get(k) or "" for k in ("step", "at", "detail"))
                said = (  # (a rejected.json written by hand may lack them: probe37u U8)
                    f"failed its {step}{f' ({at})' if at else ''} and was rolled back"
                    + (f": {detail}" if detail else "")
                    if step
                    else "is marked rejected (its rejected.json)"
                )
                raise OpsError(
                    f"{self.target.name}: release {want} {said}",
                    hint="deploy a fixed commit instead (ops deploy --ref)",
                )
            seen = self._service_now()  # one look at the service for what follows
            if seen is not None and seen.port_held and want != before:  # its restart would be
                # refused: nothing is switched for it (probe37bk L2: switched, then back)
                raise OpsError(
                    f"{self.target.name}: the service is not running and another program holds "
                    f"its port ({seen.detail}): a rollback's restart would be refused",
                    hint="stop that program, or give the service a free port (docs/inventory.md)"
                    f"; then ops rollback {self.target.name}" + (f" --to {to}" if to else ""),
                )
            runs = self._runs_instead(listing, seen)
            stuck = listing.get("current_unrevertible")
            edited = seen.untried if seen is not None and seen.lives else None
            stuck = stuck or edited  # (probe37au H1: its revert would start an untried edit)
            mend = self._untried_mend(self.target.name) if edited else "mend current first"
            serves = seen.runs_release if seen is not None else None
            adopts = bool(runs) and not to and not redo  # (it stops at what serves: below)
            plain = not to and not redo and not adopts and want != before
            if plain and not rel.get("proven"):  # never onto code that never served, weighed
                # before current's state (probe37bo M1: an edited current named a stop, then
                # --to the unproven previous, and never the proven release)
                back = newest_proven(listing, other_code=True)
                if back is not None:
                    self._instead = f"previous ({want}) never passed a post-flight"
                    want, rel = back, next(r for r in listing["releases"] if r["id"] == back)
            if stuck and want != before and not rel.get("proven") and not adopts:
                # its revert could not come back (probe37x H2: a rollback --to a release that
                # never served, from a current without its service.env: the start failed and
                # the host was left down); a proven release is the way out, and stays open
                back = newest_proven(listing)
                way = (
                    f"ops rollback {self.target.name} --to {back} goes to the newest proven release"
                    if back
                    else "mend current first"
                )
                hint = f"{way}; or mend current, then roll back to {want}"
                if runs:  # (probe37as L1: --to what runs adopts it, with no restart)
                    hint = (
                        f"ops rollback {self.target.name} --to {runs} makes what the service "
                        f"runs current, with no restart; or {hint}"
                    )
                elif edited:  # (it runs current: the way back is current's env, mended)
                    cur = named_release(listing.get("current_state"))
                    hint = self._keep_way(seen, cur, want, mend=mend)
                elif seen is not None and seen.active and serves != back:  # it serves: the
                    # rollback to `back` would stop it with no way back too (probe37at H2)
                    cur = named_release(listing.get("current_state"))
                    hint = self._keep_way(seen, cur, back)
                raise OpsError(
                    f"{self.target.name}: release {want} never passed a post-flight, and a "
                    f"failed rollback could not come back to current ({before}: {stuck})",
                    hint=hint,
                )
            gone = seen.release_gone if seen is not None and seen.active else None
            if gone and not runs:  # (probe37as H1: stopped, then `want` failed: left down)
                raise OpsError(
                    f"{self.target.name}: the service runs {gone}, whose directory is gone from "
                    f"releases/ ({self._gone_where(seen)}): a rollback would stop it with no "
                    f"way back to it if {want} then failed to start",
                    hint=self._keep_way(seen, named_release(listing.get("current_state")), to),
                )
            if want == before and not runs:
                # current, but is it served? (probe37ak M1: exit 0 over a stopped service)
                down = self._not_serving(want, rel.get("proven"), seen)
                said = f"release {want} is already current"
                if down is not None:
                    return self.result(
                        "failed",
                        failed_step="service",
                        release=want,
                        before=before,
                        after=before,
                        message=f"{said}, but {down}",
                    )
                return self.result(
                    "already-current", release=want, before=before, after=before, message=said
                )
            if stuck and not runs and seen is not None and seen.lives and serves != want:
                # it serves, and a failed rollback could not come back to what it runs: its
                # directory renamed in releases/, current damaged or a copy deleted (probe37at
                # H1, H2: stopped, then `want` failed to start: left down)
                raise OpsError(
                    f"{self.target.name}: current ({before}) is one a failed rollback could not "
                    f"come back to ({stuck}), and the service serves: a rollback would stop it "
                    f"with no way back if {want} then failed to start",
                    hint=self._keep_way(
                        seen, named_release(listing.get("current_state")), to, mend=mend
                    ),
                )
            # (want == before with runs: the service runs another release; what it runs is
            # adopted below, then `want` switched to and proven with a way back to it)
            if not runs:  # (probe37ag H1, H2: a put-back onto code that never served)
                self._no_way_back = self._nothing_to_go_back_to(listing, seen)
            if runs and not to and not redo and not rel.get("proven"):
                # a plain rollback goes back, never forward: after --no-restart installs, its
                # `previous` may be one that never served either (probe37ai H1); it stops at
                # what serves, and names the way there
                self._instead = (
                    f"previous, as it was ({want}), never passed a post-flight, so the rollback "
                    f"stopped at what the service runs (ops rollback {self.target.name} --to "
                    f"{want} goes there)"
                )
                want = runs
            elif not to and not redo and want != before and not rel.get("proven"):
                # nor onto code that never served where the service runs current: a `previous`
                # an adopt left, a --no-restart install (probe37ak M2)
                back = newest_proven(listing, other_code=True)
                if back is None:
                    raise OpsError(
                        f"{self.target.name}: previous ({want}) never passed a post-flight, and "
                        "no other release did: a plain rollback goes only to code that served",
                        hint=f"ops rollback {self.target.name} --to {want} goes there as asked",
                    )
                self._instead = f"previous ({want}) never passed a post-flight"
                want, rel = back, next(r for r in listing["releases"] if r["id"] == back)
            if runs:  # a failure must come back to what served, never to `current` (ae-H1)
                adopted = self._adopt(runs, want, before)
                if adopted is not None:
                    return adopted
                listing = host_releases(self.host, "list")
                self._before_state = listing.get("current_state")
                before = self._before = runs
            self._rolling_back = True
            try:
                res = self._switch_and_prove(want, before, prune=False)
            except StepFailed as exc:
                after, message = self._unswitched(exc.step)
                return self.result(
                    "failed",
                    failed_step=exc.step.name,
                    message=message,
                    before=before,
                    after=after,
                )
            if res.outcome == "rolled-back":  # this rollback failed and was undone: the host
                res.outcome = "failed"  # is where it was, nothing rolled back (probe37ad L3)
            if res.outcome == "deployed":
                res.outcome = "switched"
                was = f"was {before}" if before else "there was no current"
                # the newest proven release may be newer than the one left (probe37aj L4)
                ahead = bool(before) and newer_release(want, str(before))
                verb = "moved forward" if ahead else "rolled back"
                res.message = f"{verb}: {want} is current and healthy ({was})"
                if ahead:
                    res.message += f"; {want} is newer than {before}: not a step back"
                if self._instead:
                    res.message += f"; {self._instead}, so {self._taken(want)} was taken"
                edited = self._edited(want)
                if edited:  # (probe37bd M3: said by nothing)
                    res.message += f"; {edited}: it passed this post-flight as it is now"
                if redo:
                    res.message += f"; an earlier rollback to {redo}, cut off, was made again"
                res.message += self._lingered
                if self._unchecked:
                    res.message += self._unchecked_note(
                        "so it was not marked proven now"
                        if not rel.get("proven")
                        else "as it was once proven, it stays so"
                    )
            if self._adopted:
                had = (
                    "there was no current"
                    if self._adopted == "(none)"
                    else f"current had been {self._adopted}, which the service did not run"
                )
                res.message += (
                    f"; {had}: {before}, which it ran, was made current first, so a failure "
                    "comes back to it"
                )
            return res

    def _redo(self, undone: dict[str, Any], listing: dict[str, Any]) -> str | DeployResult | None:
        """Where a plain rollback goes after its recover undid a dead rollback's switch: that
        rollback's own target (the switch's `new`, maybe a --to), so the host ends where the
        operator was going. A target rejected since (its restart failed, and the dead rollback
        was putting the host back) is not gone to again: the result says where the host is.
        None: no release to redo (the plain rollback takes `previous`)."""
        if undone.get("by") != "rollback":
            return None
        went, now = undone.get("from"), undone.get("to")
        rel = next((r for r in listing["releases"] if r["id"] == went), None)
        if rel is None or went == now:
            return None
        if rel.get("rejected") or rel.get("damaged") or rel.get("selftest_ok") is not True:
            why = "was rejected" if rel.get("rejected") else "cannot be trusted"
            name = self.target.name
            said = (
                f"an earlier rollback to {went} was cut off and undone: {now or '(none)'} is "
                f"current again; {went} {why}, so it was not made again "
                f"(ops releases {name} lists the releases; ops rollback {name} --to ID)"
            )
            return self.result(
                "failed", failed_step="recover", message=said, before=went, after=now
            )
        return str(went)

    def _nothing_to_go_back_to(self, listing: dict[str, Any], seen: Any) -> str | None:
        """Why a rollback has no `current` to go back to, where it has none (None: it has one):
        no service runs, and current is no release, or one that never passed a post-flight
        (installed with --no-restart, then the service stopped). Switching back there, and
        restarting the service on it, would take a host that the rollback's release serves
        onto code that never ran (probe37ag H1, H2: ops killed, its guard or the next rollback
        did that, and the service went down); such a switch is made final at once."""
        cur = listing.get("current_state") or {"kind": "none"}
        if seen is None or seen.active:  # unknown; or it serves (what it runs is adopted first)
            return None
        if cur.get("kind") == "none":
            return "there was no current"
        rel = next((r for r in listing["releases"] if r["id"] == cur.get("id")), None)
        if cur.get("kind") != "release" or rel is None or rel.get("proven"):
            return None
        return f"current before it, {cur['id']}, never passed a post-flight and no service ran"

    def _runs_instead(self, listing: dict[str, Any], seen: Any) -> str | None:
        """The release the service runs where that is not `current` (current installed with
        --no-restart, or switched by hand): one of this root's, whole and never rejected. None
        where it runs current, is not running, or that cannot be told (systemd)."""
        cur = listing.get("current_state") or {"kind": "none"}
        if cur.get("kind") not in ("release", "foreign", "none"):
            return None
        runs = self._running_release(seen)
        if runs is None or runs == cur.get("id"):
            return None
        rel = next((r for r in listing["releases"] if r["id"] == runs), None)
        usable = rel is not None and not rel.get("damaged") and not rel.get("rejected")
        return runs if usable and rel["selftest_ok"] is True else None

    def _adopt(self, runs: str, want: str, before: str | None) -> DeployResult | None:
        """Make `runs`, the release the service runs, current, without a restart (a failed
        rollback reverts to current, and restarting the service on a `current` that never
        served would leave it down or on code nobody ran: probe37ae H1). Where the operator
        asked for that very release, it is the whole rollback: proven by a post-flight, and
        the result is returned. None: adopted, the rollback goes on from it."""
        was = before or "(none)"

        def adopt() -> tuple[Status, str, dict[str, Any]]:
            try:
                doc = host_releases(self.host, "switch", runs)
            except HostError as exc:
                return "fail", f"could not make {runs} current: {exc.message}", {"lost": True}
            except OpsError as exc:
                return "fail", f"could not make {runs} current: {exc.message}", {}
            self._adopted = was
            why = (
                # (it may have served before: probe37bd L3 said "never")
                f"the service did not run {was}: installed with --no-restart, or switched by hand"
                if before
                else "there was no current: removed by hand?"
            )
            detail = (
                f"current: {was} -> {runs}, the release the service runs ({why}); not restarted"
            )
            return "ok", detail, doc

        try:
            self.step("adopt", adopt)
        except StepFailed as exc:
            after, message = self._unswitched(exc.step)
            return self.result(
                "failed", failed_step="adopt", message=message, before=before, after=after
            )
        if want != runs:
            return None
        try:
            self.step("postflight", lambda: self._postflight(False))
        except StepFailed as exc:
            said = f"{runs} is current, which the service runs (not restarted); {exc.step.detail}"
            return self.result(
                "failed", failed_step="postflight", message=said, before=before, after=runs
            )
        done = self._commit(runs, proven=not self._unchecked)
        had = "there was no current" if not before else f"was {was}, which the service did not run"
        said = (
            f"rolled back: {runs} is current and healthy ({had}; the service already ran "
            f"{runs}: not restarted)"
        )
        if self._unchecked:
            said += self._unchecked_note("so it was not marked proven for it")
        if self._instead:
            said += f"; {self._instead}"
        if done[0] == "fail":
            said += f"; {done[1]}"
        return self.result("switched", release=runs, before=before, after=runs, message=said)
