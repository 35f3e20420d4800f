"""The data plane's command lines: an argparse whose mistakes are one line on stderr, exit 2.

`OneLineParser` is what `python -m kernels.bench`, `python -m engine.bench` and the benchmark
scripts parse with: a bad flag prints `error: <argparse's message>` and exits 2, instead of
argparse's usage block. Standard library only.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line and exit 2, not the usage block
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
