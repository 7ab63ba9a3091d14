"""lstm_twins: the fast twins of lstm.py's recurrence, same names, same signatures, the same cache.

lstm.lstm_forward / lstm_backward loop the step in NumPy, one small product and a dozen elementwise ops per
time step. The twins take the input half of the gate product out of the loop (x W_x for every t in one
product), run the gates and the cell of each step in one Numba loop, and in the backward collect every step's
gate gradient da_t first, so that dx, dW and db are three products over all steps instead of 3T small ones:
    a_t = x_t W_x + h_{t-1} W_h + b,   W = [W_x; W_h]            (the step's one product, split by rows)
    dW = [x, h_prev]^T da,   dx = da W_x^T,   dh_{t-1} += da_t W_h^T   (summed over t by the products)
Each twin returns what its NumPy op returns (lstm_forward's cache: the step caches in time order), so the two
paths can be swapped at any op; test_lstm_mamba.py checks each pair in float32 and float64. The Numba
conventions are kernels.py's.
"""

import numpy as np
from numba import njit

import kernels
from kernels import FASTMATH, fast_exp, matmul, matmul_tn

TWINS = ("lstm_forward", "lstm_backward")


@njit(cache=True, fastmath=FASTMATH)
def sigmoid1(a, one):
    """sigmoid of one number a (one: 1 in a's precision), with exp of -|a| so nothing overflows."""
    e = fast_exp(-abs(a))
    r = one / (one + e)
    return r if a >= 0 else e * r              # one division: a conditional between two compiled much slower


@njit(cache=True, fastmath=FASTMATH)
def lstm_forward_kernel(ax, wh):
    """ax (B, T, 4C) = x W_x + b for every step, wh (C, 4C) -> h, c_prev, tanh c (B, T, C), gates (B, T, 4C)
    holding i, f, g, o after their nonlinearities: the step of lstm.lstm_step_forward, looped over t."""
    B, T, C4 = ax.shape
    C = C4 // 4
    one = ax.dtype.type(1)
    hs = np.empty((B, T, C), dtype=ax.dtype)
    c_prev = np.empty((B, T, C), dtype=ax.dtype)
    tcs = np.empty((B, T, C), dtype=ax.dtype)
    gates = np.empty((B, T, C4), dtype=ax.dtype)
    h = np.zeros((B, C), dtype=ax.dtype)
    c = np.zeros((B, C), dtype=ax.dtype)
    for t in range(T):
        a = h @ wh                                           # (B, 4C)  h_{t-1} W_h
        for bb in range(B):
            for j in range(C):
                i = sigmoid1(ax[bb, t, j] + a[bb, j], one)
                fg = sigmoid1(ax[bb, t, C + j] + a[bb, C + j], one)
                g = np.tanh(ax[bb, t, 2 * C + j] + a[bb, 2 * C + j])
                o = sigmoid1(ax[bb, t, 3 * C + j] + a[bb, 3 * C + j], one)
                c_prev[bb, t, j] = c[bb, j]
                cn = fg * c[bb, j] + i * g                   # c_t = f c_{t-1} + i g
                tc = np.tanh(cn)
                c[bb, j] = cn
                h[bb, j] = o * tc                            # h_t = o tanh(c_t)
                hs[bb, t, j] = o * tc
                tcs[bb, t, j] = tc
                gates[bb, t, j], gates[bb, t, C + j], gates[bb, t, 2 * C + j], gates[bb, t, 3 * C + j] = i, fg, g, o
    return hs, c_prev, tcs, gates


@njit(cache=True, fastmath=FASTMATH)
def lstm_backward_kernel(dh, c_prev, tcs, gates, whT):
    """dh (B, T, C), the forward's c_prev, tanh c (B, T, C) and gates (B, T, 4C), whT = W_h^T (4C, C) -> da
    (B, T, 4C), the gradient of every step's gate pre-activations: lstm.lstm_step_backward looped in reverse
    time, dh_next = da_t W_h^T and dc_next = dc_t f_t carried from step t to step t-1."""
    B, T, C = dh.shape
    f = dh.dtype.type
    da = np.empty((B, T, 4 * C), dtype=dh.dtype)
    dh_next = np.zeros((B, C), dtype=dh.dtype)
    dc_next = np.zeros((B, C), dtype=dh.dtype)
    for t in range(T - 1, -1, -1):
        for bb in range(B):
            for j in range(C):
                i, fg, g, o = gates[bb, t, j], gates[bb, t, C + j], gates[bb, t, 2 * C + j], gates[bb, t, 3 * C + j]
                tc = tcs[bb, t, j]
                dht = dh[bb, t, j] + dh_next[bb, j]
                do = dht * tc                                            # h = o tanh(c)
                dc = dc_next[bb, j] + dht * o * (f(1) - tc * tc)
                dc_next[bb, j] = dc * fg                                 # c = f c_prev + i g
                da[bb, t, j] = dc * g * i * (f(1) - i)                   # di, through the sigmoid
                da[bb, t, C + j] = dc * c_prev[bb, t, j] * fg * (f(1) - fg)
                da[bb, t, 2 * C + j] = dc * i * (f(1) - g * g)           # dg, through the tanh
                da[bb, t, 3 * C + j] = do * o * (f(1) - o)
        dh_next = np.ascontiguousarray(da[:, t]) @ whT                   # (B, C)  what step t sends to h_{t-1}
    return da


def lstm_forward(x, w, b):
    """Twin of lstm.lstm_forward: the same output and cache."""
    B, T, Cin = x.shape
    C = w.shape[1] // 4
    ax = matmul(np.ascontiguousarray(x.reshape(-1, Cin)), w[:Cin]) + b          # (B T, 4C)  x_t W_x + b
    hs, c_prev, tcs, gates = lstm_forward_kernel(ax.reshape(B, T, 4 * C), np.ascontiguousarray(w[Cin:]))
    h_prev = np.concatenate([np.zeros((B, 1, C), dtype=x.dtype), hs[:, :-1]], axis=1)
    xh = np.concatenate([x, h_prev], axis=2)                                     # (B, T, Cin + C)
    steps = [((xh[:, t], w), c_prev[:, t], gates[:, t, :C], gates[:, t, C:2 * C], gates[:, t, 2 * C:3 * C],
              gates[:, t, 3 * C:], tcs[:, t]) for t in range(T)]
    return hs, steps


def lstm_backward(dh, cache):
    """Twin of lstm.lstm_backward: the gate gradients of every step in one reverse-time loop, then dx, dW, db
    as products over all steps."""
    steps = cache
    B, T, C = dh.shape
    w = steps[0][0][1]
    Cin = w.shape[0] - C
    xh = np.stack([s[0][0] for s in steps], axis=1)                              # (B, T, Cin + C)
    c_prev = np.stack([s[1] for s in steps], axis=1)                             # (B, T, C)
    gates = np.concatenate([np.stack([s[k] for s in steps], axis=1) for k in range(2, 6)], axis=2)  # (B, T, 4C)
    tcs = np.stack([s[6] for s in steps], axis=1)
    da = lstm_backward_kernel(np.ascontiguousarray(dh), c_prev, tcs, gates, np.ascontiguousarray(w[Cin:].T))
    da2 = da.reshape(B * T, 4 * C)
    dx = matmul(da2, np.ascontiguousarray(w[:Cin].T)).reshape(B, T, Cin)
    return dx, matmul_tn(xh.reshape(B * T, Cin + C), da2), da2.sum(axis=0)


kernels.add_twins(__name__, {name: globals()[name] for name in TWINS})
