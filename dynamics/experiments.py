"""dynamics: Paper II's gradient dynamics on the sticky Markov chain (tunnels/sticky.py), the experiments.

The model and its optimisers are dynamics/onehead.py; every experiment trains through the project's one loop,
training.train, and runs from the one command line, `python -m dynamics.run [--compare-em |
--deep]`. Here: the steps of each arm with the two-timescale quantities logged, the exact Bayes
references, and the experiments of Paper II and past it:
    compare_em      SGD against the EM-like schedule (W_V stepped 10x faster) and a true M-step,
                    5 seeds, one long chain and many short ones; the two-timescale logs
    deep_variant    the authors' 4-layer transformer on the continuous inputs, a held-out chain
    transformer_timescales   routing against value gradients per layer of a bijection transformer
Losses are nats inside the code and bits in every report.
"""

import json
import math
import os
import time
import zipfile

import layers as ly  # first: it sets OPENBLAS_NUM_THREADS=1 before NumPy loads
import bayesattn as ba
import numba
import numpy as np
from scipy import stats

from tunnels import bijection
import models
import optim
from dynamics import plots_dynamics
from harness import runs
from tunnels import sticky
import training
from tunnels import windtunnels as wt
from harness.checkpoints import plain, save_arrays, write_json
from dynamics.onehead import (EVAL_SEED, N_CLASSES, D_X, D_K, D_V, INIT_STD, ROUTING, SEEDS, V_SCALE, VALUE, LN2,
                     em_like_step, error_signal, head_backward, head_forward, head_loss, init_head, m_step_update,
                     sgd_step)

SGD_LR = 0.01               # the authors' plain SGD (and the base of the EM-like schedule)
DEEP_LR = 3e-4              # the deep variant's AdamW peak
OUTPUTS = {"one-head": ("sticky_metrics.json", "sticky_head.npz", "sticky_progress.npz"),   # what each experiment
           "compare-em": ("dynamics.json", "curves.json", "em_vs_sgd.png", "two_timescales.png", "progress")}  # writes
FINAL = {"one-head": "sticky_metrics.json", "compare-em": "dynamics.json", "deep": "deep_variant.json"}  # a finished
# run has written it


# ----------------------------------------------------------------------------
# training with the dynamics logged

def finished(result, steps):
    """training.train's result, unless a signal stopped it: a run that keeps no progress of its own is not
    reported as if it had ended (training.Interrupted names the step)."""
    if result["interrupted"]:
        raise training.Interrupted(f"interrupted at step {result['step']} of {steps}; this run keeps no progress, so "
                                   f"nothing was written: run it again")
    return result


def _norm(grads, names):
    return float(math.sqrt(sum(float(np.vdot(grads[k], grads[k])) for k in names)))


def dynamics_snapshot(params, cache, u, pairs, alpha_prev=None, V_prev=None):
    """The quantities of the two-timescale story at one step, on the first sequence of the batch (in the
    training dtype). u (B, T, d_v) the error signal the E-step used; pairs (i, j), j <= i, sample the advantages."""
    alpha = cache["alpha"][0]                                    # (T, T)
    V = cache["x"][0] @ params["W_V"]                            # (T, d_v) the values the step saw
    u0 = u[0]                                                    # (T, d_v)
    b = u0 @ V.T                                                 # (T, T)  b_ij = u_i . v_j
    b_bar = (u0 * (alpha @ V)).sum(axis=1)                       # (T,)    b_bar_i = sum_j alpha_ij b_ij = u_i . o_i
    adv = b - b_bar[:, None]                                     # (T, T)  the advantage b_ij - b_bar_i
    sample = adv[pairs].astype(np.float64)                       # uniform over the causal pairs j <= i
    ent = -(alpha * np.log2(np.maximum(alpha, np.finfo(alpha.dtype).tiny))).sum(axis=1)   # (T,) bits
    T = len(alpha)
    snap = {
        "adv_quantiles": np.quantile(sample, [0.05, 0.25, 0.5, 0.75, 0.95]).tolist(),
        "adv_std": float(sample.std()),
        "adv_weighted_std": float(np.sqrt((alpha * adv * adv).sum(axis=1)).mean()),   # sqrt(sum_j alpha_ij adv_ij^2)
        "ds_abs": float((alpha * np.abs(adv)).sum(axis=1).mean()),                     # sum_j |ds_ij|, ds the E-step
        "attn_entropy_bits": float(ent.mean()),
        "attn_entropy_frac": float((ent[1:] / np.log2(np.arange(2, T + 1))).mean()),    # 1 = uniform over the past
    }
    if alpha_prev is not None:
        snap["frame_drift"] = float(0.5 * np.abs(alpha - alpha_prev).sum(axis=1).mean())  # mean TV distance per row
        snap["value_drift"] = float(np.linalg.norm(V - V_prev) / np.linalg.norm(V_prev))
    return snap, alpha.copy(), V


def prototype_cosine(V_before, V_after, dV):
    """Mean over positions j of cos(v_j's change, -dv_j), dv_j = sum_i alpha_ij u_i (the M-step signal)."""
    dv = V_after - V_before                                      # (T, d_v)
    num = (dv * -dV).sum(axis=1)
    den = np.linalg.norm(dv, axis=1) * np.linalg.norm(dV, axis=1)
    ok = den > 0
    return float((num[ok] / den[ok]).mean()) if ok.any() else float("nan")


def compile_head(params, x, targets, lr, methods=("sgd",)):
    """One thrown-away step of each method on a copy of params: Numba compiles the kernels at their first call,
    so that the timed runs (their seconds, the seconds to the threshold) count training only."""
    for method in methods:
        train_head({k: v.copy() for k, v in params.items()}, x, targets, 1, method, lr)


def train_head(params, x, targets, steps, method="sgd", lr=SGD_LR, log_every=None, seed=0, so_far=None, stop=None):
    """Train the head in place, full batch, through training.train. method: "sgd", "em" (EM-like) or "mstep".
    -> dict: loss (steps + 1,) nats, loss[k] before update k and loss[steps] after the last;
    seconds (steps + 1,) cumulative compute time before update k (logging excluded);
    routing_norm, value_norm (steps,) gradient norms of (W_Q, W_K) and (W_V, W_O) before each update;
    logs: every log_every steps, dynamics_snapshot plus the prototype cosine; step: the step reached.
    so_far: the dict of an earlier session's run, stopped at its "step" (SGD keeps no other state; no logs),
    to continue; stop: end at that step, or where a signal stops it ("interrupted": True), returning the run
    so far without the final loss. Without so_far or stop, a signal raises training.Interrupted."""
    if method not in ("sgd", "em", "mstep"):
        raise ValueError(f"method={method!r}: allowed are 'sgd', 'em', 'mstep'")
    if so_far and (log_every or method != "sgd"):
        raise ValueError("so_far: only a plain-SGD run without logs continues (the others keep more state)")
    x = np.ascontiguousarray(x, dtype=params["W_Q"].dtype)
    out = dict(method=method, lr=lr, loss=[], seconds=[0.0], routing_norm=[], value_norm=[], logs=[])
    if so_far:
        out.update({k: list(so_far[k]) for k in ("loss", "seconds", "routing_norm", "value_norm")})
    start, prior = (so_far or {}).get("step", 0), out["seconds"][-1]
    newton = []
    T = x.shape[1]
    rng = np.random.default_rng(seed)
    i = np.floor(T * np.sqrt(rng.random(20000))).astype(np.int64)   # P(i) ~ i + 1: uniform over the causal pairs
    pairs = (i, (rng.random(20000) * (i + 1)).astype(np.int64))      # then j uniform in 0..i
    previous = {"alpha": None, "V": None}

    def step(k):
        with np.errstate(over="ignore", invalid="ignore"):
            loss, dlogits, _, cache = head_loss(params, x, targets)
        if not math.isfinite(loss):
            return dict(loss=loss)
        grads = head_backward(dlogits, cache, params)
        u = error_signal(dlogits, params)
        W_V_before = params["W_V"].copy()
        if method == "mstep":
            _, losses, g_rout, u_e = m_step_update(params, cache, x, targets, lr)   # u_e: the error after it
            newton.append(len(losses) - 1)
        else:
            g_rout, u_e = {n: grads[n] for n in ROUTING}, u
            (em_like_step if method == "em" else sgd_step)(params, grads, lr)
        return dict(loss=loss, grads=grads, g_rout=g_rout, u=u, u_e=u_e, cache=cache, W_V_before=W_V_before)

    def on_step(k, r, compute):
        out["seconds"].append(prior + compute)
        out["loss"].append(r["loss"])
        out["routing_norm"].append(_norm(r["g_rout"], ROUTING))
        out["value_norm"].append(_norm(r["grads"], VALUE))
        if log_every and (k % log_every == 0 or k == steps - 1):
            # the advantages the routing step saw: u_e against the values it was computed with
            seen = params if method == "mstep" else params | {"W_V": r["W_V_before"]}
            snap, previous["alpha"], previous["V"] = dynamics_snapshot(seen, r["cache"], r["u_e"], pairs,
                                                                       previous["alpha"], previous["V"])
            dV = ba.value_update(r["u"][0], r["cache"]["alpha"][0])   # (T, d_v) the M-step signal sum_i alpha_ij u_i
            snap["prototype_cos"] = prototype_cosine(x[0] @ r["W_V_before"], x[0] @ params["W_V"], dV)
            snap["step"] = k
            out["logs"].append(snap)

    result = training.train(step, steps, start, stop, on_step=on_step)
    if so_far is None and stop is None:
        finished(result, steps)
    out.update(step=result["step"], interrupted=result["interrupted"])
    if result["step"] < steps:                                   # stopped: no final loss yet
        return out
    loss, _, _, _ = head_loss(params, x, targets)
    out["loss"].append(loss)
    if method == "mstep":
        out["newton_steps"] = newton
    return out


def steps_to_threshold(loss, threshold):
    """First k whose loss (before update k; k = steps means after the last) is below threshold; None if never."""
    below = np.flatnonzero(np.asarray(loss) < threshold)
    return int(below[0]) if below.size else None


# ----------------------------------------------------------------------------
# exact Bayes

def exact_bayes_reference(sigma=1.0, n=8, T=2000, seed=EVAL_SEED, chain="exact"):
    """Held-out chains from a separate seed and their exact Bayes predictor p(y_{t+1} | x_0..x_t)
    (sticky.posterior_batch, the forward filter). -> x, targets, posterior (n, T, K), references (bits)."""
    P, mu = sticky.task(chain)
    x, targets = sticky.data(seed, T=T, n=n, sigma=sigma, chain=chain)
    posterior = sticky.posterior_batch(P, mu, x, sigma)      # (n, T, K)
    bayes_ce = float(-np.log2(np.take_along_axis(posterior, targets[..., None], axis=-1)).mean())
    bayes_entropy = float(wt.entropy_bits(posterior).mean())    # the same in expectation, far less sampling noise
    bound = sticky.conditional_entropy_bits(P)                # H(Y_{t+1} | Y_t): sees y_t itself, a lower bound
    ref = dict(bayes_loss_bits=bayes_ce, bayes_entropy_bits=bayes_entropy, conditional_entropy_bound_bits=bound,
               bound_gap_bits=bayes_ce - bound, bound_gap_entropy_bits=bayes_entropy - bound,
               eval_seed=seed, eval_chains=n, eval_T=T, sigma=sigma, chain=chain)
    return x, targets, posterior, ref


def evaluate_vs_bayes(params, sigma=1.0, n=8, T=2000, seed=EVAL_SEED, reference=None):
    """The model's held-out cross-entropy against the exact Bayes predictor's and H(Y_{t+1} | Y_t), and the
    KL(posterior || model), all in bits per token. reference: exact_bayes_reference's output, to reuse."""
    x, targets, posterior, ref = reference or exact_bayes_reference(sigma, n, T, seed)
    q = np.concatenate([ly.softmax(head_forward(params, x[b:b + 1])[0].astype(np.float64))
                        for b in range(len(x))])                 # (n, T, K) model predictive, one chain at a time
    model_ce = float(-np.log2(np.maximum(np.take_along_axis(q, targets[..., None], axis=-1), wt.TINY)).mean())
    return dict(loss_bits=model_ce, excess_ce_bits=model_ce - ref["bayes_loss_bits"],
                kl_bits=float(wt.kl_bits(posterior, q).mean()), **ref)


def bayes_loss_bits(x, targets, sigma=1.0, chain="exact"):
    """Cross-entropy (bits) of the exact Bayes predictor on given chains x (n, T, d_x)."""
    P, mu = sticky.task(chain)
    post = sticky.posterior_batch(P, mu, x, sigma)
    return float(-np.log2(np.take_along_axis(post, targets[..., None], axis=-1)).mean())


def run_sticky(steps=1000, seed=0, lr=SGD_LR, T=2000, sigma=1.0, out_dir=None, chain="exact", stop=None,
               progress=None):
    """Train the one-head model with plain SGD on one chain (full batch) and compare it, on held-out
    chains, with the exact Bayes predictor. With out_dir, writes sticky_metrics.json and sticky_head.npz
    there, and keeps a run stopped at step `stop` (--stop-after) or by Ctrl-C, SIGTERM or SIGHUP in
    sticky_progress.npz (Stopped, or training.Interrupted); progress (one_head_progress's, read before
    anything is written) continues it. -> metrics dict."""
    identity = dict(steps=steps, seed=seed, lr=lr, T=T, sigma=sigma, chain=chain)
    x, targets = sticky.data(seed, T=T, sigma=sigma, chain=chain)
    params, so_far = progress or (init_head(seed, dtype="float32"), None)
    compile_head(params, x, targets, lr)
    run = train_head(params, x, targets, steps, "sgd", lr, so_far=so_far, stop=(stop or steps) if out_dir else None)
    path = os.path.join(out_dir or "", "sticky_progress.npz")
    if run["step"] < steps:                                      # stopped: keep it to continue from
        save_arrays(path, {"meta": np.array(json.dumps(dict(identity, step=run["step"]))), **{
            k: np.array(run[k], dtype=np.float64) for k in ("loss", "seconds", "routing_norm", "value_norm")},
            **{f"param:{k}": v for k, v in params.items()}})
        what = "interrupted" if run["interrupted"] else "stopped (--stop-after)"
        raise (training.Interrupted if run["interrupted"] else Stopped)(
            f"the one-head run {what} at step {run['step']} of {steps}: saved in {path}; continue with --resume and "
            f"the same flags")
    metrics = dict(task="sticky", model="one-head", steps=steps, seed=seed, lr=lr, T=T, sigma=sigma,
                   seconds=run["seconds"][-1],
                   train_loss_first_bits=run["loss"][0] / LN2, train_loss_final_bits=run["loss"][-1] / LN2,
                   train_bayes_loss_bits=bayes_loss_bits(x, targets, sigma, chain))
    metrics.update(evaluate_vs_bayes(params, reference=exact_bayes_reference(sigma, T=T, chain=chain)))
    metrics["train_loss_curve_bits"] = (np.asarray(run["loss"]) / LN2).tolist()
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        write_json(os.path.join(out_dir, "sticky_metrics.json"), metrics)
        save_arrays(os.path.join(out_dir, "sticky_head.npz"), params)
        if os.path.exists(path):                                 # finished: the metrics, not the progress
            os.remove(path)
    return metrics


def one_head_progress(out_dir, steps=1000, seed=0, lr=SGD_LR, T=2000, sigma=1.0, chain="exact"):
    """What an earlier session of the one-head run left in out_dir (sticky_progress.npz), read and judged
    before anything is written: (params, so_far) for run_sticky's progress. ValueError in one line for a
    file that is not a regular file, cannot be read, or is of another run (other steps, seed, lr, length,
    noise or chain)."""
    path = os.path.join(out_dir, "sticky_progress.npz")
    identity = dict(steps=steps, seed=seed, lr=lr, T=T, sigma=sigma, chain=chain)
    data, meta = _read_progress(path, identity, "the one-head run's")
    step, shapes = meta.get("step"), {k: v.shape for k, v in init_head(seed, dtype="float32").items()}
    try:
        params = {k: data[f"param:{k}"] for k in shapes}
        so_far = {k: data[k].tolist() for k in ("loss", "seconds", "routing_norm", "value_norm")}
        ok = (isinstance(step, int) and 0 < step < steps and len(so_far["loss"]) == len(so_far["routing_norm"]) == step
              and len(so_far["seconds"]) == step + 1 and all(np.isfinite(v).all() and v.shape == shapes[k]
                                                              and v.dtype == np.float32 for k, v in params.items())
              and len([k for k in data if k.startswith("param:")]) == len(shapes))
    except KeyError:
        ok = False
    if not ok:
        raise ValueError(f"{path!r} is damaged or not the one-head run's (its arrays or step)")
    return params, dict(so_far, step=step)


def _read_progress(path, identity, whose):
    """A file a run in progress keeps: an .npz (its arrays, and its meta as JSON in "meta") or a .json (its
    meta and data at once), whose identity must be this run's. -> data, meta."""
    problem = runs.kind_problem(path, want_dir=False) if os.path.lexists(path) else "missing"
    if problem:
        raise ValueError(f"{path!r} is {problem}")
    try:
        if path.endswith(".json"):
            with open(path, encoding="utf-8") as f:
                data = meta = json.load(f)
        else:
            with np.load(path, allow_pickle=False) as z:
                data = {k: z[k] for k in z.files}
            meta = json.loads(str(data["meta"]))
        have = {k: meta[k] for k in identity}
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError) as e:
        raise ValueError(f"{path!r} is damaged or not {whose} ({type(e).__name__})") from None
    _same_run(path, have, identity)
    return data, meta


def _same_run(path, have, identity):
    if have != identity:
        k = next(k for k in identity if have[k] != identity[k])
        raise ValueError(f"{path!r} has {k}={have[k]!r} but this run asks for {identity[k]!r}")


def sticky_table(m, path=None):
    """run_sticky's metrics as a table in bits: the model's loss on its training chain and on held-out chains,
    against the exact Bayes predictor's and the bound H(Y_t+1 | Y_t)."""
    lines = [f"sticky chain ({m['chain']}), one attention head, plain SGD at lr {m['lr']:g}, {m['steps']:,} full-batch "
             f"steps on one chain of T = {m['T']:,} (seed {m['seed']}, input noise sigma {m['sigma']:g}): "
             f"{m['seconds']:.1f} s of training",
             f"{'':34}{'training chain':>16}{'held-out':>12}",
             f"{'the model at initialisation':34}{m['train_loss_first_bits']:>16.4f}",
             f"{'the model, trained':34}{m['train_loss_final_bits']:>16.4f}{m['loss_bits']:>12.4f}",
             f"{'exact Bayes (forward filter)':34}{m['train_bayes_loss_bits']:>16.4f}{m['bayes_loss_bits']:>12.4f}",
             f"{'bound H(Y_t+1 | Y_t)':34}{'':>16}{m['conditional_entropy_bound_bits']:>12.4f}",
             f"{'KL(Bayes || model)':34}{'':>16}{m['kl_bits']:>12.4f}",
             f"(cross-entropy in bits per token; held-out: {m['eval_chains']} chains of T = {m['eval_T']:,})"]
    return "\n".join(lines + ([f"wrote {path}"] if path else []))


# ----------------------------------------------------------------------------
# the 2-4 layer bijection transformer: routing against value gradients per layer

def transformer_timescales(steps=500, seed=0, n_layers=3, d_model=64, n_heads=4, batch=64, lr=1e-3,
                           V=20, probe_every=25, warmup=50, probe_size=128, threads=1):
    """Train a small bijection transformer (bayesattn, AdamW) and log, per layer and step, the gradient
    norm of the routing weights (wq, wk) against the value/output weights (wv, wo); on a fixed probe
    batch every probe_every steps, the attention entropy, frame drift (mean TV distance of attention
    rows since the last probe) and value drift (relative change of the per-head values). -> dict.
    threads: Numba threads while it runs (1 by default: on a busy 2-core machine a parallel kernel
    waits on its slowest thread and ran 2-3x slower than a serial one)."""
    prev_threads = numba.get_num_threads()
    numba.set_num_threads(threads)                               # bayesattn's kernels are parallel; see the docstring
    try:
        return _transformer_timescales(steps, seed, n_layers, d_model, n_heads, batch, lr, V, probe_every,
                                       warmup, probe_size)
    finally:
        numba.set_num_threads(prev_threads)


def _transformer_timescales(steps, seed, n_layers, d_model, n_heads, batch, lr, V, probe_every, warmup, probe_size):
    cfg = ba.Config(vocab_size=2 * V, n_classes=V, max_len=2 * (V - 1), d_model=d_model, n_layers=n_layers,
                    n_heads=n_heads)
    params = ba.init_params(cfg, seed)
    opt = optim.adamw_init(params)
    model = lambda p, tok, tgt, m: models.loss_and_grads("transformer", p, tok, tgt, m, cfg)
    rng = np.random.default_rng(seed)
    probe = bijection.batch(np.random.default_rng(seed + 1), probe_size, V)
    routing = np.zeros((steps, n_layers))
    value = np.zeros((steps, n_layers))
    loss_curve, probes, prev = [], [], [None]

    def step(i):
        data = bijection.batch(rng, batch, V)

        def log_norms(grads):                                    # before clipping
            for l in range(n_layers):
                pre = f"blocks.{l}.attn."
                routing[i, l] = _norm(grads, (pre + "wq", pre + "wk"))
                value[i, l] = _norm(grads, (pre + "wv", pre + "wo"))
        loss, norm = training.train_step(model, params, opt, data["tokens"], data["targets"], data["mask"],
                                         optim.lr_schedule(i, lr, warmup, steps), 0.01, on_grads=log_norms)
        return dict(loss=loss, grad_norm=norm)

    def on_step(i, r, compute):
        loss_curve.append(r["loss"])
        if i % probe_every == 0 or i == steps - 1:
            _, cache = ba.forward(params, probe["tokens"], cfg)
            cur = [(lc["alpha"].astype(np.float64), lc["v"].astype(np.float64)) for lc in cache["layers"]]
            snap = {"step": i, "attn_entropy_bits": [], "frame_drift": [], "value_drift": []}
            for l, (alpha, v) in enumerate(cur):
                with np.errstate(divide="ignore", invalid="ignore"):
                    ent = -np.where(alpha > 0, alpha * np.log2(alpha), 0.0).sum(-1)   # (B, NH, T)
                snap["attn_entropy_bits"].append(float(ent.mean()))
                if prev[0] is not None:
                    snap["frame_drift"].append(float(0.5 * np.abs(alpha - prev[0][l][0]).sum(-1).mean()))
                    snap["value_drift"].append(float(np.linalg.norm(v - prev[0][l][1]) / np.linalg.norm(prev[0][l][1])))
            probes.append(snap)
            prev[0] = cur

    out = finished(training.train(step, steps, on_step=on_step), steps)
    proba = models.predict_proba("transformer", params, probe["tokens"], cfg)   # (B, T, V)
    m = probe["mask"] > 0
    post, tgt = probe["posterior"][m], probe["targets"][m]
    q = proba[m]
    return dict(config=cfg.to_dict(), steps=steps, seed=seed, batch=batch, lr=lr, seconds=out["compute_seconds"],
                loss_bits=(np.asarray(loss_curve) / LN2).tolist(),
                routing_norm=routing.tolist(), value_norm=value.tolist(), probes=probes,
                probe_loss_bits=float(-np.log2(q[np.arange(len(tgt)), tgt]).mean()),
                probe_bayes_loss_bits=float(-np.log2(post[np.arange(len(tgt)), tgt]).mean()),
                probe_kl_bits=float(wt.kl_bits(post, q).mean()))


# ----------------------------------------------------------------------------
# the authors' deep variant: a 4-layer transformer on the continuous inputs, one chain to train, another
# to test, AdamW; no EM arm (the value/routing split of one head has no counterpart here)

DEEP = dict(d_model=64, n_layers=4, n_heads=4, d_mlp=256)   # input projection 20 -> 64, 4 pre-LN blocks


def deep_init(seed, T, dtype="float32", **sizes):
    """-> cfg, params: bayesattn's blocks (no token or position embedding: the authors' deep model has no
    positional encoding) behind a linear input projection in.w (d_x, C), in.b (C,). sizes override DEEP."""
    cfg = ba.Config(vocab_size=1, n_classes=N_CLASSES, max_len=T, init="fan-in", dtype=dtype, **{**DEEP, **sizes})
    params = ba.init_params(cfg, seed)
    del params["wte"], params["wpe"]
    rng = np.random.default_rng((seed, 1))
    params["in.w"] = rng.normal(0, 1 / math.sqrt(D_X), (D_X, cfg.d_model)).astype(dtype)
    params["in.b"] = np.zeros(cfg.d_model, dtype=dtype)
    return cfg, params


def deep_forward(params, x, cfg):
    """x (B, T, d_x) -> logits (B, T, K), cache: h = x W_in + b_in, then the blocks."""
    h, inputs = ly.linear_forward(x.astype(cfg.dtype), params["in.w"], params["in.b"])   # (B, T, C)
    logits, cache = ba.forward_embedded(params, h, cfg)
    cache["inputs"] = inputs
    return logits, cache


def deep_loss_and_grads(params, x, targets, cfg):
    """Mean cross-entropy (nats) of the targets (B, T) and the gradient of every parameter."""
    logits, cache = deep_forward(params, x, cfg)
    loss, dlogits = ly.cross_entropy(logits, targets, np.ones(targets.shape))
    g, dh = ba.backward_embedded(dlogits, cache, params, cfg)
    _, g["in.w"], g["in.b"] = ly.linear_backward(dh, cache["inputs"])             # forward: h = x W_in + b_in
    return loss, g


def deep_variant(seeds=SEEDS, steps=1000, lr=DEEP_LR, T=2000, chain="exact", threads=None, out_dir=None,
                 stop=None, progress=None):
    """Train on one chain of each seed (full batch), test on a fresh chain (seed + 10000), as the authors.
    training.train_step (AdamW, weight decay 0.01, clipping at 1), cosine from lr to 0; no dropout (the
    authors use 0.1).
    With out_dir the run keeps its progress there, seed by seed: a finished seed's row (deep_seed<seed>.json),
    and the seed in progress as a checkpoint (deep_seed<seed>.npz) when it stops at step `stop` (--stop-after)
    or on Ctrl-C, SIGTERM or SIGHUP (training.Interrupted then, or Stopped at `stop`); progress
    (deep_progress's, read before anything is written) continues from them.
    -> dict with per-seed held-out cross-entropy, exact Bayes on the same chain, the bound, KL, in bits."""
    prev = numba.get_num_threads()
    numba.set_num_threads(threads or prev)
    identity = dict(steps=steps, lr=lr, T=T, chain=chain)
    progress = progress or {"rows": {}, "states": {}}
    try:
        P, mu = sticky.task(chain)
        rows = []
        for seed in seeds:
            if seed in progress["rows"]:                          # finished in an earlier session
                rows.append(progress["rows"][seed])
                continue
            t0 = time.perf_counter()
            x, y = sticky.data(seed, T=T, chain=chain)
            x_test, y_test = sticky.data(seed + 10000, T=T, chain=chain)
            cfg, params = deep_init(seed, T)
            opt = optim.adamw_init(params)
            start, losses, prior = 0, [], 0.0
            if seed in progress["states"]:                        # stopped in an earlier session: continue
                params, opt, losses, start, prior = progress["states"][seed]
            model = lambda p, xx, yy, m: deep_loss_and_grads(p, xx, yy, cfg)

            def step(i):
                loss, norm = training.train_step(model, params, opt, x, y, None, optim.lr_schedule(i, lr, 0, steps),
                                                 0.01)
                return dict(loss=loss, grad_norm=norm)

            def keep(i):                                          # the seed in progress, to continue from
                if out_dir:
                    save_arrays(os.path.join(out_dir, f"deep_seed{seed}.npz"), {
                        "meta": np.array(json.dumps(dict(identity, seed=seed, step=i,
                                                         seconds=prior + time.perf_counter() - t0))),
                        "losses": np.array(losses, dtype=np.float64), "adam_t": np.array(opt["t"]),
                        **{f"param:{k}": v for k, v in params.items()},
                        **{f"adam_m:{k}": v for k, v in opt["m"].items()},
                        **{f"adam_v:{k}": v for k, v in opt["v"].items()}})
            try:
                result = training.train(step, steps, start, stop, on_interrupt=keep if out_dir else None,
                                        on_step=lambda i, r, c: losses.append(r["loss"] / LN2))
            except training.TrainingStopped as e:
                raise training.TrainingStopped(f"deep variant, seed {seed}: {e}") from None
            if out_dir and result["step"] < steps:
                keep(result["step"])
                what = "interrupted" if result["interrupted"] else "stopped (--stop-after)"
                raise (training.Interrupted if result["interrupted"] else Stopped)(
                    f"deep variant {what} at step {result['step']} of {steps} of seed {seed}: saved in "
                    f"{os.path.join(out_dir, f'deep_seed{seed}.npz')}; continue with --resume and the same flags")
            if not out_dir:
                finished(result, steps)
            t0 -= prior
            q = ly.softmax(deep_forward(params, x_test, cfg)[0].astype(np.float64))    # (1, T, K)
            post = sticky.posterior_batch(P, mu, x_test, 1.0)                          # (1, T, K)
            ce = lambda p: float(-np.log2(np.maximum(np.take_along_axis(p, y_test[..., None], -1), wt.TINY)).mean())
            rows.append(dict(seed=seed, train_loss_final_bits=losses[-1], test_loss_bits=ce(q),
                             test_bayes_loss_bits=ce(post), test_kl_bits=float(wt.kl_bits(post, q).mean()),
                             seconds=time.perf_counter() - t0, train_loss_bits=losses))
            if out_dir:                                           # this seed is done: its row, not its state
                write_json(os.path.join(out_dir, f"deep_seed{seed}.json"), dict(identity, **rows[-1]))
                if os.path.exists(os.path.join(out_dir, f"deep_seed{seed}.npz")):
                    os.remove(os.path.join(out_dir, f"deep_seed{seed}.npz"))
                if result["interrupted"]:                         # a signal at the seed's last step
                    raise training.Interrupted(f"deep variant interrupted after seed {seed}, which is saved; "
                                               f"continue with --resume and the same flags")
            print(f"  deep seed {seed}: train {losses[0]:.4f} -> {losses[-1]:.4f} bits, held-out {ce(q):.4f} "
                  f"(exact Bayes {ce(post):.4f}, KL {rows[-1]['test_kl_bits']:.4f}), {rows[-1]['seconds']:.0f} s",
                  flush=True)
    finally:
        numba.set_num_threads(prev)
    column = lambda key: np.array([r[key] for r in rows])
    return {"config": dict(DEEP, d_x=D_X, classes=N_CLASSES, steps=steps, lr=lr, T=T, chain=chain, seeds=list(seeds),
                           optimiser="AdamW, weight decay 0.01, cosine to 0, clip 1.0, no dropout",
                           bound_bits=sticky.conditional_entropy_bits(P)),
            "per_seed": rows,
            **{f"{key}_mean": float(column(key).mean()) for key in
               ("train_loss_final_bits", "test_loss_bits", "test_bayes_loss_bits", "test_kl_bits")},
            "test_loss_std_bits": float(column("test_loss_bits").std())}


# ----------------------------------------------------------------------------
# the comparison

def _paired(a, b):
    """Paired t-test and Wilcoxon signed-rank test of a against b (per-seed numbers)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    out = {"mean_diff": float((a - b).mean())}
    for name, test in (("ttest_rel", stats.ttest_rel), ("wilcoxon", stats.wilcoxon)):
        try:
            r = test(a, b)
            out[name] = {"statistic": float(r.statistic), "p": float(r.pvalue)}
        except ValueError as e:                                  # e.g. all differences zero
            out[name] = {"error": str(e)}
    return out


def compare_setting(name, seeds, make_data, steps, mstep_steps, reference, log_every=None, lr=SGD_LR, units=None):
    """SGD, EM-like and M-step arms from the same initialisation for each seed, full batch on make_data(seed).
    Threshold = mean over seeds of SGD's final training loss (nats, as the authors); per arm and seed the
    first step below it, the compute seconds to get there, and the held-out loss against exact Bayes.
    units: compare_em's progress (kept): each arm of each seed is one of its runs."""
    arms = {"sgd": steps, "em": steps, "mstep": mstep_steps}
    runs = {m: [] for m in arms}
    train_bayes = []
    for seed in seeds:
        x, targets = make_data(seed)
        train_bayes.append(bayes_loss_bits(x, targets, chain=reference[3]["chain"]))
        for method, n in arms.items():
            def arm():
                params = init_head(seed, dtype="float32")           # the same start for every arm
                run = train_head(params, x, targets, n, method, lr=lr, log_every=log_every, seed=seed)
                return dict(run, seed=seed, params={k: v.tolist() for k, v in params.items()},
                            heldout=evaluate_vs_bayes(params, reference=reference))
            run = kept(units, f"{name}-seed{seed}-{method}", arm)
            runs[method].append(run)
            print(f"  {name} seed {seed} {method:5s}: train {run['loss'][0] / LN2:.4f} -> {run['loss'][-1] / LN2:.4f}"
                  f" bits, held-out {run['heldout']['loss_bits']:.4f} bits, {run['seconds'][-1]:.1f} s", flush=True)
    threshold = float(np.mean([r["loss"][-1] for r in runs["sgd"]]))
    summary = {"setting": name, "threshold_nats": threshold, "threshold_bits": threshold / LN2,
               "train_bayes_loss_bits": train_bayes, "heldout_reference": reference[3], "per_seed": []}
    for k, seed in enumerate(seeds):
        row = {"seed": seed}
        for method, rs in runs.items():
            r = rs[k]
            hit = steps_to_threshold(r["loss"], threshold)
            row[method] = dict(final_loss_nats=r["loss"][-1], final_loss_bits=r["loss"][-1] / LN2,
                               steps_to_threshold=hit if hit is not None else arms[method], reached=hit is not None,
                               seconds_to_threshold=r["seconds"][hit if hit is not None else -1],
                               seconds_total=r["seconds"][-1], seconds_per_step=float(np.median(np.diff(r["seconds"]))),
                               heldout_loss_bits=r["heldout"]["loss_bits"], heldout_kl_bits=r["heldout"]["kl_bits"])
        summary["per_seed"].append(row)
    column = lambda method, key: np.array([row[method][key] for row in summary["per_seed"]], float)
    for method in arms:
        s = summary[method] = {"steps_run": arms[method], "reached": int(column(method, "reached").sum())}
        for key in ("steps_to_threshold", "seconds_to_threshold", "final_loss_bits", "heldout_loss_bits",
                    "heldout_kl_bits"):
            s[key + "_mean"], s[key + "_std"] = float(column(method, key).mean()), float(column(method, key).std())
        s["seconds_per_step_median"] = float(np.median(column(method, "seconds_per_step")))
    for method in ("em", "mstep"):                                # steps not reached count as the steps run
        s = summary[method]
        s["speedup_steps"] = arms["sgd"] / max(s["steps_to_threshold_mean"], 1e-12)
        s["speedup_seconds"] = summary["sgd"]["seconds_to_threshold_mean"] / max(s["seconds_to_threshold_mean"], 1e-12)
        s["paired_final_loss_vs_sgd"] = _paired(column(method, "final_loss_nats"), column("sgd", "final_loss_nats"))
        s["paired_steps_vs_sgd"] = _paired(column(method, "steps_to_threshold"), column("sgd", "steps_to_threshold"))
        s["paired_heldout_loss_vs_sgd"] = _paired(column(method, "heldout_loss_bits"), column("sgd", "heldout_loss_bits"))
    return summary, runs


def compare_em(seeds=SEEDS, steps=1000, out_dir=None, quick=False, mstep_steps=None,
               transformer_steps=None, chain="exact", lr=SGD_LR, stop=None, progress=None):
    """Paper II's EM-like schedule against SGD, and a true M-step, on the sticky chain: one T = 2000 chain
    per seed (the authors' setting) and 32 chains of T = 64 (a second setting); the two-timescale logs;
    exact-Bayes references; the bijection transformer's per-layer gradient norms. Writes em_vs_sgd.png,
    two_timescales.png, dynamics.json and curves.json to out_dir (default runs/dynamics[-quick][-authors-chain]).
    -> the JSON dict.
    The M-step arm runs min(steps, 300) steps unless mstep_steps says otherwise (it costs ~2x a step).
    Its runs (compare_em_runs: each arm of each seed in both settings, then three more) are kept one by one
    in out_dir/progress/ as they finish; it stops before run number stop + 1 (--stop-after: Stopped) and, on
    Ctrl-C, SIGTERM or SIGHUP, in the run in progress (training.Interrupted; that run is not kept);
    progress (compare_em_progress's, read before anything is written) holds the runs an earlier session
    finished, which are read, not trained again."""
    t_start = time.perf_counter()
    seeds = tuple(seeds)
    out_dir = out_dir or default_out_dir(chain, quick)
    identity = compare_em_identity(seeds, steps, quick, mstep_steps, transformer_steps, chain, lr)
    units = dict(dir=os.path.join(out_dir, "progress"), identity=identity, stop=stop,
                 done={name: p["result"] for name, p in (progress or {}).items()},
                 earlier={name: p["seconds"] for name, p in (progress or {}).items()},
                 total=len(compare_em_runs(seeds, quick)))
    if quick:
        seeds, steps, T, short, log_every = seeds[:2], 20, 64, (4, 16), 5
        transformer_kw = dict(steps=transformer_steps or 6, n_layers=2, d_model=32, V=6, batch=8,
                              probe_every=2, warmup=2, probe_size=8)
        eval_long, eval_short, long_horizon = dict(n=1, T=64), dict(n=4, T=16), 20
    else:
        T, short, log_every = 2000, (32, 64), 50
        transformer_kw = dict(steps=transformer_steps or 500)
        eval_long, eval_short, long_horizon = dict(n=4, T=2000), dict(n=128, T=64), 1000
    mstep_steps = mstep_steps or min(steps, 300)
    bound = sticky.conditional_entropy_bits(sticky.task(chain)[0])
    out = {"config": dict(seeds=seeds, steps=steps, mstep_steps=mstep_steps, lr=lr, v_scale=V_SCALE, T=T,
                          short_batch=short, sigma=1.0, d_x=D_X, d_k=D_K, d_v=D_V, classes=N_CLASSES,
                          init_std=INIT_STD, mu_seed=sticky.MU_SEED, eval_seed=EVAL_SEED, eval_long=eval_long,
                          eval_short=eval_short, log_every=log_every, quick=quick,
                          precision="float32 training; float64 M-step solve and evaluation",
                          chain=chain, self_transition=float(sticky.task(chain)[0][0, 0]),
                          conditional_entropy_bound_bits=bound)}

    compile_head(init_head(seeds[0], dtype="float32"), *sticky.data(seeds[0], T=short[1], chain=chain), lr,
                 methods=("sgd", "em", "mstep"))            # before any arm's clock (seconds to the threshold)
    print(f"long chain: T = {T}, full batch, seeds {seeds}", flush=True)
    ref_long = exact_bayes_reference(1.0, **eval_long, chain=chain)
    out["long_chain"], long_runs = compare_setting("long_chain", seeds, lambda s: sticky.data(s, T=T, chain=chain),
                                                   steps, mstep_steps, ref_long, log_every, lr, units)
    print(f"short sequences: {short[0]} chains of T = {short[1]}, full batch", flush=True)
    ref_short = exact_bayes_reference(1.0, **eval_short, chain=chain)
    out["short_sequences"], short_runs = compare_setting(
        "short_sequences", seeds, lambda s: sticky.data(s, T=short[1], n=short[0], chain=chain), steps, mstep_steps,
        ref_short, lr=lr, units=units)

    # exact Bayes: the references at three noise levels, and plain SGD trained and judged at sigma = 3
    out["exact_bayes_reference"] = {str(s): exact_bayes_reference(s, n=4 * eval_long["n"], T=eval_long["T"],
                                                                  chain=chain)[3] for s in (1.0, 2.0, 3.0)}
    print("SGD at sigma = 3 against exact Bayes", flush=True)
    out["sigma3_sgd"] = s3 = kept(units, "sigma3_sgd", lambda: run_sticky(steps=steps, seed=seeds[0], lr=lr, T=T,
                                                                         sigma=3.0, chain=chain))
    print(f"  held-out {s3['loss_bits']:.3f} bits against exact Bayes's {s3['bayes_loss_bits']:.3f} "
          f"(KL {s3['kl_bits']:.3g} bits)", flush=True)

    # two timescales: the arms' logs, a longer-horizon SGD run (lr 0.3) where attention does concentrate,
    # and the bijection transformer
    out["two_timescales_one_head"] = _timescale_summary(long_runs)
    print(f"long-horizon SGD, lr 0.3, {long_horizon} steps", flush=True)

    def long_run():
        x, targets = sticky.data(seeds[0], T=T, chain=chain)
        params = init_head(seeds[0], dtype="float32")
        lh = train_head(params, x, targets, long_horizon, "sgd", lr=0.3, log_every=log_every, seed=seeds[0])
        return dict(lh, seed=seeds[0], heldout=evaluate_vs_bayes(params, reference=ref_long))
    out["long_horizon_sgd"] = lh = kept(units, "long_horizon_sgd", long_run)
    print(f"  training loss {lh['loss'][0] / LN2:.3f} -> {lh['loss'][-1] / LN2:.3f} bits, held-out "
          f"{lh['heldout']['loss_bits']:.3f}", flush=True)
    print("bijection transformer (routing against value gradients by layer)", flush=True)
    out["transformer"] = tf = kept(units, "transformer", lambda: transformer_timescales(seed=seeds[0], **transformer_kw))
    print(f"  {tf['steps']} steps: probe loss {tf['probe_loss_bits']:.3f} bits against exact Bayes's "
          f"{tf['probe_bayes_loss_bits']:.3f} (KL {tf['probe_kl_bits']:.3g} bits)", flush=True)

    out["curves"] = {setting: {m: [{k: r[k] for k in r if k != "params"} for r in rs] for m, rs in runs.items()}
                     for setting, runs in (("long_chain", long_runs), ("short_sequences", short_runs))}
    out["final_params_first_seed"] = {m: long_runs[m][0]["params"] for m in long_runs}
    out["seconds_total"] = time.perf_counter() - t_start + sum(units["earlier"].values())
    os.makedirs(out_dir, exist_ok=True)
    plots_dynamics.plot_em_vs_sgd(out, os.path.join(out_dir, "em_vs_sgd.png"))
    plots_dynamics.plot_two_timescales(out, os.path.join(out_dir, "two_timescales.png"))
    out = plain(out)
    # every number in dynamics.json; the per-step curves (about 2 MB) in curves.json beside it
    heavy = ("curves", "final_params_first_seed")
    write_json(os.path.join(out_dir, "dynamics.json"), {k: v for k, v in out.items() if k not in heavy})
    write_json(os.path.join(out_dir, "curves.json"), {k: out[k] for k in heavy}, indent=None)
    runs.remove_run(out_dir, ["progress"] if os.path.isdir(units["dir"]) else [])   # finished: its JSON, not its progress
    print(f"wrote em_vs_sgd.png, two_timescales.png, dynamics.json, curves.json in {out_dir}/ in "
          f"{out['seconds_total']:.0f} s")
    print(summary_lines(out, steps))
    return out


def compare_em_identity(seeds, steps, quick, mstep_steps, transformer_steps, chain, lr):
    """What makes two sessions of compare_em the same comparison (each kept run records it)."""
    return dict(seeds=list(seeds), steps=steps, quick=quick, mstep_steps=mstep_steps,
                transformer_steps=transformer_steps, chain=chain, lr=lr)


def compare_em_runs(seeds=SEEDS, quick=False):
    """The names of compare_em's runs, in the order it trains them: each arm of each seed in the long-chain
    setting, then in the short-sequence one, then SGD at sigma = 3, the long-horizon SGD, the transformer."""
    seeds = tuple(seeds)[:2] if quick else tuple(seeds)
    return [f"{setting}-seed{seed}-{arm}" for setting in ("long_chain", "short_sequences") for seed in seeds
            for arm in ("sgd", "em", "mstep")] + ["sigma3_sgd", "long_horizon_sgd", "transformer"]


def kept(units, name, compute):
    """One of compare_em's runs: read if an earlier session finished it, else compute() (its result as JSON
    gives it back, so that a run read and a run trained feed the summary the same numbers) and keep it in
    units["dir"] as <name>.json with the experiment's identity. Stops before it (Stopped) when units["stop"]
    runs are done; a signal inside compute() drops this run and says what is kept (training.Interrupted).
    units None: compute()'s result as JSON gives it back, nothing kept."""
    if units is None:
        return json.loads(json.dumps(plain(compute())))
    done = units["done"]
    if name in done:
        return done[name]
    where = f"the {len(done)} runs finished before it are kept in {units['dir']}"
    if units["stop"] is not None and len(done) >= units["stop"]:
        raise Stopped(f"compare-em stopped (--stop-after) after {len(done)} of its {units['total']} runs, kept in "
                      f"{units['dir']}; continue with --resume and the same flags")
    t0 = time.perf_counter()
    try:
        result = json.loads(json.dumps(plain(compute())))
    except training.Interrupted as e:
        raise training.Interrupted(f"compare-em {e.args[0].split(';')[0]} of its run {name}; {where}: continue "
                                   f"with --resume and the same flags") from None
    os.makedirs(units["dir"], exist_ok=True)
    write_json(os.path.join(units["dir"], f"{name}.json"),
               dict(units["identity"], name=name, seconds=time.perf_counter() - t0, result=result), indent=None)
    done[name] = result
    return result


def compare_em_progress(out_dir, seeds=SEEDS, steps=1000, quick=False, mstep_steps=None, transformer_steps=None,
                        chain="exact", lr=SGD_LR):
    """The runs an earlier session of compare_em finished, in out_dir/progress/, read and judged before
    anything is written: {name: {"result", "seconds"}}. ValueError in one line for a file that is not one of
    its runs, is not a regular file, cannot be read, or is of another comparison (other seeds, steps, ...)."""
    identity = compare_em_identity(seeds, steps, quick, mstep_steps, transformer_steps, chain, lr)
    folder, names, out = os.path.join(out_dir, "progress"), compare_em_runs(seeds, quick), {}
    problem = runs.kind_problem(folder, want_dir=True)
    if problem:
        raise ValueError(f"{folder!r} is {problem}")
    for file in sorted(os.listdir(folder)):
        path = os.path.join(folder, file)
        if file.startswith(".tmp-"):                             # an atomic write that a kill cut short
            continue
        if not (file.endswith(".json") and file[:-5] in names):
            raise ValueError(f"{path!r} is not one of compare-em's runs")
        kept_run, _ = _read_progress(path, identity, "compare-em's")
        if not (kept_run.get("name") == file[:-5] and isinstance(kept_run.get("result"), dict)
                and isinstance(kept_run.get("seconds"), (int, float)) and math.isfinite(kept_run["seconds"])):
            raise ValueError(f"{path!r} is damaged or not compare-em's (its name, result or seconds)")
        out[file[:-5]] = {"result": kept_run["result"], "seconds": kept_run["seconds"]}
    return out


def summary_lines(out, steps):
    """compare_em's result as a paper prints it: per setting and arm, the mean steps to SGD's final loss, the
    authors' ratio (SGD's budget over that mean) and the paired t-tests' p-values, two significant digits."""
    p = lambda test: "n/a" if test.get("p") is None else f"{test['p']:.2g}"
    lines = [f"steps to SGD's final loss (mean ± std over {len(out['config']['seeds'])} seeds), and 'x sooner': SGD's "
             f"{steps} steps over that mean"]
    for setting in ("long_chain", "short_sequences"):
        sgd = out[setting]["sgd"]["steps_to_threshold_mean"]
        lines.append(f"{setting.replace('_', ' ')}: SGD's own seeds {sgd:.3g}")
        for m, name in (("em", "EM-like"), ("mstep", "true M-step")):
            t = out[setting][m]
            lines.append(f"  {name}: {t['steps_to_threshold_mean']:.3g} ± {t['steps_to_threshold_std']:.2g} steps, "
                         f"{t['speedup_steps']:.3g}x sooner; paired t-test against SGD: p = "
                         f"{p(t['paired_final_loss_vs_sgd']['ttest_rel'])} on the final losses, "
                         f"{p(t['paired_steps_vs_sgd']['ttest_rel'])} on the steps")
    return "\n".join(lines)


def _timescale_summary(runs):
    """Seed-mean of the routing/value gradient norms and of the logs, per arm, at a few steps."""
    out = {}
    for m, rs in runs.items():
        routing = np.array([r["routing_norm"] for r in rs])      # (seeds, steps)
        value = np.array([r["value_norm"] for r in rs])
        n = routing.shape[1]
        at = sorted({0, n // 10, n // 4, n // 2, n - 1})
        logs = rs[0]["logs"]
        mean_log = lambda key: [float(np.mean([r["logs"][k][key] for r in rs])) if key in logs[k] else None
                                for k in range(len(logs))]
        out[m] = {"steps": at,
                  "routing_norm": routing.mean(0)[at].tolist(), "value_norm": value.mean(0)[at].tolist(),
                  "routing_over_value": (routing.mean(0) / value.mean(0))[at].tolist(),
                  "log_steps": [l["step"] for l in logs]}
        for key in ("adv_std", "adv_weighted_std", "ds_abs", "attn_entropy_bits", "attn_entropy_frac",
                    "frame_drift", "value_drift", "prototype_cos"):
            out[m][key] = mean_log(key) if logs else []
        out[m]["prototype_cos_mean"] = float(np.mean(out[m]["prototype_cos"])) if logs else None
    return out


def default_out_dir(chain="exact", quick=False, what="dynamics"):
    """runs/dynamics, runs/dynamics-quick, runs/dynamics-authors-chain, runs/deep-variant, ..."""
    return os.path.join("runs", what + ("-quick" if quick else "") + ("-authors-chain" if chain == "authors" else ""))


class Stopped(Exception):
    """A Paper II run stopped at --stop-after with its progress saved; the message says where."""


def deep_progress(out_dir, seeds=SEEDS, steps=1000, lr=DEEP_LR, T=2000, chain="exact"):
    """What an earlier session of the deep variant left in out_dir, read and judged before anything is
    written: {"rows": {seed: row}, "states": {seed: (params, opt_state, losses, step, seconds)}}. ValueError
    in one line for a file that is not a regular file, cannot be read, or is of another run (other steps,
    lr, length or chain)."""
    identity = dict(steps=steps, lr=lr, T=T, chain=chain)
    out = {"rows": {}, "states": {}}
    for seed in seeds:
        for ext in ("json", "npz"):
            path = os.path.join(out_dir, f"deep_seed{seed}.{ext}")
            if not os.path.lexists(path):
                continue
            data, meta = _read_progress(path, identity, "the deep variant's")
            if ext == "json" and seed not in out["rows"]:
                numbers = ("train_loss_final_bits", "test_loss_bits", "test_bayes_loss_bits", "test_kl_bits", "seconds")
                if not all(isinstance(data.get(k), (int, float)) and math.isfinite(data[k]) for k in numbers):
                    raise ValueError(f"{path!r} is damaged or not the deep variant's (its numbers)")
                out["rows"][seed] = {k: v for k, v in data.items() if k not in identity}
            elif ext == "npz" and seed not in out["rows"]:
                step = meta.get("step")
                cfg, params = deep_init(seed, T)
                try:
                    got = {k[len("param:"):]: data[k] for k in data if k.startswith("param:")}
                    m = {k[len("adam_m:"):]: data[k] for k in data if k.startswith("adam_m:")}
                    v = {k[len("adam_v:"):]: data[k] for k in data if k.startswith("adam_v:")}
                    ok = (isinstance(step, int) and 0 < step < steps and len(data["losses"]) == step
                          and all(got[k].shape == p.shape and m[k].shape == p.shape and v[k].shape == p.shape
                                  and np.isfinite(got[k]).all() for k, p in params.items()) and len(got) == len(params))
                except KeyError:
                    ok = False
                if not ok:
                    raise ValueError(f"{path!r} is damaged or not the deep variant's (its arrays or step)")
                out["states"][seed] = (got, {"t": int(data["adam_t"]), "m": m, "v": v}, data["losses"].tolist(),
                                       step, float(meta.get("seconds", 0.0)))
    return out


def files(experiment, out_dir, seeds=SEEDS):
    """The files of a Paper II run (one-head, compare-em, deep) in out_dir: its results and its progress."""
    names = OUTPUTS.get(experiment) or ["deep_variant.json", "deep_variant.png", *(f"deep_seed{s}.{e}" for s in seeds
                                                               for e in ("json", "npz"))]
    return [n for n in names if os.path.lexists(os.path.join(out_dir, n))]


def progress_files(held):
    """Those of held (files' result) that an earlier session left to continue from."""
    return [n for n in held if n in ("sticky_progress.npz", "progress") or n.startswith("deep_seed")]


def run_deep(chain="exact", steps=1000, out_dir=None, seeds=SEEDS, lr=DEEP_LR, stop=None, progress=None, T=2000):
    """The deep variant over the seeds; writes deep_variant.json to out_dir (default
    runs/deep-variant[-authors-chain]), keeping its progress there seed by seed (deep_variant). -> the dict."""
    out_dir = out_dir or default_out_dir(chain, what="deep-variant")
    os.makedirs(out_dir, exist_ok=True)
    out = plain(deep_variant(seeds=seeds, steps=steps, lr=lr, T=T, chain=chain, out_dir=out_dir, stop=stop,
                             progress=progress))
    path = os.path.join(out_dir, "deep_variant.json")
    plots_dynamics.plot_deep_variant(out, os.path.join(out_dir, "deep_variant.png"))
    write_json(path, {**out, "per_seed": [{k: v for k, v in r.items() if k != "train_loss_bits"}
                                          for r in out["per_seed"]]})
    print(f"deep variant ({chain} chain): held-out {out['test_loss_bits_mean']:.4f} +- {out['test_loss_std_bits']:.4f} "
          f"bits, exact Bayes {out['test_bayes_loss_bits_mean']:.4f}, bound {out['config']['bound_bits']:.4f}, "
          f"KL {out['test_kl_bits_mean']:.4f}; wrote {path} and deep_variant.png")
    return out

