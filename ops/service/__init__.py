"""Service managers: systemd (production) and ops's own process manager (local, containers, CI),
behind one interface (`managers`).

Runs on the operator's machine; the process manager's host side is `ops.hostside.procman`, sent
as source text.
"""
