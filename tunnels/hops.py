"""hops: multi-hop lookup, as a task of tasks.TASKS: how many steps of inference a fixed depth can take.

A fresh random permutation f of V symbols per sequence, shown as pairs `k f(k)` in a random order, with
`hidden` of them left out: shown as `k ?`, the key without its image (which ones: drawn per sequence,
independently of f). Then a query `Q H_h x`: follow f from x for h hops (h drawn per sequence, uniformly
from 1 to max_hops).
    k_1 v_1 k_2 ? k_3 v_3 ... k_V v_V  Q H_h x  [c_1 ... c_(h-1)]  FILL ...
Direct (the default): the model predicts f^h(x) at x. Chain of thought (cot): the model writes the chain
one hop per token: at x it predicts c_1 = f(x), at c_j it predicts f^(j+1)(x), teacher-forced (the true
c_j is the next input), so its last answer is f^h(x). (The symbol x last, where the first answer is due,
as recall's queried key.)

The exact posterior. Given what is shown, f is uniform over its completions: the m hidden keys go to the
m hidden values (those no shown pair maps to), one of m! ways, each equally likely (the prior over
permutations is uniform and which pairs are hidden does not depend on f). So the posterior of f^h(x) is
the share of completions that send x there in h hops, and a chain of thought's j-th hop, given the hops
before it, is the same share among the completions that agree with those hops (completions). A chain
that never meets a hidden key has a one-hot answer; one that does is uncertain from there on (one hidden
pair alone is found by elimination). By the chain rule, a model calibrated at every hop that samples its
own chain ends on f^h(x) distributed as the direct posterior (primitives/cot.py measures it).

Answer groups (evaluation.group_metrics): "h=1" ... "h=<max_hops>", each sequence's final answer by its
h; with cot also "hops before the last" (the intermediate hops).

Curricula. --hops-curriculum V':S,... draws the permutation on V' of the symbols (drawn per sequence, so
every class is an answer at every stage) before training step S, with hidden x V' / V (rounded) of its
pairs hidden; its pairs sit in slots drawn among the V places, FILL FILL in the others (so the query, the
answers and T stay where they are, and every place holds pairs from the first stage on). The posterior
stays exact: the symbols in play are the keys shown. --hop-curriculum H':S,... draws h from 1 to H' (at
most max_hops) before step S. What the transformer needed (primitives/README.md, "Running out of layers"): without
a curriculum it had not begun the lookup by step 1,500; from 4 symbols it had in one run of four, from
2 within 750 steps; with a stage's pairs at the end of the places the lookup broke at each change of
stage; with no hidden pair before the task itself, the first hidden ones cost a spike of 12 bits.

Tokens: symbol s is token s as a key (the query's, a written hop's: class c is token c) and V + s as a
value (in a pair), hop count h is token 2V + h - 1, then Q, FILL and ? (UNSEEN). (Keys and values apart,
as recall's: with one token per symbol the transformer had not begun the lookup within 500 steps.)
Notation: n sequences, T tokens, V symbols, m hidden pairs, H max_hops, C completions (m!).
"""
import itertools
import math

import numpy as np

from tunnels import windtunnels as wt

SETTINGS = {"n_symbols": 16, "hidden": 3, "max_hops": 4, "cot": False, "symbol_curriculum": "", "hop_curriculum": "",
            "queries": 1}
HOPS_TOP = 64                  # the hop curriculum's stages may name up to this (clipped to max_hops)
CHUNK = 2 ** 22                # hop_posteriors' one-hot holds at most this many floats (32 MB) at a time
MAX_COMPLETIONS = 720          # m! completions are enumerated for every sequence: m <= 6
TINY = {"train": {"n_symbols": 5, "hidden": 1, "max_hops": 2},              # 11 positions
        "grad": {"n_symbols": 6, "hidden": 2, "max_hops": 3, "cot": True}}  # 13 positions, up to three hops
ANSWER_LABEL = "answer j (direct: the one answer; cot: hop j)"
LAST = "hops before the last"  # the cot's intermediate answers, a group of their own


def check_symbols(v, s):
    return None if v >= 2 else "hops needs at least 2 symbols"


def check_hidden(m, s):
    if m < 0:
        return "the hidden pairs cannot be negative"
    if math.factorial(m) > MAX_COMPLETIONS:
        return f"{m} hidden pairs have {math.factorial(m)} completions to enumerate; at most 6 (720)"
    if s.get("n_symbols") is not None and m > s["n_symbols"]:
        return f"{m} hidden pairs of {s['n_symbols']} symbols"
    return None


def check_hops(h, s):
    return None if h >= 1 else "hops needs at least 1 hop"


def check_queries(q, s):
    if q < 1:
        return "a sequence needs at least 1 query"
    if q > 1 and s.get("cot"):
        return "several queries a sequence are the direct format's (a chain of thought writes one chain)"
    return None if q <= 64 else "at most 64 queries a sequence"


def check_curriculum(text, s):
    try:
        stages = wt.parse_stages(text, s.get("n_symbols") or SETTINGS["n_symbols"], "symbols", "4:500,8:1500")
    except ValueError as e:
        return str(e)
    if any(V < 2 for _, V in stages):                    # a stage shows every pair: no hidden ones to hold
        return "every stage needs at least 2 symbols"
    return wt.check_stages(stages, s.get("steps"))


def check_hop_curriculum(text, s):
    try:
        stages = wt.parse_stages(text, HOPS_TOP, "hops", "1:1500,2:2500")
    except ValueError as e:
        return str(e)
    top = s.get("max_hops") or SETTINGS["max_hops"]
    beyond = [H for _, H in stages if H > top]
    if beyond and s.get("typed", True):         # a preset's stages are clipped to --max-hops (sample)
        return f"a stage of {beyond[0]} hops, beyond --max-hops {top}: each stage at most --max-hops"
    return wt.check_stages(stages, s.get("steps"))


FLAGS = {"--symbols": dict(setting="n_symbols", type=int, check=check_symbols,
                           help="hops: the symbols the permutation acts on (default 16)"),
         "--hidden": dict(setting="hidden", type=int, check=check_hidden,
                          help="hops: pairs left out per sequence, 0 to 6 (default 3)"),
         "--max-hops": dict(setting="max_hops", type=int, check=check_hops,
                            help="hops: the query's hops are drawn from 1 to this (default 4)"),
         "--queries": dict(setting="queries", type=int, check=check_queries,
                           help="hops, direct: queries a sequence, each `Q H_h x` with its own h and start, each "
                                "answer supervised (default 1; as many as a chain of thought's answers matches their "
                                "supervision)"),
         "--cot": dict(setting="cot", type=bool, check=lambda v, s: None,
                       help="hops: chain of thought, one hop per token, each supervised against its exact "
                            "posterior given the hops before it (teacher-forced)"),
         "--hops-curriculum": dict(setting="symbol_curriculum", type=str, check=check_curriculum, quote=True,
                                   help="hops: fewer symbols first, stages symbols:until_step (e.g. 4:500,8:1500); "
                                        "the targets stay exact (default: from the preset)"),
         "--hop-curriculum": dict(setting="hop_curriculum", type=str, check=check_hop_curriculum, quote=True,
                                  help="hops: fewer hops first, stages max_hops:until_step (e.g. 1:1500,2:2500), each "
                                       "at most --max-hops (default: from the preset)")}
PRESETS = {
    "quick":   dict(batch=16, steps=60, lr=3e-3, warmup=10, symbol_curriculum="4:30"),
    "default": dict(batch=64, steps=6000, lr=3e-3, warmup=100, symbol_curriculum="2:500,4:1000,8:1500",
                    hop_curriculum="1:1500,2:2500,4:3500"),
    "paper":   dict(batch=64, steps=20000, lr=2e-3, warmup=300, lr_floor=0.0, symbol_curriculum="2:500,4:1000,8:1500",
                    hop_curriculum="1:1500,2:2500,4:3500"),
}


# ----------------------------------------------------------------------------
# the task protocol

def sizes(s):
    V, H = s["n_symbols"], s["max_hops"]
    T = 2 * V + 3 * s.get("queries", 1) + (H - 1 if s["cot"] else 0)
    return dict(vocab=2 * V + H + 3, classes=V, max_len=T, eval_len=T)


def sample(rng, n, s, step=None):
    """n sequences; the training loop passes its step, which picks the curriculum's symbols (held-out sets
    pass none and see the task itself)."""
    fields = {k: v for k, v in s.items() if k not in ("symbol_curriculum", "hop_curriculum")}
    active = wt.stage_at(wt.parse_stages(s.get("symbol_curriculum", ""), s["n_symbols"], "symbols", ""), step)
    most = wt.stage_at(wt.parse_stages(s.get("hop_curriculum", ""), HOPS_TOP, "hops", ""), step)
    return batch(rng, n, **fields, active=active, most=None if most is None else min(most, s["max_hops"]))


def settings_of(cfg):
    """The settings of a checkpoint written before --queries existed (its meta has the rest): one query."""
    return {**SETTINGS, "n_symbols": cfg.n_classes, "queries": 1}


def prior_gap_bits(s, n=20_000, seed=0):
    """The gap of a prior-only predictor (uniform over the symbols): log2 V - E[H_Bayes] over all the answers
    pooled, Monte Carlo over n sequences (an answer's entropy depends on whether its chain meets a hidden
    key). Direct, one answer a row, this is the paper metric; with cot the paper metric averages by answer
    index first and differs a little (3.751 against 3.728 bits at the defaults)."""
    b = sample(np.random.default_rng(seed), n, s)
    return float(np.log2(s["n_symbols"]) - wt.entropy_bits(b["posterior"][b["mask"] > 0]).mean())


def tokens_of(n_symbols, max_hops):
    """-> the hop-count token of h = 1 (h's is this + h - 1), Q, FILL, UNSEEN (the values are V .. 2V - 1)."""
    base = 2 * n_symbols + max_hops
    return 2 * n_symbols, base, base + 1, base + 2


# ----------------------------------------------------------------------------
# the exact posterior

def completions(f_shown, V):
    """f_shown (n, V) int: f(k) where the pair k is shown, -1 where hidden -> (n, C, V) every completion of
    each row's f: its hidden keys sent to its hidden values in each of the m! ways (the same m in every
    row), in the order of itertools.permutations."""
    n = len(f_shown)
    hidden = f_shown < 0                                                        # (n, V)
    m = int(hidden[0].sum())
    if np.any(hidden.sum(1) != m):
        raise ValueError("every row must hide the same number of pairs")
    shown_values = np.zeros((n, V), bool)                                        # (n, V) v is some shown f(k)
    r, k = np.nonzero(~hidden)
    shown_values[r, f_shown[r, k]] = True
    keys = np.argsort(~hidden, axis=1, kind="stable")[:, :m]                     # (n, m) the hidden keys
    values = np.argsort(shown_values, axis=1, kind="stable")[:, :m]             # (n, m) the hidden values
    perms = np.array(list(itertools.permutations(range(m))), dtype=np.int64).reshape(math.factorial(m), m)  # (C, m)
    out = np.repeat(f_shown[:, None, :], len(perms), axis=1)                     # (n, C, V)
    rows = np.arange(n)[:, None, None]
    out[rows, np.arange(len(perms))[None, :, None], keys[:, None, :]] = values[:, perms]
    return out


def chains(fs, x, h):
    """fs (n, C, V) maps, x (n,) start symbols -> (n, C, h + 1) each map's chain x, f(x), ..., f^h(x)."""
    n, C, _ = fs.shape
    out = np.empty((n, C, h + 1), dtype=np.int64)
    out[:, :, 0] = x[:, None]
    for j in range(h):
        out[:, :, j + 1] = np.take_along_axis(fs, out[:, :, j:j + 1], axis=2)[:, :, 0]
    return out


def hop_posteriors(f_shown, x, h, chain):
    """The exact posterior of every hop of every row. f_shown (n, V) (-1 where hidden), x (n,), h: the
    largest hop asked, chain (n, h + 1) the true chain (teacher forcing) -> direct (n, h, V): row b's
    posterior of f^j(x) given the shown pairs alone, at [b, j - 1]; cot (n, h, V): the same given also the
    true hops before it, f(x) ... f^(j-1)(x)."""
    n, V = f_shown.shape
    step = max(1, CHUNK // (math.factorial(int((f_shown[0] < 0).sum())) * h * V))   # rows at a time: the
    if n > step:                                                                # one-hot below is (n, C, h, V)
        parts = [hop_posteriors(f_shown[i:i + step], x[i:i + step], h, chain[i:i + step]) for i in range(0, n, step)]
        return tuple(np.concatenate(p) for p in zip(*parts))
    walk = chains(completions(f_shown, V), x, h)                                # (n, C, h + 1)
    C = walk.shape[1]
    onehot = np.eye(V)[walk[:, :, 1:]]                                          # (n, C, h, V)
    direct = onehot.mean(1)                                                     # (n, h, V)
    agree = np.cumprod(walk[:, :, 1:] == chain[:, None, 1:], axis=2)            # (n, C, h): agrees to hop j
    before = np.concatenate([np.ones((n, C, 1)), agree[:, :, :-1]], axis=2)     # agrees with the hops before j
    with np.errstate(invalid="ignore", divide="ignore"):   # past a hop no completion agrees with (never on a
        cot = np.einsum("nch,nchv->nhv", before, onehot) / before.sum(1)[..., None]   # true chain): NaN
    return direct, cot


def batch(rng, n, n_symbols=16, hidden=3, max_hops=4, cot=False, active=None, most=None, queries=1):
    """n sequences of the hops task (module docstring) -> a batch with groups "h=1".. and, with cot, LAST.
    The curricula: active, the permutation acts on `active` of the symbols (None: all); most, h is drawn
    from 1 to `most` (None: max_hops). queries (direct only): `Q H_h x` this many times after the pairs, each
    with its own h and x (the first drawn as a single query's is, the others after everything else)."""
    V, m, H = n_symbols, hidden, max_hops
    A = V if active is None else active                                         # the symbols in play
    if active is not None:
        m = int(round(m * A / V))                  # hidden pairs in proportion (Python's round: halves to even)
    H1, Q, FILL, UNSEEN = tokens_of(V, H)
    T = sizes(dict(n_symbols=V, hidden=hidden, max_hops=H, cot=cot, queries=queries))["max_len"]
    f = rng.permuted(np.tile(np.arange(A), (n, 1)), axis=1)                     # (n, A) the permutation, on
    order = rng.permuted(np.tile(np.arange(A), (n, 1)), axis=1)                 # (n, A) a random order of keys
    shown_keys = order[:, m:]                                                   # (n, A - m) in shown order
    f_shown = np.full((n, A), -1, dtype=np.int64)
    np.put_along_axis(f_shown, shown_keys, np.take_along_axis(f, shown_keys, 1), axis=1)
    top = H if most is None else most

    def query(x, h):                              # (n,) start and hops -> the true chain, both posteriors
        chain = chains(f[:, None, :], x, H)[:, 0]                               # (n, H + 1) the true chain
        return [x, h, chain, *hop_posteriors(f_shown, x, H, chain)]             # ..., (n, H, A) each
    asked = [query(rng.integers(0, A, size=n), rng.integers(1, top + 1, size=n))]
    shown_values = np.take_along_axis(f, shown_keys, 1)                         # (n, A - m)
    hidden_keys = order[:, :m]                                                  # (n, m)
    if active is not None:                                                      # symbols 0..A-1 stand for A
        sym = rng.permuted(np.tile(np.arange(V), (n, 1)), axis=1)[:, :A]        # (n, A) of the V, drawn per row
    keys = np.concatenate([shown_keys, hidden_keys], axis=1)                    # (n, A) shown, then hidden
    slots = rng.permuted(np.tile(np.arange(V), (n, 1)), axis=1)[:, :A]          # (n, A) their places
    asked += [query(rng.integers(0, A, size=n), rng.integers(1, top + 1, size=n)) for _ in range(queries - 1)]
    if active is not None:
        onto = np.eye(V)[sym]                                                   # (n, A, V)
        name = lambda a: np.take_along_axis(sym, a, 1)                          # local symbols -> tokens
        asked = [[name(x[:, None])[:, 0], h, name(chain), *(np.einsum("nha,nav->nhv", p, onto) for p in posts)]
                 for x, h, chain, *posts in asked]                              # (n, H, V) posteriors
        keys, shown_values = name(keys), name(shown_values)
    tokens = np.full((n, T), FILL, dtype=np.int64)
    targets = np.zeros((n, T), dtype=np.int64)
    mask, posterior = np.zeros((n, T)), np.zeros((n, T, V))
    values = np.concatenate([V + shown_values, np.full((n, m), UNSEEN)], axis=1)
    np.put_along_axis(tokens, 2 * slots, keys, axis=1)                         # in a random order (all V places
    np.put_along_axis(tokens, 2 * slots + 1, values, axis=1)                   # but in a curriculum stage)
    groups = {f"h={k}": np.zeros((n, T)) for k in range(1, H + 1)}
    last = np.zeros((n, T))
    rows = np.arange(n)
    for i, (x, h, chain, direct, cot_post) in enumerate(asked):
        P = 2 * V + 3 * i                                                       # this query's place
        tokens[:, P], tokens[:, P + 1], tokens[:, P + 2] = Q, H1 + h - 1, x        # the answers start at x
        if not cot:
            t = np.full(n, P + 2)
            targets[:, P + 2], mask[:, P + 2] = chain[rows, h], 1.0
            posterior[:, P + 2] = direct[rows, h - 1]
        else:
            for j in range(1, H + 1):                                           # hop j is answered at P + 1 + j
                on = h >= j
                t = P + 1 + j
                if j > 1:
                    tokens[on, t] = chain[on, j - 1]                             # the true hop before it
                targets[on, t], mask[on, t] = chain[on, j], 1.0
                posterior[on, t] = cot_post[on, j - 1]
                last[on & (h > j), t] = 1.0
            t = P + 1 + h
        for k in range(1, H + 1):
            groups[f"h={k}"][rows[h == k], t[h == k]] = 1.0
    if cot and last.any():
        groups[LAST] = last
    x, h, chain, direct, _ = asked[0]
    return dict(tokens=tokens, targets=targets, mask=mask, posterior=posterior,
                groups={g: w for g, w in groups.items() if w.any()},             # a group marks one answer or more
                final_posterior=direct[rows, h - 1], final_target=chain[rows, h])   # (n, V), (n,): primitives/cot.py's


def answer_length(s, h):
    """The tokens a model reads up to its last answer of h hops: direct, the query's x; cot, the last hop."""
    return 2 * s["n_symbols"] + 3 + (h - 1 if s["cot"] else 0)


def chain_layout(batch, s):
    """primitives/cot.py's hook: -> (first (n,), hops (n,)): row b's hop j is predicted at first[b] + j - 1 and is the
    input at first[b] + j (its answers are its supervised positions, one per hop); None for the direct
    format (one answer per row: nothing to run free)."""
    if not s["cot"]:
        return None
    mask = batch["mask"] > 0
    return mask.argmax(1), mask.sum(1)


# ----------------------------------------------------------------------------
# two readings of a depth: the lookup (answers whose posterior is one-hot) and the elimination (uncertain
# answers), each beside a predictor that does only one of the two

def shown_map(tokens, s):
    """tokens (n, T) of the task itself (no curriculum) -> f_shown (n, V): f(k) where the pair k is shown, -1
    where it is hidden; x (n, q) each query's start; h (n, q) its hops (q: the queries a sequence)."""
    V, H, q = s["n_symbols"], s["max_hops"], s.get("queries", 1)
    H1, _, _, _ = tokens_of(V, H)
    keys, values = tokens[:, 0:2 * V:2], tokens[:, 1:2 * V:2]                   # (n, V) each, in shown order
    f_shown = np.full((len(tokens), V), -1, dtype=np.int64)
    shown = (values >= V) & (values < 2 * V)                                    # a value token, not `?`
    r, i = np.nonzero(shown)
    f_shown[r, keys[r, i]] = values[r, i] - V
    at = 2 * V + 3 * np.arange(q)                                               # (q,) each query's Q
    return f_shown, tokens[:, at + 2], tokens[:, at + 1] - H1 + 1


def follow_shown(f_shown, x, h):
    """The lookup-only predictor: follow the shown pairs from x for h hops; one-hot at f^h(x) where the chain
    meets no hidden key, uniform over the V symbols once it does. f_shown (n, V), x (n,), h (n,) -> (n, V)."""
    n, V = f_shown.shape
    at, lost = x.copy(), np.zeros(n, bool)
    for j in range(int(h.max())):
        go = (j < h) & ~lost
        nxt = f_shown[np.arange(n), at]
        lost |= go & (nxt < 0)
        at = np.where(go & (nxt >= 0), nxt, at)
    return np.where(lost[:, None], 1.0 / V, np.eye(V)[at])


def eliminate_each_hop(f_shown, x, h):
    """Lookup plus elimination, each hop on its own: p_0 = one-hot at x, then p_j = p_(j-1) M, where M's row k
    is one-hot at f(k) for a shown key and uniform over the hidden values (those no shown pair maps to) for a
    hidden one. Exact for one hop; past a hidden hop it forgets that a permutation sends two hidden keys to two
    different values. f_shown (n, V), x (n,), h (n,) -> (n, V)."""
    n, V = f_shown.shape
    hidden_values = np.ones((n, V), bool)
    r, k = np.nonzero(f_shown >= 0)
    hidden_values[r, f_shown[r, k]] = False
    W = hidden_values / np.maximum(hidden_values.sum(1, keepdims=True), 1)      # (n, V) uniform on them
    M = np.where((f_shown >= 0)[:, :, None], np.eye(V)[np.maximum(f_shown, 0)], W[:, None, :])   # (n, V, V)
    p = np.eye(V)[x]                                                            # (n, V)
    for j in range(int(h.max())):
        p = np.where((j < h)[:, None], np.einsum("nk,nkv->nv", p, M), p)
    return p


def readings(batch, q, s):
    """The direct format's two readings, h by h. batch: held-out sequences of the task itself; q (n, T, K)
    the model's distributions. -> {h: dict(lookup=..., elimination=..., follow_shown=..., eliminate_each_hop=...)}:
    lookup, over the answers whose exact posterior is one-hot: n, the model's accuracy and KL; elimination,
    over the others: n, the model's KL; and the two predictors' accuracy (lookup) and KL (elimination) on the
    same answers, with each one's score over all the answers of h (1 - KL / KL(uniform), the matrix's score)."""
    if s["cot"]:
        raise ValueError("readings are the direct format's (one answer a row)")
    f_shown, x, h = shown_map(batch["tokens"], s)                               # (n, V), (n, Q), (n, Q)
    t = 2 * s["n_symbols"] + 2 + 3 * np.arange(x.shape[1])                      # (Q,) each query's answer
    post, model = (a[:, t].reshape(-1, a.shape[-1]) for a in (batch["posterior"], q))   # (n Q, V) each
    f_shown, x, h = np.repeat(f_shown, x.shape[1], axis=0), x.reshape(-1), h.reshape(-1)  # one row an answer
    preds = {"follow_shown": follow_shown(f_shown, x, h), "eliminate_each_hop": eliminate_each_hop(f_shown, x, h)}
    one_hot = post.max(-1) == 1.0
    uniform = np.full_like(post, 1.0 / post.shape[1])
    out = {}
    for hh in range(1, s["max_hops"] + 1):
        rows = h == hh
        if not rows.any():
            continue
        look, elim = rows & one_hot, rows & ~one_hot
        acc = lambda p: float((p[look].argmax(-1) == post[look].argmax(-1)).mean()) if look.any() else None
        kl = lambda p, where: float(wt.kl_bits(post[where], p[where]).mean()) if where.any() else None
        prior = float(wt.kl_bits(post[rows], uniform[rows]).mean())
        entry = dict(lookup=dict(n=int(look.sum()), accuracy=acc(model), kl_bits=kl(model, look)),
                     elimination=dict(n=int(elim.sum()), kl_bits=kl(model, elim)), prior_kl_bits=prior)
        for name, p in preds.items():
            entry[name] = dict(accuracy=acc(p), lookup_kl_bits=kl(p, look), elimination_kl_bits=kl(p, elim),
                               score=1.0 - float(wt.kl_bits(post[rows], p[rows]).mean()) / prior)
        out[hh] = entry
    return out
