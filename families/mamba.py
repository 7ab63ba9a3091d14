"""mamba: a selective state-space model (the Mamba block of Gu and Dao 2023, unfused), every backward by hand.

Notation (fixed for the whole module)
    B  batch size     T  sequence length     C  model width (d_model)     E  expansion (2)
    D  inner width E * C (the scan's channels)     N  state size per channel (d_state, 16)
    R  rank of the step's projection (dt_rank, ceil(C / 16))     W  convolution width (4)
    V  input vocabulary     K  output classes     L  number of blocks

Gradient convention (layers.py's, for every op): a forward returns (out, cache), its backward takes
(dout, cache) and returns FRESH arrays. `backward` returns a dict with the same keys as the parameters.

This module is one model family of models.FAMILIES ("ssm"): `Config`, `init_params`, `forward`,
`backward`, and `param_shapes`, `decayed`, `step_memory_bytes`, `step_flops`, `TWINS`.

The model, in the order of its forward pass:
    x = wte[tokens]                                               embedding (no positions: the convolution and
                                                                  the scan know the order)
    L pre-norm residual blocks  x = x + out_proj(block(LN(x))):
      [u, z]  = LN(x) W_in                        (B, T, 2D)      in-projection, no bias; u the input, z the gate
      u       = silu(causal_conv(u) + b_conv)     (B, T, D)       depthwise, width W, causal
      [r, Bm, Cm] = u W_x                         (B, T, R+2N)    the step's low-rank code, B_t, C_t (no bias)
      dt      = softplus(r W_dt + b_dt)           (B, T, D)       the step size Delta_t > 0, per channel
      A       = -exp(A_log)                       (D, N)          per channel and state, A_log = log n (S4D-real);
                                                                  --shared-a: one row (N,) for every channel
      y       = selective_scan(u, dt, A, Bm, Cm, Dskip)           (B, T, D)
      out     = (y * silu(z)) W_out               (B, T, C)       gate, out-projection, no bias
    logits = LNf(x) W_u + b_u

The selective scan, per batch b, channel d, state n (h_0 = 0):
    h_t = exp(dt_t A) * h_{t-1} + dt_t B_t x_t        (D, N): the input-dependent decay and write
    y_t = C_t . h_t + Dskip * x_t                     (D,)
Its backward runs in reverse time. Write a_t = exp(dt_t A) and g_t = dL/dh_t, all the paths from h_t to
the loss: h_t reaches y_t directly and h_{t+1} through a_{t+1}, so
    g_t = dy_t C_t + a_{t+1} g_{t+1}                 (the dy-term, then what step t+1 sends back)
and from h_t = a_t h_{t-1} + dt_t B_t x_t:
    dC_t = sum_d dy_t h_t                dB_t = sum_d g_t dt_t x_t       dx_t = sum_n g_t dt_t B_t + Dskip dy_t
    da_t = g_t h_{t-1}   ->   ddt_t = sum_n (da_t a_t A + g_t B_t x_t),   dA = sum_{b,t} da_t a_t dt_t
    dDskip = sum_{b,t} dy_t x_t

Initialisation (Mamba's defaults): A_log = log n (n = 1..N) for every channel; Dskip = 1; the step's bias
the softplus inverse of a step drawn log-uniform in [DT_MIN, DT_MAX] (so the first steps lie there);
W_dt U(-1/sqrt(R), 1/sqrt(R)); the convolution U(-1/sqrt(W), 1/sqrt(W)) with its bias likewise (PyTorch's
Conv1d); the other matrices and the embedding by Config.init: "fan-in" (the default) N(0, 1/fan_in)
matrices, an N(0, 1) embedding; "gpt2" N(0, 0.02) for both (the reference Mamba language model's
embedding; the scan's own parameters are drawn as above either way).
Weight decay (decayed): the matrices (embedding, W_in, the convolution, W_x, W_dt, W_out, the head) decay;
biases, LayerNorm gains, A_log, Dskip and the step's bias do not.
Left out: the fused kernel and its recomputation of the states, dropout, a tied head, the authors' clamps.
"""

import math
from dataclasses import dataclass, asdict

import layers as ly
from layers import twin

import numpy as np  # noqa: E402  (after layers: it pins OpenBLAS to one thread before NumPy loads)

DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 1e-1, 1e-4   # the initial steps: log-uniform in [DT_MIN, DT_MAX], at least DT_FLOOR
INITS = ("fan-in", "gpt2")  # Config.init: how the embedding and the dense matrices are drawn (the docstring)
TWINS = "families.mamba_twins"   # the module of this family's Numba twins (models.py loads it with the family)


# ----------------------------------------------------------------------------
# configuration and initialisation

# sizes: the Config's 2 blocks, the width that gives the transformer's parameter count in each task's
# default and paper presets (within 5%: --params); the quick presets take the Config's width. Optimisation:
# the learning rate and initialisation of a sweep, the lowest held-out KL over its grid: the sawtooth's
# (families/README.md, "The sweep and its rule": 3 rates x 2 initialisations; the bijection takes it) and
# the rate sweep's on recall, hops, transport and the HMM (primitives/README.md, "The recurrent families' rate
# sweep": 4 rates x 2 initialisations on seed 9, which no verdict uses), over the task's own
TUNED = {"bijection": dict(lr=1e-2, init="fan-in"), "sawtooth": dict(lr=1e-2, init="fan-in"),
         "recall": dict(lr=1e-2, init="fan-in"), "hops": dict(lr=1e-2, init="fan-in"),
         "transport": dict(lr=3e-3, init="fan-in"), "hmm": dict(lr=3e-3, init="fan-in")}
PRESETS = {task: {preset: dict(params=n, **TUNED[task]) for preset, n in counts.items()} for task, counts in {
    "bijection": {"default": 156_372, "paper": 156_372},
    "sawtooth": {"first": 105_172, "default": 105_172, "paper": 105_172},
    "hmm": {"default": 213_445, "paper": 691_301},
    "transport": {"default": 208_709, "paper": 684_197},
    "recall": {"default": 109_600, "paper": 109_600},
    "hops": {"default": 205_840, "paper": 205_840}}.items()}
FLAGS = {"--d-state": dict(field="d_state", type=int, help="ssm: the state size N per channel (default 16)"),
         "--expand": dict(field="expand", type=int, help="ssm: the inner width E x d_model (default E = 2)"),
         "--d-conv": dict(field="d_conv", type=int, help="ssm: the causal convolution's width (default 4)"),
         "--shared-a": dict(field="shared_a", type=bool, help="ssm: the authors' variant, one vector A_log of N "
                            "log rates shared by every channel (default: one per channel)")}


@dataclass
class Config:
    vocab_size: int            # V, input tokens
    n_classes: int             # K, output classes
    max_len: int = 64          # the training length (no position table: any length runs)
    d_model: int = 64          # C
    n_layers: int = 2          # L
    dtype: str = "float32"     # "float32" for training, "float64" for checks
    d_state: int = 16          # N
    expand: int = 2            # E
    d_conv: int = 4            # W
    dt_rank: int = 0           # R; 0 means ceil(C / 16)
    shared_a: bool = False     # the authors' variant: one A_log (N,) for every channel, not one per channel
    init: str = "fan-in"       # see INITS

    def __post_init__(self):
        if self.dt_rank == 0 and isinstance(self.d_model, (int, np.integer)):
            self.dt_rank = math.ceil(self.d_model / 16)
        for name in ("vocab_size", "n_classes", "max_len", "d_model", "n_layers", "d_state", "expand", "d_conv",
                     "dt_rank"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}={value!r}: must be a positive integer")
        if self.init not in INITS:
            raise ValueError(f"init={self.init!r}: allowed are {', '.join(map(repr, INITS))}")
        if not isinstance(self.shared_a, (bool, np.bool_)):
            raise ValueError(f"shared_a={self.shared_a!r}: allowed are True, False")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype={self.dtype!r}: allowed are 'float32', 'float64'")

    def to_dict(self):
        return asdict(self)


def param_shapes(cfg):
    """name -> shape of every parameter init_params makes for cfg."""
    C, D, N, R = cfg.d_model, cfg.expand * cfg.d_model, cfg.d_state, cfg.dt_rank
    shapes = {"wte": (cfg.vocab_size, C)}
    for l in range(cfg.n_layers):
        pre = f"blocks.{l}."
        shapes.update({pre + "ln.g": (C,), pre + "ln.b": (C,), pre + "in_proj.w": (C, 2 * D),
                       pre + "conv.w": (D, cfg.d_conv), pre + "conv.b": (D,), pre + "x_proj.w": (D, R + 2 * N),
                       pre + "dt_proj.w": (R, D), pre + "dt_proj.b": (D,),
                       pre + "A_log": (N,) if cfg.shared_a else (D, N), pre + "D": (D,),
                       pre + "out_proj.w": (D, C)})
    shapes.update({"lnf.g": (C,), "lnf.b": (C,), "unembed.w": (C, cfg.n_classes), "unembed.b": (cfg.n_classes,)})
    return shapes


def init_params(cfg, seed=0):
    """Mamba's initialisation (the module docstring says each draw)."""
    rng = np.random.default_rng(seed)
    p = {}
    for name, shape in param_shapes(cfg).items():
        kind = name.rsplit(".", 1)[-1] if not name.startswith("blocks.") else name.split(".", 2)[2]
        if name == "wte":
            p[name] = rng.normal(0, 1.0 if cfg.init == "fan-in" else 0.02, shape)
        elif kind in ("conv.w", "conv.b"):
            p[name] = rng.uniform(-1 / math.sqrt(cfg.d_conv), 1 / math.sqrt(cfg.d_conv), shape)
        elif kind == "dt_proj.w":
            p[name] = rng.uniform(-1 / math.sqrt(cfg.dt_rank), 1 / math.sqrt(cfg.dt_rank), shape)
        elif kind == "dt_proj.b":
            dt = np.exp(rng.uniform(math.log(DT_MIN), math.log(DT_MAX), shape))
            dt = np.maximum(dt, DT_FLOOR)
            p[name] = dt + np.log(-np.expm1(-dt))                   # softplus^-1(dt) = log(exp(dt) - 1)
        elif kind == "A_log":
            p[name] = np.log(np.broadcast_to(np.arange(1, cfg.d_state + 1), shape))   # A = -n, S4D-real
        elif kind in ("D", "ln.g") or name == "lnf.g":
            p[name] = np.ones(shape)
        elif len(shape) == 2:                                       # in_proj, x_proj, out_proj, unembed
            p[name] = rng.normal(0, 1 / math.sqrt(shape[0]) if cfg.init == "fan-in" else 0.02, shape)
        else:                                                       # the LayerNorm and head biases
            p[name] = np.zeros(shape)
    return {k: v.astype(cfg.dtype) for k, v in p.items()}


def decayed(name, shape):
    """Weight decay on the matrices; not on biases, LayerNorm parameters, A_log (a matrix of log rates), Dskip
    or the step's bias."""
    return len(shape) >= 2 and not name.endswith("A_log")


def step_memory_bytes(cfg, B, T):
    """About how many bytes one training step at batch B and length T holds at its peak: per block the scan's
    states h_t (B, T, D, N), kept for the backward, about 16 activations of (B, T, D) (u, z, the convolution,
    dt, y, the gate, and the backward's temporaries) and 6 of (B, T, C); the parameters four times (weights,
    gradients, AdamW's m and v); three (B, T, K) arrays of logits. An estimate to refuse what cannot fit."""
    C, D, N, L = cfg.d_model, cfg.expand * cfg.d_model, cfg.d_state, cfg.n_layers
    itemsize = 8 if cfg.dtype == "float64" else 4
    params = sum(int(np.prod(s)) for s in param_shapes(cfg).values())
    per_block = B * T * D * N + 16 * B * T * D + 6 * B * T * C
    return itemsize * (L * per_block + 4 * params + 3 * B * T * cfg.n_classes)


def state_floats(cfg, T):
    """Floats carried from one position to the next: every layer's scan state (E d channels x N) and its
    convolution's window (d_conv - 1 inputs of E d channels): fixed, whatever T."""
    inner = cfg.expand * cfg.d_model
    return cfg.n_layers * (inner * cfg.d_state + (cfg.d_conv - 1) * inner)


def step_flops(cfg, B, T):
    """Floating-point operations of one training step: per block and token the four projections' products
    (2 C 2D, 2 D (R + 2N), 2 R D, 2 D C), the convolution (2 W D) and the scan (about 6 D N: the decay's
    exponential and product, the write, the read-out), the head's product; the backward twice the forward."""
    C, D, N, R, W = cfg.d_model, cfg.expand * cfg.d_model, cfg.d_state, cfg.dt_rank, cfg.d_conv
    per_token = cfg.n_layers * (2 * C * 2 * D + 2 * D * (R + 2 * N) + 2 * R * D + 2 * D * C + 2 * W * D + 6 * D * N)
    return 3 * (per_token + 2 * C * cfg.n_classes) * B * T


# ----------------------------------------------------------------------------
# elementwise ops:  silu(x) = x sigmoid(x),  softplus(x) = log(1 + exp(x))

@twin
def silu_forward(x):
    """x (...) -> y = x sigmoid(x) (...), cache (x, sigmoid(x))."""
    s, _ = ly.sigmoid_forward(x)
    return x * s, (x, s)


@twin
def silu_backward(dy, cache):
    """With s = sigmoid(x): dy/dx = s + x s (1 - s)."""
    x, s = cache
    return dy * s * (1.0 + x * (1.0 - s))


def softplus_forward(x):
    """x (...) -> y = log(1 + exp(x)) (...), cache x. logaddexp(0, x) never overflows."""
    return np.logaddexp(0.0, x).astype(x.dtype), x


@twin
def softplus_backward(dy, cache):
    """cache = x. dy/dx = exp(x) / (1 + exp(x)) = sigmoid(x)."""
    return dy * ly.sigmoid_forward(cache)[0]


# ----------------------------------------------------------------------------
# depthwise causal convolution: y_t = b + sum_k w_k x_{t - (W-1) + k}, x_s = 0 for s < 0

def causal_conv_forward(x, w, b):
    """x (B, T, D), w (D, W), b (D,) -> y (B, T, D), cache (xp, w). Each channel convolved with its own w."""
    B, T, D = x.shape
    W = w.shape[1]
    xp = np.concatenate([np.zeros((B, W - 1, D), dtype=x.dtype), x], axis=1)   # (B, T + W - 1, D), zeros before t = 0
    y = np.zeros_like(x) + b
    for k in range(W):
        y += w[:, k] * xp[:, k:k + T]                              # tap k reads x_{t - (W-1) + k}
    return y, (xp, w)


def causal_conv_backward(dy, cache):
    """-> dx (B, T, D), dw (D, W), db (D,). Forward was y_t += w_k x_{t-(W-1)+k} for each tap k, so
    dx_{t-(W-1)+k} += w_k dy_t and dw_k = sum_{b,t} dy_t x_{t-(W-1)+k}; db = sum dy."""
    xp, w = cache
    T, W = dy.shape[1], w.shape[1]
    dxp = np.zeros_like(xp)
    dw = np.empty_like(w)
    for k in range(W):
        dxp[:, k:k + T] += w[:, k] * dy
        dw[:, k] = (dy * xp[:, k:k + T]).sum(axis=(0, 1))
    return dxp[:, W - 1:], dw, dy.sum(axis=(0, 1))


# ----------------------------------------------------------------------------
# the selective scan, a plain loop over time (the module docstring derives its backward)

@twin
def selective_scan_forward(x, dt, A, Bm, Cm, Dskip):
    """x, dt (B, T, D), A (D, N), Bm, Cm (B, T, N), Dskip (D,) -> y (B, T, D), cache.
        h_t = exp(dt_t A) * h_{t-1} + dt_t B_t x_t,  y_t = C_t . h_t + Dskip x_t,  h_0 = 0."""
    Bsz, T, D = x.shape
    N = A.shape[1]
    hs = np.empty((Bsz, T, D, N), dtype=x.dtype)                    # every state, kept for the backward
    y = np.empty_like(x)
    h = np.zeros((Bsz, D, N), dtype=x.dtype)
    for t in range(T):
        a = np.exp(dt[:, t, :, None] * A)                           # (B, D, N)  a_t = exp(dt_t A)
        h = a * h + (dt[:, t] * x[:, t])[:, :, None] * Bm[:, t, None, :]   # h_t = a_t h_{t-1} + dt_t x_t B_t
        y[:, t] = (h * Cm[:, t, None, :]).sum(axis=-1) + Dskip * x[:, t]  # y_t = C_t . h_t + Dskip x_t
        hs[:, t] = h
    return y, (x, dt, A, Bm, Cm, Dskip, hs)


@twin
def selective_scan_backward(dy, cache):
    """dy (B, T, D) -> dx, ddt (B, T, D), dA (D, N), dBm, dCm (B, T, N), dDskip (D,). Reverse time, carrying
    g = dL/dh_t: g_t = dy_t C_t + a_{t+1} g_{t+1}."""
    x, dt, A, Bm, Cm, Dskip, hs = cache
    Bsz, T, D = x.shape
    dx, ddt = np.empty_like(x), np.empty_like(dt)
    dBm, dCm = np.empty_like(Bm), np.empty_like(Cm)
    dA = np.zeros_like(A)
    g = np.zeros_like(hs[:, 0])                                      # (B, D, N)  a_{t+1} g_{t+1}, 0 past the end
    for t in reversed(range(T)):
        # y_t = C_t . h_t + Dskip x_t
        dCm[:, t] = (dy[:, t, :, None] * hs[:, t]).sum(axis=1)      # dC_t = sum_d dy_t h_t
        g = g + dy[:, t, :, None] * Cm[:, t, None, :]               # g_t = dy_t C_t + a_{t+1} g_{t+1}
        # h_t = a_t h_{t-1} + dt_t x_t B_t
        gB = (g * Bm[:, t, None, :]).sum(axis=-1)                   # (B, D)  sum_n g_t B_t
        dx[:, t] = gB * dt[:, t] + Dskip * dy[:, t]
        dBm[:, t] = (g * (dt[:, t] * x[:, t])[:, :, None]).sum(axis=1)
        a = np.exp(dt[:, t, :, None] * A)                           # (B, D, N)  a_t
        h_prev = hs[:, t - 1] if t > 0 else np.zeros_like(g)
        da = g * h_prev * a                                         # dL/d(dt_t A) = g_t h_{t-1} a_t
        ddt[:, t] = (da * A).sum(axis=-1) + gB * x[:, t]
        dA += (da * dt[:, t, :, None]).sum(axis=0)
        g = a * g                                                    # what step t sends back to h_{t-1}
    dDskip = (dy * x).sum(axis=(0, 1))
    return dx, ddt, dA, dBm, dCm, dDskip


# ----------------------------------------------------------------------------
# the model

def forward(params, tokens, cfg):
    """tokens (B, T) int -> logits (B, T, K), cache. cache["resid"] lists the stream before each block and
    after the last (B, T, C); cache["xf"] is the final LayerNorm's output."""
    T, D, N, R = tokens.shape[1], cfg.expand * cfg.d_model, cfg.d_state, cfg.dt_rank
    x, embedding = ly.embedding_forward(params["wte"], np.zeros((T, cfg.d_model), dtype=cfg.dtype), tokens)
    x = x.astype(cfg.dtype)                                          # (B, T, C)
    cache = {"embedding": embedding, "blocks": [], "resid": [x]}
    for l in range(cfg.n_layers):
        pre, bc = f"blocks.{l}.", {}
        v, bc["ln"] = ly.layernorm_forward(x, params[pre + "ln.g"], params[pre + "ln.b"])
        uz, bc["in_proj"] = ly.linear_forward(v, params[pre + "in_proj.w"], np.zeros(2 * D, dtype=cfg.dtype))
        u, z = uz[..., :D], uz[..., D:]                              # (B, T, D) each
        u, bc["conv"] = causal_conv_forward(u, params[pre + "conv.w"], params[pre + "conv.b"])
        u, bc["silu_u"] = silu_forward(u)                            # the scan's input
        rbc, bc["x_proj"] = ly.linear_forward(u, params[pre + "x_proj.w"], np.zeros(R + 2 * N, dtype=cfg.dtype))
        r, Bm, Cm = rbc[..., :R], rbc[..., R:R + N], rbc[..., R + N:]
        dt, bc["dt_proj"] = ly.linear_forward(r, params[pre + "dt_proj.w"], params[pre + "dt_proj.b"])
        dt, bc["softplus"] = softplus_forward(dt)                    # (B, T, D)  dt > 0
        A = np.ascontiguousarray(np.broadcast_to(-np.exp(params[pre + "A_log"]), (D, N)))   # (D, N); shared: (N,) repeated
        y, bc["scan"] = selective_scan_forward(u, dt, A, np.ascontiguousarray(Bm), np.ascontiguousarray(Cm),
                                               params[pre + "D"])
        sz, bc["silu_z"] = silu_forward(z)
        out, bc["out_proj"] = ly.linear_forward(y * sz, params[pre + "out_proj.w"], np.zeros(cfg.d_model, dtype=cfg.dtype))
        bc.update(y=y, sz=sz, A=A)
        x = x + out
        cache["blocks"].append(bc)
        cache["resid"].append(x)
    logits, cache["head"] = ly.head_forward(x, params["lnf.g"], params["lnf.b"], params["unembed.w"], params["unembed.b"])
    cache["xf"] = cache["head"]["xf"]                               # (B, T, C)  the final state
    return logits, cache


def backward(dlogits, cache, params, cfg):
    """dlogits (B, T, K) -> grads, a dict with the same keys as params. Reverses forward line by line."""
    g = {}
    dx, g["lnf.g"], g["lnf.b"], g["unembed.w"], g["unembed.b"] = ly.head_backward(dlogits, cache["head"])
    for l in reversed(range(cfg.n_layers)):
        pre, bc = f"blocks.{l}.", cache["blocks"][l]
        # forward: x = x + (y * silu(z)) W_out; the residual passes dx straight through
        dyg, g[pre + "out_proj.w"], _ = ly.linear_backward(dx, bc["out_proj"])
        dy, dz = dyg * bc["sz"], silu_backward(dyg * bc["y"], bc["silu_z"])
        # forward: y = selective_scan(u, dt, A, Bm, Cm, Dskip), A = -exp(A_log) so dA_log = dA * A; a shared
        # A_log was repeated over the channels, so its gradient sums over them
        du, ddt, dA, dBm, dCm, g[pre + "D"] = selective_scan_backward(dy, bc["scan"])
        g[pre + "A_log"] = (dA * bc["A"]).sum(0) if cfg.shared_a else dA * bc["A"]
        # forward: dt = softplus(r W_dt + b_dt)
        dr, g[pre + "dt_proj.w"], g[pre + "dt_proj.b"] = ly.linear_backward(softplus_backward(ddt, bc["softplus"]),
                                                                           bc["dt_proj"])
        # forward: [r, Bm, Cm] = u W_x; u feeds both the scan and W_x
        dux, g[pre + "x_proj.w"], _ = ly.linear_backward(np.concatenate([dr, dBm, dCm], axis=-1), bc["x_proj"])
        du = silu_backward(du + dux, bc["silu_u"])
        du, g[pre + "conv.w"], g[pre + "conv.b"] = causal_conv_backward(du, bc["conv"])
        # forward: [u, z] = LN(x) W_in
        dv, g[pre + "in_proj.w"], _ = ly.linear_backward(np.concatenate([du, dz], axis=-1), bc["in_proj"])
        dv, g[pre + "ln.g"], g[pre + "ln.b"] = ly.layernorm_backward(dv, bc["ln"])
        dx = dx + dv                                                   # x feeds both the residual and LN
    g["wte"], _ = ly.embedding_backward(dx, cache["embedding"])
    return g
