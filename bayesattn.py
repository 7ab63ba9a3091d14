"""bayesattn: a decoder-only transformer with every backward pass derived by hand.

Notation (fixed for the whole module)
    B  batch size            T  sequence length        C  model width (d_model)
    NH number of heads       hs head size = C // NH    M  MLP width (d_mlp)
    V  input vocabulary      K  output classes         L  number of layers

Gradient convention: every `*_backward` returns FRESH arrays (nothing is
accumulated into buffers). `backward` returns a dict with the same keys as the
parameters.

Every op is a pair `x_forward(...) -> (out, cache)` / `x_backward(dout, cache)`.
The hot loops (attention, softmax, LayerNorm, GELU, softmax + cross-entropy, the
embedding's scatter-add) are Numba kernels named `*_kernel`; beside each one is a
plain NumPy reference named `*_ref`, and the test suite checks that the two agree.
Their e^x is `exp32` in float32 (vectorisable), `math.exp` otherwise.
Matrix products are BLAS calls, large ones split by rows over threads (`matmul`).

The attention backward is written as the papers' E-step and M-step
(shared/PAPERS.md, "The gradient equations"):
    b_ij   = u_i . v_j                    (u = dL/d head output)
    b_bar_i = sum_j alpha_ij b_ij
    ds_ij  = alpha_ij (b_ij - b_bar_i)     E-step: advantage routing law
    dv_j   = sum_i alpha_ij u_i            M-step: responsibility-weighted value update
    dq_i   = sum_j ds_ij k_j / sqrt(hs),   dk_j = sum_i ds_ij q_i / sqrt(hs)
"""

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, asdict, replace

# Numba's worker threads and OpenBLAS's worker threads both spin while waiting; on a
# 2-core machine they fight and a training step runs about 3x slower. The matrix
# products here are small, so BLAS gets one thread and Numba gets the cores.
# (Takes effect only when this module is imported before NumPy; set it yourself otherwise.)
# Numba's OpenMP workers also spin between kernels; when another process holds a core they
# spin against it (a 5 us kernel then takes 8 ms). Passive waiting costs nothing measurable.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np  # noqa: E402
import numba  # noqa: E402
from numba import njit, prange, types  # noqa: E402
from numba.extending import overload  # noqa: E402

LN_EPS = 1e-5
GELU_C = math.sqrt(2.0 / math.pi)  # tanh-approximation constant of GELU
# Numba kernels may reorder sums and fuse multiply-adds (so row reductions vectorise); never full
# fastmath, which assumes no NaN or inf. Kernels take constants in their input's precision,
# f = x.dtype.type: a Python float is float64 and would turn every float32 operation into float64.
FASTMATH = {"reassoc", "contract"}
INITS = ("gpt2", "fan-in")  # Config.init: how init_params draws the weights


# ----------------------------------------------------------------------------
# e^x for the kernels
#
# Numba compiles math.exp to one call into the C library per element, so a loop over exp never
# runs 8 lanes at a time (the vector math library Numba could use is not among our dependencies).
# exp32 is e^x in float32 written with nothing but multiply-adds, a rounding and an integer
# shift, which the compiler does vectorise: 5-10x faster than math.exp in the kernels' loops.

LOG2E = 1.4426950408889634         # 1 / ln 2
LN2_HI = 0.693145751953125         # ln 2 = LN2_HI + LN2_LO; LN2_HI = 22713 / 2^15 has 15 significant
LN2_LO = 1.4286068202862268e-06    # bits, so n * LN2_HI is exact in float32 for every |n| < 2^9


@njit(cache=True, fastmath=FASTMATH)
def exp32(x):
    """e^x for a float32 x, within 1.5e-7 relative (about one float32 step) wherever e^x is a normal
    float32; 0 for x < -87.33 (the normal range ends at -87.34), inf above it, NaN for NaN.
        x = n ln2 + r with n = round(x / ln2), |r| <= ln2 / 2, so e^x = 2^n e^r;
        e^r = sum_k r^k / k! up to k = 7 (the rest is below 7e-9 relative);
        2^n = 2^n1 2^n2 with n1 = n // 2, each made as the float32 bit pattern (m + 127) << 23."""
    f = np.float32
    y = min(max(x, f(-87.33)), f(89.0))             # 2^n1 and 2^n2 stay normal floats
    n = np.floor(y * f(LOG2E) + f(0.5))             # nearest integer to y / ln 2
    r = (y - n * f(LN2_HI)) - n * f(LN2_LO)         # y - n ln 2, |r| <= ln2 / 2
    p = f(1 / 5040)                                  # Horner: 1 + r (1 + r/2 (1 + r/3 (... r/7)))
    for c in (f(1 / 720), f(1 / 120), f(1 / 24), f(1 / 6), f(0.5), f(1), f(1)):
        p = p * r + c
    n1 = np.int32(n) >> 1
    n2 = np.int32(n) - n1
    e = p * np.int32((n1 + 127) << 23).view(np.float32) * np.int32((n2 + 127) << 23).view(np.float32)
    if x < f(-87.33):                                # e^x below the smallest normal float32: flush to 0
        e = f(0)
    if x != x:                                       # NaN in, NaN out
        e = x
    return e


def fast_exp(x):
    """e^x inside the kernels: exp32 for a float32 x, math.exp for anything else (float64 checks).
    Run as plain Python (NUMBA_DISABLE_JIT=1) it is math.exp."""
    return math.exp(x)


@overload(fast_exp)
def _fast_exp_compiled(x):
    if x == types.float32:
        return lambda x: exp32(x)
    return lambda x: math.exp(x)


# ----------------------------------------------------------------------------
# how many threads a kernel gets
#
# Starting a parallel loop wakes Numba's sleeping worker thread (its OpenMP threads wait
# passively, see the top of the module): about 76 us on this 2-core machine, against 12 us for
# running the loop held to one thread (`python bench.py` prints both). A kernel that takes t us
# on one thread and runs s times faster on two is quicker on one thread when
#     t + 12 < t / s + 76,   i.e.   t < 64 / (1 - 1/s),
# and the bench's kernels run about 1.5x faster on two threads, so the line is near 200 us:
# a kernel estimated under PARALLEL_MIN_US on one thread runs on the calling thread alone. Each
# call site estimates that time as items x ns_per_item, the kernel's one-thread time per item in
# the bench. With OMP_WAIT_POLICY=active the workers spin instead of sleeping, a parallel loop
# starts in about 2 us (less than switching to one thread), and every kernel takes all threads.
# For the same reason a kernel has one parallel loop and no more: inside a parallel kernel,
# np.zeros is a parallel loop of its own, waking the worker again. So the kernels allocate their
# outputs empty, and the iteration that owns a row zeroes it.

PARALLEL_MIN_US = 0.0 if os.environ.get("OMP_WAIT_POLICY", "").lower() == "active" else 200.0


def run_kernel(kernel, items, ns_per_item, *args):
    """kernel(*args), on one thread if its estimated one-thread time, items * ns_per_item
    nanoseconds, is under PARALLEL_MIN_US."""
    threads = numba.get_num_threads()
    if items * ns_per_item >= PARALLEL_MIN_US * 1e3 or threads == 1:
        return kernel(*args)
    numba.set_num_threads(1)
    try:
        return kernel(*args)
    finally:
        numba.set_num_threads(threads)


# ----------------------------------------------------------------------------
# configuration

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
    sawtooth's lookup needs to leave its plateau (README, sawtooth)."""
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


def sinusoidal_positions(T, C, dtype="float64"):
    """Fixed sinusoidal table (T, C): sin on even channels, cos on odd (Vaswani et al.)."""
    pos = np.arange(T)[:, None]                                  # (T, 1)
    freq = np.exp(-math.log(10000.0) * (np.arange(0, C, 2) / C))  # (ceil(C/2),)
    table = np.zeros((T, C))
    table[:, 0::2] = np.sin(pos * freq)
    table[:, 1::2] = np.cos(pos * freq[: C // 2])
    return table.astype(dtype)


# ----------------------------------------------------------------------------
# embedding

def embedding_forward(wte, wpe, tokens):
    """tokens (B, T) int -> x (B, T, C) = wte[tokens] + wpe[:T]; wpe is a table (T', C)."""
    T = tokens.shape[1]
    return wte[tokens] + wpe[None, :T], tokens


def scatter_add_ref(rows, idx, V):
    """rows (N, C), idx (N,) ints in 0..V-1 -> out (V, C) with out[v] = sum of rows[n] where idx[n] = v."""
    out = np.zeros((V, rows.shape[1]), dtype=rows.dtype)
    np.add.at(out, idx, rows)
    return out


@njit(cache=True)
def scatter_add_kernel(rows, idx, V):
    """Numba twin of scatter_add_ref: one pass over the rows (np.add.at is slow on many rows)."""
    N, C = rows.shape
    out = np.zeros((V, C), dtype=rows.dtype)
    for n in range(N):
        for c in range(C):
            out[idx[n], c] += rows[n, c]
    return out


def embedding_backward(dx, tokens, V):
    """dx (B, T, C) -> dwte (V, C), dwpe (T, C). Rows that share a token add up."""
    C = dx.shape[-1]
    idx = np.ascontiguousarray(tokens.reshape(-1))
    if idx.size and (idx.min() < 0 or idx.max() >= V):      # the kernel does not bounds-check
        raise ValueError(f"token ids must lie in 0..{V - 1}, got {idx.min()}..{idx.max()}")
    dwte = scatter_add_kernel(np.ascontiguousarray(dx.reshape(-1, C)), idx, V)
    dwpe = dx.sum(axis=0)                                        # (T, C)
    return dwte, dwpe


# ----------------------------------------------------------------------------
# linear layer: matrix products by BLAS, the rows split over threads
#
# BLAS runs with one thread (see the top of the module). A large product is cut into blocks of
# rows, one per Numba thread (numba.get_num_threads(), so NUMBA_NUM_THREADS pins both), and each
# block is one BLAS call; NumPy releases the GIL inside it, so the blocks run at the same time.
# With more than one thread, dW = x^T dout adds its row blocks' partial sums, so the last bits of a
# result depend on the thread count (a run is bit-identical only at the same NUMBA_NUM_THREADS).

SPLIT_FLOPS = 1 << 22      # multiply-adds; smaller products go to BLAS whole (handing out blocks costs more)
_pool = None               # ThreadPoolExecutor, created on first use


def _blocks(N):
    nt = min(numba.get_num_threads(), N)
    return [(N * c // nt, N * (c + 1) // nt) for c in range(nt)]


def _split(N, K, M):
    """Is an (N, K) @ (K, M) product worth cutting into row blocks?"""
    return N * K * M >= SPLIT_FLOPS and numba.get_num_threads() > 1 and N > 0


def _run_blocks(jobs):
    """Run the calls in jobs, the first on this thread and the rest on the pool; wait for all."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=max(1, numba.config.NUMBA_NUM_THREADS - 1))
    futures = [_pool.submit(job) for job in jobs[1:]]
    jobs[0]()
    for fut in futures:
        fut.result()


def matmul(a, b):
    """a (N, K) @ b (K, M) -> (N, M); out[rows] = a[rows] @ b for each block of rows."""
    N, M = a.shape[0], b.shape[1]
    if not _split(N, a.shape[1], M):
        return a @ b
    out = np.empty((N, M), dtype=np.result_type(a, b))
    _run_blocks([lambda lo=lo, hi=hi: np.matmul(a[lo:hi], b, out=out[lo:hi]) for lo, hi in _blocks(N)])
    return out


def matmul_tn(a, b):
    """a (N, K), b (N, M) -> a^T b (K, M), a sum over rows: each block sums its rows, then the blocks add."""
    N, K, M = a.shape[0], a.shape[1], b.shape[1]
    if not _split(N, K, M):
        return a.T @ b
    blocks = _blocks(N)
    part = np.empty((len(blocks), K, M), dtype=np.result_type(a, b))
    _run_blocks([lambda c=c, lo=lo, hi=hi: np.matmul(a[lo:hi].T, b[lo:hi], out=part[c])
                 for c, (lo, hi) in enumerate(blocks)])
    return part.sum(axis=0)


def linear_forward(x, w, b):
    """x (..., Cin), w (Cin, Cout), b (Cout,) -> out = x @ w + b (..., Cout), cache x."""
    out = matmul(np.ascontiguousarray(x.reshape(-1, w.shape[0])), w)
    out += b
    return out.reshape(x.shape[:-1] + (w.shape[1],)), x


def linear_backward(dout, x, w):
    """Forward was out = x @ w + b, so dx = dout @ w^T, dw = x^T dout, db = sum dout."""
    Cin, Cout = w.shape
    x2 = np.ascontiguousarray(x.reshape(-1, Cin))
    d2 = np.ascontiguousarray(dout.reshape(-1, Cout))
    dx = matmul(d2, w.T).reshape(x.shape)
    return dx, matmul_tn(x2, d2), d2.sum(axis=0)


# ----------------------------------------------------------------------------
# LayerNorm:  y = g * (x - mean) * rstd + b,   rstd = 1 / sqrt(var + eps)

def layernorm_forward_ref(x, g, b):
    """x (N, C) -> y (N, C), mean (N,), rstd (N,)."""
    mean = x.mean(axis=-1)
    var = ((x - mean[:, None]) ** 2).mean(axis=-1)
    rstd = 1.0 / np.sqrt(var + LN_EPS)
    xhat = (x - mean[:, None]) * rstd[:, None]
    return (xhat * g + b).astype(x.dtype), mean.astype(x.dtype), rstd.astype(x.dtype)


def layernorm_backward_ref(dy, x, mean, rstd, g):
    """Returns dx (N, C), dg (C,), db (C,). With xhat the normalised input and dxhat = dy * g:
    dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),  dg = sum_n dy xhat,  db = sum_n dy."""
    xhat = (x - mean[:, None]) * rstd[:, None]
    dxhat = dy * g
    dx = rstd[:, None] * (dxhat - dxhat.mean(-1, keepdims=True)
                          - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx.astype(x.dtype), (dy * xhat).sum(axis=0).astype(x.dtype), dy.sum(axis=0)


@njit(cache=True, parallel=True, fastmath=FASTMATH)
def layernorm_forward_kernel(x, g, b, eps):
    """Numba twin of layernorm_forward_ref; one row per parallel iteration."""
    N, C = x.shape
    f = x.dtype.type
    y = np.empty_like(x)
    mean = np.empty(N, dtype=x.dtype)
    rstd = np.empty(N, dtype=x.dtype)
    for n in prange(N):
        m = f(0)
        for c in range(C):
            m += x[n, c]
        m /= f(C)
        v = f(0)
        for c in range(C):
            d = x[n, c] - m
            v += d * d
        r = f(1) / math.sqrt(v / f(C) + f(eps))
        for c in range(C):
            y[n, c] = (x[n, c] - m) * r * g[c] + b[c]
        mean[n] = m
        rstd[n] = r
    return y, mean, rstd


@njit(cache=True, parallel=True, fastmath=FASTMATH)
def layernorm_backward_kernel(dy, x, mean, rstd, g):
    """Numba twin of layernorm_backward_ref. dg and db sum over rows, so the rows are cut into 16
    blocks (fixed, so the sums do not depend on the thread count), each summed into its own partial
    by one thread; the partials add up at the end."""
    N, C = x.shape
    f = x.dtype.type
    nt = min(N, 16)
    dx = np.empty_like(x)
    dg = np.empty((nt, C), dtype=x.dtype)
    db = np.empty((nt, C), dtype=x.dtype)
    for t in prange(nt):
        for c in range(C):
            dg[t, c] = f(0)
            db[t, c] = f(0)
        for n in range(N * t // nt, N * (t + 1) // nt):
            m, r = mean[n], rstd[n]
            s1 = f(0)  # sum_c dxhat
            s2 = f(0)  # sum_c dxhat * xhat
            for c in range(C):
                xhat = (x[n, c] - m) * r
                dxhat = dy[n, c] * g[c]
                s1 += dxhat
                s2 += dxhat * xhat
                dg[t, c] += dy[n, c] * xhat
                db[t, c] += dy[n, c]
            s1 /= f(C)
            s2 /= f(C)
            for c in range(C):
                xhat = (x[n, c] - m) * r
                dx[n, c] = r * (dy[n, c] * g[c] - s1 - xhat * s2)
    dg_sum = np.empty(C, dtype=x.dtype)
    db_sum = np.empty(C, dtype=x.dtype)
    for c in range(C):                                      # dg = sum over blocks of their partials
        sg, sb = f(0), f(0)                                 # (the same blocks for any thread count)
        for t in range(nt):
            sg += dg[t, c]
            sb += db[t, c]
        dg_sum[c], db_sum[c] = sg, sb
    return dx, dg_sum, db_sum


def layernorm_forward(x, g, b):
    """x (..., C) -> y (..., C), cache."""
    shape = x.shape
    x2 = np.ascontiguousarray(x.reshape(-1, shape[-1]))
    y, mean, rstd = run_kernel(layernorm_forward_kernel, x2.size, 0.5, x2, g, b, LN_EPS)
    return y.reshape(shape), (x2, mean, rstd, g, shape)


def layernorm_backward(dy, cache):
    """-> dx (..., C), dg (C,), db (C,)."""
    x2, mean, rstd, g, shape = cache
    dy2 = np.ascontiguousarray(dy.reshape(-1, shape[-1]))
    dx, dg, db = run_kernel(layernorm_backward_kernel, x2.size, 0.5, dy2, x2, mean, rstd, g)
    return dx.reshape(shape), dg, db


# ----------------------------------------------------------------------------
# GELU (tanh approximation):  y = 0.5 x (1 + tanh(c (x + 0.044715 x^3)))

def gelu_forward_ref(x):
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + 0.044715 * x ** 3)))


def gelu_backward_ref(dy, x):
    """dy/dx = 0.5 (1 + tanh z) + 0.5 x (1 - tanh^2 z) c (1 + 3 * 0.044715 x^2)."""
    z = GELU_C * (x + 0.044715 * x ** 3)
    t = np.tanh(z)
    dz = GELU_C * (1.0 + 3 * 0.044715 * x ** 2)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dz)


# The kernels use the exact identity 0.5 (1 + tanh z) = 1 / (1 + exp(-2z)) = sigma(2z):
# exp in float32 is several times faster than tanh, and y = x sigma(2z).

@njit(cache=True, parallel=True, fastmath=FASTMATH)
def gelu_forward_kernel(x):
    """x (N, M) -> y (N, M); Numba twin of gelu_forward_ref, as y = x / (1 + exp(-2z))."""
    N, M = x.shape
    f = x.dtype.type
    c, a, one = f(GELU_C), f(0.044715), f(1)
    y = np.empty_like(x)
    for n in prange(N):
        for m in range(M):
            xi = x[n, m]
            z = c * (xi + a * xi * xi * xi)
            y[n, m] = xi / (one + fast_exp(-(z + z)))
    return y


@njit(cache=True, parallel=True, fastmath=FASTMATH)
def gelu_backward_kernel(dy, x):
    """Numba twin of gelu_backward_ref. With s = sigma(2z) = 0.5 (1 + tanh z), 1 - tanh^2 z = 4 s (1 - s):
    dy/dx = s + 2 x s (1 - s) dz."""
    N, M = x.shape
    f = x.dtype.type
    c, a, one = f(GELU_C), f(0.044715), f(1)
    dx = np.empty_like(x)
    for n in prange(N):
        for m in range(M):
            xi = x[n, m]
            z = c * (xi + a * xi * xi * xi)
            s = one / (one + fast_exp(-(z + z)))
            dz = c * (one + f(3) * a * xi * xi)
            dx[n, m] = dy[n, m] * (s + f(2) * xi * s * (one - s) * dz)
    return dx


def gelu_forward(x):
    shape = x.shape
    x2 = np.ascontiguousarray(x.reshape(-1, shape[-1]))
    return run_kernel(gelu_forward_kernel, x2.size, 1.5, x2).reshape(shape), x2


def gelu_backward(dy, x2):
    dy2 = np.ascontiguousarray(dy.reshape(x2.shape))
    return run_kernel(gelu_backward_kernel, x2.size, 1.6, dy2, x2).reshape(dy.shape)


# ----------------------------------------------------------------------------
# softmax (last axis), stable: subtract the row maximum

def softmax_ref(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@njit(cache=True, parallel=True, fastmath=FASTMATH)
def softmax_kernel(s):
    """s (N, K) -> rows of probabilities; Numba twin of softmax_ref."""
    N, K = s.shape
    f = s.dtype.type
    p = np.empty_like(s)
    for n in prange(N):
        mx = s[n, 0]
        for k in range(1, K):
            mx = max(mx, s[n, k])
        z = f(0)
        for k in range(K):
            e = fast_exp(s[n, k] - mx)
            p[n, k] = e
            z += e
        rz = f(1) / z
        for k in range(K):
            p[n, k] *= rz
    return p


def softmax(s):
    """Rows of s (N, K) -> probabilities, by softmax_kernel."""
    s = np.ascontiguousarray(s)
    return run_kernel(softmax_kernel, s.size, 1.6, s)


# ----------------------------------------------------------------------------
# causal multi-head attention core, per (batch, head):
#   s_ij = q_i . k_j / sqrt(hs)  (j <= i),  alpha_ij = softmax_j s_ij,  o_i = sum_j alpha_ij v_j

def attention_forward_ref(q, k, v):
    """q, k, v (B, NH, T, hs) -> o (B, NH, T, hs), alpha (B, NH, T, T) (zero above the diagonal)."""
    T, hs = q.shape[-2], q.shape[-1]
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(hs)                # (B, NH, T, T)
    causal = np.tril(np.ones((T, T), dtype=bool))
    s = np.where(causal, s, -np.inf)
    alpha = softmax_ref(s)                                         # (B, NH, T, T)
    return alpha @ v, alpha


def advantage_routing(u, alpha, v):
    """E-step. u (..., T, hs), alpha (..., T, T), v (..., T, hs) -> ds = dL/ds (..., T, T).
    Each row of ds sums to zero: attention is redistributed, not created."""
    b = u @ np.swapaxes(v, -1, -2)                                 # (..., T, T)  b_ij = u_i . v_j
    b_bar = (alpha * b).sum(axis=-1, keepdims=True)                # (..., T, 1)  b_bar_i = sum_j alpha_ij b_ij
    return alpha * (b - b_bar)                                     # ds_ij = alpha_ij (b_ij - b_bar_i)


def value_update(u, alpha):
    """M-step. dv_j = sum_i alpha_ij u_i: each value moves toward the errors of the queries that use it."""
    return np.swapaxes(alpha, -1, -2) @ u                          # (..., T, hs)


def attention_backward_ref(u, alpha, q, k, v):
    """u = dL/do (B, NH, T, hs) -> dq, dk, dv; the E-step and M-step in NumPy."""
    hs = q.shape[-1]
    ds = advantage_routing(u, alpha, v)                            # E-step: advantage routing law
    dv = value_update(u, alpha)                                    # M-step: responsibility-weighted value update
    dq = ds @ k / math.sqrt(hs)                                    # dq_i = sum_j ds_ij k_j / sqrt(hs)
    dk = np.swapaxes(ds, -1, -2) @ q / math.sqrt(hs)               # dk_j = sum_i ds_ij q_i / sqrt(hs)
    return dq, dk, dv


@njit(cache=True, parallel=True, fastmath=FASTMATH)
def attention_forward_kernel(q, k, v):
    """Numba twin of attention_forward_ref; one (batch, head) per parallel iteration: two small
    matrix products (BLAS) around a causal softmax that never touches j > i."""
    B, NH, T, hs = q.shape
    f = q.dtype.type
    o = np.empty_like(q)
    alpha = np.empty((B, NH, T, T), dtype=q.dtype)
    scale = f(1.0 / math.sqrt(hs))
    for bh in prange(B * NH):
        bb, h = bh // NH, bh % NH
        s = q[bb, h] @ k[bb, h].T                           # (T, T)  q_i . k_j, unscaled; only j <= i is read
        for i in range(T):
            # alpha_ij = softmax over j <= i of s_ij / sqrt(hs), stable: subtract the row maximum
            mx = s[i, 0]
            for j in range(1, i + 1):
                mx = max(mx, s[i, j])
            z = f(0)
            for j in range(i + 1):
                e = fast_exp((s[i, j] - mx) * scale)
                alpha[bb, h, i, j] = e
                z += e
            rz = f(1) / z
            for j in range(i + 1):
                alpha[bb, h, i, j] *= rz                    # alpha_ij
            for j in range(i + 1, T):
                alpha[bb, h, i, j] = f(0)                   # no attention to the future
        o[bb, h] = alpha[bb, h] @ v[bb, h]                  # o_i = sum_j alpha_ij v_j
    return o, alpha


@njit(cache=True, parallel=True, fastmath=FASTMATH)
def attention_backward_kernel(u, alpha, q, k, v):
    """Numba twin of attention_backward_ref. Each (batch, head) owns its dq, dk, dv."""
    B, NH, T, hs = q.shape
    f = q.dtype.type
    dq = np.empty_like(q)
    dk = np.empty_like(k)
    dv = np.empty_like(v)
    scale = f(1.0 / math.sqrt(hs))
    for bh in prange(B * NH):
        bb, h = bh // NH, bh % NH
        for t in range(T):
            for c in range(hs):
                dq[bb, h, t, c] = f(0)
                dk[bb, h, t, c] = f(0)
                dv[bb, h, t, c] = f(0)
        b = np.empty(T, dtype=q.dtype)
        for i in range(T):
            # b_ij = u_i . v_j and b_bar_i = sum_j alpha_ij b_ij
            b_bar = f(0)
            for j in range(i + 1):
                bij = f(0)
                for c in range(hs):
                    bij += u[bb, h, i, c] * v[bb, h, j, c]
                b[j] = bij
                b_bar += alpha[bb, h, i, j] * bij
            for j in range(i + 1):
                a = alpha[bb, h, i, j]
                ds = a * (b[j] - b_bar)                     # E-step: advantage routing law
                for c in range(hs):
                    dv[bb, h, j, c] += a * u[bb, h, i, c]   # M-step: dv_j += alpha_ij u_i
                    dq[bb, h, i, c] += ds * k[bb, h, j, c] * scale   # dq_i += ds_ij k_j / sqrt(hs)
                    dk[bb, h, j, c] += ds * q[bb, h, i, c] * scale   # dk_j += ds_ij q_i / sqrt(hs)
    return dq, dk, dv


def attention_forward(q, k, v):
    """-> o, alpha by attention_forward_kernel; one thread takes about 0.5 ns per (i, j <= i, channel)."""
    return run_kernel(attention_forward_kernel, q.size * (q.shape[2] + 1) / 2, 0.5, q, k, v)


def attention_backward(u, alpha, q, k, v):
    """-> dq, dk, dv by attention_backward_kernel; about 0.5 ns per (i, j <= i, channel) on one thread."""
    return run_kernel(attention_backward_kernel, q.size * (q.shape[2] + 1) / 2, 0.5, u, alpha, q, k, v)


def split_heads(x, NH):
    """(B, T, C) -> (B, NH, T, hs), contiguous."""
    B, T, C = x.shape
    return np.ascontiguousarray(x.reshape(B, T, NH, C // NH).transpose(0, 2, 1, 3))


def merge_heads(x):
    """(B, NH, T, hs) -> (B, T, C)."""
    B, NH, T, hs = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, NH * hs)


# ----------------------------------------------------------------------------
# softmax + cross-entropy at supervised positions, loss in nats
#   loss = sum_n w_n * (-sum_k p_nk log softmax(z_n)_k) / sum_n w_n
#   dz_n = w_n * (softmax(z_n) * sum_k p_nk - p_n) / sum_n w_n

def cross_entropy_ref(logits, targets, weights):
    """logits (N, K); targets (N,) ints or (N, K) probabilities; weights (N,) -> loss, dlogits."""
    K = logits.shape[-1]
    if targets.ndim == 1:
        targets = np.eye(K, dtype=logits.dtype)[targets]
    z = logits - logits.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    wsum = max(float(weights.sum()), 1e-12)
    loss = -(weights[:, None] * targets * logp).sum() / wsum
    dlogits = weights[:, None] * (np.exp(logp) * targets.sum(-1, keepdims=True) - targets) / wsum
    return float(loss), dlogits.astype(logits.dtype)


@njit(cache=True, parallel=True, fastmath=FASTMATH)
def cross_entropy_kernel(logits, targets, weights, wsum):
    """Soft-target Numba twin of cross_entropy_ref; returns per-row loss (N,) and dlogits."""
    N, K = logits.shape
    f = logits.dtype.type
    rows = np.empty(N)
    dlogits = np.empty_like(logits)
    for n in prange(N):
        if weights[n] == 0.0:                               # an unsupervised position: no loss, no gradient
            rows[n] = 0.0
            for k in range(K):
                dlogits[n, k] = f(0)
            continue
        mx = logits[n, 0]
        for k in range(1, K):
            mx = max(mx, logits[n, k])
        z = f(0)
        for k in range(K):
            e = fast_exp(logits[n, k] - mx)
            dlogits[n, k] = e                               # softmax(z_n)_k * z, normalised below
            z += e
        logz = math.log(z) + mx
        ptot = f(0)
        loss = 0.0
        for k in range(K):
            ptot += targets[n, k]
            if targets[n, k] != 0.0:
                loss -= targets[n, k] * (logits[n, k] - logz)
        w = weights[n] / wsum
        rows[n] = w * loss
        for k in range(K):
            dlogits[n, k] = f(w) * (dlogits[n, k] / z * ptot - targets[n, k])
    return rows, dlogits


@njit(cache=True, parallel=True, fastmath=FASTMATH)
def cross_entropy_hard_kernel(logits, targets, weights, wsum):
    """Hard-target (class index) version: p is one-hot, so loss_n = logsumexp(z_n) - z_n[y_n]."""
    N, K = logits.shape
    f = logits.dtype.type
    rows = np.empty(N)
    dlogits = np.empty_like(logits)
    for n in prange(N):
        if weights[n] == 0.0:                               # an unsupervised position: no loss, no gradient
            rows[n] = 0.0
            for k in range(K):
                dlogits[n, k] = f(0)
            continue
        mx = logits[n, 0]
        for k in range(1, K):
            mx = max(mx, logits[n, k])
        z = f(0)
        for k in range(K):
            e = fast_exp(logits[n, k] - mx)
            dlogits[n, k] = e                               # softmax(z_n)_k * z, normalised below
            z += e
        logz = math.log(z) + mx
        w = weights[n] / wsum
        rows[n] = w * (logz - logits[n, targets[n]])
        wz = f(w) / z
        for k in range(K):
            dlogits[n, k] *= wz                             # w_n softmax(z_n)_k / sum w
        dlogits[n, targets[n]] -= f(w)                      # minus w_n onehot(y_n) / sum w
    return rows, dlogits


def cross_entropy(logits, targets, mask):
    """logits (B, T, K); targets (B, T) ints or (B, T, K) probs; mask (B, T) -> loss (nats), dlogits."""
    B, T, K = logits.shape
    z = np.ascontiguousarray(logits.reshape(-1, K))
    w = np.ascontiguousarray(mask.reshape(-1), dtype=np.float64)
    wsum = max(float(w.sum()), 1e-12)
    if targets.ndim == 2:
        if targets.size and (targets.min() < 0 or targets.max() >= K):  # the kernel does not bounds-check
            raise ValueError(f"class targets must lie in 0..{K - 1}, got {targets.min()}..{targets.max()}")
        y = np.ascontiguousarray(targets.reshape(-1), dtype=np.int64)
        rows, dz = run_kernel(cross_entropy_hard_kernel, z.size, 3.0, z, y, w, wsum)
    else:
        p = np.ascontiguousarray(targets.reshape(-1, K), dtype=logits.dtype)
        rows, dz = run_kernel(cross_entropy_kernel, z.size, 3.0, z, p, w, wsum)
    return float(rows.sum()), dz.reshape(B, T, K)


def bits(nats):
    """Convert nats to bits."""
    return nats / math.log(2.0)


# ----------------------------------------------------------------------------
# the model

def position_rows(cfg, T):
    """Row of the learned position table used at each t < T: t itself, or with a pos_limit the last
    trained row for every t past it (a time-homogeneous task then sees "one more step", not an
    untrained row)."""
    t = np.arange(T)
    return np.minimum(t, cfg.pos_limit - 1) if cfg.pos_limit else t


def position_table(params, cfg, T):
    if T > cfg.max_len and cfg.pos == "learned":
        raise ValueError(f"sequence length {T} exceeds max_len={cfg.max_len} of learned positions")
    if cfg.pos == "learned":
        return params["wpe"][position_rows(cfg, T)]
    return sinusoidal_positions(T, cfg.d_model, cfg.dtype)


def forward(params, tokens, cfg, head_mask=None):
    """tokens (B, T) int -> logits (B, T, K), cache.

    head_mask: optional (L, NH) array multiplying each head's output (1 keeps, 0 ablates).
    cache["layers"][l] holds for layer l: "x_in" (B,T,C) residual stream entering the block,
    "q","k","v" (B,NH,T,hs), "alpha" (B,NH,T,T), "head_out" (B,NH,T,hs), "attn_out" (B,T,C)
    (after the output projection), "x_mid" (B,T,C), "x_out" (B,T,C). cache["resid"] lists the
    residual stream before each block and after the last.
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
    dwte, dwpe = embedding_backward(dx, cache["tokens"], cfg.vocab_size)
    g["wte"] = dwte
    if cfg.pos == "learned":
        # clamped positions share a row, so their gradients add up
        g["wpe"] = scatter_add_kernel(dwpe, position_rows(cfg, cache["T"]), params["wpe"].shape[0])
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
        dpre = gelu_backward(dact, lc["pre_act"].reshape(-1, cfg.d_mlp))
        dh2, g[pre + "mlp.w1"], g[pre + "mlp.b1"] = linear_backward(dpre, lc["h2"], params[pre + "mlp.w1"])
        dh, g[pre + "ln2.g"], g[pre + "ln2.b"] = layernorm_backward(dh2, lc["ln2"])
        dx = dx + dh                                                   # x_mid feeds both the residual and LN2
        # forward: x_mid = x_in + y @ W_o + b_o
        dy, g[pre + "attn.wo"], g[pre + "attn.bo"] = linear_backward(dx, lc["y"], params[pre + "attn.wo"])
        u = split_heads(dy, NH)                                        # (B, NH, T, hs)  u = dL/d head output
        if cache["head_mask"] is not None:
            u = u * np.asarray(cache["head_mask"][l], dtype=u.dtype)[None, :, None, None]
        dq, dk, dv = attention_backward(u, lc["alpha"], lc["q"], lc["k"], lc["v"])
        dh = np.zeros_like(lc["h1"])
        for name, d in (("q", dq), ("k", dk), ("v", dv)):
            d = merge_heads(d)                                         # (B, T, C)
            dhn, g[pre + f"attn.w{name}"], g[pre + f"attn.b{name}"] = linear_backward(
                d, lc["h1"], params[pre + f"attn.w{name}"])
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
        out.append(softmax_ref(logits.astype(np.float64)))
    return np.concatenate(out)


# ----------------------------------------------------------------------------
# optimiser: AdamW (decoupled weight decay), global-norm clipping, warm-up + cosine

def default_decay(name):
    """Weight decay applies to matrices (projections, embeddings), not to biases or LayerNorm gains."""
    return name.endswith((".wq", ".wk", ".wv", ".wo", ".w1", ".w2", ".w", ".wte", ".wpe")) or name in ("wte", "wpe")


def adamw_init(params):
    return {"t": 0,
            "m": {k: np.zeros_like(v) for k, v in params.items()},
            "v": {k: np.zeros_like(v) for k, v in params.items()}}


def adamw_step(params, grads, state, lr, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0,
               decay=default_decay, lr_scale=None):
    """One AdamW step, in place on params and state:
        m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,  mhat = m / (1 - b1^t),  vhat = v / (1 - b2^t)
        p = p - lr * (mhat / (sqrt(vhat) + eps) + wd * p)      (wd only where decay(name))
    lr_scale: optional dict name -> factor multiplying lr for that tensor (two-timescale schedules)."""
    state["t"] += 1
    t = state["t"]
    for name, p in params.items():
        gr = grads[name]
        m, v = state["m"][name], state["v"][name]
        m *= beta1
        m += (1 - beta1) * gr
        v *= beta2
        v += (1 - beta2) * gr * gr
        mhat = m / (1 - beta1 ** t)
        vhat = v / (1 - beta2 ** t)
        step_lr = lr * (lr_scale.get(name, 1.0) if lr_scale else 1.0)
        if weight_decay and decay(name):
            p -= step_lr * weight_decay * p
        p -= step_lr * mhat / (np.sqrt(vhat) + eps)


def clip_grad_norm(grads, max_norm):
    """Scale all gradients in place so that their global L2 norm is at most max_norm; return the norm before."""
    norm = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
    if max_norm and norm > max_norm:
        for g in grads.values():
            g *= max_norm / (norm + 1e-12)
    return norm


def lr_schedule(step, max_lr, warmup, total, min_lr=0.0):
    """Linear warm-up over `warmup` steps, then cosine decay to min_lr at `total` steps (step counts from 0)."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def count_params(params):
    return int(sum(v.size for v in params.values()))


# ----------------------------------------------------------------------------
# checkpoints: one .npz holding the config, the parameters, optionally the AdamW state
# and a JSON "meta" dict (task, step, ...). Written atomically: temporary file, then rename.

def save_checkpoint(path, params, cfg, meta=None, opt_state=None):
    import json
    import tempfile
    arrays = {"config": np.array(json.dumps(cfg.to_dict())), "meta": np.array(json.dumps(meta or {}))}
    arrays.update({f"param:{k}": v for k, v in params.items()})
    if opt_state is not None:
        arrays["adam_t"] = np.array(opt_state["t"])
        arrays.update({f"adam_m:{k}": v for k, v in opt_state["m"].items()})
        arrays.update({f"adam_v:{k}": v for k, v in opt_state["v"].items()})
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".ckpt-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load_checkpoint(path):
    """-> (params, cfg, meta, opt_state or None). Raises ValueError with one clear line if unreadable."""
    import json
    import zipfile
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
        fields = json.loads(str(data["config"]))
        if "width" in fields:                                   # the MLP baseline's config
            from mlp_baseline import MLPConfig
            cfg = MLPConfig(**fields)
        else:
            cfg = Config(**fields)
        meta = json.loads(str(data["meta"]))
    except FileNotFoundError:
        raise ValueError(f"checkpoint {path!r} does not exist") from None
    except (OSError, KeyError, ValueError, TypeError, zipfile.BadZipFile, EOFError) as e:
        raise ValueError(f"checkpoint {path!r} is truncated or not a bayesattn checkpoint ({type(e).__name__})") from None
    params = {k[len("param:"):]: v for k, v in data.items() if k.startswith("param:")}
    opt_state = None
    if "adam_t" in data:
        opt_state = {"t": int(data["adam_t"]),
                     "m": {k[len("adam_m:"):]: v for k, v in data.items() if k.startswith("adam_m:")},
                     "v": {k[len("adam_v:"):]: v for k, v in data.items() if k.startswith("adam_v:")}}
    return params, cfg, meta, opt_state
