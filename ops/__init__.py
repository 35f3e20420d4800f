"""ddtree-ops, the control plane: it runs on the operator's machine and never imports torch.

Its parts, one subpackage each: `cli` (the `ops` command), `hosts` (inventory, Host, facts,
records), `service` (service managers), `deploy` (releases, deploy, rollback, fleet),
`hostside` (stdlib scripts sent to a host), `measure` (bench, probe, profile, shadow, load,
healthcheck), `verdict` (evidence, the Amdahl model, the decision, reports) and `rollout`
(playbooks and their runner). `errors` and `files` serve them all.
"""
