"""onehead: Paper II's single attention head on the sticky Markov chain (tunnels/sticky.py), and its optimisers.

The model is the paper's single causal attention head: no MLP, no residual, no biases.
    q = x W_Q,  k = x W_K,  v = x W_V                x (T, d_x): d_x = 20, d_k = 10, d_v = 15
    s_ij = q_i . k_j / sqrt(d_k)  (j <= i),  alpha_ij = softmax_j s_ij   (the diagonal included)
    o_i = sum_j alpha_ij v_j,  logits_i = o_i W_O    8 classes; the target at i is y_{i+1}
Its backward is the EM reading of attention, Paper II's gradient equations, in the transformer's own
ops (bayesattn.attention_forward and attention_backward, whose Numba twins run inside
`with kernels.enabled():` and whose NumPy code runs otherwise, as for every model here):
    u_i = dL/do_i = dlogits_i W_O^T                  the error signal of query i
    E-step  ds_ij = alpha_ij (b_ij - b_bar_i)        b_ij = u_i . v_j,  b_bar_i = sum_j alpha_ij b_ij
    M-step  dv_j  = sum_i alpha_ij u_i               a step moves v_j along -dv_j: against its queries' errors
    dq_i = sum_j ds_ij k_j / sqrt(d_k),  dk_j = sum_i ds_ij q_i / sqrt(d_k)
and then dW_Q = x^T dq, dW_K = x^T dk, dW_V = x^T dv, dW_O = o^T dlogits.

Experiments (Paper II, section on the sticky chain, and past it; dynamics/experiments.py runs them):
    SGD       all four weights, plain SGD, lr 0.01
    EM-like   the same gradient, but W_V stepped with lr 0.1 (10x)
    M-step    with alpha fixed the model is multinomial logistic regression on h_i = sum_j alpha_ij x_j
              (o_i = h_i W_V): solve it by Newton in W = W_V W_O, write W back into W_V, then one
              gradient step on W_Q, W_K.

Notation: B sequences, T time steps, d_x, d_k, d_v as above, K = 8 classes, N = B * T rows.
Gradient convention (layers.py's): a backward returns FRESH arrays, here a dict keyed like the
parameters ("W_Q", "W_K", "W_V", "W_O"). Losses are nats inside the code and bits in every report.
"""

import math

import layers as ly  # first: it sets OPENBLAS_NUM_THREADS=1 before NumPy loads
import bayesattn as ba
import numpy as np

D_X, D_K, D_V, N_CLASSES = 20, 10, 15, 8
INIT_STD = 0.1                           # all four weights ~ N(0, 0.1^2), as the authors
SEEDS = (42, 2024, 1337, 7777, 9999)     # the authors' five seeds
EVAL_SEED = 31337                        # held-out sequences, a seed no training run uses
V_SCALE = 10.0                           # EM-like: W_V steps 10x faster
ROUTING, VALUE = ("W_Q", "W_K"), ("W_V", "W_O")
LN2 = math.log(2.0)


def _rows(a):
    """(..., C) -> (N, C)."""
    return a.reshape(-1, a.shape[-1])


# ----------------------------------------------------------------------------
# the model

def init_head(seed, std=INIT_STD, dtype="float64"):
    """W_Q (d_x, d_k), W_K (d_x, d_k), W_V (d_x, d_v), W_O (d_v, K), all N(0, std^2)."""
    rng = np.random.default_rng(seed)
    shapes = {"W_Q": (D_X, D_K), "W_K": (D_X, D_K), "W_V": (D_X, D_V), "W_O": (D_V, N_CLASSES)}
    return {name: rng.normal(0.0, std, shape).astype(dtype) for name, shape in shapes.items()}


def head_forward(params, x):
    """x (B, T, d_x) -> logits (B, T, K), cache. One head: the attention op's head axis has length 1."""
    x = np.ascontiguousarray(x, dtype=params["W_Q"].dtype)
    q = x @ params["W_Q"]                                        # (B, T, d_k)
    k = x @ params["W_K"]                                        # (B, T, d_k)
    v = x @ params["W_V"]                                        # (B, T, d_v)
    o, alpha = ba.attention_forward(q[:, None], k[:, None], v[:, None])   # (B, 1, T, d_v), (B, 1, T, T)
    o, alpha = o[:, 0], alpha[:, 0]                              # o_i = sum_j alpha_ij v_j
    logits = o @ params["W_O"]                                   # (B, T, K)
    return logits, dict(x=x, q=q, k=k, v=v, alpha=alpha, o=o)


def error_signal(dlogits, params):
    """u_i = dL/do_i = dlogits_i W_O^T: (B, T, K) -> (B, T, d_v)."""
    return dlogits @ params["W_O"].T


def head_backward(dlogits, cache, params):
    """dlogits (B, T, K) -> grads. Reverses head_forward line by line."""
    x, q, k, v, alpha, o = (cache[n] for n in ("x", "q", "k", "v", "alpha", "o"))
    g = {"W_O": _rows(o).T @ _rows(dlogits)}                     # forward: logits = o W_O
    u = error_signal(dlogits, params)                            # (B, T, d_v)
    # forward: o = alpha v, alpha = softmax(q k^T / sqrt(d_k)): the E-step and the M-step
    dq, dk, dv = ba.attention_backward(u[:, None], alpha[:, None], q[:, None], k[:, None], v[:, None])
    # forward: q = x W_Q, k = x W_K, v = x W_V
    g["W_Q"] = _rows(x).T @ _rows(dq[:, 0])
    g["W_K"] = _rows(x).T @ _rows(dk[:, 0])
    g["W_V"] = _rows(x).T @ _rows(dv[:, 0])
    return g


def cross_entropy(logits, targets):
    """Mean cross-entropy (nats) of int targets (B, T) under softmax(logits) (B, T, K) -> loss, dlogits:
    layers.cross_entropy with every position supervised."""
    return ly.cross_entropy(logits, targets, np.ones(targets.shape))


def head_loss(params, x, targets):
    """Mean cross-entropy (nats) of the targets y_{t+1} (B, T) -> loss, dlogits, logits, cache."""
    logits, cache = head_forward(params, x)
    loss, dlogits = cross_entropy(logits, targets)
    return loss, dlogits, logits, cache


def head_loss_and_grads(params, x, targets):
    """-> loss (nats), grads, cache."""
    loss, dlogits, _, cache = head_loss(params, x, targets)
    return loss, head_backward(dlogits, cache, params), cache


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


def m_step_update(params, cache, x, targets, lr):
    """One step of the M-step arm, in place: the M-step at fixed alpha, then one gradient step on W_Q, W_K
    whose E-step sees the new values.
    -> loss after the M-step (nats), the Newton losses, routing grads, u (B, T, d_v) at the new values."""
    H = _rows(cache["alpha"] @ cache["x"]).astype(np.float64)   # (N, d_x) h_i = sum_j alpha_ij x_j
    W = params["W_V"].astype(np.float64) @ params["W_O"].astype(np.float64)
    W, losses = m_step(H, targets.reshape(-1), W)
    params["W_V"] = refactor_values(W, params)
    loss, dlogits, _, new = head_loss(params, x, targets)        # the same alpha (W_Q, W_K unchanged), new values
    g = {name: grad for name, grad in head_backward(dlogits, new, params).items() if name in ROUTING}
    sgd_step({k: params[k] for k in ROUTING}, g, lr)
    return loss, losses, g, error_signal(dlogits, params)
