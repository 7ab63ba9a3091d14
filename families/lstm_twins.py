"""lstm_twins: the fast twins of families/lstm.py's recurrence, same names, same signatures, the same cache.

lstm.lstm_forward / lstm_backward loop the step in NumPy, one small product and a dozen elementwise ops per
time step. The twins take the input half of the gate product out of the loop (x W_x for every t in one
product), run the gates and the cell of each step in one Numba kernel after NumPy's product h_{t-1} W_h, and
in the backward collect every step's gate gradient da_t first, so that dx, dW and db are three products over all steps instead of 3T small ones:
    a_t = x_t W_x + h_{t-1} W_h + b,   W = [W_x; W_h]            (the step's one product, split by rows)
    dW = [x, h_prev]^T da,   dx = da W_x^T,   dh_{t-1} += da_t W_h^T   (summed over t by the products)
Each twin returns what its NumPy op returns (lstm_forward's cache: the step caches in time order), so the two
paths can be swapped at any op; tests/test_lstm_mamba.py checks each pair in float32 and float64. The Numba
conventions are kernels.py's.
"""

import numpy as np
from numba import njit

import kernels
from kernels import FASTMATH, NUMPY_ERRORS, fast_tanh, sigmoid1

TWINS = ("lstm_forward", "lstm_backward")


@njit(cache=True, fastmath=FASTMATH, error_model=NUMPY_ERRORS)
def lstm_cell_kernel(ax, a, c_prev, c, h, tc, gi, gf, gg, go):
    """One step's gates and cell, lstm.lstm_step_forward after its product: ax (B, 4C) = x_t W_x + b, a (B, 4C) =
    h_{t-1} W_h, c_prev (B, C) -> written in place: c = c_t, h = h_t, tc = tanh c_t, and the gates i, f, g, o
    after their nonlinearities (B, C each). Every output its own contiguous array: four gates written into
    one (B, 4C) array at four offsets did not vectorise (about 13x slower)."""
    B, C = c.shape
    one = ax.dtype.type(1)
    for bb in range(B):
        for j in range(C):
            i = sigmoid1(ax[bb, j] + a[bb, j], one)
            fg = sigmoid1(ax[bb, C + j] + a[bb, C + j], one)
            g = fast_tanh(ax[bb, 2 * C + j] + a[bb, 2 * C + j])
            o = sigmoid1(ax[bb, 3 * C + j] + a[bb, 3 * C + j], one)
            cn = fg * c_prev[bb, j] + i * g                  # c_t = f c_{t-1} + i g
            t = fast_tanh(cn)
            c[bb, j] = cn
            h[bb, j] = o * t                                 # h_t = o tanh(c_t)
            tc[bb, j] = t
            gi[bb, j], gf[bb, j], gg[bb, j], go[bb, j] = i, fg, g, o


@njit(cache=True, fastmath=FASTMATH, error_model=NUMPY_ERRORS)
def lstm_cell_backward_kernel(dh, dh_next, dc_next, c_prev, tc, gi, gf, gg, go, da):
    """One step of lstm.lstm_step_backward before its product: dh (B, C) from above, dh_next (B, C) = da_{t+1}
    W_h^T, dc_next (B, C) what step t+1 sent back through c_t, the forward's c_prev, tanh c and gates (B, C)
    -> written in place: da (4, B, C) the gradient of the gate pre-activations i, f, g, o (one contiguous
    block each, as in the forward), dc_next = dc_t f_t (for step t-1)."""
    B, C = dh.shape
    one = dh.dtype.type(1)
    for bb in range(B):
        for j in range(C):
            i, fg, g, o = gi[bb, j], gf[bb, j], gg[bb, j], go[bb, j]
            t = tc[bb, j]
            dht = dh[bb, j] + dh_next[bb, j]
            do = dht * t                                             # h = o tanh(c)
            dc = dc_next[bb, j] + dht * o * (one - t * t)
            dc_next[bb, j] = dc * fg                                 # c = f c_prev + i g
            da[0, bb, j] = dc * g * i * (one - i)                    # di, through the sigmoid
            da[1, bb, j] = dc * c_prev[bb, j] * fg * (one - fg)
            da[2, bb, j] = dc * i * (one - g * g)                    # dg, through the tanh
            da[3, bb, j] = do * o * (one - o)


def lstm_forward(x, w, b):
    """Twin of lstm.lstm_forward: the same output and cache. Time-major buffers (T, B, ...), so that each
    step's rows are contiguous; each step is NumPy's product h_{t-1} W_h (Numba's own @ was about twice as
    slow at these shapes) and then the cell kernel."""
    B, T, Cin = x.shape
    C = w.shape[1] // 4
    xt = np.ascontiguousarray(x.transpose(1, 0, 2))                             # (T, B, Cin)
    ax = (kernels.matmul(xt.reshape(-1, Cin), w[:Cin]) + b).reshape(T, B, 4 * C)        # x_t W_x + b for every t
    wh = np.ascontiguousarray(w[Cin:])                                          # (C, 4C)
    h = np.zeros((T + 1, B, C), dtype=x.dtype)                                  # h[t + 1] = h_t, h[0] = h_0 = 0
    c = np.zeros((T + 1, B, C), dtype=x.dtype)
    tcs = np.empty((T, B, C), dtype=x.dtype)
    gates = np.empty((4, T, B, C), dtype=x.dtype)                               # i, f, g, o
    a = np.empty((B, 4 * C), dtype=x.dtype)
    for t in range(T):
        np.matmul(h[t], wh, out=a)                                              # h_{t-1} W_h
        lstm_cell_kernel(ax[t], a, c[t], c[t + 1], h[t + 1], tcs[t], *gates[:, t])
    xh = np.concatenate([xt, h[:-1]], axis=2)                                   # (T, B, Cin + C)
    steps = [((xh[t], w), c[t], *gates[:, t], tcs[t]) for t in range(T)]
    return np.ascontiguousarray(h[1:].transpose(1, 0, 2)), steps


def lstm_backward(dh, cache):
    """Twin of lstm.lstm_backward: the gate gradients of every step in one reverse-time loop (NumPy's product
    da_t W_h^T, then the cell kernel), then dx, dW, db as products over all steps."""
    steps = cache
    B, T, C = dh.shape
    w = steps[0][0][1]
    Cin = w.shape[0] - C
    xh = np.stack([s[0][0] for s in steps])                                     # (T, B, Cin + C)
    c_prev = np.stack([s[1] for s in steps])                                    # (T, B, C)
    gates = [np.stack([s[k] for s in steps]) for k in range(2, 6)]              # i, f, g, o: (T, B, C) each
    tcs = np.stack([s[6] for s in steps])
    dht = np.ascontiguousarray(dh.transpose(1, 0, 2))                           # (T, B, C)
    whT = np.ascontiguousarray(w[Cin:].T)                                       # (4C, C)
    da = np.empty((T, B, 4 * C), dtype=dh.dtype)
    da_t = np.empty((4, B, C), dtype=dh.dtype)
    dh_next = np.zeros((B, C), dtype=dh.dtype)
    dc_next = np.zeros((B, C), dtype=dh.dtype)
    for t in range(T - 1, -1, -1):
        lstm_cell_backward_kernel(dht[t], dh_next, dc_next, c_prev[t], tcs[t], *(g[t] for g in gates), da_t)
        np.concatenate(da_t, axis=1, out=da[t])                                 # (B, 4C)
        np.matmul(da[t], whT, out=dh_next)                                      # what step t sends to h_{t-1}
    da2 = da.reshape(T * B, 4 * C)
    dx = kernels.matmul(da2, np.ascontiguousarray(w[:Cin].T)).reshape(T, B, Cin)
    return (np.ascontiguousarray(dx.transpose(1, 0, 2)), kernels.matmul_tn(xh.reshape(T * B, Cin + C), da2),
            da2.sum(axis=0))


kernels.add_twins(__name__, {name: globals()[name] for name in TWINS})
