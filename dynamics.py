"""dynamics: Paper II's gradient dynamics on the sticky Markov chain (wind tunnel 3).

The model is the paper's single causal attention head: no MLP, no residual, no biases.
    Q = X W_Q,  K = X W_K,  V = X W_V                X (T, d_x): d_x = 20, d_k = 10, d_v = 15
    s_ij = q_i . k_j / sqrt(d_k)  (j <= i),  alpha_ij = softmax_j s_ij   (the diagonal included)
    o_i = sum_j alpha_ij v_j,  logits_i = o_i W_O    8 classes; the target at i is y_{i+1}
Its backward is the EM reading of attention (shared/PAPERS.md, "The gradient equations"):
    u_i = dL/do_i = dlogits_i W_O^T                  the error signal of query i
    E-step  ds_ij = alpha_ij (b_ij - b_bar_i)        b_ij = u_i . v_j,  b_bar_i = sum_j alpha_ij b_ij
    M-step  dv_j  = sum_i alpha_ij u_i               each value moves toward the errors of its queries
    dq_i = sum_j ds_ij k_j / sqrt(d_k),  dk_j = sum_i ds_ij q_i / sqrt(d_k)
Two paths compute it. `head_forward_ref` / `head_backward_ref` are NumPy, line by line, with
bayesattn's `advantage_routing` (E-step) and `value_update` (M-step): the reference, checked by
finite differences. `head_forward` / `head_backward` are the fast path for the T = 2000 chain
(serial Numba kernels that skip the masked half, float32 in training), tested against the
reference. The fast path uses one identity: o_i = sum_j alpha_ij x_j W_V = h_i W_V with
h_i = sum_j alpha_ij x_j, so dW_V = X^T dV = X^T alpha^T U = H^T U.

Experiments (Paper II, section on the sticky chain, and past it):
    SGD       all four weights, plain SGD, lr 0.01
    EM-like   the same gradient, but W_V stepped with lr 0.1 (10x)
    M-step    with alpha fixed the model is multinomial logistic regression on h_i: solve it by
              Newton in W = W_V W_O, write W back into W_V, then one gradient step on W_Q, W_K.

Notation: B sequences, T time steps, d_x, d_k, d_v as above, K = 8 classes, N = B * T rows.
Gradient convention: every backward returns FRESH arrays, a dict keyed like the parameters
("W_Q", "W_K", "W_V", "W_O"). Losses are nats inside the code and bits in every report.
"""

import argparse
import json
import math
import os
import time

import bayesattn as ba  # first: it sets OPENBLAS_NUM_THREADS=1 before NumPy loads
import numba
import numpy as np
from numba import njit
from scipy import stats

import windtunnels as wt

D_X, D_K, D_V, N_CLASSES = 20, 10, 15, 8
INIT_STD = 0.1                           # all four weights ~ N(0, 0.1^2), as the authors
SEEDS = (42, 2024, 1337, 7777, 9999)     # the authors' five seeds
MU_SEED = 0                              # the symbol means mu are drawn once, the same for every seed
EVAL_SEED = 31337                        # held-out sequences, a seed no training run uses
V_SCALE = 10.0                           # EM-like: W_V steps 10x faster
ROUTING, VALUE = ("W_Q", "W_K"), ("W_V", "W_O")
FASTMATH = {"reassoc", "contract"}       # lets the row reductions vectorise; never full fastmath
LN2 = math.log(2.0)


def _rows(a):
    """(..., C) -> (N, C)."""
    return a.reshape(-1, a.shape[-1])


# ----------------------------------------------------------------------------
# the task: x[t] = mu[y_t] + sigma * eps_t, target y_{t+1} (windtunnels' convention)

CHAINS = ("exact", "authors")   # self-transition 0.3 exactly, or 0.3498 as the authors' script normalises it


def sticky_task(chain="exact"):
    """Transition matrix P (8, 8) and symbol means mu (8, 20), fixed for every seed. chain "exact":
    self-transition 0.3 (the paper's text); "authors": 0.3498, what the authors' script builds
    (windtunnels.sticky_authors_self_prob), whose bound H(Y_t+1 | Y_t) is 2.639 bits, not 2.717."""
    if chain not in CHAINS:
        raise ValueError(f"chain={chain!r}: allowed are {', '.join(map(repr, CHAINS))}")
    self_prob = 0.3 if chain == "exact" else wt.sticky_authors_self_prob(N_CLASSES, 0.3)
    return wt.sticky_transition(N_CLASSES, self_prob), wt.sticky_means(np.random.default_rng(MU_SEED), N_CLASSES, D_X)


def sticky_data(seed, T=2000, n=1, sigma=1.0, chain="exact"):
    """n chains: inputs x (n, T, d_x) float64 and targets y_{t+1} (n, T) int64."""
    P, mu = sticky_task(chain)
    x, y = wt.sticky_sample(np.random.default_rng(seed), P, mu, T, n=n, sigma=sigma)
    return x, y[:, 1:]


# ----------------------------------------------------------------------------
# the model, reference path (NumPy, the equations line by line)

def init_head(seed, std=INIT_STD, dtype="float64"):
    """W_Q (d_x, d_k), W_K (d_x, d_k), W_V (d_x, d_v), W_O (d_v, K), all N(0, std^2)."""
    rng = np.random.default_rng(seed)
    shapes = {"W_Q": (D_X, D_K), "W_K": (D_X, D_K), "W_V": (D_X, D_V), "W_O": (D_V, N_CLASSES)}
    return {name: rng.normal(0.0, std, shape).astype(dtype) for name, shape in shapes.items()}


def head_forward_ref(params, x):
    """x (B, T, d_x) -> logits (B, T, K), cache."""
    Q = x @ params["W_Q"]                                        # (B, T, d_k)
    K = x @ params["W_K"]                                        # (B, T, d_k)
    V = x @ params["W_V"]                                        # (B, T, d_v)
    O, alpha = ba.attention_forward_ref(Q, K, V)                 # (B, T, d_v), (B, T, T): o_i = sum_j alpha_ij v_j
    logits = O @ params["W_O"]                                   # (B, T, K)
    return logits, dict(x=x, Q=Q, K=K, V=V, alpha=alpha, O=O)


def head_backward_ref(dlogits, cache, params):
    """dlogits (B, T, K) -> grads. Reverses head_forward_ref line by line."""
    x, Q, K, V, alpha, O = (cache[k] for k in ("x", "Q", "K", "V", "alpha", "O"))
    g = {}
    # forward: logits = O W_O
    g["W_O"] = _rows(O).T @ _rows(dlogits)                      # (d_v, K)
    u = dlogits @ params["W_O"].T                                # (B, T, d_v)  u_i = dL/do_i
    # forward: o_i = sum_j alpha_ij v_j,  alpha = softmax(Q K^T / sqrt(d_k))
    ds = ba.advantage_routing(u, alpha, V)                       # (B, T, T)  E-step: alpha_ij (b_ij - b_bar_i)
    dV = ba.value_update(u, alpha)                               # (B, T, d_v) M-step: dv_j = sum_i alpha_ij u_i
    dQ = ds @ K / math.sqrt(D_K)                                 # (B, T, d_k) dq_i = sum_j ds_ij k_j / sqrt(d_k)
    dK = np.swapaxes(ds, -1, -2) @ Q / math.sqrt(D_K)            # (B, T, d_k) dk_j = sum_i ds_ij q_i / sqrt(d_k)
    # forward: Q = x W_Q, K = x W_K, V = x W_V
    g["W_Q"] = _rows(x).T @ _rows(dQ)
    g["W_K"] = _rows(x).T @ _rows(dK)
    g["W_V"] = _rows(x).T @ _rows(dV)
    return g


# ----------------------------------------------------------------------------
# the model, fast path: serial Numba kernels over the causal half of each (T, T) matrix
# (serial on purpose: on a shared 2-core machine a parallel loop waits on its slowest thread)

@njit(cache=True, fastmath=FASTMATH)
def causal_scores_kernel(qs, kT):
    """qs = Q / sqrt(d_k) (B, T, d_k), kT = K^T (B, d_k, T) -> s (B, T, T):
    s_ij - max_j s_ij for j <= i (the stable softmax's shift), -inf above the diagonal."""
    B, T, d_k = qs.shape
    s = np.empty((B, T, T), dtype=qs.dtype)
    buf = np.empty(T, dtype=qs.dtype)
    for bb in range(B):
        for i in range(T):
            n = i + 1
            buf[:n] = 0.0
            for c in range(d_k):
                qc = qs[bb, i, c]
                for j in range(n):
                    buf[j] += qc * kT[bb, c, j]              # s_ij = q_i . k_j / sqrt(d_k)
            mx = buf[0]
            for j in range(1, n):
                mx = max(mx, buf[j])
            for j in range(n):
                s[bb, i, j] = buf[j] - mx
            for j in range(n, T):
                s[bb, i, j] = -np.inf                        # causal: no weight on j > i
    return s


@njit(cache=True, fastmath=FASTMATH)
def causal_normalize_kernel(e):
    """e = exp(s) (B, T, T), valid on and below the diagonal -> alpha (B, T, T), written over e:
    alpha_ij = e_ij / sum_j' e_ij' for j <= i, zero above the diagonal."""
    B, T, _ = e.shape
    zero = np.zeros(1, dtype=e.dtype)[0]                     # 0 in the arrays' dtype keeps float32 sums float32
    for bb in range(B):
        for i in range(T):
            n = i + 1
            z = zero
            for j in range(n):
                z += e[bb, i, j]
            for j in range(n):
                e[bb, i, j] /= z                             # alpha_ij = exp(s_ij) / sum_j exp(s_ij)
            for j in range(n, T):
                e[bb, i, j] = 0.0
    return e


@njit(cache=True, fastmath=FASTMATH)
def routing_backward_kernel(u, alpha, qs, ksT, vT):
    """E-step and the query/key gradients, one query row at a time.
    u (B, T, d_v), alpha (B, T, T), qs = Q / sqrt(d_k) (B, T, d_k), ksT = K^T / sqrt(d_k) (B, d_k, T),
    vT = V^T (B, d_v, T) -> dQ (B, T, d_k), dK^T (B, d_k, T)."""
    B, T, d_k = qs.shape
    d_v = u.shape[2]
    zero = np.zeros(1, dtype=u.dtype)[0]
    dQ = np.zeros((B, T, d_k), dtype=u.dtype)
    dKT = np.zeros((B, d_k, T), dtype=u.dtype)
    ds = np.empty(T, dtype=u.dtype)
    for bb in range(B):
        for i in range(T):
            n = i + 1
            ds[:n] = 0.0
            for c in range(d_v):
                uc = u[bb, i, c]
                for j in range(n):
                    ds[j] += uc * vT[bb, c, j]               # b_ij = u_i . v_j
            b_bar = zero
            for j in range(n):
                b_bar += alpha[bb, i, j] * ds[j]             # b_bar_i = sum_j alpha_ij b_ij
            for j in range(n):
                ds[j] = alpha[bb, i, j] * (ds[j] - b_bar)    # E-step: ds_ij = alpha_ij (b_ij - b_bar_i)
            for c in range(d_k):
                acc = zero
                for j in range(n):
                    acc += ds[j] * ksT[bb, c, j]             # dq_i = sum_j ds_ij k_j / sqrt(d_k)
                dQ[bb, i, c] = acc
                qc = qs[bb, i, c]
                for j in range(n):
                    dKT[bb, c, j] += ds[j] * qc              # dk_j += ds_ij q_i / sqrt(d_k)
    return dQ, dKT


def _exp_causal_(s, block=256):
    """exp in place on the part of s (B, T, T) on or below the diagonal, in row blocks (NumPy's SIMD exp)."""
    T = s.shape[1]
    for r0 in range(0, T, block):
        r1 = min(T, r0 + block)
        np.exp(s[:, r0:r1, :r1], out=s[:, r0:r1, :r1])


def _T(a):
    """(B, T, C) -> (B, C, T), contiguous."""
    return np.ascontiguousarray(np.swapaxes(a, -1, -2))


def head_forward(params, x):
    """Fast twin of head_forward_ref: x (B, T, d_x) -> logits (B, T, K), cache (with H = alpha X)."""
    x = np.ascontiguousarray(x, dtype=params["W_Q"].dtype)
    Q = x @ params["W_Q"]                                        # (B, T, d_k)
    K = x @ params["W_K"]                                        # (B, T, d_k)
    s = causal_scores_kernel(Q / Q.dtype.type(math.sqrt(D_K)), _T(K))   # (B, T, T)
    _exp_causal_(s)
    alpha = causal_normalize_kernel(s)                           # (B, T, T)
    H = alpha @ x                                                # (B, T, d_x)  h_i = sum_j alpha_ij x_j (BLAS)
    O = H @ params["W_V"]                                        # (B, T, d_v)  o_i = h_i W_V = sum_j alpha_ij v_j
    logits = O @ params["W_O"]                                   # (B, T, K)
    return logits, dict(x=x, Q=Q, K=K, alpha=alpha, H=H, O=O)


def value_backward(dlogits, cache, params):
    """The value/output path: -> u (B, T, d_v), {"W_V", "W_O"}. Cheap: no (T, T) work."""
    g = {"W_O": _rows(cache["O"]).T @ _rows(dlogits)}            # forward: logits = O W_O
    u = dlogits @ params["W_O"].T                                # (B, T, d_v)  u_i = dL/do_i
    g["W_V"] = _rows(cache["H"]).T @ _rows(u)                    # M-step summed over j: X^T (alpha^T U) = H^T U
    return u, g


def routing_backward(u, cache, params):
    """The routing path (E-step): u (B, T, d_v) -> {"W_Q", "W_K"}."""
    x, Q, K = cache["x"], cache["Q"], cache["K"]
    scale = Q.dtype.type(1.0 / math.sqrt(D_K))
    V = x @ params["W_V"]                                        # (B, T, d_v)
    dQ, dKT = routing_backward_kernel(np.ascontiguousarray(u), cache["alpha"], Q * scale, _T(K) * scale, _T(V))
    return {"W_Q": _rows(x).T @ _rows(dQ),                       # forward: Q = x W_Q
            "W_K": _rows(x).T @ _rows(np.swapaxes(dKT, -1, -2))}


def head_backward(dlogits, cache, params):
    """Fast twin of head_backward_ref."""
    u, g = value_backward(dlogits, cache, params)
    g.update(routing_backward(u, cache, params))
    return g


def cross_entropy(logits, targets):
    """Mean cross-entropy (nats) of int targets (B, T) under softmax(logits) (B, T, K) -> loss, dlogits.
    dlogits = (softmax(logits) - onehot(targets)) / N. Same value as bayesattn.cross_entropy with an all-ones
    mask; in NumPy because a parallel kernel per call costs more than this whole (N, 8) problem."""
    z = logits - logits.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))    # (B, T, K) log softmax
    logp_y = np.take_along_axis(logp, targets[..., None], axis=-1)
    dlogits = np.exp(logp)
    np.put_along_axis(dlogits, targets[..., None], np.take_along_axis(dlogits, targets[..., None], axis=-1) - 1, axis=-1)
    N = targets.size
    return float(-logp_y.astype(np.float64).sum() / N), dlogits / logits.dtype.type(N)


def head_loss(params, x, targets, fast=True):
    """Mean cross-entropy (nats) of the targets y_{t+1} (B, T) -> loss, dlogits, logits, cache."""
    logits, cache = (head_forward if fast else head_forward_ref)(params, x)
    loss, dlogits = cross_entropy(logits, targets)
    return loss, dlogits, logits, cache


def head_loss_and_grads(params, x, targets, fast=True):
    """-> loss (nats), grads, cache."""
    loss, dlogits, _, cache = head_loss(params, x, targets, fast)
    return loss, (head_backward if fast else head_backward_ref)(dlogits, cache, params), cache


# ----------------------------------------------------------------------------
# the three optimisers

def sgd_step(params, grads, lr, lr_scale=None):
    """W <- W - lr * scale_W * dL/dW for all four weights, from the same gradient, in place."""
    for name in params:
        params[name] -= params[name].dtype.type(lr * (lr_scale or {}).get(name, 1.0)) * grads[name]


def em_like_step(params, grads, lr):
    """The authors' EM-like schedule: SGD with W_V stepped V_SCALE (10x) faster."""
    sgd_step(params, grads, lr, {"W_V": V_SCALE})


def softmax_regression(H, Y, W):
    """Mean CE of softmax(H W) against one-hot Y: H (N, d), Y (N, K), W (d, K) -> loss (nats), grad (d, K), p (N, K)."""
    z = H @ W                                                    # (N, K)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    p = np.exp(logp)
    N = len(H)
    return float(-(Y * logp).sum() / N), H.T @ (p - Y) / N, p


def softmax_regression_hessian(H, p):
    """d^2 loss / dW^2 (d K, d K), W flattened row-major: sum_n (h_n h_n^T) kron (diag p_n - p_n p_n^T) / N."""
    N, d = H.shape
    K = p.shape[1]
    hp = (H[:, :, None] * p[:, None, :]).reshape(N, d * K)      # (N, d K)  h_na p_nk
    hess = -(hp.T @ hp) / N                                      # - sum_n h_na p_nk h_nb p_nl
    hess4 = hess.reshape(d, K, d, K)
    for k in range(K):
        hess4[:, k, :, k] += (H.T * p[:, k]) @ H / N             # + sum_n h_na h_nb p_nk, where k = l
    return hess


def m_step(H, targets, W, max_newton=6, tol=1e-10):
    """True M-step. With alpha fixed, logits = h W where h_i = sum_j alpha_ij x_j and W = W_V W_O:
    the value/output path is convex multinomial logistic regression in W. Newton's method with
    backtracking; a step is taken only if it lowers the loss, so the loss never increases.
    H (N, d_x), targets (N,), W (d_x, K) float64 -> W, losses (one per accepted Newton step, first = start)."""
    K = W.shape[1]
    Y = np.eye(K)[targets]                                       # (N, K)
    loss, grad, p = softmax_regression(H, Y, W)
    losses = [loss]
    for _ in range(max_newton):
        hess = softmax_regression_hessian(H, p)
        damping = 1e-6 * np.trace(hess) / len(hess) + 1e-12      # the Hessian is singular along W + c 1^T
        step = np.linalg.solve(hess + damping * np.eye(len(hess)), grad.reshape(-1)).reshape(W.shape)
        t = 1.0
        while t > 1e-4:                                          # backtracking: halve until the loss drops
            new_loss, new_grad, new_p = softmax_regression(H, Y, W - t * step)
            if new_loss < loss:
                break
            t /= 2
        else:
            break                                                # no decrease along the Newton direction: done
        W, done = W - t * step, loss - new_loss < tol
        loss, grad, p = new_loss, new_grad, new_p
        losses.append(loss)
        if done:
            break
    return W, losses


def refactor_values(W, params):
    """Write W = W_V W_O back into W_V with W_O fixed, moving W_V as little as possible:
    W_V <- W W_O^+ + W_V (I - W_O W_O^+), so W_V W_O = W when W_O (d_v, K) has full column rank."""
    W_O = params["W_O"].astype(np.float64)
    pinv = np.linalg.pinv(W_O)                                   # (K, d_v)
    W_V = W @ pinv + params["W_V"].astype(np.float64) @ (np.eye(len(W_O)) - W_O @ pinv)
    return W_V.astype(params["W_V"].dtype)


def m_step_update(params, cache, targets, lr):
    """One step of the M-step arm, in place: the M-step at fixed alpha, then one gradient step on
    W_Q, W_K whose E-step sees the new values.
    -> loss after the M-step (nats), the Newton losses, routing grads, u (B, T, d_v) at the new values."""
    H = _rows(cache["H"]).astype(np.float64)                     # (N, d_x) h_i = sum_j alpha_ij x_j
    W = params["W_V"].astype(np.float64) @ params["W_O"].astype(np.float64)
    W, losses = m_step(H, targets.reshape(-1), W)
    params["W_V"] = refactor_values(W, params)
    cache["O"] = cache["H"] @ params["W_V"]                      # same alpha, new values
    loss, dlogits = cross_entropy(cache["O"] @ params["W_O"], targets)
    u, _ = value_backward(dlogits, cache, params)
    g = routing_backward(u, cache, params)
    sgd_step({k: params[k] for k in ROUTING}, g, lr)
    return loss, losses, g, u


# ----------------------------------------------------------------------------
# training with the dynamics logged

def _norm(grads, names):
    return float(math.sqrt(sum(float(np.vdot(grads[k], grads[k])) for k in names)))


def dynamics_snapshot(params, cache, u, pairs, alpha_prev=None, V_prev=None):
    """The quantities of the two-timescale story at one step, on the first sequence of the batch (in the
    training dtype). u (B, T, d_v) the error signal the E-step used; pairs (i, j), j <= i, sample the advantages."""
    alpha = cache["alpha"][0]                                    # (T, T)
    V = cache["x"][0] @ params["W_V"]                            # (T, d_v)
    u0 = u[0]                                                    # (T, d_v)
    b = u0 @ V.T                                                 # (T, T)  b_ij = u_i . v_j
    b_bar = (u0 * (alpha @ V)).sum(axis=1)                       # (T,)    b_bar_i = sum_j alpha_ij b_ij = u_i . o_i
    adv = b - b_bar[:, None]                                     # (T, T)  the advantage b_ij - b_bar_i
    sample = adv[pairs].astype(np.float64)                       # uniform over the causal pairs j <= i
    ent = -(alpha * np.log2(np.maximum(alpha, np.finfo(alpha.dtype).tiny))).sum(axis=1)   # (T,) bits
    T = len(alpha)
    snap = {
        "adv_quantiles": np.quantile(sample, [0.05, 0.25, 0.5, 0.75, 0.95]).tolist(),
        "adv_std": float(sample.std()),
        "adv_weighted_std": float(np.sqrt((alpha * adv * adv).sum(axis=1)).mean()),   # sqrt(sum_j alpha_ij adv_ij^2)
        "ds_abs": float((alpha * np.abs(adv)).sum(axis=1).mean()),                     # sum_j |ds_ij|, ds the E-step
        "attn_entropy_bits": float(ent.mean()),
        "attn_entropy_frac": float((ent[1:] / np.log2(np.arange(2, T + 1))).mean()),    # 1 = uniform over the past
    }
    if alpha_prev is not None:
        snap["frame_drift"] = float(0.5 * np.abs(alpha - alpha_prev).sum(axis=1).mean())  # mean TV distance per row
        snap["value_drift"] = float(np.linalg.norm(V - V_prev) / np.linalg.norm(V_prev))
    return snap, alpha.copy(), V


def prototype_cosine(V_before, V_after, dV):
    """Mean over positions j of cos(v_j's change, -dv_j), dv_j = sum_i alpha_ij u_i (the M-step signal)."""
    dv = V_after - V_before                                      # (T, d_v)
    num = (dv * -dV).sum(axis=1)
    den = np.linalg.norm(dv, axis=1) * np.linalg.norm(dV, axis=1)
    ok = den > 0
    return float((num[ok] / den[ok]).mean()) if ok.any() else float("nan")


def train_head(params, x, targets, steps, method="sgd", lr=0.01, log_every=None, seed=0):
    """Train the head in place, full batch. method: "sgd", "em" (EM-like) or "mstep".
    -> dict: loss (steps + 1,) nats, loss[k] before update k and loss[steps] after the last;
    seconds (steps + 1,) cumulative compute time before update k (logging excluded);
    routing_norm, value_norm (steps,) gradient norms of (W_Q, W_K) and (W_V, W_O) before each update;
    logs: every log_every steps, dynamics_snapshot plus the prototype cosine."""
    if method not in ("sgd", "em", "mstep"):
        raise ValueError(f"method={method!r}: allowed are 'sgd', 'em', 'mstep'")
    x = np.ascontiguousarray(x, dtype=params["W_Q"].dtype)
    loss_curve, seconds, routing_norm, value_norm, mstep_newton, logs = [], [0.0], [], [], [], []
    T = x.shape[1]
    rng = np.random.default_rng(seed)
    i = np.floor(T * np.sqrt(rng.random(20000))).astype(np.int64)   # P(i) ~ i + 1: uniform over the causal pairs
    pairs = (i, (rng.random(20000) * (i + 1)).astype(np.int64))      # then j uniform in 0..i
    alpha_prev = V_prev = None
    for step in range(steps):
        t0 = time.perf_counter()
        loss, dlogits, _, cache = head_loss(params, x, targets)
        u, g_val = value_backward(dlogits, cache, params)
        W_V_before = params["W_V"].copy()
        if method == "mstep":
            _, newton, g_rout, u_e = m_step_update(params, cache, targets, lr)   # u_e: the error after the M-step
            mstep_newton.append(len(newton) - 1)
        else:
            g_rout, u_e = routing_backward(u, cache, params), u
            (em_like_step if method == "em" else sgd_step)(params, {**g_rout, **g_val}, lr)
        seconds.append(seconds[-1] + time.perf_counter() - t0)
        loss_curve.append(loss)
        routing_norm.append(_norm(g_rout, ROUTING))
        value_norm.append(_norm(g_val, VALUE))
        if log_every and (step % log_every == 0 or step == steps - 1):
            # the advantages the routing step saw: u_e against the values it was computed with
            seen = params if method == "mstep" else params | {"W_V": W_V_before}
            snap, alpha_prev, V_prev = dynamics_snapshot(seen, cache, u_e, pairs, alpha_prev, V_prev)
            dV = ba.value_update(u[0], cache["alpha"][0])          # (T, d_v) the M-step signal sum_i alpha_ij u_i
            snap["prototype_cos"] = prototype_cosine(x[0] @ W_V_before, x[0] @ params["W_V"], dV)
            snap["step"] = step
            logs.append(snap)
    loss, _, _, _ = head_loss(params, x, targets)
    loss_curve.append(loss)
    out = dict(method=method, lr=lr, loss=loss_curve, seconds=seconds, routing_norm=routing_norm,
               value_norm=value_norm, logs=logs)
    if method == "mstep":
        out["newton_steps"] = mstep_newton
    return out


def steps_to_threshold(loss, threshold):
    """First k whose loss (before update k; k = steps means after the last) is below threshold; None if never."""
    below = np.flatnonzero(np.asarray(loss) < threshold)
    return int(below[0]) if below.size else None


# ----------------------------------------------------------------------------
# exact Bayes

def exact_bayes_reference(sigma=1.0, n=8, T=2000, seed=EVAL_SEED, chain="exact"):
    """Held-out chains from a separate seed and their exact Bayes predictor p(y_{t+1} | x_0..x_t)
    (windtunnels.sticky_posterior_batch, the forward filter). -> x, targets, posterior (n, T, K), references (bits)."""
    P, mu = sticky_task(chain)
    x, targets = sticky_data(seed, T=T, n=n, sigma=sigma, chain=chain)
    posterior = wt.sticky_posterior_batch(P, mu, x, sigma)      # (n, T, K)
    bayes_ce = float(-np.log2(np.take_along_axis(posterior, targets[..., None], axis=-1)).mean())
    bayes_entropy = float(wt.entropy_bits(posterior).mean())    # the same in expectation, far less sampling noise
    bound = wt.sticky_conditional_entropy_bits(P)                # H(Y_{t+1} | Y_t): sees y_t itself, a lower bound
    ref = dict(bayes_loss_bits=bayes_ce, bayes_entropy_bits=bayes_entropy, conditional_entropy_bound_bits=bound,
               bound_gap_bits=bayes_ce - bound, bound_gap_entropy_bits=bayes_entropy - bound,
               eval_seed=seed, eval_chains=n, eval_T=T, sigma=sigma, chain=chain)
    return x, targets, posterior, ref


def evaluate_vs_bayes(params, sigma=1.0, n=8, T=2000, seed=EVAL_SEED, reference=None):
    """The model's held-out cross-entropy against the exact Bayes predictor's and H(Y_{t+1} | Y_t), and the
    KL(posterior || model), all in bits per token. reference: exact_bayes_reference's output, to reuse."""
    x, targets, posterior, ref = reference or exact_bayes_reference(sigma, n, T, seed)
    q = np.concatenate([ba.softmax_ref(head_forward(params, x[b:b + 1])[0].astype(np.float64))
                        for b in range(len(x))])                 # (n, T, K) model predictive, one chain at a time
    model_ce = float(-np.log2(np.maximum(np.take_along_axis(q, targets[..., None], axis=-1), wt.TINY)).mean())
    return dict(loss_bits=model_ce, excess_ce_bits=model_ce - ref["bayes_loss_bits"],
                kl_bits=float(wt.kl_bits(posterior, q).mean()), **ref)


def bayes_loss_bits(x, targets, sigma=1.0, chain="exact"):
    """Cross-entropy (bits) of the exact Bayes predictor on given chains x (n, T, d_x)."""
    P, mu = sticky_task(chain)
    post = wt.sticky_posterior_batch(P, mu, x, sigma)
    return float(-np.log2(np.take_along_axis(post, targets[..., None], axis=-1)).mean())


def run_sticky(steps=1000, seed=0, lr=0.01, T=2000, sigma=1.0, fig_dir="figures", out_dir=None, chain="exact"):
    """Train the one-head model with plain SGD on one chain (full batch) and compare it, on held-out
    chains, with the exact Bayes predictor. fig_dir is accepted for a uniform entry point; no figure
    is drawn. With out_dir, writes sticky_metrics.json and sticky_head.npz there. -> metrics dict."""
    x, targets = sticky_data(seed, T=T, sigma=sigma, chain=chain)
    params = init_head(seed, dtype="float32")
    run = train_head(params, x, targets, steps, "sgd", lr)
    metrics = dict(task="sticky", model="one-head", steps=steps, seed=seed, lr=lr, T=T, sigma=sigma,
                   seconds=run["seconds"][-1],
                   train_loss_first_bits=run["loss"][0] / LN2, train_loss_final_bits=run["loss"][-1] / LN2,
                   train_bayes_loss_bits=bayes_loss_bits(x, targets, sigma, chain))
    metrics.update(evaluate_vs_bayes(params, reference=exact_bayes_reference(sigma, T=T, chain=chain)))
    metrics["train_loss_curve_bits"] = (np.asarray(run["loss"]) / LN2).tolist()
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "sticky_metrics.json"), "w") as f:
            json.dump(_clean(metrics), f, indent=1)
        np.savez(os.path.join(out_dir, "sticky_head.npz"), **params)
    return metrics


# ----------------------------------------------------------------------------
# the 2-4 layer bijection transformer: routing against value gradients per layer

def transformer_timescales(steps=500, seed=0, n_layers=3, d_model=64, n_heads=4, batch=64, lr=1e-3,
                           V=20, probe_every=25, warmup=50, probe_size=128, threads=1):
    """Train a small bijection transformer (bayesattn, AdamW) and log, per layer and step, the gradient
    norm of the routing weights (wq, wk) against the value/output weights (wv, wo); on a fixed probe
    batch every probe_every steps, the attention entropy, frame drift (mean TV distance of attention
    rows since the last probe) and value drift (relative change of the per-head values). -> dict.
    threads: Numba threads while it runs (1 by default: on a busy 2-core machine a parallel kernel
    waits on its slowest thread and ran 2-3x slower than a serial one)."""
    prev_threads = numba.get_num_threads()
    numba.set_num_threads(threads)                               # bayesattn's kernels are parallel; see the docstring
    try:
        return _transformer_timescales(steps, seed, n_layers, d_model, n_heads, batch, lr, V, probe_every,
                                       warmup, probe_size)
    finally:
        numba.set_num_threads(prev_threads)


def _transformer_timescales(steps, seed, n_layers, d_model, n_heads, batch, lr, V, probe_every, warmup, probe_size):
    L = V - 1
    cfg = ba.Config(vocab_size=2 * V, n_classes=V, max_len=2 * L, d_model=d_model, n_layers=n_layers,
                    n_heads=n_heads)
    params = ba.init_params(cfg, seed)
    opt = ba.adamw_init(params)
    rng = np.random.default_rng(seed)
    probe = wt.bijection_batch(np.random.default_rng(seed + 1), probe_size, V)
    routing = np.zeros((steps, n_layers))
    value = np.zeros((steps, n_layers))
    loss_curve, probes, prev, seconds = [], [], None, 0.0
    for step in range(steps):
        t0 = time.perf_counter()
        data = wt.bijection_batch(rng, batch, V)
        loss, grads = ba.loss_and_grads(params, data["tokens"], data["targets"], data["mask"], cfg)
        for l in range(n_layers):
            pre = f"blocks.{l}.attn."
            routing[step, l] = _norm(grads, (pre + "wq", pre + "wk"))
            value[step, l] = _norm(grads, (pre + "wv", pre + "wo"))
        ba.clip_grad_norm(grads, 1.0)
        ba.adamw_step(params, grads, opt, ba.lr_schedule(step, lr, warmup, steps), weight_decay=0.01)
        seconds += time.perf_counter() - t0
        loss_curve.append(loss)
        if step % probe_every == 0 or step == steps - 1:
            _, cache = ba.forward(params, probe["tokens"], cfg)
            cur = [(lc["alpha"].astype(np.float64), lc["v"].astype(np.float64)) for lc in cache["layers"]]
            snap = {"step": step, "attn_entropy_bits": [], "frame_drift": [], "value_drift": []}
            for l, (alpha, v) in enumerate(cur):
                with np.errstate(divide="ignore", invalid="ignore"):
                    ent = -np.where(alpha > 0, alpha * np.log2(alpha), 0.0).sum(-1)   # (B, NH, T)
                snap["attn_entropy_bits"].append(float(ent.mean()))
                if prev is not None:
                    snap["frame_drift"].append(float(0.5 * np.abs(alpha - prev[l][0]).sum(-1).mean()))
                    snap["value_drift"].append(float(np.linalg.norm(v - prev[l][1]) / np.linalg.norm(prev[l][1])))
            probes.append(snap)
            prev = cur
    proba = ba.predict_proba(params, probe["tokens"], cfg)       # (B, T, V)
    m = probe["mask"] > 0
    post, tgt = probe["posterior"][m], probe["targets"][m]
    q = proba[m]
    return dict(config=cfg.to_dict(), steps=steps, seed=seed, batch=batch, lr=lr, seconds=seconds,
                loss_bits=(np.asarray(loss_curve) / LN2).tolist(),
                routing_norm=routing.tolist(), value_norm=value.tolist(), probes=probes,
                probe_loss_bits=float(-np.log2(q[np.arange(len(tgt)), tgt]).mean()),
                probe_bayes_loss_bits=float(-np.log2(post[np.arange(len(tgt)), tgt]).mean()),
                probe_kl_bits=float(wt.kl_bits(post, q).mean()))


# ----------------------------------------------------------------------------
# the authors' deep variant: a 4-layer transformer on the continuous inputs, one chain to train, another
# to test, AdamW; no EM arm (the value/routing split of one head has no counterpart here)

DEEP = dict(d_model=64, n_layers=4, n_heads=4, d_mlp=256)   # input projection 20 -> 64, 4 pre-LN blocks


def deep_init(seed, T, dtype="float32", **sizes):
    """-> cfg, params: bayesattn's blocks (no token or position embedding: the authors' deep model has no
    positional encoding) behind a linear input projection in.w (d_x, C), in.b (C,). sizes override DEEP."""
    cfg = ba.Config(vocab_size=1, n_classes=N_CLASSES, max_len=T, init="fan-in", dtype=dtype, **{**DEEP, **sizes})
    params = ba.init_params(cfg, seed)
    del params["wte"], params["wpe"]
    rng = np.random.default_rng((seed, 1))
    params["in.w"] = rng.normal(0, 1 / math.sqrt(D_X), (D_X, cfg.d_model)).astype(dtype)
    params["in.b"] = np.zeros(cfg.d_model, dtype=dtype)
    return cfg, params


def deep_forward(params, x, cfg):
    """x (B, T, d_x) -> logits (B, T, K), cache: h = x W_in + b_in, then the blocks."""
    h, _ = ba.linear_forward(x.astype(cfg.dtype), params["in.w"], params["in.b"])   # (B, T, C)
    logits, cache = ba.forward_embedded(params, h, cfg)
    cache["x"] = x.astype(cfg.dtype)
    return logits, cache


def deep_loss_and_grads(params, x, targets, cfg):
    """Mean cross-entropy (nats) of the targets (B, T) and the gradient of every parameter."""
    logits, cache = deep_forward(params, x, cfg)
    loss, dlogits = ba.cross_entropy(logits, targets, np.ones(targets.shape))
    g, dh = ba.backward_embedded(dlogits, cache, params, cfg)
    _, g["in.w"], g["in.b"] = ba.linear_backward(dh, cache["x"], params["in.w"])   # forward: h = x W_in + b_in
    return loss, g


def deep_variant(seeds=SEEDS, steps=1000, lr=3e-4, T=2000, chain="exact", threads=None):
    """Train on one chain of each seed (full batch), test on a fresh chain (seed + 10000), as the authors.
    AdamW (weight decay 0.01), cosine from lr to 0, clipping at 1; no dropout (the authors use 0.1).
    -> dict with per-seed held-out cross-entropy, exact Bayes on the same chain, the bound, KL, in bits."""
    prev = numba.get_num_threads()
    numba.set_num_threads(threads or prev)
    try:
        P, mu = sticky_task(chain)
        rows = []
        for seed in seeds:
            t0 = time.perf_counter()
            x, y = sticky_data(seed, T=T, chain=chain)
            x_test, y_test = sticky_data(seed + 10000, T=T, chain=chain)
            cfg, params = deep_init(seed, T)
            opt = ba.adamw_init(params)
            losses = []
            for step in range(steps):
                loss, g = deep_loss_and_grads(params, x, y, cfg)
                ba.clip_grad_norm(g, 1.0)
                ba.adamw_step(params, g, opt, ba.lr_schedule(step, lr, 0, steps), weight_decay=0.01)
                losses.append(loss / LN2)
            q = ba.softmax_ref(deep_forward(params, x_test, cfg)[0].astype(np.float64))    # (1, T, K)
            post = wt.sticky_posterior_batch(P, mu, x_test, 1.0)                          # (1, T, K)
            ce = lambda p: float(-np.log2(np.maximum(np.take_along_axis(p, y_test[..., None], -1), wt.TINY)).mean())
            rows.append(dict(seed=seed, train_loss_final_bits=losses[-1], test_loss_bits=ce(q),
                             test_bayes_loss_bits=ce(post), test_kl_bits=float(wt.kl_bits(post, q).mean()),
                             seconds=time.perf_counter() - t0, train_loss_bits=losses))
            print(f"  deep seed {seed}: train {losses[0]:.4f} -> {losses[-1]:.4f} bits, held-out {ce(q):.4f} "
                  f"(exact Bayes {ce(post):.4f}, KL {rows[-1]['test_kl_bits']:.4f}), {rows[-1]['seconds']:.0f} s",
                  flush=True)
    finally:
        numba.set_num_threads(prev)
    column = lambda key: np.array([r[key] for r in rows])
    return {"config": dict(DEEP, d_x=D_X, classes=N_CLASSES, steps=steps, lr=lr, T=T, chain=chain, seeds=list(seeds),
                           optimiser="AdamW, weight decay 0.01, cosine to 0, clip 1.0, no dropout",
                           bound_bits=wt.sticky_conditional_entropy_bits(P)),
            "per_seed": rows,
            **{f"{key}_mean": float(column(key).mean()) for key in
               ("train_loss_final_bits", "test_loss_bits", "test_bayes_loss_bits", "test_kl_bits")},
            "test_loss_std_bits": float(column("test_loss_bits").std())}


# ----------------------------------------------------------------------------
# the comparison

def _paired(a, b):
    """Paired t-test and Wilcoxon signed-rank test of a against b (per-seed numbers)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    out = {"mean_diff": float((a - b).mean())}
    for name, test in (("ttest_rel", stats.ttest_rel), ("wilcoxon", stats.wilcoxon)):
        try:
            r = test(a, b)
            out[name] = {"statistic": float(r.statistic), "p": float(r.pvalue)}
        except ValueError as e:                                  # e.g. all differences zero
            out[name] = {"error": str(e)}
    return out


def compare_setting(name, seeds, make_data, steps, mstep_steps, reference, log_every=None):
    """SGD, EM-like and M-step arms from the same initialisation for each seed, full batch on make_data(seed).
    Threshold = mean over seeds of SGD's final training loss (nats, as the authors); per arm and seed the
    first step below it, the compute seconds to get there, and the held-out loss against exact Bayes."""
    arms = {"sgd": steps, "em": steps, "mstep": mstep_steps}
    runs = {m: [] for m in arms}
    train_bayes = []
    for seed in seeds:
        x, targets = make_data(seed)
        train_bayes.append(bayes_loss_bits(x, targets, chain=reference[3]["chain"]))
        for method, n in arms.items():
            params = init_head(seed, dtype="float32")           # the same start for every arm
            run = train_head(params, x, targets, n, method, log_every=log_every, seed=seed)
            run.update(seed=seed, params={k: v.tolist() for k, v in params.items()},
                       heldout=evaluate_vs_bayes(params, reference=reference))
            runs[method].append(run)
            print(f"  {name} seed {seed} {method:5s}: train {run['loss'][0] / LN2:.4f} -> {run['loss'][-1] / LN2:.4f}"
                  f" bits, held-out {run['heldout']['loss_bits']:.4f} bits, {run['seconds'][-1]:.1f} s", flush=True)
    threshold = float(np.mean([r["loss"][-1] for r in runs["sgd"]]))
    summary = {"setting": name, "threshold_nats": threshold, "threshold_bits": threshold / LN2,
               "train_bayes_loss_bits": train_bayes, "heldout_reference": reference[3], "per_seed": []}
    for k, seed in enumerate(seeds):
        row = {"seed": seed}
        for method, rs in runs.items():
            r = rs[k]
            hit = steps_to_threshold(r["loss"], threshold)
            row[method] = dict(final_loss_nats=r["loss"][-1], final_loss_bits=r["loss"][-1] / LN2,
                               steps_to_threshold=hit if hit is not None else arms[method], reached=hit is not None,
                               seconds_to_threshold=r["seconds"][hit if hit is not None else -1],
                               seconds_total=r["seconds"][-1], seconds_per_step=float(np.median(np.diff(r["seconds"]))),
                               heldout_loss_bits=r["heldout"]["loss_bits"], heldout_kl_bits=r["heldout"]["kl_bits"])
        summary["per_seed"].append(row)
    column = lambda method, key: np.array([row[method][key] for row in summary["per_seed"]], float)
    for method in arms:
        s = summary[method] = {"steps_run": arms[method], "reached": int(column(method, "reached").sum())}
        for key in ("steps_to_threshold", "seconds_to_threshold", "final_loss_bits", "heldout_loss_bits",
                    "heldout_kl_bits"):
            s[key + "_mean"], s[key + "_std"] = float(column(method, key).mean()), float(column(method, key).std())
        s["seconds_per_step_median"] = float(np.median(column(method, "seconds_per_step")))
    for method in ("em", "mstep"):                                # steps not reached count as the steps run
        s = summary[method]
        s["speedup_steps"] = arms["sgd"] / max(s["steps_to_threshold_mean"], 1e-12)
        s["speedup_seconds"] = summary["sgd"]["seconds_to_threshold_mean"] / max(s["seconds_to_threshold_mean"], 1e-12)
        s["paired_final_loss_vs_sgd"] = _paired(column(method, "final_loss_nats"), column("sgd", "final_loss_nats"))
        s["paired_steps_vs_sgd"] = _paired(column(method, "steps_to_threshold"), column("sgd", "steps_to_threshold"))
        s["paired_heldout_loss_vs_sgd"] = _paired(column(method, "heldout_loss_bits"), column("sgd", "heldout_loss_bits"))
    return summary, runs


def _clean(obj):
    """JSON-safe: numpy scalars to Python, NaN and inf to None."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _clean(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        return float(obj) if np.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def compare_em(seeds=SEEDS, steps=1000, fig_dir="figures", quick=False, mstep_steps=None,
               transformer_steps=None, chain="exact"):
    """Paper II's EM-like schedule against SGD, and a true M-step, on the sticky chain: one T = 2000 chain
    per seed (the authors' setting) and 32 chains of T = 64 (a second setting); the two-timescale logs;
    exact-Bayes references; the bijection transformer's per-layer gradient norms. Writes em_vs_sgd.png,
    two_timescales.png and dynamics.json to fig_dir. -> the JSON dict.
    The M-step arm runs min(steps, 300) steps unless mstep_steps says otherwise (it costs ~2x a step)."""
    t_start = time.perf_counter()
    seeds = tuple(seeds)
    if quick:
        seeds, steps, T, short, log_every = seeds[:2], 20, 64, (4, 16), 5
        transformer_kw = dict(steps=transformer_steps or 6, n_layers=2, d_model=32, V=6, batch=8,
                              probe_every=2, warmup=2, probe_size=8)
        eval_long, eval_short, long_horizon = dict(n=1, T=64), dict(n=4, T=16), 20
    else:
        T, short, log_every = 2000, (32, 64), 50
        transformer_kw = dict(steps=transformer_steps or 500)
        eval_long, eval_short, long_horizon = dict(n=4, T=2000), dict(n=128, T=64), 1000
    mstep_steps = mstep_steps or min(steps, 300)
    bound = wt.sticky_conditional_entropy_bits(sticky_task(chain)[0])
    out = {"config": dict(seeds=seeds, steps=steps, mstep_steps=mstep_steps, lr=0.01, v_scale=V_SCALE, T=T,
                          short_batch=short, sigma=1.0, d_x=D_X, d_k=D_K, d_v=D_V, classes=N_CLASSES,
                          init_std=INIT_STD, mu_seed=MU_SEED, eval_seed=EVAL_SEED, eval_long=eval_long,
                          eval_short=eval_short, log_every=log_every, quick=quick,
                          precision="float32 training; float64 M-step solve and evaluation",
                          chain=chain, self_transition=float(sticky_task(chain)[0][0, 0]),
                          conditional_entropy_bound_bits=bound)}

    print(f"long chain: T = {T}, full batch, seeds {seeds}", flush=True)
    ref_long = exact_bayes_reference(1.0, **eval_long, chain=chain)
    out["long_chain"], long_runs = compare_setting("long_chain", seeds, lambda s: sticky_data(s, T=T, chain=chain),
                                                   steps, mstep_steps, ref_long, log_every)
    print(f"short sequences: {short[0]} chains of T = {short[1]}, full batch", flush=True)
    ref_short = exact_bayes_reference(1.0, **eval_short, chain=chain)
    out["short_sequences"], short_runs = compare_setting(
        "short_sequences", seeds, lambda s: sticky_data(s, T=short[1], n=short[0], chain=chain), steps, mstep_steps,
        ref_short)

    # exact Bayes: the references at three noise levels, and plain SGD trained and judged at sigma = 3
    out["exact_bayes_reference"] = {str(s): exact_bayes_reference(s, n=4 * eval_long["n"], T=eval_long["T"],
                                                                  chain=chain)[3] for s in (1.0, 2.0, 3.0)}
    print("SGD at sigma = 3 against exact Bayes", flush=True)
    out["sigma3_sgd"] = run_sticky(steps=steps, seed=seeds[0], T=T, sigma=3.0, chain=chain)

    # two timescales: the arms' logs, a longer-horizon SGD run (lr 0.3) where attention does concentrate,
    # and the bijection transformer
    out["two_timescales_one_head"] = _timescale_summary(long_runs)
    print(f"long-horizon SGD, lr 0.3, {long_horizon} steps", flush=True)
    x, targets = sticky_data(seeds[0], T=T, chain=chain)
    params = init_head(seeds[0], dtype="float32")
    lh = train_head(params, x, targets, long_horizon, "sgd", lr=0.3, log_every=log_every, seed=seeds[0])
    lh.update(seed=seeds[0], heldout=evaluate_vs_bayes(params, reference=ref_long))
    out["long_horizon_sgd"] = lh
    print("bijection transformer", flush=True)
    out["transformer"] = transformer_timescales(seed=seeds[0], **transformer_kw)

    out["curves"] = {setting: {m: [{k: r[k] for k in r if k != "params"} for r in rs] for m, rs in runs.items()}
                     for setting, runs in (("long_chain", long_runs), ("short_sequences", short_runs))}
    out["final_params_first_seed"] = {m: long_runs[m][0]["params"] for m in long_runs}
    out["seconds_total"] = time.perf_counter() - t_start
    os.makedirs(fig_dir, exist_ok=True)
    tag = "" if chain == "exact" else "_authors-chain"             # the two chains' results side by side
    plot_em_vs_sgd(out, os.path.join(fig_dir, f"em_vs_sgd{tag}.png"))
    plot_two_timescales(out, os.path.join(fig_dir, f"two_timescales{tag}.png"))
    out = _clean(out)
    # every number in dynamics.json; the per-step curves (about 2 MB) go to runs/dynamics/curves.json
    heavy = ("curves", "final_params_first_seed")
    with open(os.path.join(fig_dir, f"dynamics{tag}.json"), "w") as f:
        json.dump({k: v for k, v in out.items() if k not in heavy}, f, indent=1)
    os.makedirs(os.path.join("runs", "dynamics"), exist_ok=True)
    with open(os.path.join("runs", "dynamics", f"curves{tag}.json"), "w") as f:
        json.dump({k: out[k] for k in heavy}, f)
    print(f"wrote {fig_dir}/em_vs_sgd{tag}.png, two_timescales{tag}.png, dynamics{tag}.json in "
          f"{out['seconds_total']:.0f} s")
    for setting in ("long_chain", "short_sequences"):
        for m in ("em", "mstep"):
            t = out[setting][m]
            print(f"{setting} {m} vs sgd: steps {t['steps_to_threshold_mean']:.0f} +- {t['steps_to_threshold_std']:.0f} "
                  f"(sgd {out[setting]['sgd']['steps_to_threshold_mean']:.0f}), x{t['speedup_steps']:.2f}; paired t "
                  f"on final loss p = {t['paired_final_loss_vs_sgd']['ttest_rel'].get('p')}, on steps p = "
                  f"{t['paired_steps_vs_sgd']['ttest_rel'].get('p')}")
    return out


def _timescale_summary(runs):
    """Seed-mean of the routing/value gradient norms and of the logs, per arm, at a few steps."""
    out = {}
    for m, rs in runs.items():
        routing = np.array([r["routing_norm"] for r in rs])      # (seeds, steps)
        value = np.array([r["value_norm"] for r in rs])
        n = routing.shape[1]
        at = sorted({0, n // 10, n // 4, n // 2, n - 1})
        logs = rs[0]["logs"]
        mean_log = lambda key: [float(np.mean([r["logs"][k][key] for r in rs])) if key in logs[k] else None
                                for k in range(len(logs))]
        out[m] = {"steps": at,
                  "routing_norm": routing.mean(0)[at].tolist(), "value_norm": value.mean(0)[at].tolist(),
                  "routing_over_value": (routing.mean(0) / value.mean(0))[at].tolist(),
                  "log_steps": [l["step"] for l in logs]}
        for key in ("adv_std", "adv_weighted_std", "ds_abs", "attn_entropy_bits", "attn_entropy_frac",
                    "frame_drift", "value_drift", "prototype_cos"):
            out[m][key] = mean_log(key) if logs else []
        out[m]["prototype_cos_mean"] = float(np.mean(out[m]["prototype_cos"])) if logs else None
    return out


# ----------------------------------------------------------------------------
# figures

ARMS = {"sgd": ("SGD (lr 0.01)", "tab:red"), "em": ("EM-like (W_V lr 0.1)", "tab:blue"),
        "mstep": ("true M-step + routing SGD", "tab:green")}
LONG = ("SGD lr 0.3, long horizon", "tab:orange")


def _band(ax, xs, ys, label, color):
    """Mean line and a +-1 std band over the first axis of ys (seeds, steps)."""
    m, s = ys.mean(0), ys.std(0)
    ax.plot(xs, m, color=color, label=label, lw=1.8)
    ax.fill_between(xs, m - s, m + s, color=color, alpha=0.2)


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_em_vs_sgd(out, path):
    """Loss against steps and seconds, steps to threshold, held-out loss against exact Bayes, a table."""
    plt = _plt()
    fig, axes = plt.subplots(2, 3, figsize=(19, 10.5))
    cfg = out["config"]
    bound = cfg["conditional_entropy_bound_bits"]
    settings = {"long_chain": f"one chain of T = {cfg['T']}",
                "short_sequences": f"{cfg['short_batch'][0]} chains of T = {cfg['short_batch'][1]}"}
    for ax, (setting, title) in zip((axes[0, 0], axes[1, 0]), settings.items()):
        summ = out[setting]
        for m, (label, color) in ARMS.items():
            loss = np.array([r["loss"] for r in out["curves"][setting][m]]) / LN2
            s = summ[m]
            _band(ax, np.arange(loss.shape[1]), loss, f"{label}: {s['steps_to_threshold_mean']:.0f} ± "
                  f"{s['steps_to_threshold_std']:.0f} steps to threshold ({s['reached']}/{len(loss)} reached)", color)
        ax.axhline(summ["threshold_bits"], color="k", ls="--", lw=1,
                   label=f"threshold = SGD's mean final loss, {summ['threshold_bits']:.4f}")
        ax.axhline(np.mean(summ["train_bayes_loss_bits"]), color="tab:purple", ls=":", lw=1.5,
                   label=f"exact Bayes predictor on these chains, {np.mean(summ['train_bayes_loss_bits']):.4f}")
        ax.axhline(bound, color="tab:gray", ls="-.", lw=1, label=f"H(Y_t+1 | Y_t) = {bound:.4f}")
        ax.set(xlabel="training step (full batch)", ylabel="training cross-entropy (bits / token)",
               title=f"One head, {title}: mean ± std, {len(summ['per_seed'])} seeds")
        ax.legend(fontsize=7.5, loc="lower left")
        ax.grid(alpha=0.3)
    ax = axes[0, 1]
    for m, (label, color) in ARMS.items():
        for k, r in enumerate(out["curves"]["long_chain"][m]):
            ax.plot(r["seconds"], np.asarray(r["loss"]) / LN2, color=color, lw=1, alpha=0.7,
                    label=f"{label}, {out['long_chain'][m]['seconds_per_step_median'] * 1e3:.0f} ms / step" if k == 0 else None)
    ax.axhline(out["long_chain"]["threshold_bits"], color="k", ls="--", lw=1, label="threshold")
    ax.set(xlabel="compute seconds (logging excluded; a shared 2-core CPU)", ylabel="training cross-entropy (bits / token)",
           title="Long chain against compute time (one line per seed)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[1, 1]
    width = 0.13
    seeds = [row["seed"] for row in out["long_chain"]["per_seed"]]
    xs = np.arange(len(seeds))
    k = 0
    for setting, hatch in (("long_chain", None), ("short_sequences", "//")):
        for m in ("em", "mstep", "sgd"):
            label, color = ARMS[m]
            rows = out[setting]["per_seed"]
            vals = [row[m]["steps_to_threshold"] for row in rows]
            pos = xs + (k - 2.5) * width
            ax.bar(pos, vals, width, color=color, hatch=hatch, alpha=0.85 if hatch is None else 0.4, edgecolor="k",
                   lw=0.5, label=f"{label.split(' (')[0]}, {'long chain' if hatch is None else 'short sequences'}")
            for p, row, v in zip(pos, rows, vals):
                if not row[m]["reached"] or v < 50:
                    ax.text(p, v, "x" if not row[m]["reached"] else str(v), ha="center", va="bottom", fontsize=8)
            k += 1
    ax.set_xticks(xs, [str(s) for s in seeds])
    ax.set(xlabel="seed", ylabel="steps until the training loss is below the threshold",
           title="Steps to threshold per seed (x: not reached, bar = steps run)",
           ylim=(0, 1.35 * ax.get_ylim()[1]))
    ax.legend(fontsize=7.5, ncol=2, loc="upper center")
    ax.grid(alpha=0.3, axis="y")
    ax = axes[0, 2]
    top = min(5.0, max(3.6, max(row[m]["heldout_loss_bits"] for s in settings for row in out[s]["per_seed"]
                                for m in ARMS) + 0.05))          # an overfitting model can be far above: clipped at 5
    for j, setting in enumerate(settings):
        ref = out[setting]["heldout_reference"]
        for i, m in enumerate(ARMS):
            label, color = ARMS[m]
            vals = [row[m]["heldout_loss_bits"] for row in out[setting]["per_seed"]]
            p = 4 * j + i
            ax.bar(p, np.mean(vals), 0.8, color=color, alpha=0.6, edgecolor="k", lw=0.5,
                   label=label if j == 0 else None)
            ax.plot([p] * len(vals), vals, "k.", ms=4)
            ax.text(p, min(np.mean(vals), top) + 0.01, f"{np.mean(vals):.3f}", ha="center", va="bottom", fontsize=8)
        ax.hlines(ref["bayes_loss_bits"], 4 * j - 0.5, 4 * j + 2.5, color="tab:purple", lw=2,
                  label="exact Bayes predictor" if j == 0 else None)
        ax.hlines(ref["conditional_entropy_bound_bits"], 4 * j - 0.5, 4 * j + 2.5, color="tab:gray", ls="-.",
                  label="H(Y_t+1 | Y_t)" if j == 0 else None)
    ax.axhline(3.0, color="k", lw=0.5, ls=":")
    ax.set_xticks([1, 5], ["long chain", "short sequences"])
    ax.set_ylim(2.6, top + 0.1)
    ax.set(ylabel="held-out cross-entropy (bits / token)",
           title=f"Held-out chains (seed {cfg['eval_seed']}) vs exact Bayes; dots: seeds")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax = axes[1, 2]
    ax.axis("off")
    lines = []
    for setting in settings:
        s = out[setting]
        lines.append(f"{setting.replace('_', ' ')}: threshold {s['threshold_bits']:.4f} bits")
        for m in ("em", "mstep"):
            t = s[m]
            p_steps = t["paired_steps_vs_sgd"]
            p_loss = t["paired_final_loss_vs_sgd"]
            lines.append(f"  {m:5s} steps {t['steps_to_threshold_mean']:.0f} ± {t['steps_to_threshold_std']:.0f}"
                         f"  x{t['speedup_steps']:.2f} in steps, x{t['speedup_seconds']:.2f} in seconds")
            lines.append(f"        paired t on final loss p = {p_loss['ttest_rel'].get('p', float('nan')):.2g},"
                         f" on steps p = {p_steps['ttest_rel'].get('p', float('nan')):.2g}"
                         f" (Wilcoxon {p_steps['wilcoxon'].get('p', float('nan')):.2g})")
    lines.append("")
    lines.append("exact Bayes vs H(Y_t+1 | Y_t), held-out, bits:")
    for sig, r in out["exact_bayes_reference"].items():
        lines.append(f"  sigma {float(sig):.0f}: Bayes CE {r['bayes_loss_bits']:.4f} (entropy {r['bayes_entropy_bits']:.4f}),"
                     f" bound {r['conditional_entropy_bound_bits']:.4f}, gap {r['bound_gap_entropy_bits']:.4f}")
    s3 = out["sigma3_sgd"]
    lines.append(f"  SGD at sigma 3: {s3['loss_bits']:.4f} (Bayes {s3['bayes_loss_bits']:.4f}, KL {s3['kl_bits']:.4f})")
    ax.text(0, 1, "\n".join(lines), va="top", family="monospace", fontsize=8.5, transform=ax.transAxes)
    ax.set_title("Summary (steps not reached count as the steps run)")
    fig.suptitle("Paper II, sticky Markov chain: SGD against the EM-like schedule and a true M-step", fontsize=13)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_two_timescales(out, path):
    """Routing vs value gradients, advantages, the frame, prototypes (one head); the same for the transformer."""
    plt = _plt()
    fig, axes = plt.subplots(3, 3, figsize=(19, 15))
    curves = out["curves"]["long_chain"]
    lh = out["long_horizon_sgd"]
    tsum = out["two_timescales_one_head"]
    runs = [(m, np.mean([c["routing_norm"] for c in curves[m]], 0), np.mean([c["value_norm"] for c in curves[m]], 0),
             ARMS[m]) for m in ARMS] + [("long", np.asarray(lh["routing_norm"]), np.asarray(lh["value_norm"]), LONG)]
    logged = [(tsum[m]["log_steps"], tsum[m], ARMS[m]) for m in ARMS if tsum[m]["log_steps"]]
    logged.append(([l["step"] for l in lh["logs"]], {k: [l.get(k) for l in lh["logs"]] for k in lh["logs"][-1]}, LONG))

    ax = axes[0, 0]
    for m, r, v, (label, color) in runs:
        if m != "mstep":                                         # the M-step arm's value gradient is ~0 by design
            ax.plot(r, color=color, lw=1.8, label=f"{label}: routing")
            ax.plot(v, color=color, lw=1.8, ls="--", label=f"{label}: value")
    ax.set_yscale("log")
    ax.set(xlabel="training step", ylabel="gradient norm",
           title="One head: routing |(dW_Q, dW_K)| solid, value |(dW_V, dW_O)| dashed")
    ax.legend(fontsize=7.5)
    ax.grid(alpha=0.3, which="both")

    ax = axes[0, 1]
    for m, r, v, (label, color) in runs:
        if m != "mstep":
            ax.plot(r / v, color=color, lw=1.8, label=label)
    ax.set(xlabel="training step", ylabel="routing / value gradient norm", ylim=(0, None),
           title="One head: routing / value ratio (lr 0.01 arms: seed mean)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")

    ax = axes[0, 2]
    for run, (label, color) in ((curves["sgd"][0], ARMS["sgd"]), (curves["em"][0], ARMS["em"]), (lh, LONG)):
        st = [l["step"] for l in run["logs"]]
        qs = np.array([l["adv_quantiles"] for l in run["logs"]])
        ax.plot(st, qs[:, 4] - qs[:, 0], color=color, ls=":", lw=1.5, label=f"{label}: 5-95% range")
        ax.plot(st, qs[:, 3] - qs[:, 1], color=color, ls="--", lw=1.5, label=f"{label}: 25-75% range")
        ax.plot(st, [l["adv_weighted_std"] for l in run["logs"]], color=color, lw=1.8,
                label=f"{label}: alpha-weighted std")
    ax.set_yscale("log")
    ax.set(xlabel="training step", ylabel="spread of the advantage b_ij - b_bar_i (nats)",
           title=f"Spread of advantages b_ij - b_bar_i (seed {curves['sgd'][0]['seed']})")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3, which="both")

    ax = axes[1, 0]
    for st, s, (label, color) in logged:
        ax.plot(st, s["attn_entropy_frac"], color=color, lw=1.8, marker=".", label=label)
    ax.set(xlabel="training step", ylabel="mean_i H(alpha_i) / log2(i + 1)", ylim=(0, 1.05),
           title="The frame: attention entropy / uniform's")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)

    ax = axes[1, 1]
    for st, s, (label, color) in logged:
        ax.plot(st[1:], s["frame_drift"][1:], color=color, ls=":", lw=1.8, marker=".", label=f"{label}: frame")
        ax.plot(st[1:], s["value_drift"][1:], color=color, ls="--", lw=1.5, label=f"{label}: values")
    ax.set_yscale("log")
    ax.set(xlabel="training step", ylabel="change since the previous log",
           title="Drift per log interval: frame (TV of alpha rows) vs values")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3, which="both")

    ax = axes[1, 2]
    for st, s, (label, color) in logged:
        ax.plot(st, s["prototype_cos"], color=color, lw=1.8, marker=".", label=f"{label}: mean {np.mean(s['prototype_cos']):.3f}")
    ax.axhline(0, color="k", lw=0.5)
    ax.set(xlabel="training step", ylabel="mean_j cos(change of v_j, -sum_i alpha_ij u_i)", ylim=(-1.05, 1.05),
           title="Values become prototypes? v_j's step vs its M-step signal")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)

    tr = out["transformer"]
    routing, value = np.array(tr["routing_norm"]), np.array(tr["value_norm"])
    n_layers = routing.shape[1]
    colors = plt.cm.viridis(np.linspace(0, 0.85, n_layers))
    smooth = lambda a: np.convolve(a, np.ones(10) / 10, mode="valid") if len(a) >= 10 else a
    name = f"Bijection transformer, {n_layers} layers, width {tr['config']['d_model']}"
    ax = axes[2, 0]
    for l in range(n_layers):
        ax.plot(smooth(routing[:, l]), color=colors[l], lw=1.6, label=f"layer {l}: routing |(wq, wk)|")
        ax.plot(smooth(value[:, l]), color=colors[l], lw=1.6, ls="--", label=f"layer {l}: value |(wv, wo)|")
    ax.set_yscale("log")
    ax.set(xlabel="training step", ylabel="gradient norm (10-step running mean)",
           title=f"{name}: gradient norms\nprobe loss {tr['probe_loss_bits']:.3f} bits, exact Bayes "
                 f"{tr['probe_bayes_loss_bits']:.3f}, KL {tr['probe_kl_bits']:.3f}")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3, which="both")
    ax = axes[2, 1]
    for l in range(n_layers):
        ax.plot(smooth(routing[:, l] / value[:, l]), color=colors[l], lw=1.6, label=f"layer {l}")
    ax.set_yscale("log")
    ax.set(xlabel="training step", ylabel="routing / value gradient norm (10-step running mean)",
           title="Transformer: the ratio per layer")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax = axes[2, 2]
    probes = tr["probes"][1:]
    st = [p["step"] for p in probes]
    for l in range(n_layers):
        ax.plot(st, [p["frame_drift"][l] for p in probes], color=colors[l], ls=":", lw=1.8, marker=".",
                label=f"layer {l}: frame (TV of attention rows)")
        ax.plot(st, [p["value_drift"][l] for p in probes], color=colors[l], ls="--", lw=1.5,
                label=f"layer {l}: values (relative change)")
    ax.set_yscale("log")
    ax.set(xlabel="training step (the learning rate decays, cosine, to 0)", ylabel="change between probes",
           title="Transformer: frame vs value drift (fixed probe batch)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3, which="both")
    fig.suptitle("Two timescales: routing (the frame) against values (the precision)", fontsize=14)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run_deep(chain="exact", steps=1000, fig_dir="figures", seeds=SEEDS):
    """The deep variant over the seeds; writes deep_variant[_authors-chain].json to fig_dir. -> the dict."""
    out = _clean(deep_variant(seeds=seeds, steps=steps, chain=chain))
    tag = "" if chain == "exact" else "_authors-chain"
    os.makedirs(fig_dir, exist_ok=True)
    path = os.path.join(fig_dir, f"deep_variant{tag}.json")
    with open(path, "w") as f:
        json.dump({**out, "per_seed": [{k: v for k, v in r.items() if k != "train_loss_bits"} for r in out["per_seed"]]},
                  f, indent=1)
    print(f"deep variant ({chain} chain): held-out {out['test_loss_bits_mean']:.4f} +- {out['test_loss_std_bits']:.4f} "
          f"bits, exact Bayes {out['test_bayes_loss_bits_mean']:.4f}, bound {out['config']['bound_bits']:.4f}, "
          f"KL {out['test_kl_bits_mean']:.4f}; wrote {path}")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Paper II dynamics on the sticky Markov chain.")
    parser.add_argument("--compare-em", action="store_true", help="the full comparison (about 10 minutes)")
    parser.add_argument("--quick", action="store_true", help="the comparison at toy size (seconds)")
    parser.add_argument("--sticky", action="store_true", help="run_sticky: SGD against exact Bayes")
    parser.add_argument("--deep", action="store_true", help="the authors' deep variant, 5 seeds (about an hour)")
    parser.add_argument("--chain", default="exact", choices=CHAINS,
                        help="exact: self-transition 0.3; authors: 0.3498, as the authors' script builds it")
    parser.add_argument("--steps", type=int, default=1000, help="training steps per arm")
    parser.add_argument("--seed", type=int, default=0, help="seed for --sticky")
    parser.add_argument("--sigma", type=float, default=1.0, help="noise for --sticky")
    parser.add_argument("--fig-dir", default="figures", help="where the figures and dynamics.json go")
    args = parser.parse_args()
    if args.sticky:
        m = run_sticky(steps=args.steps, seed=args.seed, sigma=args.sigma, fig_dir=args.fig_dir, chain=args.chain)
        print(json.dumps({k: v for k, v in m.items() if not isinstance(v, list)}, indent=1))
    elif args.deep:
        run_deep(args.chain, args.steps, args.fig_dir)
    elif args.compare_em or args.quick:
        compare_em(steps=args.steps, fig_dir=args.fig_dir, quick=args.quick, chain=args.chain)
    else:
        parser.print_help()
