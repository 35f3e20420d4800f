"""The decision: evidence read back from run records as typed models (`evidence`), the Amdahl model
(`amdahl`), GO / NO-GO / HOLD and its reasons (`decide`), the audit of a projection against a
measured gain (`gain_audit`), number formatting (`numbers`) and the md / html reports (`render`,
`templates/`).

Runs on the operator's machine from records alone (no host needed); imports no other part of ops
but `ops.errors` and `ops.files`.
"""
