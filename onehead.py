"""onehead: Paper II's single attention head on the sticky Markov chain (wind tunnel 3), and its optimisers.

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

import math

import layers as ly  # first: it sets OPENBLAS_NUM_THREADS=1 before NumPy loads
import bayesattn as ba
import numpy as np
from numba import njit

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
    O, alpha = ba.attention_forward.numpy(Q, K, V)                 # (B, T, d_v), (B, T, T): o_i = sum_j alpha_ij v_j
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
    """Mean cross-entropy (nats) of int targets (B, T) under softmax(logits) (B, T, K) -> loss, dlogits:
    layers.cross_entropy with every position supervised, its NumPy code always (a parallel kernel per
    call costs more than this whole (N, 8) problem)."""
    return ly.cross_entropy.numpy(logits, targets, np.ones(targets.shape))


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


