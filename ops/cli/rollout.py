"""`ops rollout TARGET [--playbook FILE|NAME] [--set KEY=VALUE ...] [--json]`.

Validates the playbook whole (overrides applied, the change against the inventory) before
anything runs, then runs it (ops.rollout.runner), one stderr line per step as it goes. Exit codes as
the report: 0 GO, 1 NO-GO, 3 HOLD; 2 a bad playbook, override or target (one line naming the
step and the field). The `--set` keys are listed in ops.rollout.playbook's docstring and `--help`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from ops.cli.common import (
    InventoryOpt,
    JsonOpt,
    TargetArg,
    command,
    emit_json,
    err,
    escape,
    out,
    record_error,
    say_record,
    state,
)

if TYPE_CHECKING:
    from ops.rollout.runner import RolloutResult

STYLE = {"GO": "bold green", "NO-GO": "bold red", "HOLD": "bold yellow"}
MARK = {
    "ok": "[green]ok[/]",
    "fail": "[red]FAIL[/]",
    "hold": "[yellow]HOLD[/]",
    "skip": "[dim]skip[/]",
    "error": "[red]ERROR[/]",
    "interrupted": "[red]interrupted[/]",
}
SET_HELP = (
    "Override a playbook value (repeatable): change.component|baseline|candidate, "
    "change.shape.KEY, threshold, target_concurrency, load.concurrency (1,8,32), "
    "load.requests|input_len|output_len|timeout, or STEP.FIELD (e.g. bench.gpu=7, "
    "deploy.allow_dirty=true, measure.repeats=3, preflight.aa_runs=0)."
)


@command
def rollout(
    ctx: typer.Context,
    target: TargetArg,
    playbook: Annotated[
        str | None,
        typer.Option(
            "--playbook",
            "-p",
            metavar="FILE",
            help="Playbook file, or a name in playbooks/ (rollout, bench-only, "
            "healthcheck-only). Default: playbooks/rollout.yaml.",
        ),
    ] = None,
    sets: Annotated[
        list[str] | None, typer.Option("--set", metavar="KEY=VALUE", help=SET_HELP)
    ] = None,
    _json: JsonOpt = False,
    _inventory: InventoryOpt = None,
) -> int:
    """Run a playbook against TARGET: preflight, bench, profile, decide, deploy if GO, report."""
    # imported here, not at the top: every other `ops` command starts without yaml and the
    # playbook and rollout models (~50 ms of each CLI start)
    from ops.rollout.playbook_load import load_playbook
    from ops.rollout.runner import Runner, check_target

    pb = load_playbook(playbook, sets or [])
    st = state(ctx)
    t = st.target(target)
    check_target(pb, t)
    label = pb.change.label if pb.change else "no change"
    err.print(f"rollout {escape(t.name)}: {escape(pb.name)} ({escape(label)})")
    inputs = {
        "target": t.name,
        "playbook": pb.path,
        "sets": list(sets or []),
        "resolved": pb.model_dump(mode="json"),
    }
    runner = Runner(pb, t, lambda line: err.print(escape(line), soft_wrap=True))
    res = runner.run(inputs)
    if st.as_json:
        emit_json({**res.model_dump(mode="json"), **record_error(runner.run_dir)})
    else:
        _print(res)
    say_record(runner.run_dir, where=not st.as_json)
    return res.exit_code


def _print(res: RolloutResult) -> None:
    from rich.table import Table

    table = Table(title=f"rollout {escape(res.target)}", title_justify="left")
    for col in ("#", "step", "status", "s", "detail"):
        table.add_column(col, overflow="fold", justify="right" if col in ("#", "s") else "left")
    for r in res.steps:
        table.add_row(
            str(r.index),
            r.name,
            _mark(r.name, r.status, res.verdict, r.detail),
            f"{r.seconds:.1f}",
            escape(r.detail),
        )
    out.print(table)
    if res.verdict:
        out.print(f"[{STYLE[res.verdict]}]{res.verdict}[/]: {escape(res.change or '')}")
        d = res.decision or {}
        # the verdict's own reasons; a NO-GO is not also called HOLD (its open questions are
        # in the report), a HOLD has no NO-GO reason by construction
        key = {"NO-GO": "failed", "HOLD": "holds"}.get(res.verdict)
        for r in d.get(key, []) if key else []:
            out.print(
                f"  [{STYLE[res.verdict]}]{res.verdict}[/] {r['code']}: {escape(r['message'])}",
                soft_wrap=True,
            )
        if res.verdict == "NO-GO" and d.get("holds"):
            n = len(d["holds"])
            out.print(f"  [dim]and {n} open question(s) the report lists[/]", soft_wrap=True)
    for note in res.notes:
        out.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    for f in res.files:
        err.print(f"[dim]report: {escape(str(f))}[/]", soft_wrap=True)  # whole: copyable


def _mark(step: str, status: str, verdict: str | None, detail: str = "") -> str:
    """A step's status word. The steps that carry a decision (decide, report) show their own
    verdict (its detail starts with it), not FAIL: a NO-GO is the rollout working, not its
    report failing; and decide's GO stays GO though a later measure made the report HOLD."""
    own = detail.split(":", 1)[0].strip()
    if step in ("decide", "report") and status in ("fail", "hold", "ok"):
        said = own if own in STYLE else verdict
        if said:
            return f"[{STYLE[said]}]{said}[/]"
    return MARK[status]
