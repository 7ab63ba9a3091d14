"""state_clusters: probe 7, do a model's final states form one discrete cluster per hidden state?

The revised Paper I reports that a selective SSM's final states on the HMM form five discrete clusters, one per
hidden state. Measured here on any family, on a task that names what its posterior's classes are (a task's
CLUSTERS, the HMM's "hidden state"), at the answer rows:
    labels     the MAP class of the exact posterior at each row (the hidden state most probable given the
               observations so far)
    agreement  NMI between the k-means clusters of the final state (k = the number of classes) and the labels
    discrete   the share of the state's variance between its k-means clusters, against the same share of the
               exact posterior vectors themselves (clustered the same way): clusters the posterior already
               has are the task's, read through, not the model's
Controls: the same clustering of the states of randomly initialised models of the same family (the
architecture alone, five seeds), and the labels shuffled (the NMI of no relation). Noise: the standard error
over folds of the sequences (each fold clustered on its own), the initialisations' sd over seeds, the
shuffles' sd. verdicts.state_clusters turns these into a verdict. Reported beside it, outside the rule: the
NMI of the same clusters with the row's own input token (clusters that are the last observation, not the state).
"""

import numpy as np

from geometry import measures as ms

SHUFFLES = 20               # shuffled labellings for the NMI of no relation


def fold_values(X, P, labels, seq, k, seed):
    """Per fold of the sequences (seq % READOUT_FOLDS), each clustered on its own: the NMI of the state's
    clusters with the labels, and the state's between-cluster share minus the posterior's. -> two lists."""
    nmis, diffs = [], []
    for f in np.unique(seq % ms.READOUT_FOLDS):
        rows = seq % ms.READOUT_FOLDS == f
        km = ms.kmeans(X[rows], k, seed)
        a, b = ms.cluster_share(X[rows], km), ms.cluster_share(P[rows], ms.kmeans(P[rows], k, seed))
        nmis.append(ms.nmi(km, labels[rows]))
        diffs.append(None if a is None or b is None else a - b)
    return nmis, diffs


def mean_and_se(values):
    v = [x for x in values if x is not None]
    return (float(np.mean(v)), ms.mean_se(v)) if v else (None, None)


def cluster_probe(X, posterior, seq, init_states, seed=0, tokens=None):
    """X (N, C): the trained model's final state at the answer rows; posterior (N, K): the exact posterior
    there; seq (N,): each row's sequence; init_states: [(N, C)] the same rows' final states under randomly
    initialised models of the same family, one per seed; tokens (N,): each row's input token, or None.
    -> the numbers of the module docstring."""
    X, P = np.asarray(X, np.float64), np.asarray(posterior, np.float64)
    k = P.shape[1]
    labels = P.argmax(1)                                                        # (N,) MAP class
    km = ms.kmeans(X, k, seed)
    rng = np.random.default_rng(seed)
    shuffled = [ms.nmi(km, rng.permutation(labels)) or 0.0 for _ in range(SHUFFLES)]   # None: constant labels
    init = [ms.kmeans(X0, k, seed) for X0 in init_states]
    nmis, diffs = fold_values(X, P, labels, seq, k, seed)
    (nmi_folds, nmi_se), (diff, diff_se) = mean_and_se(nmis), mean_and_se(diffs)
    return {"k": k, "rows": len(X), "label_shares": (np.bincount(labels, minlength=k) / len(labels)).tolist(),
            "nmi": ms.nmi(km, labels), "nmi_se": nmi_se, "nmi_folds_mean": nmi_folds,
            "share": ms.cluster_share(X, km),
            "nmi_init_per_seed": [ms.nmi(c, labels) for c in init],
            "share_init_per_seed": [ms.cluster_share(X0, c) for X0, c in zip(init_states, init)],
            "nmi_shuffled_mean": float(np.mean(shuffled)), "nmi_shuffled_sd": ms.seed_sd(shuffled),
            "posterior_share": ms.cluster_share(P, ms.kmeans(P, k, seed)),
            "share_beyond_posterior": diff, "share_beyond_posterior_se": diff_se,
            "nmi_token": None if tokens is None else ms.nmi(km, np.asarray(tokens))}
