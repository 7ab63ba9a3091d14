"""How the cost grows: every family's training step against batch, sequence length and width, and the peak
memory of a training run at the default preset and at each task's paper preset, so that a user can tell what a
larger run will cost before starting it.

    python -m bench.scaling                                  # every family, both tables
    python -m bench.scaling --families transformer,lstm --repeats 10
    python -m bench.scaling --table time                     # only the step times (or: memory, kernels)
    python -m bench.scaling --quick                          # a smoke test: the quick preset, few repeats

The step time: each family as `python train.py --model F` builds it (the bijection's default preset: its width,
layers and batch, T 38), then each of batch, length and width at half, once and twice that, the others held;
the width as `--width` sets it (the family's other sizes follow as they do on the command line). A step is
training.train_step on the fast path, the step train.py takes (bench.transformer.ours_step), on random tokens
with every position scored (what a step costs does not depend on the tokens' values). The three points of an
axis are timed alternately, a median over repeats each. The exponent is the slope of log time against log size
over the three points (least squares; with sizes in equal ratios it is log(t_twice / t_half) / log 4), beside
the same slope of the step's counted FLOPs (models.step_flops): time that grows slower than the FLOPs is
overhead that does not grow with the work (Python, thread starts, small products below BLAS's speed).

The peak memory: each (family, preset) in a fresh process, which builds the model as train.py does and takes
MEMORY_STEPS training steps on the preset's own batches (the default run also ten times as many: a peak
that grew with the steps would be a leak); it prints the process's resident memory after its imports and one
step of the task's quick preset at batch 1 (which loads the compiled kernels), and its peak after the preset's
steps (the difference: what its model, optimiser state and activations add), beside train.py's
estimate of a step's peak (models.step_memory_bytes, the number it refuses a run by). A run's evaluation and
probes come on top (train.py's memory check estimates them too). The first process of each family fills
Numba's cache, so compiling is not counted as training.

The kernels on one thread (--table kernels): at every task's default and paper preset, each family as train.py
builds it, one training step with each call of kernels.run_kernel recorded (bench/roofline.kernel_estimates);
the kernels whose estimated one-thread time is under kernels.PARALLEL_MIN_US run on the calling thread
whatever --threads says (a preset that trains on one thread is marked so: there the limit changes nothing).
"""

if not __package__:                 # run as a file, its folder-qualified imports cannot resolve
    raise SystemExit("bench/scaling.py: run it as python -m bench.scaling, from the repository's folder")

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as bench/transformer.py: BLAS threads fight Numba's

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402

from bench import roofline, transformer as bench  # noqa: E402
from harness import flags  # noqa: E402
import kernels  # noqa: E402
import models  # noqa: E402
import optim  # noqa: E402
from tunnels import tasks  # noqa: E402
import training  # noqa: E402

AXES = ("batch", "length", "width")
FACTORS = (0.5, 1.0, 2.0)       # each axis at half, once and twice the preset's size
MEMORY_STEPS = 5                # training steps a memory process takes
MIB = 2 ** 20


def fail(msg):
    print(f"python -m bench.scaling: error: {msg}", file=sys.stderr)
    sys.exit(2)


def exponent(sizes, values):
    """The least-squares slope of log(values) against log(sizes): values ~ sizes^exponent. ValueError if a size
    or a value is not positive, or the sizes are all equal."""
    x, y = np.asarray(sizes, dtype=float), np.asarray(values, dtype=float)
    if x.shape != y.shape or x.size < 2 or (x <= 0).any() or (y <= 0).any():
        raise ValueError(f"exponent needs two or more positive sizes and values of one length, got {list(x)} and {list(y)}")
    lx, ly = np.log(x), np.log(y)
    if np.ptp(lx) == 0:
        raise ValueError(f"exponent needs sizes that differ, got {list(x)}")
    dx = lx - lx.mean()
    return float(dx @ (ly - ly.mean()) / (dx @ dx))


# ----------------------------------------------------------------------------
# the model a command line builds, and the same model at another batch, length or width

def built(family, preset, extra=(), task=None):
    """-> (args, cfg, T) of `python train.py [--task task] --model family --preset preset [extra]`: the flags
    train.py parses and the Config it builds, T the training length."""
    args = flags.parse_args([*(["--task", task] if task else []), "--model", family, "--preset", preset, *extra])
    sizes = tasks.sizes(args.task, args.settings)
    return args, flags.model_config(args, sizes, family), sizes["max_len"]


def point(family, preset, axis, factor):
    """-> (cfg, B, T, the size on axis) of the preset's model with one axis scaled by factor (rounded, at least
    1): batch and length directly, the width as --width sets it."""
    args, cfg, T = built(family, preset)
    B = args.batch
    if axis == "batch":
        B = max(1, round(B * factor))
    elif axis == "length":
        T = max(1, round(T * factor))
        if hasattr(cfg, "max_len"):
            cfg = dataclasses.replace(cfg, max_len=max(cfg.max_len, T))
    elif axis == "width":
        _, cfg, _ = built(family, preset, ["--width", str(max(1, round(cfg.d_model * factor)))])
    else:
        raise ValueError(f"axis {axis!r}: allowed are {', '.join(AXES)}")
    return cfg, B, T, {"batch": B, "length": T, "width": getattr(cfg, "d_model", 0)}[axis]


def random_batch(cfg, B, T, seed=0):
    """Random tokens and targets, every position scored: a step's cost does not depend on the values."""
    rng = np.random.default_rng(seed)
    return dict(tokens=rng.integers(0, cfg.vocab_size, (B, T)), targets=rng.integers(0, cfg.n_classes, (B, T)),
                mask=np.ones((B, T)))


def time_axis(family, preset, axis, repeats, warmup):
    """-> [(size, median seconds of a step, counted FLOPs of a step)] at the FACTORS of axis, timed alternately."""
    steps, rows = [], []
    for factor in FACTORS:
        cfg, B, T, size = point(family, preset, axis, factor)
        params = models.init_params(family, cfg, 0)
        steps.append(bench.ours_step(cfg, params, random_batch(cfg, B, T), family))
        rows.append((size, models.step_flops(family, cfg, B, T)))
    times = bench.interleaved(steps, repeats, warmup)
    return [(size, float(np.median(ts)), flops) for (size, flops), ts in zip(rows, times)]


def time_table(families, preset, repeats, warmup):
    print(f"step time against batch, length and width (the others at the {preset} preset's; median of {repeats} "
          f"steps, the three sizes alternated; exponent: slope of log time on log size, the FLOPs' beside)")
    for family in families:
        args, cfg, T = built(family, preset)
        print(f"{family} ({args.task} {preset}: width {getattr(cfg, 'd_model', '-')}, {getattr(cfg, 'n_layers', '-')} "
              f"layers, batch {args.batch}, T {T}, {models.count_params(models.param_shapes(family, cfg)):,} parameters)")
        for axis in AXES:
            rows = time_axis(family, preset, axis, repeats, warmup)
            sizes, secs, flops = zip(*rows)
            print(f"  {axis:6s} {' / '.join(f'{s:4d}' for s in sizes)}:  {' / '.join(f'{1e3 * t:8.2f}' for t in secs)} ms"
                  f"   exponent {exponent(sizes, secs):.2f} (FLOPs {exponent(sizes, flops):.2f})  ({bench.load()})")


# ----------------------------------------------------------------------------
# peak memory, each run in a fresh process

def _status_mib(key):
    """A line of /proc/self/status in MiB (it gives kB): VmHWM the peak resident memory, VmRSS the current."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) * 1024 / MIB


def peak_mib():
    """This process's peak resident memory in MiB: VmHWM, which starts afresh at a process's exec; where there is
    no /proc, ru_maxrss (KiB on Linux, bytes on macOS), which a child inherits from its parent."""
    try:
        return _status_mib("VmHWM")
    except (OSError, StopIteration):
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss / MIB if sys.platform == "darwin" else rss * 1024 / MIB


def current_mib():
    """This process's resident memory now, in MiB (VmRSS; where there is no /proc, the peak)."""
    try:
        return _status_mib("VmRSS")
    except (OSError, StopIteration):
        return peak_mib()


def memory_child(family, task, preset, steps):
    """Build the model as `train.py --task task --model family --preset preset` does and take `steps` training
    steps on the preset's batches (a new one each step, as train.py samples them), after one step of the task's
    quick preset at batch 1 (it loads the compiled kernels, the same code at any size); prints the resident MiB
    before the preset's steps, the peak after them, and the estimate of a step's peak (models.step_memory_bytes) in MiB."""
    def run(preset, steps, extra=()):
        args, cfg, T = built(family, preset, extra, task)
        params = models.init_params(family, cfg, args.seed)
        state = optim.adamw_init(params)
        model = lambda p, tok, tgt, m: models.loss_and_grads(family, p, tok, tgt, m, cfg)
        decay = models.decay_set(family, params)
        with kernels.enabled():
            for i in range(steps):
                batch = tasks.sample(task, np.random.default_rng((args.seed, i)), args.batch, args.settings)
                training.train_step(model, params, state, batch["tokens"], batch["targets"], batch["mask"], args.lr,
                                    args.weight_decay, decay=decay)
        return models.step_memory_bytes(family, cfg, args.batch, T) / MIB
    run("quick", 1, ["--batch", "1"])
    before = current_mib()
    estimate = run(preset, steps)
    print(f"{before:.1f} {peak_mib():.1f} {estimate:.1f}")


def memory(family, task, preset, steps):
    """-> (MiB before the steps, peak MiB, estimate MiB) from a fresh process."""
    out = bench.child(f"from bench import scaling; scaling.memory_child({family!r}, {task!r}, {preset!r}, {steps})")
    return tuple(float(v) for v in out.split()[-3:])


def memory_runs(quick):
    """[(task, preset, steps)]: the default run's, again at ten times the steps (does the peak grow with the
    steps?), then each task's paper preset (--quick: the bijection's quick preset, 2 and 20 steps)."""
    task = flags.flag_table()["--task"]["default"]
    if quick:
        return [(task, "quick", 2), (task, "quick", 20)]
    return [(task, "default", MEMORY_STEPS), (task, "default", 10 * MEMORY_STEPS)] + [
        (name, "paper", MEMORY_STEPS) for name in tasks.TASKS if "paper" in tasks.task(name).PRESETS]


def memory_table(families, quick):
    runs = memory_runs(quick)
    print("\npeak resident memory of a training run, MiB (each a fresh process, steps on the preset's batches; "
          "'before': resident after imports and one quick step at batch 1; the estimate: models.step_memory_bytes, train.py's)")
    print(f"  {'family':12s} {'run':18s} {'steps':>5s} {'before':>8s} {'peak':>8s} {'training adds':>14s} {'estimate':>9s}")
    for family in families:
        memory(family, runs[0][0], "quick", 1)             # fills Numba's cache: compiling is not training
        for task, preset, steps in runs:
            before, peak, estimate = memory(family, task, preset, steps)
            print(f"  {family:12s} {task + ' ' + preset:18s} {steps:5d} {before:8.1f} {peak:8.1f} "
                  f"{peak - before:14.1f} {estimate:9.1f}  ({bench.load()})")


def small_kernels(family, task, preset):
    """-> (the preset's --threads, {kernel: (estimated one-thread us, calls)}) of one training step of the family
    at the task's preset: the kernels run_kernel runs on the calling thread (estimated under PARALLEL_MIN_US)."""
    args, cfg, T = built(family, preset, (), task)
    step = bench.ours_step(cfg, models.init_params(family, cfg, 0), random_batch(cfg, args.batch, T), family)
    with roofline.kernel_estimates() as found, kernels.enabled():
        step()
    small = {}
    for name, us in found:
        if us < kernels.PARALLEL_MIN_US:
            small[name] = (max(us, small.get(name, (0, 0))[0]), small.get(name, (0, 0))[1] + 1)
    return args.threads, small


def kernels_table(families, quick):
    presets = ("quick",) if quick else ("default", "paper")
    runs = [(task, preset) for preset in presets for task in tasks.TASKS if preset in tasks.task(task).PRESETS]
    print(f"\nkernels a step runs on one thread (estimated under kernels.PARALLEL_MIN_US = {kernels.PARALLEL_MIN_US:g} us), "
          f"{len(runs) * len(families)} presets and families")
    for task, preset in runs:
        for family in families:
            try:
                threads, small = small_kernels(family, task, preset)
            except SystemExit:                          # a family the preset refuses (train.py's one line)
                continue
            if small:
                what = ", ".join(f"{name} {us:.1f} us x{calls}" for name, (us, calls) in sorted(small.items()))
                note = "  (this preset trains on one thread: no change)" if threads == 1 else ""
                print(f"  {task + ' ' + preset:18s} {family:12s} {what}{note}")


# ----------------------------------------------------------------------------
# command line

def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.split("\n\n")[0])
    p.error = fail
    p.add_argument("--quick", action="store_true", help="the quick preset, few repeats: a smoke test")
    p.add_argument("--repeats", type=int, help="timed steps per size (default 10; --quick: 2)")
    p.add_argument("--families", help=f"comma-separated subset of {', '.join(models.FAMILIES)} (default: all)")
    p.add_argument("--table", help="time | memory | kernels (default: time and memory)")
    args = p.parse_args(argv)
    repeats = args.repeats if args.repeats is not None else 2 if args.quick else 10
    if repeats < 1:
        fail(f"--repeats {repeats}: must be a positive integer")
    families = bench.shape_list(args.families, models.FAMILIES, models.FAMILIES, fail, "--families")
    if args.table not in (None, "time", "memory", "kernels"):
        fail(f"--table {args.table}: allowed are time, memory, kernels")
    preset = "quick" if args.quick else "default"
    print(f"python -m bench.scaling  {bench.load()}  numba {numba.__version__} ({numba.config.NUMBA_NUM_THREADS} threads)  "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset: spins a while)')}")
    if args.table == "kernels":
        kernels_table(families, args.quick)
        return
    if args.table != "memory":
        with kernels.enabled():                            # the fast path, as train.py runs
            time_table(families, preset, repeats, 1 if args.quick else 3)
    if args.table != "time":
        memory_table(families, args.quick)


if __name__ == "__main__":
    main()
