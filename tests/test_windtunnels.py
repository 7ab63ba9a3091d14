"""Tests for the wind tunnels: the shared math (tunnels/windtunnels.py), every task module's exact posterior
(tunnels/bijection.py, tunnels/sawtooth.py, tunnels/hmm.py, tunnels/sticky.py) against brute-force enumeration, and the registry (tunnels/tasks.py)."""
import itertools
import math

import numpy as np
import pytest

from tunnels import bijection
from tunnels import hmm
from tunnels import sawtooth
from tunnels import sticky
from tunnels import tasks
from tunnels import windtunnels as wt


# ----------------------------------------------------------------------------
# tunnels/windtunnels.py: the shared math


def test_entropy_and_kl_bits():
    p = np.array([[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.25] * 4])  # (3, 4)
    np.testing.assert_allclose(wt.entropy_bits(p), [1.0, 0.0, 2.0])
    np.testing.assert_allclose(wt.entropy_bits(p.T, axis=0), [1.0, 0.0, 2.0])
    assert not np.signbit(wt.entropy_bits(p)[1]) and str(np.round(wt.entropy_bits(p), 3)) == "[1. 0. 2.]"  # no "-0."
    q = np.full(4, 0.25)
    np.testing.assert_allclose(wt.kl_bits(p, q), [1.0, 2.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(wt.kl_bits(p, p), 0.0, atol=1e-15)
    # q = 0 where p > 0 stays finite (and huge) thanks to the clip
    kl = wt.kl_bits([0.5, 0.5], [1.0, 0.0])
    assert np.isfinite(kl) and kl > 400


def test_sample_categorical_draws_by_p_and_never_an_impossible_class():
    rng = np.random.default_rng(0)
    p = np.array([[0.5, 0.0, 0.5], [0.0, 0.0, 1.0], [0.2, 0.3, 0.5]])      # (3, 3) one distribution per row
    draws = wt.sample_categorical(rng, np.broadcast_to(p, (20000, 3, 3)))   # (20000, 3)
    assert draws.dtype == np.int64 and draws.shape == (20000, 3)
    assert np.all(draws[:, 0] != 1) and np.all(draws[:, 1] == 2)           # p = 0 is never drawn
    freq = np.stack([np.bincount(draws[:, r], minlength=3) / 20000 for r in range(3)])
    np.testing.assert_allclose(freq, p, atol=0.015)                         # about 4 standard errors


def test_logsumexp_is_stable_and_minus_inf_for_an_empty_slice():
    a = np.array([[0.0, math.log(3.0)], [-np.inf, -np.inf], [1000.0, 1000.0]])
    out = wt.logsumexp(a, axis=1)
    np.testing.assert_allclose(out[[0, 2]], [math.log(4.0), 1000.0 + math.log(2.0)], rtol=1e-15)
    assert out[1] == -np.inf                                                # not nan, not an overflow


def test_check_stochastic():
    P = wt.check_stochastic([[0.5, 0.5], [0.25, 0.75]], "P")
    assert P.dtype == np.float64 and P.shape == (2, 2)
    assert wt.check_stochastic(np.full((2, 3), 1 / 3), "E", square=False).shape == (2, 3)
    with pytest.raises(ValueError, match=r"^P must be a \(k, k\) matrix, got shape \(2, 3\)$"):
        wt.check_stochastic(np.full((2, 3), 1 / 3), "P")
    with pytest.raises(ValueError, match="^P must have non-negative rows summing to 1$"):
        wt.check_stochastic([[1.5, -0.5], [0.5, 0.5]], "P")                 # rows sum to 1, one entry < 0
    with pytest.raises(ValueError, match="^E must have non-negative rows summing to 1$"):
        wt.check_stochastic([[0.5, 0.4], [0.5, 0.5]], "E")


# ----------------------------------------------------------------------------
# tunnels/bijection.py (Paper I's format a)


def brute_bijection_posterior(keys, values, V):
    """Count the permutations consistent with the pairs before i, tally where they send keys[i]."""
    perms = np.array(list(itertools.permutations(range(V))))  # (V!, V)
    posterior = np.zeros((len(keys), V))
    for i in range(len(keys)):
        consistent = np.all(perms[:, keys[:i]] == values[:i], axis=1)  # (V!,)
        posterior[i] = np.bincount(perms[consistent, keys[i]], minlength=V) / consistent.sum()
    return posterior


@pytest.mark.parametrize("V", [2, 3, 4, 5])
@pytest.mark.parametrize("replacement", [False, True])
def test_bijection_posterior_matches_enumeration(V, replacement):
    rng = np.random.default_rng(V + 10 * replacement)
    for _ in range(5):
        perm = rng.permutation(V)
        L = 2 * V if replacement else V
        keys = rng.integers(0, V, L) if replacement else rng.permutation(V)
        values = perm[keys]
        np.testing.assert_allclose(bijection.posterior(keys, values, V), brute_bijection_posterior(keys, values, V), atol=1e-12)


def test_bijection_posterior_rejects_inconsistent_pairs():
    with pytest.raises(ValueError, match="key 0"):
        bijection.posterior([0, 0], [1, 2], V=3)  # key 0 mapped twice
    with pytest.raises(ValueError, match="already taken"):
        bijection.posterior([0, 1], [1, 1], V=3)  # value 1 taken twice
    with pytest.raises(ValueError, match="0..2"):
        bijection.posterior([0, 3], [1, 2], V=3)


@pytest.mark.parametrize("replacement,query", [(False, False), (False, True), (True, False), (True, True)])
def test_bijection_batch_consistent_with_reference(replacement, query):
    rng = np.random.default_rng(1)
    V, n = 6, 50
    L = 12 if replacement else V - 1
    batch = bijection.batch(rng, n, V=V, n_pairs=L, replacement=replacement, query=query)
    tokens, targets, mask, posterior = batch["tokens"], batch["targets"], batch["mask"], batch["posterior"]
    Tlen = 2 * L + query
    assert tokens.shape == targets.shape == mask.shape == (n, Tlen)
    assert posterior.shape == (n, Tlen, V)
    assert tokens.dtype == targets.dtype == np.int64 and mask.dtype == posterior.dtype == np.float64
    keys, values = tokens[:, 0 : 2 * L : 2], tokens[:, 1 : 2 * L : 2] - V  # (n, L) each
    assert keys.min() >= 0 and keys.max() < V and values.min() >= 0 and values.max() < V
    # mask: every key, and the query
    expected_mask = np.zeros(Tlen)
    expected_mask[0 : 2 * L : 2] = 1
    if query:
        expected_mask[-1] = 1
    assert np.all(mask == expected_mask)
    assert np.all(posterior[:, mask[0] == 0] == 0) and np.all(targets[:, mask[0] == 0] == 0)
    for b in range(n):
        ref = bijection.posterior(keys[b], values[b], V)  # also checks the pairs form a bijection
        np.testing.assert_allclose(posterior[b, 0 : 2 * L : 2], ref, atol=1e-15)
        assert np.all(targets[b, 0 : 2 * L : 2] == values[b])
        if not replacement:
            assert len(set(keys[b])) == L
        if query:
            q = tokens[b, -1]
            assert q in keys[b]
            assert targets[b, -1] == values[b][list(keys[b]).index(q)]
            assert posterior[b, -1, targets[b, -1]] == 1.0
    # the posterior is a distribution and never rules out the truth
    at = mask == 1
    np.testing.assert_allclose(posterior[at].sum(-1), 1.0)
    assert np.all(np.take_along_axis(posterior, targets[..., None], -1)[..., 0][at] > 0)


def test_bijection_entropy_curve():
    rng = np.random.default_rng(2)
    V = 20
    curve = bijection.entropy_curve(V)
    assert curve.shape == (V - 1,)
    np.testing.assert_allclose(curve, np.log2(V - np.arange(1, V) + 1.0))
    batch = bijection.batch(rng, 100, V=V)
    H = wt.entropy_bits(batch["posterior"][:, 0::2])  # (n, L) every sequence, not just on average
    np.testing.assert_allclose(H, np.broadcast_to(curve, H.shape), atol=1e-12)
    np.testing.assert_allclose(bijection.entropy_curve(4, 4), [2.0, np.log2(3), 1.0, 0.0])


def test_bijection_with_replacement_sawtooth():
    rng = np.random.default_rng(3)
    batch = bijection.batch(rng, 200, V=8, n_pairs=30, replacement=True)
    keys = batch["tokens"][:, 0::2]  # (n, L)
    H = wt.entropy_bits(batch["posterior"][:, 0::2])  # (n, L)
    for b in range(len(keys)):
        seen = np.array([keys[b, i] in keys[b, :i] for i in range(keys.shape[1])])
        assert np.all(H[b, seen] == 0)  # a repeated key is certain
        distinct_before = np.array([len(set(keys[b, :i])) for i in range(keys.shape[1])])
        np.testing.assert_allclose(H[b, ~seen], np.log2(8 - distinct_before[~seen]))


def test_bijection_batch_is_calibrated():
    # a Bayes posterior is calibrated: E[p(true class)] = E[sum_c p(c)^2], E[-log p(true)] = E[H]
    rng = np.random.default_rng(4)
    batch = bijection.batch(rng, 4000, V=10, n_pairs=10, replacement=True)
    at = batch["mask"] == 1
    p_true = np.take_along_axis(batch["posterior"], batch["targets"][..., None], -1)[..., 0][at]
    p = batch["posterior"][at]
    assert abs(p_true.mean() - (p**2).sum(-1).mean()) < 0.01


def test_bijection_batch_bad_arguments():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="V must be >= 2, got 1"):
        bijection.batch(rng, 4, V=1)
    with pytest.raises(ValueError, match="n_pairs must be >= 1, got 0"):
        bijection.batch(rng, 4, V=5, n_pairs=0)
    with pytest.raises(ValueError, match="n_pairs must be <= V = 5 without replacement, got 6"):
        bijection.batch(rng, 4, V=5, n_pairs=6)
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        bijection.batch(rng, 0, V=5)
    with pytest.raises(ValueError, match="n_pairs must be in 1..5, got 6"):
        bijection.entropy_curve(5, 6)
    assert bijection.batch(rng, 2, V=5, n_pairs=9, replacement=True)["tokens"].shape == (2, 18)  # allowed with replacement


def test_bijection_prior_gap_by_hand():
    """The prior predicts uniformly over V values (log2 V bits); H_Bayes at the i-th key is log2(V - i + 1).
    V = 4: mean(2 - 2, 2 - log2 3, 2 - 1) = (3 - log2 3) / 3 = 0.471679. V = 20: log2 20 - log2(20!) / 19 =
    1.107329, the paper's 1.107."""
    assert bijection.prior_gap_bits({"V": 4}) == pytest.approx((3 - math.log2(3)) / 3, abs=1e-12)
    assert bijection.prior_gap_bits({"V": 4}) == pytest.approx(0.471679, abs=1e-6)
    assert bijection.prior_gap_bits({"V": 20}) == pytest.approx(math.log2(20) - math.log2(math.factorial(20)) / 19, abs=1e-12)
    assert bijection.prior_gap_bits({"V": 20}) == pytest.approx(1.107329, abs=1e-6)


# ----------------------------------------------------------------------------
# tunnels/sawtooth.py (Paper I's format b)


@pytest.mark.parametrize("alphabet", [None, 3])
def test_sawtooth_batch_matches_reference(alphabet):
    rng = np.random.default_rng(5)
    V, L, n = 6, 9, 40
    batch = sawtooth.batch(rng, n, V=V, n_pairs=L, alphabet=alphabet)
    tokens, targets, mask, post = batch["tokens"], batch["targets"], batch["mask"], batch["posterior"]
    assert tokens.shape == targets.shape == mask.shape == batch["query_mask"].shape == (n, 2 * L + 1)
    assert tokens.max() < V                                   # one shared vocabulary for keys and values
    keys, values, query = tokens[:, 0:2 * L:2], tokens[:, 1:2 * L:2], tokens[:, -1]
    expected_mask = np.zeros(2 * L + 1)
    expected_mask[0:2 * L:2], expected_mask[-1] = 1, 1       # every key predicts its value; the query too
    assert np.all(mask == expected_mask) and np.all(batch["query_mask"] == np.eye(2 * L + 1)[-1])
    for b in range(n):
        np.testing.assert_allclose(post[b, 0:2 * L:2], bijection.posterior(keys[b], values[b], V), atol=1e-12)
        assert query[b] in keys[b]                           # the query repeats a context key ...
        answer = values[b][list(keys[b]).index(query[b])]
        assert targets[b, -1] == answer and post[b, -1, answer] == 1.0   # ... so its posterior is one-hot
        np.testing.assert_array_equal(targets[b, 0:2 * L:2], values[b])
        if alphabet:
            assert len(set(keys[b])) <= alphabet


def test_distinct_keys_distribution_by_hand():
    # 3 keys, 3 draws: 3 of the 27 sequences use 1 key, 3 * (2^3 - 2) = 18 use 2, 3! = 6 use all 3
    np.testing.assert_allclose(sawtooth.distinct_keys_distribution(3, 3), [0, 3 / 27, 18 / 27, 6 / 27])
    np.testing.assert_allclose(sawtooth.distinct_keys_distribution(3, 0), [1, 0, 0, 0])


def test_sawtooth_entropy_curve_and_prior_gap_by_hand():
    # V = 3: key 1 is new, H = log2 3; key 2 is new with probability 2/3, then H = log2 2 = 1;
    # key 3: one distinct key before (prob 1/3) and new (2/3) gives H = 1, two before gives H = log2 1 = 0
    np.testing.assert_allclose(sawtooth.entropy_curve(3, 3), [np.log2(3), 2 / 3, 2 / 9])
    # the prior's gap over the L = V - 1 = 2 value positions (the query, H = 0, is not among them):
    # mean(log2 3 - log2 3, log2 3 - 2/3) = 0.4591; with the query it would be 0.8340, in nats 0.3182
    assert sawtooth.prior_gap_bits({"V": 3, "curriculum": ""}) == pytest.approx((np.log2(3) - 2 / 3) / 2, abs=1e-12)
    assert sawtooth.prior_gap_bits({"V": 3, "curriculum": ""}) == pytest.approx(0.459148, abs=1e-6)
    # format a, V = 3: H = log2 3, log2 2 at the two keys, gap = (log2 3 - 1) / 2
    assert bijection.prior_gap_bits({"V": 3}) == pytest.approx((np.log2(3) - 1) / 2, abs=1e-12)
    assert bijection.prior_gap_bits({"V": 20}) == pytest.approx(1.1073, abs=1e-4)                   # the paper's V = 20
    assert sawtooth.prior_gap_bits({"V": 20, "curriculum": ""}) == pytest.approx(1.8490, abs=1e-4)  # the paper's "1.85"


def test_sawtooth_entropy_curve_matches_sampled_sequences():
    batch = sawtooth.batch(np.random.default_rng(6), 20000, V=8, n_pairs=12)
    H = wt.entropy_bits(batch["posterior"][:, 0:24:2]).mean(0)   # (L,)
    np.testing.assert_allclose(H, sawtooth.entropy_curve(8, 12), atol=0.03)


def brute_sawtooth_entropy_curve(V, L):
    """E[H_Bayes] at each of L keys by enumerating all V^L equally likely key sequences, each scored by the
    enumeration-tested bijection.posterior (the entropy does not depend on the bijection: take the identity)."""
    H = np.zeros(L)
    for keys in itertools.product(range(V), repeat=L):
        keys = np.array(keys)
        H += wt.entropy_bits(bijection.posterior(keys, keys, V))            # (L,)
    return H / V**L


@pytest.mark.parametrize("V,L", [(3, 3), (4, 3), (5, 4)])
def test_sawtooth_entropy_curve_matches_enumeration(V, L):
    np.testing.assert_allclose(sawtooth.entropy_curve(V, L), brute_sawtooth_entropy_curve(V, L), atol=1e-12)


def test_sawtooth_prior_gap_for_four_keys_by_hand():
    """V = 4, L = 3. Key 1: H = log2 4 = 2. Key 2: new with probability 3/4, then H = log2 3. Key 3: after
    two draws one distinct key (1/4), new with 3/4 and H = log2 3; or two (3/4), new with 2/4 and H = 1:
    E[H] = 3/16 log2 3 + 3/8. The gap: mean(2 - H) = (29/8 - 15/16 log2 3) / 3 = 0.713033 bits."""
    np.testing.assert_allclose(sawtooth.entropy_curve(4), [2.0, 0.75 * math.log2(3), 3 / 16 * math.log2(3) + 3 / 8])
    assert sawtooth.prior_gap_bits({"V": 4, "curriculum": ""}) == pytest.approx((29 / 8 - 15 / 16 * math.log2(3)) / 3, abs=1e-12)
    assert sawtooth.prior_gap_bits({"V": 4, "curriculum": ""}) == pytest.approx(0.713033, abs=1e-6)
    # the curriculum changes how training keys are drawn, not the task the gap is of
    assert sawtooth.prior_gap_bits({"V": 4, "curriculum": "2:100"}) == sawtooth.prior_gap_bits({"V": 4, "curriculum": ""})


def test_sawtooth_curriculum_draws_from_smaller_alphabets_and_keeps_the_posterior_exact():
    stages = sawtooth.parse_curriculum("2:10,4:20", 5)
    assert stages == [(10, 2), (20, 4)] and sawtooth.parse_curriculum("", 5) == []
    assert [sawtooth.curriculum_alphabet(stages, step) for step in (0, 9, 10, 19, 20, None)] == [2, 2, 4, 4, None, None]
    for text, error in (("five", "expected stages alphabet:until_step"), ("6:10", "each alphabet must lie in 1..5"),
                        ("2:10,3:5", "the steps must increase")):
        with pytest.raises(ValueError, match=error):
            sawtooth.parse_curriculum(text, 5)
        assert error in sawtooth.check_curriculum(text, {"V": 5})
    assert sawtooth.check_curriculum("2:10", {"V": 5}) is None
    s = {"V": 5, "curriculum": "2:10"}
    distinct = lambda b: np.array([len(set(row)) for row in b["tokens"][:, 0:8:2]])   # (n,) keys used, L = 4
    early = sawtooth.sample(np.random.default_rng(0), 200, s, step=9)
    assert distinct(early).max() <= 2                                   # keys from 2-key alphabets
    keys, values = early["tokens"][:, 0:8:2], early["tokens"][:, 1:8:2]
    for b in range(200):
        np.testing.assert_allclose(early["posterior"][b, 0:8:2], bijection.posterior(keys[b], values[b], 5), atol=1e-15)
    # from step 10, and for held-out sets (no step), the task itself: more than 2 keys in some row
    late, held = sawtooth.sample(np.random.default_rng(0), 200, s, step=10), sawtooth.sample(np.random.default_rng(0), 200, s)
    assert distinct(late).max() > 2 and np.array_equal(late["tokens"], held["tokens"])


def test_sawtooth_bad_arguments():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="alphabet must lie in 1..5, got 6"):
        sawtooth.batch(rng, 2, V=5, alphabet=6)
    with pytest.raises(ValueError, match="V must be >= 2, got 1"):
        sawtooth.batch(rng, 2, V=1)


# ----------------------------------------------------------------------------
# tunnels/hmm.py


def test_hmm_sample_params_on_the_grid():
    rng = np.random.default_rng(5)
    for _ in range(300):
        for M in hmm.sample_params(rng):                     # P, then E
            assert M.shape == (5, 5) and M.dtype == np.float64
            hundredths = np.rint(100 * M).astype(np.int64)
            np.testing.assert_allclose(100 * M, hundredths, atol=1e-9)
            assert np.all(hundredths.sum(1) == 100), hundredths
            assert np.all(hundredths >= 5)
    P, E = hmm.sample_params_batch(rng, 2000)  # (n, S, S) each
    counts = np.rint(100 * np.stack([P, E])).astype(np.int64)
    assert np.all(counts.sum(-1) == 100) and counts.min() >= 5
    assert abs(P.mean() - 0.2) < 0.002  # each row is exchangeable, so every entry has mean 1/5


def test_hmm_round_hundredths_edge_cases():
    # many entries just under 0.05 force the floor to push the sum above 100
    p = np.array([[0.041, 0.041, 0.041, 0.041, 0.836], [0.2] * 5, [0.125, 0.125, 0.125, 0.125, 0.5], [0.05, 0.05, 0.05, 0.05, 0.8]])
    counts = hmm.round_hundredths(p)
    assert counts.dtype == np.int64
    assert np.all(counts.sum(1) == 100) and counts.min() >= 5
    assert list(counts[0]) == [5, 5, 5, 5, 80]
    assert list(counts[1]) == [20] * 5
    assert list(counts[3]) == [5, 5, 5, 5, 80]
    assert np.abs(counts[2] - 100 * p[2]).max() <= 1.0
    rng = np.random.default_rng(6)
    q = rng.dirichlet(np.ones(5), size=10000)
    q = np.maximum(q, 0.05)
    q /= q.sum(1, keepdims=True)
    counts = hmm.round_hundredths(q)
    assert np.all(counts.sum(1) == 100) and counts.min() >= 5
    # close to the unrounded probabilities: entries >= 4.17 hundredths, so raising up to four of them
    # to 5 costs at most 4 * 0.83 = 3.33 hundredths taken from the others
    assert np.abs(counts - 100 * q).max() < 3.4


def brute_hmm_filter(P, E, pi, obs):
    """p(s_t | o_0..o_t) by summing the joint over every path s_0..s_t."""
    S = len(pi)
    belief = np.zeros((len(obs), S))
    for t in range(len(obs)):
        paths = np.array(list(itertools.product(range(S), repeat=t + 1)))  # (S^(t+1), t+1)
        joint = pi[paths[:, 0]] * np.prod(E[paths, obs[: t + 1]], axis=1)  # (S^(t+1),)
        if t > 0:
            joint *= np.prod(P[paths[:, :-1], paths[:, 1:]], axis=1)
        belief[t] = np.bincount(paths[:, -1], weights=joint, minlength=S) / joint.sum()
    return belief


def test_hmm_filter_matches_enumeration():
    rng = np.random.default_rng(7)
    for n_obs in [1, 2, 4, 6]:
        P, E = hmm.sample_params(rng)
        pi = rng.dirichlet(np.ones(5))  # a non-uniform start tests the convention s_0 ~ pi
        obs = rng.integers(0, 5, n_obs)
        np.testing.assert_allclose(hmm.forward_filter(P, E, pi, obs), brute_hmm_filter(P, E, pi, obs), atol=1e-12)
    # a 3-state, 2-symbol HMM with a structural zero
    P = np.array([[0.9, 0.1, 0.0], [0.0, 0.5, 0.5], [0.3, 0.3, 0.4]])
    E = np.array([[0.8, 0.2], [0.1, 0.9], [0.5, 0.5]])
    pi = np.array([0.6, 0.3, 0.1])
    obs = np.array([0, 1, 1, 0, 1, 0])
    np.testing.assert_allclose(hmm.forward_filter(P, E, pi, obs), brute_hmm_filter(P, E, pi, obs), atol=1e-12)
    batch = hmm.forward_filter_batch(P[None], E[None], pi, obs[None])[0]
    np.testing.assert_allclose(batch, brute_hmm_filter(P, E, pi, obs), atol=1e-12)


def test_hmm_filter_stable_for_long_sequences():
    rng = np.random.default_rng(8)
    P, E = hmm.sample_params(rng)
    obs = rng.integers(0, 5, 5000)
    belief = hmm.forward_filter(P, E, np.full(5, 0.2), obs)
    assert belief.shape == (5000, 5)
    assert np.all(np.isfinite(belief)) and belief.min() >= 0
    np.testing.assert_allclose(belief.sum(1), 1.0, atol=1e-12)


def test_hmm_tokens_round_trip():
    rng = np.random.default_rng(9)
    for n_obs in [0, 1, 20, 50]:
        P, E = hmm.sample_params(rng)
        obs = rng.integers(0, 5, n_obs)
        tokens = hmm.tokens_of(P, E, obs)
        assert tokens.shape == (hmm.HEADER + n_obs,) and tokens.dtype == np.int64
        assert tokens.min() >= 0 and tokens.max() < hmm.VOCAB
        assert tokens[25] == tokens[51] == 96 and np.all(tokens[52:] == 97 + obs)
        P2, E2, obs2 = hmm.detokenize(tokens)
        assert np.array_equal(P, P2) and np.array_equal(E, E2) and np.array_equal(obs, obs2)
    # token id -> value (id + 5) / 100 at the extremes
    P = np.full((5, 5), 0.05)
    P[:, 0] = 0.80
    tokens = hmm.tokens_of(P, P, [0])
    assert tokens[0] == 75 and tokens[1] == 0
    assert hmm.S == 5 and hmm.VOCAB == 102 and hmm.HEADER == 52


def test_hmm_batch_matches_filter():
    rng = np.random.default_rng(10)
    n, n_obs = 64, 20
    batch = hmm.batch(rng, n, n_obs=n_obs)
    tokens, targets, mask, posterior = batch["tokens"], batch["targets"], batch["mask"], batch["posterior"]
    assert tokens.shape == targets.shape == mask.shape == (n, 52 + n_obs)
    assert posterior.shape == (n, 52 + n_obs, 5)
    assert tokens.dtype == targets.dtype == np.int64 and mask.dtype == posterior.dtype == np.float64
    assert np.all(mask[:, :52] == 0) and np.all(mask[:, 52:] == 1)
    assert np.all(posterior[:, :52] == 0) and np.all(targets[:, :52] == 0)
    assert targets.min() >= 0 and targets.max() < 5
    np.testing.assert_allclose(posterior[:, 52:].sum(-1), 1.0, atol=1e-12)
    for b in range(n):
        P, E, obs = hmm.detokenize(tokens[b])
        np.testing.assert_allclose(posterior[b, 52:], hmm.forward_filter(P, E, np.full(5, 0.2), obs), atol=1e-12)


def test_hmm_batch_is_calibrated():
    # the true states are drawn from the same model the filter assumes: E[p(s_true)] = E[sum_s p(s)^2]
    rng = np.random.default_rng(11)
    batch = hmm.batch(rng, 3000, n_obs=10)
    at = batch["mask"] == 1
    p_true = np.take_along_axis(batch["posterior"], batch["targets"][..., None], -1)[..., 0][at]
    p = batch["posterior"][at]
    assert abs(p_true.mean() - (p**2).sum(-1).mean()) < 0.01
    assert abs(-np.log2(p_true).mean() - wt.entropy_bits(p).mean()) < 0.03


def test_hmm_prior_gap_is_the_mean_kl_to_uniform():
    """log2 5 - H(p) = KL(p || uniform): two routes to the same Monte Carlo number, which also stays put
    between seeds (standard error about 1e-3 bits at 100,000 HMMs, 3e-3 at 20,000)."""
    gap = hmm.prior_gap_bits({"n_obs": 20}, n=20000, seed=3)
    batch = hmm.batch(np.random.default_rng(3), 10000, 20)
    post = batch["posterior"][:, hmm.HEADER:]
    kl = wt.kl_bits(post, np.full(5, 0.2)).mean()
    assert abs(gap - kl) < 0.01 and abs(gap - hmm.prior_gap_bits({"n_obs": 20}, n=20000, seed=4)) < 0.01
    assert 0.40 < gap < 0.44                                  # the authors' MLP and LSTM: 0.416


def test_hmm_bad_arguments():
    rng = np.random.default_rng(0)
    P, E = hmm.sample_params(rng)
    with pytest.raises(ValueError, match="n must be >= 1"):
        hmm.batch(rng, 0)
    with pytest.raises(ValueError, match="n_obs must be >= 1"):
        hmm.batch(rng, 4, n_obs=0)
    with pytest.raises(ValueError, match="symbols in 0..4"):
        hmm.forward_filter(P, E, np.full(5, 0.2), [0, 5])
    with pytest.raises(ValueError, match="rows summing to 1"):
        hmm.forward_filter(P * 2, E, np.full(5, 0.2), [0])
    with pytest.raises(ValueError, match="pi must be a distribution"):
        hmm.forward_filter(P, E, np.full(5, 0.3), [0])
    with pytest.raises(ValueError, match="zero probability"):
        hmm.forward_filter(np.eye(2), np.eye(2), [1.0, 0.0], [0, 1])
    with pytest.raises(ValueError, match="multiples of 0.01"):
        hmm.tokens_of(np.full((5, 5), 0.2) + [0.001, -0.001, 0, 0, 0], E, [0])
    with pytest.raises(ValueError, match="rows must sum to exactly 1.00"):
        hmm.tokens_of(np.full((5, 5), 0.21), E, [0])
    with pytest.raises(ValueError, match=r"\[0.05, 1.00\]"):
        hmm.tokens_of(np.eye(5), E, [0])
    tokens = hmm.tokens_of(P, E, [1, 2])
    with pytest.raises(ValueError, match="SEP"):
        hmm.detokenize(np.r_[tokens[:25], 0, tokens[26:]])
    with pytest.raises(ValueError, match="at least 52"):
        hmm.detokenize(tokens[:40])


# ----------------------------------------------------------------------------
# tunnels/sticky.py: Paper II's sticky Markov chain


def test_sticky_transition():
    P = sticky.transition()
    assert P.shape == (8, 8)
    np.testing.assert_allclose(P.sum(1), 1.0)
    np.testing.assert_allclose(np.diag(P), 0.3)
    # row 0: weights 1/d for d = 1, 2, 3, 4, 3, 2, 1 over symbols 1..7
    w = 1 / np.array([1, 2, 3, 4, 3, 2, 1])
    np.testing.assert_allclose(P[0, 1:], 0.7 * w / w.sum())
    np.testing.assert_allclose(P, P.T)  # circulant and symmetric
    # stationary distribution is uniform, so H(Y'|Y) is the entropy of one row
    np.testing.assert_allclose(sticky.conditional_entropy_bits(P), wt.entropy_bits(P[0]))
    P3 = sticky.transition(3, 0.5)
    np.testing.assert_allclose(P3, [[0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.25, 0.25, 0.5]])
    with pytest.raises(ValueError, match="n_symbols must be >= 2, got 1"):
        sticky.transition(1)
    with pytest.raises(ValueError, match="self_prob must be in"):
        sticky.transition(8, 1.5)


def test_sticky_authors_self_prob():
    # by hand for 8 symbols: distances 1, 1, 2, 2, 3, 3, 4 sum to 47/12 in reciprocal, S = 0.3 + 47/12,
    # P[i, i] = 0.3 + 0.3 * 0.7 / S = 0.349802
    assert sticky.authors_self_prob(8, 0.3) == pytest.approx(0.3 + 0.21 / (0.3 + 47 / 12), abs=1e-15)
    assert sticky.authors_self_prob(8, 0.3) == pytest.approx(0.349802, abs=1e-6)
    # the same row built the authors' way: 0.3 on the diagonal, 1 / distance elsewhere, normalised, scaled
    # by 0.7, plus 0.3 on the diagonal
    row = np.array([0.3] + [1 / min(j, 8 - j) for j in range(1, 8)])
    row = row / row.sum() * 0.7 + np.eye(8)[0] * 0.3
    np.testing.assert_allclose(sticky.transition(8, sticky.authors_self_prob())[0], row, atol=1e-15)
    assert sticky.conditional_entropy_bits(sticky.transition(8, sticky.authors_self_prob())) == \
        pytest.approx(2.639, abs=1e-3)                      # the authors' bound, against 2.717 at exactly 0.3


def test_sticky_conditional_entropy_non_uniform_stationary():
    P = np.array([[0.9, 0.1], [0.5, 0.5]])  # stationary (5/6, 1/6)
    H = lambda p: -sum(x * math.log2(x) for x in p)
    expected = 5 / 6 * H([0.9, 0.1]) + 1 / 6 * H([0.5, 0.5])
    assert abs(sticky.conditional_entropy_bits(P) - expected) < 1e-12


def brute_sticky_posterior(P, mu, x, sigma):
    """p(y_{t+1} | x[0..t]) by summing over every symbol path y_0..y_{t+1}."""
    M = len(P)
    lik = np.exp(-np.sum((x[:, None] - mu[None]) ** 2, -1) / (2 * sigma**2))  # (T, M)
    predictive = np.zeros((len(x), M))
    for t in range(len(x)):
        paths = np.array(list(itertools.product(range(M), repeat=t + 2)))  # (M^(t+2), t+2) y_0..y_{t+1}
        joint = np.prod(lik[np.arange(t + 1), paths[:, : t + 1]], axis=1) / M  # (M^(t+2),)
        joint *= np.prod(P[paths[:, :-1], paths[:, 1:]], axis=1)
        predictive[t] = np.bincount(paths[:, -1], weights=joint, minlength=M) / joint.sum()
    return predictive


def test_sticky_posterior_matches_enumeration():
    rng = np.random.default_rng(12)
    P = np.array([[0.6, 0.4, 0.0], [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]])  # not symmetric, one impossible move
    mu = sticky.means(rng, 3, 4)  # (3, 4)
    for T in [1, 2, 3, 4]:
        for sigma in [0.5, 1.0, 2.0]:
            x, y = sticky.sample(rng, P, mu, T, n=1, sigma=sigma)
            ref = brute_sticky_posterior(P, mu, x[0], sigma)
            post = sticky.posterior(P, mu, x[0], sigma)
            assert post.shape == (T, 3)
            np.testing.assert_allclose(post, ref, atol=1e-12)
            np.testing.assert_allclose(post.sum(1), 1.0, atol=1e-12)
            np.testing.assert_allclose(sticky.posterior_batch(P, mu, x, sigma)[0], ref, atol=1e-12)


def test_sticky_batch_matches_reference_and_is_stable():
    rng = np.random.default_rng(13)
    P = sticky.transition()
    mu = sticky.means(rng)
    x, y = sticky.sample(rng, P, mu, 30, n=20, sigma=1.0)
    assert x.shape == (20, 30, 20) and y.shape == (20, 31)
    assert x.dtype == np.float64 and y.dtype == np.int64
    batch = sticky.posterior_batch(P, mu, x, 1.0)  # (n, T, M)
    for b in range(20):
        np.testing.assert_allclose(batch[b], sticky.posterior(P, mu, x[b], 1.0), atol=1e-12)
    # tiny noise makes huge log-likelihoods: still finite, and the filter knows y_t, so it predicts P[y_t]
    x, y = sticky.sample(rng, P, mu, 2000, n=2, sigma=1e-3)
    post = sticky.posterior_batch(P, mu, x, 1e-3)
    assert np.all(np.isfinite(post))
    np.testing.assert_allclose(post, P[y[:, :-1]], atol=1e-9)


def test_sticky_sample_statistics():
    rng = np.random.default_rng(14)
    P = sticky.transition()
    mu = sticky.means(rng)
    x, y = sticky.sample(rng, P, mu, 200, n=100, sigma=0.7)
    counts = np.zeros((8, 8))
    np.add.at(counts, (y[:, :-1], y[:, 1:]), 1)
    np.testing.assert_allclose(counts / counts.sum(1, keepdims=True), P, atol=0.03)
    noise = x - mu[y[:, :-1]]  # x[t] is a view of the current symbol y_t
    assert abs(noise.std() - 0.7) < 0.01 and abs(noise.mean()) < 0.01


def test_sticky_posterior_is_calibrated():
    rng = np.random.default_rng(15)
    P = sticky.transition()
    mu = sticky.means(rng)
    x, y = sticky.sample(rng, P, mu, 20, n=2000, sigma=3.0)
    post = sticky.posterior_batch(P, mu, x, 3.0)  # (n, T, M)
    p_true = np.take_along_axis(post, y[:, 1:, None], -1)[..., 0]  # (n, T) targets are y[:, 1:]
    assert abs(p_true.mean() - (post**2).sum(-1).mean()) < 0.01
    # the exact predictor never beats the bound that sees y_t itself
    assert wt.entropy_bits(post).mean() >= sticky.conditional_entropy_bits(P) - 1e-9


def test_sticky_bad_arguments():
    rng = np.random.default_rng(0)
    P = sticky.transition()
    mu = sticky.means(rng)
    with pytest.raises(ValueError, match="sigma must be a finite number > 0"):
        sticky.sample(rng, P, mu, 5, sigma=0.0)
    with pytest.raises(ValueError, match="same M"):
        sticky.sample(rng, P, mu[:5], 5)
    with pytest.raises(ValueError, match="T must be >= 1"):
        sticky.sample(rng, P, mu, 0)
    with pytest.raises(ValueError, match="rows summing to 1"):
        sticky.posterior(P * 0.5, mu, np.zeros((3, 20)), 1.0)
    with pytest.raises(ValueError, match=r"x must be \(T, 20\)"):
        sticky.posterior(P, mu, np.zeros((3, 4)), 1.0)
    with pytest.raises(ValueError, match=r"x must be \(n, T, 20\)"):
        sticky.posterior_batch(P, mu, np.zeros((3, 20)), 1.0)


# ----------------------------------------------------------------------------
# tunnels/tasks.py: the registry, and the protocol every registered task keeps

# small settings of every registered task, and its sizes there by hand: bijection T = 2 (V - 1), two
# vocabularies; sawtooth T = 2 (V - 1) + 1, one shared vocabulary; hmm T = 52 + n_obs, evaluated up to 50
SMALL = {"bijection": ({"V": 5}, dict(vocab=10, classes=5, max_len=8, eval_len=8)),
         "sawtooth": ({"V": 5, "curriculum": ""}, dict(vocab=5, classes=5, max_len=9, eval_len=9)),
         "hmm": ({"n_obs": 3}, dict(vocab=102, classes=5, max_len=55, eval_len=102))}


def test_registry_names_its_tasks_and_refuses_others_in_one_line():
    assert list(tasks.TASKS)[:3] == ["bijection", "sawtooth", "hmm"] and set(SMALL) <= set(tasks.TASKS)
    assert (tasks.task("bijection"), tasks.task("sawtooth"), tasks.task("hmm")) == (bijection, sawtooth, hmm)
    allowed = ", ".join(tasks.TASKS)
    for name in ("nope", "sticky", "Bijection"):                # tunnels/sticky.py is outside the registry
        with pytest.raises(ValueError, match=rf"^task '{name}': allowed are {allowed}$"):
            tasks.task(name)
    with pytest.raises(ValueError, match=f"allowed are {allowed}"):
        tasks.settings("nope")


@pytest.mark.parametrize("name", list(SMALL))
def test_the_papers_tasks_have_their_sizes(name):
    s, sizes = SMALL[name]
    assert tasks.sizes(name, s) == sizes


@pytest.mark.parametrize("name", list(tasks.TASKS))
def test_every_task_keeps_the_protocol(name):
    mod = tasks.task(name)
    s = tasks.settings(name, mod.TINY["train"])
    assert set(mod.TINY) == {"train", "grad"} and set(mod.TINY["train"]) <= set(mod.SETTINGS)
    for flag, spec in mod.FLAGS.items():                         # each flag sets a declared setting
        assert flag.startswith("--") and spec["setting"] in mod.SETTINGS and spec["help"]
        assert spec["check"](mod.SETTINGS[spec["setting"]], mod.SETTINGS) is None   # the default is allowed
    assert {"quick", "default", "paper"} <= set(mod.PRESETS)
    sizes = tasks.sizes(name, s)
    assert set(sizes) == {"vocab", "classes", "max_len", "eval_len"} and sizes["eval_len"] >= sizes["max_len"]
    if hasattr(mod, "settings_of"):                              # only a task with older checkpoints has it
        cfg = type("Cfg", (), {"n_classes": 5})()                # an older checkpoint's model config
        assert set(mod.settings_of(cfg)) == set(mod.SETTINGS)
    # settings: the defaults, overridden by the declared settings given (None is not given; others dropped)
    assert tasks.settings(name, {**s, "not_a_setting": 1}) == s and tasks.settings(name) == mod.SETTINGS
    assert tasks.settings(name, {k: None for k in mod.SETTINGS}) == mod.SETTINGS != s


@pytest.mark.parametrize("step", [None, 0])
@pytest.mark.parametrize("name", list(tasks.TASKS))
def test_every_task_samples_consistent_batches(name, step):
    s = tasks.settings(name, tasks.task(name).TINY["train"])
    sizes = tasks.sizes(name, s)
    n, T, K = 7, sizes["max_len"], sizes["classes"]
    b = tasks.sample(name, np.random.default_rng(0), n, s, step)
    assert set(b) <= {"tokens", "targets", "mask", "posterior", "query_mask", "groups", "final_posterior", "final_target"}
    if "final_posterior" in b:                                    # a task with chains (primitives/cot.py): one per row
        assert b["final_posterior"].shape == (n, K) and b["final_target"].shape == (n,)
        assert np.allclose(b["final_posterior"].sum(1), 1.0)
    for where in b.get("groups", {}).values():                   # each group: supervised answers, at least one
        assert where.shape == (n, T) and not np.any((where > 0) & (b["mask"] == 0)) and np.any(where > 0)
    assert b["tokens"].shape == b["targets"].shape == b["mask"].shape == (n, T) and b["posterior"].shape == (n, T, K)
    assert b["tokens"].dtype == b["targets"].dtype == np.int64 and b["posterior"].dtype == np.float64
    assert 0 <= b["tokens"].min() and b["tokens"].max() < sizes["vocab"]
    assert 0 <= b["targets"].min() and b["targets"].max() < K
    at = b["mask"] > 0                                           # (n, T) supervised positions
    query = b.get("query_mask", np.zeros((n, T))) > 0
    assert not np.any(query & ~at) and np.all((at & ~query).any(1))   # every row has an answer on the curve
    np.testing.assert_allclose(b["posterior"][at].sum(-1), 1.0, atol=1e-12)
    assert b["posterior"].min() >= 0 and np.all(b["posterior"][~at] == 0) and np.all(b["targets"][~at] == 0)
    p_target = np.take_along_axis(b["posterior"], b["targets"][..., None], -1)[..., 0]   # (n, T)
    assert np.all(p_target[at] > 0)                              # the posterior never rules out the truth


def test_held_out_sets_are_seeded_apart_and_keep_their_seeds():
    s = SMALL["bijection"][0]
    sets = tasks.held_out_sets("bijection", s, 6, seed=3)
    assert list(sets) == [""]
    # the generator (EVAL_SEED, seed, 20) as it has always been: the same sequences every time
    again = bijection.sample(np.random.default_rng((tasks.EVAL_SEED, 3, 20)), 6, s)
    assert all(np.array_equal(sets[""][k], again[k]) for k in again)
    assert not np.array_equal(sets[""]["tokens"], tasks.held_out_sets("bijection", s, 6, seed=4)[""]["tokens"])
    for step in range(5):                                        # apart from the training stream (seed, step)
        train = tasks.sample("bijection", np.random.default_rng((3, step)), 6, s, step)
        assert not np.array_equal(sets[""]["tokens"], train["tokens"])
    # a curriculum shapes training only: the held-out set is the task itself
    saw = {"V": 5, "curriculum": "2:1000"}
    a, b = (tasks.held_out_sets("sawtooth", x, 6, seed=0)[""] for x in (saw, {**saw, "curriculum": ""}))
    assert np.array_equal(a["tokens"], b["tokens"])
    # the HMM: the task itself, then its variants at the training length and the longer ones, by label
    sets = tasks.held_out_sets("hmm", {"n_obs": 3}, 2, seed=0)
    assert list(sets) == ["", "3", "30", "50"] and sets["3"] is sets[""]
    assert [sets[k]["tokens"].shape for k in sets] == [(2, 55), (2, 55), (2, 82), (2, 102)]
    long = hmm.sample(np.random.default_rng((tasks.EVAL_SEED, 0, 50)), 2, {"n_obs": 50})
    assert np.array_equal(sets["50"]["tokens"], long["tokens"])
    assert list(tasks.held_out_sets("hmm", {"n_obs": 50}, 1, seed=0)) == ["", "50"]


def test_prior_gap_of_every_task_by_hand():
    """tasks.prior_gap_bits: bijection V = 20 log2 20 - log2(20!) / 19 = 1.107 and V = 4 (3 - log2 3) / 3;
    sawtooth V = 20 1.849 (the paper's 1.85) and V = 4 (29/8 - 15/16 log2 3) / 3 (the by-hand test above);
    hmm: Monte Carlo, near the authors' MLP and LSTM (0.416)."""
    assert tasks.prior_gap_bits("bijection", {"V": 20}) == pytest.approx(1.107329, abs=1e-6)
    assert tasks.prior_gap_bits("bijection", {"V": 4}) == pytest.approx((3 - math.log2(3)) / 3, abs=1e-12)
    assert tasks.prior_gap_bits("sawtooth", {"V": 20, "curriculum": ""}) == pytest.approx(1.849037, abs=1e-6)
    assert tasks.prior_gap_bits("sawtooth", {"V": 4, "curriculum": ""}) == pytest.approx(
        (29 / 8 - 15 / 16 * math.log2(3)) / 3, abs=1e-12)
    gap = tasks.prior_gap_bits("hmm", {"n_obs": 20})
    assert isinstance(gap, float) and 0.40 < gap < 0.44


@pytest.mark.parametrize("name,tol", [("bijection", 1e-12), ("sawtooth", 0.02), ("hmm", 0.02)])
def test_prior_gap_is_the_paper_metric_of_a_uniform_predictor(name, tol):
    """What prior_gap_bits claims: the paper metric of a predictor that knows only the prior (uniform over
    the classes). Exact for the bijection (H_Bayes is a function of the position), Monte Carlo otherwise."""
    import evaluation
    s, sizes = SMALL[name]
    b = tasks.sample(name, np.random.default_rng(1), 2000, s)
    uniform = lambda tokens: np.full(tokens.shape + (sizes["classes"],), 1.0 / sizes["classes"])
    metrics, _ = evaluation.evaluate(uniform, b)
    assert metrics["entropy_mae_bits"] == pytest.approx(tasks.prior_gap_bits(name, s), abs=tol)


def test_settings_from_a_checkpoint_read_the_config_only_for_older_meta(monkeypatch):
    """tasks.settings_from: a meta that holds every setting is read as it is (the task's settings_of, which may
    need config fields a bare family lacks, is not called); a meta without them falls back to settings_of."""
    from tunnels import bijection
    calls = []
    monkeypatch.setattr(bijection, "settings_of", lambda cfg: calls.append(cfg) or {"V": 9})
    assert tasks.settings_from("bijection", "cfg", {"V": 7}) == {"V": 7} and calls == []
    assert tasks.settings_from("bijection", "cfg", {}) == {"V": 9} and calls == ["cfg"]


def test_a_task_without_older_checkpoints_needs_no_settings_of(monkeypatch):
    """A meta without a setting, of a task that has no settings_of, is refused in one line naming the setting;
    the held-out seed takes the task's held_out_key (default 20, the HMM's length)."""
    from tunnels import bijection
    monkeypatch.delattr(bijection, "settings_of")
    assert tasks.settings_from("bijection", "cfg", {"V": 7}) == {"V": 7}
    with pytest.raises(ValueError, match="^the checkpoint's meta lacks the bijection setting 'V' "):
        tasks.settings_from("bijection", "cfg", {})
    assert tasks._held_out_seed("bijection", {"V": 7}, 3) == (tasks.EVAL_SEED, 3, 20)
    assert tasks._held_out_seed("hmm", {"n_obs": 30}, 3) == (tasks.EVAL_SEED, 3, 30)
