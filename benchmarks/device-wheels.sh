#!/usr/bin/env bash
# The wheels a GPU device machine needs before this project runs there: the packages its image
# lacks (the library's device/KINDS.md lists what it has: torch, numpy, typer, rich, jinja2,
# requests, httpx, ...), each at the version installed here, for the device's Python 3.12 on
# x86-64 Linux, into ./.whl (git-ignored). The device scripts (verify-all.sh, rollout-gpu.sh,
# deploy-gpu.sh) install ./.whl into /tmp/site when it is there (benchmarks/preamble.sh). It runs
# here, not on the device, so it does not source the preamble.
# fastapi 0.165 (the version installed here) needs opentelemetry-api; without it the engine's HTTP front end exits at import.
# These versions and platform tags made the set that ran on the H200 device on 2026-12-02.
# Usage, project root, on this machine (pip must reach an index): bash benchmarks/device-wheels.sh
set -euo pipefail
PKGS=(fastapi starlette uvicorn pydantic pydantic_core annotated-types typing-inspection
      opentelemetry-api fabric paramiko invoke bcrypt pynacl cryptography cffi pycparser
      decorator deprecated openai distro jiter)
pins=()
for p in "${PKGS[@]}"; do
  v=$(python3 -m pip show "$p" 2>/dev/null | awk '/^Version:/{print $2}' || true)
  if [ -n "$v" ]; then pins+=("$p==$v"); else pins+=("$p"); echo "note: $p not installed here: the index's newest" >&2; fi
done
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .whl "${pins[@]}"
ls .whl
