"""Smoke tests of bench/transformer.py: `--quick` runs end to end in under a minute, bad arguments fail in one line."""

import os
import re
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository's folder
LAST_LINE = re.compile(r"worst ratio ours/torch: (nan|\d+\.\d+)")
PRODUCTS_LINE = re.compile(r"  the step's (\d+) layer products alone \(kernels\.PRODUCTS; attention's own products "
                           r"count in the rest\): \d+\.\d\d ms \(IQR .*\)  \d+\.\d GFLOP/s = \d+% of 2-thread "
                           r"sgemm; at 50% a step takes \d+\.\d ms, which leaves -?\d+\.\d ms for the rest "
                           r"\(now -?\d+\.\d ms\)")


def run_bench(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "bench.transformer", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.ci_only
def test_quick_runs_and_ends_with_the_worst_ratio():
    start = time.perf_counter()
    out = run_bench("--quick")
    seconds = time.perf_counter() - start
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert LAST_LINE.fullmatch(lines[-1]), f"last line {lines[-1]!r}"
    assert any("sgemm" in line for line in lines) and any("Numba compile" in line for line in lines)
    assert sum("ours with 1 Numba thread" in line for line in lines) == 2      # one per quick shape
    products = [PRODUCTS_LINE.fullmatch(line) for line in lines if "layer products alone" in line]
    assert len(products) == 2 and all(products), [line for line in lines if "products" in line]
    assert [int(m.group(1)) for m in products] == [21, 21]         # 18 per layer + 3 for the unembedding
    assert sum(line.startswith("an almost empty parallel loop: ") for line in lines) == 1
    assert sum("(1 thread " in line for line in lines) == 2 * 9                # each kernel, each shape
    print(f"bench/transformer.py --quick took {seconds:.0f} s")    # informative only: CI's cores are shared


@pytest.mark.parametrize("args", [["--repeats", "0"], ["--repeats", "many"], ["--shapes", "bij-default,nope"],
                                  ["--no-such-flag"]])
def test_bad_arguments_give_one_line_and_exit_code_2(args):
    out = run_bench(*args, timeout=900)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m bench.transformer: error: "), out.stderr


def test_torch_is_optional(monkeypatch):
    from bench import transformer as bench
    monkeypatch.setitem(sys.modules, "torch", None)           # `import torch` now raises ImportError
    assert bench.torch_available() is None


def test_step_products_records_the_layer_products_and_restores_matmul():
    import numpy as np
    import bayesattn as ba
    from bench import transformer as bench
    import kernels
    import layers
    before = dict(layers.FAST)
    cfg = ba.Config(vocab_size=7, n_classes=5, max_len=6, d_model=8, n_layers=2, n_heads=2, dtype="float32")
    rng = np.random.default_rng(0)
    batch = {"tokens": rng.integers(0, 7, (3, 6)), "targets": rng.integers(0, 5, (3, 6)), "mask": np.ones((3, 6))}
    step = bench.ours_step(cfg, ba.init_params(cfg, 0), batch)
    with kernels.enabled():                                   # the products are the fast path's (kernels.matmul)
        replay, flops, calls = bench.step_products(step)
    assert layers.FAST == before                              # the switch is off again
    assert all(getattr(kernels, name).__name__ == name for name in kernels.PRODUCTS)            # restored
    assert calls == 18 * cfg.n_layers + 3
    B, T = batch["tokens"].shape
    assert flops == ba.step_flops(cfg, B, T) - ba.attention_flops(cfg, B, T)      # every layer product
    replay()

    with layers.use_twins({}):                                # on the NumPy path no product is the twins'
        assert bench.step_products(step)[2] == 0

    def failing_step():
        kernels.matmul(np.ones((2, 2)), np.ones((2, 2)))
        raise RuntimeError("boom")
    originals = [getattr(kernels, name) for name in kernels.PRODUCTS]
    with pytest.raises(RuntimeError):
        bench.step_products(failing_step)
    assert [getattr(kernels, name) for name in kernels.PRODUCTS] == originals   # restored after an exception too


def test_the_products_table_lists_each_distinct_product_once(monkeypatch):
    """--products: at a tiny shape, one row per distinct product of a step (a transformer of one layer: forward
    q/k/v/o and the unembedding share a shape, the MLP's two; backward the pairs likewise), each with the
    multiply-adds of its first product and two positive times; a product called inside a pair (more threads
    than two cut each by rows) is not a row of its own."""
    from bench import transformer as bench
    import kernels
    monkeypatch.setitem(bench.SHAPES, "one-layer", dict(task="bijection", V=6, width=16, layers=1, heads=2, batch=4))
    with kernels.enabled():
        rows = bench.product_table("one-layer", 2)
    calls = [call for call, _, _, _ in rows]
    assert len(calls) == len(set(calls))
    assert sum(c.startswith("matmul(") for c in calls) == 4 and sum(c.startswith("matmul_pair(") for c in calls) == 4
    N = int(calls[0].split("(")[1].split("x")[0])                # the step's rows, B T
    assert ("matmul(%dx16 x 16x64)" % N, N * 16 * 64) in [(c, m) for c, m, _, _ in rows]
    assert all(w > 0 and c > 0 for _, _, w, c in rows)


def test_main_leaves_the_switch_as_it_found_it(monkeypatch):
    """bench.main runs the benchmark inside `with kernels.enabled():` and turns the switch back after it,
    also when the benchmark fails."""
    from bench import transformer as bench
    import kernels
    import layers
    before = dict(layers.FAST)
    seen = []

    def fake_bench(args):
        seen.append(dict(layers.FAST))
        raise RuntimeError("the benchmark failed")
    monkeypatch.setattr(bench, "bench", fake_bench)
    with pytest.raises(RuntimeError, match="the benchmark failed"):
        bench.main(["--quick"])
    assert set(seen[0]) == set(kernels.twins()) and all(seen[0][n] is getattr(kernels, n) for n in kernels.TWINS)
    assert layers.FAST == before


@pytest.mark.ci_only
def test_sgemm_alone_prints_one_line_in_gflops():
    """`python -m bench.transformer --sgemm`: the one number the documents' times are scaled by, in one line."""
    out = run_bench("--sgemm")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(r"sgemm 2048x2048 float32, 1 BLAS thread \(best of 3 runs\): [1-9]\d* "
                                            r"GFLOP/s  \(load [\d.]+ [\d.]+ [\d.]+\)", lines[0]), lines


def test_the_families_bench_builds_the_same_models_in_pytorch():
    """bench/recurrent.py: at a tiny shape, PyTorch's LSTM (nn.LSTM with our gate matrix split) and SSM (the
    scan as a loop and chunked) give our loss at the initial parameters; without PyTorch, our step alone."""
    import numpy as np
    from bench import recurrent as bf
    import models
    for family in bf.FAMILIES:
        cfg, params, batch = bf.setup(family, "tiny-hmm")
        ours = float(models.loss_and_grads(family, params, batch["tokens"], batch["targets"], batch["mask"], cfg)[0])
        if bench_torch() is None:
            continue
        opponents = [bf.torch_lstm(cfg, params, batch)] if family == "lstm" else \
            [bf.torch_ssm(cfg, params, batch, chunked) for chunked in (False, True)]
        for _, loss0 in opponents:
            assert np.isclose(loss0, ours, rtol=1e-5), (family, loss0, ours)
    cfg, params, batch = bf.setup("ssm", "hmm-paper")          # a preset's shape: the family's count
    assert abs(models.count_params(params) - 691_301) / 691_301 < 0.05 and len(batch["tokens"]) == 32


def bench_torch():
    from bench import transformer as bench
    return bench.torch_available()


@pytest.mark.parametrize("args", [["--repeats", "0"], ["--shapes", "nope"], ["--quick", "--shapes", "hmm-paper"],
                                  ["--families", "gru"], ["--families", ","]])
def test_the_families_bench_refuses_bad_arguments_in_one_line(args):
    out = subprocess.run([sys.executable, "-m", "bench.recurrent", *args], capture_output=True,
                         text=True, timeout=600, cwd=ROOT)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("python -m bench.recurrent: error: "), out.stderr


def test_the_roofline_splits_a_step_into_its_ops_own_times(monkeypatch):
    """On a clock that only the stand-in ops move: a linear op of 3 units around a product of 5, the optimiser's
    2, and 1 in the step itself. Exclusive times: the product 5, the linear op 3 (not 8: its product is
    taken out), the optimiser 2, the rest 1 of a step of 11; a family's own op (lstm_forward) 4 on its own
    line. The line gives each part's share of the step (5 / 15 = 33%)."""
    import kernels
    import layers
    import optim
    from bench import roofline
    clock = [0.0]
    tick = lambda units: clock.__setitem__(0, clock[0] + units)
    monkeypatch.setattr(roofline.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(kernels, "matmul", lambda a, b: tick(5))
    monkeypatch.setattr(optim, "adamw_step", lambda *a, **k: tick(2))

    def linear(x):
        tick(3)
        return kernels.matmul(x, x)

    def step():
        layers.FAST["linear_forward"](None)
        layers.FAST["lstm_forward"](None)
        optim.adamw_step()
        tick(1)
    with layers.use_twins({"linear_forward": linear, "lstm_forward": lambda x: tick(4)}):
        ops, total = roofline.exclusive_times(step, n=2)
        assert layers.FAST["linear_forward"] is linear                # switched back after
    assert ops == {"matmul": 5, "linear_forward": 3, "lstm_forward": 4, "adamw_step": 2} and total == 15
    parts = roofline.split(ops, total)
    assert parts["products"] == 5 and parts[roofline.OWN] == 4 and parts[roofline.REST] == 1
    assert parts["the optimiser"] == 2 and parts["linear, outside its product (bias, reshapes)"] == 3
    text = roofline.line(parts, total, 30e9, 100.0)      # the clock's units as seconds: 30 GFLOP in 15 s
    assert text.startswith("step 15000.00 ms, 30.000 GFLOP: 2.0 GFLOP/s = 2% of 2-thread sgemm; products 5000.00 ms "
                           "(33% of the step)") and "the family's own ops 4000.00 ms (27%)" in text


def test_tricks_switch_each_trick_off_around_a_step_and_back():
    """--tricks' in-process variants: inside `without` the trick is off (the threshold infinite, the pair two
    products in turn, the twins off), outside it is back, also when the step raises; the tricks only a fresh
    process can switch off name the environment variable kernels.py reads."""
    import contextlib
    import numpy as np
    from bench import transformer as bench
    import kernels
    import layers
    for label, (module, name, value) in bench.SWITCHED.items():
        ns = {"kernels": kernels, "layers": layers}
        exec(bench.WITHOUT.format(module=module, name=name, value=value), ns)
        before = getattr(kernels, name)
        with ns["without"]():
            inside = getattr(kernels, name)
            assert inside is not before and inside != before, label
        assert getattr(kernels, name) is before
        with pytest.raises(ZeroDivisionError), ns["without"]():
            1 / 0
        assert getattr(kernels, name) is before
    ns = {"kernels": kernels, "layers": layers}
    exec(bench.WITHOUT.format(module="kernels", name="matmul_pair", value=bench.SWITCHED[
        "a layer's two backward products in turn, each cut by rows (not side by side)"][2]), ns)
    a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    with ns["without"]():
        x, y = kernels.matmul_pair(a, b, a, a)
    assert np.array_equal(x, a @ b) and np.array_equal(y, a.T @ a)
    ns = {"kernels": kernels, "layers": layers, "contextlib": contextlib}
    exec(bench.NO_TWINS, ns)
    with kernels.enabled():
        with ns["without"]():
            assert layers.FAST == {}
        assert layers.FAST
        exec(bench.NO_ATTENTION_TWINS, ns)
        with ns["without"]():
            assert "attention_forward" not in layers.FAST and "layernorm_forward" in layers.FAST
        assert "attention_forward" in layers.FAST and "attention_backward" in layers.FAST
    assert bench.ENVIRONMENT and all(
        f'os.environ.get("{var}"' in open(kernels.__file__).read() for env in bench.ENVIRONMENT.values() for var in env)


def test_the_memory_floor_counts_each_array_once_and_an_inner_calls_arrays_in_the_inner_call():
    """A linear op over x (4x8 float32, 128 bytes) and w (8x2, 64), adding a bias (2, 8) to its product's
    result (4x2, 32) in a new array (32): the product moves 128 + 64 + 32 = 224 bytes, the linear op only what
    its product does not hold, the bias and its own result, 40 (264 if the inner call's arrays counted again,
    488 if each call's were added up); x passed twice, as its transpose and as views that overlap it counts
    once (128); arrays met only in a keyword argument, a list or a dict count (24 + 12 + 8); a strided view of
    memory nothing else holds counts its own bytes (every other row of a 4x4: 32 of the 64 it spans). The line
    gives each category outside the products its MB, its floor at the fastest and slowest bandwidth and its
    time."""
    import numpy as np
    import kernels
    import layers
    from bench import roofline
    x, w, bias = np.ones((4, 8), np.float32), np.ones((8, 2), np.float32), np.ones(2, np.float32)
    g, listed, held = np.ones(6, np.float32), np.ones(3, np.float32), np.ones(2, np.float32)
    grid = np.ones((4, 4), np.float32)

    def linear(x, w, bias):
        return kernels.matmul(x, w) + bias

    def step():
        layers.FAST["linear_forward"](x, w, bias)
        layers.FAST["attention_forward"](x, x.T, [x[:2], {"again": x[1:]}])
        layers.FAST["layernorm_forward"](x, g=g, cache=([listed], {"held": held}))
        layers.FAST["gelu_forward"](grid[::2])
    twins = {"linear_forward": linear, "attention_forward": lambda *a: None,
             "layernorm_forward": lambda *a, **k: None, "gelu_forward": lambda y: None}
    with kernels.enabled(), layers.use_twins(twins):
        moved = roofline.exclusive_bytes(step)
    assert moved == {"matmul": 224, "linear_forward": 40, "attention_forward": 128, "layernorm_forward": 128 + 44,
                     "gelu_forward": 32}
    assert roofline.distinct_bytes(roofline.arrays((grid, grid[::2]))) == 64     # the view inside its array
    assert roofline.distinct_bytes(roofline.arrays(np.broadcast_to(g[:1], (100,)))) == 4    # 400 bytes shown, 4 held
    assert roofline.distinct_bytes(roofline.arrays(x), below=[(0, 2 ** 62)]) == 0
    text = roofline.memory_line({"attention_backward": 2e6, "matmul": 5e9, "adamw_update": 0},
                                {"attention_backward": 1e-3, "matmul": 1.0}, {"L2": 100.0, "memory": 10.0})
    assert text == "attention 2.00 MB, floor 0.02-0.20 ms, takes 1.00 ms"


def test_the_copy_bandwidth_counts_both_copies_of_a_round_and_what_each_moves(monkeypatch):
    """Two arrays of 1 MiB, 2^29 / 2 MiB = 256 rounds of two copies in a run, each copy moving three times its
    1 MiB (read, written, and read by the cache before it is written): 6 MiB a round; on a clock that moves
    1 s a reading, 1.6106 GB/s (two thirds of that without the cache's read, half with one copy a round). The
    kernel itself: every element of both arrays moves in every copy of every round (b = a + 1, a = b + 1 from
    zeros: 2r - 1 and 2r after r rounds), whatever the threads' parts."""
    import itertools
    import numpy as np
    from bench import roofline
    for parts in (1, 2, 3):
        a, b = np.zeros(10, np.float32), np.zeros(10, np.float32)
        roofline._copy_back_and_forth(a, b, parts, 3)
        assert (b == 5).all() and (a == 6).all()
    ticks = itertools.count()
    monkeypatch.setattr(roofline.time, "perf_counter", lambda: float(next(ticks)))
    assert abs(roofline.copy_bandwidth(2 ** 20, repeats=2) - 3 * 2 ** 29 / 1e9) < 1e-12


# ----------------------------------------------------------------------------
# bench/scaling.py: how a step's cost grows

def test_the_exponent_is_the_least_squares_slope_of_log_time_on_log_size():
    from bench import scaling
    # three sizes in equal ratios: the middle point does not move the slope, log(16 / 1) / log(4) = 2; a slope
    # read from the first two points would be log2(3) = 1.585, one of time on size (not logs) 15 / 48 = 0.31
    assert scaling.exponent([16, 32, 64], [1.0, 3.0, 16.0]) == pytest.approx(2.0)
    # four sizes: log2 values 0, 1, 2, 6 at 0, 1, 2, 3: slope 9.5 / 5 = 1.9, where the ends alone give 2
    assert scaling.exponent([1, 2, 4, 8], [1.0, 2.0, 4.0, 64.0]) == pytest.approx(1.9)
    assert scaling.exponent([3, 6, 12], [5.0, 5.0, 5.0]) == 0.0
    for sizes, values in [([1, 2, 4], [1.0, 0.0, 2.0]), ([2, 2, 2], [1.0, 2.0, 3.0]), ([1, 2], [1.0, 2.0, 3.0])]:
        with pytest.raises(ValueError, match="exponent needs"):
            scaling.exponent(sizes, values)


def test_a_point_scales_one_axis_and_holds_the_others_as_the_command_line_would():
    from bench import scaling
    cfg, B, T, size = scaling.point("transformer", "default", "batch", 2.0)
    assert (B, T, cfg.d_model, size) == (128, 38, 64, 128)
    cfg, B, T, size = scaling.point("transformer", "default", "length", 0.5)
    assert (B, T, cfg.max_len, size) == (64, 19, 38, 19)               # the position table keeps its rows
    cfg, B, T, size = scaling.point("transformer", "default", "length", 2.0)
    assert (T, cfg.max_len) == (76, 76)
    cfg, B, T, size = scaling.point("transformer", "default", "width", 0.5)
    assert (B, T, cfg.d_model, cfg.d_mlp, cfg.n_heads, size) == (64, 38, 32, 128, 2, 32)
    base, _, _, _ = scaling.point("ssm", "default", "width", 1.0)     # capacity-matched: width 101, dt_rank 7
    cfg, _, _, size = scaling.point("ssm", "default", "width", 2.0)
    assert (base.d_model, base.dt_rank, cfg.d_model, cfg.dt_rank, size) == (101, 7, 202, 13, 202)   # ceil(202 / 16)
    with pytest.raises(ValueError, match="allowed are batch, length, width"):
        scaling.point("transformer", "default", "depth", 2.0)


def test_the_peak_memory_is_this_process_high_water_mark_in_mib():
    import numpy as np
    from bench import scaling
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    kib = lambda key: int(status[key].split()[0])
    grow = (kib("VmHWM") - kib("VmRSS")) * 1024 + 64 * 2 ** 20        # 64 MiB above the peak so far
    before = scaling.peak_mib()
    assert before == pytest.approx(kib("VmHWM") / 1024, abs=8)       # MiB, not KiB or bytes
    assert scaling.current_mib() == pytest.approx(kib("VmRSS") / 1024, abs=8)
    block = np.ones(grow // 8)                                        # written, so resident
    del block                                                         # the peak stays, the resident memory not
    after = scaling.peak_mib()
    assert 56 < after - before < 80, (before, after)
    assert after - scaling.current_mib() > 48


@pytest.mark.parametrize("args", [["--families", "transformer,gru"], ["--table", "speed"], ["--repeats", "0"]])
def test_the_scaling_bench_refuses_bad_arguments_in_one_line(args):
    out = subprocess.run([sys.executable, "-m", "bench.scaling", *args], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 2 and out.stdout == "", (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m bench.scaling: error: ") \
        and args[1].split(",")[-1] in lines[0]


@pytest.mark.ci_only
def test_the_scaling_bench_quick_prints_every_family_axis_and_memory_row():
    import models
    out = subprocess.run([sys.executable, "-m", "bench.scaling", "--quick"], capture_output=True, text=True,
                         timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    axis = re.compile(r"  (batch|length|width) +\d+ / +\d+ / +\d+: +[\d.]+ / +[\d.]+ / +[\d.]+ ms   exponent "
                      r"-?\d+\.\d\d \(FLOPs \d+\.\d\d\)  \(load .*\)")
    lines = out.stdout.splitlines()
    assert sum(bool(axis.fullmatch(line)) for line in lines) == 3 * len(models.FAMILIES), out.stdout
    rows = [line.split() for line in lines if line.startswith("  ") and "bijection quick" in line]
    assert [(r[0], r[3]) for r in rows] == [(f, s) for f in models.FAMILIES for s in ("2", "20")], out.stdout
    for r in rows:
        before, peak, adds = map(float, r[4:7])
        assert 0 < before <= peak and adds == pytest.approx(peak - before, abs=0.11)


def test_the_kernels_a_step_runs_on_one_thread_are_named_with_their_estimates(monkeypatch):
    """Transport's default step (batch 32, 23 positions, 5 classes, two threads): its loss kernel is estimated at
    32 x 23 x 5 x 3 ns = 11.04 us, under 20 us, once a step; its LayerNorms at 32 x 23 x 64 x 0.5 ns = 23.55 us are
    not (each kernel's estimate is run_kernel's items x ns_per_item, in microseconds, not ns or ms). At a limit of
    24 us the LayerNorms join it, nine calls of each (four blocks' two and the final one); and the recorder is
    switched back."""
    import kernels
    from bench import scaling
    monkeypatch.setattr(kernels, "PARALLEL_MIN_US", 20.0)
    threads, small = scaling.small_kernels("transformer", "transport", "default")
    assert threads == 2 and small == {"cross_entropy_hard_kernel": (pytest.approx(11.04), 1)}
    monkeypatch.setattr(kernels, "PARALLEL_MIN_US", 24.0)
    _, small = scaling.small_kernels("transformer", "transport", "default")
    assert small["layernorm_forward_kernel"] == (pytest.approx(23.552), 9)
    assert small["layernorm_backward_kernel"] == (pytest.approx(23.552), 9)
    assert kernels.run_kernel.__name__ == "run_kernel"
