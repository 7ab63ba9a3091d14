"""The geometry of Bayesian attention (Paper I): six probes of a trained wind-tunnel transformer, each a
function from a model's parameters and activations to numbers. geometry.py runs them on a checkpoint.

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

import math  # noqa: E402

import numpy as np  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

import bayesattn as ba  # noqa: E402
import windtunnels as wt  # noqa: E402
from evaluation import calibration as _calibration, scored_columns  # noqa: E402

PROBE_SEED = 2_000_003      # held-out stream of the probes (training draws default_rng((seed, step)))
HMM_K = 20                  # observations per HMM probe sequence (the training length)
RANDOM_INIT_SEEDS = (101, 102, 103, 104, 105)  # untrained baselines of the key frame
GAUSSIAN_DRAWS = 50         # draws of random Gaussian vectors for the key-frame baseline
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
    """Positions the probes read (the same in every row): those of the paper's curve, every supervised
    position but the sawtooth's final query (evaluation.scored_columns): (P,) int."""
    return scored_columns(batch)[0]


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
#   "authors"     LN1(wte[tok]) @ W_K[:, head]: the authors' definition (no position, no bias),
#                 the same keys as authors_keys below
#   "value_ln"    value vectors LN1(wte[tok] + p) @ W_V[:, head] + b_V[head]: what attention adds up
RECIPES = ("ln", "ln_centred", "authors", "value_ln")


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
    if recipe == "authors":
        k = token_frame(params, tokens) @ params[pre + "attn.wk"].astype(np.float64)   # (n, C), no p, no b_K
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


def constant(a):
    """True when a varies by less than rounding: every entropy of a position equal up to 1e-9 bits."""
    return np.ptp(a) <= 1e-9 * max(1.0, float(np.abs(a).max()))


def spearman(a, b):
    """Spearman rank correlation; None when either side is constant (up to rounding, see constant())."""
    if constant(a) or constant(b):
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
    if constant(a) or constant(b):
        return None
    a, b = np.asarray(a, np.float64) - np.mean(a), np.asarray(b, np.float64) - np.mean(b)
    return float(a @ b) / math.sqrt(float(a @ a) * float(b @ b))


def r_squared(X, y):
    """R^2 of the least-squares fit y ~ X w + c (in sample, so in [0, 1]); None when y is constant."""
    if constant(y):
        return None
    A = np.c_[X, np.ones(len(X))]
    w = np.linalg.lstsq(A, y, rcond=None)[0]
    return 1.0 - float(((y - A @ w) ** 2).sum()) / float(((y - y.mean()) ** 2).sum())


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


# ----------------------------------------------------------------------------
# probe 4: logit lens, the final LayerNorm and unembedding applied to every residual stream

def lens_proba(params, x):
    """Residual stream x (..., C) -> predictive distribution (..., K) of the final LN + unembedding."""
    xf, _ = ba.layernorm_forward(x, params["lnf.g"], params["lnf.b"])
    return ba.softmax.numpy((xf @ params["unembed.w"] + params["unembed.b"]).astype(np.float64))


def calibration(q, post):
    """q, post (n, P, K) -> the paper's entropy MAE and the KL, in bits (evaluation.calibration)."""
    c = _calibration(q, post)[0]
    return {"entropy_mae_bits": c["entropy_mae_bits"], "kl_bits": c["kl_bits"]}


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
    return calibration(ba.softmax.numpy(logits[:, cols].astype(np.float64)), batch["posterior"][:, cols])


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
# probe 6 (formation.py): one snapshot, measured

def snapshot_state(params, cfg, batch, task):
    """-> attention (per layer, (n, NH, T, T)), a dict of numbers: calibration, per-layer attention
    entropy and evidence mass (probe 2, mean over heads), |Spearman(PC1 of final residual, H)|."""
    cols = supervised_columns(batch)
    logits, cache = ba.forward(params, batch["tokens"], cfg)
    post = batch["posterior"][:, cols]
    state = calibration(ba.softmax.numpy(logits[:, cols].astype(np.float64)), post)
    att = attention_probe(cache, batch, task, cfg)
    state["attention_entropy_bits"] = [l["entropy_bits_mean"] for l in att["layers"]]
    state["consistent_mass"] = [float(np.mean(l["consistent_mass"])) for l in att["layers"]]
    stats, _ = manifold_stats(cache["resid"][-1][:, cols].reshape(-1, cfg.d_model).astype(np.float64),
                              wt.entropy_bits(post).reshape(-1))
    state["abs_spearman_pc1_entropy"] = stats["abs_spearman_pc1_entropy"]
    return [lc["alpha"] for lc in cache["layers"]], state
