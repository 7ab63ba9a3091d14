"""training: one training step (loss and gradients, clipping, AdamW) and the project's one training loop.

Every run trains through `train`: the transformer and the baselines of train.py, Paper II's three arms
on the sticky chain (SGD, EM-like, a true M-step), its deep variant and the timescales experiment of
dynamics/experiments.py. What differs between them is the step (a function of the step index that draws its batch
and updates the parameters) and what happens after each step (logging, snapshots, checkpoints); the
loop itself, the non-finite guard, the timing and the handling of Ctrl-C, SIGTERM and SIGHUP are
written once, here.
"""

import math
import signal
import time

import numpy as np

import optim

GRAD_CLIP = 1.0             # global gradient norm
BETAS = (0.9, 0.98)         # AdamW
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)   # finish the step, save, stop


class Interrupted(Exception):
    """Ctrl-C, SIGTERM or SIGHUP stopped a run; the message says where, and what was kept to continue from."""


class TrainingStopped(Exception):
    """The loss or the gradient turned non-finite (nothing of that step was applied), or a checkpoint could
    not be saved; the message says at which step."""


def train_step(loss_and_grads, params, opt_state, tokens, targets, mask, lr, weight_decay=0.0, on_grads=None,
               decay=None):
    """One step, in place on params and opt_state: the loss and every gradient, global-norm clipping at
    GRAD_CLIP, one AdamW step (weight decay on the names in decay; None: every matrix).
    -> (loss in nats, gradient norm before clipping). When either is not finite nothing is updated.
    on_grads(grads), if given, sees the gradients before clipping (dynamics/experiments.py logs their norms)."""
    with np.errstate(over="ignore", invalid="ignore"):
        loss, grads = loss_and_grads(params, tokens, targets, mask)
        if on_grads is not None:
            on_grads(grads)
        norm = optim.clip_grad_norm(grads, GRAD_CLIP)
    if math.isfinite(loss) and math.isfinite(norm):
        optim.adamw_step(params, grads, opt_state, lr, beta1=BETAS[0], beta2=BETAS[1], weight_decay=weight_decay,
                         decay=decay)
    return loss, norm


def compile_step(loss_and_grads, params, opt_state, tokens, targets, mask, weight_decay=0.0, decay=None):
    """One train_step on copies of params and opt_state, thrown away: Numba compiles a kernel at its first call
    (half a minute on a cold cache, a fraction of a second from the cache), so a run calls this before its
    clock starts, and its training time and time left count training only. The batch should be a real one
    (the twins pick one thread or all by its size). -> seconds it took."""
    t0 = time.perf_counter()
    copy = lambda tree: {k: copy(v) if isinstance(v, dict) else np.copy(v) if isinstance(v, np.ndarray) else v
                          for k, v in tree.items()}
    train_step(loss_and_grads, copy(params), copy(opt_state), tokens, targets, mask, 0.0, weight_decay, decay=decay)
    return time.perf_counter() - t0


def train(step, steps, start=0, stop=None, on_step=None, on_interrupt=None, progress=None, prior_seconds=0.0):
    """The training loop: for i = start .. min(stop, steps) - 1, record = step(i), a dict with the step's
    "loss" (nats) and, where it has one, its "grad_norm"; then on_step(i, record, compute_seconds) (not
    timed). compute_seconds is the time spent inside step() so far, this session.
    A loss or gradient norm that is not finite raises TrainingStopped naming step i + 1 (the step applies
    nothing then: train_step's rule). Ctrl-C, SIGTERM and SIGHUP only raise a flag: the current step
    finishes, then on_interrupt(i + 1) runs (a checkpoint) and the loop returns; a second signal
    interrupts at once. progress(), if given, is called after every step (a progress bar's update).
    -> dict(step reached, seconds: wall time of training summed over resumes (prior_seconds before this
    session), compute_seconds, interrupted)."""
    stop = steps if stop is None else min(stop, steps)
    interrupted = []

    def on_signal(signum, frame):
        if interrupted:
            raise KeyboardInterrupt
        interrupted.append(signum)
    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    t0, compute, i = time.time() - prior_seconds, 0.0, start
    try:
        for i in range(start, stop):
            c0 = time.perf_counter()
            with np.errstate(over="ignore", invalid="ignore"):     # an overflow is reported once, below
                record = step(i)
            compute += time.perf_counter() - c0
            loss, norm = record["loss"], record.get("grad_norm", 0.0)
            if not (math.isfinite(loss) and math.isfinite(norm)):
                raise TrainingStopped(f"step {i + 1}: the loss ({loss}) or the gradient norm ({norm}) is not "
                                      f"finite; training stopped")
            if on_step is not None:
                on_step(i, record, compute)
            if progress is not None:
                progress()
            if interrupted:
                if on_interrupt is not None:
                    on_interrupt(i + 1)
                return dict(step=i + 1, seconds=time.time() - t0, compute_seconds=compute, interrupted=True)
        i = stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return dict(step=max(i, start), seconds=time.time() - t0, compute_seconds=compute, interrupted=False)
