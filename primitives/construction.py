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

The construction here is the simpler, sequential one, an upper bound: one hop a layer at x, so h hops in
h + 1 layers (`sequential_layers`); it agrees with the prediction for one hop (2 layers) and takes one layer more
for two and three. The doubling construction of the predicted depth is not built yet.

The construction (`params(s)`) is bayesattn's own transformer (pre-LN blocks, one head, GELU MLP), every
weight set by hand. Every feature is a pair of coordinates (+a, -a), so each vector's mean is 0 and
LayerNorm only rescales it; a large constant feature (ONE, at every position) keeps that scale the same
at every position, so a feature written as 1 reads as about 1 everywhere. Features:
  S (V): the token as a key symbol (a pair's key, the query's x); U (V): a value symbol; HOP (H): the h of
  H_h; IS_VAL: a pair's second place (a value or `?`); POS (T): the position; ONE.
  B (V): the bound key (block 0: the previous token's S); HH (H): h at x (block 0: the previous token's HOP).
  R_1 .. R_H (V each): block l's lookup: the value at the pair whose bound key is R_(l-1) (R_0 = S, x
  itself); a hidden key's pair holds `?`, no value, so the chain reads nothing from there on, as the
  lookup-only predictor does (tunnels/hops.follow_shown).
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


def sequential_layers(h):
    """The layers this module's construction takes for h hops: one to bind and one a hop (an upper bound)."""
    return h + 1


def features(V, H, T):
    """{name: (first logical index, size)} of the residual stream's features, and the logical size."""
    layout, at = {}, 0
    for name, size in [("S", V), ("U", V), ("HOP", H), ("IS_VAL", 1), ("POS", T), ("ONE", 1), ("B", V),
                       ("HH", H), *[(f"R{l}", V) for l in range(1, H + 1)], ("ANS", V)]:
        layout[name], at = (at, size), at + size
    return layout, at


def params(s, n_layers=None, dtype="float64"):
    """-> (cfg, params) of the construction for hops settings s (direct format), with n_layers blocks (default
    sequential_layers(max_hops); fewer: the first hops only, the MLP's choice in the last block)."""
    if s["cot"]:
        raise ValueError("the construction answers the direct format (one answer at x)")
    V, H = s["n_symbols"], s["max_hops"]
    sz = hops.sizes(s)
    T = sz["max_len"]
    L = sequential_layers(H) if n_layers is None else n_layers
    layout, D = features(V, H, T)
    C = 2 * D                                                   # each logical feature: two coordinates
    cfg = ba.Config(vocab_size=sz["vocab"], n_classes=V, max_len=T, d_model=C, n_layers=L, n_heads=1,
                    d_mlp=max(1, H * V), dtype=dtype)
    c = math.sqrt(C / 2) / ONE               # how a feature of size 1 reads after LayerNorm (norm ~ ONE)
    scale = SHARP * math.sqrt(C) / c ** 2    # a query's weight: one unit of match scores SHARP after 1/sqrt(hs)

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

    # block 0: every position reads the token before it (by position), copying its S into B and its HOP into HH
    pre = "blocks.0.attn."
    for t in range(1, T):
        p[pre + "wq"][:, t - 1] += scale * read("POS", t)
    for t in range(T):
        p[pre + "wk"][:, t] += read("POS", t)
    for a in range(V):
        p[pre + "wv"][:, a] += read("S", a)
        p[pre + "wo"][a] += write("B", a) / c
    for b in range(H):
        p[pre + "wv"][:, V + b] += read("HOP", b)
        p[pre + "wo"][V + b] += write("HH", b) / c
    # blocks 1..: a lookup. Query R_(l-1) (S for the first), key B, and a bonus for a pair's second place
    # (a value or `?`), which sets it above a key position whose B holds its own symbol (position 0)
    for l in range(1, L):
        pre = f"blocks.{l}.attn."
        src = "S" if l == 1 else f"R{l - 1}"
        for a in range(V):
            p[pre + "wq"][:, a] += scale * read(src, a)
            p[pre + "wk"][:, a] += read("B", a)
            p[pre + "wv"][:, a] += read("U", a)
            p[pre + "wo"][a] += write(f"R{l}", a) / c
        p[pre + "wq"][:, V] += scale * read("ONE") / ONE
        p[pre + "wk"][:, V] += read("IS_VAL")
    # the last block's MLP: ANS += R_j where HH says j = h (a neuron per (j, symbol): on only when both are 1)
    last = f"blocks.{L - 1}.mlp."
    for j in range(1, min(H, L - 1) + 1):
        for a in range(V):
            n = (j - 1) * V + a
            p[last + "w1"][:, n] = GATE * (read(f"R{j}", a) + read("HH", j - 1)) / c
            p[last + "b1"][n] = -1.5 * GATE
            p[last + "w2"][n] = write("ANS", a) / (GATE / 2)
    for a in range(V):
        p["unembed.w"][:, a] = CONFIDENT * read("ANS", a) / c
    return cfg, {k: v.astype(dtype) for k, v in p.items()}


def predict(s, tokens, n_layers=None):
    """The construction's distributions (n, T, V) on a batch's tokens."""
    cfg, prm = params(s, n_layers)
    logits, _ = ba.forward(prm, tokens, cfg)
    z = logits - logits.max(-1, keepdims=True)
    q = np.exp(z)
    return q / q.sum(-1, keepdims=True)
