"""mamba_twins: the fast twins of families/mamba.py's selective scan and of the SiLU and softplus around it, same names,
same signatures, the same cache.

mamba.selective_scan_forward / _backward loop over time in NumPy, allocating (B, D, N) arrays at every step.
The twins run the same recurrences as loops over (t, d, n), one sequence of the batch per parallel iteration
(each owns its states, y, dx, ddt, dB and dC; dA, a sum over the batch, goes into a partial per sequence that
the wrapper adds up). The equations are families/mamba.py's, line for line:
    forward   h_t = a_t h_{t-1} + dt_t x_t B_t,  a_t = exp(dt_t A);   y_t = C_t . h_t + Dskip x_t
    backward  g_t = dy_t C_t + a_{t+1} g_{t+1};  dB_t, dC_t, dx_t, ddt_t, dA from g_t, h_t, h_{t-1}
SiLU forward and backward and the softplus's backward (a sigmoid) are one loop each. The Numba conventions
are kernels.py's; tests/test_lstm_mamba.py checks each twin against its NumPy op in float32
and float64.
"""

import numpy as np
from numba import njit, prange

import kernels
from kernels import FASTMATH, fast_exp, run_kernel, sigmoid1

TWINS = ("selective_scan_forward", "selective_scan_backward", "silu_forward", "silu_backward", "softplus_backward")


@njit(cache=True, parallel=True, fastmath=FASTMATH)
def scan_forward_kernel(x, dt, A, Bm, Cm, Dskip):
    """mamba.selective_scan_forward as loops -> y (B, T, D), hs (B, T, D, N)."""
    B, T, D = x.shape
    N = A.shape[1]
    f = x.dtype.type
    y = np.empty_like(x)
    hs = np.empty((B, T, D, N), dtype=x.dtype)
    for bb in prange(B):
        h0 = np.empty((D, N), dtype=x.dtype)                 # h_0 = 0
        for d in range(D):
            for n in range(N):
                h0[d, n] = f(0)
        for t in range(T):
            hp = hs[bb, t - 1] if t > 0 else h0              # h_{t-1} (D, N): no branch on t in the inner loop
            for d in range(D):
                dtv, xv = dt[bb, t, d], x[bb, t, d]
                acc = f(0)
                for n in range(N):
                    h = fast_exp(dtv * A[d, n]) * hp[d, n] + dtv * xv * Bm[bb, t, n]   # h_t = a_t h_{t-1} + dt_t x_t B_t
                    hs[bb, t, d, n] = h
                    acc += Cm[bb, t, n] * h
                y[bb, t, d] = acc + Dskip[d] * xv                                # y_t = C_t . h_t + Dskip x_t
    return y, hs


@njit(cache=True, parallel=True, fastmath=FASTMATH)
def scan_backward_kernel(dy, x, dt, A, Bm, Cm, Dskip, hs):
    """mamba.selective_scan_backward as loops -> dx, ddt (B, T, D), dA per sequence (B, D, N), dBm, dCm (B, T, N)."""
    B, T, D = x.shape
    N = A.shape[1]
    f = x.dtype.type
    dx, ddt = np.empty_like(x), np.empty_like(x)
    dBm, dCm = np.empty_like(Bm), np.empty_like(Cm)
    dA = np.empty((B, D, N), dtype=x.dtype)
    for bb in prange(B):
        g = np.empty((D, N), dtype=x.dtype)                  # a_{t+1} g_{t+1}, 0 past the end
        h0 = np.empty((D, N), dtype=x.dtype)                 # h_0 = 0
        for d in range(D):
            for n in range(N):
                g[d, n] = f(0)
                h0[d, n] = f(0)
                dA[bb, d, n] = f(0)
        for t in range(T - 1, -1, -1):
            hp = hs[bb, t - 1] if t > 0 else h0              # h_{t-1} (D, N): no branch on t in the inner loop
            for n in range(N):
                dBm[bb, t, n] = f(0)
                dCm[bb, t, n] = f(0)
            for d in range(D):
                dyv, dtv, xv = dy[bb, t, d], dt[bb, t, d], x[bb, t, d]
                gB = f(0)                                    # sum_n g_t B_t
                dadt = f(0)                                  # sum_n dL/d(dt_t A) A
                for n in range(N):
                    dCm[bb, t, n] += dyv * hs[bb, t, d, n]   # dC_t = sum_d dy_t h_t
                    gv = g[d, n] + dyv * Cm[bb, t, n]        # g_t = dy_t C_t + a_{t+1} g_{t+1}
                    gB += gv * Bm[bb, t, n]
                    dBm[bb, t, n] += gv * dtv * xv           # dB_t = sum_d g_t dt_t x_t
                    a = fast_exp(dtv * A[d, n])
                    da = gv * hp[d, n] * a                   # dL/d(dt_t A) = g_t h_{t-1} a_t
                    dadt += da * A[d, n]
                    dA[bb, d, n] += da * dtv
                    g[d, n] = a * gv                         # what step t sends back to h_{t-1}
                dx[bb, t, d] = gB * dtv + Dskip[d] * dyv
                ddt[bb, t, d] = dadt + gB * xv
    return dx, ddt, dA, dBm, dCm


def selective_scan_forward(x, dt, A, Bm, Cm, Dskip):
    """Twin of mamba.selective_scan_forward: the same output and cache."""
    x, dt, Bm, Cm = (np.ascontiguousarray(a) for a in (x, dt, Bm, Cm))
    y, hs = run_kernel(scan_forward_kernel, x.size * A.shape[1], 10.0, x, dt, A, Bm, Cm, Dskip)
    return y, (x, dt, A, Bm, Cm, Dskip, hs)


def selective_scan_backward(dy, cache):
    """Twin of mamba.selective_scan_backward."""
    x, dt, A, Bm, Cm, Dskip, hs = cache
    dx, ddt, dA, dBm, dCm = run_kernel(scan_backward_kernel, x.size * A.shape[1], 10.0, np.ascontiguousarray(dy),
                                       x, dt, A, Bm, Cm, Dskip, hs)
    return dx, ddt, dA.sum(axis=0), dBm, dCm, (dy * x).sum(axis=(0, 1))


# ----------------------------------------------------------------------------
# the elementwise ops around the scan: NumPy's take several passes and temporaries for each (np.where, exp,
# two divisions); each is one loop here

@njit(cache=True, parallel=True, fastmath=FASTMATH)
def silu_forward_kernel(x):
    """x (N, M) -> y = x sigmoid(x), s = sigmoid(x) (N, M): mamba.silu_forward."""
    N, M = x.shape
    one = x.dtype.type(1)
    y, s = np.empty_like(x), np.empty_like(x)
    for n in prange(N):
        for m in range(M):
            sv = sigmoid1(x[n, m], one)
            s[n, m] = sv
            y[n, m] = x[n, m] * sv
    return y, s


@njit(cache=True, parallel=True, fastmath=FASTMATH)
def silu_backward_kernel(dy, x, s):
    """dy, x, s = sigmoid(x) (N, M) -> dx = dy s (1 + x (1 - s)): mamba.silu_backward."""
    N, M = x.shape
    one = x.dtype.type(1)
    dx = np.empty_like(x)
    for n in prange(N):
        for m in range(M):
            dx[n, m] = dy[n, m] * s[n, m] * (one + x[n, m] * (one - s[n, m]))
    return dx


@njit(cache=True, parallel=True, fastmath=FASTMATH)
def softplus_backward_kernel(dy, x):
    """dy, x (N, M) -> dx = dy sigmoid(x): mamba.softplus_backward."""
    N, M = x.shape
    one = x.dtype.type(1)
    dx = np.empty_like(x)
    for n in prange(N):
        for m in range(M):
            dx[n, m] = dy[n, m] * sigmoid1(x[n, m], one)
    return dx


def rows(a):
    """a (..., M) as a contiguous (rows, M) array."""
    return np.ascontiguousarray(a.reshape(-1, a.shape[-1]))


def silu_forward(x):
    """Twin of mamba.silu_forward: the same output and cache (x, sigmoid(x))."""
    y, s = run_kernel(silu_forward_kernel, x.size, 1.0, rows(x))
    return y.reshape(x.shape), (x, s.reshape(x.shape))


def silu_backward(dy, cache):
    """Twin of mamba.silu_backward."""
    x, s = cache
    return run_kernel(silu_backward_kernel, x.size, 0.5, rows(dy), rows(x), rows(s)).reshape(x.shape)


def softplus_backward(dy, cache):
    """Twin of mamba.softplus_backward (cache: x)."""
    x = cache
    return run_kernel(softplus_backward_kernel, x.size, 1.0, rows(dy), rows(x)).reshape(x.shape)


kernels.add_twins(__name__, {name: globals()[name] for name in TWINS})
