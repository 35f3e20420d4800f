"""`python -m ops` is the `ops` command."""

from ops.cli import main

main()
