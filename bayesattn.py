"""bayesattn: a decoder-only transformer with every backward pass derived by hand, in NumPy.

Notation (fixed for the whole module)
    B  batch size            T  sequence length        C  model width (d_model)
    NH number of heads       hs head size = C // NH    M  MLP width (d_mlp)
    V  input vocabulary      K  output classes         L  number of layers

Gradient convention (layers.py's, for every op): a forward returns (out, cache), its backward takes
(dout, cache) and returns FRESH arrays. `backward` returns a dict with the same keys as the parameters.

This module is one model family of models.FAMILIES: `Config`, `init_params`, `forward`, `backward`
(and `param_shapes`, `step_memory_bytes`, `PROBES`, which the shared code uses where a family has them).

The model, in the order of its forward pass:
    x  = wte[tokens] + wpe                                  embedding          (layers.py)
    L blocks of
      x = x + W_o attention(LN1(x) W_q, LN1(x) W_k, LN1(x) W_v)   causal attention (below)
      x = x + W_2 gelu(LN2(x) W_1)                               MLP        (layers.py)
    logits = LNf(x) W_u                                     unembedding        (layers.py)
The shared layers live in layers.py; the attention is here. Each op is NumPy as written; an op
marked @twin runs its Numba twin in kernels.py instead inside `with kernels.enabled():` (train.py
does, unless --kernels numpy).

The attention backward is the papers' E-step and M-step (Paper II's gradient equations: for one head,
query i and key/value j, with u_i = dL/do_i the error signal arriving at the head's output):
    b_ij    = u_i . v_j                    (u = dL/d head output)
    b_bar_i = sum_j alpha_ij b_ij
    ds_ij   = alpha_ij (b_ij - b_bar_i)     E-step: advantage routing law      advantage_routing()
    dv_j    = sum_i alpha_ij u_i            M-step: responsibility-weighted    value_update()
    dq_i    = sum_j ds_ij k_j / sqrt(hs),   dk_j = sum_i ds_ij q_i / sqrt(hs)
"""

import math
from dataclasses import dataclass, asdict, replace

import layers as ly
from layers import twin

import numpy as np  # noqa: E402  (after layers: it pins OpenBLAS to one thread before NumPy loads)

INITS = ("gpt2", "fan-in")  # Config.init: how init_params draws the weights
PROBES = True               # geometry/run.py's probes read this family's attention (cache["layers"][l]["alpha"], ...)
# its sizes in each task's presets (the task's own: batch, steps, learning rate). Heads of 32, at least the 20
# hypotheses, so that the key frame could be orthogonal; the sawtooth: fan-in init (without it the lookup
# does not form within the budget, tunnels/README.md) and 2 layers for time; the HMM: heads of 16
PRESETS = {
    "bijection": {"quick": dict(width=32, layers=2, heads=2), "default": dict(width=64, layers=3, heads=2),
                  "paper": dict(width=64, layers=3, heads=2)},
    "sawtooth": {"quick": dict(width=32, layers=2, heads=2, init="fan-in"),
                 **{p: dict(width=64, layers=2, heads=2, init="fan-in") for p in ("first", "default", "paper")}},
    "hmm": {"quick": dict(width=32, layers=2, heads=2), "default": dict(width=64, layers=4, heads=4),
            "paper": dict(width=96, layers=6, heads=6)},
    "transport": {"quick": dict(width=32, layers=2, heads=2), "default": dict(width=64, layers=4, heads=4),
                  "paper": dict(width=96, layers=6, heads=6)},     # the HMM's sizes
    # recall: a lookup (find the stored key, read the value two tokens on) is a two-layer circuit, as the
    # sawtooth's; its initialisation too
    "recall": {"quick": dict(width=32, layers=2, heads=2, init="fan-in"),
               **{p: dict(width=64, layers=2, heads=2, init="fan-in") for p in ("default", "paper")}},
    # hops: a chain of lookups, one layer per lookup and one to pair each value with its key (primitives/depth.py varies
    # the layers); the lookup's initialisation: with the default one the transformer had not begun the lookup
    # in 2,500 steps of one hop, with fan-in it had by step 1,000
    "hops": {"quick": dict(width=32, layers=2, heads=2, init="fan-in"),
             **{p: dict(width=64, layers=4, heads=2, init="fan-in") for p in ("default", "paper")}},
}


# ----------------------------------------------------------------------------
# configuration and initialisation

@dataclass
class Config:
    vocab_size: int            # V, input tokens
    n_classes: int             # K, output classes (may differ from V)
    max_len: int = 64          # longest sequence the learned positions cover
    d_model: int = 64          # C
    n_layers: int = 4          # L
    n_heads: int = 4           # NH
    d_mlp: int = 0             # M; 0 means 4 * d_model
    pos: str = "learned"       # "learned" or "sinusoidal"
    dtype: str = "float32"     # "float32" for training, "float64" for checks
    pos_limit: int = 0         # learned positions: t >= pos_limit reuses row pos_limit - 1 (0: no limit)
    init: str = "gpt2"         # "gpt2": N(0, 0.02); "fan-in": N(0, 1/fan_in) matrices, N(0, 1) embeddings

    def __post_init__(self):
        for name in ("vocab_size", "n_classes", "max_len", "d_model", "n_layers", "n_heads"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}={value!r}: must be a positive integer")
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"n_heads={self.n_heads} does not divide d_model={self.d_model}: "
                             f"allowed are divisors of {self.d_model}")
        if self.d_mlp == 0:
            self.d_mlp = 4 * self.d_model
        if self.d_mlp < 1:
            raise ValueError(f"d_mlp={self.d_mlp!r}: must be a positive integer (or 0 for 4*d_model)")
        if self.pos not in ("learned", "sinusoidal"):
            raise ValueError(f"pos={self.pos!r}: allowed are 'learned', 'sinusoidal'")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype={self.dtype!r}: allowed are 'float32', 'float64'")
        if self.init not in INITS:
            raise ValueError(f"init={self.init!r}: allowed are {', '.join(map(repr, INITS))}")
        if not isinstance(self.pos_limit, (int, np.integer)) or not 0 <= self.pos_limit <= self.max_len:
            raise ValueError(f"pos_limit={self.pos_limit!r}: allowed are 0 (no limit) to max_len={self.max_len}")

    def to_dict(self):
        return asdict(self)


def init_params(cfg, seed=0):
    """Weights at random, biases 0, LayerNorm gains 1. cfg.init "gpt2": N(0, 0.02), the residual projections
    (wo, w2) scaled by 1/sqrt(2L). "fan-in": every matrix N(0, 1/fan_in), so each output starts at the
    scale of its inputs, and learned embeddings N(0, 1): attention starts far from uniform, which the
    sawtooth's lookup needs to leave its plateau (tunnels/README.md, sawtooth)."""
    rng = np.random.default_rng(seed)
    C, M, L = cfg.d_model, cfg.d_mlp, cfg.n_layers
    std, std_res = 0.02, 0.02 / math.sqrt(2 * L)
    if cfg.init == "fan-in":
        p = init_params(replace(cfg, init="gpt2"), seed)             # the same shapes, then every draw redone
        return {k: (rng.normal(0, 1.0 if k in ("wte", "wpe") else 1 / math.sqrt(v.shape[0]), v.shape)
                    if v.ndim == 2 else v).astype(cfg.dtype) for k, v in p.items()}
    # With fixed sinusoidal positions (entries of RMS 1/sqrt 2) the token embeddings start at the
    # same scale; at 0.02 the position would drown the token identity after the first LayerNorm.
    p = {"wte": rng.normal(0, std if cfg.pos == "learned" else math.sqrt(0.5), (cfg.vocab_size, C))}
    if cfg.pos == "learned":
        p["wpe"] = rng.normal(0, std, (cfg.max_len, C))
    for l in range(L):
        pre = f"blocks.{l}."
        p[pre + "ln1.g"], p[pre + "ln1.b"] = np.ones(C), np.zeros(C)
        for name in ("q", "k", "v"):
            p[pre + f"attn.w{name}"] = rng.normal(0, std, (C, C))
            p[pre + f"attn.b{name}"] = np.zeros(C)
        p[pre + "attn.wo"], p[pre + "attn.bo"] = rng.normal(0, std_res, (C, C)), np.zeros(C)
        p[pre + "ln2.g"], p[pre + "ln2.b"] = np.ones(C), np.zeros(C)
        p[pre + "mlp.w1"], p[pre + "mlp.b1"] = rng.normal(0, std, (C, M)), np.zeros(M)
        p[pre + "mlp.w2"], p[pre + "mlp.b2"] = rng.normal(0, std_res, (M, C)), np.zeros(C)
    p["lnf.g"], p["lnf.b"] = np.ones(C), np.zeros(C)
    p["unembed.w"], p["unembed.b"] = rng.normal(0, std, (C, cfg.n_classes)), np.zeros(cfg.n_classes)
    return {k: v.astype(cfg.dtype) for k, v in p.items()}


def grow(params, cfg_from, cfg, seed=0):
    """A deeper model that computes exactly what params (cfg_from) computes: its blocks, embeddings, final
    LayerNorm and unembedding copied, the blocks past them drawn as init_params draws them but with their
    output maps (attn.wo, attn.bo, mlp.w2, mlp.b2) at zero, so each new block adds nothing to the residual
    stream until training moves them (the depth experiment's growth control). cfg: cfg_from with more layers."""
    sizes = lambda c: {k: v for k, v in asdict(c).items() if k not in ("n_layers", "dtype", "pos_limit", "init")}
    if sizes(cfg) != sizes(cfg_from) or cfg.n_layers <= cfg_from.n_layers:
        raise ValueError(f"a model grows by layers only: {cfg_from.n_layers} layers of width {cfg_from.d_model} "
                         f"cannot become {cfg.n_layers} layers of width {cfg.d_model}")
    out = init_params(cfg, seed)
    out.update({k: v.astype(cfg.dtype) for k, v in params.items()})   # the trained blocks 0..L0-1 and the rest
    for l in range(cfg_from.n_layers, cfg.n_layers):
        for name in ("attn.wo", "attn.bo", "mlp.w2", "mlp.b2"):
            out[f"blocks.{l}.{name}"] = np.zeros_like(out[f"blocks.{l}.{name}"])
    return out


def param_shapes(cfg):
    """name -> shape of every parameter init_params makes for cfg (checked when a checkpoint is loaded)."""
    C, M, K = cfg.d_model, cfg.d_mlp, cfg.n_classes
    shapes = {"wte": (cfg.vocab_size, C)}
    if cfg.pos == "learned":
        shapes["wpe"] = (cfg.max_len, C)
    for l in range(cfg.n_layers):
        pre = f"blocks.{l}."
        shapes.update({pre + "ln1.g": (C,), pre + "ln1.b": (C,), pre + "ln2.g": (C,), pre + "ln2.b": (C,),
                       pre + "mlp.w1": (C, M), pre + "mlp.b1": (M,), pre + "mlp.w2": (M, C), pre + "mlp.b2": (C,)})
        for name in ("q", "k", "v", "o"):
            shapes[pre + f"attn.w{name}"], shapes[pre + f"attn.b{name}"] = (C, C), (C,)
    shapes.update({"lnf.g": (C,), "lnf.b": (C,), "unembed.w": (C, K), "unembed.b": (K,)})
    return shapes


def step_memory_bytes(cfg, B, T):
    """About how many bytes one training step at batch B and length T holds at its peak: per layer the
    attention weights (B NH T^2) twice (alpha and the scores), about 14 activations of (B T C) and 4 of
    (B T M) in the forward cache and the backward's temporaries, and the parameters four times (weights,
    gradients, AdamW's m and v). An estimate to refuse what cannot fit, not a measurement."""
    C, L, NH, M = cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_mlp
    itemsize = 8 if cfg.dtype == "float64" else 4
    per_layer = 2 * B * NH * T * T + 14 * B * T * C + 4 * B * T * M
    params = cfg.vocab_size * C + cfg.max_len * C + L * (4 * C * C + 2 * C * M + 13 * C) + C * cfg.n_classes
    return itemsize * (L * per_layer + 4 * params + 3 * B * T * cfg.n_classes)


def attention_flops(cfg, B, T):
    """Floating-point operations of attention's two causal products (q k^T, alpha v) in one training step,
    forward and backward (the backward twice the forward)."""
    pairs = B * cfg.n_heads * T * (T + 1) // 2             # (i, j) with j <= i, per batch and head
    return 3 * cfg.n_layers * 2 * pairs * (cfg.d_model // cfg.n_heads) * 2


def state_floats(cfg, T):
    """Floats carried from one position to the next on a sequence of T tokens: every layer's keys and values of
    every position so far (a cache that grows with the length; models.state_floats)."""
    return 2 * cfg.n_layers * cfg.d_model * T


def step_flops(cfg, B, T):
    """Floating-point operations of one training step: the layers' matrix products and attention's, forward
    and backward (the backward twice the forward: dx and dw)."""
    N, C, M, K = B * T, cfg.d_model, cfg.d_mlp, cfg.n_classes
    layer = 2 * N * C * C * 4 + 2 * N * C * M * 2
    return 3 * (cfg.n_layers * layer + 2 * N * C * K) + attention_flops(cfg, B, T)


# ----------------------------------------------------------------------------
# positions: a learned table (or fixed sinusoids) added to the token embeddings

def sinusoidal_positions(T, C, dtype="float64"):
    """Fixed sinusoidal table (T, C): sin on even channels, cos on odd (Vaswani et al.)."""
    pos = np.arange(T)[:, None]                                  # (T, 1)
    freq = np.exp(-math.log(10000.0) * (np.arange(0, C, 2) / C))  # (ceil(C/2),)
    table = np.zeros((T, C))
    table[:, 0::2] = np.sin(pos * freq)
    table[:, 1::2] = np.cos(pos * freq[: C // 2])
    return table.astype(dtype)


def position_rows(cfg, T):
    """Row of the learned position table used at each t < T: t itself, or with a pos_limit the last
    trained row for every t past it (a time-homogeneous task then sees "one more step", not an
    untrained row)."""
    t = np.arange(T)
    return np.minimum(t, cfg.pos_limit - 1) if cfg.pos_limit else t


def position_table(params, cfg, T):
    """The positional term (T, C) the forward adds to the token embeddings."""
    if T > cfg.max_len and cfg.pos == "learned":
        raise ValueError(f"sequence length {T} exceeds max_len={cfg.max_len} of learned positions")
    if cfg.pos == "learned":
        return params["wpe"][position_rows(cfg, T)]
    return sinusoidal_positions(T, cfg.d_model, cfg.dtype)


# ----------------------------------------------------------------------------
# causal multi-head attention, per (batch, head):
#   s_ij = q_i . k_j / sqrt(hs)  (j <= i),  alpha_ij = softmax_j s_ij,  o_i = sum_j alpha_ij v_j

def split_heads(x, NH):
    """(B, T, C) -> (B, NH, T, hs), contiguous."""
    B, T, C = x.shape
    return np.ascontiguousarray(x.reshape(B, T, NH, C // NH).transpose(0, 2, 1, 3))


def merge_heads(x):
    """(B, NH, T, hs) -> (B, T, C)."""
    B, NH, T, hs = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, NH * hs)


@twin
def attention_forward(q, k, v):
    """q, k (B, NH, T, hs), v (B, NH, T, hv) -> o (B, NH, T, hv), alpha (B, NH, T, T) (zero above the
    diagonal). The scale is 1 / sqrt(hs), the keys' size; the values may be wider (dynamics/onehead.py's are)."""
    T, hs = q.shape[-2], q.shape[-1]
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(hs)                # (B, NH, T, T)  s_ij = q_i . k_j / sqrt(hs)
    causal = np.tril(np.ones((T, T), dtype=bool))
    alpha = ly.softmax(np.where(causal, s, -np.inf))         # (B, NH, T, T)  the responsibilities
    return alpha @ v, alpha                                        # o_i = sum_j alpha_ij v_j


def advantage_routing(u, alpha, v):
    """E-step. u (..., T, hv), alpha (..., T, T), v (..., T, hv) -> ds = dL/ds (..., T, T).
    Each row of ds sums to zero: attention is redistributed, not created."""
    b = u @ np.swapaxes(v, -1, -2)                                 # (..., T, T)  b_ij = u_i . v_j
    b_bar = (alpha * b).sum(axis=-1, keepdims=True)                # (..., T, 1)  b_bar_i = sum_j alpha_ij b_ij
    return alpha * (b - b_bar)                                     # ds_ij = alpha_ij (b_ij - b_bar_i)


def value_update(u, alpha):
    """M-step. dv_j = sum_i alpha_ij u_i, the error signals of the queries that read v_j weighted by their
    attention to it; a gradient step moves v_j along -dv_j, against those errors."""
    return np.swapaxes(alpha, -1, -2) @ u                          # (..., T, hv)


@twin
def attention_backward(u, alpha, q, k, v):
    """u = dL/do (B, NH, T, hv) -> dq, dk, dv. Forward was o = alpha v with alpha = softmax(q k^T / sqrt(hs))."""
    hs = q.shape[-1]
    ds = advantage_routing(u, alpha, v)                            # E-step: advantage routing law
    dv = value_update(u, alpha)                                    # M-step: responsibility-weighted value update
    dq = ds @ k / math.sqrt(hs)                                    # dq_i = sum_j ds_ij k_j / sqrt(hs)
    dk = np.swapaxes(ds, -1, -2) @ q / math.sqrt(hs)               # dk_j = sum_i ds_ij q_i / sqrt(hs)
    return dq, dk, dv


# ----------------------------------------------------------------------------
# the model

def forward(params, tokens, cfg, head_mask=None, patch=None):
    """tokens (B, T) int -> logits (B, T, K), cache.

    head_mask: optional (L, NH) array multiplying each head's output (1 keeps, 0 ablates).
    patch: optional function (l, o) -> o' replacing layer l's head outputs o (B, NH, T, hs) before W_o: the
    probes' ablations by a mean or by another sequence's output (forward only: backward ignores it).
    cache["layers"][l] holds for layer l: "x_in" (B,T,C) residual stream entering the block,
    "q","k","v" (B,NH,T,hs), "alpha" (B,NH,T,T), "head_out" (B,NH,T,hs), "attn_out" (B,T,C)
    (after the output projection), "x_mid" (B,T,C), "x_out" (B,T,C), and the caches of its ops.
    cache["resid"] lists the residual stream before each block and after the last; cache["xf"] is the
    final LayerNorm's output.
    """
    B, T = tokens.shape
    x, embedding = ly.embedding_forward(params["wte"], position_table(params, cfg, T), tokens)  # (B, T, C)
    logits, cache = forward_embedded(params, x.astype(cfg.dtype), cfg, head_mask, patch)
    cache["embedding"] = embedding
    return logits, cache


def forward_embedded(params, x, cfg, head_mask=None, patch=None):
    """The blocks, the final LayerNorm and the unembedding on an embedded input x (B, T, C) -> logits, cache
    (forward's cache without "embedding"). A model with another input layer (dynamics/experiments.py's projection of
    continuous inputs) calls this directly."""
    NH, T = cfg.n_heads, x.shape[1]
    cache = {"T": T, "layers": [], "resid": [x], "head_mask": head_mask}
    for l in range(cfg.n_layers):
        pre = f"blocks.{l}."
        lc = {"x_in": x}
        # attention sub-block: x = x + W_o . attention(LN(x))
        h, lc["ln1"] = ly.layernorm_forward(x, params[pre + "ln1.g"], params[pre + "ln1.b"])
        lc["h1"] = h
        q, lc["wq"] = ly.linear_forward(h, params[pre + "attn.wq"], params[pre + "attn.bq"])   # (B, T, C)
        k, lc["wk"] = ly.linear_forward(h, params[pre + "attn.wk"], params[pre + "attn.bk"])
        v, lc["wv"] = ly.linear_forward(h, params[pre + "attn.wv"], params[pre + "attn.bv"])
        q, k, v = split_heads(q, NH), split_heads(k, NH), split_heads(v, NH)       # (B, NH, T, hs)
        o, alpha = attention_forward(q, k, v)                                      # (B, NH, T, hs), (B, NH, T, T)
        if head_mask is not None:
            o = o * np.asarray(head_mask[l], dtype=o.dtype)[None, :, None, None]
        if patch is not None:
            o = patch(l, o)
        y = merge_heads(o)                                                         # (B, T, C)
        attn_out, lc["wo"] = ly.linear_forward(y, params[pre + "attn.wo"], params[pre + "attn.bo"])
        x = x + attn_out
        lc.update(q=q, k=k, v=v, alpha=alpha, head_out=o, y=y, attn_out=attn_out, x_mid=x)
        # MLP sub-block: x = x + W_2 gelu(W_1 LN(x))
        h2, lc["ln2"] = ly.layernorm_forward(x, params[pre + "ln2.g"], params[pre + "ln2.b"])
        pre_act, lc["w1"] = ly.linear_forward(h2, params[pre + "mlp.w1"], params[pre + "mlp.b1"])  # (B, T, M)
        act, lc["gelu"] = ly.gelu_forward(pre_act)
        mlp_out, lc["w2"] = ly.linear_forward(act, params[pre + "mlp.w2"], params[pre + "mlp.b2"])
        x = x + mlp_out
        lc.update(h2=h2, pre_act=pre_act, act=act, x_out=x)
        cache["layers"].append(lc)
        cache["resid"].append(x)
    xf, cache["lnf"] = ly.layernorm_forward(x, params["lnf.g"], params["lnf.b"])
    cache["xf"] = xf
    logits, cache["unembed"] = ly.linear_forward(xf, params["unembed.w"], params["unembed.b"])   # (B, T, K)
    return logits, cache


def backward(dlogits, cache, params, cfg):
    """dlogits (B, T, K) -> grads, a dict with the same keys as params. Reverses forward line by line."""
    g, dx = backward_embedded(dlogits, cache, params, cfg)
    g["wte"], dwpe = ly.embedding_backward(dx, cache["embedding"])                # (V, C), (T, C)
    if cfg.pos == "learned":                      # clamped positions share a row: their gradients add up
        g["wpe"] = np.zeros_like(params["wpe"])
        np.add.at(g["wpe"], position_rows(cfg, cache["T"]), dwpe)
    return g


def backward_embedded(dlogits, cache, params, cfg):
    """Reverses forward_embedded: -> grads of the blocks, lnf and unembedding, and dx (B, T, C) for the input."""
    g = {}
    NH = cfg.n_heads
    # forward: logits = xf @ W_u + b_u
    dx, g["unembed.w"], g["unembed.b"] = ly.linear_backward(dlogits, cache["unembed"])
    dx, g["lnf.g"], g["lnf.b"] = ly.layernorm_backward(dx, cache["lnf"])
    for l in reversed(range(cfg.n_layers)):
        pre, lc = f"blocks.{l}.", cache["layers"][l]
        # forward: x_out = x_mid + act @ W_2 + b_2; the residual passes dx straight through
        dact, g[pre + "mlp.w2"], g[pre + "mlp.b2"] = ly.linear_backward(dx, lc["w2"])
        dpre = ly.gelu_backward(dact, lc["gelu"])
        dh2, g[pre + "mlp.w1"], g[pre + "mlp.b1"] = ly.linear_backward(dpre, lc["w1"])
        dh, g[pre + "ln2.g"], g[pre + "ln2.b"] = ly.layernorm_backward(dh2, lc["ln2"])
        dx = dx + dh                                                   # x_mid feeds both the residual and LN2
        # forward: x_mid = x_in + y @ W_o + b_o
        dy, g[pre + "attn.wo"], g[pre + "attn.bo"] = ly.linear_backward(dx, lc["wo"])
        u = split_heads(dy, NH)                                        # (B, NH, T, hs)  u = dL/d head output
        if cache["head_mask"] is not None:
            u = u * np.asarray(cache["head_mask"][l], dtype=u.dtype)[None, :, None, None]
        dq, dk, dv = attention_backward(u, lc["alpha"], lc["q"], lc["k"], lc["v"])   # E-step, M-step
        dh = np.zeros_like(lc["h1"])
        for name, d in (("q", dq), ("k", dk), ("v", dv)):
            # forward: q = h1 @ W_q + b_q (and k, v): h1 feeds all three, so their dh add up
            dhn, g[pre + f"attn.w{name}"], g[pre + f"attn.b{name}"] = ly.linear_backward(merge_heads(d), lc[f"w{name}"])
            dh += dhn
        dh, g[pre + "ln1.g"], g[pre + "ln1.b"] = ly.layernorm_backward(dh, lc["ln1"])
        dx = dx + dh                                                   # x_in feeds both the residual and LN1
    return g, dx
