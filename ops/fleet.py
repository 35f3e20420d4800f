"""Deploy to a group: the first host is the canary and goes all the way alone, then the rest in
waves of `wave_size` hosts in parallel. The first failure stops the rollout: the failing wave
is returned to where it was, hosts not yet reached are untouched, and every host's outcome is
kept (fabric's GroupResult habit: no host's result is ever lost)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ops.deploy import Deployer, DeployOptions, DeployResult, Step
from ops.errors import OpsError
from ops.inventory import Target
from ops.remote import open_host

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
                result.before
            )
        result.steps += back.steps
        result.outcome = "rolled-back"
        result.after = back.after
        result.message = f"returned to {result.before}: another host of its wave failed"
    except OpsError as exc:
        result.message += f"; could not return to {result.before}: {exc.message}"


def deploy_group(
    targets: list[Target], opts: DeployOptions, wave_size: int, progress: Progress
) -> list[DeployResult]:
    results: dict[str, DeployResult] = {}
    waves = [targets[:1]] + [
        targets[i : i + wave_size] for i in range(1, len(targets), max(1, wave_size))
    ]
    stopped = False
    for wave in waves:
        if stopped:
            for t in wave:
                results[t.name] = DeployResult(
                    target=t.name,
                    outcome="failed",
                    failed_step="not reached",
                    message="untouched: the rollout stopped at an earlier failure",
                )
            continue
        with ThreadPoolExecutor(max_workers=len(wave)) as pool:
            done = list(pool.map(lambda t: deploy_one(t, opts, progress), wave))
        for t, r in zip(wave, done, strict=True):
            results[t.name] = r
        if not all(r.ok for r in done) and not opts.dry_run:
            stopped = True
            for t, r in zip(wave, done, strict=True):
                undo(t, r, opts, progress)
    return [results[t.name] for t in targets]
