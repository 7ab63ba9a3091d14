"""evaluation: a model's predictive distributions against the exact posterior, in bits.

The numbers every document here reports, each defined once:
    entropy_mae_bits       the papers' metric (paper_metric): average H over sequences at each answer
                           index first (the i-th answer of every sequence), then the mean over answer
                           indices of |H_model - H_Bayes|
    entropy_mae_seq_bits   the mean over every answer of every sequence of |H_model - H_Bayes|
    kl_bits                the mean KL(posterior || model) per answer
    excess_ce_bits         cross-entropy of the sampled targets under the model minus under the posterior
    impossible_mass        the mean model probability on answers the posterior rules out (a probability)
    prior_kl_bits          the mean KL(posterior || uniform): the KL of a predictor that ignores the context,
                           the denominator of the score that reads the same on every task (primitives/matrix.py)
    prior_only             that uniform predictor's paper metric, per-sequence MAE and KL on the same answers
                           (the summary table's "prior only" row: measured, so it moves with the held-out
                           sample as the models' rows do, where tasks.prior_gap_bits is its expectation)
The answers of a row are its supervised positions (mask > 0) but those its query_mask marks (the
sawtooth's final query), which the paper's curve leaves out. Rows may have their answers at other
positions, and other numbers of them; the i-th answer of a row is its i-th supervised position.

A batch may name answer groups (batch["groups"] = {name: (n, T) mask}, each inside mask: the sawtooth's
final query, the recall's stored and unstored keys). Each is scored over all its answers, pooled over the
rows, under metrics["groups"][name] (group_metrics): the KL, the excess cross-entropy, the per-sequence
MAE, the mean entropies of the model and of the posterior, and where the posterior is one-hot the
accuracy of the model's argmax.
"""

import numpy as np

from tunnels import windtunnels as wt

CONFIDENT, IMPLAUSIBLE = 0.5, 0.05  # hallucinated: more than half the mass on an answer the posterior gives < 5%
DOUBT_BITS = 1.0                    # honest doubt: at least a coin flip's entropy where the posterior is certain


def answers(batch):
    """-> positions (n, P) int and valid (n, P) bool: row b's i-th answer sits at positions[b, i] where
    valid[b, i] (P is the largest count of any row; the rest is padding): the answers of the paper's curve,
    every supervised position but those query_mask leaves out. ValueError in one line for a batch that
    cannot be scored."""
    mask = np.asarray(batch["mask"]) > 0
    n, T = mask.shape
    if batch["tokens"].shape != (n, T) or batch["posterior"].shape[:2] != (n, T):
        raise ValueError(f"batch shapes do not agree: tokens {batch['tokens'].shape}, mask {(n, T)}, "
                         f"posterior {batch['posterior'].shape}")
    query = np.asarray(batch.get("query_mask", np.zeros((n, T)))) > 0
    if np.any(query & ~mask):
        raise ValueError("the batch's query_mask marks positions its mask does not supervise")
    chosen = mask & ~query
    if not chosen.any(axis=1).all():
        raise ValueError(f"row {int(np.flatnonzero(~chosen.any(axis=1))[0])} of the batch has no supervised answer")
    sums = batch["posterior"][mask].sum(-1)
    if not np.allclose(sums, 1.0, atol=1e-6):
        raise ValueError("the batch's posterior is not a distribution at every supervised position")
    count = chosen.sum(axis=1)                                      # (n,)
    P = int(count.max()) if n else 0
    order = np.argsort(~chosen, axis=1, kind="stable")[:, :P]       # (n, P) the chosen positions first, in order
    valid = np.arange(P)[None, :] < count[:, None]                  # (n, P)
    return np.where(valid, order, 0), valid


def gather(a, positions):
    """a (n, T, ...) -> (n, P, ...) the entries at each row's positions (n, P). Where every row has the same
    positions this is a[:, positions[0]], whose memory layout (and so the last bits of the sums over it)
    is the one the documented numbers were computed with."""
    if len(positions) and np.all(positions == positions[0]):
        return a[:, positions[0]]
    return np.take_along_axis(a, positions.reshape(positions.shape + (1,) * (a.ndim - 2)), axis=1)


def masked_mean(x, valid, axis=None):
    """The mean of x over its valid entries (along axis). Where every entry is valid: x.mean(axis), whose
    order of summation (and so whose last bits) the documented numbers were computed with."""
    return x.mean(axis) if valid.all() else np.mean(x, axis=axis, where=valid)


def paper_metric(h_model, h_bayes, valid):
    """The papers' entropy MAE: h (n, P) at each row's i-th answer, valid (n, P). Average H over the
    sequences that have an i-th answer, then the mean over i of |H_model - H_Bayes|, in bits."""
    mean = lambda h: masked_mean(h, valid, axis=0)                  # (P,) over the sequences with an i-th answer
    return float(np.abs(mean(h_model) - mean(h_bayes)).mean())


def calibration(q, post, valid=None):
    """q, post (n, P, K) model and exact distributions at each row's P answers (valid (n, P), default all)
    -> the paper metric, the per-sequence MAE and the KL, in bits, and the entropies (n, P) they come from."""
    valid = np.ones(q.shape[:2], bool) if valid is None else valid
    h_model, h_bayes = wt.entropy_bits(q), wt.entropy_bits(post)   # (n, P)
    return {"entropy_mae_bits": paper_metric(h_model, h_bayes, valid),
            "entropy_mae_seq_bits": float(masked_mean(np.abs(h_model - h_bayes), valid)),
            "kl_bits": float(masked_mean(wt.kl_bits(post, q), valid))}, h_model, h_bayes


def evaluate(predict, batch):
    """predict(tokens) -> (n, T, K) probabilities. -> (metrics, traces): the numbers above, per answer index,
    and the entropies of the first 8 sequences at their answers (the single-sequence figure; NaN past a
    row's last answer)."""
    pos, valid = answers(batch)
    q_all = predict(batch["tokens"])                                # (n, T, K)
    post, q = gather(batch["posterior"], pos), gather(q_all, pos)  # (n, P, K)
    metrics, h_model, h_bayes = calibration(q, post, valid)
    kl = wt.kl_bits(post, q)                                        # (n, P)
    impossible = np.where(post == 0, q, 0.0).sum(-1)                # (n, P) mass on ruled-out answers
    y = gather(batch["targets"], pos)[..., None]                    # (n, P, 1)
    ce_model = -np.log2(np.maximum(np.take_along_axis(q, y, -1)[..., 0], wt.TINY))
    ce_bayes = -np.log2(np.maximum(np.take_along_axis(post, y, -1)[..., 0], wt.TINY))
    at = lambda a, i: float(masked_mean(a[:, i], valid[:, i]))
    uniform = np.full(q.shape, 1.0 / q.shape[-1])                   # (n, P, K)
    prior_only = calibration(uniform, post, valid)[0]
    metrics.update(
        prior_kl_bits=prior_only["kl_bits"], prior_only=prior_only,
        excess_ce_bits=float(masked_mean(ce_model, valid) - masked_mean(ce_bayes, valid)),
        impossible_mass=float(masked_mean(impossible, valid)),
        per_position=[dict(position=int(i + 1), H_model=at(h_model, i), H_bayes=at(h_bayes, i), kl=at(kl, i),
                           impossible_mass=at(impossible, i)) for i in range(pos.shape[1])])
    groups = {g: group_metrics(q_all, batch, where) for g, where in answer_groups(batch).items()}
    if groups:
        metrics["groups"] = groups
    nan = lambda h: np.where(valid[:8], h[:8], np.nan)
    return metrics, dict(h_model=nan(h_model), h_bayes=nan(h_bayes))


def answer_groups(batch):
    """The batch's named answer groups as {name: (n, T) bool}; ValueError in one line for a group that marks
    a position its mask does not supervise, or marks none."""
    mask = np.asarray(batch["mask"]) > 0
    out = {}
    for name, where in batch.get("groups", {}).items():
        where = np.asarray(where) > 0
        if where.shape != mask.shape or np.any(where & ~mask) or not where.any():
            raise ValueError(f"answer group {name!r} must mark supervised positions of the batch (shape "
                             f"{mask.shape}), at least one")
        out[name] = where
    return out


def group_metrics(q_all, batch, where):
    """q_all (n, T, K) the model's distributions, where (n, T) bool one group's answers -> its numbers, over
    the N answers it marks (each answer weighs the same, whatever its row): n_answers; kl_bits, the mean
    KL(posterior || model); excess_ce_bits, the mean cross-entropy of the targets under the model minus under
    the posterior; entropy_mae_seq_bits, the mean |H_model - H_Bayes|; h_model_bits and h_bayes_bits, the mean
    entropies; one_hot, the share of its answers whose posterior is one-hot, and where there are any,
    accuracy: how often the model's argmax is that answer; and two shares of all its answers, defined
    before any run read them: hallucinated, the model puts more than CONFIDENT of its mass on one answer
    the posterior gives less than IMPLAUSIBLE (confident and wrong); honest_doubt, the posterior is one-hot,
    the model's entropy is at least DOUBT_BITS, it gives the true answer at least IMPLAUSIBLE and it does not
    hallucinate (unsure, but not ruling out the truth)."""
    q, post, y = q_all[where], batch["posterior"][where], batch["targets"][where]      # (N, K), (N, K), (N,)
    ce = lambda p: -np.log2(np.maximum(p[np.arange(len(y)), y], wt.TINY))             # (N,)
    h_model, h_bayes = wt.entropy_bits(q), wt.entropy_bits(post)
    one_hot = post.max(-1) == 1.0
    out = dict(n_answers=int(where.sum()), kl_bits=float(wt.kl_bits(post, q).mean()),
               excess_ce_bits=float(ce(q).mean() - ce(post).mean()),
               entropy_mae_seq_bits=float(np.abs(h_model - h_bayes).mean()),
               h_model_bits=float(h_model.mean()), h_bayes_bits=float(h_bayes.mean()), one_hot=float(one_hot.mean()))
    hallucinated = np.any((q > CONFIDENT) & (post < IMPLAUSIBLE), axis=-1)            # (N,)
    out.update(hallucinated=float(hallucinated.mean()),
               honest_doubt=float((one_hot & (h_model >= DOUBT_BITS) & ~hallucinated
                                   & (q[np.arange(len(q)), post.argmax(-1)] >= IMPLAUSIBLE)).mean()))
    if one_hot.any():
        out["accuracy"] = float((q[one_hot].argmax(-1) == post[one_hot].argmax(-1)).mean())
    return out
