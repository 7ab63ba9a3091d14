"""optim: AdamW with decoupled weight decay, global-norm gradient clipping, warm-up + cosine schedule.

Parameters and gradients are dicts name -> array; every step updates the parameters in place.
"""

import math

import numpy as np


def adamw_init(params):
    return {"t": 0,
            "m": {k: np.zeros_like(v) for k, v in params.items()},
            "v": {k: np.zeros_like(v) for k, v in params.items()}}


def adamw_step(params, grads, state, lr, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0,
               decay=None, lr_scale=None):
    """One AdamW step, in place on params and state:
        m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,  mhat = m / (1 - b1^t),  vhat = v / (1 - b2^t)
        p = p - lr * (mhat / (sqrt(vhat) + eps) + wd * p)      (wd only on the names in decay)
    decay: the set of parameter names that take weight decay (models.decay_set: the family's rule); None:
    every matrix (two or more axes), no vector or gain.
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
        if weight_decay and (name in decay if decay is not None else p.ndim >= 2):
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
