"""sawtooth: Paper I's sawtooth variant of the bijection, format (b), as a task of tasks.TASKS.

One shared vocabulary 0..V-1 for keys and values, keys drawn WITH replacement, and a final query key q
drawn from the context keys:   k1 v1 k2 v2 ... kL vL q.
The model predicts v_i at the key k_i and pi(q) at q. Posterior at k_i: one-hot if k_i appeared before
(its value is known), else uniform over the V - m values the m distinct earlier keys have not taken; at
q: one-hot. The entropy along one sequence is a sawtooth, and it is not a function of the position.
The paper's curve (and so the paper metric) covers the n_pairs values; the query is scored apart (query_mask).
The posterior depends only on the pairs seen, never on how the keys were drawn, so a curriculum that
draws keys from a smaller alphabet (more repeats) keeps every target exact.

Notation: n sequences, T = 2 n_pairs + 1 tokens, V keys (= values), n_pairs pairs, A an alphabet size.
"""
import numpy as np

from tunnels import bijection
from tunnels import windtunnels as wt

ANSWER_LABEL = "key index i (pairs seen = i - 1)"   # what the figures call the i-th answer
SETTINGS = {"V": 20, "curriculum": ""}
TINY = {"train": {"V": 4}, "grad": {"V": 7}}   # the conformance tests' shapes: 7 and 13 positions


def parse_curriculum(text, V):
    """"A:S,A2:S2,..." -> [(S, A), ...]: keys from A-key alphabets before step S, then A2 before S2, ...;
    after the last stage, the task itself (all V keys). "" or None -> []. ValueError if malformed."""
    return wt.parse_stages(text, V, "alphabet", "5:2500,10:4000")


def check_curriculum(text, s):
    """What is wrong with a curriculum, or None; where s holds the run's steps, a curriculum that lasts the
    whole run (the task itself never trained) is wrong too."""
    try:
        stages = parse_curriculum(text, s["V"])
    except ValueError as e:
        stages = e
    return wt.check_stages(stages, s.get("steps"))


FLAGS = {"--V": bijection.FLAGS["--V"],
         "--curriculum": dict(setting="curriculum", type=str, check=check_curriculum, quote=True,
                              help="sawtooth: keys from smaller random alphabets first, stages alphabet:until_step "
                                   "(e.g. 5:2500,10:4000); the targets stay exact (default: from the preset)")}
PRESETS = {
    # 1,000 steps of 5-key alphabets first: without them (and the transformer's fan-in init), the lookup
    # does not form within the budget (tunnels/README.md, sawtooth); the model's sizes are its family's
    "quick":   dict(batch=32, steps=60, lr=3e-3, warmup=10, curriculum="5:30"),
    # the README's first command: the default model for 2,500 steps (the lookup forms, about 0.1 bits), and the
    # authors' MLP for the 500 steps in which it reaches the prior (its log shows it): minutes on a laptop
    "first":   dict(batch=64, steps=2500, lr=3e-3, warmup=100, curriculum="5:500", weight_decay=0.0,
                    baseline_steps=500),
    "default": dict(batch=64, steps=8000, lr=3e-3, warmup=100, curriculum="5:1000", weight_decay=0.0),
    # batch 32 for three times the steps per sample (batch 16 left the query unlearned), cosine to zero
    "paper":   dict(batch=32, steps=100000, lr=3e-3, warmup=200, lr_floor=0.0, curriculum="5:2000",
                    weight_decay=0.0, threads=1),
}


# ----------------------------------------------------------------------------
# the task protocol

def sizes(s):
    T = 2 * (s["V"] - 1) + 1
    return dict(vocab=s["V"], classes=s["V"], max_len=T, eval_len=T)


def curriculum_alphabet(stages, step):
    """The key alphabet at this step (None: all keys, the task itself; also when step is None)."""
    return wt.stage_at(stages, step)


def sample(rng, n, s, step=None):
    """n sequences; the training loop passes its step, which picks the curriculum's alphabet (held-out
    sets pass none and see the task itself)."""
    return batch(rng, n, s["V"], alphabet=curriculum_alphabet(parse_curriculum(s["curriculum"], s["V"]), step))


def prior_gap_bits(s):
    """The paper metric of a prior-only predictor over the n_pairs values (the query is not in the paper's curve), exact."""
    return float(np.mean(np.log2(s["V"]) - entropy_curve(s["V"])))


def settings_of(cfg):
    return {"V": int(cfg.n_classes), "curriculum": ""}


# ----------------------------------------------------------------------------
# the sampler and the exact posterior

def batch(rng, n, V=20, n_pairs=None, alphabet=None):
    """n sequences of the sawtooth bijection, T = 2 n_pairs + 1, with exact posteriors at every key and
    at the query. alphabet: draw each sequence's keys from a random subset of that many keys
    (default V: uniform over all keys)."""
    n_pairs = V - 1 if n_pairs is None else n_pairs
    A = V if alphabet is None else int(alphabet)
    if V < 2:
        raise ValueError(f"V must be >= 2, got {V}")
    if n < 1 or n_pairs < 1:
        raise ValueError(f"n and n_pairs must be >= 1, got n = {n}, n_pairs = {n_pairs}")
    if not 1 <= A <= V:
        raise ValueError(f"alphabet must lie in 1..{V}, got {alphabet}")
    identity = np.tile(np.arange(V), (n, 1))  # (n, V)
    perm = rng.permuted(identity, axis=1)  # (n, V) a fresh bijection per sequence
    subset = rng.permuted(identity, axis=1)[:, :A]  # (n, A) the keys this sequence may use
    keys = np.take_along_axis(subset, rng.integers(0, A, size=(n, n_pairs)), axis=1)  # (n, n_pairs) iid from the subset
    values = np.take_along_axis(perm, keys, axis=1)  # (n, n_pairs)
    rows = np.arange(n)
    j = rng.integers(0, n_pairs, size=n)  # (n,) which context pair the query repeats
    query, answer = keys[rows, j], values[rows, j]

    T = 2 * n_pairs + 1
    tokens = np.zeros((n, T), dtype=np.int64)
    targets = np.zeros((n, T), dtype=np.int64)
    mask = np.zeros((n, T))
    posterior = np.zeros((n, T, V))
    at_key = slice(0, 2 * n_pairs, 2)
    tokens[:, at_key], tokens[:, 1:2 * n_pairs:2], tokens[:, -1] = keys, values, query  # shared vocabulary
    targets[:, at_key], targets[:, -1] = values, answer
    mask[:, at_key], mask[:, -1] = 1.0, 1.0
    posterior[:, at_key] = bijection.posterior_batch(keys, values, V)  # (n, n_pairs, V)
    posterior[:, -1] = np.eye(V)[answer]  # the query key was seen: one-hot
    query_mask = np.zeros((n, T))
    query_mask[:, -1] = 1.0
    return dict(tokens=tokens, targets=targets, mask=mask, posterior=posterior, query_mask=query_mask,
                groups={"final query": query_mask})


def shortcut(batch, s):
    """The best answer without a lookup (primitives/matrix.py's floor for the sawtooth): it tells a repeated key from a
    new one and knows which values were seen, but not which value went with which key: a new key gets the
    unseen values uniformly (exact), a repeated key (and the final query) the seen values uniformly.
    -> (n, T, V)."""
    V = s["V"]
    tokens, mask = batch["tokens"], batch["mask"] > 0
    n, T = tokens.shape
    q = np.full((n, T, V), 1.0 / V)
    for b in range(n):
        for t in np.flatnonzero(mask[b]):
            keys, values = tokens[b, 0:t:2], tokens[b, 1:t:2]          # the pairs before position t
            keys = keys[:len(values)]
            seen = np.zeros(V, bool)
            seen[values] = True
            pool = seen if tokens[b, t] in set(keys) else ~seen
            q[b, t] = pool / pool.sum()
    return q


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


def entropy_curve(V, n_pairs=None):
    """E[H_Bayes] at the i-th key of the sawtooth, i = 1..n_pairs, averaged over sequences: (n_pairs,).
    With m distinct earlier keys the key is new with probability (V - m) / V, and then
    H = log2(V - m); a repeated key has H = 0."""
    n_pairs = V - 1 if n_pairs is None else n_pairs
    if V < 2 or n_pairs < 1:
        raise ValueError(f"need V >= 2 and n_pairs >= 1, got V = {V}, n_pairs = {n_pairs}")
    m = np.arange(V + 1)
    h_new = np.log2(np.maximum(V - m, 1))  # (V + 1,) entropy with a new key after m distinct keys
    return np.array([distinct_keys_distribution(V, i - 1) @ ((V - m) / V * h_new) for i in range(1, n_pairs + 1)])


# ----------------------------------------------------------------------------
# what the geometry probes read (manifold.py): cols (P,) are the answer positions (the n_pairs keys; the
# query is scored apart), the same in every row

def hypothesis_tokens(cfg):
    """The tokens that stand for the hypotheses: all V tokens (keys and values share them)."""
    return np.arange(cfg.n_classes)


def token_groups(cfg, tokens):
    """One type: the V tokens, keys and values at once (every position)."""
    return {"tokens": (np.arange(cfg.n_classes), np.arange(tokens.shape[1]))}


def token_names(cfg, tokens):
    """k3 / v7 / q5 (the final query)."""
    return [("q" if i == len(tokens) - 1 else "k" if i % 2 == 0 else "v") + str(t) for i, t in enumerate(tokens)]


evidence_masks = bijection.evidence_masks
swap_query = bijection.swap_query


def row_split(batch, cols):
    """The binary split that could carry an entropy statistic: {"seen key": (n, P) bool}. A key seen before
    has H_Bayes = 0, a new one H_Bayes = log2(V - m) >= log2(V - n_pairs + 1), so within a position this split
    alone explains nearly all of H's variance."""
    return {"seen key": bijection.key_seen_before(batch["tokens"], cols)}


def graded_rows(batch, cols):
    """(n, P) bool: the new-key rows, where H_Bayes = log2(V - m) is graded by the number m of values taken."""
    return ~bijection.key_seen_before(batch["tokens"], cols)
