"""sticky: Paper II's sticky Markov chain (wind tunnel 3), continuous inputs, outside tasks.TASKS.

Symbols y_0 .. y_T with y_0 uniform and y_{t+1} ~ P[y_t]; P keeps a symbol with
probability 0.3 and otherwise moves to j with weight 1 / circular distance.
The input at t is a noisy view of the current symbol,
    x[t] = mu[y_t] + sigma * eps_t,   eps_t ~ N(0, I_d),   t = 0..T-1,
and the target at t is y_{t+1}. This is an HMM with Gaussian emissions, so
    p(y_{t+1} | x[0..t]) = sum_y p(y_t = y | x[0..t]) P[y, y_{t+1}]
is exact by the forward filter. The authors compare with H(Y_{t+1} | Y_t),
the loss of a predictor that sees y_t itself: a lower bound, not the optimum.

Notation: M symbols, T time steps, d the input dimension; P the transition matrix, mu (M, d) the means.
"""
import numpy as np

from tunnels import windtunnels as wt


def transition(n_symbols=8, self_prob=0.3):
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


def authors_self_prob(n_symbols=8, self_prob=0.3):
    """The self-transition of the authors' script, which normalises a row that already holds self_prob:
    row = [self_prob on the diagonal, 1 / distance elsewhere], divided by its sum S and scaled by
    1 - self_prob, then self_prob added on the diagonal, so P[i, i] = self_prob + self_prob (1 - self_prob) / S
    (0.3498 for 8 symbols), the rest still proportional to 1 / distance. Use it as transition's self_prob."""
    i = np.arange(1, n_symbols)
    S = self_prob + np.sum(1.0 / np.minimum(i, n_symbols - i))      # the row sum before normalising
    return float(self_prob + self_prob * (1.0 - self_prob) / S)


def means(rng, n_symbols=8, d=20):
    """Symbol embeddings mu (M, d), standard Gaussian."""
    if n_symbols < 1 or d < 1:
        raise ValueError(f"n_symbols and d must be >= 1, got {n_symbols} and {d}")
    return rng.standard_normal((n_symbols, d))


def check(P, mu, sigma):
    """Validate the sticky-chain parameters; return P (M, M) and mu (M, d) as float64."""
    P = wt.check_stochastic(P, "P")
    mu = np.asarray(mu, dtype=np.float64)
    if P.ndim != 2 or mu.ndim != 2 or mu.shape[0] != P.shape[0]:
        raise ValueError(f"need P (M, M) and mu (M, d) with the same M, got {P.shape} and {mu.shape}")
    if not (np.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be a finite number > 0, got {sigma}")
    return P, mu


def sample(rng, P, mu, T, n=1, sigma=1.0):
    """n chains of T inputs: x (n, T, d) float64 and symbols y (n, T + 1) int64; targets are y[:, 1:]."""
    P, mu = check(P, mu, sigma)
    if T < 1:
        raise ValueError(f"T must be >= 1, got {T}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    M, d = mu.shape
    y = np.zeros((n, T + 1), dtype=np.int64)
    y[:, 0] = rng.integers(0, M, size=n)  # y_0 uniform
    for t in range(T):
        y[:, t + 1] = wt.sample_categorical(rng, P[y[:, t]])  # y_{t+1} ~ P[y_t]
    x = mu[y[:, :T]] + sigma * rng.standard_normal((n, T, d))  # (n, T, d) noisy view of y_t
    return x, y


def posterior(P, mu, x, sigma):
    """Reference p(y_{t+1} | x[0..t]) by the forward filter in log space: x (T, d) -> (T, M)."""
    P, mu = check(P, mu, sigma)
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
        log_belief -= wt.logsumexp(log_belief, axis=0)  # log p(y_t | x_<=t)
        log_prior = wt.logsumexp(log_belief[:, None] + log_P, axis=0)  # (M,) log p(y_{t+1} | x_<=t)
        predictive[t] = np.exp(log_prior)
    return predictive


def posterior_batch(P, mu, x, sigma):
    """posterior over a batch: x (n, T, d) -> (n, T, M)."""
    P, mu = check(P, mu, sigma)
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
        log_belief -= wt.logsumexp(log_belief, axis=1)[:, None]  # (n, M) log p(y_t | x_<=t)
        log_prior = wt.logsumexp(log_belief[:, :, None] + log_P[None], axis=1)  # (n, M) log p(y_{t+1} | x_<=t)
        predictive[:, t] = np.exp(log_prior)
    return predictive


def conditional_entropy_bits(P):
    """H(Y_{t+1} | Y_t) = sum_i pi_i H(P[i]) in bits, pi the stationary distribution (pi P = pi)."""
    P = wt.check_stochastic(P, "P")
    M = len(P)
    A = np.vstack([P.T - np.eye(M), np.ones((1, M))])  # (M + 1, M) pi P = pi and sum(pi) = 1
    b = np.r_[np.zeros(M), 1.0]  # (M + 1,)
    stationary = np.linalg.lstsq(A, b, rcond=None)[0]  # (M,)
    return float(stationary @ wt.entropy_bits(P, axis=1))


# ----------------------------------------------------------------------------
# Paper II's setting: 8 symbols, inputs in R^20, the symbol means drawn once for every seed

N_SYMBOLS, D_X = 8, 20
MU_SEED = 0                     # the symbol means mu are drawn once, the same for every seed
CHAINS = ("exact", "authors")   # self-transition 0.3 exactly, or 0.3498 as the authors' script normalises it


def task(chain="exact"):
    """Transition matrix P (8, 8) and symbol means mu (8, 20), fixed for every seed. chain "exact":
    self-transition 0.3 (the paper's text); "authors": 0.3498, what the authors' script builds
    (authors_self_prob), whose bound H(Y_t+1 | Y_t) is 2.639 bits, not 2.717."""
    if chain not in CHAINS:
        raise ValueError(f"chain={chain!r}: allowed are {', '.join(map(repr, CHAINS))}")
    self_prob = 0.3 if chain == "exact" else authors_self_prob(N_SYMBOLS, 0.3)
    return transition(N_SYMBOLS, self_prob), means(np.random.default_rng(MU_SEED), N_SYMBOLS, D_X)


def data(seed, T=2000, n=1, sigma=1.0, chain="exact"):
    """n chains: inputs x (n, T, d_x) float64 and targets y_{t+1} (n, T) int64."""
    P, mu = task(chain)
    x, y = sample(np.random.default_rng(seed), P, mu, T, n=n, sigma=sigma)
    return x, y[:, 1:]
