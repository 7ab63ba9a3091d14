"""The geometry of Bayesian attention (Paper I): six probes of a trained wind-tunnel transformer.

    python manifold.py runs/<name>/checkpoint.npz [--figures figures] [--n-seqs 500] [--seed 0]

writes figures/geometry_<name>_*.png and every number into runs/<name>/geometry.json.
`analyze(checkpoint_path, fig_dir, n_seqs, seed) -> dict` does the same from Python.

The probes (shared/PAPERS.md, "What the trained transformer shows"):
  1. key_frame        stage 1: layer-0 keys of the hypothesis tokens are near-orthogonal
  2. attention_probe  stage 2: attention entropy falls layer by layer, mass moves onto the evidence
  3. manifold_stats   stage 3: late representations lie on a curve ordered by posterior entropy
  4. logit_lens       the belief is refined layer by layer in the residual stream
  5. ablations        zeroing one head or one layer's attention, and what it costs in bits
  6. frame_precision  across training snapshots: the attention frame settles before the calibration

Notation: n sequences, T tokens per sequence, P supervised positions per sequence, C width,
NH heads, hs = C / NH head size, L layers, K output classes, V keys (= values) of the bijection.
Entropies, KL divergences and calibration errors are in bits. Every probe reads held-out
sequences drawn from default_rng((PROBE_SEED, seed)), a stream training never uses.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see bayesattn.py: BLAS threads fight Numba's
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

import bayesattn as ba  # noqa: E402
import windtunnels as wt  # noqa: E402

PROBE_SEED = 2_000_003      # held-out stream of the probes (training draws default_rng((seed, step)))
HMM_K = 20                  # observations per HMM probe sequence (the training length)
RANDOM_INIT_SEEDS = (101, 102, 103, 104, 105)  # untrained baselines of the key frame
GAUSSIAN_DRAWS = 50         # draws of random Gaussian vectors for the key-frame baseline
SNAPSHOT_SEQS = 200         # probe sequences per training snapshot (probe 6) ...
SNAPSHOT_FLOATS = 2e7       # ... fewer if one snapshot's attention (n L NH T T floats) would exceed this
SETTLE_FRACTION = 0.1       # a series settles once its per-step change stays below this x its maximum
N_PROB = wt.HMM_S * wt.HMM_S  # HMM header: T (N_PROB tokens) SEP E (N_PROB tokens) SEP
E_START = N_PROB + 1        # position of E[0, 0]; E[s, o] sits at E_START + S s + o


# ----------------------------------------------------------------------------
# the probe data: held-out sequences with exact posteriors

def task_of(cfg, meta):
    """-> the task of a checkpoint, from its meta (older checkpoints: from the vocabulary)."""
    task = meta.get("task") or ("hmm" if cfg.vocab_size == wt.HMM_VOCAB else "bijection")
    if task not in ("bijection", "sawtooth", "hmm") or meta.get("replacement"):
        raise ValueError(f"task {task!r}{' with replacement' if meta.get('replacement') else ''}: manifold.py "
                         f"probes the bijection, sawtooth and HMM wind tunnels")
    return task


def probe_batch(task, cfg, n, seed):
    """n held-out sequences shaped like the training data of this checkpoint."""
    rng = np.random.default_rng((PROBE_SEED, seed))
    if task == "bijection":
        V = cfg.n_classes
        L = min(V - 1, cfg.max_len // 2)                             # train.py: L = V - 1, max_len = 2L
        return wt.bijection_batch(rng, n, V, L=L)
    if task == "sawtooth":
        return wt.sawtooth_batch(rng, n, cfg.n_classes)
    K = HMM_K if cfg.pos != "learned" else min(HMM_K, cfg.max_len - wt.HMM_HEADER)
    return wt.hmm_batch(rng, n, K)


def supervised_columns(batch):
    """Positions the probes read (the same in every row): every supervised position but a final query,
    whose posterior is always one-hot (train.evaluate leaves it out of the paper metric too): (P,) int."""
    cols = np.flatnonzero(batch["mask"][0] > 0)
    assert np.all(batch["mask"][:, cols] > 0)
    if "query_mask" in batch:
        cols = np.setdiff1d(cols, np.flatnonzero(batch["query_mask"][0] > 0))
    return cols


def token_names(task, cfg, tokens):
    """Readable names of one sequence's tokens: k3 / v7 (bijection, sawtooth; q: the query), T / E / | / o2 (HMM)."""
    if task == "bijection":
        V = cfg.n_classes
        return [f"k{t}" if t < V else f"v{t - V}" for t in tokens]
    if task == "sawtooth":
        return [("q" if i == len(tokens) - 1 else "k" if i % 2 == 0 else "v") + str(t) for i, t in enumerate(tokens)]
    names = ["T"] * N_PROB + ["|"] + ["E"] * N_PROB + ["|"]
    return names + [f"o{t - wt.HMM_OBS0}" for t in tokens[wt.HMM_HEADER:]]


def position_table(params, cfg, T):
    """The positional term added to the token embeddings: (T, C), exactly as the model's forward adds it."""
    return ba.position_table(params, cfg, T).astype(np.float64)


def token_groups(task, cfg, tokens):
    """Hypothesis-carrying token types -> (token ids, positions where that type occurs).

    bijection: the key tokens 0..V-1 (even positions) and the value tokens V..2V-1 (odd positions).
    sawtooth: the V tokens, keys and values at once (every position).
    HMM: the observation tokens (positions 52..) and the probability tokens of the header (SEP
    excluded) that occur in the probe sequences (entries >= 0.05 cap a probability at 0.80)."""
    T = tokens.shape[1]
    if task == "bijection":
        V = cfg.n_classes
        return {"keys": (np.arange(V), np.arange(0, T, 2)),
                "values": (np.arange(V, 2 * V), np.arange(1, T, 2))}
    if task == "sawtooth":
        return {"tokens": (np.arange(cfg.n_classes), np.arange(T))}
    header = np.r_[0:N_PROB, E_START:E_START + N_PROB]
    return {"observations": (wt.HMM_OBS0 + np.arange(wt.HMM_S), np.arange(wt.HMM_HEADER, T)),
            "probabilities": (np.unique(tokens[:, header]), header)}


# ----------------------------------------------------------------------------
# probe 1: the orthogonal hypothesis frame (stage 1), per layer-0 head and token type
#   "ln"          key_tok = LN1(wte[tok] + p) @ W_K[:, head] + b_K[head], p = the mean positional
#                 term over the positions where tokens of that type occur
#   "ln_centred"  the same minus its mean over the tokens of the type: adding one vector c to every
#                 key adds q . c to a whole row of scores, which softmax ignores, so this is the part
#                 of the keys that can tell the tokens of one type apart
#   "raw"         wte[tok] @ W_K[:, head], the authors' recipe
#   "value_ln"    value vectors LN1(wte[tok] + p) @ W_V[:, head] + b_V[head]: what attention adds up
RECIPES = ("ln", "ln_centred", "raw", "value_ln")


def cosine_matrix(X):
    """X (n, d) -> cosine similarities (n, n)."""
    U = X / np.maximum(np.linalg.norm(X, axis=-1, keepdims=True), 1e-300)
    return U @ U.T


def offdiag(Cm):
    return Cm[~np.eye(len(Cm), dtype=bool)]


def mean_abs_offdiag(Cm):
    """Mean |C_ij| over i != j of a square matrix."""
    return float(np.abs(offdiag(Cm)).mean()) if len(Cm) > 1 else 0.0


def rms_offdiag(Cm):
    return float(np.sqrt((offdiag(Cm) ** 2).mean())) if len(Cm) > 1 else 0.0


def welch_rms_bound(n, d):
    """Smallest possible RMS off-diagonal cosine of n unit vectors in R^d:
    sum_{i != j} cos_ij^2 >= n^2 / d - n (Welch), so rms >= sqrt((n - d) / (d (n - 1))) when n > d."""
    return math.sqrt(max(0.0, (n - d) / (d * (n - 1)))) if n > 1 else 0.0


def layer0_vectors(params, cfg, tokens, p, recipe="ln"):
    """Per-token layer-0 keys (or values) of every head: tokens (n,), p (C,) -> (NH, n, hs)."""
    pre, NH = "blocks.0.", cfg.n_heads
    x = params["wte"][tokens].astype(np.float64)                    # (n, C)
    if recipe == "raw":
        k = x @ params[pre + "attn.wk"].astype(np.float64)           # (n, C) raw embedding keys
    else:
        h, _ = ba.layernorm_forward(x + p, params[pre + "ln1.g"].astype(np.float64),
                                    params[pre + "ln1.b"].astype(np.float64))  # (n, C)
        w = "v" if recipe == "value_ln" else "k"
        k = h @ params[pre + f"attn.w{w}"] + params[pre + f"attn.b{w}"]       # (n, C)
    k = k.reshape(len(tokens), NH, -1).transpose(1, 0, 2)           # (NH, n, hs)
    return k - k.mean(1, keepdims=True) if recipe == "ln_centred" else k


def key_frame(params, cfg, groups, recipe="ln"):
    """-> {group: cosine matrices (NH, n, n)} of the layer-0 vectors of each token type."""
    T = max(int(pos.max()) for _, pos in groups.values()) + 1
    table = position_table(params, cfg, T)                          # (T, C)
    return {name: np.stack([cosine_matrix(k) for k in layer0_vectors(params, cfg, toks, table[pos].mean(0), recipe)])
            for name, (toks, pos) in groups.items()}


def gaussian_baseline(n, d, centred=False, draws=GAUSSIAN_DRAWS, seed=0):
    """Mean |off-diagonal cosine| of n iid N(0, I_d) vectors (centred over the n if asked), over draws."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((draws, n, d))                          # (draws, n, d)
    X = X - X.mean(1, keepdims=True) if centred else X
    return float(np.mean([mean_abs_offdiag(cosine_matrix(x)) for x in X]))


def key_frame_probe(params, cfg, task, tokens):
    """Probe 1: trained cosines beside random initialisations (same recipe) and random Gaussian vectors."""
    groups = token_groups(task, cfg, tokens)
    hs = cfg.d_model // cfg.n_heads
    inits = [ba.init_params(cfg, s) for s in RANDOM_INIT_SEEDS]
    out, matrices = {}, {}
    for recipe in RECIPES:
        trained = key_frame(params, cfg, groups, recipe)
        untrained = [key_frame(p, cfg, groups, recipe) for p in inits]
        out[recipe] = {}
        for name, (toks, _) in groups.items():
            per_head = [mean_abs_offdiag(c) for c in trained[name]]
            per_seed = [float(np.mean([mean_abs_offdiag(c) for c in u[name]])) for u in untrained]
            out[recipe][name] = {
                "n_tokens": len(toks), "head_size": hs,
                "mean_abs_offdiag": float(np.mean(per_head)), "mean_abs_offdiag_per_head": per_head,
                "rms_offdiag": float(np.mean([rms_offdiag(c) for c in trained[name]])),
                "random_init_mean_abs_offdiag": float(np.mean(per_seed)), "random_init_per_seed": per_seed,
                "gaussian_mean_abs_offdiag": gaussian_baseline(len(toks), hs, centred=recipe == "ln_centred"),
                "welch_rms_lower_bound": welch_rms_bound(len(toks), hs)}
            matrices[(recipe, name)] = trained[name]
    return out, matrices


# ----------------------------------------------------------------------------
# probe 2: progressive query-key sharpening (stage 2)
#
# Evidence ("consistent") positions of a supervised row t, positions j <= t:
#   bijection and sawtooth, key k_i at t = 2(i-1): if k_i occurred before (sawtooth), the value
#     positions right after its earlier occurrences (they hold the answer); otherwise every earlier
#     value position (each holds a value already taken, i.e. an eliminated hypothesis). Without
#     replacement (bijection): all earlier values.
#   HMM, observation o_t: the five header positions of the emission column E[s, o_t], s = 0..4,
#     the likelihood of the current observation under each state.
# Rows with no evidence position (the first key) are left out of the mass averages.

def row_entropy_bits(alpha):
    """Entropy of attention rows (..., T) in bits (0 log 0 = 0)."""
    a = alpha.astype(np.float64)
    return -(a * np.log2(np.where(a > 0, a, 1.0))).sum(-1)


def evidence_masks(task, tokens, cols):
    """-> dict of (n, P, T) bool masks over attended positions for each supervised row."""
    n, T = tokens.shape
    j = np.arange(T)
    causal = j[None, :] <= cols[:, None]                            # (P, T)
    if task in ("bijection", "sawtooth"):
        value_pos = causal & (j[None, :] % 2 == 1)                  # (P, T) earlier value positions
        key_now = tokens[:, cols]                                    # (n, P)
        prev_key = np.concatenate([np.full((n, 1), -1), tokens[:, :-1]], axis=1)  # (n, T) token before j
        answer = value_pos[None] & (prev_key[:, None, :] == key_now[:, :, None])  # (n, P, T)
        repeated = answer.any(-1, keepdims=True)                    # (n, P, 1)
        consistent = np.where(repeated, answer, value_pos[None])    # (n, P, T)
        return {"consistent": consistent, "value": np.broadcast_to(value_pos, (n,) + value_pos.shape)}
    obs = tokens[:, cols] - wt.HMM_OBS0                              # (n, P)
    column = E_START + wt.HMM_S * np.arange(wt.HMM_S)[None, None, :] + obs[..., None]  # (n, P, S) E[s, o_t]
    consistent = np.zeros((n, len(cols), T), dtype=bool)
    np.put_along_axis(consistent, column, True, axis=-1)
    obs_pos = causal & (j[None, :] >= wt.HMM_HEADER)
    return {"consistent": consistent, "observation": np.broadcast_to(obs_pos, (n,) + obs_pos.shape),
            "transition": np.broadcast_to(causal & (j[None, :] < N_PROB), (n,) + obs_pos.shape)}


def attention_probe(cache, batch, task, cfg):
    """Probe 2 per layer and head: attention entropy (bits) and mass on evidence positions."""
    cols = supervised_columns(batch)
    masks = evidence_masks(task, batch["tokens"], cols)
    has_evidence = masks["consistent"].any(-1)                      # (n, P)
    uniform_h = np.log2(cols + 1.0)                                  # (P,) entropy of uniform causal attention
    uniform_mass = masks["consistent"].sum(-1) / (cols + 1.0)       # (n, P) mass of uniform attention on the evidence
    out = {"uniform_entropy_bits": float(uniform_h.mean()),
           "uniform_consistent_mass": float(uniform_mass[has_evidence].mean()), "layers": []}
    for lc in cache["layers"]:
        alpha = lc["alpha"][:, :, cols].astype(np.float64)           # (n, NH, P, T)
        h = row_entropy_bits(alpha)                                  # (n, NH, P)
        layer = {"entropy_bits": h.mean((0, 2)).tolist(), "entropy_bits_mean": float(h.mean()),
                 "entropy_reduction": float(1.0 - h.mean() / uniform_h.mean())}
        for name, m in masks.items():
            mass = (alpha * m[:, None]).sum(-1)                      # (n, NH, P)
            keep = has_evidence if name == "consistent" else np.ones_like(has_evidence)
            layer[f"{name}_mass"] = [float(mass[:, hd][keep].mean()) for hd in range(cfg.n_heads)]
        out["layers"].append(layer)
    return out


# ----------------------------------------------------------------------------
# probe 3: the entropy-ordered value manifold (stage 3)

def pca(X):
    """X (N, C) -> scores (N, C'), explained-variance ratios (C',); each axis signed so that its
    largest loading is positive."""
    Xc = X - X.mean(0)
    _, S, Vt = np.linalg.svd(Xc, full_matrices=False)
    Vt = Vt * np.sign(Vt[np.arange(len(Vt)), np.abs(Vt).argmax(1)])[:, None]
    var = S ** 2
    return Xc @ Vt.T, var / max(var.sum(), 1e-300)


def spearman(a, b):
    """Spearman rank correlation; None when either side is constant."""
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(spearmanr(a, b)[0])


def manifold_stats(X, h_bayes, position=None):
    """X (N, C) representations, h_bayes (N,) exact posterior entropy (bits), position (N,) optional.
    -> explained variance of PC1 and PC1+PC2, Spearman(PC1, H), and two controls: Spearman(PC1,
    position) and the mean within-position Spearman(PC1, H) where H varies at a fixed position."""
    scores, ratio = pca(np.asarray(X, dtype=np.float64))
    rho = spearman(scores[:, 0], h_bayes)
    out = {"pc1_variance": float(ratio[0]), "pc12_variance": float(ratio[:2].sum()),
           "spearman_pc1_entropy": rho, "abs_spearman_pc1_entropy": None if rho is None else abs(rho)}
    if position is not None:
        out["spearman_pc1_position"] = spearman(scores[:, 0], position)
        within = [spearman(scores[position == p, 0], h_bayes[position == p]) for p in np.unique(position)]
        within = [r for r in within if r is not None]
        out["mean_within_position_spearman"] = float(np.mean(within)) if within else None
    return out, scores[:, :2]


def manifold_probe(cache, batch):
    """Probe 3 on the last layer's attention output and the final residual stream, and by layer."""
    cols = supervised_columns(batch)
    h = wt.entropy_bits(batch["posterior"][:, cols]).reshape(-1)    # (n P,)
    pos = np.tile(cols, len(batch["tokens"]))                        # (n P,)
    rows = lambda a: a[:, cols].reshape(-1, a.shape[-1]).astype(np.float64)  # (n, T, C) -> (n P, C)
    attn, attn_xy = manifold_stats(rows(cache["layers"][-1]["attn_out"]), h, pos)
    resid, resid_xy = manifold_stats(rows(cache["resid"][-1]), h, pos)
    by_layer = {"attn_out": [manifold_stats(rows(lc["attn_out"]), h, pos)[0] for lc in cache["layers"]],
                "residual": [manifold_stats(rows(r), h, pos)[0] for r in cache["resid"][1:]]}
    return ({"attn_out_last": attn, "residual_final": resid, "by_layer": by_layer,
             "authors": authors_manifold(rows(cache["xf"]), h, pos)}, (attn_xy, resid_xy, h))


# ----------------------------------------------------------------------------
# the authors' definitions of probes 1, 3 and 6 (shared/PAPERS.md, "Geometry, in three stages")
#   key frame:   layer 0, each head separately, the hypothesis tokens h; key_h = LN1(wte[h]) @ W_K[:, head]
#                (no positional term, no bias b_K); mean |off-diagonal cosine| per head
#   manifold:    the final hidden state after the final LayerNorm at the positions that predict a value;
#                centred PCA; Pearson r of each of PC1..PC5 with H_Bayes (the best |r|), R^2 of a linear fit
#                of H_Bayes on the top 5 PCs, PC1's share of the variance
#   frame:       the span of LN1(wte[h]) over the hypotheses (their "embedding" frame), compared across
#                snapshots with the final one by the projection overlap ||U^T W||_F^2 / min(rank U, rank W),
#                as a multiple of a random subspace's overlap
AUTHORS_FRAME_RANK = 8      # the snapshot side of the overlap: its top 8 frame directions (the authors' rank)


def hypothesis_tokens(task, cfg):
    """The tokens that stand for the hypotheses: the value tokens V..2V-1 (bijection, format a), all V
    tokens (sawtooth, format b), the five observation tokens (HMM: the authors define no HMM frame; an
    observation is the evidence token whose likelihood column the filter reads)."""
    if task == "bijection":
        return np.arange(cfg.n_classes, 2 * cfg.n_classes)
    if task == "sawtooth":
        return np.arange(cfg.n_classes)
    return wt.HMM_OBS0 + np.arange(wt.HMM_S)


def token_frame(params, tokens):
    """LN1 of layer 0 applied to the bare token embeddings: (n, C), no positional term."""
    x = params["wte"][tokens].astype(np.float64)                    # (n, C)
    h, _ = ba.layernorm_forward(x, params["blocks.0.ln1.g"].astype(np.float64),
                                params["blocks.0.ln1.b"].astype(np.float64))
    return h


def authors_keys(params, cfg, tokens):
    """key_h = LN1(wte[h]) @ W_K[:, head] for every layer-0 head: (NH, n, hs)."""
    k = token_frame(params, tokens) @ params["blocks.0.attn.wk"].astype(np.float64)   # (n, C), no b_K
    return k.reshape(len(tokens), cfg.n_heads, -1).transpose(1, 0, 2)


def authors_key_frame(params, cfg, task):
    """Mean |off-diagonal cosine| of the hypothesis keys per layer-0 head, beside random initialisations."""
    toks = hypothesis_tokens(task, cfg)
    hs = cfg.d_model // cfg.n_heads
    per_head = [mean_abs_offdiag(cosine_matrix(k)) for k in authors_keys(params, cfg, toks)]
    init = [[mean_abs_offdiag(cosine_matrix(k)) for k in authors_keys(ba.init_params(cfg, s), cfg, toks)]
            for s in RANDOM_INIT_SEEDS]                              # (seeds, NH)
    return {"hypotheses": len(toks), "head_size": hs, "per_head": per_head, "mean": float(np.mean(per_head)),
            "most_orthogonal_head": int(np.argmin(per_head)),
            "random_init_per_head": np.mean(init, 0).tolist(), "random_init_mean": float(np.mean(init)),
            "welch_rms_lower_bound": welch_rms_bound(len(toks), hs),
            "orthogonality_possible": hs >= len(toks)}


def pearson(a, b):
    """Pearson correlation; None when either side is constant."""
    a, b = np.asarray(a, np.float64) - np.mean(a), np.asarray(b, np.float64) - np.mean(b)
    den = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b) / den if den > 0 else None


def r_squared(X, y):
    """R^2 of the least-squares fit y ~ X w + c (in sample); None when y is constant."""
    A = np.c_[X, np.ones(len(X))]
    w = np.linalg.lstsq(A, y, rcond=None)[0]
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - A @ w) ** 2).sum()) / ss_tot if ss_tot > 0 else None


def authors_manifold(X, h_bayes, position, n_pcs=5):
    """X (N, C) final hidden states (after the final LayerNorm), h_bayes (N,), position (N,).
    -> PC1 variance, Pearson r of PC1..PC5 with H (best |r|), R^2 of H on the top 5 PCs; controls:
    R^2 of H on the position alone (1 when H is a function of the position, as in format a) and the
    mean within-position R^2 of the same top-5-PC fit, over positions where H varies."""
    scores, ratio = pca(np.asarray(X, dtype=np.float64))
    top = scores[:, :n_pcs]
    r = [pearson(top[:, i], h_bayes) for i in range(top.shape[1])]
    best = max(range(len(r)), key=lambda i: -1.0 if r[i] is None else abs(r[i]))
    onehot = (position[:, None] == np.unique(position)[None, :]).astype(np.float64)
    within = [r_squared(top[position == p], h_bayes[position == p]) for p in np.unique(position)]
    within = [w for w in within if w is not None]
    return {"pc1_variance": float(ratio[0]), "pearson_pc1_to_pc5": r, "best_pc": best + 1,
            "best_abs_pearson": None if r[best] is None else abs(r[best]), "r2_top5": r_squared(top, h_bayes),
            "r2_position_only": r_squared(onehot[:, 1:], h_bayes),
            "mean_within_position_r2_top5": float(np.mean(within)) if within else None}


def frame_basis(params, task, cfg, rank=None):
    """Orthonormal basis (C, r) of span{LN1(wte[h])} over the hypotheses h; with rank, its top `rank`
    directions (the leading right singular vectors of the (n, C) frame)."""
    F = token_frame(params, hypothesis_tokens(task, cfg))            # (n, C)
    _, S, Vt = np.linalg.svd(F, full_matrices=False)
    keep = int((S > S[0] * 1e-10).sum()) if rank is None else min(rank, len(S))
    return Vt[:keep].T                                               # (C, r)


def projection_overlap(U, W):
    """||U^T W||_F^2 / min(r1, r2) for orthonormal bases U (C, r1), W (C, r2): 1 iff one contains the other.
    A uniformly random r1-dimensional U has expected overlap r1 r2 / C / min(r1, r2)."""
    return float((np.linalg.svd(U.T @ W, compute_uv=False) ** 2).sum() / min(U.shape[1], W.shape[1]))


def random_overlap(C, r1, r2):
    """Expected projection overlap of a uniformly random r1-dimensional subspace with a fixed r2-dimensional
    one in R^C: E||U^T W||_F^2 = r1 r2 / C, divided by min(r1, r2)."""
    return r1 * r2 / C / min(r1, r2)


# ----------------------------------------------------------------------------
# probe 4: logit lens, the final LayerNorm and unembedding applied to every residual stream

def lens_proba(params, x):
    """Residual stream x (..., C) -> predictive distribution (..., K) of the final LN + unembedding."""
    xf, _ = ba.layernorm_forward(x, params["lnf.g"], params["lnf.b"])
    return ba.softmax_ref((xf @ params["unembed.w"] + params["unembed.b"]).astype(np.float64))


def calibration(q, post):
    """q, post (n, P, K) -> paper entropy MAE (mean over sequences per position first), KL (bits)."""
    h_model, h_bayes = wt.entropy_bits(q), wt.entropy_bits(post)    # (n, P)
    return {"entropy_mae_bits": float(np.abs(h_model.mean(0) - h_bayes.mean(0)).mean()),
            "kl_bits": float(wt.kl_bits(post, q).mean())}


def logit_lens(params, cache, batch):
    """Probe 4: KL(posterior || lens) and the lens entropy per position, for the embedding (0) and
    after every block (1..L)."""
    cols = supervised_columns(batch)
    post = batch["posterior"][:, cols]                               # (n, P, K)
    out = {"kl_bits": [], "entropy_mae_bits": [], "entropy_by_position_bits": [],
           "bayes_entropy_by_position_bits": wt.entropy_bits(post).mean(0).tolist()}
    for x in cache["resid"]:
        q = lens_proba(params, x[:, cols])                           # (n, P, K)
        c = calibration(q, post)
        out["kl_bits"].append(c["kl_bits"])
        out["entropy_mae_bits"].append(c["entropy_mae_bits"])
        out["entropy_by_position_bits"].append(wt.entropy_bits(q).mean(0).tolist())
    return out


# ----------------------------------------------------------------------------
# probe 5: ablations, a head's output (before W_o) set to zero, then all heads of a layer

def ablated_calibration(params, cfg, batch, head_mask):
    cols = supervised_columns(batch)
    logits, _ = ba.forward(params, batch["tokens"], cfg, head_mask=head_mask)
    return calibration(ba.softmax_ref(logits[:, cols].astype(np.float64)), batch["posterior"][:, cols])


def ablations(params, cfg, batch):
    """Probe 5 -> baseline, per head and per layer: entropy MAE and KL (bits) and their changes."""
    L, NH = cfg.n_layers, cfg.n_heads
    base = ablated_calibration(params, cfg, batch, None)
    delta = lambda c: {**c, "delta_entropy_mae_bits": c["entropy_mae_bits"] - base["entropy_mae_bits"],
                       "delta_kl_bits": c["kl_bits"] - base["kl_bits"]}
    heads, layers = [], []
    for l in range(L):
        mask = np.ones((L, NH))
        mask[l] = 0.0
        layers.append({"layer": l, **delta(ablated_calibration(params, cfg, batch, mask))})
        for h in range(NH):
            mask = np.ones((L, NH))
            mask[l, h] = 0.0
            heads.append({"layer": l, "head": h, **delta(ablated_calibration(params, cfg, batch, mask))})
    worst = max(heads, key=lambda r: r["delta_kl_bits"])
    by_mae = sorted(heads, key=lambda r: -r["delta_entropy_mae_bits"])
    worst_mae, second = by_mae[0], by_mae[1] if len(by_mae) > 1 else None
    return {"baseline": base, "heads": heads, "layers": layers,
            "hypothesis_frame_head": {"layer": worst["layer"], "head": worst["head"],
                                      "name": f"L{worst['layer']}H{worst['head']}", "rule": "largest KL increase"},
            "worst_head_by_entropy_mae": f"L{worst_mae['layer']}H{worst_mae['head']}",
            "authors_frame_head": {   # the authors' rule: the head whose removal raises the entropy MAE most
                "name": f"L{worst_mae['layer']}H{worst_mae['head']}",
                "delta_entropy_mae_bits": worst_mae["delta_entropy_mae_bits"],
                "second": None if second is None else f"L{second['layer']}H{second['head']}",
                "second_delta_entropy_mae_bits": None if second is None else second["delta_entropy_mae_bits"],
                "ratio_to_second": None if second is None or second["delta_entropy_mae_bits"] <= 0
                else worst_mae["delta_entropy_mae_bits"] / second["delta_entropy_mae_bits"]},
            "worst_layer": int(max(layers, key=lambda r: r["delta_kl_bits"])["layer"])}


# ----------------------------------------------------------------------------
# probe 6: frame-precision dissociation across training snapshots
#   frame change between consecutive snapshots a, b: mean over sequences, heads and every query
#   row i of the total-variation distance TV_i = 1/2 sum_j |alpha^b_ij - alpha^a_ij|, per layer;
#   divided by the steps between them it is a rate (per step).
#   A series settles at the first snapshot step s after which its per-step change stays below
#   SETTLE_FRACTION x its maximum: frame = mean over layers of the TV rate; precision = the rate
#   of |change of log10 entropy MAE| (calibration improves in orders of magnitude).
#   A second, scale-free rule: progress from the first snapshot (0) to the last (1), frame =
#   1 - TV(alpha_s, alpha_last) / TV(alpha_first, alpha_last), precision = the fraction of the drop
#   in log10 entropy MAE; the "90pct" step is the first after which progress stays >= 0.9.

def attention_tv(alpha_a, alpha_b):
    """Mean total-variation distance between corresponding attention rows (..., T): a float."""
    return float(0.5 * np.abs(alpha_a - alpha_b).sum(-1).mean(dtype=np.float64))


def settling_step(steps, change, frac=SETTLE_FRACTION):
    """steps (S,) snapshot steps; change (S-1,) per-step change between consecutive snapshots.
    -> the first step s_k after which change[k:] < frac * max(change) stays true (None if never)."""
    change = np.asarray(change, dtype=np.float64)
    if len(change) == 0 or not np.isfinite(change).all() or change.max() <= 0:
        return None
    return first_step_staying(steps, change < frac * change.max())


def first_step_staying(steps, ok):
    """-> the first steps[k] from which ok[k:] is all true (None if ok[-1] is false)."""
    ok = np.asarray(ok, dtype=bool)
    for k in range(len(ok)):
        if ok[k:].all():
            return int(steps[k])
    return None


def snapshot_paths(run_dir):
    """-> [(step, path)] of runs/<name>/snapshots/step_XXXXXXX.npz, sorted by step."""
    paths = glob.glob(os.path.join(run_dir, "snapshots", "step_*.npz"))
    return sorted((int(os.path.basename(p)[5:-4]), p) for p in paths)


def snapshot_state(params, cfg, batch, task):
    """-> attention (per layer, (n, NH, T, T)), a dict of numbers: calibration, per-layer attention
    entropy and evidence mass (probe 2, mean over heads), |Spearman(PC1 of final residual, H)|."""
    cols = supervised_columns(batch)
    logits, cache = ba.forward(params, batch["tokens"], cfg)
    post = batch["posterior"][:, cols]
    state = calibration(ba.softmax_ref(logits[:, cols].astype(np.float64)), post)
    att = attention_probe(cache, batch, task, cfg)
    state["attention_entropy_bits"] = [l["entropy_bits_mean"] for l in att["layers"]]
    state["consistent_mass"] = [float(np.mean(l["consistent_mass"])) for l in att["layers"]]
    stats, _ = manifold_stats(cache["resid"][-1][:, cols].reshape(-1, cfg.d_model).astype(np.float64),
                              wt.entropy_bits(post).reshape(-1))
    state["abs_spearman_pc1_entropy"] = stats["abs_spearman_pc1_entropy"]
    return [lc["alpha"] for lc in cache["layers"]], state


def frame_precision(run_dir, cfg, batch, task):
    """Probe 6 over the snapshots of a run; None with fewer than two snapshots."""
    snaps = snapshot_paths(run_dir)
    if len(snaps) < 2:
        return None
    load = lambda path: ba.load_checkpoint(path)[0]
    last = load(snaps[-1][1])
    final = snapshot_state(last, cfg, batch, task)[0]                 # attention of the last snapshot
    final_frame = frame_basis(last, task, cfg)                        # (C, k) the authors' final frame
    steps, states, tv, to_final, overlap, prev = [], [], [], [], [], None
    for step, path in snaps:
        params = load(path)
        alphas, state = snapshot_state(params, cfg, batch, task)
        overlap.append(projection_overlap(frame_basis(params, task, cfg, AUTHORS_FRAME_RANK), final_frame))
        if prev is not None:
            tv.append([attention_tv(a, b) for a, b in zip(prev, alphas)])  # (L,) per layer
        to_final.append([attention_tv(a, b) for a, b in zip(alphas, final)])
        steps.append(step)
        states.append(state)
        prev = alphas
    series = {key: [s[key] for s in states] for key in states[0]}
    gaps = np.diff(steps).astype(np.float64)                          # (S-1,)
    tv, to_final = np.asarray(tv), np.asarray(to_final)               # (S-1, L), (S, L)
    log_mae = np.log10(np.maximum(series["entropy_mae_bits"], 1e-12))  # (S,)
    frame_rate = tv.mean(1) / gaps                                    # (S-1,)
    precision_rate = np.abs(np.diff(log_mae)) / gaps                  # (S-1,)
    frame_progress = 1.0 - to_final.mean(1) / max(to_final.mean(1)[0], 1e-300)
    drop = log_mae[0] - log_mae[-1]
    precision_progress = (log_mae[0] - log_mae) / drop if drop != 0 else np.ones_like(log_mae)
    return {"steps": steps, **series,
            "attention_tv_per_layer": tv.tolist(), "attention_tv_rate": frame_rate.tolist(),
            "precision_rate": precision_rate.tolist(),
            "attention_tv_to_final_per_layer": to_final.tolist(),
            "frame_progress": frame_progress.tolist(), "precision_progress": precision_progress.tolist(),
            "frame_settle_step": settling_step(steps, frame_rate),
            "frame_settle_step_per_layer": [settling_step(steps, tv[:, l] / gaps) for l in range(tv.shape[1])],
            "precision_settle_step": settling_step(steps, precision_rate),
            "frame_90pct_step": first_step_staying(steps, frame_progress >= 0.9),
            "precision_90pct_step": first_step_staying(steps, precision_progress >= 0.9),
            "probe_sequences": int(len(batch["tokens"])),
            "authors": authors_frame_precision(steps, overlap, series["entropy_mae_bits"],
                                               random_overlap(cfg.d_model, min(AUTHORS_FRAME_RANK, final_frame.shape[1]),
                                                              final_frame.shape[1]))}


def authors_frame_precision(steps, overlap, mae, chance):
    """The authors' reading of probe 6: the frame's overlap with its final version as a multiple of chance,
    against the calibration (entropy MAE). The frame plateaus at the first snapshot from which the ratio
    stays >= 90% of its last value; the calibration gain after it is MAE(plateau) / MAE(last)."""
    ratio = np.asarray(overlap) / chance
    plateau = first_step_staying(steps, ratio >= 0.9 * ratio[-1])
    k = steps.index(plateau) if plateau is not None else None
    near_300 = int(np.argmin(np.abs(np.log(np.asarray(steps, np.float64) / 300.0))))
    return {"overlap": list(overlap), "chance_overlap": chance, "ratio_to_chance": ratio.tolist(),
            "ratio_ceiling": 1.0 / chance, "step_nearest_300": int(steps[near_300]),
            "ratio_nearest_300": float(ratio[near_300]), "frame_plateau_step": plateau,
            "ratio_at_plateau": None if k is None else float(ratio[k]),
            "entropy_mae_at_plateau_bits": None if k is None else float(mae[k]),
            "calibration_gain_after_plateau": None if k is None or mae[-1] <= 0 else float(mae[k] / mae[-1])}


# ----------------------------------------------------------------------------
# figures

def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path):
    fig.savefig(path, dpi=120)
    _plt().close(fig)
    return path


GROUP_LABELS = {"keys": "key", "values": "value", "tokens": "key or value", "observations": "observation",
                "probabilities": "probability"}
RECIPE_LABELS = {"ln": "LN1 W_K", "ln_centred": "LN1 W_K,\ncentred", "raw": "wte W_K\n(authors')",
                 "value_ln": "LN1 W_V\n(values)"}


def plot_key_frame(stats, matrices, cfg, title, path):
    plt = _plt()
    groups, NH = list(stats["ln"]), cfg.n_heads
    fig = plt.figure(figsize=(2.3 * NH + 6.0, 4.4 * len(groups) + 1.0), layout="constrained")
    grid = fig.add_gridspec(2 * len(groups), NH + 2)
    heat = []
    for g, name in enumerate(groups):
        for r, recipe in enumerate(("ln", "ln_centred")):
            for h in range(NH):
                ax = fig.add_subplot(grid[2 * g + r, h])
                im = ax.imshow(matrices[(recipe, name)][h], cmap="RdBu_r", vmin=-1, vmax=1)
                ax.set_title(f"{GROUP_LABELS[name]} tokens, head {h}{', centred' if r else ''}\n"
                             f"mean|cos| {stats[recipe][name]['mean_abs_offdiag_per_head'][h]:.3f}", fontsize=7)
                ax.set_xlabel(f"{GROUP_LABELS[name]} token", fontsize=6)
                if h == 0:
                    ax.set_ylabel(f"{GROUP_LABELS[name]} token", fontsize=6)
                ax.tick_params(labelsize=5)
                heat.append(ax)
        ax = fig.add_subplot(grid[2 * g:2 * g + 2, NH:])
        for b, (key, label, color) in enumerate((("mean_abs_offdiag", "trained", "C0"),
                                                 ("random_init_mean_abs_offdiag", "random init (5 seeds)", "C1"),
                                                 ("gaussian_mean_abs_offdiag", "random Gaussian vectors", "C7"))):
            ax.bar(np.arange(len(RECIPES)) + 0.27 * (b - 1), [stats[r][name][key] for r in RECIPES],
                   width=0.27, color=color, label=label)
        ax.axhline(stats["ln"][name]["welch_rms_lower_bound"], color="k", ls=":", lw=1,
                   label="Welch bound on RMS cosine")
        ax.set_xticks(np.arange(len(RECIPES)))
        ax.set_xticklabels([RECIPE_LABELS[r] for r in RECIPES], fontsize=7)
        ax.set_ylabel("mean |off-diagonal cosine|")
        ax.set_ylim(0, 1.05)
        s = stats["ln"][name]
        ax.set_title(f"{GROUP_LABELS[name]} tokens: {s['n_tokens']} vectors in R^{s['head_size']} per head, mean over heads",
                     fontsize=8)
        ax.legend(fontsize=7, frameon=False, loc="upper right")
    fig.colorbar(im, ax=heat, shrink=0.5, label="cosine similarity")
    fig.suptitle(f"{title}: layer-0 vectors per token type\nkeys = LN1(wte[tok] + p) W_K + b_K, p = mean position "
                 f"of the type; raw = wte[tok] W_K; values = LN1(wte[tok] + p) W_V + b_V", fontsize=10)
    return _save(fig, path)


def plot_attention_maps(cache, tokens, names, cfg, title, path):
    from matplotlib.colors import PowerNorm
    plt = _plt()
    NH, L = cfg.n_heads, cfg.n_layers
    layers = list(range(L)) if L <= 4 else [0, L // 2, L - 1]      # always the first and the last layer
    T = len(tokens)
    fig, axes = plt.subplots(len(layers), NH, figsize=(3.6 * NH + 1.2, 3.7 * len(layers) + 0.6),
                             squeeze=False, layout="constrained")
    ticks = np.arange(0, T, max(1, -(-T // 40)))                   # every position up to T = 40
    fs = 5 if len(ticks) > 24 else 6
    for r, l in enumerate(layers):
        for h in range(NH):
            ax = axes[r, h]
            im = ax.imshow(cache["layers"][l]["alpha"][0, h], cmap="magma", norm=PowerNorm(0.5, vmin=0, vmax=1))
            ax.set_title(f"layer {l}, head {h}", fontsize=9)
            ax.set_xticks(ticks)
            ax.set_xticklabels([names[t] for t in ticks], rotation=90, fontsize=fs)
            ax.set_yticks(ticks)
            ax.set_yticklabels([names[t] for t in ticks], fontsize=fs)
            ax.set_xlabel("attended position j", fontsize=7)
            if h == 0:
                ax.set_ylabel("query position i", fontsize=7)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6, label="attention weight alpha_ij (square-root scale)")
    fig.suptitle(f"{title}: attention of one held-out sequence, layers {', '.join(map(str, layers))}")
    return _save(fig, path)


def plot_attention_entropy(att, task, cfg, title, path):
    plt = _plt()
    L = len(att["layers"])
    x = np.arange(L)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    H = np.array([l["entropy_bits"] for l in att["layers"]])        # (L, NH)
    M = np.array([l["consistent_mass"] for l in att["layers"]])     # (L, NH)
    for h in range(H.shape[1]):
        axes[0].plot(x, H[:, h], "o-", ms=4, lw=1, alpha=0.7, label=f"head {h}")
        axes[1].plot(x, M[:, h], "o-", ms=4, lw=1, alpha=0.7, label=f"head {h}")
    axes[0].plot(x, H.mean(1), "k-", lw=2.5, label="mean over heads")
    axes[0].axhline(att["uniform_entropy_bits"], color="gray", ls="--", label="uniform causal attention")
    axes[1].axhline(att["uniform_consistent_mass"], color="gray", ls="--", label="uniform causal attention")
    axes[0].set_ylabel("attention entropy at supervised rows (bits)")
    evidence = ("earlier values (eliminated) / the answer if the key repeats" if task != "hmm"
                else "emission column E[:, o_t] of the current observation")
    axes[1].set_ylabel("attention mass on evidence positions")
    axes[1].set_title(f"evidence: {evidence}", fontsize=8)
    axes[0].set_title("attention entropy by layer", fontsize=9)
    axes[0].set_ylim(0, 1.08 * att["uniform_entropy_bits"])
    axes[1].set_ylim(0, 1.02)
    for ax in axes:
        ax.set_xlabel("layer")
        ax.set_xticks(x)
        ax.legend(fontsize=7, frameon=False, loc="lower left")
    fig.suptitle(f"{title}: query-key sharpening (held-out sequences, rows at supervised positions)")
    fig.tight_layout()
    return _save(fig, path)


def plot_manifold(man, xy, title, path, max_points=4000):
    plt = _plt()
    attn_xy, resid_xy, h = xy
    idx = np.random.default_rng(0).permutation(len(h))[:max_points]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for ax, pts, key, name in ((axes[0], attn_xy, "attn_out_last", "last layer attention output"),
                               (axes[1], resid_xy, "residual_final", "final residual stream")):
        s = man[key]
        sc = ax.scatter(pts[idx, 0], pts[idx, 1], c=h[idx], s=5, cmap="viridis", alpha=0.7)
        fmt = lambda r: "n/a" if r is None else f"{r:+.3f}"
        ax.set_title(f"{name}\nPC1 {100 * s['pc1_variance']:.1f}%, PC1+2 {100 * s['pc12_variance']:.1f}% of variance; "
                     f"Spearman(PC1, H) = {fmt(s['spearman_pc1_entropy'])}\ncontrols: Spearman(PC1, position) = "
                     f"{fmt(s['spearman_pc1_position'])}, within-position = {fmt(s['mean_within_position_spearman'])}",
                     fontsize=8)
        ax.set_xlabel("PC1")
        ax.set_ylabel("PC2")
        fig.colorbar(sc, ax=ax, label="posterior entropy H_Bayes (bits)")
    fig.suptitle(f"{title}: the entropy-ordered manifold at supervised positions")
    fig.tight_layout()
    return _save(fig, path)


def plot_logit_lens(lens, title, path):
    plt = _plt()
    n = len(lens["kl_bits"])
    labels = ["embedding"] + [f"after block {l}" for l in range(n - 1)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].semilogy(np.arange(n), np.maximum(lens["kl_bits"], 1e-6), "o-")
    axes[0].set_xticks(np.arange(n))
    axes[0].set_xticklabels(labels, fontsize=8)
    axes[0].set_ylabel("mean KL(posterior || lens) (bits)")
    axes[0].set_xlabel("residual stream read by the lens")
    axes[0].set_title("KL of the lens prediction by layer", fontsize=9)
    pos = np.arange(1, len(lens["bayes_entropy_by_position_bits"]) + 1)
    axes[1].plot(pos, lens["bayes_entropy_by_position_bits"], "k-", lw=3, alpha=0.35, label="exact Bayes")
    for l, hs in enumerate(lens["entropy_by_position_bits"]):
        axes[1].plot(pos, hs, "o-", ms=2.5, lw=1, label=labels[l])
    axes[1].set_xlabel("supervised position (1 = first)")
    axes[1].set_ylabel("predictive entropy, mean over sequences (bits)")
    axes[1].set_title("lens entropy by position", fontsize=9)
    axes[1].legend(fontsize=7, frameon=False)
    fig.suptitle(f"{title}: logit lens (final LayerNorm + unembedding on each residual stream)")
    fig.tight_layout()
    return _save(fig, path)


def plot_ablations(abl, title, path):
    plt = _plt()
    rows = ([("none", abl["baseline"])] + [(f"L{r['layer']}H{r['head']}", r) for r in abl["heads"]]
            + [(f"L{r['layer']} all", r) for r in abl["layers"]])
    names = [n for n, _ in rows]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    worst = abl["hypothesis_frame_head"]["name"]
    colors = ["k"] + ["C3" if n == worst else "C0" for n in names[1:-len(abl["layers"])]] + ["C1"] * len(abl["layers"])
    for ax, key, label in ((axes[0], "kl_bits", "mean KL(posterior || model) (bits)"),
                           (axes[1], "entropy_mae_bits", "entropy MAE, paper metric (bits)")):
        ax.bar(np.arange(len(rows)), [max(r[key], 1e-6) for _, r in rows], color=colors)
        ax.axhline(max(abl["baseline"][key], 1e-6), color="k", ls="--", lw=0.8)
        ax.set_yscale("log")
        ax.set_xticks(np.arange(len(rows)))
        ax.set_xticklabels(names, rotation=90, fontsize=7)
        ax.set_ylabel(label)
        ax.set_xlabel("ablated (none / one head / all heads of a layer)")
    axes[0].set_title(f"red: the hypothesis-frame head {worst} (largest KL increase)", fontsize=9)
    axes[1].set_title("orange: a whole layer's attention removed", fontsize=9)
    fig.suptitle(f"{title}: zero-ablation of attention heads")
    fig.tight_layout()
    return _save(fig, path)


def plot_frame_precision(fp, title, path):
    plt = _plt()
    steps = np.asarray(fp["steps"])
    mid = np.sqrt(steps[1:] * steps[:-1])                           # geometric midpoints of the intervals
    tv = np.asarray(fp["attention_tv_per_layer"])                    # (S-1, L)
    gaps = np.diff(steps)
    fig, axes = plt.subplots(2, 3, figsize=(19, 8.5))
    (a, b, e), (c, d, f) = axes
    for l in range(tv.shape[1]):
        a.loglog(mid, np.maximum(tv[:, l] / gaps, 1e-12), "o-", ms=3, label=f"layer {l}")
    a.loglog(mid, np.maximum(fp["attention_tv_rate"], 1e-12), "k-", lw=2, label="mean over layers")
    a.set_ylabel("attention change per step (TV distance / step)")
    a.set_title("frame: how fast the attention rows move between snapshots", fontsize=9)
    b.loglog(steps, fp["entropy_mae_bits"], "o-", color="C3", ms=3, label="entropy MAE (bits)")
    b.loglog(steps, fp["kl_bits"], "s-", color="C4", ms=3, label="KL (bits)")
    b.set_ylabel("calibration error (bits)")
    b.set_title("precision: calibration against the exact posterior", fontsize=9)
    twin = b.twinx()
    twin.semilogx(steps, [np.nan if r is None else r for r in fp["abs_spearman_pc1_entropy"]], "^-",
                  color="C2", ms=3, label="|Spearman(PC1, H)|, final residual")
    twin.set_ylabel("|Spearman(PC1 of final residual, H_Bayes)|")
    twin.set_ylim(0, 1.05)
    mass = np.asarray(fp["consistent_mass"])                        # (S, L)
    for l in range(mass.shape[1]):
        c.semilogx(steps, mass[:, l], "o-", ms=3, label=f"layer {l}")
    c.set_ylabel("attention mass on evidence positions (mean over heads)")
    c.set_title("frame, functionally: routing onto the evidence", fontsize=9)
    d.semilogx(steps, fp["frame_progress"], "o-", color="k", ms=3,
               label="frame: 1 - TV(attention, last) / TV(first, last)")
    d.semilogx(steps, fp["precision_progress"], "o-", color="C3", ms=3,
               label="precision: fraction of the log10 entropy-MAE drop")
    d.axhline(0.9, color="gray", lw=0.8)
    d.set_ylabel("progress from first to last snapshot")
    d.set_title("progress (0 = first snapshot, 1 = last)", fontsize=9)
    au = fp["authors"]                                              # the authors' reading: frame overlap vs calibration
    gain = "n/a" if au["calibration_gain_after_plateau"] is None else f"{au['calibration_gain_after_plateau']:.3g}"
    e.semilogx(steps, au["ratio_to_chance"], "o-", color="k", ms=3, label="frame overlap with the last, x chance")
    e.axhline(au["ratio_ceiling"], color="gray", ls=":", lw=1, label=f"ceiling {au['ratio_ceiling']:.2f}x (= C / rank)")
    e.axhline(1.0, color="gray", lw=0.8)
    if au["frame_plateau_step"] is not None:
        e.axvline(au["frame_plateau_step"], color="C2", ls="--", lw=1,
                  label=f"plateau ({au['frame_plateau_step']}), then calibration x{gain}")
    e.set_ylabel("projection overlap / a random subspace's")
    e.set_title("the authors' frame: span of LN1(wte[h]), h the hypotheses", fontsize=9)
    twin_e = e.twinx()
    twin_e.loglog(steps, fp["entropy_mae_bits"], "s-", color="C3", ms=3, label="entropy MAE (bits)")
    twin_e.set_ylabel("calibration: entropy MAE (bits)")
    h1, l1 = e.get_legend_handles_labels()
    h2, l2 = twin_e.get_legend_handles_labels()
    e.legend(h1 + h2, l1 + l2, fontsize=7, frameon=False, loc="center left")
    f.axis("off")
    f.text(0, 0.9, "the authors (their checkpoints, Jacobian-lens subspaces):\n" + AUTHORS_NUMBERS["frame_precision"]
           + f"\n\nthis run: {au['ratio_nearest_300']:.2f}x chance at step {au['step_nearest_300']},\nplateau at step "
           f"{au['frame_plateau_step']}, calibration x{gain} after it", va="top",
           fontsize=9, wrap=True)
    for ax in (a, b, c, d, e):
        ax.set_xlabel("training step")
        for key, ls, name in (("frame_settle_step", "--", "frame settles"),
                              ("precision_settle_step", ":", "precision settles")):
            if fp[key] is not None:
                ax.axvline(fp[key], color="k", ls=ls, lw=1, label=f"{name} ({fp[key]})")
    for ax in (a, c, d):
        ax.legend(fontsize=7, frameon=False, loc="upper left")
    h1, l1 = b.get_legend_handles_labels()
    h2, l2 = twin.get_legend_handles_labels()
    b.legend(h1 + h2, l1 + l2, fontsize=7, frameon=False, loc="lower left")
    fig.suptitle(f"{title}: frame-precision dissociation\n(a series settles at the first snapshot after which its "
                 f"change per step stays < {SETTLE_FRACTION:g} x its maximum)")
    fig.tight_layout()
    return _save(fig, path)


# ----------------------------------------------------------------------------
# everything

DEFINITIONS = {
    "key_frame": "layer 0, per head: key_tok = LN1(wte[tok] + p) @ W_K[:, head] + b_K[head], p = the mean "
                 "positional term over the positions where tokens of that type occur ('ln'); 'ln_centred': the "
                 "same minus its mean over the type's tokens (softmax ignores a shift shared by all keys); "
                 "'raw': the authors' wte[tok] @ W_K[:, head]; 'value_ln': the value vectors "
                 "LN1(wte[tok] + p) @ W_V[:, head] + b_V[head]. Statistic: mean |cosine| over off-diagonal "
                 "token pairs, mean over heads. Baselines: the same recipe on init_params of the same config "
                 f"(seeds {RANDOM_INIT_SEEDS}), and iid N(0, I_hs) vectors ({GAUSSIAN_DRAWS} draws). HMM "
                 "probability tokens: those occurring in the probe headers. Welch bound: the least possible RMS "
                 "off-diagonal cosine of n unit vectors in R^hs.",
    "attention_entropy": "entropy (bits) of attention rows at supervised positions, mean over sequences and rows; "
                         "uniform = log2(i + 1) at query position i (0-based); reduction = 1 - H / H_uniform.",
    "consistent_mass": "bijection: at a key, the attention on the value positions right after earlier occurrences "
                       "of the same key (they hold the answer) if the key repeats, else on every earlier value "
                       "position (each holds an eliminated value); rows without such positions (the first key) "
                       "are excluded. HMM: at observation o_t, the mass on the five header positions of "
                       "E[s, o_t], s = 0..4 (the likelihood column of the current observation); "
                       "observation_mass: on positions 52..t; transition_mass: on the T entries.",
    "manifold": "PCA (centred, SVD) of the rows at supervised positions; Spearman of PC1 with the exact posterior "
                "entropy; controls: Spearman with the position, mean within-position Spearman where H varies.",
    "logit_lens": "final LayerNorm + unembedding applied to the residual stream before block 0 (embedding) and "
                  "after every block; KL(posterior || lens) in bits.",
    "ablations": "a head's output (before W_o, so b_o stays) set to zero via forward's head_mask; the hypothesis-"
                 "frame head is the single head whose removal raises the KL most.",
    "frame_precision": f"snapshots runs/<name>/snapshots/step_*.npz on the first {SNAPSHOT_SEQS} probe sequences "
                       "(fewer for long sequences: see probe_sequences). Frame change = mean TV distance between "
                       "attention rows (all query rows) of consecutive snapshots, per layer, divided by the steps "
                       "between them. A series settles at the first snapshot step after which its per-step change "
                       f"stays below {SETTLE_FRACTION:g} x its maximum; frame series = mean over layers, precision "
                       "series = |change of log10 entropy MAE| per step. Second rule (90pct): progress from the "
                       "first to the last snapshot (frame: 1 - TV to the last attention / the same at the first "
                       "snapshot; precision: fraction of the log10 entropy-MAE drop) stays >= 0.9 from then on.",
}


AUTHORS_DEFINITIONS = {
    "key_frame": "layer 0, each head separately: key_h = LN1(wte[h]) @ W_K[:, head] for the hypothesis tokens h "
                 "(bijection: the value tokens; sawtooth: all V tokens; HMM: the 5 observation tokens), no "
                 "positional term and no bias b_K; statistic: mean |off-diagonal cosine| per head; beside it the "
                 f"same at random initialisation (init_params, seeds {RANDOM_INIT_SEEDS}) and the Welch bound on "
                 "the RMS cosine (orthogonality needs head size >= number of hypotheses).",
    "manifold": "the final hidden state after the final LayerNorm at the positions that predict a value (the "
                "sawtooth's query left out); centred PCA; Pearson r of PC1..PC5 with H_Bayes (best |r|); R^2 of "
                "the least-squares fit of H_Bayes on the top 5 PC scores (in sample); PC1's share of the "
                "variance. Controls (ours): R^2 of H_Bayes on the position alone, and the mean within-position "
                "R^2 of the same fit over positions where H_Bayes varies.",
    "frame_head": "the single head (any layer) whose zero-ablation raises the paper's entropy MAE most, and the "
                  "ratio of its increase to the second-largest.",
    "frame_precision": "frame = span of LN1(wte[h]) over the hypotheses (the authors' 'embedding' frame) of each "
                       f"snapshot, its top {AUTHORS_FRAME_RANK} directions; overlap with the last snapshot's "
                       "whole frame W = ||U^T W||_F^2 / min(rank U, rank W); ratio to chance = overlap / "
                       "the expected overlap of a uniformly random subspace of the same rank (rank W / C). The "
                       "authors compare their Jacobian-lens subspaces (not computed here) with the final frame "
                       "the same way. Plateau: the first snapshot from which the ratio stays >= 90% of its last "
                       "value; calibration gain after it: entropy MAE at the plateau / at the last snapshot.",
}
AUTHORS_NUMBERS = {   # what the authors report (shared/PAPERS.md), for the side-by-side table
    "key_frame": "their checkpoint (format a, head size 32): 0.43-0.49 trained, 0.13-0.17 at random init",
    "manifold": "PC1 above 80% of the variance expected; strong |r| with H_Bayes",
    "frame_head": "removing layer 0 or a single hypothesis-frame head collapses calibration",
    "frame_precision": "2.3x chance by step 300, a plateau near 6x by step 2,500, while calibration improves "
                       "about 40x (0.03 -> 0.0008 bits)",
}


def plain(obj):
    """numpy scalars and arrays -> JSON types; non-finite floats -> None."""
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return plain(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    return obj


def analyze(checkpoint_path, fig_dir="figures", n_seqs=500, seed=0, threads=1):
    """All six probes of one checkpoint: figures into fig_dir, numbers into geometry.json beside the
    checkpoint; returns the same dict. threads: Numba threads while it runs (restored after)."""
    import numba
    prev_threads = numba.get_num_threads()
    numba.set_num_threads(max(1, min(threads, prev_threads)))
    try:
        return _analyze(checkpoint_path, fig_dir, n_seqs, seed)
    finally:
        numba.set_num_threads(prev_threads)


def _analyze(checkpoint_path, fig_dir, n_seqs, seed):
    params, cfg, meta, _ = ba.load_checkpoint(checkpoint_path)
    if not isinstance(cfg, ba.Config):
        raise ValueError(f"{checkpoint_path!r} is not a transformer checkpoint")
    task = task_of(cfg, meta)
    run_dir = os.path.dirname(os.path.abspath(checkpoint_path))
    run = os.path.basename(run_dir)
    title = f"{run} ({task})"
    os.makedirs(fig_dir, exist_ok=True)
    fig = lambda name: os.path.join(fig_dir, f"geometry_{run}_{name}.png")

    batch = probe_batch(task, cfg, n_seqs, seed)
    _, cache = ba.forward(params, batch["tokens"], cfg)

    frame, matrices = key_frame_probe(params, cfg, task, batch["tokens"])
    att = attention_probe(cache, batch, task, cfg)
    man, xy = manifold_probe(cache, batch)
    lens = logit_lens(params, cache, batch)
    abl = ablations(params, cfg, batch)
    T = batch["tokens"].shape[1]
    n_snap = min(SNAPSHOT_SEQS, max(16, int(SNAPSHOT_FLOATS / (cfg.n_layers * cfg.n_heads * T * T))))
    small = {k: v[:n_snap] for k, v in batch.items()}
    fp = frame_precision(run_dir, cfg, small, task)

    figures = [plot_key_frame(frame, matrices, cfg, title, fig("key_frame")),
               plot_attention_maps(cache, batch["tokens"][0], token_names(task, cfg, batch["tokens"][0]), cfg,
                                   title, fig("attention_maps")),
               plot_attention_entropy(att, task, cfg, title, fig("attention_entropy")),
               plot_manifold(man, xy, title, fig("value_manifold")),
               plot_logit_lens(lens, title, fig("logit_lens")),
               plot_ablations(abl, title, fig("ablations"))]
    if fp is not None:
        figures.append(plot_frame_precision(fp, title, fig("frame_precision")))

    authors = {"key_frame": authors_key_frame(params, cfg, task), "manifold": man["authors"],
               "frame_head": abl["authors_frame_head"], "frame_precision": fp["authors"] if fp else None}
    out = plain({
        "checkpoint": os.path.abspath(checkpoint_path), "task": task,
        "step": meta.get("step"), "config": cfg.to_dict(), "probe_sequences": n_seqs, "probe_seed": seed,
        "authors": authors, "authors_definitions": AUTHORS_DEFINITIONS, "authors_numbers": AUTHORS_NUMBERS,
        "definitions": DEFINITIONS,
        "key_frame": frame, "attention": att, "manifold": man, "logit_lens": lens, "ablations": abl,
        "frame_precision": fp, "figures": figures})
    with open(os.path.join(run_dir, "geometry.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


def summary(g):
    """A few lines for the terminal: the authors' definitions first, then ours."""
    a, lines = g["authors"], ["the authors' definitions:"]
    k = a["key_frame"]
    lines.append(f"  layer-0 keys of the {k['hypotheses']} hypotheses, mean|cos| per head "
                 f"{', '.join(f'{c:.3f}' for c in k['per_head'])} (random init {k['random_init_mean']:.3f}; "
                 f"head size {k['head_size']}, Welch RMS bound {k['welch_rms_lower_bound']:.3f})")
    m = a["manifold"]
    fmt = lambda x: "n/a" if x is None else f"{x:.3f}"
    lines.append(f"  final hidden state: PC1 {m['pc1_variance']:.3f} of the variance, best |Pearson| "
                 f"{fmt(m['best_abs_pearson'])} (PC{m['best_pc']}), R^2 top-5 PCs {fmt(m['r2_top5'])}; position "
                 f"alone R^2 {fmt(m['r2_position_only'])}, within-position R^2 {fmt(m['mean_within_position_r2_top5'])}")
    h = a["frame_head"]
    lines.append(f"  frame head by entropy MAE: {h['name']} (+{h['delta_entropy_mae_bits']:.3g} bits), "
                 f"{fmt(h['ratio_to_second'])}x the second ({h['second']})")
    f = a["frame_precision"]
    if f:
        lines.append(f"  frame overlap with its final version: {f['ratio_nearest_300']:.2f}x chance at step "
                     f"{f['step_nearest_300']}, plateau at step {f['frame_plateau_step']} "
                     f"({fmt(f['ratio_at_plateau'])}x, ceiling {f['ratio_ceiling']:.2f}x); calibration improves "
                     f"{fmt(f['calibration_gain_after_plateau'])}x after it")
    lines.append("ours:")
    for recipe, groups in g["key_frame"].items():
        for name, s in groups.items():
            lines.append(f"layer-0 frame {recipe:>10} {name:>13}: mean|cos| trained {s['mean_abs_offdiag']:.3f}, "
                         f"random init {s['random_init_mean_abs_offdiag']:.3f}, "
                         f"Gaussian {s['gaussian_mean_abs_offdiag']:.3f}")
    lines.append("attention entropy by layer (bits): " + ", ".join(
        f"{l['entropy_bits_mean']:.2f}" for l in g["attention"]["layers"])
                 + f" (uniform {g['attention']['uniform_entropy_bits']:.2f})")
    for key in ("attn_out_last", "residual_final"):
        m = g["manifold"][key]
        lines.append(f"manifold {key}: PC1 {m['pc1_variance']:.3f}, PC1+2 {m['pc12_variance']:.3f}, "
                     f"Spearman(PC1, H) {m['spearman_pc1_entropy']}")
    lines.append("logit-lens KL by layer (bits): " + ", ".join(f"{k:.3g}" for k in g["logit_lens"]["kl_bits"]))
    a = g["ablations"]
    worst = next(h for h in a["heads"] if f"L{h['layer']}H{h['head']}" == a["hypothesis_frame_head"]["name"])
    lines.append(f"ablation: hypothesis-frame head {a['hypothesis_frame_head']['name']}: KL "
                 f"{a['baseline']['kl_bits']:.3g} -> {worst['kl_bits']:.3g} bits, entropy MAE "
                 f"{a['baseline']['entropy_mae_bits']:.3g} -> {worst['entropy_mae_bits']:.3g} bits")
    fp = g["frame_precision"]
    if fp:
        lines.append(f"frame settles at step {fp['frame_settle_step']} (per layer {fp['frame_settle_step_per_layer']}), "
                     f"precision at step {fp['precision_settle_step']}; 90% progress: frame {fp['frame_90pct_step']}, "
                     f"precision {fp['precision_90pct_step']}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])

    def fail(msg):                                   # one clear line, exit code 2, no usage dump
        print(f"manifold.py: error: {msg}", file=sys.stderr)
        sys.exit(2)
    p.error = fail
    p.add_argument("checkpoint", help="runs/<name>/checkpoint.npz")
    p.add_argument("--figures", default="figures", help="where the geometry_*.png figures go")
    p.add_argument("--n-seqs", type=int, default=500, help="held-out probe sequences")
    p.add_argument("--seed", type=int, default=0, help="seed of the probe sequences")
    args = p.parse_args(argv)
    if args.n_seqs < 2:
        p.error(f"--n-seqs {args.n_seqs}: must be at least 2")
    try:
        g = analyze(args.checkpoint, args.figures, args.n_seqs, args.seed)
    except ValueError as e:
        p.error(str(e))
    except OSError as e:
        p.error(f"--figures {args.figures!r} cannot be written ({e.strerror})")
    print(summary(g))
    print(f"wrote {os.path.join(os.path.dirname(os.path.abspath(args.checkpoint)), 'geometry.json')} "
          f"and {len(g['figures'])} figures in {args.figures}/")
    return g


if __name__ == "__main__":
    main()
