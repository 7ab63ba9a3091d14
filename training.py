"""training: the wind tunnels as a training run sees them, the models, one training step, the loop.

A run is described by an argparse-style namespace `args` (train.py builds it and validates every
value once; nothing here checks a flag). Every batch is drawn from its own generator
default_rng((seed, step)), so a run resumed from a checkpoint sees exactly the data an
uninterrupted run would have seen; held-out data come from seeds no training run uses.
"""

import csv
import math
import os
import signal
import time

import numpy as np

import bayesattn as ba
import mlp_baseline as mb
import optim
import windtunnels as wt
from checkpoints import save_checkpoint

GRAD_CLIP = 1.0             # global gradient norm
BETAS = (0.9, 0.98)         # AdamW
N_SNAPSHOTS = 24            # light parameter snapshots at log-spaced steps (the frame-precision probe)
SAVE_EVERY = 500            # steps between checkpoints
HMM_EVAL_K = (30, 50)       # HMM lengths evaluated past the training length (length generalisation)
EVAL_SEED = 1_000_003       # held-out data never overlaps the training stream (seeds (seed, step))
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)   # finish the step, save, stop


class TrainingStopped(Exception):
    """The loss or the gradient turned non-finite; the message says at which step and what was kept."""


# ----------------------------------------------------------------------------
# the tasks: sizes, and a batch sampler with exact posteriors

def parse_curriculum(text, V):
    """"A:S,A2:S2,..." -> [(S, A), ...]: keys from A-key alphabets before step S, then A2 before S2, ...;
    after the last stage, the task itself (all V keys). "" or None -> []."""
    stages = []
    for part in (text or "").split(","):
        if not part.strip():
            continue
        try:
            A, S = (int(x) for x in part.split(":"))
        except ValueError:
            raise ValueError(f"--curriculum {text!r}: expected stages alphabet:until_step, e.g. 5:2500,10:4000")
        if not 1 <= A <= V or S < 1 or (stages and S <= stages[-1][0]):
            raise ValueError(f"--curriculum {text!r}: each alphabet must lie in 1..{V} and the steps must increase")
        stages.append((S, A))
    return stages


def curriculum_alphabet(stages, step):
    """The key alphabet at this step (None: all keys, the task itself)."""
    for until, A in stages:
        if step is not None and step < until:
            return A
    return None


def eval_lengths(K):
    """HMM: the training length K and the longer lengths of HMM_EVAL_K."""
    return [K] + [k for k in HMM_EVAL_K if k > K]


def task_spec(task, V=20, K=20, soft=False, curriculum=None):
    """-> dict(vocab, classes, max_len, eval_len, soft, batch(rng, n, step=None) -> wind-tunnel batch dict).
    The training loop passes step (the sawtooth's curriculum reads it); evaluation never does, and sees the task."""
    L = V - 1
    if task == "bijection":                       # format (a): separate vocabularies, keys without replacement
        return dict(vocab=2 * V, classes=V, max_len=2 * L, eval_len=2 * L, soft=soft,
                    batch=lambda rng, n, step=None: wt.bijection_batch(rng, n, V))
    if task == "sawtooth":                        # format (b): shared vocabulary, with replacement, a query
        stages = parse_curriculum(curriculum, V)
        return dict(vocab=V, classes=V, max_len=2 * L + 1, eval_len=2 * L + 1, soft=soft,
                    batch=lambda rng, n, step=None: wt.sawtooth_batch(
                        rng, n, V, alphabet=curriculum_alphabet(stages, step)))
    if task == "hmm":
        return dict(vocab=wt.HMM_VOCAB, classes=wt.HMM_S, max_len=wt.HMM_HEADER + K,
                    eval_len=wt.HMM_HEADER + max(eval_lengths(K)), soft=soft,
                    batch=lambda rng, n, step=None: wt.hmm_batch(rng, n, K))
    raise ValueError(f"unknown task {task!r}")


def targets_of(batch, soft):
    """Sampled labels (the honest default) or the exact posterior as a soft target."""
    return batch["posterior"] if soft else batch["targets"]


def bayes_loss_bits(batch, soft=False):
    """The loss floor of this batch, in bits: the cross-entropy of the sampled targets under the exact
    posterior, or with soft targets the posterior's own entropy (so loss - floor is then the KL)."""
    mask = batch["mask"] > 0
    if soft:
        return float(wt.entropy_bits(batch["posterior"][mask]).mean())
    p = np.take_along_axis(batch["posterior"], batch["targets"][..., None], -1)[..., 0]
    return float(-np.log2(p[mask]).mean())


def held_out(args, K=None):
    """Held-out sequences of the run's task: a generator seeded apart from every training batch."""
    K = K or args.K
    return task_spec(args.task, V=args.V, K=K)["batch"](np.random.default_rng((EVAL_SEED, args.seed, K)),
                                                          args.eval_seqs)


def step_memory_bytes(args, spec):
    """About how many bytes one training step of the transformer these flags describe holds at its peak:
    per layer the attention weights (B NH T^2) twice (alpha and the scores), about 14 activations of
    (B T C) and 4 of (B T M) in the forward cache and the backward's temporaries, and the parameters
    four times (weights, gradients, AdamW's m and v). An estimate to refuse what cannot fit, not a
    measurement."""
    B, T, C, L, NH = args.batch, spec["eval_len"], args.width, args.layers, args.heads
    M, itemsize = 4 * C, 8 if args.dtype == "float64" else 4
    per_layer = 2 * B * NH * T * T + 14 * B * T * C + 4 * B * T * M
    params = spec["vocab"] * C + spec["eval_len"] * C + L * (4 * C * C + 2 * C * M + 13 * C) + C * spec["classes"]
    return itemsize * (L * per_layer + 4 * params + 3 * B * T * spec["classes"])


def available_memory_bytes():
    """MemAvailable of /proc/meminfo (Linux), or the physical memory where that file is missing."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# ----------------------------------------------------------------------------
# the models: a transformer, or one of the two MLPs, as (loss_and_grads, predict)

def make_transformer(args, spec, params=None, cfg=None):
    if cfg is None:
        # learned positions cover the longest evaluated length; rows past training stay untrained
        cfg = ba.Config(vocab_size=spec["vocab"], n_classes=spec["classes"], max_len=spec["eval_len"],
                        d_model=args.width, n_layers=args.layers, n_heads=args.heads,
                        pos=args.pos, init=args.init, dtype=args.dtype)
    if cfg.pos == "learned" and not cfg.pos_limit and spec["eval_len"] > spec["max_len"]:
        # positions past the training length reuse its last row (bayesattn.position_rows): the HMM is
        # time-homogeneous, so "one more observation" beats an untrained row. Training never reaches
        # the limit, so this changes only evaluation at K > 20 (and older checkpoints get it here too).
        cfg.pos_limit = spec["max_len"]
    params = params if params is not None else ba.init_params(cfg, args.seed)
    model = (lambda p, tok, tgt, m: ba.loss_and_grads(p, tok, tgt, m, cfg),
             lambda p, tok: ba.predict_proba(p, tok, cfg))
    return model, params, cfg


def make_mlp(args, spec, target_params, params=None, mcfg=None, inputs="token"):
    """inputs "token": the authors' MLP (--model mlp); "prefix": the whole-prefix MLP (--model prefix-mlp)."""
    if mcfg is None:
        # positions (or prefix slots) cover the longest evaluated sequence; those past training stay untrained
        mcfg = mb.match_width(spec["vocab"], spec["classes"], spec["eval_len"], args.layers, target_params,
                              dtype=args.dtype, inputs=inputs)
    params = params if params is not None else mb.mlp_init_params(mcfg, args.seed)
    model = (lambda p, tok, tgt, m: mb.mlp_loss_and_grads(p, tok, tgt, m, mcfg),
             lambda p, tok: mb.mlp_predict_proba(p, tok, mcfg))
    return model, params, mcfg


# ----------------------------------------------------------------------------
# one training step: the loss and every gradient, global-norm clipping, one AdamW step

def train_step(loss_and_grads, params, opt_state, tokens, targets, mask, lr, weight_decay=0.0, on_grads=None):
    """In place on params and opt_state. -> (loss in nats, gradient norm before clipping). When either is
    not finite nothing is updated (the caller stops). on_grads(grads), if given, sees the gradients
    before clipping (dynamics.py logs their norms)."""
    with np.errstate(over="ignore", invalid="ignore"):
        loss, grads = loss_and_grads(params, tokens, targets, mask)
        if on_grads is not None:
            on_grads(grads)
        norm = optim.clip_grad_norm(grads, GRAD_CLIP)
    if math.isfinite(loss) and math.isfinite(norm):
        optim.adamw_step(params, grads, opt_state, lr, beta1=BETAS[0], beta2=BETAS[1], weight_decay=weight_decay)
    return loss, norm


def lr_at(args, step):
    """Warm-up, then cosine from args.lr to args.lr * args.lr_floor at args.steps."""
    return optim.lr_schedule(step, args.lr, args.warmup, args.steps, min_lr=args.lr * args.lr_floor)


# ----------------------------------------------------------------------------
# the loop

def checkpoint_name(model):
    return "checkpoint.npz" if model == "transformer" else f"{model}.npz"


def run_files(run_dir):
    """The files a run writes that are in run_dir: checkpoints, metrics, logs, snapshots/, geometry.json and
    the run's own figures (named after it). Nothing else there is ever touched."""
    if not os.path.isdir(run_dir):
        return []
    run = os.path.basename(os.path.normpath(run_dir))
    ours = lambda name: (name in ("checkpoint.npz", "geometry.json", "snapshots")
                         or (name.startswith(("metrics", "log")) and name.endswith((".json", ".csv")))
                         or name in ("mlp.npz", "prefix-mlp.npz")
                         or (name.startswith((f"{run}_", f"geometry_{run}_")) and name.endswith(".png")))
    return sorted(name for name in os.listdir(run_dir) if ours(name))


def remove_run(run_dir, names):
    """Delete those files of a run (--overwrite), snapshots/ with its contents."""
    for name in names:
        path = os.path.join(run_dir, name)
        if os.path.isdir(path):
            for snap in os.listdir(path):
                os.remove(os.path.join(path, snap))
            os.rmdir(path)
        else:
            os.remove(path)


def remove_stale_temporaries(run_dir):
    """The .tmp-* files an interrupted atomic write left (checkpoints._atomic_write), in run_dir and snapshots/."""
    for folder in (run_dir, os.path.join(run_dir, "snapshots")):
        if os.path.isdir(folder):
            for name in os.listdir(folder):
                if name.startswith(".tmp-"):
                    os.remove(os.path.join(folder, name))


def log_spaced_steps(steps, n, first=100):
    """n snapshot steps, log-spaced from `first` (the frame-precision probe starts near step 100; a run of
    fewer than 1,000 steps starts at a tenth of its length) to steps."""
    return sorted({int(round(s)) for s in np.geomspace(max(1, min(first, steps // 10)), steps, n)} | {steps})


def run_meta(args, step, seconds=0.0):
    return dict(seconds=round(seconds, 2), task=args.task, model=args.model, step=step, steps=args.steps, seed=args.seed,
                batch=args.batch, lr=args.lr, warmup=args.warmup, lr_floor=args.lr_floor,
                weight_decay=args.weight_decay, soft=args.soft, curriculum=args.curriculum, preset=args.preset,
                threads=args.threads, V=args.V, K=args.K, pos=args.pos, init=args.init, dtype=args.dtype,
                eval_seqs=args.eval_seqs)


def save_run_checkpoint(run_dir, params, cfg, args, step, opt_state, seconds):
    """The run's checkpoint at this step; TrainingStopped (and the previous checkpoint kept) if a weight is
    not finite or the file cannot be written."""
    save_params(os.path.join(run_dir, checkpoint_name(args.model)), params, cfg, run_meta(args, step, seconds),
                opt_state, step)


def save_params(path, params, cfg, meta, opt_state=None, step=None):
    bad = [name for name, p in params.items() if not np.isfinite(p).all()]
    if bad:
        raise TrainingStopped(f"step {step}: weights {', '.join(bad[:3])} are not finite; training stopped before "
                              f"saving them, {path} keeps the last good checkpoint (try a smaller --lr)")
    try:
        save_checkpoint(path, params, cfg, meta, opt_state)
    except OSError as e:
        raise TrainingStopped(f"step {step}: {path} cannot be written ({e.strerror}); training stopped, the "
                              f"previous file stays") from None


def train(model, params, cfg, spec, args, run_dir, opt_state=None, start=0, log_name="log.csv"):
    """The training loop. model = (loss_and_grads, predict).
    -> params, opt_state, step reached, seconds of training (summed over resumes), interrupted (bool).
    Ctrl-C, SIGTERM (a job scheduler) and SIGHUP (a closed terminal) only raise a flag: the current step
    finishes (parameters and optimiser state stay consistent, so a resume is exact), then the loop saves a
    checkpoint and returns. A second signal interrupts at once.
    Raises TrainingStopped when the loss or the gradient turns non-finite (nothing of that step is applied),
    or a checkpoint cannot be saved."""
    from tqdm import tqdm
    opt_state = opt_state or optim.adamw_init(params)
    snap_dir = os.path.join(run_dir, "snapshots")
    os.makedirs(snap_dir, exist_ok=True)
    snapshots = set(log_spaced_steps(args.steps, N_SNAPSHOTS))
    log_path = os.path.join(run_dir, log_name)
    rows = []
    if start and os.path.exists(log_path):       # keep the rows up to the checkpoint, drop any after it
        with open(log_path, newline="") as f:
            rows = [r for r in csv.reader(f)][1:]
        rows = [r for r in rows if r and int(r[0]) <= start]
    stop = min(args.steps, args.stop_after or args.steps)
    t0 = time.time() - (getattr(args, "prior_seconds", 0.0) if start else 0.0)  # wall time counts across resumes
    interrupted = []

    def on_sigint(signum, frame):
        if interrupted:
            raise KeyboardInterrupt
        interrupted.append(signum)
    previous_handlers = {sig: signal.signal(sig, on_sigint) for sig in STOP_SIGNALS}
    step = start
    with open(log_path, "w", newline="") as log_file:
        log = csv.writer(log_file)
        log.writerow(["step", "loss_bits", "bayes_loss_bits", "lr", "grad_norm", "seconds"])
        log.writerows(rows)
        bar = tqdm(range(start, stop), initial=start, total=args.steps, desc=f"{args.task}/{args.model}",
                   disable=args.quiet, dynamic_ncols=True, mininterval=1.0, unit="step")
        try:
            for step in bar:
                batch = spec["batch"](np.random.default_rng((args.seed, step)), args.batch, step)
                lr = lr_at(args, step)
                loss, norm = train_step(model[0], params, opt_state, batch["tokens"], targets_of(batch, spec["soft"]),
                                        batch["mask"], lr, args.weight_decay)
                if not (math.isfinite(loss) and math.isfinite(norm)):
                    ckpt = os.path.join(run_dir, checkpoint_name(args.model))
                    kept = (f"the last good checkpoint stays in {ckpt}" if os.path.exists(ckpt)
                            else "no checkpoint had been written yet")
                    raise TrainingStopped(f"step {step + 1}: the loss ({loss}) or the gradient norm ({norm}) is not "
                                          f"finite; training stopped, {kept} (try a smaller --lr)")
                loss_bits, floor = ba.bits(loss), bayes_loss_bits(batch, spec["soft"])
                log.writerow([step + 1, f"{loss_bits:.6f}", f"{floor:.6f}", f"{lr:.3e}", f"{norm:.4f}",
                              f"{time.time() - t0:.2f}"])
                if (step + 1) in snapshots and args.model == "transformer":
                    save_params(os.path.join(snap_dir, f"step_{step + 1:07d}.npz"), params, cfg,
                                run_meta(args, step + 1), step=step + 1)
                if (step + 1) % SAVE_EVERY == 0:
                    save_run_checkpoint(run_dir, params, cfg, args, step + 1, opt_state, time.time() - t0)
                if step % 10 == 0:
                    log_file.flush()                     # so `tail runs/<name>/log.csv` follows the run
                    bar.set_postfix_str(f"loss {loss_bits:.3f} bits | Bayes {floor:.3f} bits")
                if interrupted:
                    save_run_checkpoint(run_dir, params, cfg, args, step + 1, opt_state, time.time() - t0)
                    return params, opt_state, step + 1, time.time() - t0, True
            step = stop
        finally:
            bar.close()
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)
    save_run_checkpoint(run_dir, params, cfg, args, step, opt_state, time.time() - t0)
    return params, opt_state, step, time.time() - t0, False
