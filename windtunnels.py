"""Bayesian wind tunnels: the tasks and their exact posteriors (Paper I, Paper II).

A wind tunnel is a task whose Bayes-optimal predictive distribution is known in
closed form and where memorisation is impossible: a fresh task instance (a
permutation, an HMM, noise) is drawn for every sequence. Everything here is
float64 NumPy, seeded by a numpy.random.Generator passed in by the caller.

Notation, fixed for the whole module:
    n     sequences in a batch
    Tlen  tokens per sequence
    V     keys = values of the bijection task;  L  (key, value) pairs per sequence
    S     hidden states (= observation symbols) of the HMM;  K  observations
    M     symbols of the sticky chain;  T  time steps;  d  input dimension
    T, E  in the HMM section: transition and emission matrices, rows sum to 1
Entropies and KL divergences are in bits. A "batch" is a dict with
    tokens (n, Tlen) int64, targets (n, Tlen) int64, mask (n, Tlen) float64,
    posterior (n, Tlen, classes) float64 (zeros where mask == 0),
and the sawtooth's also query_mask (n, Tlen) float64, 1 at its final query (a supervised position
the paper's entropy curve leaves out).
"""
import numpy as np

TINY = np.finfo(np.float64).tiny  # q is clipped here in kl_bits so log2(q) stays finite


# ----------------------------------------------------------------------------
# common helpers


def entropy_bits(p, axis=-1):
    """Shannon entropy H(p) = -sum p log2 p in bits, with 0 log 0 = 0."""
    p = np.asarray(p, dtype=np.float64)
    log_p = np.log2(np.where(p > 0, p, 1.0))  # log2 1 = 0 where p == 0
    return -np.sum(p * log_p, axis=axis)


def kl_bits(p, q, axis=-1):
    """KL(p || q) = sum p log2(p / q) in bits; terms with p = 0 contribute 0."""
    p = np.asarray(p, dtype=np.float64)
    q = np.maximum(np.asarray(q, dtype=np.float64), TINY)
    log_p = np.log2(np.where(p > 0, p, 1.0))
    return np.sum(p * (log_p - np.log2(q)), axis=axis)


def _sample_categorical(rng, p):
    """One draw per row of p by inverting the CDF: (..., k) -> (...) int64."""
    cdf = np.cumsum(p, axis=-1)  # (..., k)
    u = rng.random(p.shape[:-1])  # (...)
    i = np.sum(cdf <= u[..., None], axis=-1)  # first index with u < cdf[i]; p = 0 is never drawn
    return np.minimum(i, p.shape[-1] - 1).astype(np.int64)  # guard against cdf[-1] < u by rounding


def _logsumexp(a, axis):
    """log sum exp(a) along axis, stable, and -inf (not nan) for an all -inf slice."""
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = m + np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True))
    return np.squeeze(out, axis=axis)


def _check_stochastic(P, name, square=True):
    """Raise ValueError unless P (..., k, k), or (..., k, m) if not square, has non-negative rows summing to 1."""
    P = np.asarray(P, dtype=np.float64)
    if P.ndim < 2 or (square and P.shape[-1] != P.shape[-2]):
        raise ValueError(f"{name} must be a (k, k) matrix, got shape {P.shape}")
    if np.any(P < 0) or not np.allclose(P.sum(-1), 1.0, atol=1e-9):
        raise ValueError(f"{name} must have non-negative rows summing to 1")
    return P


# ----------------------------------------------------------------------------
# Wind tunnel 1: bijection elimination (Paper I)
#
# A fresh uniformly random bijection pi: {0..V-1} -> {0..V-1} per sequence.
# Tokens: key k is token k, value v is token V + v; the sequence is
# k1 v1 k2 v2 ... kL vL [q], with vi = pi(ki) and an optional final query key q
# repeated from the context. At every key the model predicts the value class
# (0..V-1) that follows. Given m distinct (key, value) pairs, the bijections
# consistent with them number (V - m)!, and each unassigned value is the image
# of a new key in (V - m - 1)! of them: the posterior is uniform over the
# V - m unassigned values, or one-hot if the key was already seen.


def bijection_posterior(keys, values, V):
    """Reference posterior of each value given the pairs before it: (L,), (L,) -> (L, V)."""
    keys = np.asarray(keys, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    if keys.ndim != 1 or keys.shape != values.shape:
        raise ValueError(f"keys and values must be 1-D of equal length, got {keys.shape} and {values.shape}")
    if V < 2:
        raise ValueError(f"V must be >= 2, got {V}")
    if keys.size and (keys.min() < 0 or keys.max() >= V or values.min() < 0 or values.max() >= V):
        raise ValueError(f"keys and values must lie in 0..{V - 1}")
    posterior = np.zeros((len(keys), V))  # (L, V)
    known = {}  # key -> value, from the pairs seen so far
    for i, (k, v) in enumerate(zip(keys.tolist(), values.tolist())):
        if k in known:
            posterior[i, known[k]] = 1.0  # a seen key: its value is determined
            if known[k] != v:
                raise ValueError(f"pair {i} maps key {k} to {v}, but it was mapped to {known[k]} before")
        else:
            free = np.ones(V)  # (V,) 1 for values no earlier key has taken
            free[list(known.values())] = 0.0
            posterior[i] = free / free.sum()  # uniform over the V - m unassigned values
            if free[v] == 0:
                raise ValueError(f"pair {i} maps new key {k} to value {v}, already taken by another key")
            known[k] = v
    return posterior


def _bijection_posterior_batch(keys, values, V):
    """Vectorised bijection_posterior for consistent pairs: (n, L), (n, L) -> (n, L, V)."""
    eye = np.eye(V)
    key_onehot = eye[keys]  # (n, L, V)
    value_onehot = eye[values]  # (n, L, V)
    keys_before = np.cumsum(key_onehot, axis=1) - key_onehot  # (n, L, V) counts over pairs j < i
    values_before = np.cumsum(value_onehot, axis=1) - value_onehot  # (n, L, V)
    seen_key = np.sum(keys_before * key_onehot, axis=-1) > 0  # (n, L) keys[i] appeared before i
    free = (values_before == 0).astype(np.float64)  # (n, L, V) values not yet assigned
    uniform_free = free / np.maximum(free.sum(-1, keepdims=True), 1.0)  # (n, L, V)
    return np.where(seen_key[..., None], value_onehot, uniform_free)  # (n, L, V)


def bijection_batch(rng, n, V=20, L=None, replacement=False, query=False):
    """n sequences of the bijection task with exact posteriors at every key; Tlen = 2L (+1 with query)."""
    L = V - 1 if L is None else L
    if V < 2:
        raise ValueError(f"V must be >= 2, got {V}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if L < 1:
        raise ValueError(f"L must be >= 1, got {L}")
    if not replacement and L > V:
        raise ValueError(f"L must be <= V = {V} without replacement, got L = {L}")
    identity = np.tile(np.arange(V), (n, 1))  # (n, V)
    perm = rng.permuted(identity, axis=1)  # (n, V) perm[b, key] = value: a fresh bijection per sequence
    if replacement:
        keys = rng.integers(0, V, size=(n, L))  # (n, L) iid uniform keys
    else:
        keys = rng.permuted(identity, axis=1)[:, :L]  # (n, L) L distinct keys in random order
    values = np.take_along_axis(perm, keys, axis=1)  # (n, L) values[b, i] = perm[b, keys[b, i]]

    Tlen = 2 * L + int(bool(query))
    tokens = np.zeros((n, Tlen), dtype=np.int64)
    targets = np.zeros((n, Tlen), dtype=np.int64)
    mask = np.zeros((n, Tlen))
    posterior = np.zeros((n, Tlen, V))
    at_key = slice(0, 2 * L, 2)  # positions of k1 .. kL
    tokens[:, at_key] = keys
    tokens[:, 1 : 2 * L : 2] = V + values
    targets[:, at_key] = values
    mask[:, at_key] = 1.0
    posterior[:, at_key] = _bijection_posterior_batch(keys, values, V)  # (n, L, V)
    if query:
        rows = np.arange(n)
        j = rng.integers(0, L, size=n)  # (n,) which context pair is queried
        tokens[:, -1] = keys[rows, j]
        targets[:, -1] = values[rows, j]
        mask[:, -1] = 1.0
        posterior[:, -1] = np.eye(V)[values[rows, j]]  # the queried key was seen: one-hot
    return dict(tokens=tokens, targets=targets, mask=mask, posterior=posterior)


def bijection_entropy_curve(V, L=None):
    """H_Bayes(i) = log2(V - i + 1) bits at the i-th key, i = 1..L (keys without replacement): (L,)."""
    L = V - 1 if L is None else L
    if V < 2:
        raise ValueError(f"V must be >= 2, got {V}")
    if L < 1 or L > V:
        raise ValueError(f"L must be in 1..{V}, got {L}")
    i = np.arange(1, L + 1)  # (L,)
    return np.log2(V - i + 1.0)


# ----------------------------------------------------------------------------
# Wind tunnel 1b: Paper I's sawtooth variant of the bijection
#
# One shared vocabulary 0..V-1 for keys and values, keys drawn WITH replacement, and a final
# query key q drawn from the context keys:   k1 v1 k2 v2 ... kL vL q.
# The model predicts v_i at the key k_i and pi(q) at q. Posterior at k_i: one-hot if k_i
# appeared before (its value is known), else uniform over the V - m values the m distinct earlier
# keys have not taken; at q: one-hot. The entropy along one sequence is a sawtooth, and it is
# not a function of the position. The posterior depends only on the pairs seen, never on how
# the keys were drawn, so a curriculum that draws keys from a smaller alphabet (more repeats)
# keeps every target exact.


def sawtooth_batch(rng, n, V=20, L=None, alphabet=None):
    """n sequences of the sawtooth bijection, Tlen = 2L + 1, with exact posteriors at every key and
    at the query. alphabet: draw each sequence's keys from a random subset of that many keys
    (default V: uniform over all keys)."""
    L = V - 1 if L is None else L
    A = V if alphabet is None else int(alphabet)
    if V < 2:
        raise ValueError(f"V must be >= 2, got {V}")
    if n < 1 or L < 1:
        raise ValueError(f"n and L must be >= 1, got n = {n}, L = {L}")
    if not 1 <= A <= V:
        raise ValueError(f"alphabet must lie in 1..{V}, got {alphabet}")
    identity = np.tile(np.arange(V), (n, 1))  # (n, V)
    perm = rng.permuted(identity, axis=1)  # (n, V) a fresh bijection per sequence
    subset = rng.permuted(identity, axis=1)[:, :A]  # (n, A) the keys this sequence may use
    keys = np.take_along_axis(subset, rng.integers(0, A, size=(n, L)), axis=1)  # (n, L) iid from the subset
    values = np.take_along_axis(perm, keys, axis=1)  # (n, L)
    rows = np.arange(n)
    j = rng.integers(0, L, size=n)  # (n,) which context pair the query repeats
    query, answer = keys[rows, j], values[rows, j]

    Tlen = 2 * L + 1
    tokens = np.zeros((n, Tlen), dtype=np.int64)
    targets = np.zeros((n, Tlen), dtype=np.int64)
    mask = np.zeros((n, Tlen))
    posterior = np.zeros((n, Tlen, V))
    at_key = slice(0, 2 * L, 2)
    tokens[:, at_key], tokens[:, 1:2 * L:2], tokens[:, -1] = keys, values, query  # shared vocabulary
    targets[:, at_key], targets[:, -1] = values, answer
    mask[:, at_key], mask[:, -1] = 1.0, 1.0
    posterior[:, at_key] = _bijection_posterior_batch(keys, values, V)  # (n, L, V)
    posterior[:, -1] = np.eye(V)[answer]  # the query key was seen: one-hot
    query_mask = np.zeros((n, Tlen))
    query_mask[:, -1] = 1.0
    return dict(tokens=tokens, targets=targets, mask=mask, posterior=posterior, query_mask=query_mask)


def distinct_keys_distribution(V, n):
    """P(m distinct keys among n iid uniform draws from V), m = 0..V: (V + 1,). By the recursion
    P_{n+1}(m) = P_n(m) m / V + P_n(m - 1) (V - m + 1) / V, P_0 = [1, 0, ...]."""
    p = np.zeros(V + 1)
    p[0] = 1.0
    m = np.arange(V + 1)
    for _ in range(n):
        new = p * m / V  # the draw repeats one of the m keys
        new[1:] += p[:-1] * (V - m[1:] + 1) / V  # the draw is a new key
        p = new
    return p


def sawtooth_entropy_curve(V, L=None):
    """E[H_Bayes] at the i-th key of the sawtooth, i = 1..L, averaged over sequences: (L,).
    With m distinct earlier keys the key is new with probability (V - m) / V, and then
    H = log2(V - m); a repeated key has H = 0."""
    L = V - 1 if L is None else L
    if V < 2 or L < 1:
        raise ValueError(f"need V >= 2 and L >= 1, got V = {V}, L = {L}")
    m = np.arange(V + 1)
    h_new = np.log2(np.maximum(V - m, 1))  # (V + 1,) entropy with a new key after m distinct keys
    return np.array([distinct_keys_distribution(V, i - 1) @ ((V - m) / V * h_new) for i in range(1, L + 1)])


def prior_gap_bits(task, V=20, K=20, n=100_000, seed=0):
    """The paper metric of a predictor that learns only the prior (the authors' MLP, which sees one
    token and its position): mean over the predicted positions of |H(prior) - E[H_Bayes]|, bits.
    Per token and position the prior is uniform (every value, every state is exchangeable), so
    H(prior) = log2(#classes). bijection (format a), sawtooth (format b, the L value positions;
    the query is not in the paper's curve): exact. hmm: Monte Carlo over n fresh HMMs
    (standard error about 1e-3 bits at n = 100,000)."""
    if task == "bijection":
        h = bijection_entropy_curve(V)
        return float(np.mean(np.log2(V) - h))
    if task == "sawtooth":
        return float(np.mean(np.log2(V) - sawtooth_entropy_curve(V)))
    if task == "hmm":
        rng = np.random.default_rng(seed)
        h = np.zeros(K)
        for start in range(0, n, 10_000):  # in chunks: (10,000, 72, 5) posteriors at a time
            b = hmm_batch(rng, min(10_000, n - start), K)
            h += entropy_bits(b["posterior"][:, HMM_HEADER:]).sum(0)
        return float(np.mean(np.log2(HMM_S) - h / n))
    raise ValueError(f"task {task!r}: allowed are bijection, sawtooth, hmm")


# ----------------------------------------------------------------------------
# Wind tunnel 2: HMM state tracking (Paper I)
#
# A fresh HMM per sequence: s_0 ~ pi (uniform), o_t ~ E[s_t], s_{t+1} ~ T[s_t].
# Every row of T and E is Dirichlet(1, ..., 1), floored at 0.05, renormalised,
# and rounded to whole hundredths (each >= 5, summing to exactly 100). The
# parameters are given in context, one token per probability:
#   ids 0..95   the probabilities 0.05, 0.06, ..., 1.00   (value = (id + 5) / 100)
#   id  96      SEP
#   ids 97..101 observation symbols 0..4
# Sequence: T (25 entries, row-major) SEP E (25 entries) SEP o_0 .. o_{K-1}.
# Target at observation t: the true state s_t; its exact posterior is the
# filtering distribution p(s_t | o_0..o_t) from the forward algorithm.

HMM_S = 5  # hidden states = observation symbols
HMM_MIN_COUNT = 5  # smallest probability, in hundredths (0.05)
HMM_SEP = 96
HMM_OBS0 = 97  # token of observation symbol 0
HMM_VOCAB = 102
HMM_HEADER = 2 * HMM_S * HMM_S + 2  # 52 tokens before the first observation


def hmm_round_hundredths(p):
    """Round probability rows (..., S) to int64 hundredths, each >= 5, every row summing to exactly 100."""
    target = 100.0 * np.asarray(p, dtype=np.float64)  # (..., S) the ideal, fractional counts
    counts = np.maximum(np.rint(target), HMM_MIN_COUNT).astype(np.int64)  # (..., S)
    S = counts.shape[-1]
    if S * HMM_MIN_COUNT > 100:
        raise ValueError(f"rows of {S} entries cannot all be >= 0.05 and sum to 1")
    counts, target = counts.reshape(-1, S), target.reshape(-1, S)  # (R, S) one row per distribution
    rows = np.arange(len(counts))
    excess = counts.sum(-1) - 100  # (R,) hundredths too many (> 0) or too few (< 0)
    while np.any(excess):  # each pass moves every unbalanced row one hundredth closer to 100
        error = target - counts  # (R, S) > 0 where an entry was rounded down
        up = np.argmax(error, axis=-1)  # (R,) the entry most below its target
        down = np.argmax(np.where(counts > HMM_MIN_COUNT, -error, -np.inf), axis=-1)  # (R,) most above, still > 5
        counts[rows, up] += excess < 0
        counts[rows, down] -= excess > 0
        excess = counts.sum(-1) - 100
    return counts.reshape(np.shape(p))


def hmm_sample_params_batch(rng, n):
    """n random HMMs on the 0.01 grid: T, E each (n, S, S) float64, entries counts / 100."""
    p = rng.dirichlet(np.ones(HMM_S), size=(n, 2, HMM_S))  # (n, 2, S, S) rows of T and of E
    p = np.maximum(p, 0.05)
    p = p / p.sum(-1, keepdims=True)  # floored at 0.05, renormalised
    counts = hmm_round_hundredths(p)  # (n, 2, S, S) int64, rows sum to 100
    return counts[:, 0] / 100.0, counts[:, 1] / 100.0


def hmm_sample_params(rng):
    """One random HMM on the 0.01 grid: T, E each (S, S), every entry >= 0.05, rows sum to 1."""
    T, E = hmm_sample_params_batch(rng, 1)
    return T[0], E[0]


def hmm_filter(T, E, pi, obs):
    """Reference forward filter, normalised each step: row t = p(s_t | o_0..o_t): (S,S), (S,S), (S,), (K,) -> (K, S)."""
    T = _check_stochastic(T, "T")
    E = _check_stochastic(E, "E", square=False)  # (S, O): O symbols, 5 in the wind tunnel
    if E.shape[0] != len(T):
        raise ValueError(f"E must have one row per state ({len(T)}), got shape {E.shape}")
    pi = np.asarray(pi, dtype=np.float64)
    obs = np.asarray(obs, dtype=np.int64)
    if pi.shape != (len(T),) or np.any(pi < 0) or not np.isclose(pi.sum(), 1.0):
        raise ValueError(f"pi must be a distribution over the {len(T)} states, got {pi}")
    if obs.ndim != 1 or (obs.size and (obs.min() < 0 or obs.max() >= E.shape[1])):
        raise ValueError(f"obs must be 1-D with symbols in 0..{E.shape[1] - 1}")
    belief = np.zeros((len(obs), len(pi)))  # (K, S)
    prior = pi  # (S,) p(s_t | o_0..o_{t-1})
    for t, o in enumerate(obs):
        joint = prior * E[:, o]  # (S,) p(s_t, o_t | o_<t): weigh by the evidence
        if joint.sum() <= 0:
            raise ValueError(f"observation {t} has zero probability under this HMM")
        belief[t] = joint / joint.sum()  # (S,) p(s_t | o_<=t)
        prior = belief[t] @ T  # (S,) predict one step: p(s_{t+1} | o_<=t)
    return belief


def hmm_filter_batch(T, E, pi, obs):
    """hmm_filter over a batch of HMMs: (n,S,S), (n,S,S), (S,) or (n,S), (n,K) -> (n, K, S)."""
    T = np.asarray(T, dtype=np.float64)
    E = np.asarray(E, dtype=np.float64)
    obs = np.asarray(obs, dtype=np.int64)
    n, K = obs.shape
    S = T.shape[-1]
    pi = np.broadcast_to(np.asarray(pi, dtype=np.float64), (n, S))
    emit = np.swapaxes(E, 1, 2)  # (n, O, S) emit[b, o, s] = p(o | s)
    lik = emit[np.arange(n)[:, None], obs]  # (n, K, S) p(o_t | s_t = s)
    belief = np.zeros((n, K, S))
    prior = pi  # (n, S)
    for t in range(K):
        joint = prior * lik[:, t]  # (n, S)
        if np.any(joint.sum(-1) <= 0):
            raise ValueError(f"observation {t} has zero probability under some HMM of the batch")
        belief[:, t] = joint / joint.sum(-1, keepdims=True)  # (n, S)
        prior = np.einsum("bi,bij->bj", belief[:, t], T)  # (n, S) one step through each T
    return belief


def _hmm_header_tokens(T, E):
    """Probability tokens of a batch of HMMs: (n, S, S), (n, S, S) -> (n, 52) int64."""
    n = len(T)
    tokens = []
    for name, P in (("T", T), ("E", E)):
        hundredths = np.rint(100.0 * P)  # (n, S, S)
        if np.any(np.abs(100.0 * P - hundredths) > 1e-6) or hundredths.min() < HMM_MIN_COUNT or hundredths.max() > 100:
            raise ValueError(f"{name} entries must be multiples of 0.01 in [0.05, 1.00]")
        if np.any(hundredths.sum(-1) != 100):
            raise ValueError(f"{name} rows must sum to exactly 1.00 (100 hundredths)")
        tokens.append(hundredths.reshape(n, -1).astype(np.int64) - HMM_MIN_COUNT)  # (n, 25) row-major
        tokens.append(np.full((n, 1), HMM_SEP, dtype=np.int64))
    return np.concatenate(tokens, axis=1)  # (n, 52)


def hmm_tokens(T, E, obs):
    """Token sequence T SEP E SEP o_0..o_{K-1}: (S,S), (S,S), (K,) -> (52 + K,) int64."""
    obs = np.asarray(obs, dtype=np.int64)
    if obs.ndim != 1 or (obs.size and (obs.min() < 0 or obs.max() >= HMM_S)):
        raise ValueError(f"obs must be 1-D with symbols in 0..{HMM_S - 1}")
    header = _hmm_header_tokens(np.asarray(T)[None], np.asarray(E)[None])[0]  # (52,)
    return np.concatenate([header, HMM_OBS0 + obs])


def hmm_detokenize(tokens):
    """Inverse of hmm_tokens: (52 + K,) -> T (S, S), E (S, S), obs (K,)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    n_prob = HMM_S * HMM_S
    if tokens.ndim != 1 or len(tokens) < HMM_HEADER:
        raise ValueError(f"need a 1-D sequence of at least {HMM_HEADER} tokens, got shape {tokens.shape}")
    if tokens[n_prob] != HMM_SEP or tokens[2 * n_prob + 1] != HMM_SEP:
        raise ValueError(f"expected SEP ({HMM_SEP}) at positions {n_prob} and {2 * n_prob + 1}")
    probs = np.r_[tokens[:n_prob], tokens[n_prob + 1 : 2 * n_prob + 1]]  # (50,)
    obs = tokens[HMM_HEADER:] - HMM_OBS0  # (K,)
    if probs.min() < 0 or probs.max() >= HMM_SEP:
        raise ValueError(f"probability tokens must lie in 0..{HMM_SEP - 1}")
    if obs.size and (obs.min() < 0 or obs.max() >= HMM_S):
        raise ValueError(f"observation tokens must lie in {HMM_OBS0}..{HMM_VOCAB - 1}")
    T = (probs[:n_prob] + HMM_MIN_COUNT).reshape(HMM_S, HMM_S) / 100.0
    E = (probs[n_prob:] + HMM_MIN_COUNT).reshape(HMM_S, HMM_S) / 100.0
    return T, E, obs


def hmm_batch(rng, n, K=20):
    """n sequences of the HMM task (a fresh HMM each) with exact filtering posteriors; Tlen = 52 + K."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    T, E = hmm_sample_params_batch(rng, n)  # (n, S, S) each
    rows = np.arange(n)
    states = np.zeros((n, K), dtype=np.int64)
    obs = np.zeros((n, K), dtype=np.int64)
    states[:, 0] = rng.integers(0, HMM_S, size=n)  # s_0 ~ uniform pi
    for t in range(K):
        obs[:, t] = _sample_categorical(rng, E[rows, states[:, t]])  # o_t ~ E[s_t]
        if t + 1 < K:
            states[:, t + 1] = _sample_categorical(rng, T[rows, states[:, t]])  # s_{t+1} ~ T[s_t]
    pi = np.full(HMM_S, 1.0 / HMM_S)

    tokens = np.concatenate([_hmm_header_tokens(T, E), HMM_OBS0 + obs], axis=1)  # (n, 52 + K)
    targets = np.zeros((n, HMM_HEADER + K), dtype=np.int64)
    mask = np.zeros((n, HMM_HEADER + K))
    posterior = np.zeros((n, HMM_HEADER + K, HMM_S))
    targets[:, HMM_HEADER:] = states
    mask[:, HMM_HEADER:] = 1.0
    posterior[:, HMM_HEADER:] = hmm_filter_batch(T, E, pi, obs)  # (n, K, S)
    return dict(tokens=tokens, targets=targets, mask=mask, posterior=posterior)


# ----------------------------------------------------------------------------
# Wind tunnel 3: sticky Markov chain (Paper II)
#
# Symbols y_0 .. y_T with y_0 uniform and y_{t+1} ~ P[y_t]; P keeps a symbol with
# probability 0.3 and otherwise moves to j with weight 1 / circular distance.
# The input at t is a noisy view of the current symbol,
#     x[t] = mu[y_t] + sigma * eps_t,   eps_t ~ N(0, I_d),   t = 0..T-1,
# and the target at t is y_{t+1}. This is an HMM with Gaussian emissions, so
#     p(y_{t+1} | x[0..t]) = sum_y p(y_t = y | x[0..t]) P[y, y_{t+1}]
# is exact by the forward filter. The authors compare with H(Y_{t+1} | Y_t),
# the loss of a predictor that sees y_t itself: a lower bound, not the optimum.


def sticky_transition(n_symbols=8, self_prob=0.3):
    """P (M, M): P[i, i] = self_prob, the rest spread over j != i proportionally to 1 / circular distance."""
    if n_symbols < 2:
        raise ValueError(f"n_symbols must be >= 2, got {n_symbols}")
    if not 0.0 <= self_prob <= 1.0:
        raise ValueError(f"self_prob must be in [0, 1], got {self_prob}")
    i = np.arange(n_symbols)
    gap = np.abs(i[:, None] - i[None, :])  # (M, M)
    dist = np.minimum(gap, n_symbols - gap)  # (M, M) circular distance, 0 on the diagonal
    weight = np.where(dist > 0, 1.0 / np.maximum(dist, 1), 0.0)  # (M, M) 1 / distance off the diagonal
    return (1.0 - self_prob) * weight / weight.sum(1, keepdims=True) + self_prob * np.eye(n_symbols)


def sticky_authors_self_prob(n_symbols=8, self_prob=0.3):
    """The self-transition of the authors' script, which normalises a row that already holds self_prob:
    row = [self_prob on the diagonal, 1 / distance elsewhere], divided by its sum S and scaled by
    1 - self_prob, then self_prob added on the diagonal, so P[i, i] = self_prob + self_prob (1 - self_prob) / S
    (0.3498 for 8 symbols), the rest still proportional to 1 / distance. Use it as sticky_transition's self_prob."""
    i = np.arange(1, n_symbols)
    S = self_prob + np.sum(1.0 / np.minimum(i, n_symbols - i))      # the row sum before normalising
    return float(self_prob + self_prob * (1.0 - self_prob) / S)


def sticky_means(rng, n_symbols=8, d=20):
    """Symbol embeddings mu (M, d), standard Gaussian."""
    if n_symbols < 1 or d < 1:
        raise ValueError(f"n_symbols and d must be >= 1, got {n_symbols} and {d}")
    return rng.standard_normal((n_symbols, d))


def _check_sticky(P, mu, sigma):
    """Validate the sticky-chain parameters; return P (M, M) and mu (M, d) as float64."""
    P = _check_stochastic(P, "P")
    mu = np.asarray(mu, dtype=np.float64)
    if P.ndim != 2 or mu.ndim != 2 or mu.shape[0] != P.shape[0]:
        raise ValueError(f"need P (M, M) and mu (M, d) with the same M, got {P.shape} and {mu.shape}")
    if not (np.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be a finite number > 0, got {sigma}")
    return P, mu


def sticky_sample(rng, P, mu, T, n=1, sigma=1.0):
    """n chains of T inputs: x (n, T, d) float64 and symbols y (n, T + 1) int64; targets are y[:, 1:]."""
    P, mu = _check_sticky(P, mu, sigma)
    if T < 1:
        raise ValueError(f"T must be >= 1, got {T}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    M, d = mu.shape
    y = np.zeros((n, T + 1), dtype=np.int64)
    y[:, 0] = rng.integers(0, M, size=n)  # y_0 uniform
    for t in range(T):
        y[:, t + 1] = _sample_categorical(rng, P[y[:, t]])  # y_{t+1} ~ P[y_t]
    x = mu[y[:, :T]] + sigma * rng.standard_normal((n, T, d))  # (n, T, d) noisy view of y_t
    return x, y


def sticky_posterior(P, mu, x, sigma):
    """Reference p(y_{t+1} | x[0..t]) by the forward filter in log space: x (T, d) -> (T, M)."""
    P, mu = _check_sticky(P, mu, sigma)
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != mu.shape[1]:
        raise ValueError(f"x must be (T, {mu.shape[1]}), got {x.shape}")
    M = len(P)
    with np.errstate(divide="ignore"):
        log_P = np.log(P)  # (M, M) -inf where a move is impossible
    log_lik = -np.sum((x[:, None, :] - mu[None]) ** 2, axis=-1) / (2 * sigma**2)  # (T, M) log N(x_t; mu_y) + const
    predictive = np.zeros((len(x), M))  # (T, M)
    log_prior = np.full(M, -np.log(M))  # (M,) log p(y_0) uniform
    for t in range(len(x)):
        log_belief = log_prior + log_lik[t]  # (M,) log p(y_t, x_t | x_<t) + const
        log_belief -= _logsumexp(log_belief, axis=0)  # log p(y_t | x_<=t)
        log_prior = _logsumexp(log_belief[:, None] + log_P, axis=0)  # (M,) log p(y_{t+1} | x_<=t)
        predictive[t] = np.exp(log_prior)
    return predictive


def sticky_posterior_batch(P, mu, x, sigma):
    """sticky_posterior over a batch: x (n, T, d) -> (n, T, M)."""
    P, mu = _check_sticky(P, mu, sigma)
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 3 or x.shape[2] != mu.shape[1]:
        raise ValueError(f"x must be (n, T, {mu.shape[1]}), got {x.shape}")
    n, T, _ = x.shape
    M = len(P)
    with np.errstate(divide="ignore"):
        log_P = np.log(P)  # (M, M)
    # -|x - mu|^2 / 2 sigma^2 = (x . mu - |mu|^2 / 2) / sigma^2 - |x|^2 / 2 sigma^2, the last term constant in y
    log_lik = (x @ mu.T - 0.5 * np.sum(mu**2, axis=1)) / sigma**2  # (n, T, M)
    predictive = np.zeros((n, T, M))
    log_prior = np.full((n, M), -np.log(M))  # (n, M)
    for t in range(T):
        log_belief = log_prior + log_lik[:, t]  # (n, M)
        log_belief -= _logsumexp(log_belief, axis=1)[:, None]  # (n, M) log p(y_t | x_<=t)
        log_prior = _logsumexp(log_belief[:, :, None] + log_P[None], axis=1)  # (n, M) log p(y_{t+1} | x_<=t)
        predictive[:, t] = np.exp(log_prior)
    return predictive


def sticky_conditional_entropy_bits(P):
    """H(Y_{t+1} | Y_t) = sum_i pi_i H(P[i]) in bits, pi the stationary distribution (pi P = pi)."""
    P = _check_stochastic(P, "P")
    M = len(P)
    A = np.vstack([P.T - np.eye(M), np.ones((1, M))])  # (M + 1, M) pi P = pi and sum(pi) = 1
    b = np.r_[np.zeros(M), 1.0]  # (M + 1,)
    stationary = np.linalg.lstsq(A, b, rcond=None)[0]  # (M,)
    return float(stationary @ entropy_bits(P, axis=1))
