"""evaluation: a model's predictive distributions against the exact posterior, in bits.

The numbers every document here reports, each defined once:
    entropy_mae_bits       the papers' metric: average H over sequences at each position first,
                           then the mean over positions of |H_model - H_Bayes|
    entropy_mae_seq_bits   the mean over sequences and positions of |H_model - H_Bayes|
    kl_bits                the mean KL(posterior || model) per position
    excess_ce_bits         cross-entropy of the sampled targets under the model minus under the posterior
    impossible_mass        the mean model probability on answers the posterior rules out (a probability)
On the sawtooth the paper's curve covers the L value positions; its final query (posterior
one-hot) is scored apart, under "query".
"""

import numpy as np

import windtunnels as wt


def calibration(q, post):
    """q, post (n, P, K) model and exact distributions at P positions -> the paper metric, the per-sequence
    MAE and the KL, in bits, and the entropies (n, P) they come from."""
    h_model, h_bayes = wt.entropy_bits(q), wt.entropy_bits(post)   # (n, P)
    return {"entropy_mae_bits": float(np.abs(h_model.mean(0) - h_bayes.mean(0)).mean()),
            "entropy_mae_seq_bits": float(np.abs(h_model - h_bayes).mean()),
            "kl_bits": float(wt.kl_bits(post, q).mean())}, h_model, h_bayes


def scored_columns(batch):
    """(value positions, query positions): every supervised position the paper's curve covers, and the
    sawtooth's final query (empty elsewhere). The same in every row."""
    cols = np.flatnonzero(batch["mask"][0] > 0)
    assert np.all(batch["mask"][:, cols] > 0)
    query = np.flatnonzero(batch["query_mask"][0] > 0) if "query_mask" in batch else np.array([], int)
    return np.setdiff1d(cols, query), query


def evaluate(predict, batch):
    """predict(tokens) -> (n, Tlen, K) probabilities. -> (metrics, traces): the numbers above, per position,
    and the entropies of the first 8 sequences (the single-sequence figure)."""
    q = predict(batch["tokens"])                                    # (n, Tlen, K)
    cols, query = scored_columns(batch)
    post, qc = batch["posterior"][:, cols], q[:, cols]              # (n, P, K)
    metrics, h_model, h_bayes = calibration(qc, post)
    kl = wt.kl_bits(post, qc)                                       # (n, P)
    impossible = np.where(post == 0, qc, 0.0).sum(-1)               # (n, P) mass on ruled-out answers
    y = batch["targets"][:, cols][..., None]
    ce_model = -np.log2(np.maximum(np.take_along_axis(qc, y, -1)[..., 0], wt.TINY))
    ce_bayes = -np.log2(np.take_along_axis(post, y, -1)[..., 0])
    metrics.update(
        excess_ce_bits=float(ce_model.mean() - ce_bayes.mean()),
        impossible_mass=float(impossible.mean()),
        per_position=[dict(position=int(i + 1), H_model=float(h_model[:, i].mean()),
                           H_bayes=float(h_bayes[:, i].mean()), kl=float(kl[:, i].mean()),
                           impossible_mass=float(impossible[:, i].mean())) for i in range(len(cols))])
    if len(query):                                                  # one-hot posterior: KL = -log2 q(answer)
        qq, answer = q[:, query[0]], batch["targets"][:, query[0]]  # (n, K), (n,)
        metrics["query"] = dict(kl_bits=float(wt.kl_bits(batch["posterior"][:, query[0]], qq).mean()),
                                accuracy=float((qq.argmax(-1) == answer).mean()))
    return metrics, dict(h_model=h_model[:8], h_bayes=h_bayes[:8])
