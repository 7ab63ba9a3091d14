"""Train a model on a Bayesian wind tunnel and measure it against the exact posterior, in bits.

    python train.py                         # bijection wind tunnel (format a), CPU-sized default (minutes)
    python train.py --task sawtooth         # Paper I's variant (format b): the per-sequence sawtooth
    python train.py --task hmm --preset paper
    python train.py --eval-only runs/bijection-transformer-default/checkpoint.npz

Writes runs/<name>/: checkpoint.npz, metrics.json, log.csv, snapshots/, geometry.json and the figures.
This file is the command line: the presets, every flag checked once, and what runs in which order.
The loop is training.py, the numbers evaluation.py, the figures plots.py.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see layers.py: BLAS threads fight Numba's
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import argparse  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402

import numba  # noqa: E402

import bayesattn as ba  # noqa: E402
import plots  # noqa: E402
import training  # noqa: E402
import windtunnels as wt  # noqa: E402
from checkpoints import load_checkpoint, write_json  # noqa: E402
from evaluation import evaluate  # noqa: E402
from training import checkpoint_name, eval_lengths, make_mlp, make_transformer, task_spec  # noqa: E402

# ----------------------------------------------------------------------------
# defaults (the `default` preset of the bijection task); presets below override them

TASK = "bijection"      # which wind tunnel
V = 20                  # bijection: keys = values = V, L = V - 1 pairs
HMM_K = 20              # hmm: observations per training sequence
EVAL_SEQS = 2000        # held-out sequences for evaluation
MIN_EVAL_SEQS = 4       # the single-sequence figure draws four

PRESETS = {
    # task -> preset -> settings; lr is the peak of warm-up + cosine, decayed to lr * lr_floor
    # (lr_floor 0.1 unless a preset says otherwise)
    "bijection": {
        "quick":   dict(width=32, layers=2, heads=2, batch=32, steps=60, lr=3e-3, warmup=10),
        # heads of 32, at least the 20 hypotheses (the value tokens), so the key frame could be orthogonal
        "default": dict(width=64, layers=3, heads=2, batch=64, steps=3000, lr=3e-3, warmup=100, weight_decay=0.0),
        # many small steps: per sample, batch 16 pulls the leaked mass off seen values faster than batch 256;
        # at this size a second Numba thread costs more than it gives, so the run uses one
        "paper":   dict(width=64, layers=3, heads=2, batch=16, steps=130000, lr=3e-3, warmup=400, lr_floor=0.0,
                        weight_decay=0.0, threads=1),
    },
    "sawtooth": {
        # fan-in init and 1,000 steps of 5-key alphabets first: without either, the lookup does not form
        # within the budget (RESULTS.md, sawtooth); heads of 32 (>= the 20 hypotheses); 2 layers for time
        "quick":   dict(width=32, layers=2, heads=2, batch=32, steps=60, lr=3e-3, warmup=10, curriculum="5:30",
                        init="fan-in"),
        "default": dict(width=64, layers=2, heads=2, batch=64, steps=8000, lr=3e-3, warmup=100,
                        curriculum="5:1000", init="fan-in", weight_decay=0.0),
        # batch 32 for three times the steps per sample (batch 16 left the query unlearned), cosine to zero
        "paper":   dict(width=64, layers=2, heads=2, batch=32, steps=100000, lr=3e-3, warmup=200, lr_floor=0.0,
                        curriculum="5:2000", init="fan-in", weight_decay=0.0, threads=1),
    },
    "hmm": {
        "quick":   dict(width=32, layers=2, heads=2, batch=16, steps=40, lr=3e-3, warmup=10),
        "default": dict(width=64, layers=4, heads=4, batch=32, steps=3000, lr=2e-3, warmup=100),
        "paper":   dict(width=96, layers=6, heads=6, batch=32, steps=17000, lr=1.5e-3, warmup=300, lr_floor=0.0),
    },
}
WEIGHT_DECAY = 0.01     # AdamW's decoupled weight decay, unless the preset says otherwise


TASKS = ("bijection", "sawtooth", "hmm", "sticky")
MODELS = ("transformer", "mlp", "prefix-mlp")   # mlp: the authors' (token + position); prefix-mlp: whole prefix


def metrics_name(model):
    return "metrics.json" if model == "transformer" else f"metrics_{model}.json"


def fail(msg):
    """One clear line on stderr, exit code 2, no traceback."""
    print(f"train.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


# ----------------------------------------------------------------------------
# command line

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.error = fail
    p.add_argument("--task", default=TASK, help="wind tunnel: bijection (format a, the default) | sawtooth "
                   "(format b, Paper I's variant) | hmm | sticky (Paper II)")
    p.add_argument("--model", default="transformer", help="transformer (the default) | mlp (the authors' MLP: "
                   "one token and its position) | prefix-mlp (an MLP that sees the whole prefix)")
    p.add_argument("--baseline", default="mlp", help="the MLP trained after the transformer: mlp (the default) | "
                   "prefix-mlp")
    p.add_argument("--preset", default="default", help="quick | default (the default) | paper: sets the sizes below")
    p.add_argument("--steps", type=int, help="training steps (default: from the preset)")
    p.add_argument("--batch", type=int, help="sequences per step")
    p.add_argument("--width", type=int, help="model width d_model")
    p.add_argument("--layers", type=int, help="transformer layers (MLP: residual blocks)")
    p.add_argument("--heads", type=int, help="attention heads (must divide the width)")
    p.add_argument("--lr", type=float, help="peak learning rate (warm-up, then cosine to lr * lr-floor)")
    p.add_argument("--lr-floor", type=float, help="final learning rate as a fraction of --lr (default 0.1)")
    p.add_argument("--warmup", type=int, help="warm-up steps")
    p.add_argument("--weight-decay", type=float, help=f"AdamW decoupled weight decay on the matrices "
                   f"(default {WEIGHT_DECAY} unless the preset says otherwise)")
    p.add_argument("--threads", type=int, help="Numba threads (default: all cores, unless the preset says otherwise)")
    p.add_argument("--seed", type=int, help="seed of the initialisation and the data stream (default 0)")
    p.add_argument("--dtype", default="float32", help="float32 (the default) | float64")
    p.add_argument("--pos", default="learned", help="positions: learned (the default) | sinusoidal")
    p.add_argument("--soft", action="store_true", help="train on the exact posterior (soft targets) instead of "
                                                       "sampled labels (values, hidden states)")
    p.add_argument("--V", type=int, help=f"bijection, sawtooth: number of keys (= values), L = V - 1 pairs "
                   f"(default {V})")
    p.add_argument("--K", type=int, help=f"hmm: observations per training sequence (default {HMM_K})")
    p.add_argument("--curriculum", help="sawtooth: keys from smaller random alphabets first, stages "
                   "alphabet:until_step (e.g. 5:2500,10:4000); the targets stay exact (default: from the preset)")
    p.add_argument("--init", help="initialisation: gpt2 (N(0, 0.02)) | fan-in (N(0, 1/fan_in) matrices, "
                   "N(0, 1) embeddings) (default: from the preset)")
    p.add_argument("--stop-after", type=int, metavar="N",
                   help="stop after N steps with a checkpoint, as Ctrl-C would (continue with --resume)")
    p.add_argument("--out", help="run directory (default runs/<task>-<model>-<preset>)")
    p.add_argument("--figures", help="where the figures go (default: the run directory; --figures figures "
                   "regenerates the ones the documents show)")
    p.add_argument("--kernels", default="numba", help="numba: the fast twins of kernels.py | numpy: the readable "
                   "NumPy ops of layers.py and bayesattn.py, as written (slower, the same numbers)")
    p.add_argument("--eval-only", metavar="CHECKPOINT", help="evaluate a checkpoint, no training")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint (also after "
                   "Ctrl-C, SIGTERM or SIGHUP)")
    p.add_argument("--no-baseline", action="store_true", help="do not train the MLP baseline after the transformer")
    p.add_argument("--eval-seqs", type=int, help=f"held-out sequences for evaluation (default {EVAL_SEQS})")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in --out (its checkpoint, "
                   "metrics, logs, snapshots and figures) instead of refusing")
    p.add_argument("--compare-em", action="store_true", help="sticky: SGD against the EM-like schedule and "
                                                             "the true M-step over 5 seeds")
    p.add_argument("--chain", help="sticky: exact (self-transition 0.3, the default) | authors (0.3498, as the "
                   "authors' script builds it)")
    p.add_argument("--deep", action="store_true", help="sticky: the authors' deep variant (4 pre-LN blocks, AdamW, "
                                                       "a held-out chain), 5 seeds")
    p.add_argument("--no-geometry", action="store_true", help="skip the geometry probes (geometry.py) after training")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.kernels not in ("numba", "numpy"):
        fail(f"--kernels {args.kernels!r}: allowed are numba, numpy")
    if args.task not in TASKS:
        fail(f"--task {args.task!r}: allowed are {', '.join(TASKS)}")
    if args.model not in MODELS:
        fail(f"--model {args.model!r}: allowed are {', '.join(MODELS)}")
    if args.baseline not in MODELS[1:]:
        fail(f"--baseline {args.baseline!r}: allowed are {', '.join(MODELS[1:])}")
    misplaced = [(flag, tasks) for flag, given, tasks in (
        ("--V", args.V is not None, ("bijection", "sawtooth")), ("--K", args.K is not None, ("hmm",)),
        ("--curriculum", args.curriculum is not None, ("sawtooth",)), ("--chain", args.chain is not None, ("sticky",)),
        ("--deep", args.deep, ("sticky",)))
        if given and args.task not in tasks]
    if misplaced:
        flag, tasks = misplaced[0]
        fail(f"{flag} does not apply to --task {args.task} (it belongs to {' and '.join(tasks)})")
    args.V = V if args.V is None else args.V
    args.K = HMM_K if args.K is None else args.K
    if args.task == "sticky":                       # Paper II's one-head model: dynamics.py owns its settings
        ignored = [flag for flag, given in (
            ("--model", args.model != "transformer"), ("--preset", args.preset != "default"),
            ("--resume", args.resume), ("--eval-only", args.eval_only), ("--batch", args.batch),
            ("--width", args.width), ("--layers", args.layers), ("--heads", args.heads),
            ("--dtype", args.dtype != "float32"), ("--soft", args.soft), ("--init", args.init is not None),
            ("--baseline", args.baseline != "mlp"), ("--no-baseline", args.no_baseline),
            ("--lr-floor", args.lr_floor is not None), ("--weight-decay", args.weight_decay is not None),
            ("--figures", args.figures is not None), ("--stop-after", args.stop_after is not None),
            ("--eval-seqs", args.eval_seqs is not None), ("--warmup", args.warmup is not None),
            ("--curriculum", args.curriculum is not None), ("--overwrite", args.overwrite),
            ("--quiet", args.quiet), ("--no-geometry", args.no_geometry))
            if given]
        if ignored:
            fail(f"{', '.join(ignored)}: not used by --task sticky (allowed: --steps, --lr, --seed, --out, "
                 f"--compare-em, --deep, --chain, --threads)")
        args.chain = args.chain or "exact"
        if args.chain not in ("exact", "authors"):
            fail(f"--chain {args.chain!r}: allowed are exact, authors")
        if args.compare_em and args.deep:
            fail("--compare-em and --deep are two experiments: run them one at a time")
    if args.task != "sticky":
        if args.preset not in PRESETS[args.task]:
            fail(f"--preset {args.preset!r}: allowed are {', '.join(PRESETS[args.task])}")
        for key, value in PRESETS[args.task][args.preset].items():
            if getattr(args, key) is None:
                setattr(args, key, value)
    if args.lr_floor is None:
        args.lr_floor = 0.1
    args.init = args.init or "gpt2"
    if args.init not in ba.INITS:
        fail(f"--init {args.init!r}: allowed are {', '.join(ba.INITS)}")
    if args.task == "sawtooth":
        try:
            training.parse_curriculum(args.curriculum, args.V)
        except ValueError as e:
            fail(str(e))
    args.curriculum = args.curriculum or ""
    if not 0.0 <= args.lr_floor <= 1.0:
        fail(f"--lr-floor {args.lr_floor}: must lie in [0, 1] (a fraction of --lr)")
    if args.weight_decay is None:
        args.weight_decay = WEIGHT_DECAY
    if not 0.0 <= args.weight_decay < 1.0:
        fail(f"--weight-decay {args.weight_decay}: must lie in [0, 1)")
    if args.threads is None:
        args.threads = numba.config.NUMBA_NUM_THREADS
    if not 1 <= args.threads <= numba.config.NUMBA_NUM_THREADS:
        fail(f"--threads {args.threads}: must lie in 1..{numba.config.NUMBA_NUM_THREADS} (NUMBA_NUM_THREADS)")
    for key in ("steps", "batch", "width", "layers", "heads"):
        value = getattr(args, key)
        if value is not None and value < 1:
            fail(f"--{key.replace('_', '-')} {value}: must be a positive integer")
    if args.warmup is not None and args.warmup < 0:
        fail(f"--warmup {args.warmup}: must be a non-negative integer")
    if args.seed is not None and not 0 <= args.seed < 2 ** 63:
        fail(f"--seed {args.seed}: must be an integer in 0..2^63-1")
    args.seed = 0 if args.seed is None else args.seed
    if args.eval_seqs is not None and args.eval_seqs < MIN_EVAL_SEQS:
        fail(f"--eval-seqs {args.eval_seqs}: must be at least {MIN_EVAL_SEQS} (the single-sequence figure draws four)")
    args.eval_seqs_given = args.eval_seqs is not None
    args.eval_seqs = EVAL_SEQS if args.eval_seqs is None else args.eval_seqs
    if args.V < 2:
        fail(f"--V {args.V}: the bijection needs at least 2 keys")
    if args.K < 1:
        fail(f"--K {args.K}: the HMM needs at least 1 observation")
    if args.stop_after is not None and args.stop_after < 1:
        fail(f"--stop-after {args.stop_after}: must be a positive integer")
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        fail(f"--lr {args.lr}: must be a finite number > 0")
    if args.pos not in ("learned", "sinusoidal"):
        fail(f"--pos {args.pos!r}: allowed are learned, sinusoidal")
    if args.dtype not in ("float32", "float64"):
        fail(f"--dtype {args.dtype!r}: allowed are float32, float64")
    if args.task != "sticky" and args.width % args.heads:
        fail(f"--heads {args.heads} does not divide --width {args.width}")
    if args.compare_em and args.task != "sticky":
        fail(f"--compare-em belongs to --task sticky, not --task {args.task}")
    if args.task == "sticky":
        what = "dynamics" if args.compare_em else "deep-variant" if args.deep else "sticky-one-head"
        args.out = args.out or os.path.join("runs", what + ("-authors-chain" if args.chain == "authors" else ""))
    args.out = args.out or os.path.join("runs", f"{args.task}-{args.model}-{args.preset}")
    return args


def summary_table(rows, prior_gap=None):
    """The models' metrics, then the exact posterior's (0) and a prior-only predictor's: its entropy MAE,
    per-sequence MAE and KL all equal the prior's gap, log2(#classes) - E[H_Bayes] (windtunnels.prior_gap_bits)."""
    head = (f"{'model':<14}{'params':>10}{'entropy MAE':>13}{'per-seq MAE':>13}{'KL':>11}{'excess CE':>11}"
            f"{'p(impossible)':>15}")
    lines = [head, "-" * len(head)]
    for name, m in rows.items():
        lines.append(f"{name:<14}{m.get('params', 0):>10,}{m['entropy_mae_bits']:>13.4g}"
                     f"{m['entropy_mae_seq_bits']:>13.4g}{m['kl_bits']:>11.4g}{m['excess_ce_bits']:>11.4g}"
                     f"{m.get('impossible_mass', float('nan')):>15.3g}")
    if prior_gap is not None:
        lines.append(f"{'prior only':<14}{'':>10}{prior_gap:>13.4g}{prior_gap:>13.4g}{prior_gap:>11.4g}")
    lines.append(f"{'exact Bayes':<14}{'':>10}{0:>13}{0:>13}{0:>11}{0:>11}{0:>15}   (bits; p: a probability)")
    for name, m in rows.items():
        if "query" in m:
            lines.append(f"{name} at the final query (one-hot posterior): KL {m['query']['kl_bits']:.4g} bits, "
                         f"accuracy {m['query']['accuracy']:.4f}")
        if "length_generalization_all" in m:
            lines.append(f"{name}, HMM by length K (bits): " + "; ".join(
                f"K = {K}: KL {g['kl_bits']:.4g}, entropy MAE (paper) {g['entropy_mae_bits']:.4g}, "
                f"per-seq MAE {g['entropy_mae_seq_bits']:.4g}" for K, g in m["length_generalization_all"].items()))
    return "\n".join(lines)


def evaluate_run(args, predict, params):
    """Held-out metrics; for the HMM also at K = 30 and 50 (length generalisation)."""
    metrics, traces = evaluate(lambda tok: predict(params, tok), training.held_out(args))
    if args.task == "hmm":
        curves = {args.K: metrics}
        for K in eval_lengths(args.K)[1:]:
            curves[K], _ = evaluate(lambda tok: predict(params, tok), training.held_out(args, K=K))
        metrics["length_generalization"] = {str(K): m["kl_bits"] for K, m in curves.items()}
        metrics["length_generalization_all"] = {
            str(K): {key: m[key] for key in ("kl_bits", "entropy_mae_bits", "entropy_mae_seq_bits")}
            for K, m in curves.items()}
        metrics["length_generalization_curves"] = {str(K): m["per_position"] for K, m in curves.items()}
    return metrics, traces


def prior_gap(args):
    """The task's prior gap in bits (what the authors' MLP can reach at best)."""
    return wt.prior_gap_bits(args.task, V=args.V, K=args.K)


def main(argv=None):
    """python train.py: one line and exit code 2 for bad input or a file that cannot be written."""
    try:
        return dispatch(parse_args(argv))
    except OSError as e:
        fail(f"{e.filename or 'a file'} cannot be written ({e.strerror})")


def dispatch(args):
    numba.set_num_threads(args.threads)
    if args.kernels == "numba":
        import kernels
        kernels.enable()                             # the fast twins; --kernels numpy keeps the NumPy ops
    if args.eval_only:
        return eval_only(args)
    args.figures = args.figures or args.out                     # a run's figures stay in its directory
    for flag, folder in (("--out", args.out), ("--figures", args.figures)):   # fail now, not after training
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, ".write-test"), "w"):
                pass
            os.remove(os.path.join(folder, ".write-test"))
        except OSError as e:
            fail(f"{flag} {folder!r} cannot be written ({e.strerror})")
    if args.task == "sticky":
        return sticky(args)
    spec = task_spec(args.task, V=args.V, K=args.K, soft=args.soft, curriculum=args.curriculum)
    need, have = training.step_memory_bytes(args, spec), training.available_memory_bytes()
    if need > 0.8 * have:                           # refuse before allocating anything
        fits = max(0, int(args.batch * 0.8 * have / need))
        fail(f"--batch {args.batch} --width {args.width} --layers {args.layers}: a training step would need about "
             f"{need / 2**30:.1f} GiB, and {have / 2**30:.1f} GiB are available"
             + (f" (--batch {fits} would fit)" if fits else ""))
    if args.resume and args.overwrite:
        fail("--resume and --overwrite: continue the run in --out or replace it, not both")
    previous = training.run_files(args.out)
    if previous and not (args.resume or args.overwrite):
        fail(f"--out {args.out!r} already holds a run ({', '.join(previous[:3])}{', ...' if len(previous) > 3 else ''}): "
             f"continue it with --resume, replace it with --overwrite, or give another --out")
    training.remove_stale_temporaries(args.out)                 # a save killed half-way leaves .tmp-* files
    if args.overwrite:
        training.remove_run(args.out, previous)
    results = {}
    run_name = os.path.basename(os.path.normpath(args.out))    # figures are named after the run
    figure = lambda what: os.path.join(args.figures, f"{run_name}_{what}.png")
    gap = prior_gap(args)                                       # the authors' MLP can reach this at best

    # the model (a transformer unless --model says otherwise), then the baseline MLP (unless --no-baseline)
    resumed = load_for_resume(args) if args.resume else None     # (params, cfg, opt_state, step)
    t_state = resumed if resumed and args.model == "transformer" else (None, None, None, 0)
    model, params, cfg = make_transformer(args, spec, t_state[0], t_state[1])
    n_params = ba.count_params(params)                           # the MLPs match the transformer's size
    runs = [("transformer", model, params, cfg, t_state[2], t_state[3])] if args.model == "transformer" else []
    mlps = [args.model] if args.model != "transformer" else [] if args.no_baseline else [args.baseline]
    for name in mlps:
        m_state = resumed if resumed and args.model == name else (None, None, None, 0)
        if args.resume and args.model == "transformer" and os.path.exists(os.path.join(args.out, checkpoint_name(name))):
            m_state = load_for_resume(argparse.Namespace(**{**vars(args), "model": name}))  # baseline resumes too
        try:
            mlp_model, mlp_params, mcfg = make_mlp(args, spec, n_params, m_state[0], m_state[1],
                                                   inputs="token" if name == "mlp" else "prefix")
            runs.append((name, mlp_model, mlp_params, mcfg, m_state[2], m_state[3]))
        except ValueError as e:                      # too small a transformer to match
            if args.model == name:
                fail(f"--model {name}: {e}")
            print(f"{name} baseline skipped: {e}")
    sizes = ", ".join(f"{ba.count_params(r[2]):,} {r[0]} parameters" for r in runs)   # each model's own size
    print(f"{args.task}: {sizes}, {args.steps} steps of batch {args.batch}, "
          f"{'soft posterior' if spec['soft'] else 'sampled'} targets, run dir {args.out}")
    for name, mdl, prm, c, opt_state, start in runs:
        model_args = argparse.Namespace(**{**vars(args), "model": name})
        try:
            prm, _, step, seconds, interrupted = training.train(
                mdl, prm, c, spec, model_args, args.out, opt_state=opt_state, start=start,
                log_name="log.csv" if name == "transformer" else f"log_{name}.csv")
        except training.TrainingStopped as e:
            fail(str(e))
        if interrupted:
            print(f"\ninterrupted after step {step}: checkpoint saved; continue with --resume", file=sys.stderr)
            sys.exit(130)
        if step < args.steps:
            print(f"stopped at step {step} of {args.steps} (--stop-after); continue with "
                  f"python train.py --resume --out {args.out} and the same flags, without --stop-after")
            return results
        metrics, traces = evaluate_run(args, mdl[1], prm)
        metrics = dict(task=args.task, model=name, params=ba.count_params(prm), steps=step,
                       seconds=round(seconds, 1), targets="soft" if spec["soft"] else "sampled",
                       prior_gap_bits=gap, config=c.to_dict(), **metrics)
        write_json(os.path.join(args.out, metrics_name(name)), metrics)
        results[name] = metrics
        if name == "transformer":
            plots.plot_traces(traces, args.task, figure("traces"))
            if args.task == "hmm":
                plots.plot_length_generalization(plots.length_curves(metrics), figure("length_generalization"))
    plots.plot_calibration(results, args.task, figure("calibration"))
    print(summary_table(results, gap))
    if "transformer" in results and not args.no_geometry:
        import geometry                                  # the geometry probes, into runs/<name>/geometry.json
        geometry.analyze(os.path.join(args.out, "checkpoint.npz"), fig_dir=args.figures)
        print(f"geometry: {os.path.join(args.out, 'geometry.json')} and {args.figures}/geometry_*.png")
    for name, m in results.items():
        extra = f", length generalisation KL {m['length_generalization']}" if "length_generalization" in m else ""
        print(f"{name}: {m['seconds']} s of training{extra}")
    return results


def sticky(args):
    """Paper II on the sticky chain: dynamics.py's one head, the EM comparison or the deep variant."""
    try:
        return _sticky(args)
    except ValueError as e:                          # a loss that turned non-finite
        fail(str(e))


def _sticky(args):
    import json
    import dynamics
    if args.compare_em:                              # SGD vs EM-like vs true M-step, 5 seeds (minutes)
        return dynamics.compare_em(steps=args.steps or 1000, out_dir=args.out, chain=args.chain)
    if args.deep:                                    # the authors' deep variant, 5 seeds (an hour)
        return dynamics.run_deep(args.chain, args.steps or 1000, args.out)
    metrics = dynamics.run_sticky(steps=args.steps or 1000, seed=args.seed, lr=args.lr or 0.01,
                                  out_dir=args.out, chain=args.chain)
    print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, (list, dict))}, indent=1))
    return metrics


def load_for_resume(args):
    """-> (params, cfg, opt_state, step) of the run in --out, after checking it is the same run."""
    path = os.path.join(args.out, checkpoint_name(args.model))
    try:
        params, cfg, meta, opt_state = load_checkpoint(path)
    except ValueError as e:
        fail(f"--resume: {e}")
    want = training.run_meta(args, meta.get("step", 0))
    # threads too: the split products' partial sums depend on it, and a resume is bit-identical only at the same
    for key in ("task", "model", "seed", "batch", "steps", "lr", "warmup", "lr_floor", "weight_decay", "threads",
                "soft", "curriculum", "V", "K", "pos", "init", "dtype", "eval_seqs"):
        # runs older than --lr-floor used 0.1, older than --weight-decay 0.01; older than --threads: not checked
        have = meta.get(key, {"lr_floor": 0.1, "weight_decay": WEIGHT_DECAY, "threads": want["threads"],
                              "curriculum": "", "init": "gpt2", "eval_seqs": EVAL_SEQS}.get(key))
        if have != want[key]:
            fail(f"--resume: checkpoint {path!r} has {key}={have!r} but this run asks for {want[key]!r}")
    if args.stop_after is not None and args.stop_after <= meta.get("step", 0):
        fail(f"--stop-after {args.stop_after}: the checkpoint {path!r} is already at step {meta.get('step', 0)}; "
             f"give a later step, or leave --stop-after out to finish the run")
    if opt_state is None:
        fail(f"--resume: checkpoint {path!r} holds no optimiser state")
    if args.model == "transformer" and (cfg.d_model, cfg.n_layers, cfg.n_heads) != (args.width, args.layers, args.heads):
        fail(f"--resume: checkpoint {path!r} holds width {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads, "
             f"not the {args.width}/{args.layers}/{args.heads} asked for")
    args.prior_seconds = float(meta.get("seconds", 0.0))
    return params, cfg, opt_state, int(meta["step"])


def eval_only(args):
    try:
        params, cfg, meta, _ = load_checkpoint(args.eval_only)
    except ValueError as e:
        fail(f"--eval-only: {e}")
    if "task" not in meta:
        fail(f"--eval-only: checkpoint {args.eval_only!r} does not say which task it was trained on")
    if meta.get("replacement"):
        fail(f"--eval-only: checkpoint {args.eval_only!r} is of the retired --replacement variant "
             f"(separate vocabularies, keys with replacement); Paper I's variant is --task sawtooth")
    for key in ("task", "V", "K", "seed"):               # the run's own held-out set: its seed picks it
        if key in meta:
            setattr(args, key, meta[key])
    if "eval_seqs" in meta and not args.eval_seqs_given:
        args.eval_seqs = meta["eval_seqs"]
    spec = task_spec(args.task, V=args.V, K=args.K)
    if (cfg.vocab_size, cfg.n_classes) != (spec["vocab"], spec["classes"]):
        fail(f"--eval-only: checkpoint {args.eval_only!r} has {cfg.vocab_size} tokens and {cfg.n_classes} classes, "
             f"not the {spec['vocab']} and {spec['classes']} of task {args.task}")
    name = "transformer" if isinstance(cfg, ba.Config) else "mlp" if cfg.inputs == "token" else "prefix-mlp"
    if name == "transformer":
        model, params, cfg = make_transformer(args, spec, params, cfg)
    else:
        model, params, cfg = make_mlp(args, spec, None, params, cfg)
    metrics, traces = evaluate_run(args, model[1], params)
    metrics = dict(task=args.task, model=name, params=ba.count_params(params), **metrics)
    print(summary_table({name: metrics}, prior_gap(args)))
    if name == "transformer":                    # redraw the run's figures from this evaluation
        run_name = os.path.basename(os.path.dirname(os.path.abspath(args.eval_only)))
        args.figures = args.figures or os.path.dirname(os.path.abspath(args.eval_only))
        try:
            os.makedirs(args.figures, exist_ok=True)
        except OSError as e:
            fail(f"--figures {args.figures!r} cannot be written ({e.strerror})")
        paths = [plots.plot_calibration({name: metrics}, args.task, os.path.join(args.figures, f"{run_name}_calibration.png")),
                 plots.plot_traces(traces, args.task, os.path.join(args.figures, f"{run_name}_traces.png"))]
        if "length_generalization" in metrics:
            paths.append(plots.plot_length_generalization(
                plots.length_curves(metrics), os.path.join(args.figures, f"{run_name}_length_generalization.png")))
        print("figures: " + ", ".join(paths))
    return metrics


if __name__ == "__main__":
    main()
