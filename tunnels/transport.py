"""transport: belief transport that needs memory, as a task of tasks.TASKS: an in-context HMM whose states are
sticky and whose observations are noisy, so that filtering has to carry evidence over many observations.

Paper I's HMM (tunnels/hmm.py) cannot tell filtering from one observation of memory: there a filter that
reads only the last two observations closes 0.99 of the gap to the exact posterior. Here every sequence draws
a fresh HMM of S = 5 states and 5 symbols from a prior chosen so that it cannot:
    stay  the self-transition, uniform on 0.90, 0.91, ..., 0.97; the other four states (1 - stay) / 4 each
    acc   the emission of a state's own symbol, uniform on 0.35, 0.36, ..., 0.50; the others (1 - acc) / 4
(both matrices doubly stochastic, so the chain's marginal stays uniform). The two numbers are given in context:
    ids 0..100   a probability in hundredths (0.00 ... 1.00)
    id  101      SEP
    ids 102..106 observation symbols 0..4
Sequence: stay acc SEP o_0 .. o_{n_obs-1}. Target at observation t: the state s_t; its exact posterior the
filtering distribution p(s_t | o_0..o_t), the forward algorithm on the exact matrices.

Memory, measured: the window filter of k (window_filter) reads only o_(t-k) .. o_t, from the uniform
marginal; k = 0 is the memoryless shortcut (the current observation and the known emissions). Its score,
1 - KL / KL(uniform) over every observation of 20 (the matrix's score), climbs slowly with k: the staircase
(staircase(); tests/test_transport.py checks its bounds) is about 0.28 at k = 0, 0.49 at k = 1, 0.63 at 2,
0.81 at 4, 0.95 at 8 and 1.00 at 16, so one observation of memory closes under 60% of the gap and eight
over 90%. (A window of k is exact at every t <= k, so part of the climb is the sequence's length: at
t >= 16 alone the steps are about 0.24, 0.42, 0.55, 0.73, 0.91, 0.995.) effective_memory(): the k whose window filter's KL equals a model's, read between the steps
linearly in log2(1 + k): "this model filters as well as a filter that remembers k observations".
"""
import math

import numpy as np

from tunnels import hmm
from tunnels import windtunnels as wt

S = 5
STAY = (90, 97)             # the self-transition, in hundredths, both ends drawn
ACC = (35, 50)              # the emission of a state's own symbol, in hundredths, both ends drawn
SEP, OBS0, VOCAB = 101, 102, 107
HEADER = 3                  # stay acc SEP
WINDOWS = (0, 1, 2, 4, 8, 16)
SETTINGS = {"observations": 20}    # (not n_obs: a setting name is one flag, and --K sets the HMM's)
TINY = {"train": {"observations": 6}, "grad": {"observations": 12}}    # the conformance tests' shapes: 9 and 15 positions
ANSWER_LABEL = "observation t"
CLUSTERS = "hidden state"


def check_n_obs(n_obs, s):
    return None if n_obs >= 1 else "transport needs at least 1 observation"


FLAGS = {"--obs": dict(setting="observations", type=int, check=check_n_obs,
                       help="transport: observations per sequence (default 20)")}
PRESETS = {
    "quick":   dict(batch=16, steps=40, lr=3e-3, warmup=10),
    "default": dict(batch=32, steps=3000, lr=2e-3, warmup=100),
    "paper":   dict(batch=32, steps=12000, lr=1.5e-3, warmup=300, lr_floor=0.0),
}


# ----------------------------------------------------------------------------
# the task protocol

def sizes(s):
    return dict(vocab=VOCAB, classes=S, max_len=HEADER + s["observations"], eval_len=HEADER + s["observations"])


def sample(rng, n, s, step=None):
    return batch(rng, n, s["observations"])


def prior_gap_bits(s, n=20_000, seed=0):
    """The paper metric of a prior-only predictor: log2 S - E[H_Bayes] over the observations, Monte Carlo."""
    b = batch(np.random.default_rng(seed), n, s["observations"])
    return float(np.log2(S) - wt.entropy_bits(b["posterior"][:, HEADER:]).mean())


def shortcut(batch, s=None):
    """The best answer without transport: the current observation under the known emissions (window_filter,
    k = 0), the matrix's floor for this column."""
    return window_filter(batch, 0)


# ----------------------------------------------------------------------------
# the sampler and the exact posterior

def matrices(stay, acc):
    """stay, acc (n,) probabilities -> P, E (n, S, S): stay (acc) on the diagonal, the rest shared evenly."""
    eye = np.eye(S)
    P = stay[:, None, None] * eye + ((1 - stay) / (S - 1))[:, None, None] * (1 - eye)
    E = acc[:, None, None] * eye + ((1 - acc) / (S - 1))[:, None, None] * (1 - eye)
    return P, E


def batch(rng, n, n_obs=20):
    """n sequences, a fresh HMM each, with exact filtering posteriors; T = 3 + n_obs."""
    stay = rng.integers(STAY[0], STAY[1] + 1, size=n)                  # (n,) hundredths
    acc = rng.integers(ACC[0], ACC[1] + 1, size=n)                     # (n,) hundredths
    P, E = matrices(stay / 100, acc / 100)                             # (n, S, S) each
    states, obs = hmm.sample_chains(rng, P, E, n_obs)                  # (n, n_obs) each
    tokens = np.concatenate([stay[:, None], acc[:, None], np.full((n, 1), SEP), OBS0 + obs], axis=1)
    T = HEADER + n_obs
    targets, mask, posterior = np.zeros((n, T), dtype=np.int64), np.zeros((n, T)), np.zeros((n, T, S))
    targets[:, HEADER:], mask[:, HEADER:] = states, 1.0
    posterior[:, HEADER:] = hmm.forward_filter_batch(P, E, np.full(S, 1.0 / S), obs)
    return dict(tokens=tokens, targets=targets, mask=mask, posterior=posterior)


def read_header(tokens):
    """tokens (n, T) -> P, E (n, S, S) and the observations (n, n_obs)."""
    P, E = matrices(tokens[:, 0] / 100, tokens[:, 1] / 100)
    return P, E, tokens[:, HEADER:] - OBS0


def window_filter(batch, k):
    """Exact filtering that reads only the last k + 1 observations: the posterior of s_t given o_(t-k) .. o_t,
    from the chain's marginal at t - k (uniform: P is doubly stochastic). k >= t is the exact filter.
    -> (n, T, S), uniform off the observations."""
    P, E, obs = read_header(batch["tokens"])
    n, T = batch["tokens"].shape
    q = np.full((n, T, S), 1.0 / S)
    rows = np.arange(n)
    for t in range(obs.shape[1]):
        belief = np.full((n, S), 1.0 / S) * E[rows, :, obs[:, max(0, t - k)]]          # (n, S)
        for u in range(max(0, t - k) + 1, t + 1):
            belief = np.einsum("ns,nsr->nr", belief / belief.sum(1, keepdims=True), P) * E[rows, :, obs[:, u]]
        q[:, HEADER + t] = belief / belief.sum(1, keepdims=True)
    return q


def staircase(batch, ks=WINDOWS):
    """{k: (KL bits, score)} of the window filters on a batch: the mean KL(posterior || window) over every
    observation, and 1 - KL / KL(uniform) (the matrix's score)."""
    post = batch["posterior"][:, HEADER:]
    uniform = float(wt.kl_bits(post, np.full_like(post, 1.0 / S)).mean())
    out = {}
    for k in ks:
        kl = float(wt.kl_bits(post, window_filter(batch, k)[:, HEADER:]).mean())
        out[k] = (kl, 1.0 - kl / uniform)
    return out


def effective_memory(kl_model, steps):
    """The k whose window filter's KL equals kl_model, between the steps linearly in log2(1 + k). steps:
    {k: KL bits} (falling with k). -> (k, where): where "within" the steps, "below" (worse than the memoryless
    filter: k = 0) or "above" (better than the longest window: its k, a lower bound)."""
    ks = sorted(steps)
    if any(steps[b] > steps[a] for a, b in zip(ks, ks[1:])):
        raise ValueError(f"the window filters' KL must fall with k: {steps}")
    if kl_model >= steps[ks[0]]:
        return float(ks[0]), "below"
    if kl_model <= steps[ks[-1]]:
        return float(ks[-1]), "above"
    for a, b in zip(ks, ks[1:]):
        if steps[b] <= kl_model <= steps[a]:
            x0, x1 = math.log2(1 + a), math.log2(1 + b)
            w = (steps[a] - kl_model) / (steps[a] - steps[b]) if steps[a] > steps[b] else 0.0
            return 2 ** (x0 + w * (x1 - x0)) - 1, "within"
