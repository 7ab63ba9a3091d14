"""bayesattn: a decoder-only transformer with every backward pass derived by hand, in NumPy.

Notation (fixed for the whole module)
    B  batch size            T  sequence length        C  model width (d_model)
    NH number of heads       hs head size = C // NH    M  MLP width (d_mlp)
    V  input vocabulary      K  output classes         L  number of layers

Gradient convention: every `*_backward` returns FRESH arrays (nothing is accumulated into
buffers). `backward` returns a dict with the same keys as the parameters.

The model, in the order of its forward pass:
    x  = wte[tokens] + wpe                                  embedding          (layers.py)
    L blocks of
      x = x + W_o attention(LN1(x) W_q, LN1(x) W_k, LN1(x) W_v)   causal attention (below)
      x = x + W_2 gelu(LN2(x) W_1)                               MLP        (layers.py)
    logits = LNf(x) W_u                                     unembedding        (layers.py)
The shared layers live in layers.py; the attention is here. Each op is NumPy as written; an op
marked @twin runs its Numba twin in kernels.py instead once kernels.enable() is called (train.py
does, unless --kernels numpy).

The attention backward is the papers' E-step and M-step (shared/PAPERS.md, "The gradient equations"):
    b_ij    = u_i . v_j                    (u = dL/d head output)
    b_bar_i = sum_j alpha_ij b_ij
    ds_ij   = alpha_ij (b_ij - b_bar_i)     E-step: advantage routing law      advantage_routing()
    dv_j    = sum_i alpha_ij u_i            M-step: responsibility-weighted    value_update()
    dq_i    = sum_j ds_ij k_j / sqrt(hs),   dk_j = sum_i ds_ij q_i / sqrt(hs)
"""

import math
from dataclasses import dataclass, asdict, replace

from layers import (bits, cross_entropy, embedding_backward, embedding_forward, gelu_backward,  # noqa: F401
                    gelu_forward, layernorm_backward, layernorm_forward, linear_backward, linear_forward,
                    softmax, twin)

import numpy as np  # noqa: E402  (after layers: it pins OpenBLAS to one thread before NumPy loads)

INITS = ("gpt2", "fan-in")  # Config.init: how init_params draws the weights


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
    sawtooth's lookup needs to leave its plateau (RESULTS.md, sawtooth)."""
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


def count_params(params):
    return int(sum(v.size for v in params.values()))


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
    """q, k, v (B, NH, T, hs) -> o (B, NH, T, hs), alpha (B, NH, T, T) (zero above the diagonal)."""
    T, hs = q.shape[-2], q.shape[-1]
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(hs)                # (B, NH, T, T)  s_ij = q_i . k_j / sqrt(hs)
    causal = np.tril(np.ones((T, T), dtype=bool))
    alpha = softmax.numpy(np.where(causal, s, -np.inf))            # (B, NH, T, T)  the responsibilities
    return alpha @ v, alpha                                        # o_i = sum_j alpha_ij v_j


def advantage_routing(u, alpha, v):
    """E-step. u (..., T, hs), alpha (..., T, T), v (..., T, hs) -> ds = dL/ds (..., T, T).
    Each row of ds sums to zero: attention is redistributed, not created."""
    b = u @ np.swapaxes(v, -1, -2)                                 # (..., T, T)  b_ij = u_i . v_j
    b_bar = (alpha * b).sum(axis=-1, keepdims=True)                # (..., T, 1)  b_bar_i = sum_j alpha_ij b_ij
    return alpha * (b - b_bar)                                     # ds_ij = alpha_ij (b_ij - b_bar_i)


def value_update(u, alpha):
    """M-step. dv_j = sum_i alpha_ij u_i: each value moves toward the errors of the queries that use it."""
    return np.swapaxes(alpha, -1, -2) @ u                          # (..., T, hs)


@twin
def attention_backward(u, alpha, q, k, v):
    """u = dL/do (B, NH, T, hs) -> dq, dk, dv. Forward was o = alpha v with alpha = softmax(q k^T / sqrt(hs))."""
    hs = q.shape[-1]
    ds = advantage_routing(u, alpha, v)                            # E-step: advantage routing law
    dv = value_update(u, alpha)                                    # M-step: responsibility-weighted value update
    dq = ds @ k / math.sqrt(hs)                                    # dq_i = sum_j ds_ij k_j / sqrt(hs)
    dk = np.swapaxes(ds, -1, -2) @ q / math.sqrt(hs)               # dk_j = sum_i ds_ij q_i / sqrt(hs)
    return dq, dk, dv


# ----------------------------------------------------------------------------
# the model

def forward(params, tokens, cfg, head_mask=None):
    """tokens (B, T) int -> logits (B, T, K), cache.

    head_mask: optional (L, NH) array multiplying each head's output (1 keeps, 0 ablates).
    cache["layers"][l] holds for layer l: "x_in" (B,T,C) residual stream entering the block,
    "q","k","v" (B,NH,T,hs), "alpha" (B,NH,T,T), "head_out" (B,NH,T,hs), "attn_out" (B,T,C)
    (after the output projection), "x_mid" (B,T,C), "x_out" (B,T,C). cache["resid"] lists the
    residual stream before each block and after the last; cache["xf"] is the final LayerNorm's output.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must have shape (B, T), got {tokens.shape}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= cfg.vocab_size):
        raise ValueError(f"token ids must lie in 0..{cfg.vocab_size - 1}, got {tokens.min()}..{tokens.max()}")
    B, T = tokens.shape
    x, _ = embedding_forward(params["wte"], position_table(params, cfg, T), tokens)  # (B, T, C)
    logits, cache = forward_embedded(params, x.astype(cfg.dtype), cfg, head_mask)
    cache["tokens"] = tokens
    return logits, cache


def forward_embedded(params, x, cfg, head_mask=None):
    """The blocks, the final LayerNorm and the unembedding on an embedded input x (B, T, C) -> logits, cache
    (forward's cache without "tokens"). A model with another input layer (dynamics.py's projection of
    continuous inputs) calls this directly."""
    NH, T = cfg.n_heads, x.shape[1]
    cache = {"T": T, "layers": [], "resid": [x], "head_mask": head_mask}
    for l in range(cfg.n_layers):
        pre = f"blocks.{l}."
        lc = {"x_in": x}
        # attention sub-block: x = x + W_o . attention(LN(x))
        h, lc["ln1"] = layernorm_forward(x, params[pre + "ln1.g"], params[pre + "ln1.b"])
        lc["h1"] = h
        q = split_heads(linear_forward(h, params[pre + "attn.wq"], params[pre + "attn.bq"])[0], NH)  # (B, NH, T, hs)
        k = split_heads(linear_forward(h, params[pre + "attn.wk"], params[pre + "attn.bk"])[0], NH)
        v = split_heads(linear_forward(h, params[pre + "attn.wv"], params[pre + "attn.bv"])[0], NH)
        o, alpha = attention_forward(q, k, v)                                      # (B, NH, T, hs), (B, NH, T, T)
        if head_mask is not None:
            o = o * np.asarray(head_mask[l], dtype=o.dtype)[None, :, None, None]
        y = merge_heads(o)                                                         # (B, T, C)
        attn_out, _ = linear_forward(y, params[pre + "attn.wo"], params[pre + "attn.bo"])
        x = x + attn_out
        lc.update(q=q, k=k, v=v, alpha=alpha, head_out=o, y=y, attn_out=attn_out, x_mid=x)
        # MLP sub-block: x = x + W_2 gelu(W_1 LN(x))
        h2, lc["ln2"] = layernorm_forward(x, params[pre + "ln2.g"], params[pre + "ln2.b"])
        pre_act, _ = linear_forward(h2, params[pre + "mlp.w1"], params[pre + "mlp.b1"])  # (B, T, M)
        act, _ = gelu_forward(pre_act)
        x = x + linear_forward(act, params[pre + "mlp.w2"], params[pre + "mlp.b2"])[0]
        lc.update(h2=h2, pre_act=pre_act, act=act, x_out=x)
        cache["layers"].append(lc)
        cache["resid"].append(x)
    xf, cache["lnf"] = layernorm_forward(x, params["lnf.g"], params["lnf.b"])
    cache["xf"] = xf
    logits, _ = linear_forward(xf, params["unembed.w"], params["unembed.b"])        # (B, T, K)
    return logits, cache


def backward(dlogits, cache, params, cfg):
    """dlogits (B, T, K) -> grads, a dict with the same keys as params. Reverses forward line by line."""
    g, dx = backward_embedded(dlogits, cache, params, cfg)
    g["wte"], dwpe = embedding_backward(dx, cache["tokens"], cfg.vocab_size)     # (V, C), (T, C)
    if cfg.pos == "learned":                      # clamped positions share a row: their gradients add up
        g["wpe"] = np.zeros_like(params["wpe"])
        np.add.at(g["wpe"], position_rows(cfg, cache["T"]), dwpe)
    return g


def backward_embedded(dlogits, cache, params, cfg):
    """Reverses forward_embedded: -> grads of the blocks, lnf and unembedding, and dx (B, T, C) for the input."""
    g = {}
    NH = cfg.n_heads
    # forward: logits = xf @ W_u + b_u
    dx, g["unembed.w"], g["unembed.b"] = linear_backward(dlogits, cache["xf"], params["unembed.w"])
    dx, g["lnf.g"], g["lnf.b"] = layernorm_backward(dx, cache["lnf"])
    for l in reversed(range(cfg.n_layers)):
        pre, lc = f"blocks.{l}.", cache["layers"][l]
        # forward: x_out = x_mid + act @ W_2 + b_2; the residual passes dx straight through
        dact, g[pre + "mlp.w2"], g[pre + "mlp.b2"] = linear_backward(dx, lc["act"], params[pre + "mlp.w2"])
        dpre = gelu_backward(dact, lc["pre_act"])
        dh2, g[pre + "mlp.w1"], g[pre + "mlp.b1"] = linear_backward(dpre, lc["h2"], params[pre + "mlp.w1"])
        dh, g[pre + "ln2.g"], g[pre + "ln2.b"] = layernorm_backward(dh2, lc["ln2"])
        dx = dx + dh                                                   # x_mid feeds both the residual and LN2
        # forward: x_mid = x_in + y @ W_o + b_o
        dy, g[pre + "attn.wo"], g[pre + "attn.bo"] = linear_backward(dx, lc["y"], params[pre + "attn.wo"])
        u = split_heads(dy, NH)                                        # (B, NH, T, hs)  u = dL/d head output
        if cache["head_mask"] is not None:
            u = u * np.asarray(cache["head_mask"][l], dtype=u.dtype)[None, :, None, None]
        dq, dk, dv = attention_backward(u, lc["alpha"], lc["q"], lc["k"], lc["v"])   # E-step, M-step
        dh = np.zeros_like(lc["h1"])
        for name, d in (("q", dq), ("k", dk), ("v", dv)):
            # forward: q = h1 @ W_q + b_q (and k, v): h1 feeds all three, so their dh add up
            dhn, g[pre + f"attn.w{name}"], g[pre + f"attn.b{name}"] = linear_backward(
                merge_heads(d), lc["h1"], params[pre + f"attn.w{name}"])
            dh += dhn
        dh, g[pre + "ln1.g"], g[pre + "ln1.b"] = layernorm_backward(dh, lc["ln1"])
        dx = dx + dh                                                   # x_in feeds both the residual and LN1
    return g, dx


def loss_and_grads(params, tokens, targets, mask, cfg):
    """Mean cross-entropy (nats) over supervised positions and its gradient for every parameter."""
    logits, cache = forward(params, tokens, cfg)
    loss, dlogits = cross_entropy(logits, targets, mask)
    return loss, backward(dlogits, cache, params, cfg)


def predict_proba(params, tokens, cfg, batch=256):
    """Model predictive distribution (B, T, K) in float64, evaluated in chunks."""
    out = []
    for i in range(0, len(tokens), batch):
        logits, _ = forward(params, tokens[i:i + batch], cfg)
        out.append(softmax.numpy(logits.astype(np.float64)))
    return np.concatenate(out)
