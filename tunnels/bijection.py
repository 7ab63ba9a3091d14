"""bijection: Paper I's bijection elimination, format (a), as a task of tasks.TASKS.

A fresh uniformly random bijection pi of V keys onto V values per sequence. Format (a): separate
vocabularies (key k is token k, value v is token V + v), keys drawn without replacement,
    k1 v1 k2 v2 ... kL          n_pairs = V - 1 pairs, the last value left out,
and at every key the model predicts the value that follows. The exact posterior at the i-th key is
uniform over the V - i + 1 values not yet seen: its entropy log2(V - i + 1) bits is a function of the
position alone. With an optional final query key (a key seen before) the posterior there is one-hot.

Notation: n sequences, T tokens per sequence, V keys (= values), n_pairs (key, value) pairs.
The module is the task's one place: the sampler and tokens, the exact posterior, the supervised
positions, the prior's gap, the presets and flags, and what the probes read (tunnels/tasks.py lists the names).
"""
import numpy as np

ANSWER_LABEL = "key index i (pairs seen = i - 1)"   # what the figures call the i-th answer
SETTINGS = {"V": 20}            # the task's settings (a run's meta records them) and their defaults
TINY = {"train": {"V": 4}, "grad": {"V": 7}}   # the conformance tests' shapes: 6 and 12 positions


def check_V(V, s):
    return None if isinstance(V, (int, np.integer)) and V >= 2 else "the bijection needs at least 2 keys"


FLAGS = {"--V": dict(setting="V", type=int, check=check_V,
                     help="bijection, sawtooth: number of keys (= values), n_pairs = V - 1 pairs (default 20)")}
PRESETS = {
    # lr is the peak of warm-up + cosine, decayed to lr * lr_floor (lr_floor 0.1 unless a preset says otherwise)
    # the model's sizes are its family's (bayesattn.PRESETS, mlp_baseline.PRESETS)
    "quick":   dict(batch=32, steps=60, lr=3e-3, warmup=10),
    "default": dict(batch=64, steps=3000, lr=3e-3, warmup=100, weight_decay=0.0),
    # many small steps: per sample, batch 16 pulls the leaked mass off seen values faster than batch 256;
    # at this size a second Numba thread costs more than it gives, so the run uses one
    "paper":   dict(batch=16, steps=130000, lr=3e-3, warmup=400, lr_floor=0.0, weight_decay=0.0, threads=1),
}


# ----------------------------------------------------------------------------
# the task protocol

def sizes(s):
    """-> input vocabulary, output classes, training length and longest evaluated length."""
    T = 2 * (s["V"] - 1)
    return dict(vocab=2 * s["V"], classes=s["V"], max_len=T, eval_len=T)


def sample(rng, n, s, step=None):
    """n training or held-out sequences (the step is not read: no curriculum)."""
    return batch(rng, n, s["V"])


def prior_gap_bits(s):
    """The paper metric of a prior-only predictor (the authors' MLP): mean over the keys of
    log2 V - H_Bayes(i), exact."""
    return float(np.mean(np.log2(s["V"]) - entropy_curve(s["V"])))


def settings_of(cfg):
    """The settings a checkpoint of this task was trained with, from its model config (older meta lacks them)."""
    return {"V": int(cfg.n_classes)}


# ----------------------------------------------------------------------------
# the sampler and the exact posterior
#
# A fresh uniformly random bijection pi: {0..V-1} -> {0..V-1} per sequence.
# Tokens: key k is token k, value v is token V + v; the sequence is
# k1 v1 k2 v2 ... kL vL [q], with vi = pi(ki) and an optional final query key q
# repeated from the context. At every key the model predicts the value class
# (0..V-1) that follows. Given m distinct (key, value) pairs, the bijections
# consistent with them number (V - m)!, and each unassigned value is the image
# of a new key in (V - m - 1)! of them: the posterior is uniform over the
# V - m unassigned values, or one-hot if the key was already seen.


def posterior(keys, values, V):
    """Reference posterior of each value given the pairs before it: (n_pairs,), (n_pairs,) -> (n_pairs, V)."""
    keys = np.asarray(keys, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    if keys.ndim != 1 or keys.shape != values.shape:
        raise ValueError(f"keys and values must be 1-D of equal length, got {keys.shape} and {values.shape}")
    if V < 2:
        raise ValueError(f"V must be >= 2, got {V}")
    if keys.size and (keys.min() < 0 or keys.max() >= V or values.min() < 0 or values.max() >= V):
        raise ValueError(f"keys and values must lie in 0..{V - 1}")
    posterior = np.zeros((len(keys), V))  # (n_pairs, V)
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


def posterior_batch(keys, values, V):
    """Vectorised posterior for consistent pairs: (n, n_pairs), (n, n_pairs) -> (n, n_pairs, V)."""
    eye = np.eye(V)
    key_onehot = eye[keys]  # (n, n_pairs, V)
    value_onehot = eye[values]  # (n, n_pairs, V)
    keys_before = np.cumsum(key_onehot, axis=1) - key_onehot  # (n, n_pairs, V) counts over pairs j < i
    values_before = np.cumsum(value_onehot, axis=1) - value_onehot  # (n, n_pairs, V)
    seen_key = np.sum(keys_before * key_onehot, axis=-1) > 0  # (n, n_pairs) keys[i] appeared before i
    free = (values_before == 0).astype(np.float64)  # (n, n_pairs, V) values not yet assigned
    uniform_free = free / np.maximum(free.sum(-1, keepdims=True), 1.0)  # (n, n_pairs, V)
    return np.where(seen_key[..., None], value_onehot, uniform_free)  # (n, n_pairs, V)


def batch(rng, n, V=20, n_pairs=None, replacement=False, query=False):
    """n sequences of the bijection task with exact posteriors at every key; T = 2 n_pairs (+1 with query)."""
    n_pairs = V - 1 if n_pairs is None else n_pairs
    if V < 2:
        raise ValueError(f"V must be >= 2, got {V}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if n_pairs < 1:
        raise ValueError(f"n_pairs must be >= 1, got {n_pairs}")
    if not replacement and n_pairs > V:
        raise ValueError(f"n_pairs must be <= V = {V} without replacement, got {n_pairs}")
    identity = np.tile(np.arange(V), (n, 1))  # (n, V)
    perm = rng.permuted(identity, axis=1)  # (n, V) perm[b, key] = value: a fresh bijection per sequence
    if replacement:
        keys = rng.integers(0, V, size=(n, n_pairs))  # (n, n_pairs) iid uniform keys
    else:
        keys = rng.permuted(identity, axis=1)[:, :n_pairs]  # (n, n_pairs) n_pairs distinct keys in random order
    values = np.take_along_axis(perm, keys, axis=1)  # (n, n_pairs) values[b, i] = perm[b, keys[b, i]]

    T = 2 * n_pairs + int(bool(query))
    tokens = np.zeros((n, T), dtype=np.int64)
    targets = np.zeros((n, T), dtype=np.int64)
    mask = np.zeros((n, T))
    posterior = np.zeros((n, T, V))
    at_key = slice(0, 2 * n_pairs, 2)  # positions of k1 .. kL
    tokens[:, at_key] = keys
    tokens[:, 1 : 2 * n_pairs : 2] = V + values
    targets[:, at_key] = values
    mask[:, at_key] = 1.0
    posterior[:, at_key] = posterior_batch(keys, values, V)  # (n, n_pairs, V)
    if query:
        rows = np.arange(n)
        j = rng.integers(0, n_pairs, size=n)  # (n,) which context pair is queried
        tokens[:, -1] = keys[rows, j]
        targets[:, -1] = values[rows, j]
        mask[:, -1] = 1.0
        posterior[:, -1] = np.eye(V)[values[rows, j]]  # the queried key was seen: one-hot
    return dict(tokens=tokens, targets=targets, mask=mask, posterior=posterior)


def entropy_curve(V, n_pairs=None):
    """H_Bayes(i) = log2(V - i + 1) bits at the i-th key, i = 1..n_pairs (keys without replacement): (n_pairs,)."""
    n_pairs = V - 1 if n_pairs is None else n_pairs
    if V < 2:
        raise ValueError(f"V must be >= 2, got {V}")
    if n_pairs < 1 or n_pairs > V:
        raise ValueError(f"n_pairs must be in 1..{V}, got {n_pairs}")
    i = np.arange(1, n_pairs + 1)  # (n_pairs,)
    return np.log2(V - i + 1.0)


# ----------------------------------------------------------------------------


# ----------------------------------------------------------------------------
# what the geometry probes read (manifold.py): cols (P,) are the answer positions, the same in every row

def hypothesis_tokens(cfg):
    """The tokens that stand for the hypotheses: the V value tokens V..2V-1."""
    return np.arange(cfg.n_classes, 2 * cfg.n_classes)


def token_groups(cfg, tokens):
    """Hypothesis-carrying token types -> (token ids, positions where that type occurs): the key tokens
    0..V-1 (even positions) and the value tokens V..2V-1 (odd positions)."""
    V, T = cfg.n_classes, tokens.shape[1]
    return {"keys": (np.arange(V), np.arange(0, T, 2)), "values": (np.arange(V, 2 * V), np.arange(1, T, 2))}


def token_names(cfg, tokens):
    """Readable names of one sequence's tokens: k3, v7."""
    V = cfg.n_classes
    return [f"k{t}" if t < V else f"v{t - V}" for t in tokens]


def evidence_masks(tokens, cols):
    """-> {name: (n, P, T) bool}: the positions j <= t a row t should attend to. "consistent": if the key at
    t occurred before, the value positions right after its earlier occurrences (they hold the answer);
    otherwise every earlier value position (each holds a value already taken, an eliminated hypothesis).
    "value": every earlier value position. (Shared by the sawtooth, whose keys and values alternate too.)"""
    n, T = tokens.shape
    j = np.arange(T)
    value_pos = (j[None, :] <= cols[:, None]) & (j[None, :] % 2 == 1)        # (P, T) earlier value positions
    prev_token = np.concatenate([np.full((n, 1), -1), tokens[:, :-1]], axis=1)  # (n, T) the token before j
    answer = value_pos[None] & (prev_token[:, None, :] == tokens[:, cols][:, :, None])   # (n, P, T)
    consistent = np.where(answer.any(-1, keepdims=True), answer, value_pos[None])      # (n, P, T)
    return {"consistent": consistent, "value": np.broadcast_to(value_pos, (n,) + value_pos.shape)}


def key_seen_before(tokens, cols):
    """(n, P) bool: the key at answer position t occurred at an earlier key position (even positions)."""
    return np.stack([(tokens[:, :t:2] == tokens[:, [t]]).any(1) for t in cols], axis=1)


def row_split(batch, cols):
    """The binary split of the answer rows that could carry an entropy statistic, or None: in format (a)
    every key is new (none), so H_Bayes is a function of the position alone."""
    return None


def graded_rows(batch, cols):
    """(n, P) bool: the rows where H_Bayes is graded (not fixed by a binary split): every row here."""
    return np.ones((len(batch["tokens"]), len(cols)), dtype=bool)


def swap_query(cfg, tokens, t, rng):
    """The query swap of probe 2: replace the key at position t by another key of the same standing (another
    key not seen before t for a new key, another seen key for a seen one). -> tokens (n, T) and ok (n,)
    (False where no such key exists). Rows before t do not change, and row t only through its own token.
    (Shared by the sawtooth: keys sit at the even positions in both formats.)"""
    out, ok = tokens.copy(), np.zeros(len(tokens), dtype=bool)
    for b in range(len(tokens)):
        seen, key = set(tokens[b, :t:2].tolist()), int(tokens[b, t])
        pool = sorted(seen - {key}) if key in seen else [k for k in range(cfg.n_classes) if k not in seen and k != key]
        if pool:
            out[b, t], ok[b] = pool[rng.integers(len(pool))], True
    return out, ok
