"""dynamics.run: Paper II's experiments on the sticky Markov chain, from the command line.

    python -m dynamics.run                             # one head, plain SGD on one chain, against exact Bayes
    python -m dynamics.run --compare-em [--chain authors]   # SGD, the EM-like schedule and a true M-step, 5 seeds
    python -m dynamics.run --deep [--chain authors]         # the authors' deep variant, 5 seeds, a held-out chain

Run from the repository's folder. Its flags are train.py's rows that apply to the sticky chain (harness/flags.py:
one table, each value checked once, before anything is written); like a token run, each experiment keeps its
progress in --out, stops at --stop-after or a stop signal, continues with --resume, takes the run directory's
lock, and replaces a finished run only with --overwrite. The experiments themselves are dynamics/experiments.py.
"""

if not __package__:                 # run as a file, its folder-qualified imports cannot resolve
    raise SystemExit("dynamics/run.py: run it as python -m dynamics.run, from the repository's folder")

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see layers.py: BLAS threads fight Numba's

import sys  # noqa: E402

import numba  # noqa: E402

import kernels  # noqa: E402
import layers  # noqa: E402
import training  # noqa: E402
from dynamics import experiments as dynamics  # noqa: E402
from harness import flags, runs  # noqa: E402
from harness.flags import STICKY, context, fail  # noqa: E402

PROG = "python -m dynamics.run"


def main(argv=None):
    """python -m dynamics.run: one line and exit code 2 for bad input or a file that cannot be written. The
    thread count and the name errors carry are this call's: both are what they were before once it returns."""
    prog, threads = flags.PROG, numba.get_num_threads()
    flags.PROG = PROG
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        if "--task" in argv or any(a.startswith("--task=") for a in argv):
            fail("--task: this command runs Paper II's sticky chain only; the token wind tunnels train with train.py")
        args = flags.parse_args(["--task", STICKY, *argv])
        args.argv = argv
        check_stop(args)
        numba.set_num_threads(args.threads)
        with kernels.enabled() if args.kernels == "numba" else layers.use_twins({}):   # --kernels, as in train.py
            return paper_two(args)
    except OSError as e:
        fail(f"{e.filename or 'a file'} cannot be written ({e.strerror})")
    finally:
        numba.set_num_threads(threads)
        flags.PROG = prog


def check_stop(args):
    """--stop-after before the end of the experiment: --compare-em counts its runs, the others their steps."""
    if args.stop_after is not None and args.compare_em:
        total = len(dynamics.compare_em_runs(quick=args.preset == "quick"))
        if args.stop_after >= total:
            fail(f"--stop-after {args.stop_after}: --compare-em{' --preset quick' if args.preset == 'quick' else ''}"
                 f" has {total} runs (each arm of each seed, and three more); allowed are 1..{total - 1}")
    elif args.stop_after is not None and args.stop_after >= (args.steps or 1000):
        fail(f"--stop-after {args.stop_after}: {'each seed' if args.deep else 'the run'} ends at step "
             f"{args.steps or 1000} anyway; give a step before it, or leave --stop-after out")


def take(args, held=(), resumable=True):
    """Take the run directory --out (runs.take: its name, writability, lock and the never-overwrite rule)."""
    if args.resume and args.overwrite:
        fail("--resume and --overwrite: continue the run in --out or replace it, not both")
    try:
        runs.take(args.out, "--out", " ".join([PROG, *args.argv]), held, keep=args.resume or args.overwrite,
                  resumable=resumable)
    except runs.Refused as e:
        fail(str(e))


def paper_two(args):
    """Paper II's experiments. Like a token run, each keeps its progress in --out (the one-head run: its
    step; --compare-em: each of its runs as it finishes; --deep: each finished seed and the one in
    progress), stops at --stop-after or a stop signal, continues with --resume, and a finished one is
    replaced only with --overwrite."""
    where = context(args).split(":")[1]
    steps, chain = args.steps or 1000, args.chain
    if where == "deep":
        lr = args.lr or dynamics.DEEP_LR
        read = lambda: dynamics.deep_progress(args.out, steps=steps, lr=lr, chain=chain)
        done = lambda p: max((state[3] for state in p["states"].values()), default=0)
        run = lambda p: dynamics.run_deep(chain, steps, args.out, lr=lr, stop=args.stop_after, progress=p)
        what = "the seed in progress is already at step {}; give a later step"
    elif where == "compare-em":
        kw = dict(steps=steps, lr=args.lr or dynamics.SGD_LR, quick=args.preset == "quick", chain=chain)
        read = lambda: dynamics.compare_em_progress(args.out, **kw)
        done = len
        run = lambda p: dynamics.compare_em(out_dir=args.out, stop=args.stop_after, progress=p, **kw)
        what = "{} of its runs are already done; give a larger number"
    else:
        kw = dict(steps=steps, seed=args.seed, lr=args.lr or dynamics.SGD_LR, sigma=args.sigma, chain=chain)
        read = lambda: dynamics.one_head_progress(args.out, **kw)
        done = lambda p: p[1]["step"]
        run = lambda p: dynamics.run_sticky(out_dir=args.out, stop=args.stop_after, progress=p, **kw)
        what = "the run is already at step {}; give a later step"
    held = dynamics.files(where, args.out) if os.path.isdir(args.out) else []
    name = {"deep": "the deep variant", "compare-em": "the comparison (--compare-em)"}.get(where, "the one-head run")
    if args.resume and dynamics.FINAL[where] in held:
        fail(f"--resume: {name} in --out {args.out!r} is finished ({dynamics.FINAL[where]} written); --overwrite "
             f"replaces it")
    if args.resume and not dynamics.progress_files(held):
        fail(f"--resume: --out {args.out!r} holds no progress of {name} to continue")
    take(args, held, resumable=dynamics.FINAL[where] not in held)
    try:
        try:
            progress = read() if args.resume else None
        except ValueError as e:
            fail(f"--resume: {e}")
        if args.stop_after is not None and progress is not None and args.stop_after <= done(progress):
            fail(f"--stop-after {args.stop_after}: {what.format(done(progress))}, or leave --stop-after out to "
                 f"finish the run")
        if args.overwrite:                                      # every check passed: now the old run goes
            runs.remove_run(args.out, held)
        result = run(progress)
    except training.TrainingStopped as e:                        # a loss that turned non-finite
        fail(str(e))
    except dynamics.Stopped as e:                                # saved at --stop-after: --resume continues
        print(e)
        return None
    except training.Interrupted as e:                            # saved at a stop signal: --resume continues
        print(f"\n{e}", file=sys.stderr)
        sys.exit(130)
    finally:
        runs.release(args.out)
    if where == "one-head":
        print(dynamics.sticky_table(result, os.path.join(args.out, "sticky_metrics.json")))
    return result


if __name__ == "__main__":
    main()
