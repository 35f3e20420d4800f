"""The DDTree vocabulary, said once: the components a release swaps and the backends each can
run on (and which of them run on the host), the engine's default backend per component, what
the SGLang import hook can swap, and the stage names of a decode step as the engine's stage
clock counts them (one of which is inside another).

Standard library only, and shipped in every release (`checks/` is part of the data plane): the
engine (`engine.components`, `engine.stats`), the control plane (`ops.hosts.inventory`,
`ops.sections`, `ops.measure.counters`, `ops.deploy.release`), the checks
(`checks.hook_counters`) and the hook (`integration.hook`) all import these names from here.
"""

from __future__ import annotations

# component -> the backends it can run on (engine.backends binds them to code)
COMPONENTS: dict[str, tuple[str, ...]] = {
    "topk": ("reference", "cuda"),
    "tree_build": ("reference", "cpp", "cuda"),
    "accept": ("reference", "cpp", "cuda"),
    "attention": ("torch", "cuda"),
}
# what a service runs where nothing names a backend: the references (and torch attention)
DEFAULT_BACKENDS: dict[str, str] = {
    "topk": "reference",
    "tree_build": "reference",
    "accept": "reference",
    "attention": "torch",
}
# the components a service can time a candidate of beside the serving backend, on its own
# forwards (engine.shadow; ops profile --shadow)
SHADOWED = ("attention", "tree_build")
HOST_BACKENDS = ("reference", "cpp")  # run on the CPU: no GPU bench times them
# what the SGLang import hook can put in the fork's place (`reference`: the fork's own function)
HOOK_BACKENDS: dict[str, tuple[str, ...]] = {
    "tree_build": ("reference", "cpp", "cuda"),
    "accept": ("reference", "cpp"),
    # the newer fork's GPU accept walk (its Triton kernel), on the project's CUDA kernel
    "gpu_accept": ("reference", "cuda"),
}
# a decode step's stages, in order, as the engine's stage clock counts them
STAGES = ("draft", "topk", "tree_build", "verify", "attention", "accept", "commit")
NESTED_STAGES = {"attention": "verify"}  # part of another stage's time, not added on top
STEP_STAGES = tuple(s for s in STAGES if s not in NESTED_STAGES)  # these add up to the step
COMPONENT_STAGE = {c: c for c in COMPONENTS}  # whose time a component's change shrinks
MAX_TOKENS = 4096  # greedy tokens per golden prompt: identity needs dozens, never a context
