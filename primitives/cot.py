"""cot: a chain-of-thought model running free, writing its own hops and continuing from them.

Trained teacher-forced, the model is scored at each hop given the true hops before it. Run free, it
writes its own. The answer distribution it then has is
    p_free(a) = sum over chains c_1 .. c_(h-1) of  q(c_1) q(c_2 | c_1) ... q(a | c_1 .. c_(h-1)),
each q the model's distribution at that hop given the context and the hops it wrote. By the chain rule, a
model calibrated at every hop (each q the exact posterior given the hops before it) has p_free equal to
the exact posterior of the last hop given the context alone: the number a direct model predicts in one
step. Three ways to run free:
    free_run     p_free itself, by expanding the chains the model gives at least `prune` of probability,
                 at most `beam` of them per row (the likeliest): the mass it drops is returned, so p_free is
                 exact to within it (a calibrated model has at most as many chains as the posterior has
                 completions: the hops task's m!, 6 at its default). Since the dropped chains only add
                 mass, the KL and the excess cross-entropy against this p_free are upper bounds on those
                 against the whole, and its hallucinated share a lower bound; report adds the upper bound
                 (hallucinated_upper: the dropped mass all put on the implausible answer), while its
                 entropies, accuracy and honest doubt describe the kept mass only
    sample_run   S chains drawn token by token, what a user of the model sees: their final answers'
                 frequencies estimate p_free, with a Monte-Carlo error of about sqrt(p (1 - p) / S) each
    greedy_run   the argmax at every hop but the last; the model's distribution at the last hop
A task with chains exposes chain_layout(batch, s) -> (first (n,), hops (n,)) or None (no chains to run): row
b's hop j (from 1) is predicted at position first[b] + j - 1 and, as the token of its class (class c is
token c), is the input at first[b] + j; and its batch holds final_posterior (n, K), the exact posterior of
the last hop given the context alone, and final_target (n,), the true last hop. The families are causal
(a prediction at t reads the tokens up to t), so what the batch holds after the hop being written is
never read.
"""
import numpy as np

from tunnels import windtunnels as wt
from evaluation import CONFIDENT, IMPLAUSIBLE, evaluate

PRUNE = 1e-4        # free_run expands the chains the model gives at least this probability,
BEAM = 16           # at most this many per row
ROWS = 500          # report runs free on the first ROWS held-out sequences (a chain costs a forward per hop)


def free_run(predict, batch, layout, prune=PRUNE, beam=BEAM):
    """predict(tokens) -> (L, T, K). -> p_free (n, K), the model's free-running answer distribution without
    the chains below prune or past the beam likeliest of a row, and dropped (n,), the mass of those chains."""
    first, hops = layout
    n, K = len(first), batch["posterior"].shape[-1]
    p_free, dropped = np.zeros((n, K)), np.zeros(n)
    rows, tokens, p = np.arange(n), batch["tokens"].copy(), np.ones(n)    # the live chains: row, tokens, probability
    for j in range(1, int(hops.max()) + 1):
        q = predict(tokens)[np.arange(len(rows)), first[rows] + j - 1]    # (L, K) hop j of each live chain
        joint = p[:, None] * q                                            # (L, K)
        last = hops[rows] == j
        np.add.at(p_free, rows[last], joint[last])                       # the chains that end here
        keep = (joint >= prune) & ~last[:, None]
        parent, c = np.nonzero(keep)                                      # the candidates: the beam per row
        order = np.lexsort((-joint[parent, c], rows[parent]))            # by row, likeliest first
        rank = np.arange(len(order)) - np.searchsorted(rows[parent][order], rows[parent][order])
        keep[parent[order[rank >= beam]], c[order[rank >= beam]]] = False
        np.add.at(dropped, rows[~last], np.where(keep, 0.0, joint)[~last].sum(1))
        parent, c = np.nonzero(keep)                                      # the chains that go on, one per class
        rows, p, tokens = rows[parent], joint[parent, c], tokens[parent].copy()
        tokens[np.arange(len(rows)), first[rows] + j] = c
        if not len(rows):
            break
    return p_free, dropped


def sample_run(predict, batch, layout, rng, S):
    """S chains per row, each hop drawn from the model given the hops drawn before it -> (n, K) the
    frequencies of their final answers."""
    first, hops = layout
    n, K = len(first), batch["posterior"].shape[-1]
    rows = np.repeat(np.arange(n), S)                                     # (n S,)
    tokens, answer = np.repeat(batch["tokens"], S, axis=0), np.zeros(n * S, dtype=np.int64)
    for j in range(1, int(hops.max()) + 1):
        live = np.flatnonzero(hops[rows] >= j)
        q = predict(tokens[live])[np.arange(len(live)), first[rows[live]] + j - 1]   # (L, K)
        c = (rng.random((len(live), 1)) > np.cumsum(q, axis=1)).sum(1).clip(max=K - 1)   # inverse CDF draw
        answer[live] = c
        go = hops[rows[live]] > j                                         # the chains that go on write it
        tokens[live[go], first[rows[live[go]]] + j] = c[go]
    return np.stack([np.bincount(answer[rows == b], minlength=K) for b in range(n)]) / S


def greedy_run(predict, batch, layout):
    """-> (n, K) the model's distribution at the last hop, after writing its argmax at every hop before."""
    first, hops = layout
    n, K = len(first), batch["posterior"].shape[-1]
    tokens, out = batch["tokens"].copy(), np.zeros((n, K))
    for j in range(1, int(hops.max()) + 1):
        live = np.flatnonzero(hops >= j)
        q = predict(tokens[live])[np.arange(len(live)), first[live] + j - 1]
        done = hops[live] == j
        out[live[done]] = q[done]
        go = live[~done]
        tokens[go, first[go] + j] = q[~done].argmax(-1)
    return out


def as_answers(batch, layout, q):
    """The final answers as a batch of one position per row scored by evaluation.evaluate: posterior
    final_posterior, target final_target, the groups "h=1", "h=2", ...; and q (n, K) as its prediction."""
    _, hops = layout
    n = len(hops)
    one = np.ones((n, 1))
    answers = dict(tokens=np.zeros((n, 1), dtype=np.int64), targets=batch["final_target"][:, None], mask=one,
                   posterior=batch["final_posterior"][:, None],
                   groups={f"h={k}": (hops == k).astype(float)[:, None] for k in np.unique(hops)})
    return evaluate(lambda tokens: q[:, None], answers)[0]


def report(predict, batch, layout, prune=PRUNE, beam=BEAM, rows=ROWS):
    """The free-running and greedy final answers of the batch's first `rows` rows against the exact
    posterior given the context alone, each as evaluation.evaluate's metrics (per h in its groups); free
    also with the mass of the chains it dropped (largest and mean over the rows) and its prune and beam."""
    n = min(rows, len(layout[0]))
    batch, layout = wt.rows_of(batch, slice(0, n)), (layout[0][:n], layout[1][:n])
    p_free, dropped = free_run(predict, batch, layout, prune, beam)
    free = as_answers(batch, layout, p_free)
    post, hops = batch["final_posterior"], layout[1]
    upper = np.any((p_free + dropped[:, None] > CONFIDENT) & (post < IMPLAUSIBLE), axis=-1)    # (n,)
    for name, g in free["groups"].items():
        g["hallucinated_upper"] = float(upper[hops == int(name[2:])].mean())
    free.update(dropped_mass_max=float(dropped.max()), dropped_mass_mean=float(dropped.mean()), prune=prune,
                beam=beam, rows=n)
    greedy = as_answers(batch, layout, greedy_run(predict, batch, layout))
    return dict(free=free, greedy=greedy)


def examples(predict, batch, layout, k=4, prune=PRUNE, beam=BEAM):
    """The companion figure's sequences: the first k rows whose exact final answer is uncertain (the others
    if too few) -> dict(rows, hops, posterior (k, K), p_free (k, K), dropped (k,)): what the model, running
    free, ends on against the exact posterior given the context alone."""
    uncertain = np.flatnonzero(batch["final_posterior"].max(-1) < 1.0)
    rows = np.concatenate([uncertain, np.setdiff1d(np.arange(len(layout[0])), uncertain)])[:k]
    sub = wt.rows_of(batch, rows)
    p_free, dropped = free_run(predict, sub, (layout[0][rows], layout[1][rows]), prune, beam)
    return dict(rows=rows, hops=layout[1][rows], posterior=sub["final_posterior"], p_free=p_free, dropped=dropped)

