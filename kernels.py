"""kernels: the fast twins of the ops in layers.py, bayesattn.py and optim.py, same names, same signatures, and the
one switch that runs them with every family's own twins.

Numba loops for the ops NumPy runs slowly (LayerNorm, GELU, the causal attention with its softmax and its
E-step/M-step backward, softmax + cross-entropy, the embedding's scatter-add, AdamW's update), and the
matrix products of the linear layer spread over threads. Each twin computes what its NumPy op's
docstring says; test_bayesattn.py checks every pair against each other and by finite differences.
`with enabled():` runs the models on these twins inside the block (train.py does, unless --kernels
numpy) and restores the switch after it. A family's twins live beside it in its own module (the family's
TWINS names it; models.py loads it with the family), which uses the Numba machinery here and hands its
twins to add_twins when imported: enabled() merges them with these, and a name twinned twice fails there. What each trick buys is measured by `python -m bench.transformer`
(docs/PERFORMANCE.md); none of it changes a formula.

Numba conventions: @njit(cache=True); parallel kernels have exactly one prange loop, over an axis
that owns its writes (a second parallel loop, e.g. an np.zeros inside, wakes the worker thread
again); fastmath only {'reassoc', 'contract'} (full fastmath assumes no NaN); constants in the
input's precision, f = x.dtype.type, so float32 stays float32. NUMBA_DISABLE_JIT=1 runs every
kernel as the plain Python it is written in.
"""

import ctypes
import math
import os
import sys

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import overload

import layers
from layers import GELU_C, LN_EPS

FASTMATH = {"reassoc", "contract"}
NUMPY_ERRORS = "numpy"   # error_model of a kernel that divides inside its loop: x / 0 gives inf or NaN, as in NumPy,
                         # instead of Numba's check that raises, a branch that stops the loop vectorising (the
                         # LSTM's sigmoid ran 26x slower with it)
TWINS = ("embedding_backward", "linear_forward", "linear_backward", "layernorm_forward", "layernorm_backward",
         "gelu_forward", "gelu_backward", "cross_entropy", "attention_forward", "attention_backward",
         "adamw_update")


FAMILY_TWINS = {}   # op name -> twin, from the families' twins modules (add_twins)


def add_twins(module_name, twins):
    """Register a family's twins ({op name: function}) from its module; ValueError on a name already twinned."""
    for name in twins:
        if name in TWINS or FAMILY_TWINS.get(name, twins[name]) is not twins[name]:
            where = "kernels" if name in TWINS else FAMILY_TWINS[name].__module__
            raise ValueError(f"twin {name!r} of {module_name} is taken already by {where}: rename one")
    FAMILY_TWINS.update(twins)
    if layers.FAST:             # loaded while the fast path is on (inside enabled()): its twins join at once; else a
        layers.FAST.update(twins)   # family first loaded inside the block would run its NumPy ops without a word


def twins():
    """{op name: twin} of every op with a twin: the ones here and those of every family's twins module loaded.
    RuntimeError if an op marked @twin has none loaded (its family's twins module was never imported): the
    fast path would otherwise run that op's NumPy code without a word."""
    table = {name: globals()[name] for name in TWINS} | FAMILY_TWINS
    missing = sorted(set(layers.TWINNED) - set(table))
    if missing:
        raise RuntimeError(f"op {missing[0]!r} of {layers.TWINNED[missing[0]]} has no twin loaded: import the "
                           f"module its family's TWINS names (models.module() does)")
    return table


def enabled():
    """A context: within it every op with a twin runs the twin (the fast path); after it, what ran before.
    A family whose module is first loaded inside the block joins it (add_twins)."""
    return layers.use_twins(twins())


# ----------------------------------------------------------------------------
# memory: glibc's malloc hands every block over 128 KiB (a step's activations and gradients, hundreds of
# them) fresh pages from the kernel (mmap) and gives them back on free, so each such array costs a page
# fault for every 4 KiB the first time it is written, step after step (glibc raises its threshold itself as
# large blocks are freed, so what follows buys 0.81-1.28x the step in noisy runs, docs/PERFORMANCE.md;
# one earlier run said 1.4-1.5x). Raising the threshold to glibc's ceiling keeps freed
# blocks in the heap for the next step's arrays. Process-wide (PyTorch in the bench gets it too); elsewhere
# than glibc, or with BAYESATTN_MALLOPT=0, nothing changes.

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # mallopt's parameter numbers (glibc's malloc.h)
MMAP_THRESHOLD = 32 << 20                      # glibc's largest allowed on 64 bits: larger blocks are still mmapped
TRIM_THRESHOLD = 256 << 20                     # free memory kept at the heap's top before it is given back


def keep_freed_memory():
    """Ask glibc to serve large arrays from the heap and keep what is freed (above). -> True if it took."""
    if os.environ.get("BAYESATTN_MALLOPT", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt        # the C library this process already runs on
    except AttributeError:                         # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


MALLOPT = keep_freed_memory()


# ----------------------------------------------------------------------------
# e^x: Numba compiles math.exp to one C-library call per element, which never runs 8 lanes at a
# time. exp32 is e^x in float32 from multiply-adds, a rounding and an integer shift, which the
# compiler does vectorise (GELU, the attention's softmax and the loss are several times faster).

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


EXP32 = os.environ.get("BAYESATTN_EXP32", "1") != "0"   # "0": math.exp everywhere (bench/transformer.py --tricks, with
                                                         # a fresh NUMBA_CACHE_DIR: the cache does not see it)


@overload(fast_exp)
def _fast_exp_compiled(x):
    if x == types.float32 and EXP32:
        return lambda x: exp32(x)
    return lambda x: math.exp(x)


TANH_SERIES = 0.3   # tanh32 below this |x|: the series (its first left-out term, 1382 x^11 / 155925, is under
                    # 6e-8 of x there); above it (1 - e) / (1 + e) with e = e^(-2|x|) no longer cancels badly


@njit(cache=True, fastmath=FASTMATH, error_model=NUMPY_ERRORS, inline="always")
def tanh32(x):
    """tanh x for a float32 x, from exp32 (Numba compiles np.tanh to one C-library call per element, which never
    vectorises): within about 2 float32 steps. |x| < TANH_SERIES: x - x^3/3 + 2x^5/15 - 17x^7/315 + 62x^9/2835;
    above: sign(x) (1 - e) / (1 + e), e = e^(-2|x|) (1 for |x| > 43.7, where e underflows). Both are computed
    and one selected, so a loop of them vectorises."""
    f = np.float32
    ax = abs(x)
    e = exp32(f(-2) * ax)
    t = (f(1) - e) / (f(1) + e)
    t = t if x >= f(0) else -t
    x2 = x * x
    s = x * (f(1) + x2 * (f(-1 / 3) + x2 * (f(2 / 15) + x2 * (f(-17 / 315) + x2 * f(62 / 2835)))))
    return s if ax < f(TANH_SERIES) else t


@njit(cache=True, fastmath=FASTMATH, error_model=NUMPY_ERRORS, inline="always")
def sigmoid1(a, one):
    """sigmoid of one number a (one: 1 in a's precision), with exp of -|a| so nothing overflows."""
    e = fast_exp(-abs(a))
    r = one / (one + e)
    return r if a >= 0 else e * r              # one division: a conditional between two compiled much slower


def fast_tanh(x):
    """tanh x inside the kernels: tanh32 for a float32 x, math.tanh for anything else (float64 checks).
    Run as plain Python (NUMBA_DISABLE_JIT=1) it is math.tanh."""
    return math.tanh(x)


@overload(fast_tanh)
def _fast_tanh_compiled(x):
    if x == types.float32 and EXP32:
        return lambda x: tanh32(x)
    return lambda x: math.tanh(x)


# ----------------------------------------------------------------------------
# how many threads a kernel gets. At OpenMP's default the worker spins a while after a parallel loop before
# it sleeps, so starting the next loop costs about 3 us: with t the one-thread time and s the two-thread
# speed-up (about 1.5), two threads win once t > 3 us / (1 - 1/s) ~ 9 us. Below 20 us (about twice that) a
# kernel runs on the calling thread: on an idle machine that costs a few microseconds at most, and where
# the other core is busy (another run, a build), a parallel loop waits for a worker that is not running:
# the gradient checks of test_bayesattn.py, whose kernels take microseconds, ran 148 s with every kernel
# parallel beside two training runs and 54 s with this limit (27 s either way with the machine idle). At the
# default and paper presets every kernel is estimated above it but transport's loss (11 us) and the bijection
# paper preset's LayerNorms (19.5 us; that preset trains on one thread): `python -m bench.scaling --table kernels`. Where the user sets OMP_WAIT_POLICY=passive the worker
# sleeps at once and waking it costs more (`python -m bench.transformer` prints both): one thread wins when
# t + 12 us < t / s + 76 us, i.e. t < 64 us / (1 - 1/s) ~ 200 us.

PARALLEL_MIN_US = 200.0 if os.environ.get("OMP_WAIT_POLICY", "").lower() == "passive" else 20.0


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
# embedding backward: rows of dx added into the rows of wte their tokens picked

@njit(cache=True)
def scatter_add_kernel(rows, idx, V):
    """rows (N, C), idx (N,) in 0..V-1 -> out (V, C), out[v] = sum of the rows n with idx[n] = v, in one pass."""
    N, C = rows.shape
    out = np.zeros((V, C), dtype=rows.dtype)
    for n in range(N):
        for c in range(C):
            out[idx[n], c] += rows[n, c]
    return out



def embedding_backward(dx, cache):
    """Twin of layers.embedding_backward: the scatter-add in one pass (np.add.at is slow on many rows)."""
    tokens, V = cache
    C = dx.shape[-1]
    idx = np.ascontiguousarray(np.asarray(tokens).reshape(-1))
    if idx.size and (idx.min() < 0 or idx.max() >= V):      # the kernel does not bounds-check
        raise ValueError(f"token ids must lie in 0..{V - 1}, got {idx.min()}..{idx.max()}")
    return scatter_add_kernel(np.ascontiguousarray(dx.reshape(-1, C)), idx, V), dx.sum(axis=0)


# ----------------------------------------------------------------------------
# linear layer: BLAS runs with one thread, and a Numba parallel loop hands each of its threads one BLAS call
# (np.dot with an out array, inside the loop: Numba calls the OpenBLAS that SciPy ships, NumPy its own build
# of it). Forward, a large product is cut into blocks of rows, one block a thread; backward, the layer's two
# products dx = dout W^T and dW = x^T dout (the same multiply-adds) run one on each thread, each whole
# (cutting both by rows instead: the step 0.97-1.03x as fast, `python -m bench.transformer --tricks`), and
# on one or two threads dW's bits do not depend on the thread count (the two libraries agree bit for bit at
# one BLAS thread; test_bayesattn.py checks it at a preset's shape). matmul_tn, cut by rows, adds its blocks' partial sums, so its last bits
# do (matmul_pair cuts its products so on more than two threads). The loop's other thread is OpenMP's own
# worker, which is awake where the workers spin: a Python thread handing over the second call cost about
# 105 us a product and shared a core with that worker (docs/PERFORMANCE.md).

PRODUCTS = ("matmul", "matmul_tn", "matmul_pair")   # the layers' matrix products (the benches time them apart)
SPLIT_FLOPS = 1 << 25      # multiply-adds: a smaller product goes to BLAS whole (handing out row blocks costs more)
PAIR_FLOPS = 1 << 24       # the same for matmul_pair's products side by side; both read off the products' table
                           # of the preset shapes, `python -m bench.transformer --products` (docs/PERFORMANCE.md)


@njit(cache=True, parallel=True)
def rows_kernel(a, b, out, bounds):
    """out[lo:hi] = a[lo:hi] @ b for each block of rows [bounds[c], bounds[c + 1]), one block an iteration."""
    for c in prange(bounds.shape[0] - 1):
        lo, hi = bounds[c], bounds[c + 1]
        np.dot(a[lo:hi], b, out[lo:hi])


@njit(cache=True, parallel=True)
def rows_tn_kernel(a, b, part, bounds):
    """part[c] = a[lo:hi]^T b[lo:hi] for each block of rows, one block an iteration."""
    for c in prange(bounds.shape[0] - 1):
        lo, hi = bounds[c], bounds[c + 1]
        np.dot(a[lo:hi].T, b[lo:hi], part[c])


@njit(cache=True, parallel=True)
def pair_kernel(a, b, ab, xt, y, xty):
    """ab = a @ b and xty = xt @ y, one product an iteration."""
    for i in prange(2):
        if i == 0:
            np.dot(a, b, ab)
        else:
            np.dot(xt, y, xty)


def _bounds(N):
    nt = min(numba.get_num_threads(), N)
    return np.array([N * c // nt for c in range(nt + 1)], dtype=np.int64)


def _split(N, K, M, threshold=None, *arrays):
    """Is an (N, K) @ (K, M) product worth cutting into row blocks (or, with threshold PAIR_FLOPS, worth a
    thread)? Only where every array has one floating type (BLAS's, and Numba's np.dot, take no mixtures)."""
    return (N * K * M >= (SPLIT_FLOPS if threshold is None else threshold) and numba.get_num_threads() > 1
            and N > 0 and len({x.dtype for x in arrays}) == 1 and arrays[0].dtype in (np.float32, np.float64))


def matmul(a, b):
    """a (N, K) @ b (K, M) -> (N, M); out[rows] = a[rows] @ b for each block of rows."""
    N, M = a.shape[0], b.shape[1]
    if not _split(N, a.shape[1], M, None, a, b):
        return a @ b
    out = np.empty((N, M), dtype=a.dtype)
    rows_kernel(a, b, out, _bounds(N))
    return out


def matmul_tn(a, b):
    """a (N, K), b (N, M) -> a^T b (K, M), a sum over rows: each block sums its rows, then the blocks add."""
    N, K, M = a.shape[0], a.shape[1], b.shape[1]
    if not _split(N, K, M, None, a, b):
        return a.T @ b
    bounds = _bounds(N)
    part = np.empty((len(bounds) - 1, K, M), dtype=a.dtype)
    rows_tn_kernel(a, b, part, bounds)
    return part.sum(axis=0)


def matmul_pair(a, b, x, y):
    """(a @ b, x^T y), two independent products: when the first is large, one on each of two threads, each by
    one whole BLAS call. With more than two threads, products large enough to cut (SPLIT_FLOPS) are each cut
    by rows instead."""
    N, K, M = a.shape[0], a.shape[1], b.shape[1]
    if numba.get_num_threads() > 2 and _split(N, K, M, None, a, b, x, y):     # more threads than products
        return matmul(a, b), matmul_tn(x, y)
    if not _split(N, K, M, PAIR_FLOPS, a, b, x, y):
        return a @ b, x.T @ y
    ab, xty = np.empty((N, M), dtype=a.dtype), np.empty((x.shape[1], y.shape[1]), dtype=a.dtype)
    pair_kernel(a, b, ab, x.T, y, xty)
    return ab, xty


def linear_forward(x, w, b):
    """Twin of layers.linear_forward."""
    out = matmul(np.ascontiguousarray(x.reshape(-1, w.shape[0])), w)
    out += b
    return out.reshape(x.shape[:-1] + (w.shape[1],)), (x, w)


def linear_backward(dout, cache):
    """Twin of layers.linear_backward."""
    x, w = cache
    Cin, Cout = w.shape
    x2 = np.ascontiguousarray(x.reshape(-1, Cin))
    d2 = np.ascontiguousarray(dout.reshape(-1, Cout))
    dx, dw = matmul_pair(d2, w.T, x2, d2)
    return dx.reshape(x.shape), dw, d2.sum(axis=0)


# ----------------------------------------------------------------------------
# LayerNorm

@njit(cache=True, parallel=True, fastmath=FASTMATH)
def layernorm_forward_kernel(x, g, b, eps):
    """x (N, C) -> y, mean (N,), rstd (N,) of layers.layernorm_forward; one row per parallel iteration."""
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
    """layers.layernorm_backward as loops. dg and db sum over rows, so the rows are cut into 16
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
    """Twin of layers.layernorm_forward (the same cache)."""
    shape = x.shape
    x2 = np.ascontiguousarray(x.reshape(-1, shape[-1]))
    y, mean, rstd = run_kernel(layernorm_forward_kernel, x2.size, 0.5, x2, g, b, LN_EPS)
    return y.reshape(shape), (x2, mean, rstd, g, shape)


def layernorm_backward(dy, cache):
    """Twin of layers.layernorm_backward."""
    x2, mean, rstd, g, shape = cache
    dy2 = np.ascontiguousarray(dy.reshape(-1, shape[-1]))
    dx, dg, db = run_kernel(layernorm_backward_kernel, x2.size, 0.5, dy2, x2, mean, rstd, g)
    return dx.reshape(shape), dg, db


# ----------------------------------------------------------------------------
# GELU
# The kernels use the exact identity 0.5 (1 + tanh z) = 1 / (1 + exp(-2z)) = sigma(2z):
# exp in float32 is several times faster than tanh, and y = x sigma(2z).

@njit(cache=True, parallel=True, fastmath=FASTMATH)
def gelu_forward_kernel(x):
    """x (N, M) -> y (N, M) of layers.gelu_forward, as y = x / (1 + exp(-2z)), and s = 1 / (1 + exp(-2z)) =
    (1 + tanh z) / 2, which the backward reads."""
    N, M = x.shape
    f = x.dtype.type
    c, a, one = f(GELU_C), f(0.044715), f(1)
    y = np.empty_like(x)
    sig = np.empty_like(x)
    for n in prange(N):
        for m in range(M):
            xi = x[n, m]
            z = c * (xi + a * xi * xi * xi)
            d = one + fast_exp(-(z + z))
            y[n, m] = xi / d                    # x / d, not x * (1 / d): another rounding, other bits
            sig[n, m] = one / d
    return y, sig


@njit(cache=True, parallel=True, fastmath=FASTMATH)
def gelu_backward_kernel(dy, x, sig):
    """layers.gelu_backward as a loop, from x and the forward's s = sigma(2z) = (1 + tanh z) / 2, since
    1 - tanh^2 z = 4 s (1 - s): dy/dx = s + 2 x s (1 - s) dz."""
    N, M = x.shape
    f = x.dtype.type
    c, a, one = f(GELU_C), f(0.044715), f(1)
    dx = np.empty_like(x)
    for n in prange(N):
        for m in range(M):
            xi, s = x[n, m], sig[n, m]
            dz = c * (one + f(3) * a * xi * xi)
            dx[n, m] = dy[n, m] * (s + f(2) * xi * s * (one - s) * dz)
    return dx



def gelu_forward(x):
    """Twin of layers.gelu_forward. Its cache holds x and s = (1 + tanh z) / 2 where the NumPy op's holds tanh z
    (the twin's backward reads s, so the twins' bits are those of the backward that computed s itself; a cache
    goes only to the backward of its own path)."""
    x2 = np.ascontiguousarray(x.reshape(-1, x.shape[-1]))
    y, s = run_kernel(gelu_forward_kernel, x2.size, 1.5, x2)
    return y.reshape(x.shape), (x, s.reshape(x.shape))


def gelu_backward(dy, cache):
    """Twin of layers.gelu_backward, on the twin's cache (x, s)."""
    x, s = cache
    x2 = np.ascontiguousarray(x.reshape(-1, x.shape[-1]))
    s2 = np.ascontiguousarray(s.reshape(x2.shape))
    dy2 = np.ascontiguousarray(dy.reshape(x2.shape))
    return run_kernel(gelu_backward_kernel, x2.size, 0.6, dy2, x2, s2).reshape(dy.shape)


# ----------------------------------------------------------------------------
# causal attention, one (batch, head) per parallel iteration: the E-step and M-step of
# bayesattn.attention_backward as loops

@njit(cache=True, parallel=True, fastmath=FASTMATH)
def attention_forward_kernel(q, k, v):
    """bayesattn.attention_forward as loops; one (batch, head) per parallel iteration: two small
    matrix products (BLAS) around a causal softmax that never touches j > i. o comes out as (B, T, NH, hv),
    the heads side by side (the wrapper hands it on as the (B, NH, T, hv) view)."""
    B, NH, T, hs = q.shape
    f = q.dtype.type
    o = np.empty((B, T, NH, v.shape[3]), dtype=q.dtype)   # the values may be wider than the keys (dynamics/onehead.py)
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
        o[bb, :, h] = alpha[bb, h] @ v[bb, h]               # o_i = sum_j alpha_ij v_j
    return o, alpha


@njit(cache=True, parallel=True, fastmath=FASTMATH)
def attention_backward_kernel(u, alpha, q, k, v):
    """bayesattn.attention_backward as loops (the E-step and M-step fused). Each (batch, head) owns its dq, dk, dv.
    q, k (B, NH, T, hs); v, u (B, NH, T, hv): the values may be wider than the keys (dynamics/onehead.py)."""
    B, NH, T, hs = q.shape
    hv = v.shape[3]
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
            for c in range(hv):
                dv[bb, h, t, c] = f(0)
        b = np.empty(T, dtype=q.dtype)
        for i in range(T):
            # b_ij = u_i . v_j and b_bar_i = sum_j alpha_ij b_ij
            b_bar = f(0)
            for j in range(i + 1):
                bij = f(0)
                for c in range(hv):
                    bij += u[bb, h, i, c] * v[bb, h, j, c]
                b[j] = bij
                b_bar += alpha[bb, h, i, j] * bij
            for j in range(i + 1):
                a = alpha[bb, h, i, j]
                ds = a * (b[j] - b_bar)                     # E-step: advantage routing law
                for c in range(hv):
                    dv[bb, h, j, c] += a * u[bb, h, i, c]   # M-step: dv_j += alpha_ij u_i
                for c in range(hs):
                    dq[bb, h, i, c] += ds * k[bb, h, j, c] * scale   # dq_i += ds_ij k_j / sqrt(hs)
                    dk[bb, h, j, c] += ds * q[bb, h, i, c] * scale   # dk_j += ds_ij q_i / sqrt(hs)
    return dq, dk, dv



def heads_view(x):
    """(B, T, NH, hs) -> the (B, NH, T, hs) view of it: merging the heads back (bayesattn.merge_heads, before W_o) is
    then free, where a contiguous (B, NH, T, hs) array is copied."""
    return x.transpose(0, 2, 1, 3)


def attention_forward(q, k, v):
    """Twin of bayesattn.attention_forward; about 0.5 ns per (i, j <= i, channel) on one thread."""
    o, alpha = run_kernel(attention_forward_kernel, q.size * (q.shape[2] + 1) / 2, 0.5, q, k, v)
    return heads_view(o), alpha


def attention_backward(u, alpha, q, k, v):
    """Twin of bayesattn.attention_backward. (Its outputs stay (B, NH, T, .) arrays: written as the heads side by
    side, as the forward's are, the kernel ran 15-30% slower at the four shapes tried, docs/PERFORMANCE.md.)"""
    return run_kernel(attention_backward_kernel, q.size * (q.shape[2] + 1) / 2, 0.5, u, alpha, q, k, v)


# ----------------------------------------------------------------------------
# softmax + cross-entropy

@njit(cache=True, fastmath=FASTMATH)
def exp_row(logits, n, out):
    """out[n] = exp(z_n - max z_n), the unnormalised softmax of row n -> (its sum z, logsumexp(z_n))."""
    K = logits.shape[1]
    mx = logits[n, 0]
    for k in range(1, K):
        mx = max(mx, logits[n, k])
    z = logits.dtype.type(0)
    for k in range(K):
        e = fast_exp(logits[n, k] - mx)
        out[n, k] = e
        z += e
    return z, math.log(z) + mx


@njit(cache=True, parallel=True, fastmath=FASTMATH)
def cross_entropy_kernel(logits, targets, weights, wsum):
    """layers.cross_entropy with soft targets p (N, K), rows flattened; -> per-row loss (N,), dlogits."""
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
        z, logz = exp_row(logits, n, dlogits)              # dlogits[n] = softmax(z_n) * z, normalised below
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
        z, logz = exp_row(logits, n, dlogits)              # dlogits[n] = softmax(z_n) * z, normalised below
        w = weights[n] / wsum
        rows[n] = w * (logz - logits[n, targets[n]])
        wz = f(w) / z
        for k in range(K):
            dlogits[n, k] *= wz                             # w_n softmax(z_n)_k / sum w
        dlogits[n, targets[n]] -= f(w)                      # minus w_n onehot(y_n) / sum w
    return rows, dlogits



def cross_entropy(logits, targets, mask):
    """Twin of layers.cross_entropy."""
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


# ----------------------------------------------------------------------------
# AdamW: one pass over a tensor instead of NumPy's ten, the same operations in the same order (no fastmath:
# no fused multiply-add), so the same bits

@njit(cache=True, error_model=NUMPY_ERRORS)
def adamw_update_kernel(p, g, m, v, lr, beta1, beta2, c1, c2, eps, weight_decay):
    """optim.adamw_update on flat arrays, with c1 = 1 - beta1^t and c2 = 1 - beta2^t."""
    f = p.dtype.type
    lr_wd = lr * weight_decay
    for n in range(p.size):
        gn = g[n]
        mn = f(beta1) * m[n] + f(1 - beta1) * gn
        vn = f(beta2) * v[n] + f(1 - beta2) * gn * gn
        m[n], v[n] = mn, vn
        pn = p[n] - f(lr_wd) * p[n] if weight_decay != 0 else p[n]     # as the NumPy op: at lr 0 too
        p[n] = pn - f(lr) * (mn / f(c1)) / (np.sqrt(vn / f(c2)) + f(eps))


def adamw_update(p, g, m, v, lr, beta1, beta2, t, eps, weight_decay):
    """Twin of optim.adamw_update. Arrays it cannot update through a flat view (not C-contiguous) are updated as
    contiguous copies, copied back. A gradient of another dtype than its parameter is refused (NumPy would
    compute in the wider one: other bits)."""
    if g.dtype != p.dtype:
        raise ValueError(f"adamw_update: a gradient of dtype {g.dtype} for a parameter of dtype {p.dtype}: they must match")
    if not (p.flags.c_contiguous and m.flags.c_contiguous and v.flags.c_contiguous):
        copies = [np.ascontiguousarray(a) for a in (p, m, v)]
        adamw_update(copies[0], g, *copies[1:], lr, beta1, beta2, t, eps, weight_decay)
        p[...], m[...], v[...] = copies
        return
    adamw_update_kernel(p.reshape(-1), np.ascontiguousarray(g).reshape(-1), m.reshape(-1), v.reshape(-1), lr, beta1,
                        beta2, 1 - beta1 ** t, 1 - beta2 ** t, eps, weight_decay)
