"""measures: the statistics the geometry probes share, on plain arrays (no model, no task): cosines and
the Welch bound, the participation ratio, PCA, rank and linear correlations, in-sample and held-out
R^2 (ridge readouts cross-validated by sequence), k-means, normalised mutual information and the share of
variance between groups, and which entries dominate a statistic. manifold.py's
DEFINITIONS says how each probe uses them; tests/test_manifold.py checks them on cases computed by hand.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see layers.py: BLAS threads fight Numba's

import math  # noqa: E402

import numpy as np  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

DOMINANCE = 5.0             # a position, token or head dominates when its share is > 5x the median share
READOUT_FOLDS = 5           # cross-validated readouts: folds split by sequence
READOUT_RIDGE = 1e-3        # ridge of the readouts, relative to the mean eigenvalue of X^T X
POSITION_LEAVES = 1e-3      # a partial readout beyond the position needs the position to leave 0.1% of H
KMEANS_RESTARTS = 5         # k-means: the best of 5 seedings


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


def participation_ratio(X):
    """X (n, d) -> (sum lambda)^2 / sum lambda^2 of the eigenvalues of X X^T: the effective number of
    directions the rows span (0 for X = 0)."""
    lam = np.linalg.svd(np.asarray(X, np.float64), compute_uv=False) ** 2
    return float(lam.sum() ** 2 / (lam ** 2).sum()) if lam.sum() > 0 else 0.0


def dominant(values, factor=DOMINANCE):
    """Indices whose value exceeds factor x the median of values (a statistic they would carry)."""
    values = np.asarray(values, dtype=np.float64)
    return [int(i) for i in np.flatnonzero(values > factor * np.median(values))] if len(values) > 2 else []


def pca(X):
    """X (N, C) -> scores (N, C'), explained-variance ratios (C',); each axis signed so that its
    largest loading is positive."""
    Xc = X - X.mean(0)
    _, S, Vt = np.linalg.svd(Xc, full_matrices=False)
    Vt = Vt * np.sign(Vt[np.arange(len(Vt)), np.abs(Vt).argmax(1)])[:, None]
    var = S ** 2
    return Xc @ Vt.T, var / max(var.sum(), 1e-300)


def constant(a):
    """True when a varies by less than rounding: every entry equal up to 1e-9 (relative)."""
    a = np.asarray(a, dtype=np.float64)
    return len(a) < 2 or np.ptp(a) <= 1e-9 * max(1.0, float(np.abs(a).max()))


def spearman(a, b):
    """Spearman rank correlation; None when either side is constant (up to rounding, see constant())."""
    if constant(a) or constant(b):
        return None
    return float(spearmanr(a, b)[0])


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


def within_groups(stat, a, b, groups):
    """The mean over groups (positions) of stat(a, b) on each group's rows, over the groups where it is
    defined (None: H constant there); None if it is defined nowhere."""
    vals = [stat(a[groups == g], b[groups == g]) for g in np.unique(groups)]
    vals = [v for v in vals if v is not None]
    return float(np.mean(vals)) if vals else None


def ridge_fit(X, y, ridge=READOUT_RIDGE):
    """The ridge readout y ~ X w + c, X's columns standardised (a constant column left as it is), the ridge
    relative to the mean eigenvalue of A^T A. -> predict(Y (m, d)) -> (m,)."""
    X, y = np.asarray(X, np.float64).reshape(len(y), -1), np.asarray(y, np.float64)
    mu, ym = X.mean(0), y.mean()
    sd = np.where(X.std(0) > 0, X.std(0), 1.0)                        # (d,)
    A = (X - mu) / sd                                                  # (N, d)
    G = A.T @ A
    lam = max(ridge * np.trace(G) / max(len(G), 1), 1e-12)
    w = np.linalg.solve(G + lam * np.eye(len(G)), A.T @ (y - ym))
    return lambda Y: (np.asarray(Y, np.float64).reshape(-1, X.shape[1]) - mu) / sd @ w + ym


def cv_predictions(X, y, groups, folds=READOUT_FOLDS, ridge=READOUT_RIDGE, extra=None, extra_groups=None):
    """The held-out ridge readout (ridge_fit): rows in folds by group (group g in fold g mod folds), each fold
    predicted by the fit on the others; extra (m, d) other rows, each predicted by the fit its group's fold
    gets (extra_groups (m,)). -> (predictions (N,), fold (N,)), with the extra rows' predictions (m,) third
    when extra is given; None when y is constant or there are too few groups."""
    X, y = np.asarray(X, np.float64).reshape(len(y), -1), np.asarray(y, np.float64)
    fold = np.asarray(groups) % folds
    if constant(y) or len(np.unique(fold)) < 2:
        return None
    pred = np.empty(len(y))
    out = None if extra is None else np.full(len(extra), np.nan)
    for f in np.unique(fold):
        test = fold == f
        fit = ridge_fit(X[~test], y[~test], ridge)
        pred[test] = fit(X[test])
        if extra is not None:
            mine = np.asarray(extra_groups) % folds == f
            out[mine] = fit(np.asarray(extra)[mine])
    return (pred, fold) if extra is None else (pred, fold, out)


def cv_fold_sse(X, y, groups, folds=READOUT_FOLDS, ridge=READOUT_RIDGE):
    """cv_predictions' readout -> (sse (F,), sst): each fold's held-out sum of squared residuals, and the sum
    of squares of y about its mean over all rows; None when cv_predictions is."""
    y = np.asarray(y, np.float64)
    r = cv_predictions(X, y, groups, folds, ridge)
    if r is None:
        return None
    pred, fold = r
    return (np.array([float(((y[fold == f] - pred[fold == f]) ** 2).sum()) for f in np.unique(fold)]),
            float(((y - y.mean()) ** 2).sum()))


def cv_r_squared(X, y, groups, folds=READOUT_FOLDS, ridge=READOUT_RIDGE):
    """Held-out R^2 of the readout of cv_fold_sse: 1 - sum over folds of sse / sst (below 0 when the readout
    is worse than the mean). None when cv_fold_sse is."""
    r = cv_fold_sse(X, y, groups, folds, ridge)
    return None if r is None else 1.0 - float(r[0].sum()) / r[1]


def partial_cv_folds(X, y, groups, position):
    """The folds of the partial readout beyond the position: {"full": (F,), "base": (F,)} the held-out sse of
    [X, one-hot position] and of the one-hot position alone (cv_fold_sse, the same folds). None where either
    is undefined, or where the position leaves less than POSITION_LEAVES of y's variance (y is a function of
    the position: the ratio would divide the ridge's rounding by nearly zero)."""
    P = onehot(position)
    full, base = cv_fold_sse(np.c_[X, P], y, groups), cv_fold_sse(P, y, groups)
    if full is None or base is None or base[0].sum() / base[1] < POSITION_LEAVES:
        return None
    return {"full": full[0].tolist(), "base": base[0].tolist()}


def partial_from_folds(folds):
    """folds: partial_cv_folds' dict. -> (value, se): the share of what the position leaves of y that X adds,
    held out, 1 - sum full / sum base (= (R^2([X, position]) - R^2(position)) / (1 - R^2(position))), and its
    standard error over the folds (ratio_se, the folds as units). (None, None) when folds is None."""
    if folds is None:
        return None, None
    r, se = ratio_se(folds["full"], folds["base"])
    return 1.0 - r, se


def partial_difference(folds, other):
    """The partial R^2 of folds minus that of other (two partial_cv_folds dicts of readouts on the same rows
    and folds): (sum other_full - sum full) / sum base, and its standard error over the folds, paired.
    (None, None) when either is None."""
    if folds is None or other is None:
        return None, None
    if not np.allclose(folds["base"], other["base"], rtol=1e-9, atol=0):
        raise ValueError("partial_difference: the two readouts were not fitted on the same rows and folds")
    return ratio_se(np.asarray(other["full"]) - np.asarray(folds["full"]), folds["base"])


def partial_cv_r_squared(X, y, groups, position):
    """The share of what the position leaves of y that X adds, held out (partial_from_folds of
    partial_cv_folds); None where partial_cv_folds is."""
    return partial_from_folds(partial_cv_folds(X, y, groups, position))[0]


def kmeans(X, k, seed=0, restarts=KMEANS_RESTARTS, iters=100):
    """Lloyd's k-means of the rows of X (N, C) into k clusters, seeded by k-means++ (each next centre drawn
    with probability proportional to the squared distance to the nearest centre so far), the best of
    restarts by the within-cluster sum of squares. -> labels (N,) in 0..k-1."""
    X = np.asarray(X, np.float64)
    rng = np.random.default_rng(seed)
    best, best_ss = None, np.inf
    for _ in range(restarts):
        centres = [X[rng.integers(len(X))]]
        for _ in range(1, k):
            d2 = ((X[:, None, :] - np.array(centres)[None]) ** 2).sum(-1).min(1)       # (N,)
            centres.append(X[rng.choice(len(X), p=d2 / d2.sum())] if d2.sum() > 0 else X[rng.integers(len(X))])
        centres = np.array(centres)                                                     # (k, C)
        for _ in range(iters):
            labels = ((X[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1)           # (N,)
            new = np.array([X[labels == j].mean(0) if (labels == j).any() else centres[j] for j in range(k)])
            if np.allclose(new, centres):
                break
            centres = new
        ss = float(((X - centres[labels]) ** 2).sum())
        if ss < best_ss:
            best, best_ss = labels, ss
    return best


def nmi(a, b):
    """Normalised mutual information of two labelings a, b (N,): I(a; b) / sqrt(H(a) H(b)) (any log base:
    it cancels), 0 when they are independent, 1 when one determines the other both ways; None when either
    is constant."""
    _, a = np.unique(a, return_inverse=True)
    _, b = np.unique(b, return_inverse=True)
    joint = np.zeros((a.max() + 1, b.max() + 1))
    np.add.at(joint, (a, b), 1.0)
    p = joint / len(a)
    pa, pb = p.sum(1), p.sum(0)
    ha, hb = -(pa * np.log(pa)).sum(), -(pb * np.log(pb)).sum()
    if ha <= 0 or hb <= 0:
        return None
    nz = p > 0
    return float((p[nz] * np.log(p[nz] / np.outer(pa, pb)[nz])).sum() / math.sqrt(ha * hb))


def cluster_share(X, labels):
    """The share of X's variance between the groups of labels: 1 - sum_i ||x_i - mean of its group||^2 /
    sum_i ||x_i - mean||^2 (1 when each group is one point, 0 when every group has the overall mean);
    None when X is constant."""
    X = np.asarray(X, np.float64)
    total = float(((X - X.mean(0)) ** 2).sum())
    if total <= 0:
        return None
    within = sum(float(((X[labels == g] - X[labels == g].mean(0)) ** 2).sum()) for g in np.unique(labels))
    return 1.0 - within / total


def mean_se(a):
    """Standard error of the mean of a (n,): sd (ddof 1) / sqrt(n); 0 for fewer than two values."""
    a = np.asarray(a, np.float64)
    return float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else 0.0


def ratio_se(num, den):
    """The ratio R = sum num / sum den of per-unit sums num, den (n,) (units: sequences, or folds) and its standard
    error by linearisation, sqrt(n / (n - 1) sum (num_i - R den_i)^2) / sum den; (None, None) when sum den
    is 0."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    if den.sum() <= 0:
        return None, None
    r = num.sum() / den.sum()
    n = len(num)
    se = math.sqrt(n / (n - 1) * ((num - r * den) ** 2).sum()) / den.sum() if n > 1 else 0.0
    return float(r), float(se)


def seed_sd(values):
    """The spread of a baseline over its seeds: sd with ddof 1 (0 for fewer than two)."""
    v = np.asarray(values, np.float64)
    return float(v.std(ddof=1)) if len(v) > 1 else 0.0


def onehot(a):
    """a (N,) -> (N, number of distinct values) indicator columns."""
    return (np.asarray(a)[:, None] == np.unique(a)[None, :]).astype(np.float64)
