"""mlp_baseline: the two MLP baselines of this project, built from bayesattn's hand-written pieces.

Neither has attention; they differ in what one position sees.

`token` (train.py --model mlp): the authors' MLP (Paper I). At position t it sees the token tok_t
and the position t, nothing else:
    h_t = wte[tok_t] + wpe[t]                                          (H,)   embedding
    h_t = h_t + gelu(LN(h_t) @ W_1 + b_1) @ W_2 + b_2                  (H,)   N residual blocks
    z_t = LNf(h_t) @ W_out + b_out                                     (K,)   logits
With no context it can learn only the prior p(y | tok_t, t), which in every wind tunnel here is
uniform (values, states are exchangeable), so its paper metric is the prior's gap
(windtunnels.prior_gap_bits): 1.107 bits (bijection), 1.849 (sawtooth), 0.42 (HMM).

`prefix` (train.py --model prefix-mlp): a stronger baseline. At every position t it sees the
whole prefix tok_0..tok_t as one-hot rows in slots 0..t of a (T_max, V) grid, zeros in slots
t+1..T_max-1, flattened:
    x_t = flatten([onehot(tok_0); ...; onehot(tok_t); 0; ...; 0])      (T_max*V,)  zero-padded prefix
    h   = x_t @ W_in + b_in                                             (H,)        input layer
then the same residual blocks and head. Whatever is a linear function of the prefix grid (which
values have been seen, say) its first layer can compute; what it lacks is weight sharing across
slots, which is what attention has.

Notation: B batch, T sequence length (T <= T_max = max_len), V input vocabulary, K classes,
H width, M = 4H inner width of a block, N number of blocks.

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

Gradient convention (as in layers.py): every backward returns FRESH arrays, and `mlp_backward`
returns a dict with the same keys as the parameters.
"""

import math
from dataclasses import dataclass, asdict

import layers as ly  # first: it pins OPENBLAS_NUM_THREADS before NumPy loads

import numpy as np  # noqa: E402

MLP_RATIO = 4   # inner width M = 4H, as in the transformer's feed-forward layers
MATCH_TOL = 0.05  # capacity matching: parameter count within 5% of the target
INPUTS = ("token", "prefix")  # what one position sees: its own token and position, or the whole prefix


# ----------------------------------------------------------------------------
# configuration and parameters

@dataclass
class MLPConfig:
    vocab_size: int            # V, input tokens
    n_classes: int             # K, output classes
    max_len: int               # T_max, slots in the zero-padded prefix grid
    width: int                 # H, residual stream width
    n_blocks: int              # N, residual blocks
    dtype: str = "float32"     # "float32" for training, "float64" for checks
    inputs: str = "prefix"     # "token": the authors' MLP (tok_t and t); "prefix": the whole prefix grid

    def __post_init__(self):
        for name in ("vocab_size", "n_classes", "max_len", "width", "n_blocks"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}={value!r}: must be a positive integer")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype={self.dtype!r}: allowed are 'float32', 'float64'")
        if self.inputs not in INPUTS:
            raise ValueError(f"inputs={self.inputs!r}: allowed are {', '.join(map(repr, INPUTS))}")

    def to_dict(self):
        return asdict(self)


def mlp_param_count(vocab_size, n_classes, max_len, width, n_blocks, inputs="prefix"):
    """Closed form of count_params(mlp_init_params(...)), so widths can be searched without allocating."""
    V, K, H, M = vocab_size, n_classes, width, MLP_RATIO * width
    per_block = 2 * H + (H * M + M) + (M * H + H)                  # LN, W_1 b_1, W_2 b_2
    first = (V * H + max_len * H) if inputs == "token" else (max_len * V * H + H)   # wte, wpe | W_in, b_in
    return first + n_blocks * per_block + 2 * H + (H * K + K)


def match_width(vocab_size, n_classes, max_len, n_blocks, target_params, dtype="float32", inputs="prefix"):
    """MLPConfig whose width gives the parameter count closest to target_params; ValueError if not within 5%."""
    count = lambda H: mlp_param_count(vocab_size, n_classes, max_len, H, n_blocks, inputs)
    H = 1
    while count(H) < target_params:                                # the count grows with H
        H += 1
    if H > 1 and target_params - count(H - 1) <= count(H) - target_params:
        H -= 1
    error = abs(count(H) - target_params) / target_params
    if error > MATCH_TOL:
        raise ValueError(f"no width matches {target_params} parameters within {MATCH_TOL:.0%} with "
                         f"n_blocks={n_blocks}, max_len={max_len}, V={vocab_size}, K={n_classes}: "
                         f"closest is width={H} with {count(H)} ({error:.1%} off)")
    return MLPConfig(vocab_size, n_classes, max_len, H, n_blocks, dtype, inputs)


def mlp_param_shapes(mcfg):
    """name -> shape of every parameter mlp_init_params makes for mcfg."""
    V, K, H, M = mcfg.vocab_size, mcfg.n_classes, mcfg.width, MLP_RATIO * mcfg.width
    shapes = ({"mlp.wte": (V, H), "mlp.wpe": (mcfg.max_len, H)} if mcfg.inputs == "token"
              else {"mlp.in.w": (mcfg.max_len * V, H), "mlp.in.b": (H,)})
    for i in range(mcfg.n_blocks):
        pre = f"mlp.blocks.{i}."
        shapes.update({pre + "ln.g": (H,), pre + "ln.b": (H,), pre + "w1": (H, M), pre + "b1": (M,),
                       pre + "w2": (M, H), pre + "b2": (H,)})
    shapes.update({"mlp.lnf.g": (H,), "mlp.lnf.b": (H,), "mlp.out.w": (H, K), "mlp.out.b": (K,)})
    return shapes


def mlp_init_params(mcfg, seed=0):
    """GPT-2-style, as bayesattn.init_params: N(0, 0.02), the residual projections W_2 scaled by 1/sqrt(2N)."""
    rng = np.random.default_rng(seed)
    V, K, H, N = mcfg.vocab_size, mcfg.n_classes, mcfg.width, mcfg.n_blocks
    M = MLP_RATIO * H
    std, std_res = 0.02, 0.02 / math.sqrt(2 * N)
    if mcfg.inputs == "token":
        p = {"mlp.wte": rng.normal(0, std, (V, H)), "mlp.wpe": rng.normal(0, std, (mcfg.max_len, H))}
    else:
        p = {"mlp.in.w": rng.normal(0, std, (mcfg.max_len * V, H)), "mlp.in.b": np.zeros(H)}
    for i in range(N):
        pre = f"mlp.blocks.{i}."
        p[pre + "ln.g"], p[pre + "ln.b"] = np.ones(H), np.zeros(H)
        p[pre + "w1"], p[pre + "b1"] = rng.normal(0, std, (H, M)), np.zeros(M)
        p[pre + "w2"], p[pre + "b2"] = rng.normal(0, std_res, (M, H)), np.zeros(H)
    p["mlp.lnf.g"], p["mlp.lnf.b"] = np.ones(H), np.zeros(H)
    p["mlp.out.w"], p["mlp.out.b"] = rng.normal(0, std, (H, K)), np.zeros(K)
    return {k: v.astype(mcfg.dtype) for k, v in p.items()}


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
    """Dense reference: h = x @ W_in + b with x = prefix_onehot(tokens) -> h (B, T, H), x."""
    x = prefix_onehot(tokens, w.shape[0] // V, V).astype(w.dtype)  # (B, T, T_max*V)
    return ly.linear_forward(x, w, b)


def slot_index(tokens, V):
    """(B, T) -> (B, T): the row j*V + tok_j of W_in that token tok_j in slot j selects."""
    return np.arange(tokens.shape[1]) * V + tokens


def prefix_linear_forward(tokens, w, b, V):
    """tokens (B, T), w (T_max*V, H), b (H,) -> h (B, T, H), idx.  h_t = b + sum_{j<=t} W_in[j*V + tok_j]."""
    idx = slot_index(tokens, V)                                    # (B, T)
    rows = w[idx]                                                  # (B, T, H)  G_j, slot j's contribution
    return np.cumsum(rows, axis=1) + b, idx


def prefix_linear_backward(dh, idx, w):
    """Forward was h_t = b + sum_{j<=t} G_j with G_j = W_in[idx_j], so dG_j = sum_{t>=j} dh_t,
    dW_in[idx_j] += dG_j (an embedding backward over (slot, token) rows), db = sum dh. -> dw, db."""
    drows = np.flip(np.cumsum(np.flip(dh, axis=1), axis=1), axis=1)   # (B, T, H)  reverse cumulative sum
    dw, _ = ly.embedding_backward(np.ascontiguousarray(drows), idx, w.shape[0])
    return dw, dh.sum(axis=(0, 1))


# ----------------------------------------------------------------------------
# the model

def mlp_forward(params, tokens, mcfg):
    """tokens (B, T) int -> logits (B, T, K), cache. cache["resid"] lists the residual stream
    (B, T, H) after the input layer and after each block."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must have shape (B, T), got {tokens.shape}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= mcfg.vocab_size):
        raise ValueError(f"token ids must lie in 0..{mcfg.vocab_size - 1}, got {tokens.min()}..{tokens.max()}")
    if tokens.shape[1] > mcfg.max_len:
        raise ValueError(f"sequence length {tokens.shape[1]} exceeds max_len={mcfg.max_len} of this MLP")
    if mcfg.inputs == "token":                                      # h_t = wte[tok_t] + wpe[t]: no mixing
        x, idx = ly.embedding_forward(params["mlp.wte"], params["mlp.wpe"], tokens)  # (B, T, H)
    else:                                                           # h_t = b + sum_{j<=t} W_in[j V + tok_j]
        x, idx = prefix_linear_forward(tokens, params["mlp.in.w"], params["mlp.in.b"], mcfg.vocab_size)
    cache = {"idx": idx, "blocks": [], "resid": [x]}
    for i in range(mcfg.n_blocks):
        pre = f"mlp.blocks.{i}."
        # residual block: x = x + gelu(LN(x) @ W_1 + b_1) @ W_2 + b_2
        a, ln = ly.layernorm_forward(x, params[pre + "ln.g"], params[pre + "ln.b"])  # (B, T, H)
        pre_act, _ = ly.linear_forward(a, params[pre + "w1"], params[pre + "b1"])    # (B, T, M)
        act, gelu_in = ly.gelu_forward(pre_act)                                       # (B, T, M)
        out, _ = ly.linear_forward(act, params[pre + "w2"], params[pre + "b2"])      # (B, T, H)
        x = x + out
        cache["blocks"].append({"ln": ln, "a": a, "gelu_in": gelu_in, "act": act})
        cache["resid"].append(x)
    xf, cache["lnf"] = ly.layernorm_forward(x, params["mlp.lnf.g"], params["mlp.lnf.b"])
    cache["xf"] = xf
    logits, _ = ly.linear_forward(xf, params["mlp.out.w"], params["mlp.out.b"])      # (B, T, K)
    return logits, cache


def mlp_backward(dlogits, cache, params, mcfg):
    """dlogits (B, T, K) -> grads, a dict with the same keys as params. Reverses mlp_forward line by line."""
    g = {}
    # forward: logits = xf @ W_out + b_out, xf = LNf(x)
    dx, g["mlp.out.w"], g["mlp.out.b"] = ly.linear_backward(dlogits, cache["xf"], params["mlp.out.w"])
    dx, g["mlp.lnf.g"], g["mlp.lnf.b"] = ly.layernorm_backward(dx, cache["lnf"])
    for i in reversed(range(mcfg.n_blocks)):
        pre, bc = f"mlp.blocks.{i}.", cache["blocks"][i]
        # forward: x_out = x_in + act @ W_2 + b_2; the residual passes dx straight through
        dact, g[pre + "w2"], g[pre + "b2"] = ly.linear_backward(dx, bc["act"], params[pre + "w2"])
        dpre = ly.gelu_backward(dact, bc["gelu_in"])                                  # (B, T, M)
        da, g[pre + "w1"], g[pre + "b1"] = ly.linear_backward(dpre, bc["a"], params[pre + "w1"])
        dh, g[pre + "ln.g"], g[pre + "ln.b"] = ly.layernorm_backward(da, bc["ln"])
        dx = dx + dh                                                   # x_in feeds both the residual and LN
    if mcfg.inputs == "token":
        g["mlp.wte"], dwpe = ly.embedding_backward(dx, cache["idx"], mcfg.vocab_size)
        g["mlp.wpe"] = np.zeros_like(params["mlp.wpe"])
        g["mlp.wpe"][:dwpe.shape[0]] = dwpe                        # rows past T get no gradient
    else:
        g["mlp.in.w"], g["mlp.in.b"] = prefix_linear_backward(dx, cache["idx"], params["mlp.in.w"])
    return g


def mlp_loss_and_grads(params, tokens, targets, mask, mcfg):
    """Mean cross-entropy (nats) over supervised positions and its gradient for every parameter.
    targets (B, T) ints or (B, T, K) probabilities, mask (B, T)."""
    logits, cache = mlp_forward(params, tokens, mcfg)
    loss, dlogits = ly.cross_entropy(logits, targets, mask)
    return loss, mlp_backward(dlogits, cache, params, mcfg)


def mlp_predict_proba(params, tokens, mcfg, batch=256):
    """Model predictive distribution (B, T, K) in float64, evaluated in chunks of `batch` sequences."""
    out = []
    for i in range(0, len(tokens), batch):
        logits, _ = mlp_forward(params, tokens[i:i + batch], mcfg)
        out.append(ly.softmax.numpy(logits.astype(np.float64)))
    return np.concatenate(out)
