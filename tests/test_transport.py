"""The transport wind tunnel (tunnels/transport.py): its exact posterior against a brute force over every state
sequence, its window filters by hand, the staircase its prior was chosen for, and effective memory."""
import itertools

import numpy as np
import pytest

from tunnels import tasks
from tunnels import transport as tr
from tunnels import windtunnels as wt

pytestmark = pytest.mark.plain_python


def brute_force(P, E, obs):
    """p(s_t | o_0..o_t) for every t, summing over all S^(t+1) state sequences: written from the definition."""
    S, out = len(P), []
    for t in range(len(obs)):
        post = np.zeros(S)
        for seq in itertools.product(range(S), repeat=t + 1):
            p = 1.0 / S
            for u, s in enumerate(seq):
                p *= (P[seq[u - 1], s] if u else 1.0) * E[s, obs[u]]
            post[seq[-1]] += p
        out.append(post / post.sum())
    return np.array(out)


def test_the_posterior_is_the_brute_forces():
    b = tr.batch(np.random.default_rng(1), 3, n_obs=4)
    P, E, obs = tr.read_header(b["tokens"])
    for i in range(3):
        np.testing.assert_allclose(b["posterior"][i, tr.HEADER:], brute_force(P[i], E[i], obs[i]), atol=1e-12)
    assert set(b["tokens"][:, 0]) <= set(range(90, 98)) and set(b["tokens"][:, 1]) <= set(range(35, 51))
    assert (b["tokens"][:, 2] == tr.SEP).all() and tasks.sizes("transport", {"observations": 4})["max_len"] == 7


def test_window_filters_by_hand():
    """stay 0.90, acc 0.50, observations 0, 0: at t = 1 the exact filter is 0.7749 on state 0 (0.4625 x 0.5 over
    0.2984375), the memoryless one 0.5 (its emission column alone), and KL(exact || memoryless) 0.2306 bits (a
    swapped KL gives 0.2225, nats 0.1598). Windows of k >= t are the exact filter."""
    tokens = np.array([[90, 50, tr.SEP, tr.OBS0, tr.OBS0]])
    P, E, obs = tr.read_header(tokens)
    exact = brute_force(P[0], E[0], obs[0])
    b = dict(tokens=tokens, posterior=np.concatenate([np.full((1, 3, 5), 0.2), exact[None]], 1))
    assert exact[1, 0] == pytest.approx(0.23125 / 0.2984375) == pytest.approx(0.77487, abs=1e-5)
    k0 = tr.window_filter(b, 0)[0, tr.HEADER + 1]
    np.testing.assert_allclose(k0, [0.5, 0.125, 0.125, 0.125, 0.125])
    assert wt.kl_bits(exact[1], k0) == pytest.approx(0.2306, abs=1e-4)
    np.testing.assert_allclose(tr.window_filter(b, 1)[0, tr.HEADER:], exact, atol=1e-12)
    np.testing.assert_allclose(tr.window_filter(b, 16)[0, tr.HEADER:], exact, atol=1e-12)


def test_the_prior_needs_memory_the_staircase():
    """On 2,000 sequences of 20 observations: the memoryless filter scores under 0.35, one observation of memory
    under 0.6 of the gap (the authors' HMM: 0.99), eight over 0.9, sixteen over 0.99, rising at every step."""
    st = tr.staircase(tr.batch(np.random.default_rng(0), 2000, 20))
    scores = [st[k][1] for k in tr.WINDOWS]
    assert scores == sorted(scores) and scores[0] < 0.35 and st[1][1] < 0.6 and st[8][1] > 0.9 and st[16][1] > 0.99
    np.testing.assert_allclose(tr.shortcut(tr.batch(np.random.default_rng(0), 5, 20)),
                               tr.window_filter(tr.batch(np.random.default_rng(0), 5, 20), 0))


def test_effective_memory_reads_between_the_steps_in_log_k():
    """KL 0.30 between k = 1 (0.35) and k = 2 (0.25): halfway in log2(1 + k), k = 2^(1 + 0.5 log2 1.5) - 1 =
    1.4495 (linear in k would say 1.5); at a step exactly, that k; worse than memoryless or better than the
    longest window: the end, said so."""
    steps = {0: 0.5, 1: 0.35, 2: 0.25, 4: 0.13, 8: 0.03, 16: 0.001}
    k, where = tr.effective_memory(0.30, steps)
    assert where == "within" and k == pytest.approx(1.4495, abs=1e-4)
    assert tr.effective_memory(0.35, steps) == (pytest.approx(1.0), "within")
    assert tr.effective_memory(0.6, steps) == (0.0, "below") and tr.effective_memory(0.0005, steps) == (16.0, "above")
    with pytest.raises(ValueError, match="must fall with k"):
        tr.effective_memory(0.2, {0: 0.5, 1: 0.1, 2: 0.3})
