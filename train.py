"""Train a transformer on a Bayesian wind tunnel and measure it against the exact posterior, in bits.

    python train.py                         # bijection wind tunnel (format a), CPU-sized default (minutes)
    python train.py --task sawtooth         # Paper I's variant (format b): the per-sequence sawtooth
    python train.py --task hmm --preset paper
    python train.py --eval-only runs/bijection-transformer-default/checkpoint.npz

Writes runs/<name>/ (checkpoint.npz, metrics.json, log.csv, snapshots/) and figures/.
Every batch is drawn from its own generator default_rng((seed, step)), so a run resumed
from a checkpoint sees exactly the data an uninterrupted run would have seen.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see bayesattn.py: BLAS threads fight Numba's
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402

import bayesattn as ba  # noqa: E402
import windtunnels as wt  # noqa: E402

# ----------------------------------------------------------------------------
# defaults (the `default` preset of the bijection task); presets below override them

TASK = "bijection"      # which wind tunnel
V = 20                  # bijection: keys = values = V, L = V - 1 pairs
HMM_K = 20              # hmm: observations per training sequence
HMM_EVAL_K = (30, 50)   # hmm: lengths evaluated beyond the training length (length generalisation)
EVAL_SEQS = 2000        # held-out sequences for evaluation
EVAL_SEED = 1_000_003   # held-out data never overlaps the training stream (seeds (seed, step))
N_SNAPSHOTS = 24        # light parameter snapshots at log-spaced steps (frame-precision probe)

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
        # 2 layers, heads of 32 (>= the 20 hypotheses), fan-in init, and 1,000 steps of 5-key alphabets
        # first: without all three the lookup never forms within the budget (RESULTS.md, sawtooth)
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
WEIGHT_DECAY = 0.01
GRAD_CLIP = 1.0
BETAS = (0.9, 0.98)


TASKS = ("bijection", "sawtooth", "hmm", "sticky")
MODELS = ("transformer", "mlp", "prefix-mlp")   # mlp: the authors' (token + position); prefix-mlp: whole prefix


def checkpoint_name(model):
    return "checkpoint.npz" if model == "transformer" else f"{model}.npz"


def metrics_name(model):
    return "metrics.json" if model == "transformer" else f"metrics_{model}.json"


def fail(msg):
    """One clear line on stderr, exit code 2, no traceback."""
    print(f"train.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


# ----------------------------------------------------------------------------
# tasks: what the model sees, and the exact posterior at every supervised position

def eval_lengths(K):
    """HMM: the training length K and the longer lengths of HMM_EVAL_K."""
    return [K] + [k for k in HMM_EVAL_K if k > K]


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


def task_spec(task, V=V, K=HMM_K, soft=False, curriculum=None):
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


# ----------------------------------------------------------------------------
# evaluation in bits

def evaluate(predict, batch):
    """predict(tokens) -> (n, Tlen, K) probabilities. Metrics of the model against the exact posterior,
    over the positions the paper's entropy curve covers (every supervised position but a final query).

    entropy_mae_bits       the papers' metric: average H over sequences per position first,
                           then mean over positions of |H_model - H_bayes|
    entropy_mae_seq_bits   mean over sequences and positions of |H_model - H_bayes|
    kl_bits                mean KL(posterior || model) per position
    excess_ce_bits         cross-entropy of the sampled targets under the model minus under the posterior
    impossible_mass        mean model probability on answers the posterior rules out (p = 0): on the
                           bijection, values already seen (on the sawtooth, once a key repeats, all
                           values but its own). Not in bits: a probability. Each 1e-3 of it
                           raises the entropy by about 1e-3 * log2(#ruled out / 1e-3) bits.
    query                  sawtooth only: at the final query (posterior one-hot) the KL, which is the
                           cross-entropy -log2 q(answer), and the accuracy of the most probable value
    """
    q = predict(batch["tokens"])                                    # (n, Tlen, K)
    cols = np.flatnonzero(batch["mask"][0] > 0)                     # supervised positions (same in every row)
    assert np.all(batch["mask"][:, cols] > 0)
    query = np.flatnonzero(batch["query_mask"][0] > 0) if "query_mask" in batch else np.array([], int)
    cols = np.setdiff1d(cols, query)                                # the paper's curve: the values, not the query
    post, qc = batch["posterior"][:, cols], q[:, cols]              # (n, P, K)
    h_model, h_bayes = wt.entropy_bits(qc), wt.entropy_bits(post)   # (n, P)
    kl = wt.kl_bits(post, qc)                                       # (n, P)
    impossible = np.where(post == 0, qc, 0.0).sum(-1)               # (n, P) mass on ruled-out answers
    y = batch["targets"][:, cols][..., None]
    ce_model = -np.log2(np.maximum(np.take_along_axis(qc, y, -1)[..., 0], wt.TINY))
    ce_bayes = -np.log2(np.take_along_axis(post, y, -1)[..., 0])
    per_position = [dict(position=int(i + 1), H_model=float(h_model[:, i].mean()),
                         H_bayes=float(h_bayes[:, i].mean()), kl=float(kl[:, i].mean()),
                         impossible_mass=float(impossible[:, i].mean()))
                    for i in range(len(cols))]
    metrics = dict(
        entropy_mae_bits=float(np.abs(h_model.mean(0) - h_bayes.mean(0)).mean()),
        entropy_mae_seq_bits=float(np.abs(h_model - h_bayes).mean()),
        kl_bits=float(kl.mean()),
        excess_ce_bits=float(ce_model.mean() - ce_bayes.mean()),
        impossible_mass=float(impossible.mean()),
        per_position=per_position)
    if len(query):
        qq, answer = q[:, query[0]], batch["targets"][:, query[0]]  # (n, K), (n,)
        metrics["query"] = dict(kl_bits=float(wt.kl_bits(batch["posterior"][:, query[0]], qq).mean()),
                                accuracy=float((qq.argmax(-1) == answer).mean()))
    traces = dict(h_model=h_model[:8], h_bayes=h_bayes[:8])       # single sequences for the trace figure
    return metrics, traces


def eval_batch(args, K=None):
    """Held-out sequences: a generator seeded apart from every training batch."""
    K, n = K or args.K, args.eval_seqs
    spec = task_spec(args.task, V=args.V, K=K)
    return spec["batch"](np.random.default_rng((EVAL_SEED, args.seed, K)), n)


# ----------------------------------------------------------------------------
# training

def log_spaced_steps(steps, n, first=100):
    """n snapshot steps, log-spaced from `first` (the frame-precision probe starts near step 100; a run of
    fewer than 1,000 steps starts at a tenth of its length) to steps."""
    return sorted({int(round(s)) for s in np.geomspace(max(1, min(first, steps // 10)), steps, n)} | {steps})


def train(model, params, cfg, spec, args, run_dir, opt_state=None, start=0, log_name="log.csv"):
    """The training loop. model = (loss_and_grads, predict). Returns params, opt_state, step reached."""
    from tqdm import tqdm
    loss_and_grads = model[0]
    opt_state = opt_state or ba.adamw_init(params)
    snap_dir = os.path.join(run_dir, "snapshots")
    os.makedirs(snap_dir, exist_ok=True)
    snapshots = set(log_spaced_steps(args.steps, N_SNAPSHOTS))
    log_path = os.path.join(run_dir, log_name)
    rows = []
    if start and os.path.exists(log_path):       # keep the rows up to the checkpoint, drop any after it
        with open(log_path, newline="") as f:
            rows = [r for r in csv.reader(f)][1:]
        rows = [r for r in rows if r and int(r[0]) <= start]
    log_file = open(log_path, "w", newline="")
    log = csv.writer(log_file)
    log.writerow(["step", "loss_bits", "bayes_loss_bits", "lr", "grad_norm", "seconds"])
    log.writerows(rows)
    stop = min(args.steps, args.stop_after or args.steps)
    t0 = time.time() - (getattr(args, "prior_seconds", 0.0) if start else 0.0)  # wall time counts across resumes
    step = start
    # Ctrl-C only raises a flag: the current step finishes (parameters and optimiser state stay
    # consistent, so --resume is exact), then the loop saves a checkpoint and exits.
    # A second Ctrl-C interrupts at once.
    interrupted = []

    def on_sigint(signum, frame):
        if interrupted:
            raise KeyboardInterrupt
        interrupted.append(signum)
    previous_handler = signal.signal(signal.SIGINT, on_sigint)
    t_start = time.time()
    bar = tqdm(range(start, stop), initial=start, total=args.steps, desc=f"{args.task}/{args.model}",
               disable=args.quiet, dynamic_ncols=True, mininterval=1.0)
    try:
        for step in bar:
            batch = spec["batch"](np.random.default_rng((args.seed, step)), args.batch, step)
            with np.errstate(over="ignore", invalid="ignore"):        # the guard below reports it
                loss, grads = loss_and_grads(params, batch["tokens"], targets_of(batch, spec["soft"]), batch["mask"])
                norm = ba.clip_grad_norm(grads, GRAD_CLIP)
            if not (math.isfinite(loss) and math.isfinite(norm)):
                bar.close()
                ckpt = os.path.join(run_dir, checkpoint_name(args.model))
                kept = (f"the last good checkpoint stays in {ckpt}" if os.path.exists(ckpt)
                        else "no checkpoint had been written yet")
                fail(f"step {step + 1}: the loss ({loss}) or the gradient norm ({norm}) is not finite; "
                     f"training stopped, {kept} (try a smaller --lr)")
            lr = ba.lr_schedule(step, args.lr, args.warmup, args.steps, min_lr=args.lr * args.lr_floor)
            ba.adamw_step(params, grads, opt_state, lr, beta1=BETAS[0], beta2=BETAS[1],
                          weight_decay=args.weight_decay)
            loss_bits, floor = ba.bits(loss), bayes_loss_bits(batch, spec["soft"])
            log.writerow([step + 1, f"{loss_bits:.6f}", f"{floor:.6f}", f"{lr:.3e}", f"{norm:.4f}",
                          f"{time.time() - t0:.2f}"])
            if (step + 1) in snapshots and args.model == "transformer":
                ba.save_checkpoint(os.path.join(snap_dir, f"step_{step + 1:07d}.npz"), params, cfg,
                                   meta=run_meta(args, step + 1))
            if (step + 1) % 500 == 0:
                save_run_checkpoint(run_dir, params, cfg, args, step + 1, opt_state, time.time() - t0)
            if step % 10 == 0:
                log_file.flush()                         # so `tail runs/<name>/log.csv` follows the run
                bar.set_postfix_str(f"loss {loss_bits:.3f} bits | Bayes {floor:.3f} bits | "
                                    f"{(step + 1 - start) / max(time.time() - t_start, 1e-9):.1f} step/s")
            if interrupted:
                bar.close()
                print(f"\ninterrupted after step {step + 1}: checkpoint saved; continue with --resume",
                      file=sys.stderr)
                save_run_checkpoint(run_dir, params, cfg, args, step + 1, opt_state, time.time() - t0)
                sys.exit(130)
        step = stop
    finally:
        log_file.close()
        signal.signal(signal.SIGINT, previous_handler)
    bar.close()
    save_run_checkpoint(run_dir, params, cfg, args, step, opt_state, time.time() - t0)
    return params, opt_state, step, time.time() - t0


def run_meta(args, step, seconds=0.0):
    return dict(seconds=round(seconds, 2), task=args.task, model=args.model, step=step, steps=args.steps, seed=args.seed,
                batch=args.batch, lr=args.lr, warmup=args.warmup, lr_floor=args.lr_floor,
                weight_decay=args.weight_decay, soft=args.soft, curriculum=args.curriculum, preset=args.preset,
                threads=args.threads, V=args.V, K=args.K, pos=args.pos, init=args.init, dtype=args.dtype)


def save_run_checkpoint(run_dir, params, cfg, args, step, opt_state, seconds):
    ba.save_checkpoint(os.path.join(run_dir, checkpoint_name(args.model)),
                       params, cfg, run_meta(args, step, seconds), opt_state)


# ----------------------------------------------------------------------------
# models: the transformer, and the capacity-matched MLP baseline

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
    import mlp_baseline as mb
    if mcfg is None:
        # positions (or prefix slots) cover the longest evaluated sequence; those past training stay untrained
        mcfg = mb.match_width(spec["vocab"], spec["classes"], spec["eval_len"], args.layers, target_params,
                              dtype=args.dtype, inputs=inputs)
    params = params if params is not None else mb.mlp_init_params(mcfg, args.seed)
    model = (lambda p, tok, tgt, m: mb.mlp_loss_and_grads(p, tok, tgt, m, mcfg),
             lambda p, tok: mb.mlp_predict_proba(p, tok, mcfg))
    return model, params, mcfg


# ----------------------------------------------------------------------------
# figures

def plot_calibration(results, task, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    first = next(iter(results.values()))
    pos = [r["position"] for r in first["per_position"]]
    ax.plot(pos, [r["H_bayes"] for r in first["per_position"]], "k-", lw=3, alpha=0.35, label="exact Bayes")
    for name, m in results.items():
        ax.plot(pos, [r["H_model"] for r in m["per_position"]], "o-", ms=3,
                label=f"{name} (MAE {m['entropy_mae_bits']:.3g} bits)")
    ax.set_xlabel("observation t" if task == "hmm" else "key index i (pairs seen = i - 1)")
    ax.set_ylabel("predictive entropy (bits)")
    ax.set_title(f"{task}: model entropy against the exact posterior")
    ax.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_traces(traces, task, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(8, 5), sharex=True, sharey=True)
    for s, ax in enumerate(axes.ravel()):
        x = np.arange(1, traces["h_bayes"].shape[1] + 1)
        ax.plot(x, traces["h_bayes"][s], "k-", lw=3, alpha=0.35, label="this sequence's posterior")
        ax.plot(x, traces["h_model"][s], "o-", ms=3, label="model")
        ax.set_title(f"held-out sequence {s}", fontsize=9)
    axes[0, 0].legend(frameon=False, fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("observation t" if task == "hmm" else "key index i (pairs seen = i - 1)")
    for ax in axes[:, 0]:
        ax.set_ylabel("entropy (bits)")
    fig.suptitle(f"{task}: single sequences")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def length_curves(metrics):
    """HMM metrics -> {K: dict(per_position, kl_bits)}, what plot_length_generalization draws."""
    return {int(K): dict(per_position=v, kl_bits=metrics["length_generalization"][K])
            for K, v in metrics["length_generalization_curves"].items()}


def plot_length_generalization(curves, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for K, m in curves.items():
        ax.semilogy([r["position"] for r in m["per_position"]], [max(r["kl"], 1e-7) for r in m["per_position"]],
                    "o-", ms=3, label=f"K = {K} (mean {m['kl_bits']:.2g} bits)")
    ax.axvline(min(curves), color="gray", ls=":", label="training length")
    ax.set_xlabel("observation t")
    ax.set_ylabel("KL(posterior || model) (bits)")
    ax.set_title("HMM: length generalisation")
    ax.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------
# command line

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.error = fail
    p.add_argument("--task", default=TASK, help="wind tunnel: bijection (format a) | sawtooth (format b, "
                   "Paper I's variant) | hmm | sticky (Paper II)")
    p.add_argument("--model", default="transformer", help="transformer | mlp (the authors' MLP: one token and its "
                   "position) | prefix-mlp (an MLP that sees the whole prefix)")
    p.add_argument("--baseline", default="mlp", help="the MLP trained after the transformer: mlp | prefix-mlp")
    p.add_argument("--preset", default="default", help="quick | default | paper (sets the sizes below)")
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
    p.add_argument("--seed", type=int, default=0, help="seed of the initialisation and the data stream")
    p.add_argument("--dtype", default="float32", help="float32 | float64")
    p.add_argument("--pos", default="learned", help="positions: learned | sinusoidal")
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
    p.add_argument("--figures", default="figures", help="where figures are written")
    p.add_argument("--eval-only", metavar="CHECKPOINT", help="evaluate a checkpoint, no training")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--no-baseline", action="store_true", help="do not train the MLP baseline after the transformer")
    p.add_argument("--eval-seqs", type=int, default=EVAL_SEQS, help="held-out sequences for evaluation")
    p.add_argument("--compare-em", action="store_true", help="sticky: SGD against the EM-like schedule and "
                                                             "the true M-step over 5 seeds (figures/em_vs_sgd.png)")
    p.add_argument("--chain", help="sticky: exact (self-transition 0.3, the default) | authors (0.3498, as the "
                   "authors' script builds it)")
    p.add_argument("--deep", action="store_true", help="sticky: the authors' deep variant (4 pre-LN blocks, AdamW, "
                                                       "a held-out chain), 5 seeds (figures/deep_variant.json)")
    p.add_argument("--no-geometry", action="store_true", help="skip the geometry probes (manifold.py) after training")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
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
            ("--lr-floor", args.lr_floor is not None), ("--weight-decay", args.weight_decay is not None))
            if given]
        if ignored:
            fail(f"{', '.join(ignored)}: not used by --task sticky (allowed: --steps, --lr, --seed, --out, "
                 f"--figures, --compare-em, --deep, --chain, --threads)")
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
            parse_curriculum(args.curriculum, args.V)
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
    for key in ("steps", "batch", "width", "layers", "heads", "warmup", "eval_seqs"):
        value = getattr(args, key)
        if value is not None and (value < 1 if key != "warmup" else value < 0):
            fail(f"--{key.replace('_', '-')} {value}: must be a positive integer")
    if args.V < 2:
        fail(f"--V {args.V}: the bijection needs at least 2 keys")
    if args.K < 1:
        fail(f"--K {args.K}: the HMM needs at least 1 observation")
    if args.stop_after is not None and args.stop_after < 1:
        fail(f"--stop-after {args.stop_after}: must be a positive integer")
    if args.lr is not None and not args.lr > 0:
        fail(f"--lr {args.lr}: must be > 0")
    if args.pos not in ("learned", "sinusoidal"):
        fail(f"--pos {args.pos!r}: allowed are learned, sinusoidal")
    if args.dtype not in ("float32", "float64"):
        fail(f"--dtype {args.dtype!r}: allowed are float32, float64")
    if args.task != "sticky" and args.width % args.heads:
        fail(f"--heads {args.heads} does not divide --width {args.width}")
    if args.compare_em and args.task != "sticky":
        fail(f"--compare-em belongs to --task sticky, not --task {args.task}")
    args.out = args.out or os.path.join("runs", f"{args.task}-{args.model}-{args.preset}"
                                        if args.task != "sticky" else "runs/sticky-one-head")
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


def evaluate_run(args, predict, params, cfg_like):
    """Held-out metrics; for the HMM also at K = 30 and 50 (length generalisation)."""
    metrics, traces = evaluate(lambda tok: predict(params, tok), eval_batch(args))
    if args.task == "hmm":
        curves = {args.K: metrics}
        for K in eval_lengths(args.K)[1:]:
            curves[K], _ = evaluate(lambda tok: predict(params, tok), eval_batch(args, K=K))
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
    args = parse_args(argv)
    numba.set_num_threads(args.threads)
    if args.eval_only:
        return eval_only(args)
    for flag, folder in (("--out", args.out), ("--figures", args.figures)):   # fail now, not after training
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, ".write-test"), "w"):
                pass
            os.remove(os.path.join(folder, ".write-test"))
        except OSError as e:
            fail(f"{flag} {folder!r} cannot be written ({e.strerror})")
    if args.task == "sticky":
        import dynamics
        if args.compare_em:                          # SGD vs EM-like vs true M-step, 5 seeds (minutes)
            dynamics.compare_em(steps=args.steps or 1000, fig_dir=args.figures, chain=args.chain)
            return None
        if args.deep:                                # the authors' deep variant, 5 seeds (an hour)
            return dynamics.run_deep(args.chain, args.steps or 1000, args.figures)
        metrics = dynamics.run_sticky(steps=args.steps or 1000, seed=args.seed, lr=args.lr or 0.01,
                                      fig_dir=args.figures, out_dir=args.out, chain=args.chain)
        print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, (list, dict))}, indent=1))
        return metrics
    spec = task_spec(args.task, V=args.V, K=args.K, soft=args.soft, curriculum=args.curriculum)
    results = {}
    run_name = os.path.basename(os.path.normpath(args.out))    # figures are named after the run
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
    print(f"{args.task}: {n_params:,} transformer parameters, {args.steps} steps of batch {args.batch}, "
          f"{'soft posterior' if spec['soft'] else 'sampled'} targets, run dir {args.out}")
    for name, mdl, prm, c, opt_state, start in runs:
        model_args = argparse.Namespace(**{**vars(args), "model": name})
        prm, _, step, seconds = train(mdl, prm, c, spec, model_args, args.out, opt_state=opt_state,
                                      start=start, log_name="log.csv" if name == "transformer" else f"log_{name}.csv")
        if step < args.steps:
            print(f"stopped at step {step} of {args.steps} (--stop-after); continue with "
                  f"python train.py --resume --out {args.out} and the same flags, without --stop-after")
            return results
        metrics, traces = evaluate_run(args, mdl[1], prm, c)
        metrics = dict(task=args.task, model=name, params=ba.count_params(prm), steps=step,
                       seconds=round(seconds, 1), targets="soft" if spec["soft"] else "sampled",
                       prior_gap_bits=gap, config=c.to_dict(), **metrics)
        with open(os.path.join(args.out, metrics_name(name)), "w") as f:
            json.dump(metrics, f, indent=1)
        results[name] = metrics
        if name == "transformer":
            plot_traces(traces, args.task, os.path.join(args.figures, f"{run_name}_traces.png"))
            if args.task == "hmm":
                plot_length_generalization(length_curves(metrics),
                                           os.path.join(args.figures, f"{run_name}_length_generalization.png"))
    plot_calibration(results, args.task, os.path.join(args.figures, f"{run_name}_calibration.png"))
    print(summary_table(results, gap))
    if "transformer" in results and not args.no_geometry:
        import manifold                                  # the geometry probes, into runs/<name>/geometry.json
        manifold.analyze(os.path.join(args.out, "checkpoint.npz"), fig_dir=args.figures)
        print(f"geometry: {os.path.join(args.out, 'geometry.json')} and figures/geometry_*.png")
    for name, m in results.items():
        extra = f", length generalisation KL {m['length_generalization']}" if "length_generalization" in m else ""
        print(f"{name}: {m['seconds']} s of training{extra}")
    return results


def load_for_resume(args):
    """-> (params, cfg, opt_state, step) of the run in --out, after checking it is the same run."""
    path = os.path.join(args.out, checkpoint_name(args.model))
    try:
        params, cfg, meta, opt_state = ba.load_checkpoint(path)
    except ValueError as e:
        fail(f"--resume: {e}")
    want = run_meta(args, meta.get("step", 0))
    # threads too: the split products' partial sums depend on it, and a resume is bit-identical only at the same
    for key in ("task", "model", "seed", "batch", "steps", "lr", "warmup", "lr_floor", "weight_decay", "threads",
                "soft", "curriculum", "V", "K", "pos", "init", "dtype"):
        # runs older than --lr-floor used 0.1, older than --weight-decay 0.01; older than --threads: not checked
        have = meta.get(key, {"lr_floor": 0.1, "weight_decay": WEIGHT_DECAY, "threads": want["threads"],
                              "curriculum": "", "init": "gpt2"}.get(key))
        if have != want[key]:
            fail(f"--resume: checkpoint {path!r} has {key}={have!r} but this run asks for {want[key]!r}")
    if opt_state is None:
        fail(f"--resume: checkpoint {path!r} holds no optimiser state")
    if args.model == "transformer" and (cfg.d_model, cfg.n_layers, cfg.n_heads) != (args.width, args.layers, args.heads):
        fail(f"--resume: checkpoint {path!r} holds width {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads, "
             f"not the {args.width}/{args.layers}/{args.heads} asked for")
    args.prior_seconds = float(meta.get("seconds", 0.0))
    return params, cfg, opt_state, int(meta["step"])


def eval_only(args):
    try:
        params, cfg, meta, _ = ba.load_checkpoint(args.eval_only)
    except ValueError as e:
        fail(f"--eval-only: {e}")
    if "task" not in meta:
        fail(f"--eval-only: checkpoint {args.eval_only!r} does not say which task it was trained on")
    if meta.get("replacement"):
        fail(f"--eval-only: checkpoint {args.eval_only!r} is of the retired --replacement variant "
             f"(separate vocabularies, keys with replacement); Paper I's variant is --task sawtooth")
    for key in ("task", "V", "K"):
        if key in meta:
            setattr(args, key, meta[key])
    spec = task_spec(args.task, V=args.V, K=args.K)
    if (cfg.vocab_size, cfg.n_classes) != (spec["vocab"], spec["classes"]):
        fail(f"--eval-only: checkpoint {args.eval_only!r} has {cfg.vocab_size} tokens and {cfg.n_classes} classes, "
             f"not the {spec['vocab']} and {spec['classes']} of task {args.task}")
    name = "transformer" if isinstance(cfg, ba.Config) else "mlp" if cfg.inputs == "token" else "prefix-mlp"
    if name == "transformer":
        model, params, cfg = make_transformer(args, spec, params, cfg)
    else:
        model, params, cfg = make_mlp(args, spec, None, params, cfg)
    metrics, _ = evaluate_run(args, model[1], params, cfg)
    metrics = dict(task=args.task, model=name, params=ba.count_params(params), **metrics)
    print(summary_table({name: metrics}, prior_gap(args)))
    if "length_generalization" in metrics:
        if name == "transformer":                    # redraw the run's figure from this evaluation
            run_name = os.path.basename(os.path.dirname(os.path.abspath(args.eval_only)))
            os.makedirs(args.figures, exist_ok=True)
            path = os.path.join(args.figures, f"{run_name}_length_generalization.png")
            plot_length_generalization(length_curves(metrics), path)
            print(f"figure: {path}")
    return metrics


if __name__ == "__main__":
    main()
