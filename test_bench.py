"""Smoke tests of bench.py: `--quick` runs end to end in under a minute, bad arguments fail in one line."""

import os
import re
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
LAST_LINE = re.compile(r"worst ratio ours/torch: (nan|\d+\.\d+)")


def run_bench(*args, timeout=180):
    return subprocess.run([sys.executable, os.path.join(HERE, "bench.py"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=HERE)


def test_quick_runs_and_ends_with_the_worst_ratio():
    start = time.perf_counter()
    out = run_bench("--quick")
    seconds = time.perf_counter() - start
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert LAST_LINE.fullmatch(lines[-1]), f"last line {lines[-1]!r}"
    assert any("sgemm" in line for line in lines) and any("peak RSS" in line for line in lines)
    assert sum("ours with 1 Numba thread" in line for line in lines) == 2      # one per quick shape
    assert sum(re.search(r"matrix products alone: .* GFLOP/s = \d+% of 2-thread sgemm; at 50% a step takes", line)
               is not None for line in lines) == 2
    assert sum(line.startswith("an almost empty parallel loop: ") for line in lines) == 1
    assert sum("(1 thread " in line for line in lines) == 2 * 9                # each kernel, each shape
    print(f"bench.py --quick took {seconds:.0f} s")    # informative only: CI's cores are shared


@pytest.mark.parametrize("args", [["--repeats", "0"], ["--repeats", "many"], ["--shapes", "bij-default,nope"],
                                  ["--no-such-flag"]])
def test_bad_arguments_give_one_line_and_exit_code_2(args):
    out = run_bench(*args, timeout=180)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench.py: error: "), out.stderr


def test_torch_is_optional(monkeypatch):
    import bench
    monkeypatch.setitem(sys.modules, "torch", None)           # `import torch` now raises ImportError
    assert bench.torch_available() is None
