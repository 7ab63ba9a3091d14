"""Train a model on a Bayesian wind tunnel and measure it against the exact posterior, in bits.

    python train.py --task sawtooth --preset first   # the first run: the sawtooth, the transformer and the
                                                      # authors' MLP side by side (minutes)
    python train.py                                   # bijection wind tunnel (format a), the CPU-sized default
    python train.py --task hmm --preset paper --soft
    python train.py --eval-only runs/bijection-transformer-default/checkpoint.npz

Writes runs/<name>/: checkpoint.npz, metrics.json, log.csv, snapshots/, geometry.json and the figures.
This file is what runs in which order; its flags, each once in one table and checked once, are harness/flags.py's.
The families are models.py's, the tasks tunnels/tasks.py's, the loop training.py's, the numbers evaluation.py's,
the figures harness/plots.py's.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see layers.py: BLAS threads fight Numba's

import csv  # noqa: E402
import dataclasses
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402

from primitives import cot  # noqa: E402
import layers  # noqa: E402
import models  # noqa: E402
import optim  # noqa: E402
from harness import plots  # noqa: E402
from harness import runs  # noqa: E402
from tunnels import tasks  # noqa: E402
import training  # noqa: E402
from harness.checkpoints import CheckpointNotSaved, load_checkpoint, save_checked, versions, write_json  # noqa: E402
from evaluation import evaluate  # noqa: E402
from harness.flags import (OPTIMIZER, STICKY, baseline_config, fail, fit_positions, flag_table,  # noqa: E402
                           model_config, parse_args)


N_SNAPSHOTS = 24        # light parameter snapshots at log-spaced steps (the frame-precision probe)
SAVE_EVERY = 500        # steps between checkpoints
LOG_HEADER = ["step", "loss_bits", "bayes_loss_bits", "lr", "grad_norm", "seconds"]    # log.csv's columns


# ----------------------------------------------------------------------------
# one training run of one model, through training.train

def lr_at(args, step, steps):
    """Warm-up, then cosine from args.lr to args.lr * args.lr_floor at `steps`."""
    return optim.lr_schedule(step, args.lr, args.warmup, steps, min_lr=args.lr * args.lr_floor)


def log_spaced_steps(steps, n, first=100):
    """n snapshot steps, log-spaced from `first` (the frame-precision probe starts near step 100; a run of
    fewer than 1,000 steps starts at a tenth of its length) to steps."""
    return sorted({int(round(s)) for s in np.geomspace(max(1, min(first, steps // 10)), steps, n)} | {steps})


def run_meta(args, model, step, steps, seconds=0.0):
    """What a checkpoint records of its run: every flag of the run's identity, the task's settings, the model."""
    meta = {row["dest"]: getattr(args, row["dest"]) for row in flag_table().values()
            if row.get("run") and not row.get("setting")}
    own = models.config_fields(model)                                  # only the fields this family has
    meta.update(args.settings, model=model, step=step, steps=steps, seconds=round(seconds, 2),
                **{k: getattr(args, k, None) for k in ("pos", "init", "dtype") if k in own}, versions=versions())
    return meta


def bayes_loss_bits(batch, soft=False):
    """The loss floor of this batch, in bits: the cross-entropy of the sampled targets under the exact
    posterior, or with soft targets the posterior's own entropy (so loss - floor is then the KL)."""
    from tunnels import windtunnels as wt
    mask = batch["mask"] > 0
    if soft:
        return float(wt.entropy_bits(batch["posterior"][mask]).mean())
    p = np.take_along_axis(batch["posterior"], batch["targets"][..., None], -1)[..., 0]
    return float(-np.log2(p[mask]).mean())


def curriculum_until(settings):
    """The step the task's curricula end (the largest S of every `*curriculum` setting's stages `V:S,...`), 0
    without one: until then a batch is easier than the task's, and so is its exact posterior's loss."""
    ends = [int(stage.split(":")[1]) for k, v in settings.items() if k.endswith("curriculum") and v
            for stage in str(v).split(",") if ":" in stage]
    return max(ends, default=0)


def train_model(args, name, cfg, params, opt_state, start, steps, main, bar, cost):
    """Train one model of the run in args.out from step `start` to `steps` (or --stop-after), writing its
    log, snapshots (the main model) and checkpoints; bar (or None): the command's one progress bar, which
    this model's steps advance by `cost` each. -> params, step reached, seconds, interrupted."""
    opt_state = opt_state or optim.adamw_init(params)
    decay = models.decay_set(name, params)
    loss_and_grads = lambda p, tok, tgt, m: models.loss_and_grads(name, p, tok, tgt, m, cfg)
    ckpt = os.path.join(args.out, runs.checkpoint_name(name, main))
    snap_dir = os.path.join(args.out, "snapshots")
    snapshots = set(log_spaced_steps(steps, N_SNAPSHOTS)) if main else set()
    os.makedirs(snap_dir, exist_ok=True)
    log_path = os.path.join(args.out, runs.log_name(name, main))
    rows = args.kept_rows.get(name, []) if start else []     # the rows up to the checkpoint (kept_log_rows)
    prior = float(getattr(args, "prior_seconds", {}).get(name, 0.0)) if start else 0.0
    wall = {"t0": None}

    def save(path, step, with_state=True):
        save_checked(path, params, cfg, run_meta(args, name, step, steps, wall["seconds"]),
                     opt_state if with_state else None)

    def step(i):
        batch = tasks.sample(args.task, np.random.default_rng((args.seed, i)), args.batch, args.settings, i)
        lr = lr_at(args, i, steps)
        targets = batch["posterior"] if args.soft else batch["targets"]
        loss, norm = training.train_step(loss_and_grads, params, opt_state, batch["tokens"], targets, batch["mask"],
                                         lr, args.weight_decay, decay=decay)
        return dict(loss=loss, grad_norm=norm, lr=lr, floor=bayes_loss_bits(batch, args.soft))

    until = curriculum_until(args.settings)
    with open(log_path, "w", newline="") as log_file:
        log = csv.writer(log_file)
        log.writerow(LOG_HEADER)
        log.writerows(rows)
        t0 = time.time() - prior

        def on_step(i, r, compute):
            wall["seconds"], wall["step"] = time.time() - t0, i + 1
            loss_bits = layers.bits(r["loss"])
            log.writerow([i + 1, f"{loss_bits:.6f}", f"{r['floor']:.6f}", f"{r['lr']:.3e}", f"{r['grad_norm']:.4f}",
                          f"{wall['seconds']:.2f}"])
            if (i + 1) in snapshots:
                save(os.path.join(snap_dir, f"step_{i + 1:07d}.npz"), i + 1, with_state=False)
            if (i + 1) % SAVE_EVERY == 0:
                save(ckpt, i + 1)
            if i % 10 == 0:
                log_file.flush()                     # so `tail runs/<name>/log.csv` follows the run
                if bar is not None:
                    stage = f" (curriculum until step {until}: easier batches)" if i < until else ""
                    bar.set_postfix_str(f"{name}: loss {loss_bits:.3f} bits | the exact posterior's on this batch "
                                        f"{max(r['floor'], 0.0):.3f}{stage}")

        wall["seconds"] = prior
        try:
            out = training.train(step, steps, start, args.stop_after, on_step=on_step,
                                 on_interrupt=lambda s: save(ckpt, s), prior_seconds=prior,
                                 progress=None if bar is None else lambda: bar.update(min(cost, bar.total - bar.n)))
            # (never past the total: float sums of the costs can overshoot it, and tqdm then drops the percentage)
            if not out["interrupted"]:
                wall["seconds"] = out["seconds"]
                save(ckpt, out["step"])
        except training.TrainingStopped as e:            # the loss or the gradient turned non-finite
            kept = (f"the last good checkpoint stays in {ckpt}" if os.path.exists(ckpt)
                    else "no checkpoint had been written yet")
            raise training.TrainingStopped(f"{e}, {kept} (try a smaller --lr)") from None
        except CheckpointNotSaved as e:                  # a weight is not finite, or the disk refused
            raise training.TrainingStopped(f"step {wall.get('step', '?')}: {e}; training stopped (try a smaller "
                                           f"--lr)") from None
    return params, out["step"], out["seconds"], out["interrupted"]


# ----------------------------------------------------------------------------
# evaluation

def evaluate_run(args, name, params, cfg):
    """Held-out metrics, and on the task's variants (the HMM's longer K) the same under its VARIANTS key;
    where the task's batches are chains of thought (its chain_layout), the model also runs free (primitives/cot.py) and
    its final answers are scored against the exact posterior given the context alone, under "free_run"; where
    the task reads its answers in parts (its readings: hops' lookup and elimination), under "readings"."""
    predict = lambda tok: models.predict_proba(name, params, tok, cfg)
    sets = tasks.held_out_sets(args.task, args.settings, args.eval_seqs, args.seed)
    held_out = sets.pop("")
    metrics, traces = evaluate(predict, held_out)
    layout = getattr(tasks.task(args.task), "chain_layout", lambda batch, s: None)(held_out, args.settings)
    if layout is not None:
        metrics["free_run"] = cot.report(predict, held_out, layout)
        traces["free"] = cot.examples(predict, held_out, layout)         # the companion figure's sequences
    read = getattr(tasks.task(args.task), "readings", None)
    if read is not None and layout is None:                # hops, direct: the lookup and the elimination apart
        metrics["readings"] = read(held_out, predict(held_out["tokens"]), args.settings)
    key = getattr(tasks.task(args.task), "VARIANTS", None)
    if key and sets:
        curves = {label: (metrics if batch is None else evaluate(predict, batch)[0]) for label, batch in sets.items()}
        metrics[key] = {label: m["kl_bits"] for label, m in curves.items()}
        metrics[key + "_all"] = {label: {k: m[k] for k in ("kl_bits", "entropy_mae_bits", "entropy_mae_seq_bits")}
                                 for label, m in curves.items()}
        metrics[key + "_curves"] = {label: m["per_position"] for label, m in curves.items()}
    return metrics, traces


def summary_table(rows, prior_gap=None, task=None):
    """The models' metrics, then the exact posterior's (0) and a prior-only (uniform) predictor's: measured on
    the same held-out answers where the rows carry it (metrics["prior_only"]), else its expectation, the
    prior's gap log2(#classes) - E[H_Bayes] (prior_gap, tasks.prior_gap_bits), in all three columns; then
    each model's answer groups and, where task (its module) has them, its held-out variants."""
    head = (f"{'model':<14}{'params':>10}{'entropy MAE':>13}{'per-seq MAE':>13}{'KL':>11}{'excess CE':>11}"
            f"{'p(impossible)':>15}")
    lines = [head, "-" * len(head)]
    for name, m in rows.items():
        lines.append(f"{name:<14}{m.get('params', 0):>10,}{m['entropy_mae_bits']:>13.4g}"
                     f"{m['entropy_mae_seq_bits']:>13.4g}{m['kl_bits']:>11.4g}{m['excess_ce_bits']:>11.4g}"
                     f"{m.get('impossible_mass', float('nan')):>15.3g}")
    measured = next((m["prior_only"] for m in rows.values() if "prior_only" in m), None)
    if measured is not None:
        lines.append(f"{'prior only':<14}{'':>10}{measured['entropy_mae_bits']:>13.4g}"
                     f"{measured['entropy_mae_seq_bits']:>13.4g}{measured['kl_bits']:>11.4g}")
    elif prior_gap is not None:
        lines.append(f"{'prior only':<14}{'':>10}{prior_gap:>13.4g}{prior_gap:>13.4g}{prior_gap:>11.4g}")
    lines.append(f"{'exact Bayes':<14}{'':>10}{0:>13}{0:>13}{0:>11}{0:>11}{0:>15}   (bits; p: a probability)")
    for name, m in rows.items():
        lines += [f"{name}, {group_line(g, v)}" for g, v in m.get("groups", {}).items()]
        if "free_run" in m:                                    # a chain of thought run free, then greedily
            free = m["free_run"]["free"]
            lines.append(f"{name} writing its own chains (the first {free['rows']:,} sequences; free: every chain "
                         f"of probability {free['prune']:g} or more, at most {free['beam']} a sequence, dropping "
                         f"at most {free['dropped_mass_max']:.2g} of the mass; greedy: the argmax at each hop), "
                         f"the final answers against the exact posterior given the context alone:")
            lines += [f"{name}, {how}, {group_line(g, v)}" for how, r in m["free_run"].items()
                      for g, v in r["groups"].items()]
        for h, r in m.get("readings", {}).items():              # hops, direct: the lookup, the elimination
            lines.append(f"{name}, h={h}: " + reading_line(r))
        key = getattr(task, "VARIANTS", None)
        if key and key + "_all" in m:
            fmt = getattr(task, "VARIANT_FORMAT", "{}")
            lines.append(f"{name}, held-out variants (bits): " + "; ".join(
                f"{fmt.format(label)}: KL {g['kl_bits']:.4g}, entropy MAE (paper) {g['entropy_mae_bits']:.4g}, "
                f"per-seq MAE {g['entropy_mae_seq_bits']:.4g}" for label, g in m[key + "_all"].items()))
    return "\n".join(lines)


def reading_line(r):
    """One h's two readings (tunnels/hops.readings) in one line, each beside the predictors that do one thing."""
    acc = lambda v: "none" if v is None else f"{v:.4f}"
    kl = lambda v: "none" if v is None else f"{v:.4g} bits"
    look, elim, only, each = r["lookup"], r["elimination"], r["follow_shown"], r["eliminate_each_hop"]
    return (f"lookup ({look['n']:,} one-hot answers): accuracy {acc(look['accuracy'])}, KL {kl(look['kl_bits'])}; "
            f"elimination ({elim['n']:,} uncertain answers): KL {kl(elim['kl_bits'])}, against the lookup-only "
            f"predictor's {kl(only['elimination_kl_bits'])} and one elimination a hop's "
            f"{kl(each['elimination_kl_bits'])}")


def group_line(name, g):
    """One answer group's numbers (evaluation.group_metrics) in one line."""
    acc = (f", accuracy {g['accuracy']:.4f} on the one-hot answers ({g['one_hot']:.0%} of them)"
           if "accuracy" in g else "")
    return (f"{name} ({g['n_answers']:,} answers): KL {g['kl_bits']:.4g} bits, excess CE {g['excess_ce_bits']:.4g}, "
            f"per-seq MAE {g['entropy_mae_seq_bits']:.4g}, mean entropy {g['h_model_bits']:.4g} "
            f"(exact {g['h_bayes_bits']:.4g})" + acc
            + (f"; hallucinated {g['hallucinated']:.1%}, honest doubt {g['honest_doubt']:.1%}" if "hallucinated" in g else ""))


def draw_figures(args, results, traces, fig_dir, run_name):
    """The run's calibration figure (every model), the main model's single sequences and variants."""
    label = getattr(tasks.task(args.task), "ANSWER_LABEL", "answer index i")
    figure = lambda what: os.path.join(fig_dir, f"{run_name}_{what}.png")
    paths = [plots.plot_calibration(results, args.task, label, figure("calibration")),
             plots.plot_traces(traces, args.task, label, figure("traces"))]
    main, mod = next(iter(results.values())), tasks.task(args.task)
    if "groups" in main and all("groups" in m and list(m["groups"]) == list(main["groups"]) for m in results.values()):
        paths.append(plots.plot_groups(results, args.task, figure("groups")))
    if traces is not None and "free" in traces:                      # a chain of thought run free
        paths.append(plots.plot_free(traces["free"], args.task, figure("free")))
    key = getattr(mod, "VARIANTS", None)
    if key and key + "_curves" in main:
        paths.append(plots.plot_variants(plots.variant_curves(main, key), figure(key),
                                         getattr(mod, "VARIANT_FORMAT", "{}"), label,
                                         getattr(mod, "VARIANT_TITLE", f"{args.task}: held-out variants")))
    return paths


# ----------------------------------------------------------------------------
# what runs in which order

def main(argv=None):
    """python train.py: one line and exit code 2 for bad input or a file that cannot be written. The fast
    path and the thread count are this call's: both are what they were before once it returns."""
    args = parse_args(argv)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(args.threads)
        with kernel_switch(args.kernels):
            return dispatch(args)
    except OSError as e:
        fail(f"{e.filename or 'a file'} cannot be written ({e.strerror})")
    finally:
        numba.set_num_threads(threads)


def kernel_switch(which):
    """--kernels numba: the fast twins within the block; numpy: the NumPy ops as written."""
    if which == "numba":
        import kernels
        return kernels.enabled()
    return layers.use_twins({})


def writable(flag, folder):
    problem = runs.writable(folder)
    if problem:
        fail(f"{flag} {folder!r} {problem}")


def take(args, held=(), resumable=True):
    """Take the run directory --out for this command (runs.take: its name, writability, lock and the
    never-overwrite rule), or one line and exit 2."""
    if args.resume and args.overwrite:
        fail("--resume and --overwrite: continue the run in --out or replace it, not both")
    try:
        runs.take(args.out, "--out", " ".join(["train.py", *args.argv]), held, keep=args.resume or args.overwrite,
                  resumable=resumable)
    except runs.Refused as e:
        fail(str(e))


def sized_by(args, flags, fallback):
    """The flags among those that the user typed, with their values ("--V 5000 --batch 64"), else fallback."""
    typed = [f"{flag} {getattr(args, flag_table()[flag]['dest'])}" for flag in flags if flag in args.given]
    return " ".join(typed) or fallback


def check_memory(args, name, cfg, sizes, eval_seqs, eval_flags):
    """Refuse, before anything is deleted, trained or written, a training step (--batch at the longest
    evaluated length) or a held-out evaluation (eval_seqs sequences: the sets, and the model run over them
    in chunks) that would not fit in the memory available; the line names the flags the user typed that
    size it. eval_flags: the flags to name for the evaluation (their values, or what they fall back to)."""
    have = models.available_memory_bytes()
    size_flags = ["--batch", "--width", "--layers", "--heads", "--dtype", *tasks.task(args.task).FLAGS]
    step = models.step_memory_bytes(name, cfg, args.batch, sizes["eval_len"]) if not args.eval_only else 0
    evaluation = (6 * tasks.held_out_bytes(args.task, args.settings, eval_seqs)
                  + models.step_memory_bytes(name, cfg, min(eval_seqs, 256), sizes["eval_len"]))
    if step > 0.8 * have:
        fits = max(0, int(args.batch * 0.8 * have / step))
        preset = f"--preset {args.preset} (--batch {args.batch} --width {args.width} --layers {args.layers})"
        fail(f"{sized_by(args, size_flags, preset)}: a training step would need about {step / 2**30:.1f} GiB, and "
             f"{have / 2**30:.1f} GiB are available"
             + (f" (--batch {fits} would fit)" if fits and "--batch" in args.given else ""))
    if evaluation > 0.8 * have:
        fail(f"{eval_flags}: the held-out evaluation of {eval_seqs:,} sequences would need about "
             f"{evaluation / 2**30:.1f} GiB, and {have / 2**30:.1f} GiB are available")


def dispatch(args):
    if args.task == STICKY:                                     # Paper II's experiments have their own command
        fail("--task sticky is Paper II's chain: its experiments run with python -m dynamics.run (the same flags, "
             "without --task sticky)")
    if args.eval_only:
        return eval_only(args)
    args.figures = args.figures or args.out                     # a run's figures stay in its directory
    sizes = tasks.sizes(args.task, args.settings)
    cfg = model_config(args, sizes, args.model)
    check_memory(args, args.model, cfg, sizes, args.eval_seqs,   # refuse before allocating anything
                 sized_by(args, ["--eval-seqs", *tasks.task(args.task).FLAGS], f"--eval-seqs {args.eval_seqs}"))
    if "--figures" in args.given:                               # fail now, not after training
        writable("--figures", args.figures)
    args.grown = grown(args, cfg) if args.grow_from and not args.resume else None
    take(args, runs.run_files(args.out, models.FAMILIES))
    try:
        return token_run(args, sizes, cfg)
    finally:
        runs.release(args.out)


def grown(args, cfg):
    """--grow-from: the model started from a trained shallower one of the same family, task and settings
    (models.grow: it computes what that one computes), checked before anything is written."""
    try:
        params, cfg_from, meta, _ = load_checkpoint(args.grow_from)
    except ValueError as e:
        fail(f"--grow-from: {e}")
    if (meta.get("model"), meta.get("task")) != (args.model, args.task):
        fail(f"--grow-from {args.grow_from!r}: a {meta.get('model')!r} trained on {meta.get('task')!r}, not the "
             f"{args.model} on {args.task} asked for")
    if tasks.settings_from(args.task, cfg_from, meta) != args.settings:
        fail(f"--grow-from {args.grow_from!r}: trained on other {args.task} settings "
             f"({tasks.settings_from(args.task, cfg_from, meta)}) than these ({args.settings})")
    try:
        return models.grow(args.model, params, fit_positions(cfg_from, tasks.sizes(args.task, args.settings)), cfg,
                           args.seed)
    except ValueError as e:
        fail(f"--grow-from {args.grow_from!r}: {e}")


def token_run(args, sizes, cfg):
    previous = runs.run_files(args.out, models.FAMILIES)
    run_name = os.path.basename(os.path.normpath(args.out))    # figures are named after the run
    gap = tasks.prior_gap_bits(args.task, args.settings)        # the authors' MLP can reach this at best

    # the model (--model), then the baseline capacity-matched to it (unless --no-baseline)
    args.prior_seconds, args.kept_rows = {}, {}
    state = load_for_resume(args, args.model, True, cfg) if args.resume else None
    params = state[0] if state else args.grown if args.grown is not None else models.init_params(args.model, cfg,
                                                                                                   args.seed)
    phases = [(args.model, state[1] if state else cfg, params, *(state[2:] if state else (None, 0)), True, args.steps)]
    n_params = models.count_params(params)
    if not args.no_baseline and args.baseline == args.model:
        print(f"no baseline: --baseline {args.baseline} is the --model itself")
    if not args.no_baseline and args.baseline != args.model:
        try:
            bcfg = baseline_config(args.baseline, phases[0][1], n_params)
        except ValueError as e:                                  # too small a model to match
            print(f"{args.baseline} baseline skipped: {e}")
        else:
            bsteps = args.baseline_steps or args.steps
            path = os.path.join(args.out, runs.checkpoint_name(args.baseline, False))
            bstate = load_for_resume(args, args.baseline, False, bcfg, bsteps) if args.resume and os.path.exists(path) \
                else None
            bparams = bstate[0] if bstate else models.init_params(args.baseline, bcfg, args.seed)
            phases.append((args.baseline, bstate[1] if bstate else bcfg, bparams,
                           *(bstate[2:] if bstate else (None, 0)), False, bsteps))
    done = {p[0]: os.path.join(args.out, runs.metrics_name(p[0], p[5])) for p in phases
            if args.resume and p[4] >= p[6] and os.path.exists(os.path.join(args.out, runs.metrics_name(p[0], p[5])))}
    if len(done) == len(phases):                                # every model finished: nothing to continue
        fail(f"--resume: the run in --out {args.out!r} is finished (step {phases[0][6]} of {phases[0][6]}; "
             f"{', '.join(os.path.basename(p) for p in done.values())} written); --overwrite replaces it, "
             f"--eval-only {os.path.join(args.out, 'checkpoint.npz')} scores it again")
    runs.remove_stale_temporaries(args.out)                     # a save killed half-way leaves .tmp-* files
    if args.overwrite:                                          # every check passed: now the old run goes
        runs.remove_run(args.out, previous)
    sizes_line = ", ".join(f"{models.count_params(p[2]):,} {p[0]} parameters" for p in phases)
    print(f"{args.task}: {sizes_line}; {' then '.join(f'{p[6]} steps' for p in phases)} of batch {args.batch}, "
          f"{'soft posterior' if args.soft else 'sampled'} targets, run dir {args.out}")
    cost = {p[0]: float(models.step_flops(p[0], p[1], args.batch, sizes["max_len"])) for p in phases}
    bar = None if args.quiet else progress_bar(sum(cost[p[0]] * max(0, p[6] - p[4]) for p in phases), args.task,
                                               args.stop_after)
    compile_seconds = compile_kernels(args, phases, bar)
    results, traces = {}, None
    try:
        for name, mcfg, prm, opt_state, start, main_model, steps in phases:
            if name in done:                                    # finished before: its metrics stay as written
                with open(done[name]) as f:
                    results[name] = json.load(f)
                traces = traces or (evaluate_run(args, name, prm, mcfg)[1] if main_model else None)
                continue
            try:
                prm, step, seconds, interrupted = train_model(args, name, mcfg, prm, opt_state, start, steps,
                                                              main_model, bar, cost[name])
            except training.TrainingStopped as e:
                fail(str(e))
            if interrupted:
                print(f"\ninterrupted after step {step}: checkpoint saved; continue with --resume", file=sys.stderr)
                sys.exit(130)
            if step < steps:
                if bar is not None:
                    bar.close()                                  # the message on a line of its own
                print(f"stopped at step {step} of {steps} (--stop-after); continue with "
                      f"python train.py --resume --out {args.out} and the same flags, without --stop-after")
                return results
            metrics, t = evaluate_run(args, name, prm, mcfg)
            metrics = dict(task=args.task, model=name, params=models.count_params(prm), steps=step, batch=args.batch,
                           seconds=round(seconds, 1), targets="soft" if args.soft else "sampled", settings=args.settings,
                           prior_gap_bits=gap, config=dataclasses.asdict(mcfg), **metrics, versions=versions(),
                           optimizer={k: getattr(args, k) for k in OPTIMIZER})
            write_json(os.path.join(args.out, runs.metrics_name(name, main_model)), metrics)
            results[name] = metrics
            traces = traces or t
    finally:
        if bar is not None:
            bar.close()
    draw_figures(args, results, traces, args.figures, run_name)
    print(summary_table(results, gap, tasks.task(args.task)))
    if results and not args.no_geometry:
        from geometry import run as geometry                                  # the geometry probes, into runs/<name>/geometry.json
        from geometry import verdicts
        try:
            g = geometry.analyze(os.path.join(args.out, "checkpoint.npz"), fig_dir=args.figures)
        except ValueError as e:                          # a family whose forward keeps no streams to probe
            print(f"geometry: skipped: {e}")
        else:
            print(f"geometry: {os.path.join(args.out, 'geometry.json')} and {args.figures}/geometry_*.png; the "
                  f"verdicts (python -m geometry.run {os.path.join(args.out, 'checkpoint.npz')} prints every number):")
            print("\n".join("  " + line for line in verdicts.lines(g["verdicts"])))
            for probe, why in g.get("skipped_probes", {}).items():
                print(f"geometry: skipped {probe}: {why}")
            if "skipped" in g:
                print(f"geometry: skipped for --model {args.model}: {g['skipped']}")
    for name, m in results.items():
        print(f"{name}: {m['seconds']:.1f} s of training")
    if compile_seconds >= 1.0:
        print(f"(and {compile_seconds:.0f} s compiling the Numba kernels before it, not counted: they are cached "
              f"for the next run)")
    return results


def progress_bar(total, desc, stop_after=None):
    """One progress bar, and one estimate of the time left, for all the training of the command: each model
    advances it by its estimated cost per step (models.step_flops) at every step, so the rate measured so
    far prices the steps still to come of every model. It first says the kernels are compiling
    (compile_kernels starts the clock after); with --stop-after it shows the share of the whole run done."""
    from tqdm import tqdm
    bar = tqdm(total=total, desc=desc, dynamic_ncols=True, mininterval=1.0,
               bar_format="{desc}: compiling the Numba kernels before training (not counted as training; cached "
                          "for the next run)")
    what = f"the run (this command stops at step {stop_after})" if stop_after else "the whole command"
    bar.training_format = ("{desc}: {percentage:3.0f}% |{bar}| {elapsed} so far, about {remaining} left for the "
                           "training of " + what + "{postfix}")
    return bar


def compile_kernels(args, phases, bar):
    """One thrown-away training step of every model of the run (training.compile_step), so that Numba compiles
    its kernels before any clock starts; then the bar starts from zero. -> seconds it took."""
    seconds = 0.0
    for name, mcfg, prm, opt_state, start, main_model, steps in phases:
        batch = tasks.sample(args.task, np.random.default_rng((args.seed, start)), args.batch, args.settings, start)
        seconds += training.compile_step(lambda p, tok, tgt, m: models.loss_and_grads(name, p, tok, tgt, m, mcfg),
                                         prm, opt_state or optim.adamw_init(prm), batch["tokens"],
                                         batch["posterior"] if args.soft else batch["targets"], batch["mask"],
                                         args.weight_decay, models.decay_set(name, prm))
    if bar is not None:
        bar.bar_format = bar.training_format
        bar.reset(total=bar.total)
    return seconds


def load_for_resume(args, name, main, cfg, steps=None):
    """-> (params, cfg, opt_state, step) of that model of the run in --out, after checking it is the same
    run: every flag of the run's identity, and the model's size against the flags that set it."""
    steps = steps or args.steps
    path = os.path.join(args.out, runs.checkpoint_name(name, main))
    try:
        params, ckpt_cfg, meta, opt_state = load_checkpoint(path)
    except ValueError as e:
        fail(f"--resume: {e}")
    want = run_meta(args, name, meta.get("step", 0), steps)
    legacy_keys = getattr(tasks.task(args.task), "LEGACY_META", {})
    for row in flag_table().values():
        if not row.get("run") or (row.get("where") and args.task not in row["where"]):
            continue
        key = row["dest"]
        have = meta.get(key, meta.get(legacy_keys.get(key, key), row.get("legacy", "missing")))
        if key == "steps":
            have = meta.get("steps")
        if have == "any" or (key == "baseline_steps" and have == "missing"):
            continue
        if key == "threads" and have == "missing":
            continue
        if have != want[key]:
            fail(f"--resume: checkpoint {path!r} has {key}={have!r} but this run asks for {want[key]!r}")
    if meta.get("model", name) != name:
        fail(f"--resume: checkpoint {path!r} holds a {meta.get('model')!r}, not the {name!r} asked for")
    if args.stop_after is not None and args.stop_after <= meta.get("step", 0):
        fail(f"--stop-after {args.stop_after}: the checkpoint {path!r} is already at step {meta.get('step', 0)}; "
             f"give a later step, or leave --stop-after out to finish the run")
    if opt_state is None:
        fail(f"--resume: checkpoint {path!r} holds no optimiser state")
    flags = {row["field"]: row["flag"] for row in flag_table().values() if row.get("field")}
    different = [k for k in dataclasses.asdict(cfg) if k != "pos_limit" and getattr(ckpt_cfg, k) != getattr(cfg, k)]
    shown = [k for k in different if k in flags] or different        # the flags' fields (d_mlp follows --width)
    if different:
        fail(f"--resume: checkpoint {path!r} holds {', '.join(f'{flags.get(k, k)} {getattr(ckpt_cfg, k)}' for k in shown)}, "
             f"not the {', '.join(f'{flags.get(k, k)} {getattr(cfg, k)}' for k in shown)} asked for")
    if "step" not in meta:
        fail(f"--resume: checkpoint {path!r} does not say at which step it was saved")
    args.kept_rows[name] = kept_log_rows(os.path.join(args.out, runs.log_name(name, main)), meta["step"])
    args.prior_seconds[name] = float(meta.get("seconds", 0.0))
    return params, fit_positions(ckpt_cfg, tasks.sizes(args.task, args.settings)), opt_state, int(meta["step"])


def kept_log_rows(path, step):
    """The rows of a run's log up to the checkpoint's step, read before anything is written: the rows after
    it are dropped (a run killed mid-row leaves half a line there, which is repaired so). A log damaged at or
    before that step (a row that is not step,numbers; bytes that are not UTF-8), or that is not a regular
    file, is refused in one line and left as it is. A missing log starts afresh."""
    if not os.path.lexists(path):
        return []
    problem = runs.kind_problem(path, want_dir=False)
    if problem:
        fail(f"--resume: the log {path!r} is {problem}; move it aside to continue with a new log")
    with open(path, "rb") as f:
        lines = f.read().splitlines()
    if not lines or log_row(lines[0]) != LOG_HEADER:
        fail(f"--resume: the log {path!r} does not start with the header a run writes; move it aside to continue "
             f"with a new log")
    rows = []
    for number, line in enumerate(lines[1:], 2):
        row = log_row(line)
        if row is None:
            fail(f"--resume: the log {path!r} is damaged at line {number} (not a row this run writes), at or before "
                 f"the checkpoint's step {step}; move it aside to continue from step {step} with a new log")
        if row:
            rows.append(row)
        if row and int(row[0]) >= step:                 # the rest, past the checkpoint, is dropped unread
            break
    return [r for r in rows if int(r[0]) <= step]


def log_row(line):
    """A line of log.csv (bytes) -> its fields, [] for an empty line, None unless it is the header or a row
    of a step (digits) and numbers."""
    try:
        row = next(csv.reader([line.decode("utf-8")]), [])
        if row == LOG_HEADER or not row:
            return row
        [float(x) for x in row[1:]]
    except (UnicodeDecodeError, ValueError, csv.Error):
        return None
    return row if len(row) == len(LOG_HEADER) and row[0].isascii() and row[0].isdigit() else None


def eval_only(args):
    """Score a checkpoint on its run's own held-out set (its task, settings and seed from its meta) and
    redraw its figures."""
    try:
        params, cfg, meta, _ = load_checkpoint(args.eval_only)
    except ValueError as e:
        fail(f"--eval-only: {e}")
    if "task" not in meta:
        fail(f"--eval-only: checkpoint {args.eval_only!r} does not say which task it was trained on")
    if meta.get("replacement"):
        fail(f"--eval-only: checkpoint {args.eval_only!r} is of the retired --replacement variant "
             f"(separate vocabularies, keys with replacement); Paper I's variant is --task sawtooth")
    if meta["task"] not in tasks.TASKS:
        fail(f"--eval-only: checkpoint {args.eval_only!r} is of task {meta['task']!r}; allowed are {', '.join(tasks.TASKS)}")
    args.task, name = meta["task"], meta["model"]
    args.settings = tasks.settings_from(args.task, cfg, meta)
    args.seed = meta.get("seed", args.seed)
    if "eval_seqs" in meta and not args.eval_seqs_given:        # the run's own held-out set: its seed picks it
        args.eval_seqs = meta["eval_seqs"]
    sizes = tasks.sizes(args.task, args.settings)
    if (cfg.vocab_size, cfg.n_classes) != (sizes["vocab"], sizes["classes"]):
        fail(f"--eval-only: checkpoint {args.eval_only!r} has {cfg.vocab_size} tokens and {cfg.n_classes} classes, "
             f"not the {sizes['vocab']} and {sizes['classes']} of task {args.task}")
    cfg = fit_positions(cfg, sizes)
    check_memory(args, name, cfg, sizes, args.eval_seqs, f"--eval-seqs {args.eval_seqs}" if args.eval_seqs_given else
                 f"--eval-only {args.eval_only!r} (its run's held-out set, --eval-seqs {args.eval_seqs})")
    run_dir = os.path.dirname(os.path.abspath(args.eval_only))
    flag = "--figures" if args.figures else "--eval-only"       # the flag the user typed names the folder
    args.figures = args.figures or run_dir
    try:                                                        # the figures' folder, taken before evaluating
        runs.take(args.figures, flag if flag == "--figures" else f"--eval-only {args.eval_only!r}: its folder",
                  " ".join(["train.py", *args.argv]), instead="--figures")
    except runs.Refused as e:
        fail(str(e) + ("" if flag == "--figures" or "another --figures" in str(e) else "; give --figures DIR"))
    try:
        metrics, traces = evaluate_run(args, name, params, cfg)
        results = {name: dict(task=args.task, model=name, params=models.count_params(params), **metrics)}
        if os.path.basename(args.eval_only) == runs.checkpoint_name(name, True):   # the main model: its baselines too
            for family in models.FAMILIES:
                path = os.path.join(run_dir, runs.checkpoint_name(family, False))
                if family != name and os.path.exists(path):
                    try:
                        bparams, bcfg, _, _ = load_checkpoint(path)
                    except ValueError as e:
                        fail(f"--eval-only: the run's baseline {e}")
                    bmetrics, _ = evaluate_run(args, family, bparams, fit_positions(bcfg, sizes))
                    results[family] = dict(task=args.task, model=family, params=models.count_params(bparams),
                                           **bmetrics)
        print(summary_table(results, tasks.prior_gap_bits(args.task, args.settings), tasks.task(args.task)))
        paths = draw_figures(args, results, traces, args.figures, os.path.basename(run_dir))
    finally:
        runs.release(args.figures)
    print("figures: " + ", ".join(paths))
    return results[name]


if __name__ == "__main__":
    main()
