"""Pure parts of the kernel benchmark: the statistics helper and the speedup bookkeeping."""

from __future__ import annotations

import pytest

from kernels.bench import add_speedups, row
from kernels.timing import summarize


def test_summarize_median_and_quartiles():
    t = summarize([5.0, 1.0, 3.0, 2.0, 4.0], "events")
    assert (t.median_us, t.p25_us, t.p75_us, t.iqr_us, t.reps) == (3.0, 2.0, 4.0, 2.0, 5)
    one = summarize([7.0], "host")
    assert one.median_us == one.p25_us == one.p75_us == 7.0 and one.iqr_us == 0.0
    g = summarize([1.0, 2.0], "graph", launches=32)
    assert g.median_us == 1.5 and g.launches_per_sample == 32
    with pytest.raises(ValueError):
        summarize([], "events")


def test_speedups_name_their_baselines():
    shape = {"B": 64}
    rows = [
        row("tree", "build_trees", "cuda_graph", shape, summarize([10.0], "graph")),
        row("tree", "build_trees", "cpu_python", shape, summarize([7000.0], "host")),
        row("tree", "build_trees", "cpu_cpp", shape, summarize([230.0], "host")),
        row("tree", "build_trees", "cuda_graph", {"B": 1}, summarize([5.0], "graph")),
    ]
    add_speedups(rows)
    assert rows[0]["speedup"] == {"cpu_python": 700.0, "cpu_cpp": 23.0}
    assert rows[3]["speedup"] == {}  # no baseline of that shape
    assert "speedup" not in rows[1] and "samples_us" not in rows[0]


def test_cli_sees_the_registered_suites():
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.run(
        [sys.executable, "-m", "kernels.bench", "--suite", "nope"],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.returncode == 2
    assert "known: ['accept', 'topk', 'tree'" in proc.stderr or "'topk'" in proc.stderr


def test_unknown_suite_or_variant_is_exit_2(capsys):
    from kernels.bench import main, suites

    assert set(suites()) == {"topk", "tree", "accept", "attn", "engine_attn", "integration"}
    assert main(["--suite", "nope"]) == 2
    assert "unknown suite" in capsys.readouterr().err
    assert main(["--suite", "tree", "--variants", "v6"]) == 2  # a tuning-step name
    assert "unknown variant(s) ['v6']" in capsys.readouterr().err
    assert main(["--suite", "topk", "--variants", "heap"]) == 2  # no selected suite knows it
    assert "heap" in capsys.readouterr().err


def test_compare_pairs_rows_of_two_runs():
    from kernels.bench import compare

    def doc(us: float, impl: str = "cuda_graph") -> dict:
        return {"results": [row("tree", "build_trees", impl, {"B": 64}, summarize([us], "graph"))]}

    got = compare([doc(10.0), doc(12.0), doc(11.0)], [doc(5.5), doc(5.5, "cuda_graph:heap")])
    assert len(got) == 1
    assert (got[0]["base_us"], got[0]["new_us"], got[0]["ratio"]) == (11.0, 5.5, 0.5)


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="the no-GPU path (a GPU host times the suites)"
)
@pytest.mark.parametrize("suite", ["tree", "topk", "accept", "attn"])
def test_kernel_suites_without_a_gpu_say_so_and_exit_0(suite, capsys):
    import json

    from kernels.bench import main

    assert main(["--suite", suite, "--batch", "1", "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["results"] == [] and "no CUDA device" in err
    assert [n.split(":")[0] for n in doc["notes"]] == [f"{suite} suite"]


def _drifting(costs: dict[str, float], slow) -> tuple[dict, list[str]]:
    """Samplers of stages costing `costs` (us) on a host whose speed changes with time: the
    k-th sample taken overall costs `slow(k)` times more. Returns them and the call log."""
    log: list[str] = []

    def sampler(name: str):
        def sample(r: int) -> float:
            log.append(name)
            return costs[name] * slow(len(log) - 1)

        return sample

    return {n: sampler(n) for n in costs}, log


def test_interleave_takes_turns_and_mirrors_each_rep():
    from kernels.timing import interleave

    samplers, log = _drifting({"a": 1.0, "b": 2.0, "c": 3.0}, lambda k: 1.0)
    out = interleave(samplers, reps=4)
    assert log == list("abccbaabccba")
    assert {n: len(v) for n, v in out.items()} == {"a": 4, "b": 4, "c": 4}


@pytest.mark.parametrize(
    "slow",
    [
        lambda k: 1.0 + 0.01 * k,  # a host slowing steadily over the run
        lambda k: 3.0 if 10 <= k < 40 else 1.0,  # a neighbour's burst in the middle of it
    ],
    ids=["drift", "spell"],
)
def test_interleaved_ratio_holds_where_one_after_the_other_does_not(slow):
    """The stage ratio the rollout projects with (b costs 2x a): sampled in turn it comes out
    right under drift or a slow spell; sampled one stage after the other (the old order) the
    same host makes it wrong."""
    from kernels.timing import interleave

    samplers, _ = _drifting({"a": 100.0, "b": 200.0}, slow)
    out = interleave(samplers, reps=40)
    ratio = summarize(out["b"], "stage").median_us / summarize(out["a"], "stage").median_us
    assert ratio == pytest.approx(2.0, rel=0.03)
    samplers, _ = _drifting({"a": 100.0, "b": 200.0}, slow)
    seq = {n: [s(r) for r in range(40)] for n, s in samplers.items()}
    wrong = summarize(seq["b"], "stage").median_us / summarize(seq["a"], "stage").median_us
    assert abs(wrong / 2.0 - 1) > 0.1
