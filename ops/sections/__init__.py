"""The record sections as typed models: the one contract between the parts that measure and the
part that decides. Runs on the operator's machine; imports only pydantic, `checks.vocabulary`
and itself (`common` below the rest).

Every command writes `runs/<dir>/record.json` (ops.hosts.records): an envelope plus one section
per kind of evidence. Each section is built as its model by its producer and dumped from it;
ops.verdict.evidence validates it back into the same model when the report reads it:

    healthcheck  health.HealthReport    ops.measure.healthcheck (pre/post-flight)
    bench        bench.BenchSection     ops.measure.bench (rows, guard, probe, environment)
    profile      profile.ProfileSection ops.measure.profile (per level: step, stages, f, shadow)
    measure      measure.MeasureSection ops.rollout.switch (tokens/s before/after, A/A, audit)
    change       change.Change          a rollout's playbook or `ops report --change`

Extra fields are allowed and kept (`common.OpenModel`), so a producer may record more than the
report reads.
"""
