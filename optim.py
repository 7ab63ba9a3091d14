"""optim: AdamW with decoupled weight decay, global-norm gradient clipping, warm-up + cosine schedule.

Parameters and gradients are dicts name -> array; every step updates the parameters in place.
"""

import math

import numpy as np

from layers import twin


def adamw_init(params):
    return {"t": 0,
            "m": {k: np.zeros_like(v) for k, v in params.items()},
            "v": {k: np.zeros_like(v) for k, v in params.items()}}


def adamw_step(params, grads, state, lr, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0,
               decay=None, lr_scale=None):
    """One AdamW step, in place on params and state: adamw_update (its formula) on every tensor.
    decay: the set of parameter names that take weight decay (models.decay_set: the family's rule); None:
    every matrix (two or more axes), no vector or gain.
    lr_scale: optional dict name -> factor multiplying lr for that tensor (two-timescale schedules)."""
    state["t"] += 1
    for name, p in params.items():
        step_lr = lr * (lr_scale.get(name, 1.0) if lr_scale else 1.0)
        decays = weight_decay and (name in decay if decay is not None else p.ndim >= 2)
        adamw_update(p, grads[name], state["m"][name], state["v"][name], step_lr, beta1, beta2, state["t"], eps,
                     weight_decay if decays else 0.0)


@twin
def adamw_update(p, g, m, v, lr, beta1, beta2, t, eps, weight_decay):
    """One tensor's AdamW update at step t (from 1), in place on p, m and v:
        m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,  mhat = m / (1 - b1^t),  vhat = v / (1 - b2^t)
        p = p - lr * (mhat / (sqrt(vhat) + eps) + wd * p)"""
    m *= beta1
    m += (1 - beta1) * g
    v *= beta2
    v += (1 - beta2) * g * g
    mhat = m / (1 - beta1 ** t)
    vhat = v / (1 - beta2 ** t)
    if weight_decay:
        p -= lr * weight_decay * p
    p -= lr * mhat / (np.sqrt(vhat) + eps)


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
