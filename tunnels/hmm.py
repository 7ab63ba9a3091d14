"""hmm: Paper I's HMM state tracking, as a task of tasks.TASKS.

A fresh HMM per sequence: s_0 ~ pi (uniform), o_t ~ E[s_t], s_{t+1} ~ P[s_t], with S = 5 states and 5
symbols. Every row of the transition matrix P and the emission matrix E is Dirichlet(1, ..., 1),
floored at 0.05, renormalised, and rounded to whole hundredths (each >= 5, summing to exactly 100).
The parameters are given in context, one token per probability:
    ids 0..95    the probabilities 0.05, 0.06, ..., 1.00   (value = (id + 5) / 100)
    id  96       SEP
    ids 97..101  observation symbols 0..4
Sequence: P (25 entries, row-major) SEP E (25 entries) SEP o_0 .. o_{n_obs-1}.
Target at observation t: the true state s_t; its exact posterior is the filtering distribution
p(s_t | o_0..o_t) from the forward algorithm. Trained at n_obs = 20 observations (--K), evaluated also
at 30 and 50 (length generalisation).

Notation: n sequences, T = 52 + n_obs tokens, S states (= symbols), P and E the HMM's matrices.
"""
import numpy as np

from tunnels import windtunnels as wt

SETTINGS = {"n_obs": 20}
TINY = {"train": {"n_obs": 3}, "grad": {"n_obs": 3}}   # the conformance tests' shapes: 55 positions (the header)
LEGACY_META = {"n_obs": "K"}    # older checkpoints' meta named the observations K
ANSWER_LABEL = "observation t"  # what the figures call the i-th answer
EVAL_LENGTHS = (30, 50)     # observations per held-out sequence past the training length
CLUSTERS = "hidden state"   # what the posterior's classes are (geometry's probe 7 clusters the states by them)


def check_n_obs(n_obs, s):
    return None if n_obs >= 1 else "the HMM needs at least 1 observation"


FLAGS = {"--K": dict(setting="n_obs", type=int, check=check_n_obs,
                     help="hmm: observations per training sequence (default 20)")}
PRESETS = {
    # the model's sizes are its family's (bayesattn.PRESETS, mlp_baseline.PRESETS)
    "quick":   dict(batch=16, steps=40, lr=3e-3, warmup=10),
    "default": dict(batch=32, steps=3000, lr=2e-3, warmup=100),
    "paper":   dict(batch=32, steps=17000, lr=1.5e-3, warmup=300, lr_floor=0.0),
}


# ----------------------------------------------------------------------------
# the task protocol

def sizes(s):
    """The learned positions cover the longest evaluated length; those past training stay untrained
    (a transformer reuses its last trained row there: bayesattn.Config.pos_limit)."""
    return dict(vocab=VOCAB, classes=S, max_len=HEADER + s["n_obs"],
                eval_len=HEADER + max([s["n_obs"], *EVAL_LENGTHS]))


def sample(rng, n, s, step=None):
    return batch(rng, n, s["n_obs"])


def variants(s):
    """More held-out sets, under metrics["length_generalization"]: the training length and the longer ones."""
    return {str(k): {**s, "n_obs": k} for k in [s["n_obs"]] + [k for k in EVAL_LENGTHS if k > s["n_obs"]]}


def held_out_key(s):
    """What the held-out generator's seed takes from the settings (tasks._held_out_seed): the length."""
    return s["n_obs"]


VARIANTS = "length_generalization"      # the metrics key of the held-out sets variants() makes, by label
VARIANT_FORMAT = "K = {}"               # how a label reads in tables and figures
VARIANT_TITLE = ("HMM: length generalisation (past the training length a transformer\nreuses its last trained "
                 "position's embedding)")


def prior_gap_bits(s, n=100_000, seed=0):
    """The paper metric of a prior-only predictor: mean over the observations of log2 S - E[H_Bayes],
    Monte Carlo over n fresh HMMs (standard error about 1e-3 bits at n = 100,000)."""
    rng = np.random.default_rng(seed)
    h = np.zeros(s["n_obs"])
    for start in range(0, n, 10_000):  # in chunks: (10,000, 72, 5) posteriors at a time
        b = batch(rng, min(10_000, n - start), s["n_obs"])
        h += wt.entropy_bits(b["posterior"][:, HEADER:]).sum(0)
    return float(np.mean(np.log2(S) - h / n))


def settings_of(cfg):
    return {"n_obs": 20}


# ----------------------------------------------------------------------------
# the sampler and the exact posterior

S = 5  # hidden states = observation symbols
MIN_COUNT = 5  # smallest probability, in hundredths (0.05)
SEP = 96
OBS0 = 97  # token of observation symbol 0
VOCAB = 102
HEADER = 2 * S * S + 2  # 52 tokens before the first observation


def round_hundredths(p):
    """Round probability rows (..., S) to int64 hundredths, each >= 5, every row summing to exactly 100."""
    target = 100.0 * np.asarray(p, dtype=np.float64)  # (..., S) the ideal, fractional counts
    counts = np.maximum(np.rint(target), MIN_COUNT).astype(np.int64)  # (..., S)
    S = counts.shape[-1]
    if S * MIN_COUNT > 100:
        raise ValueError(f"rows of {S} entries cannot all be >= 0.05 and sum to 1")
    counts, target = counts.reshape(-1, S), target.reshape(-1, S)  # (R, S) one row per distribution
    rows = np.arange(len(counts))
    excess = counts.sum(-1) - 100  # (R,) hundredths too many (> 0) or too few (< 0)
    while np.any(excess):  # each pass moves every unbalanced row one hundredth closer to 100
        error = target - counts  # (R, S) > 0 where an entry was rounded down
        up = np.argmax(error, axis=-1)  # (R,) the entry most below its target
        down = np.argmax(np.where(counts > MIN_COUNT, -error, -np.inf), axis=-1)  # (R,) most above, still > 5
        counts[rows, up] += excess < 0
        counts[rows, down] -= excess > 0
        excess = counts.sum(-1) - 100
    return counts.reshape(np.shape(p))


def sample_params_batch(rng, n):
    """n random HMMs on the 0.01 grid: P, E each (n, S, S) float64, entries counts / 100."""
    p = rng.dirichlet(np.ones(S), size=(n, 2, S))  # (n, 2, S, S) rows of P and of E
    p = np.maximum(p, 0.05)
    p = p / p.sum(-1, keepdims=True)  # floored at 0.05, renormalised
    counts = round_hundredths(p)  # (n, 2, S, S) int64, rows sum to 100
    return counts[:, 0] / 100.0, counts[:, 1] / 100.0


def sample_params(rng):
    """One random HMM on the 0.01 grid: P, E each (S, S), every entry >= 0.05, rows sum to 1."""
    P, E = sample_params_batch(rng, 1)
    return P[0], E[0]


def forward_filter(P, E, pi, obs):
    """Reference forward filter, normalised each step: row t = p(s_t | o_0..o_t): (S,S), (S,S), (S,), (n_obs,) -> (n_obs, S)."""
    P = wt.check_stochastic(P, "P")
    E = wt.check_stochastic(E, "E", square=False)  # (S, O): O symbols, 5 in the wind tunnel
    if E.shape[0] != len(P):
        raise ValueError(f"E must have one row per state ({len(P)}), got shape {E.shape}")
    pi = np.asarray(pi, dtype=np.float64)
    obs = np.asarray(obs, dtype=np.int64)
    if pi.shape != (len(P),) or np.any(pi < 0) or not np.isclose(pi.sum(), 1.0):
        raise ValueError(f"pi must be a distribution over the {len(P)} states, got {pi}")
    if obs.ndim != 1 or (obs.size and (obs.min() < 0 or obs.max() >= E.shape[1])):
        raise ValueError(f"obs must be 1-D with symbols in 0..{E.shape[1] - 1}")
    belief = np.zeros((len(obs), len(pi)))  # (n_obs, S)
    prior = pi  # (S,) p(s_t | o_0..o_{t-1})
    for t, o in enumerate(obs):
        joint = prior * E[:, o]  # (S,) p(s_t, o_t | o_<t): weigh by the evidence
        if joint.sum() <= 0:
            raise ValueError(f"observation {t} has zero probability under this HMM")
        belief[t] = joint / joint.sum()  # (S,) p(s_t | o_<=t)
        prior = belief[t] @ P  # (S,) predict one step: p(s_{t+1} | o_<=t)
    return belief


def forward_filter_batch(P, E, pi, obs):
    """forward_filter over a batch of HMMs: (n,S,S), (n,S,S), (S,) or (n,S), (n,n_obs) -> (n, n_obs, S)."""
    P = np.asarray(P, dtype=np.float64)
    E = np.asarray(E, dtype=np.float64)
    obs = np.asarray(obs, dtype=np.int64)
    n, n_obs = obs.shape
    S = P.shape[-1]
    pi = np.broadcast_to(np.asarray(pi, dtype=np.float64), (n, S))
    emit = np.swapaxes(E, 1, 2)  # (n, O, S) emit[b, o, s] = p(o | s)
    lik = emit[np.arange(n)[:, None], obs]  # (n, n_obs, S) p(o_t | s_t = s)
    belief = np.zeros((n, n_obs, S))
    prior = pi  # (n, S)
    for t in range(n_obs):
        joint = prior * lik[:, t]  # (n, S)
        if np.any(joint.sum(-1) <= 0):
            raise ValueError(f"observation {t} has zero probability under some HMM of the batch")
        belief[:, t] = joint / joint.sum(-1, keepdims=True)  # (n, S)
        prior = np.einsum("bi,bij->bj", belief[:, t], P)  # (n, S) one step through each P
    return belief


def header_tokens(P, E):
    """Probability tokens of a batch of HMMs: (n, S, S), (n, S, S) -> (n, 52) int64."""
    n = len(P)
    tokens = []
    for name, M in (("P", P), ("E", E)):
        hundredths = np.rint(100.0 * M)  # (n, S, S)
        if np.any(np.abs(100.0 * M - hundredths) > 1e-6) or hundredths.min() < MIN_COUNT or hundredths.max() > 100:
            raise ValueError(f"{name} entries must be multiples of 0.01 in [0.05, 1.00]")
        if np.any(hundredths.sum(-1) != 100):
            raise ValueError(f"{name} rows must sum to exactly 1.00 (100 hundredths)")
        tokens.append(hundredths.reshape(n, -1).astype(np.int64) - MIN_COUNT)  # (n, 25) row-major
        tokens.append(np.full((n, 1), SEP, dtype=np.int64))
    return np.concatenate(tokens, axis=1)  # (n, 52)


def tokens_of(P, E, obs):
    """Token sequence P SEP E SEP o_0..o_{n_obs-1}: (S,S), (S,S), (n_obs,) -> (52 + n_obs,) int64."""
    obs = np.asarray(obs, dtype=np.int64)
    if obs.ndim != 1 or (obs.size and (obs.min() < 0 or obs.max() >= S)):
        raise ValueError(f"obs must be 1-D with symbols in 0..{S - 1}")
    header = header_tokens(np.asarray(P)[None], np.asarray(E)[None])[0]  # (52,)
    return np.concatenate([header, OBS0 + obs])


def detokenize(tokens):
    """Inverse of tokens_of: (52 + n_obs,) -> P (S, S), E (S, S), obs (n_obs,)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    n_prob = S * S
    if tokens.ndim != 1 or len(tokens) < HEADER:
        raise ValueError(f"need a 1-D sequence of at least {HEADER} tokens, got shape {tokens.shape}")
    if tokens[n_prob] != SEP or tokens[2 * n_prob + 1] != SEP:
        raise ValueError(f"expected SEP ({SEP}) at positions {n_prob} and {2 * n_prob + 1}")
    probs = np.r_[tokens[:n_prob], tokens[n_prob + 1 : 2 * n_prob + 1]]  # (50,)
    obs = tokens[HEADER:] - OBS0  # (n_obs,)
    if probs.min() < 0 or probs.max() >= SEP:
        raise ValueError(f"probability tokens must lie in 0..{SEP - 1}")
    if obs.size and (obs.min() < 0 or obs.max() >= S):
        raise ValueError(f"observation tokens must lie in {OBS0}..{VOCAB - 1}")
    P = (probs[:n_prob] + MIN_COUNT).reshape(S, S) / 100.0
    E = (probs[n_prob:] + MIN_COUNT).reshape(S, S) / 100.0
    return P, E, obs


def sample_chains(rng, P, E, n_obs):
    """A state path and its observations for each of n HMMs: s_0 uniform, o_t ~ E[s_t], s_(t+1) ~ P[s_t].
    P, E (n, S, S) -> states, obs (n, n_obs) int64."""
    n, S_ = len(P), P.shape[-1]
    rows = np.arange(n)
    states = np.zeros((n, n_obs), dtype=np.int64)
    obs = np.zeros((n, n_obs), dtype=np.int64)
    states[:, 0] = rng.integers(0, S_, size=n)  # s_0 ~ uniform pi
    for t in range(n_obs):
        obs[:, t] = wt.sample_categorical(rng, E[rows, states[:, t]])  # o_t ~ E[s_t]
        if t + 1 < n_obs:
            states[:, t + 1] = wt.sample_categorical(rng, P[rows, states[:, t]])  # s_{t+1} ~ P[s_t]
    return states, obs


def batch(rng, n, n_obs=20):
    """n sequences of the HMM task (a fresh HMM each) with exact filtering posteriors; T = 52 + n_obs."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if n_obs < 1:
        raise ValueError(f"n_obs must be >= 1, got {n_obs}")
    P, E = sample_params_batch(rng, n)  # (n, S, S) each
    states, obs = sample_chains(rng, P, E, n_obs)
    pi = np.full(S, 1.0 / S)

    tokens = np.concatenate([header_tokens(P, E), OBS0 + obs], axis=1)  # (n, 52 + n_obs)
    targets = np.zeros((n, HEADER + n_obs), dtype=np.int64)
    mask = np.zeros((n, HEADER + n_obs))
    posterior = np.zeros((n, HEADER + n_obs, S))
    targets[:, HEADER:] = states
    mask[:, HEADER:] = 1.0
    posterior[:, HEADER:] = forward_filter_batch(P, E, pi, obs)  # (n, n_obs, S)
    return dict(tokens=tokens, targets=targets, mask=mask, posterior=posterior)


def window_filter(batch, k):
    """Exact filtering that reads only the last k + 1 observations: for each t, the posterior of s_t given
    o_(t-k) .. o_t, starting from the chain's marginal at t - k, (u P^(t-k)), u the uniform start. k = 0
    carries nothing from one observation to the next; k >= t is the exact filter. -> (n, T, S), uniform off
    the observations."""
    tokens = batch["tokens"]
    n, T = tokens.shape
    q = np.full((n, T, S), 1.0 / S)
    for b in range(n):
        P, E, obs = detokenize(tokens[b])
        marg = [np.full(S, 1.0 / S)]                                  # marg[t]: the marginal of s_t
        for _ in range(len(obs) - 1):
            marg.append(marg[-1] @ P)
        for t in range(len(obs)):
            a = max(0, t - k)
            belief = marg[a] * E[:, obs[a]]
            for u in range(a + 1, t + 1):
                belief = (belief / belief.sum()) @ P * E[:, obs[u]]
            q[b, HEADER + t] = belief / belief.sum()
    return q


def shortcut(batch, s=None):
    """The best answer without transport that primitives/matrix.py knows (its floor for the HMM): the current observation
    weighed by the chain's marginal at its time, q_t(s) proportional to (u P^t)(s) E[s, o_t] (window_filter
    with k = 0); it reads the HMM's parameters from the header but carries nothing from one observation to
    the next. (The first floor weighed by the stationary distribution instead; a referee found this one
    higher.) A predictor that carries one observation or two (window_filter, k = 1, 2) closes nearly all of
    the gap (primitives/README.md, the primitives matrix), so a mark on this HMM cannot tell full filtering from a few
    steps of it. -> (n, T, S)."""
    return window_filter(batch, 0)


# ----------------------------------------------------------------------------
# what the geometry probes read (manifold.py): cols (P,) are the observation positions

N_PROB = S * S              # header: P (N_PROB tokens) SEP E (N_PROB tokens) SEP
E_START = N_PROB + 1        # position of E[0, 0]; E[s, o] sits at E_START + S s + o


def hypothesis_tokens(cfg):
    """The five observation tokens (an observation is the evidence token whose likelihood column the filter
    reads; the authors define no HMM frame)."""
    return OBS0 + np.arange(S)


def token_groups(cfg, tokens):
    """The observation tokens (positions 52..) and the probability tokens of the header (SEP excluded) that
    occur in these sequences (entries >= 0.05 cap a probability at 0.80)."""
    header = np.r_[0:N_PROB, E_START:E_START + N_PROB]
    return {"observations": (OBS0 + np.arange(S), np.arange(HEADER, tokens.shape[1])),
            "probabilities": (np.unique(tokens[:, header]), header)}


def token_names(cfg, tokens):
    """P / | / E for the header, o2 for an observation."""
    return ["P"] * N_PROB + ["|"] + ["E"] * N_PROB + ["|"] + [f"o{t - OBS0}" for t in tokens[HEADER:]]


def evidence_masks(tokens, cols):
    """-> {name: (n, P, T) bool}. "consistent": at observation o_t, the five header positions of the emission
    column E[s, o_t], s = 0..4 (the likelihood of the current observation under each state); "observation":
    positions 52..t; "transition": the P entries."""
    n, T = tokens.shape
    j = np.arange(T)
    causal = j[None, :] <= cols[:, None]                                       # (P, T)
    column = E_START + S * np.arange(S)[None, None, :] + (tokens[:, cols] - OBS0)[..., None]  # (n, P, S)
    consistent = np.zeros((n, len(cols), T), dtype=bool)
    np.put_along_axis(consistent, column, True, axis=-1)
    obs_pos = causal & (j[None, :] >= HEADER)
    return {"consistent": consistent, "observation": np.broadcast_to(obs_pos, (n,) + obs_pos.shape),
            "transition": np.broadcast_to(causal & (j[None, :] < N_PROB), (n,) + obs_pos.shape)}


def row_split(batch, cols):
    """No binary split of the rows: the filter's entropy varies continuously."""
    return None


def graded_rows(batch, cols):
    return np.ones((len(batch["tokens"]), len(cols)), dtype=bool)


def swap_query(cfg, tokens, t, rng):
    """The query swap of probe 2: the observation at position t replaced by another symbol. -> tokens, ok (n,)."""
    out = tokens.copy()
    out[:, t] = OBS0 + (tokens[:, t] - OBS0 + rng.integers(1, S, size=len(tokens))) % S
    return out, np.ones(len(tokens), dtype=bool)
