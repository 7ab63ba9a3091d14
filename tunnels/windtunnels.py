"""windtunnels: the mathematics every wind tunnel shares, in bits: entropy, KL, sampling, checks.

A wind tunnel is a task whose Bayes-optimal predictive distribution is known in closed form and where
memorisation is impossible: a fresh task instance (a permutation, an HMM, noise) is drawn for every
sequence. Each token wind tunnel is one module, registered in tasks.TASKS (tunnels/bijection.py,
tunnels/sawtooth.py, tunnels/hmm.py); Paper II's sticky chain, with continuous inputs, is tunnels/sticky.py. Everything is
float64 NumPy, seeded by a numpy.random.Generator passed in by the caller.

A "batch" of a token wind tunnel is a dict of
    tokens (n, T) int64, targets (n, T) int64, mask (n, T) float64 (1 at a supervised position),
    posterior (n, T, K) float64 (zeros where mask == 0),
and optionally query_mask (n, T) float64: 1 at a supervised position the paper's entropy curve leaves
out (the sawtooth's final query), and groups {name: (n, T) float64}: named answer groups, each scored on
its own (evaluation.group_metrics); a task with chains of thought adds final_posterior (n, K) and
final_target (n,), each row's last answer given the context alone (primitives/cot.py). Supervised positions may
differ from row to row; rows_of slices a batch.
Entropies and KL divergences are in bits.
"""
import numpy as np

TINY = np.finfo(np.float64).tiny  # q is clipped here in kl_bits so log2(q) stays finite


# ----------------------------------------------------------------------------
# common helpers


def entropy_bits(p, axis=-1):
    """Shannon entropy H(p) = -sum p log2 p in bits, with 0 log 0 = 0."""
    p = np.asarray(p, dtype=np.float64)
    log_p = np.log2(np.where(p > 0, p, 1.0))  # log2 1 = 0 where p == 0
    return -np.sum(p * log_p, axis=axis) + 0.0  # + 0.0: a certain posterior's -0.0 becomes 0 (it printed as "-0.")


def kl_bits(p, q, axis=-1):
    """KL(p || q) = sum p log2(p / q) in bits; terms with p = 0 contribute 0."""
    p = np.asarray(p, dtype=np.float64)
    q = np.maximum(np.asarray(q, dtype=np.float64), TINY)
    log_p = np.log2(np.where(p > 0, p, 1.0))
    return np.sum(p * (log_p - np.log2(q)), axis=axis)


def rows_of(batch, rows):
    """The batch's rows (a slice or an index array) -> a batch, its answer groups sliced alike."""
    return {k: ({g: m[rows] for g, m in v.items()} if k == "groups" else v[rows]) for k, v in batch.items()}


def parse_stages(text, top, what, example):
    """A curriculum "A:S,A2:S2,..." -> [(S, A), ...]: the value A (an alphabet, a number of pairs) before step
    S, then A2 before S2, ...; after the last stage, the task itself. "" or None -> []. ValueError in one
    line if malformed: each value in 1..top, the steps increasing."""
    stages = []
    for part in (text or "").split(","):
        if not part.strip():
            continue
        try:
            A, S = (int(x) for x in part.split(":"))
        except ValueError:
            raise ValueError(f"expected stages {what}:until_step, e.g. {example}") from None
        if not 1 <= A <= top or S < 1 or (stages and S <= stages[-1][0]):
            raise ValueError(f"each {what} must lie in 1..{top} and the steps must increase")
        stages.append((S, A))
    return stages


def stage_at(stages, step):
    """The curriculum's value at this training step (None: the task itself; also when step is None)."""
    for until, A in stages:
        if step is not None and step < until:
            return A
    return None


def check_stages(stages_or_error, steps):
    """What is wrong with a parsed curriculum (or the parser's ValueError), or None; with the run's steps
    known, a curriculum that lasts the whole run (the task itself never trained) is wrong too."""
    if isinstance(stages_or_error, ValueError):
        return str(stages_or_error)
    if stages_or_error and steps and stages_or_error[-1][0] >= steps:
        return f"its last stage ends at step {stages_or_error[-1][0]}, not before the run's end (--steps {steps})"
    return None


def sample_categorical(rng, p):
    """One draw per row of p by inverting the CDF: (..., k) -> (...) int64."""
    cdf = np.cumsum(p, axis=-1)  # (..., k)
    u = rng.random(p.shape[:-1])  # (...)
    i = np.sum(cdf <= u[..., None], axis=-1)  # first index with u < cdf[i]; p = 0 is never drawn
    return np.minimum(i, p.shape[-1] - 1).astype(np.int64)  # guard against cdf[-1] < u by rounding


def logsumexp(a, axis):
    """log sum exp(a) along axis, stable, and -inf (not nan) for an all -inf slice."""
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = m + np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True))
    return np.squeeze(out, axis=axis)


def check_stochastic(P, name, square=True):
    """Raise ValueError unless P (..., k, k), or (..., k, m) if not square, has non-negative rows summing to 1."""
    P = np.asarray(P, dtype=np.float64)
    if P.ndim < 2 or (square and P.shape[-1] != P.shape[-2]):
        raise ValueError(f"{name} must be a (k, k) matrix, got shape {P.shape}")
    if np.any(P < 0) or not np.allclose(P.sum(-1), 1.0, atol=1e-9):
        raise ValueError(f"{name} must have non-negative rows summing to 1")
    return P
