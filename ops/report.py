"""`ops.verdict.decide.projected_gain(f, s)`: the gain formula under the name the design promises.

The verdict itself lives in `ops.verdict` (`ops.verdict.decide` decides, `ops.verdict.amdahl`
holds the model); this module only keeps the stable import path for users' scripts.
"""

from ops.verdict.amdahl import projected_gain

__all__ = ["projected_gain"]
