"""`ops rollout`: run a playbook's steps against one target, every record in one run directory.

    runs/<utc>-rollout-<target>/
      record.json                 the rollout: inputs (playbook, overrides), every step, verdict
      01-preflight/record.json    one directory per step, each record in the shape the report
      01-preflight/golden/...     reads (ops.verdict.evidence), with the `change`; a healthcheck
      says
      02-bench/record.json        its `inputs.role`; a step its gate kept from running says why
      ...                         (command "skipped")
      09-report/record.json       the decision; report.md / report.html / report.json beside
      report.md, report.html      the rollout's record.json

Gates (`when`): always; go (the decide step said GO); deployed (the deploy step put the
candidate in place). A step that fails or errs lets the rest run (`on_fail: continue`) or skips
to the report (`on_fail: stop`). The exit code is the report's verdict (0 GO, 1 NO-GO, 3 HOLD);
a playbook without a report step exits with its worst step (2 error, 1 fail, 3 hold, else 0).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from ops.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAIL,
    EXIT_HOLD,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    OpsError,
)
from ops.hosts.inventory import Target
from ops.hosts.records import RUNNING, RunDir
from ops.hosts.remote import Host, open_host, still_runs
from ops.measure.counters import snapshot
from ops.rollout.playbook import Playbook, PlaybookError
from ops.rollout.steps import (
    Context,
    Done,
    Status,
    step_bench,
    step_decide,
    step_healthcheck,
    step_profile,
    step_report,
)
from ops.rollout.switch import step_deploy, step_measure

STEPS: dict[str, Callable[[Context, Any, RunDir], Done]] = {
    "healthcheck": step_healthcheck,
    "bench": step_bench,
    "profile": step_profile,
    "decide": step_decide,
    "measure": step_measure,
    "deploy": step_deploy,
    "report": step_report,
}


class StepResult(BaseModel):
    index: int
    name: str
    step: str
    status: Status
    seconds: float = 0.0
    detail: str = ""
    record: str | None = None


class RolloutResult(BaseModel):
    target: str
    playbook: str
    change: str | None
    run_dir: str
    verdict: str | None = None  # the report's (None: the playbook has no report step)
    exit_code: int
    steps: list[StepResult] = Field(default_factory=list)
    decision: dict[str, Any] | None = None
    files: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def check_target(pb: Playbook, target: Target) -> None:
    """The change must start from what the inventory says the service runs (exit 2 if not)."""
    if pb.change is None:
        return
    now = target.service.components.get(pb.change.component)
    if now is not None and now != pb.change.baseline:
        raise PlaybookError(
            f"playbook {pb.path}",
            "change.baseline",
            f"{pb.change.baseline!r}, but the inventory says {target.name} runs "
            f"{pb.change.component} = {now!r}",
            None,
        )


def check_running(pb: Playbook, host: Host) -> None:
    """The change must start from what the service says it runs, where it says (exit 2): the
    profile of another implementation would answer another question."""
    if pb.change is None:
        return
    try:
        info = snapshot(host).get("server_info") or {}
    except OpsError:
        return  # the service does not answer: the pre-flight says so, with its evidence
    now = (info.get("backends") or {}).get(pb.change.component)
    if isinstance(now, str) and now != pb.change.baseline:
        raise PlaybookError(
            f"playbook {pb.path}",
            "change.baseline",
            f"{pb.change.baseline!r}, but {host.name}'s service runs {pb.change.component} = "
            f"{now!r} (its /get_server_info)",
        )


def _gate(ctx: Context, when: str, stopped: str | None) -> str | None:
    """Why the step does not run, or None when its gate is open."""
    if stopped:
        return f"the rollout stopped at step {stopped!r} (on_fail: stop)"
    if when == "go":
        d = ctx.found.decision
        if d is None or d.verdict != "GO":
            return f"gate go: decide said {d.verdict if d else 'nothing (it did not run)'}"
    if when == "deployed":
        res = ctx.found.deploy
        if res is None or res.outcome not in ("deployed", "already-current"):
            return "gate deployed: the candidate was " + (
                f"not deployed ({res.outcome})" if res else "not deployed"
            )
    return None


def _step_dir(run: RunDir, i: int, name: str, kind: str) -> RunDir:
    """The step's directory in the rollout's; one that cannot be made (a full or read-only
    disk) is `unwritten`, as its record will be: the step runs all the same."""
    sub = RunDir(run.path / f"{i:02d}-{name}", kind, run.target, datetime.now(UTC).isoformat())
    try:
        sub.path.mkdir()
    except FileExistsError:
        raise
    except OSError as exc:
        sub.unwritten = f"{sub.path}: {exc.strerror or exc}"
    return sub


class Runner:
    """One rollout: the steps in order, each recorded; `run()` returns the RolloutResult."""

    def __init__(
        self,
        pb: Playbook,
        target: Target,
        progress: Callable[[str], None],
        run: RunDir | None = None,
    ) -> None:
        self.pb, self.target, self.progress = pb, target, progress
        self.run_dir = run or RunDir.create("rollout", target.name)
        self.change = pb.change.to_change() if pb.change else None
        self.results: list[StepResult] = []

    def run(self, inputs: dict[str, Any]) -> RolloutResult:
        outcome, code = "interrupted", EXIT_INTERRUPTED
        # its record from the start (ops.hosts.records): a rollout killed outright still says so
        self.run_dir.write_record(inputs=inputs, outcome=RUNNING, exit_code=None)
        try:
            with open_host(self.target) as host:
                host.on_wait = self._still_runs  # (probe37bf M1: no long wait in silence)
                check_running(self.pb, host)
                ctx = Context(self.target, host, self.pb, self.run_dir, self._say, self.change)
                res = self._steps(ctx)
            outcome, code = res.verdict or _worst(self.results)[1], res.exit_code
            return res
        except OpsError as exc:  # the host could not be reached at all
            outcome, code = "error", exc.exit_code
            raise
        finally:
            self.run_dir.write_record(
                inputs=inputs,
                outcome=outcome,
                exit_code=code,
                steps=[r.model_dump() for r in self.results],
                **({"change": self.change.model_dump(mode="json")} if self.change else {}),
            )
            if outcome == "interrupted":  # no table will follow: say where the record is
                self.progress(f"interrupted; record: {self.run_dir.path}/record.json")

    def _still_runs(self, what: str, ran: float, bound: float) -> None:
        self._say(still_runs(what, ran, bound))

    def _say(self, line: str) -> None:
        """A step's own progress, under its line and naming it (a bare "service pid" under the
        bench's line read as an orphan)."""
        step = getattr(self, "_current", None)
        self.progress(f"      {step}: {line}" if step else f"      {line}")

    def _steps(self, ctx: Context) -> RolloutResult:
        steps = self.pb.step_list()
        stopped: str | None = None
        for i, st in enumerate(steps, 1):
            why = _gate(ctx, st.when, stopped if st.step != "report" else None)
            sub = _step_dir(self.run_dir, i, st.name, st.step if why is None else "skipped")
            head = f"[{i}/{len(steps)}] {st.name}"
            if why is not None:
                sub.write_record(
                    inputs={"step": st.name, "kind": st.step, "when": st.when},
                    outcome="skipped",
                    exit_code=0,
                    reason=why,
                )
                self._done(i, st, "skip", 0.0, why, sub)
                self.progress(f"{head}: skip ({why})")
                continue
            self.progress(f"{head} ({st.step}) ...")
            self._current = st.name
            t0 = time.monotonic()
            try:
                status, detail = self._one(ctx, st, sub)
            except KeyboardInterrupt as exc:  # the step's record says so; the rollout's lists it
                secs = time.monotonic() - t0
                more = getattr(exc, "detail", "")  # e.g. the release the recheck left current
                what = "interrupted (Ctrl-C)" + (f"; {more}" if more else "")
                self._done(i, st, "interrupted", secs, what, sub)
                self.progress(f"{head}: {what} ({secs:.1f} s)")
                raise
            self._done(i, st, status, time.monotonic() - t0, detail, sub)
            secs = time.monotonic() - t0
            if st.step in ("decide", "report"):  # its detail starts with the verdict: a NO-GO
                self.progress(f"{head}: {detail} ({secs:.1f} s)")  # is no step "fail"ing
            else:
                self.progress(f"{head}: {status} ({secs:.1f} s) {detail}")
            if status in ("fail", "error") and st.on_fail == "stop":
                stopped = st.name
        verdict = ctx.found.report["verdict"] if ctx.found.report else None
        code = ctx.found.report["exit_code"] if ctx.found.report else _worst(self.results)[0]
        return RolloutResult(
            target=self.target.name,
            playbook=self.pb.path,
            change=self.change.label if self.change else None,
            run_dir=str(self.run_dir.path),
            verdict=verdict,
            exit_code=code,
            steps=self.results,
            decision=ctx.found.report,
            files=ctx.found.files,
            notes=_notes(ctx),
        )

    def _one(self, ctx: Context, st: Any, sub: RunDir) -> tuple[Status, str]:
        inputs = {"rollout": self.run_dir.path.name, "step": st.name, "kind": st.step}
        inputs.update(st.model_dump(exclude={"name", "step", "when", "on_fail"}))
        extra = {"change": self.change.model_dump(mode="json")} if self.change else {}
        try:
            done: Done = STEPS[st.step](ctx, st, sub)
        except OpsError as exc:
            sub.write_record(
                inputs=inputs,
                outcome="error",
                exit_code=exc.exit_code,
                error=exc.to_dict(),
                **extra,
            )
            return "error", exc.message
        except BaseException as exc:  # Ctrl-C or a bug: the step's record still says so
            interrupted = isinstance(exc, KeyboardInterrupt)
            # with what it finished, where the step keeps that
            # (ops.measure.profile.ProfileInterrupted)
            partial = getattr(exc, "partial_sections", {}) if interrupted else {}
            sub.write_record(
                inputs=inputs,
                outcome="interrupted" if interrupted else "crashed",
                exit_code=EXIT_INTERRUPTED if interrupted else EXIT_INTERNAL,
                error={"error": type(exc).__name__, "message": str(exc)},
                **partial,
                **extra,
            )
            raise
        sub.write_record(
            inputs={**inputs, **done.inputs},
            outcome=done.outcome,
            exit_code=done.exit_code,
            **done.sections,
            **extra,
        )
        return done.status, done.detail

    def _done(self, i: int, st: Any, status: Status, secs: float, detail: str, sub: RunDir) -> None:
        self.results.append(
            StepResult(
                index=i,
                name=st.name,
                step=st.step,
                status=status,
                seconds=round(secs, 3),
                detail=detail,
                record=str(sub.path / "record.json"),
            )
        )


def _worst(results: list[StepResult]) -> tuple[int, str]:
    """Exit code and outcome of a playbook without a report: its worst step."""
    seen = {r.status for r in results}
    for status, code, word in (
        ("error", EXIT_BAD_INPUT, "error"),
        ("fail", EXIT_FAIL, "fail"),
        ("hold", EXIT_HOLD, "hold"),
    ):
        if status in seen:
            return code, word
    return EXIT_OK, "pass"


def _notes(ctx: Context) -> list[str]:
    notes: list[str] = []
    verdict = ctx.found.report["verdict"] if ctx.found.report else None
    res, ch = ctx.found.deploy, ctx.change
    if ch is None:
        return notes
    name = ctx.target.name
    listed = ctx.target.service.components.get(ch.component)
    if ctx.arms.recheck_left_on is not None:
        notes.append(
            f"the measure's recheck could not switch the candidate back in: {name} runs release "
            f"{ctx.arms.recheck_left_on} ({ch.component} = {ch.baseline}); "
            f"`ops rollback {name} --to {res.release if res else '?'}` puts the candidate back"
        )
    elif res is not None and res.outcome == "deployed" and verdict != "GO":
        # deployed on decide's GO, then the measure did not confirm it: say it is live
        notes.append(
            f"{name} still runs the candidate {ch.component} = {ch.candidate} (release "
            f"{res.after}), though the verdict is {verdict or 'none'}: `ops rollback {name}` "
            f"returns to {res.before}"
        )
    elif res is not None and res.outcome == "deployed" and listed != ch.candidate:
        says = (
            f"the inventory says {ch.component} = {listed}"
            if listed
            else f"the inventory names no {ch.component} (its releases then take the engine's "
            "default)"
        )
        notes.append(
            f"{name} now runs {ch.component} = {ch.candidate} (release {res.after}), and {says}: "
            f'set [targets.{name}.service.components] {ch.component} = "{ch.candidate}" so the '
            "next deploy keeps it"
        )
    return notes
