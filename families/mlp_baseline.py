"""mlp_baseline: the two MLP baselines of this project, built from bayesattn's hand-written pieces.

Neither has attention; they differ in what one position sees.

`token` (train.py --model mlp): the authors' MLP (Paper I). At position t it sees the token tok_t
and the position t, nothing else:
    h_t = wte[tok_t] + wpe[t]                                          (H,)   embedding
    h_t = h_t + gelu(LN(h_t) @ W_1 + b_1) @ W_2 + b_2                  (H,)   N residual blocks
    z_t = LNf(h_t) @ W_out + b_out                                     (K,)   logits
With no context it can learn only the prior p(y | tok_t, t), which in every wind tunnel here is
uniform (values, states are exchangeable), so its paper metric is the prior's gap
(tasks.prior_gap_bits): 1.107 bits (bijection), 1.849 (sawtooth), 0.42 (HMM).

`prefix` (train.py --model prefix-mlp): a stronger baseline. At every position t it sees the
whole prefix tok_0..tok_t as one-hot rows in slots 0..t of a (T_max, V) grid, zeros in slots
t+1..T_max-1, flattened:
    x_t = flatten([onehot(tok_0); ...; onehot(tok_t); 0; ...; 0])      (T_max*V,)  zero-padded prefix
    h   = x_t @ W_in + b_in                                             (H,)        input layer
then the same residual blocks and head. Whatever is a linear function of the prefix grid (which
values have been seen, say) its first layer can compute; what it lacks is weight sharing across
slots, which is what attention has.

Notation: B batch, T sequence length (T <= T_max = max_len), V input vocabulary, K classes,
H width (Config.d_model), M = 4H inner width of a block, N number of blocks (Config.n_layers).

The prefix input layer, reformulated exactly. x_t is one-hot within each filled slot, so x_t @ W_in is
a sum of rows of W_in, one per slot:
    h_t = b_in + sum_{j <= t} W_in[j*V + tok_j]          gather, then cumulative sum over t
    dG_j = sum_{t >= j} dh_t                              reverse cumulative sum
    dW_in[j*V + tok_j] += dG_j,   db_in = sum_t dh_t      scatter; rows sharing a (slot, token) add up
The dense one-hot product (`prefix_onehot`, `prefix_linear_ref`) stays as the reference and
the tests check that the two agree, forward and backward.

The prefix MLP has no position input, on purpose: the position is implicit in the padding. A
one-hot of t would add nothing the input layer cannot already express: adding P_j - P_{j-1} to all
V rows of slot j makes the cumulative sum contribute P_t at position t, for any table P (T_max, H)
(P_{-1} = 0). Also left out of both: dropout.

Gradient convention (layers.py's): a forward returns (out, cache), its backward takes (dout, cache) and
returns FRESH arrays; `backward` returns a dict with the same keys as the parameters.

This module is the family of two names in models.FAMILIES, "mlp" (inputs "token") and "prefix-mlp"
(inputs "prefix"): `Config`, `init_params`, `forward`, `backward`, and `param_shapes`.
"""

import math
from dataclasses import dataclass, asdict

import layers as ly  # first: it pins OPENBLAS_NUM_THREADS before NumPy loads

import numpy as np  # noqa: E402

MLP_RATIO = 4   # inner width M = 4H, as in the transformer's feed-forward layers
INPUTS = ("token", "prefix")  # what one position sees: its own token and position, or the whole prefix
LEGACY_FIELDS = {"width": "d_model", "n_blocks": "n_layers"}   # checkpoints written before the shared names


# ----------------------------------------------------------------------------
# configuration and parameters

# run alone (--model mlp, --model prefix-mlp), each task's presets give it the transformer's width and
# depth (as the baseline of a run, it is sized to the model's parameter count instead)
PRESETS = {task: {p: dict(width=w, layers=l) for p, (w, l) in sizes.items()} for task, sizes in {
    "bijection": {"quick": (32, 2), "default": (64, 3), "paper": (64, 3)},
    "sawtooth": {"quick": (32, 2), "first": (64, 2), "default": (64, 2), "paper": (64, 2)},
    "hmm": {"quick": (32, 2), "default": (64, 4), "paper": (96, 6)},
    "recall": {"quick": (32, 2), "default": (64, 2), "paper": (64, 2)}}.items()}


@dataclass
class Config:
    vocab_size: int            # V, input tokens
    n_classes: int             # K, output classes
    max_len: int               # T_max, positions (token inputs) or slots of the zero-padded prefix grid
    d_model: int = 64          # H, residual stream width
    n_layers: int = 2          # N, residual blocks
    dtype: str = "float32"     # "float32" for training, "float64" for checks
    inputs: str = "prefix"     # "token": the authors' MLP (tok_t and t); "prefix": the whole prefix grid

    def __post_init__(self):
        for name in ("vocab_size", "n_classes", "max_len", "d_model", "n_layers"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}={value!r}: must be a positive integer")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype={self.dtype!r}: allowed are 'float32', 'float64'")
        if self.inputs not in INPUTS:
            raise ValueError(f"inputs={self.inputs!r}: allowed are {', '.join(map(repr, INPUTS))}")

    def to_dict(self):
        return asdict(self)


def upgrade_fields(fields):
    """A checkpoint's config fields under the names used today: width -> d_model, n_blocks -> n_layers."""
    return {LEGACY_FIELDS.get(k, k): v for k, v in fields.items()}


def param_shapes(cfg):
    """name -> shape of every parameter init_params makes for cfg (no arrays allocated)."""
    V, K, H, M = cfg.vocab_size, cfg.n_classes, cfg.d_model, MLP_RATIO * cfg.d_model
    shapes = ({"mlp.wte": (V, H), "mlp.wpe": (cfg.max_len, H)} if cfg.inputs == "token"
              else {"mlp.in.w": (cfg.max_len * V, H), "mlp.in.b": (H,)})
    for i in range(cfg.n_layers):
        pre = f"mlp.blocks.{i}."
        shapes.update({pre + "ln.g": (H,), pre + "ln.b": (H,), pre + "w1": (H, M), pre + "b1": (M,),
                       pre + "w2": (M, H), pre + "b2": (H,)})
    shapes.update({"mlp.lnf.g": (H,), "mlp.lnf.b": (H,), "mlp.out.w": (H, K), "mlp.out.b": (K,)})
    return shapes


def state_floats(cfg, T):
    """Floats carried from one position to the next: none for the authors' MLP (one token and its position);
    the prefix MLP reads the whole prefix as its one-hot grid, T x vocab_size."""
    return 0 if cfg.inputs == "token" else T * cfg.vocab_size


def step_flops(cfg, B, T):
    """Floating-point operations of one training step: the blocks' and the head's matrix products, forward and
    backward (the input layer is a gather and a cumulative sum, not a product)."""
    H, M = cfg.d_model, MLP_RATIO * cfg.d_model
    return 3 * 2 * B * T * (cfg.n_layers * 2 * H * M + H * cfg.n_classes)


def init_params(cfg, seed=0):
    """GPT-2-style, as bayesattn.init_params: N(0, 0.02), the residual projections W_2 scaled by 1/sqrt(2N)."""
    rng = np.random.default_rng(seed)
    V, K, H, N = cfg.vocab_size, cfg.n_classes, cfg.d_model, cfg.n_layers
    M = MLP_RATIO * H
    std, std_res = 0.02, 0.02 / math.sqrt(2 * N)
    if cfg.inputs == "token":
        p = {"mlp.wte": rng.normal(0, std, (V, H)), "mlp.wpe": rng.normal(0, std, (cfg.max_len, H))}
    else:
        p = {"mlp.in.w": rng.normal(0, std, (cfg.max_len * V, H)), "mlp.in.b": np.zeros(H)}
    for i in range(N):
        pre = f"mlp.blocks.{i}."
        p[pre + "ln.g"], p[pre + "ln.b"] = np.ones(H), np.zeros(H)
        p[pre + "w1"], p[pre + "b1"] = rng.normal(0, std, (H, M)), np.zeros(M)
        p[pre + "w2"], p[pre + "b2"] = rng.normal(0, std_res, (M, H)), np.zeros(H)
    p["mlp.lnf.g"], p["mlp.lnf.b"] = np.ones(H), np.zeros(H)
    p["mlp.out.w"], p["mlp.out.b"] = rng.normal(0, std, (H, K)), np.zeros(K)
    return {k: v.astype(cfg.dtype) for k, v in p.items()}


# ----------------------------------------------------------------------------
# input layer over the zero-padded prefix: dense reference, then the exact fast form

def prefix_onehot(tokens, max_len, V):
    """tokens (B, T) -> x (B, T, T_max*V): row t holds onehot(tok_j) in slot j for j <= t, zeros elsewhere."""
    B, T = tokens.shape
    grid = np.zeros((B, max_len, V))
    grid[:, :T] = np.eye(V)[tokens]                                # (B, T_max, V), slots >= T empty
    seen = np.arange(max_len)[None, :] <= np.arange(T)[:, None]    # (T, T_max)  slot j <= position t
    x = seen[None, :, :, None] * grid[:, None]                     # (B, T, T_max, V)
    return x.reshape(B, T, max_len * V)


def prefix_linear_ref(tokens, w, b, V):
    """Dense reference: h = x @ W_in + b with x = prefix_onehot(tokens) -> h (B, T, H), cache (x, W_in)."""
    x = prefix_onehot(tokens, w.shape[0] // V, V).astype(w.dtype)  # (B, T, T_max*V)
    return ly.linear_forward(x, w, b)


def slot_index(tokens, V):
    """(B, T) -> (B, T): the row j*V + tok_j of W_in that token tok_j in slot j selects."""
    return np.arange(tokens.shape[1]) * V + tokens


def prefix_linear_forward(tokens, w, b, V):
    """tokens (B, T), w (T_max*V, H), b (H,) -> h (B, T, H), cache (idx, rows of W_in).
    h_t = b + sum_{j<=t} W_in[j*V + tok_j]."""
    idx = slot_index(tokens, V)                                    # (B, T)
    rows = w[idx]                                                  # (B, T, H)  G_j, slot j's contribution
    return np.cumsum(rows, axis=1) + b, (idx, w.shape[0])


def prefix_linear_backward(dh, cache):
    """Forward was h_t = b + sum_{j<=t} G_j with G_j = W_in[idx_j], so dG_j = sum_{t>=j} dh_t,
    dW_in[idx_j] += dG_j (an embedding backward over (slot, token) rows), db = sum dh. -> dw, db."""
    idx, n_rows = cache
    drows = np.flip(np.cumsum(np.flip(dh, axis=1), axis=1), axis=1)   # (B, T, H)  reverse cumulative sum
    dw, _ = ly.embedding_backward(np.ascontiguousarray(drows), (idx, n_rows))
    return dw, dh.sum(axis=(0, 1))


# ----------------------------------------------------------------------------
# the model

def forward(params, tokens, cfg):
    """tokens (B, T) int -> logits (B, T, K), cache. cache["resid"] lists the residual stream
    (B, T, H) after the input layer and after each block."""
    if tokens.shape[1] > cfg.max_len:
        raise ValueError(f"sequence length {tokens.shape[1]} exceeds max_len={cfg.max_len} of this MLP")
    if cfg.inputs == "token":                                       # h_t = wte[tok_t] + wpe[t]: no mixing
        x, inputs = ly.embedding_forward(params["mlp.wte"], params["mlp.wpe"], tokens)  # (B, T, H)
    else:                                                           # h_t = b + sum_{j<=t} W_in[j V + tok_j]
        x, inputs = prefix_linear_forward(tokens, params["mlp.in.w"], params["mlp.in.b"], cfg.vocab_size)
    cache = {"inputs": inputs, "blocks": [], "resid": [x]}
    for i in range(cfg.n_layers):
        pre = f"mlp.blocks.{i}."
        # residual block: x = x + gelu(LN(x) @ W_1 + b_1) @ W_2 + b_2
        bc = {}
        a, bc["ln"] = ly.layernorm_forward(x, params[pre + "ln.g"], params[pre + "ln.b"])      # (B, T, H)
        pre_act, bc["w1"] = ly.linear_forward(a, params[pre + "w1"], params[pre + "b1"])      # (B, T, M)
        act, bc["gelu"] = ly.gelu_forward(pre_act)                                              # (B, T, M)
        out, bc["w2"] = ly.linear_forward(act, params[pre + "w2"], params[pre + "b2"])        # (B, T, H)
        x = x + out
        cache["blocks"].append(bc)
        cache["resid"].append(x)
    xf, cache["lnf"] = ly.layernorm_forward(x, params["mlp.lnf.g"], params["mlp.lnf.b"])
    cache["xf"] = xf
    logits, cache["out"] = ly.linear_forward(xf, params["mlp.out.w"], params["mlp.out.b"])      # (B, T, K)
    return logits, cache


def backward(dlogits, cache, params, cfg):
    """dlogits (B, T, K) -> grads, a dict with the same keys as params. Reverses forward line by line."""
    g = {}
    # forward: logits = xf @ W_out + b_out, xf = LNf(x)
    dx, g["mlp.out.w"], g["mlp.out.b"] = ly.linear_backward(dlogits, cache["out"])
    dx, g["mlp.lnf.g"], g["mlp.lnf.b"] = ly.layernorm_backward(dx, cache["lnf"])
    for i in reversed(range(cfg.n_layers)):
        pre, bc = f"mlp.blocks.{i}.", cache["blocks"][i]
        # forward: x_out = x_in + act @ W_2 + b_2; the residual passes dx straight through
        dact, g[pre + "w2"], g[pre + "b2"] = ly.linear_backward(dx, bc["w2"])
        dpre = ly.gelu_backward(dact, bc["gelu"])                                     # (B, T, M)
        da, g[pre + "w1"], g[pre + "b1"] = ly.linear_backward(dpre, bc["w1"])
        dh, g[pre + "ln.g"], g[pre + "ln.b"] = ly.layernorm_backward(da, bc["ln"])
        dx = dx + dh                                                   # x_in feeds both the residual and LN
    if cfg.inputs == "token":
        g["mlp.wte"], dwpe = ly.embedding_backward(dx, cache["inputs"])
        g["mlp.wpe"] = np.zeros_like(params["mlp.wpe"])
        g["mlp.wpe"][:dwpe.shape[0]] = dwpe                        # rows past T get no gradient
    else:
        g["mlp.in.w"], g["mlp.in.b"] = prefix_linear_backward(dx, cache["inputs"])
    return g
