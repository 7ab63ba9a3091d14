"""The geometry of Bayesian attention (Paper I): the probes of a trained wind-tunnel transformer, each a
function from a model's parameters and activations to numbers, and beside every headline statistic the
controls that could carry it instead of the claim. geometry/run.py runs them on a checkpoint; DEFINITIONS
below is the one place where every probe and control is defined (geometry.json carries it). The
statistics they share (PCA, correlations, held-out readouts, dominance) are in geometry/measures.py.

The claims and their probes:
  1. key_frame        stage 1: layer-0 keys of the hypothesis tokens are near-orthogonal
                      controls: random initialisation, the keys' shared offset, their participation ratio
  2. attention_probe  stage 2: attention entropy falls layer by layer, mass moves onto the evidence
     query_swap       controls: mass on a sink (position 0), the rows it carries, and how much a row moves
                      when only its query changes against how much rows of different sequences differ
  3. manifold_probe   stage 3: late representations lie on a curve ordered by posterior entropy
                      controls: the per-position norm (one position can hold PC1), unit rows, the rows
                      where H_Bayes is graded against a binary split, and cross-validated linear readouts
                      of H_Bayes from the representation, from the position alone and from the split alone
  4. logit_lens       the belief is refined layer by layer in the residual stream
  5. ablations        removing one head (by zero, the mean at each position, the overall mean, or another
                      sequence's output), scored by KL and by the paper metric
  6. geometry/formation.py     across training snapshots: the frame settles before the calibration; controls: the
                      initialisation's overlap with the final frame, and the overlap of the change since it

Notation: n sequences, T tokens per sequence, P answer positions per sequence (cols), C width, NH heads,
hs = C / NH head size, L layers, K output classes, N = n P rows. Entropies, KL divergences and calibration
errors are in bits. Every probe reads held-out sequences drawn from default_rng((PROBE_SEED, seed)), a
stream training never uses. What a task contributes (its hypothesis tokens, evidence positions, the rows
where H_Bayes is graded, the query swap) comes from its module (tasks.TASKS, PROBE_HOOKS).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see layers.py: BLAS threads fight Numba's


import numpy as np  # noqa: E402

import bayesattn as ba  # noqa: E402
import layers as ly  # noqa: E402
from geometry import measures as ms  # noqa: E402
from tunnels import tasks  # noqa: E402
from tunnels import windtunnels as wt  # noqa: E402
from evaluation import answers, calibration as _calibration  # noqa: E402

PROBE_SEED = 2_000_003      # held-out stream of the probes (training draws default_rng((seed, step)))
RANDOM_INIT_SEEDS = (101, 102, 103, 104, 105)  # untrained baselines of the key frame and the frame overlap
GAUSSIAN_DRAWS = 50         # draws of random Gaussian vectors for the key-frame baseline
AUTHORS_FRAME_RANK = 8      # the snapshot side of the frame overlap: its top 8 directions (the authors' rank)
SINK_MASS = 0.5             # a sink row puts more than half its attention on position 0
SWAP_SEQS = 200             # probe sequences of the query swap
ABLATIONS = ("zero", "position_mean", "mean", "resample")
PROBE_HOOKS = ("hypothesis_tokens", "token_groups", "token_names", "evidence_masks", "row_split", "graded_rows",
               "swap_query")


DEFINITIONS = {
    # --- the data
    "probe_data": "n held-out sequences of the run's task and settings from default_rng((PROBE_SEED, seed)); the "
                  "answer rows are every supervised position but those scored apart (the sawtooth's final "
                  "query), the same positions in every row.",
    "dominance": f"a position (token, head) dominates a statistic when its value (a mean row norm, a share) is "
                 f"more than {ms.DOMINANCE:g}x the median over positions (tokens, heads); the statistic is then "
                 f"also reported without it.",
    # --- stage 1
    "key_frame": "layer 0, per head: key_tok = LN1(wte[tok] + p) @ W_K[:, head] + b_K[head], p = the mean "
                 "positional term over the positions where tokens of that type occur ('ln'); 'ln_centred': the "
                 "same minus its mean over the type's tokens (softmax ignores a shift shared by all keys); "
                 "'authors': LN1(wte[tok]) @ W_K[:, head] (no position, no bias); 'value_ln': the value vectors "
                 "LN1(wte[tok] + p) @ W_V[:, head] + b_V[head]. Statistic: mean |cosine| over off-diagonal "
                 "token pairs, mean over heads. Baselines: the same recipe on init_params of the same config "
                 f"(seeds {RANDOM_INIT_SEEDS}), and iid N(0, I_hs) vectors ({GAUSSIAN_DRAWS} draws). Welch bound: "
                 "the least possible RMS off-diagonal cosine of n unit vectors in R^hs.",
    "key_offset": "per head, offset_norm = |mean of the keys over the type's tokens|, deviation_norm = mean over "
                  "tokens of |key - that mean|; an offset much larger than the deviations makes every cosine "
                  "near 1 whatever the deviations do ('ln_centred' removes it).",
    "participation_ratio": "(sum lambda)^2 / sum lambda^2 of the eigenvalues of the keys' Gram matrix (uncentred "
                           "and centred over tokens), per head: the number of directions the keys effectively "
                           "span (n for n orthogonal keys of equal norm, 1 for keys on a line).",
    # --- stage 2
    "attention_entropy": "entropy (bits) of attention rows at the answer rows, mean over sequences and rows; "
                         "uniform = log2(t + 1) at query position t (0-based); reduction = 1 - H / H_uniform.",
    "consistent_mass": "the attention mass on the evidence positions of each answer row (the task's "
                       "evidence_masks): bijection and sawtooth: the value after an earlier occurrence of the key "
                       "if it repeats, else every earlier value; HMM: the five header entries E[s, o_t] of the "
                       "current observation. Rows without evidence positions are left out.",
    "sink": f"position 0. sink_mass: mean attention on it over the answer rows with t > 0 (row 0 has no choice); "
            f"a sink row puts more than {SINK_MASS:g} of its mass there; sink_row_share: the share of head-rows "
            f"that are sink rows; sink_share_of_entropy_drop: the sink rows' share of sum (H_uniform - H); "
            f"entropy_reduction_without_sink_rows: the reduction over the other rows; the same per head, with its "
            f"standard error over the probe sequences (a ratio of per-sequence sums, by linearisation), and the "
            f"sink rows' share of each head's drop.",
    "query_swap": f"on {SWAP_SEQS} probe sequences, for each answer position t > 0: the token at t is replaced "
                  "by another of the same standing (bijection/sawtooth: another key not seen before t for a new "
                  "key, another seen key for a seen one; HMM: another observation symbol), the prefix up to t is "
                  "run again, and the attention row at t compared with the original by total variation (TV = "
                  "1/2 sum |a - b|), per layer and head. Against it: the TV between the rows at t of two "
                  "different sequences (each with the next). ratio = swap TV / between-sequence TV: near 0, "
                  "the row does not depend on the query (a fixed preference); near 1, as much as on the sequence. "
                  "ratio_se: its standard error per head from those of the two means (rows treated as independent).",
    "monotone": "entropy reduction non-decreasing from each layer to the next.",
    # --- stage 3
    "manifold": "PCA (centred, SVD) of the rows at the answer positions; Spearman of PC1 with the exact posterior "
                "entropy; controls: Spearman with the position, the mean within-position Spearman over the "
                "positions where H varies.",
    "position_norm": "mean |row| of the representation at each answer position; pc1_variance_without_dominant: "
                     "PC1's share refit without the dominating positions (see dominance); pc1_variance_unit_rows: "
                     "PC1's share with every row scaled to norm 1.",
    "graded_rows": "the rows where H_Bayes is graded rather than fixed by a binary split (the task's graded_rows): "
                   "the sawtooth's new keys (H = log2(V - m)); every row of the bijection and the HMM. "
                   "within_position_spearman_graded: the within-position Spearman(PC1, H) on those rows only "
                   "(PC1 of all rows); graded_refit: the PCA refit on those rows.",
    "split": "the task's binary split of the rows (row_split; the sawtooth: key seen before, H = 0, or new), "
             "Spearman(PC1, split), and within_position_r2_h_by_split: the mean over positions of the R^2 of "
             "H_Bayes on the split alone (in sample).",
    "readout": f"held-out R^2 of a ridge readout H_Bayes ~ X w + c (X's columns standardised on the training "
               f"folds; ridge {ms.READOUT_RIDGE:g} x the mean eigenvalue of the standardised X^T X), {ms.READOUT_FOLDS} "
               f"folds split by sequence (sequence i in fold i mod {ms.READOUT_FOLDS}); R^2 = 1 - sum (H - H_pred)^2 "
               "/ sum (H - mean H)^2 over every row, each predicted by the fit without its sequence. Per layer: "
               "the residual stream entering block 0 (the embedding), after each block, and after the final "
               "LayerNorm. Beside it, the same readout from the position alone (one-hot), from the split alone, "
               "and from both; each on all rows and on the graded rows; and from the model's own predictive distribution "
               "(output_entropy: its entropy, one column; output_log_probs: its log-probabilities), beyond the "
               "position: what the output gives without any geometry. readout_partial_r2: what X adds beyond "
               "the position, (R^2([X, position]) - R^2(position)) / (1 - R^2(position)), both held out; none "
               f"where the position leaves less than {ms.POSITION_LEAVES:g} of H's variance. Each partial readout "
               "keeps its folds (<key>_folds: each fold's held-out sum of squared residuals with X and the "
               "position, and with the position alone), so a verdict reads its fold-to-fold standard error "
               "(measures.partial_from_folds, partial_difference).",
    # --- probe 4
    "logit_lens": "final LayerNorm + unembedding applied to the residual stream before block 0 (embedding) and "
                  "after every block; KL(posterior || lens) in bits.",
    # --- probe 5
    "ablations": "a head's output (before W_o, so b_o stays) replaced, one head (or one layer's heads) at a time: "
                 "'zero'; 'position_mean': its mean over the probe sequences at each position; 'mean': its mean "
                 "over sequences and positions; 'resample': the output of the next probe sequence (a derangement). "
                 "Each scored by the KL and by the paper metric (entropy MAE), and their changes. uniform_kl_bits: "
                 "the KL of a uniform guess on the same rows (= log2 K - mean H_Bayes). heads_above_uniform: the "
                 "heads whose removal costs more KL than that guess. delta_kl_se_bits: the standard error of the "
                 "KL change over the probe sequences (paired: each sequence's change).",
    # --- probe 6
    "frame_precision": "snapshots runs/<name>/snapshots/step_*.npz. Ours: attention rows of consecutive snapshots "
                       "(TV per step) against |change of log10 entropy MAE| per step; a series settles at the first "
                       "snapshot after which its change stays below a tenth of its maximum. 90pct: the first "
                       "snapshot after which progress from the first to the last snapshot stays >= 0.9.",
    "frame_change": "F = LN1(wte[h]) over the hypothesis tokens h (n, C); F_0 the same at the run's initialisation "
                    "(init_params rebuilt from the checkpoint's config and seed). The change D_s = F_s - F_0. "
                    f"Overlap of the top {AUTHORS_FRAME_RANK} right singular directions of D_s with the span of D_last, "
                    "as a multiple of a random subspace's (projection overlap, as the authors'); plateau and "
                    "calibration gain as the authors' reading. init_ratio: the authors' overlap of F_0 itself with "
                    "the final frame; other_init_ratio: the same for initialisations of other seeds; "
                    "final_energy_in_init_span: |F_last projected on span F_0|^2 / |F_last|^2 (chance: rank / C). "
                    "Gains after the plateau p by the paper metric and by the KL (value at p / at the last "
                    "snapshot); stillness: |F_last - F_p|_F / |F_p - F_0|_F, how far the frame moves after its "
                    "plateau against before it. blocks (specificity): the same measurement (plateau, gains, "
                    "stillness) on every 2-D weight block of the model, each as rows in the larger of its two "
                    "dimensions, against the run's initialisation.",
    # --- the verdicts
    "verdicts": "geometry.verdicts: each claim's headline beside its controls and the rule that decides it "
                "(written with each verdict).",
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
                "R^2 of the same fit over positions where H_Bayes varies, also on the graded rows only.",
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
AUTHORS_NUMBERS = {   # what the authors report, for the side-by-side table
    "key_frame": "their checkpoint (format a, head size 32): 0.43-0.49 trained, 0.13-0.17 at random init",
    "manifold": "PC1 above 80% of the variance expected; strong |r| with H_Bayes",
    "frame_head": "removing layer 0 or a single hypothesis-frame head collapses calibration",
    "frame_precision": "2.3x chance by step 300, a plateau near 6x by step 2,500, while calibration improves "
                       "about 40x (0.03 -> 0.0008 bits)",
}


# ----------------------------------------------------------------------------
# the probe data: held-out sequences with exact posteriors

def task_of(cfg, meta):
    """-> the task of a checkpoint, from its meta (older checkpoints: from the vocabulary)."""
    from tunnels import hmm
    task = meta.get("task") or ("hmm" if cfg.vocab_size == hmm.VOCAB else "bijection")
    if task not in tasks.TASKS or meta.get("replacement"):
        raise ValueError(f"task {task!r}{' with replacement' if meta.get('replacement') else ''}: the geometry "
                         f"probes read the tasks {', '.join(tasks.TASKS)}")
    return task


def task_module(task, *hooks):
    """The task's module, with the hooks a probe reads; ValueError in one line naming one it lacks
    (geometry/run.py skips the probes a task cannot feed before it calls them)."""
    mod = tasks.task(task)
    missing = [h for h in hooks if not hasattr(mod, h)]
    if missing:
        raise ValueError(f"task {task!r} does not provide {missing[0]}, which this probe reads")
    return mod


def probe_settings(task, cfg, meta=None):
    """The run's task settings: its meta's, else what its config implies (older checkpoints)."""
    return tasks.settings_from(task, cfg, meta)


def probe_batch(task, cfg, n, seed, settings=None):
    """n held-out sequences of the task itself (no curriculum), shaped like the run's training data."""
    s = tasks.settings(task, settings or probe_settings(task, cfg))
    return tasks.sample(task, np.random.default_rng((PROBE_SEED, seed)), n, s)


def supervised_columns(batch):
    """Positions the probes read: the answers of the paper's curve (evaluation.answers: every supervised
    position but those scored apart, like the sawtooth's final query), the same in every row: (P,) int.
    ValueError in one line for a batch whose rows have their answers elsewhere (the probes compare rows
    position by position)."""
    positions, valid = answers(batch)
    if not (valid.all() and np.all(positions == positions[0])):
        raise ValueError("the geometry probes need the answers at the same positions in every row; this task's "
                         "rows have them at different positions")
    return positions[0]


def token_names(task, cfg, tokens):
    return task_module(task, "token_names").token_names(cfg, tokens)


def position_table(params, cfg, T):
    """The positional term added to the token embeddings: (T, C), exactly as the model's forward adds it."""
    return ba.position_table(params, cfg, T).astype(np.float64)


# ----------------------------------------------------------------------------
# probe 1: the orthogonal hypothesis frame (stage 1), per layer-0 head and token type
RECIPES = ("ln", "ln_centred", "authors", "value_ln")


def token_frame(params, tokens):
    """LN1 of layer 0 applied to the bare token embeddings: (n, C), no positional term."""
    x = params["wte"][tokens].astype(np.float64)                    # (n, C)
    h, _ = ly.layernorm_forward(x, params["blocks.0.ln1.g"].astype(np.float64),
                                params["blocks.0.ln1.b"].astype(np.float64))
    return h


def layer0_vectors(params, cfg, tokens, p, recipe="ln"):
    """Per-token layer-0 keys (or values) of every head: tokens (n,), p (C,) -> (NH, n, hs)."""
    pre, NH = "blocks.0.", cfg.n_heads
    x = params["wte"][tokens].astype(np.float64)                    # (n, C)
    if recipe == "authors":
        k = token_frame(params, tokens) @ params[pre + "attn.wk"].astype(np.float64)   # (n, C), no p, no b_K
    else:
        h, _ = ly.layernorm_forward(x + p, params[pre + "ln1.g"].astype(np.float64),
                                    params[pre + "ln1.b"].astype(np.float64))  # (n, C)
        w = "v" if recipe == "value_ln" else "k"
        k = h @ params[pre + f"attn.w{w}"] + params[pre + f"attn.b{w}"]       # (n, C)
    k = k.reshape(len(tokens), NH, -1).transpose(1, 0, 2)           # (NH, n, hs)
    return k - k.mean(1, keepdims=True) if recipe == "ln_centred" else k


def frame_vectors(params, cfg, groups, recipe="ln"):
    """-> {group: layer-0 vectors (NH, n, hs)} of each token type."""
    T = max(int(pos.max()) for _, pos in groups.values()) + 1
    table = position_table(params, cfg, T)                          # (T, C)
    return {name: layer0_vectors(params, cfg, toks, table[pos].mean(0), recipe) for name, (toks, pos) in groups.items()}


def key_frame(params, cfg, groups, recipe="ln"):
    """-> {group: cosine matrices (NH, n, n)} of the layer-0 vectors of each token type."""
    return {name: np.stack([ms.cosine_matrix(k) for k in K]) for name, K in frame_vectors(params, cfg, groups, recipe).items()}


def offset_stats(K):
    """K (NH, n, hs) -> the keys' shared offset against their spread, and their participation ratios (means
    over heads), and the tokens whose deviation dominates (ms.DOMINANCE) with the mean |cos| without them."""
    mean = K.mean(1, keepdims=True)                                  # (NH, 1, hs)
    dev = np.linalg.norm(K - mean, axis=-1)                          # (NH, n)
    out = {"offset_norm": float(np.linalg.norm(mean, axis=-1).mean()), "deviation_norm": float(dev.mean()),
           "participation_ratio": float(np.mean([ms.participation_ratio(k) for k in K])),
           "participation_ratio_centred": float(np.mean([ms.participation_ratio(k - k.mean(0)) for k in K]))}
    dom = ms.dominant(dev.mean(0))
    out["dominant_tokens"] = dom
    if dom:
        keep = np.setdiff1d(np.arange(K.shape[1]), dom)
        out["mean_abs_offdiag_without_dominant"] = float(np.mean([ms.mean_abs_offdiag(ms.cosine_matrix(k[keep])) for k in K]))
    return out


def gaussian_baseline(n, d, centred=False, draws=GAUSSIAN_DRAWS, seed=0):
    """Mean |off-diagonal cosine| of n iid N(0, I_d) vectors (centred over the n if asked), over draws."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((draws, n, d))                          # (draws, n, d)
    X = X - X.mean(1, keepdims=True) if centred else X
    return float(np.mean([ms.mean_abs_offdiag(ms.cosine_matrix(x)) for x in X]))


def key_frame_probe(params, cfg, task, tokens):
    """Probe 1: trained cosines beside random initialisations (same recipe) and random Gaussian vectors,
    with the keys' offset, spread and participation ratio."""
    groups = task_module(task, "token_groups").token_groups(cfg, tokens)
    hs = cfg.d_model // cfg.n_heads
    inits = [ba.init_params(cfg, s) for s in RANDOM_INIT_SEEDS]
    out, matrices = {}, {}
    for recipe in RECIPES:
        vectors = frame_vectors(params, cfg, groups, recipe)
        untrained = [key_frame(p, cfg, groups, recipe) for p in inits]
        out[recipe] = {}
        for name, (toks, _) in groups.items():
            trained = np.stack([ms.cosine_matrix(k) for k in vectors[name]])
            per_head = [ms.mean_abs_offdiag(c) for c in trained]
            per_seed = [float(np.mean([ms.mean_abs_offdiag(c) for c in u[name]])) for u in untrained]
            out[recipe][name] = {
                "n_tokens": len(toks), "head_size": hs,
                "mean_abs_offdiag": float(np.mean(per_head)), "mean_abs_offdiag_per_head": per_head,
                "rms_offdiag": float(np.mean([ms.rms_offdiag(c) for c in trained])),
                "random_init_mean_abs_offdiag": float(np.mean(per_seed)), "random_init_per_seed": per_seed,
                "gaussian_mean_abs_offdiag": gaussian_baseline(len(toks), hs, centred=recipe == "ln_centred"),
                "welch_rms_lower_bound": ms.welch_rms_bound(len(toks), hs), **offset_stats(vectors[name])}
            matrices[(recipe, name)] = trained
    return out, matrices


def authors_keys(params, cfg, tokens):
    """key_h = LN1(wte[h]) @ W_K[:, head] for every layer-0 head: (NH, n, hs)."""
    k = token_frame(params, tokens) @ params["blocks.0.attn.wk"].astype(np.float64)   # (n, C), no b_K
    return k.reshape(len(tokens), cfg.n_heads, -1).transpose(1, 0, 2)


def authors_key_frame(params, cfg, task):
    """Mean |off-diagonal cosine| of the hypothesis keys per layer-0 head, beside random initialisations,
    with the keys' offset and participation ratio."""
    toks = task_module(task, "hypothesis_tokens").hypothesis_tokens(cfg)
    hs = cfg.d_model // cfg.n_heads
    K = authors_keys(params, cfg, toks)
    per_head = [ms.mean_abs_offdiag(ms.cosine_matrix(k)) for k in K]
    init = [[ms.mean_abs_offdiag(ms.cosine_matrix(k)) for k in authors_keys(ba.init_params(cfg, s), cfg, toks)]
            for s in RANDOM_INIT_SEEDS]                              # (seeds, NH)
    centred = [ms.mean_abs_offdiag(ms.cosine_matrix(k - k.mean(0))) for k in K]
    init_centred = [[ms.mean_abs_offdiag(ms.cosine_matrix(k - k.mean(0))) for k in authors_keys(ba.init_params(cfg, s), cfg, toks)]
                    for s in RANDOM_INIT_SEEDS]
    return {"hypotheses": len(toks), "head_size": hs, "per_head": per_head, "mean": float(np.mean(per_head)),
            "most_orthogonal_head": int(np.argmin(per_head)),
            "random_init_per_head": np.mean(init, 0).tolist(), "random_init_mean": float(np.mean(init)),
            "random_init_per_seed": np.mean(init, 1).tolist(),
            "centred_per_head": centred, "centred_mean": float(np.mean(centred)),
            "random_init_centred_mean": float(np.mean(init_centred)),
            "random_init_centred_per_seed": np.mean(init_centred, 1).tolist(),
            "welch_rms_lower_bound": ms.welch_rms_bound(len(toks), hs),
            "orthogonality_possible": hs >= len(toks), **offset_stats(K)}


# ----------------------------------------------------------------------------
# probe 2: progressive query-key sharpening (stage 2), with the sink and the query swap

def row_entropy_bits(alpha):
    """Entropy of attention rows (..., T) in bits (0 log 0 = 0)."""
    a = alpha.astype(np.float64)
    return -(a * np.log2(np.where(a > 0, a, 1.0))).sum(-1)


def sink_stats(alpha, cols):
    """alpha (n, NH, P, T) attention at the answer rows, cols (P,) -> the sink controls (DEFINITIONS "sink")."""
    choice = np.broadcast_to(cols > 0, alpha.shape[:3])              # (n, NH, P) rows that can choose
    h = row_entropy_bits(alpha)                                      # (n, NH, P)
    hu = np.broadcast_to(np.log2(cols + 1.0), h.shape)               # (n, NH, P)
    sink = alpha[..., 0]                                             # (n, NH, P) mass on position 0
    sink_row = (sink > SINK_MASS) & choice
    drop = hu - h                                                    # (n, NH, P) the entropy drop per row
    rest = choice & ~sink_row
    NH = alpha.shape[1]
    wo = [ms.ratio_se((hu[:, hd] - h[:, hd]).sum(-1, where=rest[:, hd]), hu[:, hd].sum(-1, where=rest[:, hd]))
          for hd in range(NH)]                                       # per head: (reduction, its SE over sequences)
    share = [ms.ratio_se(drop[:, hd].sum(-1, where=sink_row[:, hd]), drop[:, hd].sum(-1, where=choice[:, hd]))
             for hd in range(NH)]
    return {"entropy_reduction_without_sink_rows_per_head": [r for r, _ in wo],
            "entropy_reduction_without_sink_rows_se_per_head": [se for _, se in wo],
            "sink_share_of_entropy_drop_per_head": [r for r, _ in share],"sink_mass": [float(sink[:, hd][choice[:, hd]].mean()) for hd in range(NH)],
            "sink_row_share": [float(sink_row[:, hd][choice[:, hd]].mean()) for hd in range(NH)],
            "sink_share_of_entropy_drop": float(drop[sink_row].sum() / drop[choice].sum()) if drop[choice].sum() > 0
            else None,
            "entropy_reduction_without_sink_rows": float(1.0 - h[rest].mean() / hu[rest].mean()) if rest.any() else None,
            "head_share_of_entropy_drop": (drop.sum((0, 2)) / drop.sum()).tolist() if drop.sum() > 0 else None}


def attention_probe(cache, batch, task, cfg):
    """Probe 2 per layer and head: attention entropy (bits), mass on the evidence positions and on the sink."""
    cols = supervised_columns(batch)
    masks = task_module(task, "evidence_masks").evidence_masks(batch["tokens"], cols)
    has_evidence = masks["consistent"].any(-1)                      # (n, P)
    uniform_h = np.log2(cols + 1.0)                                  # (P,) entropy of uniform causal attention
    uniform_mass = masks["consistent"].sum(-1) / (cols + 1.0)       # (n, P) mass of uniform attention on the evidence
    out = {"uniform_entropy_bits": float(uniform_h.mean()),
           "uniform_consistent_mass": float(uniform_mass[has_evidence].mean()), "layers": []}
    for lc in cache["layers"]:
        alpha = lc["alpha"][:, :, cols].astype(np.float64)           # (n, NH, P, T)
        h = row_entropy_bits(alpha)                                  # (n, NH, P)
        layer = {"entropy_bits": h.mean((0, 2)).tolist(), "entropy_bits_mean": float(h.mean()),
                 "entropy_reduction": float(1.0 - h.mean() / uniform_h.mean()),
                 "entropy_reduction_per_head": (1.0 - h.mean((0, 2)) / uniform_h.mean()).tolist()}
        for name, m in masks.items():
            mass = (alpha * m[:, None]).sum(-1)                      # (n, NH, P)
            keep = has_evidence if name == "consistent" else np.ones_like(has_evidence)
            layer[f"{name}_mass"] = [float(mass[:, hd][keep].mean()) for hd in range(cfg.n_heads)]
        layer.update(sink_stats(alpha, cols))
        share = layer["head_share_of_entropy_drop"]
        layer["dominant_heads"] = ms.dominant(share) if share else []
        out["layers"].append(layer)
    reductions = [l["entropy_reduction"] for l in out["layers"]]
    out["monotone"] = bool(np.all(np.diff(reductions) >= 0))
    return out


def row_tv(a, b):
    """Total-variation distance between attention rows (..., T): 1/2 sum |a - b| (...)."""
    return 0.5 * np.abs(a - b).sum(-1)


def query_swap(params, cfg, batch, task, n=SWAP_SEQS, seed=0):
    """The query-swap control of probe 2 (DEFINITIONS "query_swap") -> per layer: swap TV, between-sequence TV
    and their ratio, per head and as the mean over heads."""
    mod, cols = task_module(task, "swap_query"), supervised_columns(batch)
    tokens = batch["tokens"][:n]
    rng = np.random.default_rng((PROBE_SEED, seed, 1))
    _, base = ba.forward(params, tokens, cfg)
    L, NH = cfg.n_layers, cfg.n_heads
    swap, between = [[] for _ in range(L)], [[] for _ in range(L)]
    for t in cols[cols > 0]:
        new, ok = mod.swap_query(cfg, tokens, int(t), rng)
        if not ok.any():
            continue
        _, c = ba.forward(params, new[ok, :t + 1], cfg)              # rows <= t see only the prefix
        for l in range(L):
            a = base["layers"][l]["alpha"][:, :, t, :t + 1].astype(np.float64)   # (n, NH, t + 1)
            swap[l].append(row_tv(a[ok], c["layers"][l]["alpha"][:, :, t].astype(np.float64)))   # (m, NH)
            if len(a) > 1:
                between[l].append(row_tv(a, np.roll(a, 1, axis=0)))  # (n, NH) each sequence against the next
    out = []
    for l in range(L):
        s = np.concatenate(swap[l]) if swap[l] else np.full((0, NH), np.nan)
        b = np.concatenate(between[l]) if between[l] else np.full((0, NH), np.nan)
        s_h, b_h = s.mean(0), b.mean(0)
        ratio = s_h / np.maximum(b_h, 1e-12)                           # (NH,)
        se = lambda x: x.std(0, ddof=1) / np.sqrt(len(x)) if len(x) > 1 else np.zeros(NH)
        rel = np.sqrt((se(s) / np.maximum(s_h, 1e-12)) ** 2 + (se(b) / np.maximum(b_h, 1e-12)) ** 2)
        out.append({"swap_tv": s_h.tolist(), "between_tv": b_h.tolist(),
                    "ratio": ratio.tolist(), "ratio_se": (ratio * rel).tolist(),
                    "swap_tv_mean": float(s.mean()), "between_tv_mean": float(b.mean()),
                    "ratio_mean": float(s.mean() / max(b.mean(), 1e-12))})
    return {"sequences": len(tokens), "layers": out}


# ----------------------------------------------------------------------------
# probe 3: the entropy-ordered value manifold (stage 3), with its controls

def manifold_stats(X, h_bayes, position=None):
    """X (N, C) representations, h_bayes (N,) exact posterior entropy (bits), position (N,) optional.
    -> explained variance of PC1 and PC1+PC2, Spearman(PC1, H), and two controls: Spearman(PC1,
    position) and the mean within-position Spearman(PC1, H) where H varies at a fixed position."""
    scores, ratio = ms.pca(np.asarray(X, dtype=np.float64))
    rho = ms.spearman(scores[:, 0], h_bayes)
    out = {"pc1_variance": float(ratio[0]), "pc12_variance": float(ratio[:2].sum()),
           "spearman_pc1_entropy": rho, "abs_spearman_pc1_entropy": None if rho is None else abs(rho)}
    if position is not None:
        out["spearman_pc1_position"] = ms.spearman(scores[:, 0], position)
        out["mean_within_position_spearman"] = ms.within_groups(ms.spearman, scores[:, 0], h_bayes, position)
    return out, scores[:, :2]


def partial(out, key, X, h, seq, pos):
    """out[key]: the held-out partial readout R^2 of h from X beyond the position, out[key + "_se"] its
    standard error over the folds; out[key + "_folds"]: the folds (measures.partial_cv_folds), from which
    the verdict also reads the paired standard error of a difference of two readouts."""
    folds = ms.partial_cv_folds(X, h, seq, pos)
    (out[key], out[key + "_se"]), out[key + "_folds"] = ms.partial_from_folds(folds), folds


def manifold_controls(X, h, pos, seq, split=None, graded=None):
    """The controls of probe 3 on one representation X (N, C) at the answer rows: h (N,) H_Bayes, pos (N,)
    positions, seq (N,) sequence index, split (N,) the task's binary split or None, graded (N,) bool the rows
    where H is graded or None (DEFINITIONS "position_norm", "graded_rows", "split", "readout")."""
    X = np.asarray(X, np.float64)
    out, scores = manifold_stats(X, h, pos)
    positions = np.unique(pos)
    norms = np.linalg.norm(X, axis=1)
    per_pos = np.array([norms[pos == p].mean() for p in positions])
    dom = [int(positions[i]) for i in ms.dominant(per_pos)]
    keep = ~np.isin(pos, dom)
    out.update(norm_by_position=per_pos.tolist(), dominant_positions=dom,
               pc1_variance_without_dominant=float(ms.pca(X[keep])[1][0]) if dom else out["pc1_variance"],
               pc1_variance_unit_rows=float(ms.pca(X / np.maximum(norms, 1e-300)[:, None])[1][0]),
               readout_r2=ms.cv_r_squared(X, h, seq))
    partial(out, "readout_partial_r2", X, h, seq, pos)
    if dom:
        out["without_dominant"] = manifold_stats(X[keep], h[keep], pos[keep])[0]
    if graded is not None:
        out["graded_share"] = float(graded.mean())
    if graded is not None and graded.any():                    # no graded row (H only the split's): none of these
        out["within_position_spearman_graded"] = ms.within_groups(ms.spearman, scores[graded, 0], h[graded], pos[graded])
        out["graded_refit"] = manifold_stats(X[graded], h[graded], pos[graded])[0]
        out["readout_r2_graded"] = ms.cv_r_squared(X[graded], h[graded], seq[graded])
        partial(out, "readout_partial_r2_graded", X[graded], h[graded], seq[graded], pos[graded])
    if split is not None:
        out["spearman_pc1_split"] = ms.spearman(scores[:, 0], split)
    return out


def readout_baselines(h, pos, seq, split=None, graded=None, q=None):
    """The readouts of H_Bayes that need no representation: from the position alone, the split alone and
    both (one-hot position, split and split x position), on all rows and on the graded rows; with q (N, K)
    the model's own predictive distribution, the partial readouts beyond the position from its entropy (one
    column) and from its log-probabilities (K columns): what the output gives without any geometry."""
    P = ms.onehot(pos)
    out = {"position": ms.cv_r_squared(P, h, seq)}
    if q is not None:
        for name, X in (("output_entropy", wt.entropy_bits(q)[:, None]), ("output_log_probs", np.log(np.maximum(q, 1e-30)))):
            partial(out, f"{name}_partial", X, h, seq, pos)
            if graded is not None and graded.any():
                partial(out, f"{name}_partial_graded", X[graded], h[graded], seq[graded], pos[graded])
    if split is not None:
        s = split.astype(np.float64)[:, None]
        out["split"] = ms.cv_r_squared(s, h, seq)
        out["position_and_split"] = ms.cv_r_squared(np.c_[P, s * P], h, seq)
        out["within_position_r2_h_by_split"] = ms.within_groups(lambda a, b: ms.r_squared(a[:, None], b), split.astype(float),
                                                             h, pos)
    if graded is not None and graded.any():
        out["position_graded"] = ms.cv_r_squared(P[graded], h[graded], seq[graded])
    return out


def manifold_rows(batch, task):
    """-> cols, and the answer rows flattened: h (N,), pos (N,), seq (N,), split (N,) or None, graded (N,),
    and the split's name."""
    mod, cols = task_module(task, "row_split", "graded_rows"), supervised_columns(batch)
    n = len(batch["tokens"])
    h = wt.entropy_bits(batch["posterior"][:, cols]).reshape(-1)    # (N,)
    pos = np.tile(cols, n)                                           # (N,)
    seq = np.repeat(np.arange(n), len(cols))                         # (N,)
    split = mod.row_split(batch, cols)
    name, split = (None, None) if split is None else next(iter(split.items()))
    graded = mod.graded_rows(batch, cols).reshape(-1)
    return cols, h, pos, seq, None if split is None else split.reshape(-1), graded, name


def manifold_probe(cache, batch, task, proba=None):
    """Probe 3 on the last layer's attention output, the final residual stream before and after the final
    LayerNorm, and by layer, each with its controls; proba (n, T, K): the model's predictive distribution
    (the readout baseline from the output). -> (numbers, points for the figure)."""
    cols, h, pos, seq, split, graded, split_name = manifold_rows(batch, task)
    rows = lambda a: a[:, cols].reshape(-1, a.shape[-1]).astype(np.float64)  # (n, T, C) -> (N, C)
    controls = lambda X: manifold_controls(X, h, pos, seq, split, graded)
    resid_final = rows(cache["resid"][-1])
    attention = [lc["attn_out"] for lc in cache.get("layers", []) if isinstance(lc, dict) and "attn_out" in lc]
    out = {**({"attn_out_last": controls(rows(attention[-1]))} if attention else {}),
           "residual_final": controls(resid_final), "after_final_ln": controls(rows(cache["xf"])),
           "by_layer": {**({"attn_out": [controls(rows(a)) for a in attention]} if attention else {}),
                        "residual": [controls(rows(r)) for r in cache["resid"]]},
           "readout_baselines": readout_baselines(h, pos, seq, split, graded,
                                                  None if proba is None else rows(proba)),
           "graded_rows": "every row" if graded.all() else f"{graded.mean():.1%} of the rows" if graded.any() else "no row",
           "split": split_name,
           "authors": authors_manifold(rows(cache["xf"]), h, pos, graded)}
    # the figure: all rows (their positions, to mark the dominating ones), the graded rows without the
    # dominating positions (PCA refit on them), and all rows after the final LayerNorm (the authors' view)
    keep = graded & ~np.isin(pos, out["residual_final"]["dominant_positions"])
    xy_all = ms.pca(resid_final)[0][:, :2]
    xy_graded = ms.pca(resid_final[keep])[0][:, :2] if keep.sum() > 2 else np.zeros((0, 2))
    xy_ln = ms.pca(rows(cache["xf"]))[0][:, :2]
    return out, dict(all=(xy_all, h), graded=(xy_graded, h[keep]), after_final_ln=(xy_ln, h), position=pos,
                     dominant=out["residual_final"]["dominant_positions"])


def authors_manifold(X, h_bayes, position, graded=None, n_pcs=5):
    """X (N, C) final hidden states (after the final LayerNorm), h_bayes (N,), position (N,).
    -> PC1 variance, Pearson r of PC1..PC5 with H (best |r|), R^2 of H on the top 5 PCs; controls:
    R^2 of H on the position alone (1 when H is a function of the position, as in format a) and the
    mean within-position R^2 of the same top-5-PC fit, over positions where H varies; the same on the
    graded rows only."""
    scores, ratio = ms.pca(np.asarray(X, dtype=np.float64))
    top = scores[:, :n_pcs]
    r = [ms.pearson(top[:, i], h_bayes) for i in range(top.shape[1])]
    best = max(range(len(r)), key=lambda i: -1.0 if r[i] is None else abs(r[i]))
    out = {"pc1_variance": float(ratio[0]), "pearson_pc1_to_pc5": r, "best_pc": best + 1,
           "best_abs_pearson": None if r[best] is None else abs(r[best]), "r2_top5": ms.r_squared(top, h_bayes),
           "r2_position_only": ms.r_squared(ms.onehot(position)[:, 1:], h_bayes),
           "mean_within_position_r2_top5": ms.within_groups(ms.r_squared, top, h_bayes, position)}
    if graded is not None and graded.any() and not graded.all():
        out["mean_within_position_r2_top5_graded"] = ms.within_groups(ms.r_squared, top[graded], h_bayes[graded],
                                                                   position[graded])
    return out


# ----------------------------------------------------------------------------
# probe 4: logit lens, the final LayerNorm and unembedding applied to every residual stream

def uniform_kl_bits(batch):
    """KL(posterior || uniform) in bits at the supervised rows, averaged: what a uniform guess scores."""
    post = batch["posterior"][:, supervised_columns(batch)]
    return float(wt.kl_bits(post, np.full_like(post, 1.0 / post.shape[-1])).mean())


def lens_proba(params, x):
    """Residual stream x (..., C) -> predictive distribution (..., K) of the final LN + unembedding."""
    xf, _ = ly.layernorm_forward(x, params["lnf.g"], params["lnf.b"])
    return ly.softmax((xf @ params["unembed.w"] + params["unembed.b"]).astype(np.float64))


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
# probe 5: ablations, a head's output (before W_o) replaced four ways, one head or one layer at a time

def replacement(method, O):
    """What replaces one head's output O (n, T, hs) of the clean run: zeros, its mean over sequences at each
    position, its mean over sequences and positions, or the next sequence's output (a derangement)."""
    if method == "zero":
        return np.zeros_like(O)
    if method == "position_mean":
        return np.broadcast_to(O.mean(0, keepdims=True), O.shape)
    if method == "mean":
        return np.broadcast_to(O.mean((0, 1), keepdims=True), O.shape)
    if method == "resample":
        return np.roll(O, 1, axis=0)
    raise ValueError(f"ablation {method!r}: allowed are {', '.join(ABLATIONS)}")


def ablated_calibration(params, cfg, batch, layer=None, heads=(), method="zero", clean=None):
    """Calibration with the outputs of `heads` of `layer` replaced (replacement); clean: the clean run's
    cache (needed by every method but zero). layer None: no ablation."""
    cols = supervised_columns(batch)
    new = {}
    if layer is not None:
        if method == "zero":
            new = {h: 0.0 for h in heads}
        else:
            O = clean["layers"][layer]["head_out"]                   # (n, NH, T, hs)
            new = {h: replacement(method, O[:, h]) for h in heads}

    def patch(l, o):
        if l != layer:
            return o
        o = o.copy()
        for h, r in new.items():
            o[:, h] = r
        return o
    logits, _ = ba.forward(params, batch["tokens"], cfg, patch=None if layer is None else patch)
    q, post = ly.softmax(logits[:, cols].astype(np.float64)), batch["posterior"][:, cols]
    return {**calibration(q, post), "kl_by_sequence": wt.kl_bits(post, q).mean(1)}   # (n,) for the noise


def ranked(rows, key):
    """(name of the row with the largest key, its value, the runner-up's name, ratio of the two)."""
    order = sorted(rows, key=lambda r: -r[key])
    first, second = order[0], order[1] if len(order) > 1 else None
    name = lambda r: f"L{r['layer']}H{r['head']}"
    return {"name": name(first), "delta": first[key], "second": None if second is None else name(second),
            "second_delta": None if second is None else second[key],
            "ratio_to_second": None if second is None or second[key] <= 0 else first[key] / second[key]}


def ablations(params, cfg, batch, clean=None, methods=ABLATIONS):
    """Probe 5 -> baseline, and for each method per head and per layer: entropy MAE and KL (bits) and their
    changes, the head each metric names, and the heads whose removal costs more than a uniform guess.
    The top-level heads and layers are the zero ablation's (the authors' rule reads them)."""
    L, NH = cfg.n_layers, cfg.n_heads
    cols = supervised_columns(batch)
    if clean is None and any(m != "zero" for m in methods):
        clean = ba.forward(params, batch["tokens"], cfg)[1]
    post = batch["posterior"][:, cols]
    uniform = np.full_like(post, 1.0 / post.shape[-1])
    uniform_kl = float(wt.kl_bits(post, uniform).mean())
    base = ablated_calibration(params, cfg, batch)
    base_seq = base.pop("kl_by_sequence", None)

    def delta(c):   # the changes, and the KL change's standard error over the probe sequences (paired)
        seq = c.pop("kl_by_sequence", None)
        return {**c, "delta_entropy_mae_bits": c["entropy_mae_bits"] - base["entropy_mae_bits"],
                "delta_kl_bits": c["kl_bits"] - base["kl_bits"],
                "delta_kl_se_bits": None if seq is None or base_seq is None else ms.mean_se(seq - base_seq)}
    by_method = {}
    for method in methods:
        heads = [{"layer": l, "head": h, **delta(ablated_calibration(params, cfg, batch, l, (h,), method, clean))}
                 for l in range(L) for h in range(NH)]
        layers = [{"layer": l, **delta(ablated_calibration(params, cfg, batch, l, range(NH), method, clean))}
                  for l in range(L)]
        by_method[method] = {"heads": heads, "layers": layers, "by_kl": ranked(heads, "delta_kl_bits"),
                             "by_entropy_mae": ranked(heads, "delta_entropy_mae_bits"),
                             "heads_above_uniform": [f"L{r['layer']}H{r['head']}" for r in heads
                                                     if r["kl_bits"] > uniform_kl]}
    zero = by_method.get("zero") or next(iter(by_method.values()))
    worst, mae = zero["by_kl"], zero["by_entropy_mae"]
    return {"baseline": base, "uniform_kl_bits": uniform_kl, "heads": zero["heads"], "layers": zero["layers"],
            "methods": by_method,
            "hypothesis_frame_head": {"name": worst["name"], "layer": int(worst["name"][1:].split("H")[0]),
                                      "head": int(worst["name"].split("H")[1]), "rule": "largest KL increase"},
            "worst_head_by_entropy_mae": mae["name"],
            "authors_frame_head": {   # the authors' rule: the head whose removal raises the entropy MAE most
                "name": mae["name"], "delta_entropy_mae_bits": mae["delta"], "second": mae["second"],
                "second_delta_entropy_mae_bits": mae["second_delta"], "ratio_to_second": mae["ratio_to_second"]},
            "worst_layer": int(max(zero["layers"], key=lambda r: r["delta_kl_bits"])["layer"])}


# ----------------------------------------------------------------------------
# probe 6 (geometry/formation.py): one snapshot, measured, and the frame it holds

def frame_matrix(params, task, cfg):
    """F = LN1(wte[h]) over the hypothesis tokens h: (n, C), the authors' 'embedding' frame."""
    return token_frame(params, task_module(task, "hypothesis_tokens").hypothesis_tokens(cfg))


def snapshot_state(params, cfg, batch, task):
    """-> attention (per layer, (n, NH, T, T)), a dict of numbers: calibration, per-layer attention
    entropy and evidence mass (probe 2, mean over heads), |Spearman(PC1 of final residual, H)|."""
    cols = supervised_columns(batch)
    logits, cache = ba.forward(params, batch["tokens"], cfg)
    post = batch["posterior"][:, cols]
    state = calibration(ly.softmax(logits[:, cols].astype(np.float64)), post)
    att = attention_probe(cache, batch, task, cfg)
    state["attention_entropy_bits"] = [l["entropy_bits_mean"] for l in att["layers"]]
    state["consistent_mass"] = [float(np.mean(l["consistent_mass"])) for l in att["layers"]]
    stats, _ = manifold_stats(cache["resid"][-1][:, cols].reshape(-1, cfg.d_model).astype(np.float64),
                              wt.entropy_bits(post).reshape(-1))
    state["abs_spearman_pc1_entropy"] = stats["abs_spearman_pc1_entropy"]
    return [lc["alpha"] for lc in cache["layers"]], state
