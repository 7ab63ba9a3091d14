"""recall: associative recall (random-access binding), as a task of tasks.TASKS.

A fresh random map f of n_keys keys into n_values values per sequence: every f(k) is drawn independently and
uniformly, so nothing but a stored pair says anything about a key's value. The sequence stores `pairs` of
them, then a run of filler tokens whose length is drawn per sequence (0 to `filler`, so the queries sit at
different positions in different rows; with --filler-fixed always `filler`, so every query sits at one
distance from the pairs), then `queries` queries, then the filler left over (T is fixed):
    STORE k_1 SEP v_1 ... STORE k_P SEP v_P  FILL^m  QUERY q_1 ... QUERY q_Q  FILL^(filler - m)
At each queried key q_j the model predicts f(q_j). A query asks for a key that was not stored with
probability p_unstored, no key twice. Exact posterior: one-hot on f(q) for a stored key; for a key not
stored, the prior, uniform over the n_values values (so the model must know what it does not know).

Layouts (--layout): "store" (default): stored keys drawn without replacement, supervised at the queries
only. "pilot" (the authors' binding pilot): stored keys drawn with replacement, supervised also at every
stored key (one-hot where that key was stored before, uniform where it is new), then the queries.

A curriculum (--recall-curriculum P:S,...) stores P pairs before training step S (the positions the other pairs
would fill hold filler, so T is the same); the posterior stays exact, since it depends on the pairs stored,
not on how the queries were chosen (a query whose pool runs short takes the other one).

Answer groups (evaluation.group_metrics): "stored" (one-hot posteriors) and "not stored" (uniform).

Tokens: key k is token k, value v is token n_keys + v, then STORE, SEP, QUERY, FILL.
Notation: n sequences, T tokens, P pairs, Q queries, K keys, V values.
"""
import numpy as np

from tunnels import windtunnels as wt

SETTINGS = {"pairs": 8, "n_keys": 32, "n_values": 32, "filler": 8, "queries": 4, "p_unstored": 0.5,
            "layout": "store", "pair_curriculum": "", "filler_fixed": False}
LAYOUTS = ("store", "pilot")
TINY = {"train": {"pairs": 2, "n_keys": 5, "n_values": 4, "filler": 2, "queries": 2},     # 14 positions
        "grad": {"pairs": 2, "n_keys": 5, "n_values": 4, "filler": 2, "queries": 2}}
ANSWER_LABEL = "answer j (the j-th query; pilot: the stored keys first)"   # what the figures call the i-th answer


def check_pairs(pairs, s):
    return None if pairs >= 1 else "recall needs at least 1 stored pair"


def check_n_keys(n_keys, s):
    """The relations between the settings are checked here and in check_queries, each once."""
    if s.get("pairs") is not None and n_keys < 2 * s["pairs"]:
        return f"the key alphabet must hold at least twice the pairs ({s['pairs']}), so unstored keys exist"
    return None


def check_queries(queries, s):
    if queries < 1:
        return "recall needs at least 1 query"
    if s.get("layout", "store") == "store" and s.get("pairs") is not None and queries > s["pairs"]:
        return f"{queries} queries without repeats need at least as many stored pairs ({s['pairs']})"
    if s.get("n_keys") is not None and s.get("pairs") is not None and s["n_keys"] - s["pairs"] < queries:
        return f"{queries} queries without repeats need as many unstored keys ({s['n_keys'] - s['pairs']})"
    return None


def check_values(n_values, s):
    return None if n_values >= 2 else "recall needs at least 2 values (with one, every posterior is one-hot)"


def check_filler(filler, s):
    return None if filler >= 0 else "the filler's longest run cannot be negative"


def check_p(p, s):
    return None if 0.0 <= p <= 1.0 else "a probability must lie in [0, 1]"


def check_curriculum(text, s):
    try:
        stages = wt.parse_stages(text, s.get("pairs") or SETTINGS["pairs"], "pairs", "2:1000,4:2000")
    except ValueError as e:
        stages = e
    return wt.check_stages(stages, s.get("steps"))


def check_layout(layout, s):
    return None if layout in LAYOUTS else f"allowed are {', '.join(LAYOUTS)}"


FLAGS = {"--pairs": dict(setting="pairs", type=int, check=check_pairs,
                         help="recall: stored key-value pairs per sequence (default 8)"),
         "--keys": dict(setting="n_keys", type=int, check=check_n_keys,
                        help="recall: the key alphabet, at least twice the pairs (default 32)"),
         "--values": dict(setting="n_values", type=int, check=check_values,
                          help="recall: the value alphabet (default 32)"),
         "--filler": dict(setting="filler", type=int, check=check_filler,
                          help="recall: the longest run of filler between the pairs and the queries, drawn per "
                               "sequence from 0 to it (default 8)"),
         "--filler-fixed": dict(setting="filler_fixed", type=bool, check=lambda v, s: None,
                                help="recall: every sequence's filler run before the queries is the longest, --filler "
                                     "(a fixed distance; default: drawn from 0 to it)"),
         "--queries": dict(setting="queries", type=int, check=check_queries,
                           help="recall: queries per sequence, no key twice (default 4)"),
         "--unstored": dict(setting="p_unstored", type=float, check=check_p,
                            help="recall: the probability that a query asks a key not stored (default 0.5)"),
         "--layout": dict(setting="layout", type=str, check=check_layout,
                          help="recall: store (keys without replacement, answers at the queries) or pilot (keys "
                               "with replacement, answers also at every stored key; the authors' pilot)"),
         "--recall-curriculum": dict(setting="pair_curriculum", type=str, check=check_curriculum, quote=True,
                                     help="recall: fewer stored pairs first, stages pairs:until_step (e.g. "
                                          "2:1000,4:2000); the targets stay exact (default: from the preset, 2:500,4:1500)")}
PRESETS = {
    # the model's sizes are its family's (models.py: PRESETS). The pair curriculum: without it the transformer
    # had not formed the lookup by step 8,000 (training loss 2.0 bits above the exact posterior's, of the
    # prior's 2.5); with 2 pairs to step 500 and 4 to step 1,500 it is within 0.002 bits by step 3,200
    "quick":   dict(batch=16, steps=60, lr=3e-3, warmup=10, pair_curriculum="2:30"),
    "default": dict(batch=64, steps=4000, lr=3e-3, warmup=100, pair_curriculum="2:500,4:1500"),
    "paper":   dict(batch=64, steps=20000, lr=2e-3, warmup=300, lr_floor=0.0, pair_curriculum="2:500,4:1500"),
}


# ----------------------------------------------------------------------------
# the task protocol

def sizes(s):
    K, V = s["n_keys"], s["n_values"]
    T = 4 * s["pairs"] + s["filler"] + 2 * s["queries"]
    return dict(vocab=K + V + 4, classes=V, max_len=T, eval_len=T)


def sample(rng, n, s, step=None):
    """n sequences; the training loop passes its step, which picks the curriculum's number of pairs (held-out
    sets pass none and see the task itself)."""
    fields = {k: v for k, v in s.items() if k != "pair_curriculum"}
    pairs = wt.stage_at(wt.parse_stages(s["pair_curriculum"], s["pairs"], "pairs", ""), step)
    if pairs is not None:                                  # fewer pairs, their places filler: the same T
        fields.update(pairs=pairs, filler=s["filler"] + 4 * (s["pairs"] - pairs))
    return batch(rng, n, **fields)


def prior_gap_bits(s, n=20_000, seed=0):
    """The paper metric of a prior-only predictor (uniform over the values): the mean over the answers of
    log2 V - E[H_Bayes]. The store layout: each query is unstored with probability p, H = p log2 V, exact.
    The pilot: exact at the stored keys (the i-th is new with probability ((K - 1) / K)^i), Monte Carlo
    over n sequences at the queries (whose pools may run short: see batch)."""
    log_v = np.log2(s["n_values"])
    if s["layout"] == "store":
        return float((1.0 - s["p_unstored"]) * log_v)
    new = ((s["n_keys"] - 1) / s["n_keys"]) ** np.arange(s["pairs"])            # (P,)
    b = sample(np.random.default_rng(seed), n, s)
    answers = b["posterior"][b["mask"] > 0].reshape(n, s["pairs"] + s["queries"], -1)   # (n, P + Q, V) in order
    h_queries = wt.entropy_bits(answers[:, s["pairs"]:])                             # (n, Q)
    h = np.r_[new * log_v, h_queries.mean(0)]
    return float(np.mean(log_v - h))


# ----------------------------------------------------------------------------
# the sampler and the exact posterior

def shortcut(batch, s):
    """The best answer without binding (primitives/matrix.py's floor for recall): it knows which keys were stored and
    the values that were, but not which value goes with which key: a stored key gets the stored values in
    their proportions (the pilot: those stored before it), an unstored key the prior. -> (n, T, V)."""
    n_keys, n_values = s["n_keys"], s["n_values"]
    STORE = tokens_of(n_keys, n_values)[0]
    tokens, mask = batch["tokens"], batch["mask"] > 0
    n, T = tokens.shape
    q = np.full((n, T, n_values), 1.0 / n_values)
    for b in range(n):
        at = np.flatnonzero(tokens[b] == STORE) + 1                  # the stored keys' positions
        for t in np.flatnonzero(mask[b]):
            before = at[at < t]                                        # the pairs stored before this answer
            keys, values = tokens[b, before], tokens[b, before + 2] - n_keys
            if tokens[b, t] in set(keys):
                q[b, t] = np.bincount(values, minlength=n_values) / len(values)
    return q


def tokens_of(n_keys, n_values):
    """-> STORE, SEP, QUERY, FILL token ids."""
    base = n_keys + n_values
    return base, base + 1, base + 2, base + 3


def posterior(stored_keys, stored_values, query, n_values):
    """The exact posterior of f(query) given the stored pairs (lists), one row, written as the definition:
    one-hot on the stored value if the key was stored, else uniform over the values. -> (n_values,)"""
    p = np.full(n_values, 1.0 / n_values)
    for k, v in zip(stored_keys, stored_values):
        if k == query:
            p = np.eye(n_values)[v]
    return p


def batch(rng, n, pairs=8, n_keys=32, n_values=32, filler=8, queries=4, p_unstored=0.5, layout="store",
          filler_fixed=False):
    """n sequences of the recall task (module docstring) -> a batch with groups "stored" and "not stored".
    The pilot's keys are drawn with replacement, so its distinct stored keys may be fewer than the queries
    asking for stored ones: a query whose pool (stored or not) is empty takes the other pool."""
    STORE, SEP, QUERY, FILL = tokens_of(n_keys, n_values)
    T = 4 * pairs + filler + 2 * queries
    f = rng.integers(0, n_values, size=(n, n_keys))                          # (n, K) the random map
    if layout == "store":
        keys = rng.permuted(np.tile(np.arange(n_keys), (n, 1)), axis=1)[:, :pairs]   # (n, P) without replacement
    else:
        keys = rng.integers(0, n_keys, size=(n, pairs))                       # (n, P) with replacement
    values = np.take_along_axis(f, keys, axis=1)                              # (n, P)
    m = rng.integers(0, filler + 1, size=n)                                   # (n,) filler before the queries
    if filler_fixed:                                                          # (drawn all the same: the other
        m[:] = filler                                                         # draws stay as they were)
    unstored = rng.random((n, queries)) < p_unstored                          # (n, Q) which pool each query asks
    order = rng.random((n, n_keys))                                           # (n, K) a random order of the keys
    tokens = np.full((n, T), FILL, dtype=np.int64)
    targets = np.zeros((n, T), dtype=np.int64)
    mask, posterior_ = np.zeros((n, T)), np.zeros((n, T, n_values))
    uniform = np.full(n_values, 1.0 / n_values)
    at_key = 4 * np.arange(pairs) + 1                                         # (P,) where each stored key sits
    tokens[:, at_key - 1], tokens[:, at_key], tokens[:, at_key + 1], tokens[:, at_key + 2] = \
        STORE, keys, SEP, n_keys + values
    if layout == "pilot":                                                     # a key's value is known once stored
        seen = (keys[:, :, None] == keys[:, None, :]) & np.tri(pairs, k=-1, dtype=bool)[None]   # (n, P, P) j < i
        known = seen.any(-1)                                                  # (n, P)
        targets[:, at_key] = values
        mask[:, at_key] = 1.0
        posterior_[:, at_key] = np.where(known[..., None], np.eye(n_values)[values], uniform)
    for b in range(n):
        stored = np.zeros(n_keys, bool)
        stored[keys[b]] = True
        pools = [list(np.argsort(order[b])[stored[np.argsort(order[b])]]),    # stored keys, in a random order
                 list(np.argsort(order[b])[~stored[np.argsort(order[b])]])]   # the others
        for j in range(queries):
            pool = pools[int(unstored[b, j])] or pools[1 - int(unstored[b, j])]
            q = pool.pop(0)
            t = 4 * pairs + m[b] + 2 * j
            tokens[b, t], tokens[b, t + 1] = QUERY, q
            targets[b, t + 1], mask[b, t + 1] = f[b, q], 1.0
            posterior_[b, t + 1] = np.eye(n_values)[f[b, q]] if stored[q] else uniform
    one_hot = (posterior_.max(-1) == 1.0) & (mask > 0)
    groups = {"stored": one_hot, "not stored": (mask > 0) & ~one_hot}
    return dict(tokens=tokens, targets=targets, mask=mask, posterior=posterior_,
                groups={g: w.astype(np.float64) for g, w in groups.items() if w.any()})   # a group marks one answer or more
