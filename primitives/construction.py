"""construction: a transformer whose weights are written by hand, not trained, that answers the hops task's
direct questions; and the prediction of how many layers h hops need, which the depth experiment's rules
(primitives/depth_rules.py) hold the trained models against.

The prediction, from the token layout (tunnels/hops.py: pairs `k v` in a random order, then `Q H_h x`, the
answer f^h(x) due at x, causal attention):
  - Binding takes one layer. A value token does not know its key: in the first layer each position reads the
    token before it, so a pair's value position learns its key (and x's position learns h from H_h before it).
  - A hop is one attention: a query (a symbol) finds the value position whose bound key matches and reads
    its value. x's position can hop once a layer, each hop keyed by the one before.
  - Pointer doubling shortens it. Of two pairs that follow each other in a chain, one is shown first, and the
    later one can compose with it: (f(a), f^2(a)) shown after (a, f(a)) finds it by its value, (a, f(a))
    shown after (f(a), f^2(a)) finds it by its key; either way the later position learns a -> f^2(a). So
    after binding, layer l can give the pairs f^(2^(l-1)) for every symbol, whatever the order, and x's
    position, jumping by the largest power ready before each layer, reaches 2^(L-1) - 1 hops with L layers.
  So h hops need 1 + ceil(log2(h + 1)) layers (`layers_needed`): 2 for one hop, 3 for two or three, 4 for up to
  seven. Fewer cannot, for every order: a layer lets a position combine what it and one earlier position
  knew, so the longest composition of f any position holds at most doubles a layer (an argument, not a proof
  for every weight setting; the k-hop lower bounds of the parallel-computation literature say the same).

The construction (`params(s, n_layers)`) builds the doubling with compositions of two hops, which is enough
for the hops task's sizes here: after binding (block 0), block 1 gives every pair the two-hop map through
the pair after it in the chain, whichever of the two is shown first (`forward`: a pair whose successor pair
came earlier reads that pair's value, f^2 of its key; `backward`: a pair whose predecessor pair came earlier
reads that pair's key, so it holds predecessor -> f^2(predecessor) = its own value), and x's position takes
its first hop. From block 2 on, x's position jumps from every hop it holds by one (a lookup) and by two (one
of the two-hop maps: exactly one of them exists for a chain's pair), so blocks 0..L-1 give hops 1; 1..3;
1..5; 1..7 (`reach`): equal to the prediction at 2 and 3 layers, and for every h of the depth sweep (at
most 4 hops: 4 layers); from 6 hops on the prediction's 4 layers would need maps of four hops built in
block 2 as well, which this construction does not build (it takes 5 layers for 6 and 7 hops).

It is bayesattn's own transformer (pre-LN blocks, GELU MLP, a few heads of one layer's attention each
doing one lookup), every weight set by hand. Every feature is a pair of coordinates (+a, -a), so each
vector's mean is 0 and LayerNorm only rescales it; a large constant feature (ONE, at every position) keeps
that scale the same at every position, so a feature written as 1 reads as about 1 everywhere. A lookup is
a head whose query is a symbol feature of the asking position and whose key is a symbol feature of the
others: a match scores SHARP, position 0 (a key token that holds nothing a lookup reads) scores SHARP / 2,
so a query that matches nowhere reads nothing. Features:
  S (V): the token as a key symbol (a pair's key, the query's x); U (V): a value symbol; HOP (H): the h of
  H_h; IS_VAL: a pair's second place (a value or `?`); POS (T): the position; ONE.
  B (V): the bound key (block 0: the previous token's S, erased by block 0's MLP where the position is not
  a pair's second place: position 0 and a later query's Q); HH (H): h at x (the previous token's HOP).
  F2 (V): the forward two-hop map's value (keyed by B); P (V): the backward map's key (its value is U).
  R_1 .. R_H (V each): x's hops, f^j(x); a hidden key's pair holds `?`, no value, so the chain reads nothing
  from there on, as the lookup-only predictor does (tunnels/hops.follow_shown).
  ANS (V): the last block's MLP copies R_h, chosen by HH, to the answer the unembedding reads.
"""

import math

import numpy as np

import bayesattn as ba
from tunnels import hops

ONE = 30.0          # the constant feature's size: the rest of a vector moves its norm by a few percent at most
SHARP = 40.0        # an attention score's margin between the position a lookup wants and the next best
GATE = 20.0         # the MLP's choice of R_h: a neuron's input is +GATE/2 when chosen, -GATE/2 else
CONFIDENT = 30.0    # the logit of the answer over the others (a one-hot answer: probability 1 - 1e-12)


def layers_needed(h):
    """The prediction: the layers a transformer needs for h hops in this layout: one to bind, then pointer
    doubling, 1 + ceil(log2(h + 1)) (module docstring)."""
    return 1 + math.ceil(math.log2(h + 1))


def hops_at(n_layers, max_hops):
    """{block l: the hops x's position holds after it} of this construction (module docstring): block 1 the
    first; each later block one and two past every hop held before it. -> {l: sorted list}, blocks 1..L-1."""
    held, out = [], {}
    for l in range(1, n_layers):
        held = [1] if l == 1 else sorted({j + d for j in held for d in (0, 1, 2)})
        held = [j for j in held if j <= max_hops]
        out[l] = held
    return out


def reach(n_layers, max_hops=64):
    """The most hops this construction answers with n_layers blocks: 0, 1, 3, 5, 7, ... (2L - 3 from 2 on)."""
    got = hops_at(n_layers, max_hops)
    return max(got[n_layers - 1]) if n_layers >= 2 else 0


def layers_for(h):
    """The layers this construction takes for h hops: the prediction's up to 5 hops, one more for 6 and 7."""
    return next(L for L in range(2, 2 * h + 3) if reach(L, h) >= h)


def plan(n_layers, max_hops):
    """Block l's new hops and where each comes from: {l: {m: (j, step)}}, hop m read from hop j by a lookup
    (step 1) or a two-hop map (step 2), the two-hop map preferred, each hop made once."""
    held, out = set(), {}
    for l, now in hops_at(n_layers, max_hops).items():
        out[l] = {m: ((m - 2, 2) if m - 2 in held else (m - 1, 1)) for m in now if m not in held and l > 1}
        held |= set(now)
    return out


def features(V, H, T):
    """{name: (first logical index, size)} of the residual stream's features, and the logical size."""
    layout, at = {}, 0
    for name, size in [("S", V), ("U", V), ("HOP", H), ("IS_VAL", 1), ("POS", T), ("ONE", 1), ("B", V),
                       ("HH", H), ("F2", V), ("P", V), *[(f"R{l}", V) for l in range(1, H + 1)], ("ANS", V)]:
        layout[name], at = (at, size), at + size
    return layout, at


def heads(n_layers, H):
    """Each block's heads, as (query feature, key feature, [(read, write), ...], exclude self): a match of the
    query's symbol with the key's reads the `read` features into the `write` ones."""
    out = {0: [], 1: [("S", "B", [("U", "R1")], False),          # x's first hop
                      ("U", "B", [("U", "F2")], False),          # forward: the successor pair came earlier
                      ("B", "U", [("B", "P")], True)]}           # backward: the predecessor pair came earlier
    for l, new in plan(n_layers, H).items():
        if l == 1:
            continue
        by_source = {}
        for m, (j, step) in sorted(new.items()):
            by_source.setdefault(j, []).append((m, step))
        out[l] = []
        for j, made in by_source.items():
            look = [("U", f"R{m}") for m, step in made if step == 1] + [("F2", f"R{m}") for m, step in made if step == 2]
            out[l].append((f"R{j}", "B", look, False))
            out[l] += [(f"R{j}", "P", [("U", f"R{m}")], False) for m, step in made if step == 2]
    return out


def params(s, n_layers=None, dtype="float64"):
    """-> (cfg, params) of the construction for hops settings s (direct format, any number of queries), with
    n_layers blocks (default layers_for(max_hops); fewer: the hops it has blocks for, the rest read nothing)."""
    if s["cot"]:
        raise ValueError("the construction answers the direct format (one answer at x)")
    V, H = s["n_symbols"], s["max_hops"]
    sz = hops.sizes(s)
    T = sz["max_len"]
    L = layers_for(H) if n_layers is None else n_layers
    if L < 1:
        raise ValueError(f"n_layers={L}: the construction needs at least 1 block")
    layout, D = features(V, H, T)
    plan_heads = {l: heads(L, H).get(l, []) for l in range(L)}
    NH = max(1, max(len(v) for v in plan_heads.values()))
    need = 2 * V + T + 1                     # a head's columns: the match, the position's own (excluded), the sink
    hs = max(need, -(-2 * D // NH))
    C = NH * hs                              # each logical feature: two coordinates, padded to the heads' split
    cfg = ba.Config(vocab_size=sz["vocab"], n_classes=V, max_len=T, d_model=C, n_layers=L, n_heads=NH,
                    d_mlp=max(V, H * V), dtype=dtype)
    c = math.sqrt(C / 2) / ONE               # how a feature of size 1 reads after LayerNorm (norm ~ ONE)
    scale = math.sqrt(hs) / c ** 2           # a query's weight: one unit of match scores 1 after 1/sqrt(hs)

    def write(name, i=0):                    # (C,) the direction that adds 1 to logical feature name[i]
        v = np.zeros(C)
        j = layout[name][0] + i
        v[2 * j], v[2 * j + 1] = 1.0, -1.0
        return v

    def read(name, i=0):                     # (C,) reads logical feature name[i] (the mean cancels)
        return write(name, i) / 2

    p = {k: np.zeros(shape) for k, shape in ba.param_shapes(cfg).items()}
    for k in p:
        if k.endswith(".g"):
            p[k][:] = 1.0
    H1, Q, FILL, UNSEEN = hops.tokens_of(V, H)
    for t in range(V):
        p["wte"][t] = write("S", t)
        p["wte"][V + t] = write("U", t) + write("IS_VAL")
    for b in range(H):
        p["wte"][H1 + b] = write("HOP", b)
    p["wte"][UNSEEN] = write("IS_VAL")
    for t in range(T):
        p["wpe"][t] = write("POS", t) + ONE * write("ONE")

    def head(l, n, matches, reads):
        """Head n of block l: matches [(query direction, key direction, score)], each one column of the head's
        queries and keys; reads [(read direction, write direction)], each one column of its values."""
        assert len(matches) <= hs and len(reads) <= hs
        pre, at = f"blocks.{l}.attn.", n * hs
        for i, (qd, kd, score) in enumerate(matches):
            p[pre + "wq"][:, at + i] += score * scale * qd
            p[pre + "wk"][:, at + i] += kd
        for i, (rd, wd) in enumerate(reads):
            p[pre + "wv"][:, at + i] += rd
            p[pre + "wo"][at + i] += wd / c

    # block 0: every position reads the token before it (by position), copying its S into B and its HOP into HH
    head(0, 0, [(read("POS", t), read("POS", t - 1), SHARP) for t in range(1, T)],
         [(read("S", a), write("B", a)) for a in range(V)] + [(read("HOP", b), write("HH", b)) for b in range(H)])
    # ... and its MLP erases B where the position is not a pair's second place (position 0 read itself, a
    # later query's Q the x before it): a neuron per symbol, on only where B holds it and IS_VAL is 0
    for a in range(V):
        p["blocks.0.mlp.w1"][:, a] = GATE * (read("B", a) - read("IS_VAL")) / c
        p["blocks.0.mlp.b1"][a] = -GATE / 2
        p["blocks.0.mlp.w2"][a] = -write("B", a) / (GATE / 2)
    sink = (read("ONE") / ONE, read("POS", 0), SHARP / 2)
    for l in range(1, L):
        for n, (qf, kf, reads, exclude_self) in enumerate(plan_heads[l]):
            matches = [(read(qf, a), read(kf, a), SHARP) for a in range(V)] + [sink]
            if exclude_self:                 # a fixed point f(a) = a would hold its map twice (forward and backward)
                matches += [(read("POS", t), read("POS", t), -2 * SHARP) for t in range(T)]
            head(l, n, matches, [(read(rf, a), write(wf, a)) for rf, wf in reads for a in range(V)])
    # the last block's MLP: ANS += R_j where HH says j = h (a neuron per (j, symbol): on only when both are 1)
    last = f"blocks.{L - 1}.mlp."
    held = hops_at(L, H).get(L - 1, []) if L >= 2 else []
    for j in held:
        for a in range(V):
            n = (j - 1) * V + a
            p[last + "w1"][:, n] = GATE * (read(f"R{j}", a) + read("HH", j - 1)) / c
            p[last + "b1"][n] = -1.5 * GATE
            p[last + "w2"][n] = write("ANS", a) / (GATE / 2)
    for a in range(V):
        p["unembed.w"][:, a] = CONFIDENT * read("ANS", a) / c
    return cfg, {k: v.astype(dtype) for k, v in p.items()}


def predict(s, tokens, n_layers=None, dtype="float32"):
    """The construction's distributions (n, T, V) on a batch's tokens."""
    cfg, prm = params(s, n_layers, dtype)
    logits, _ = ba.forward(prm, tokens, cfg)
    z = logits - logits.max(-1, keepdims=True)
    q = np.exp(z)
    return q / q.sum(-1, keepdims=True)
