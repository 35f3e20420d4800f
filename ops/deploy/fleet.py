"""Deploy to a group: the first host is the canary and goes all the way alone, then the rest in
waves of `wave_size` hosts in parallel. The first failure stops the rollout: the failing wave
is returned to where it was, hosts not yet reached are untouched, and every host's outcome is
kept (fabric's GroupResult habit: no host's result is ever lost).

Ctrl-C stops every host of the wave in progress at once (each deploy thread gets the
KeyboardInterrupt a single-host deploy would get, so the step in progress stops and the host's
guard puts it back), waits for each host's guard, reports each host with where it was left
(current release, service state), and reaches no further wave. Only the first Ctrl-C (or
SIGTERM) is taken, as in a single-host deploy: later ones are ignored, so the table and the
record always have every host."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

from ops.deploy.deploy import Deployer, DeployInterrupted, DeployOptions, DeployResult, Step
from ops.deploy.host_actions import interrupted_once
from ops.errors import OpsError
from ops.hosts.inventory import Target
from ops.hosts.remote import open_host

Progress = Callable[[str, str, Step | None], None]


def deploy_one(target: Target, opts: DeployOptions, progress: Progress) -> DeployResult:
    """Deploy to one target; an OpsError (unreachable, lock held, ...) becomes a failed result."""
    try:
        with open_host(target) as host:
            return Deployer(host, opts, lambda n, s: progress(target.name, n, s)).run()
    except OpsError as exc:
        return DeployResult(
            target=target.name, outcome="failed", message=exc.message, failed_step="connect"
        )


def undo(target: Target, result: DeployResult, opts: DeployOptions, progress: Progress) -> None:
    """Return a host that succeeded inside a failing wave to the release it had before."""
    if not result.ok or not result.before or result.before == result.after:
        return
    try:
        with open_host(target) as host:
            back = Deployer(host, opts, lambda n, s: progress(target.name, n, s)).rollback(
                result.before, f"ops deploy (a failing wave: back to {result.before})"
            )
    except DeployInterrupted as exc:
        back = exc.result
    except OpsError as exc:
        result.message += f"; could not return to {result.before}: {exc.message}"
        return
    result.steps += back.steps
    if back.outcome in ("switched", "already-current"):
        result.outcome = "rolled-back"
        result.after = back.after
        result.message = f"returned to {result.before}: another host of its wave failed"
    else:
        if back.outcome == "interrupted":  # Ctrl-C in the undo: said as the host's outcome
            result.outcome = "interrupted"
        result.after = back.after or result.after
        result.message += f"; could not return to {result.before}: {back.message}"


def _interrupt(thread: threading.Thread) -> None:
    """Raise KeyboardInterrupt in `thread` (at its next Python instruction; the hosts' command
    loops poll, so a running remote command is stopped as on a single-host Ctrl-C)."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt)
        )


def run_wave(
    wave: list[Target], opts: DeployOptions, progress: Progress
) -> tuple[list[DeployResult], bool]:
    """Deploy to the hosts of one wave in parallel: (their results in order, interrupted).

    Ctrl-C (the first one: `deploy_group` ignores the rest) interrupts every host's deploy and
    waits for each: its guard puts the host back and its result says where the host was left."""
    results: dict[str, DeployResult] = {}
    lock = threading.Lock()
    live: set[str] = {t.name for t in wave}
    stop = threading.Event()  # set by the interrupt: a deploy not yet begun never begins
    # waited on instead of Thread.join: a join that Ctrl-C interrupts marks a live thread
    # as stopped (CPython's bpo-45274 handling), so a second join would not wait for it
    finished = threading.Semaphore(0)

    def interrupted(t: Target) -> DeployResult:
        return DeployResult(
            target=t.name,
            outcome="interrupted",
            failed_step="connect",
            message="interrupted before the deploy began; nothing was changed",
        )

    def work(t: Target) -> None:
        res: DeployResult | None = None
        while True:  # the one interrupt may land anywhere, even after the deploy returned
            try:
                if res is None:
                    res = interrupted(t) if stop.is_set() else deploy_one(t, opts, progress)
                with lock:
                    if t.name in live:
                        results[t.name] = res
                        live.discard(t.name)
                        finished.release()
                return
            except DeployInterrupted as exc:
                res = res or exc.result
            except KeyboardInterrupt:
                res = res or interrupted(t)
            except Exception as exc:  # a bug: still a result, never a lost host
                res = res or DeployResult(
                    target=t.name, outcome="failed", failed_step="crashed", message=repr(exc)
                )

    threads = {
        t.name: threading.Thread(target=work, args=(t,), name=f"deploy {t.name}", daemon=True)
        for t in wave
    }
    started: set[str] = set()  # threads whose start() returned (is_alive() is true from then)
    quiet: set[str] = set()  # threads seen not alive at the previous poll

    def lost() -> int:
        """Results for hosts whose thread ended without one (its interrupt landed before its
        deploy began, so nothing was changed): how many were filled in."""
        n = 0
        with lock:
            for t in wave:
                th = threads[t.name]
                if t.name not in live or th.ident is None or th.is_alive():
                    quiet.discard(t.name)
                    continue
                if t.name in started or t.name in quiet:  # really over, not still starting
                    results[t.name] = interrupted(t)
                    live.discard(t.name)
                    n += 1
                quiet.add(t.name)
        return n

    stopped, waiting = False, len(wave)
    try:
        for name, th in threads.items():
            th.start()
            started.add(name)
        while waiting:
            waiting -= 1 if finished.acquire(timeout=0.2) else lost()
    except KeyboardInterrupt:
        stopped = True
        stop.set()
        with lock:
            for name in live:
                _interrupt(threads[name])
        while waiting:  # every host's guard has its say: no further Ctrl-C is taken
            waiting -= 1 if finished.acquire(timeout=0.2) else lost()
    return [results[t.name] for t in wave], stopped


def deploy_group(
    targets: list[Target], opts: DeployOptions, wave_size: int, progress: Progress
) -> list[DeployResult]:
    """Canary, then waves; every host's result, in the order of `targets`. Only the first
    Ctrl-C (or SIGTERM) is taken: it stops the wave in progress, whose hosts' guards put them
    back, and every host is reported, with where it was left (probe37b B12: a second Ctrl-C
    used to leave at once, with no host's result and nothing in the record)."""
    with interrupted_once() as taken:
        return _deploy_group(targets, opts, wave_size, progress, taken)


def _deploy_group(
    targets: list[Target],
    opts: DeployOptions,
    wave_size: int,
    progress: Progress,
    taken: list[int],
) -> list[DeployResult]:
    results: dict[str, DeployResult] = {}
    waves = [targets[:1]] + [
        targets[i : i + wave_size] for i in range(1, len(targets), max(1, wave_size))
    ]
    why: str | None = None
    for wave in waves:
        try:
            if why is None and taken:  # Ctrl-C between waves (or in an undo)
                why = INTERRUPTED
            if why is not None:
                for t in wave:
                    results[t.name] = DeployResult(
                        target=t.name, outcome="not-reached", failed_step="not reached", message=why
                    )
                continue
            done, stopped = run_wave(wave, opts, progress)
            for t, r in zip(wave, done, strict=True):
                results[t.name] = r
            if stopped:
                why = INTERRUPTED
            elif not all(r.ok for r in done) and not opts.dry_run:
                why = "untouched: the rollout stopped at an earlier failure"
                for t, r in zip(wave, done, strict=True):
                    if taken:
                        if r.ok and r.before and r.before != r.after:
                            r.message += f"; not returned to {r.before}: {INTERRUPTED_UNDO}"
                        continue
                    undo(t, r, opts, progress)
        except KeyboardInterrupt:  # outside a wave's hosts: nothing of this wave was begun
            why = INTERRUPTED
            for t in wave:
                results.setdefault(
                    t.name,
                    DeployResult(
                        target=t.name, outcome="not-reached", failed_step="not reached", message=why
                    ),
                )
    return [results[t.name] for t in targets]


INTERRUPTED = "untouched: the rollout was interrupted"
INTERRUPTED_UNDO = "the rollout was interrupted (Ctrl-C)"
