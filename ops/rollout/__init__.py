"""Playbook rollouts: the YAML playbook model and its loading (`playbook`, `playbook_load`), the
runner (`runner`), its steps (`steps`) and the measure's release switches (`switch`).

Runs on the operator's machine; may import every other part of `ops` except the CLI.
"""
