"""Tests for windtunnels.py: every exact posterior against brute-force enumeration."""
import itertools
import math

import numpy as np
import pytest

import windtunnels as wt


# ----------------------------------------------------------------------------
# common helpers


def test_entropy_and_kl_bits():
    p = np.array([[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.25] * 4])  # (3, 4)
    np.testing.assert_allclose(wt.entropy_bits(p), [1.0, 0.0, 2.0])
    np.testing.assert_allclose(wt.entropy_bits(p.T, axis=0), [1.0, 0.0, 2.0])
    q = np.full(4, 0.25)
    np.testing.assert_allclose(wt.kl_bits(p, q), [1.0, 2.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(wt.kl_bits(p, p), 0.0, atol=1e-15)
    # q = 0 where p > 0 stays finite (and huge) thanks to the clip
    kl = wt.kl_bits([0.5, 0.5], [1.0, 0.0])
    assert np.isfinite(kl) and kl > 400


# ----------------------------------------------------------------------------
# bijection


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
        np.testing.assert_allclose(wt.bijection_posterior(keys, values, V), brute_bijection_posterior(keys, values, V), atol=1e-12)


def test_bijection_posterior_rejects_inconsistent_pairs():
    with pytest.raises(ValueError, match="key 0"):
        wt.bijection_posterior([0, 0], [1, 2], V=3)  # key 0 mapped twice
    with pytest.raises(ValueError, match="already taken"):
        wt.bijection_posterior([0, 1], [1, 1], V=3)  # value 1 taken twice
    with pytest.raises(ValueError, match="0..2"):
        wt.bijection_posterior([0, 3], [1, 2], V=3)


@pytest.mark.parametrize("replacement,query", [(False, False), (False, True), (True, False), (True, True)])
def test_bijection_batch_consistent_with_reference(replacement, query):
    rng = np.random.default_rng(1)
    V, n = 6, 50
    L = 12 if replacement else V - 1
    batch = wt.bijection_batch(rng, n, V=V, L=L, replacement=replacement, query=query)
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
        ref = wt.bijection_posterior(keys[b], values[b], V)  # also checks the pairs form a bijection
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
    curve = wt.bijection_entropy_curve(V)
    assert curve.shape == (V - 1,)
    np.testing.assert_allclose(curve, np.log2(V - np.arange(1, V) + 1.0))
    batch = wt.bijection_batch(rng, 100, V=V)
    H = wt.entropy_bits(batch["posterior"][:, 0::2])  # (n, L) every sequence, not just on average
    np.testing.assert_allclose(H, np.broadcast_to(curve, H.shape), atol=1e-12)
    np.testing.assert_allclose(wt.bijection_entropy_curve(4, 4), [2.0, np.log2(3), 1.0, 0.0])


def test_bijection_with_replacement_sawtooth():
    rng = np.random.default_rng(3)
    batch = wt.bijection_batch(rng, 200, V=8, L=30, replacement=True)
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
    batch = wt.bijection_batch(rng, 4000, V=10, L=10, replacement=True)
    at = batch["mask"] == 1
    p_true = np.take_along_axis(batch["posterior"], batch["targets"][..., None], -1)[..., 0][at]
    p = batch["posterior"][at]
    assert abs(p_true.mean() - (p**2).sum(-1).mean()) < 0.01


def test_bijection_batch_bad_arguments():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="V must be >= 2, got 1"):
        wt.bijection_batch(rng, 4, V=1)
    with pytest.raises(ValueError, match="L must be >= 1, got 0"):
        wt.bijection_batch(rng, 4, V=5, L=0)
    with pytest.raises(ValueError, match="L must be <= V = 5 without replacement, got L = 6"):
        wt.bijection_batch(rng, 4, V=5, L=6)
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        wt.bijection_batch(rng, 0, V=5)
    with pytest.raises(ValueError, match="L must be in 1..5, got 6"):
        wt.bijection_entropy_curve(5, 6)
    assert wt.bijection_batch(rng, 2, V=5, L=9, replacement=True)["tokens"].shape == (2, 18)  # allowed with replacement


# ----------------------------------------------------------------------------
# sawtooth (Paper I's format b)


@pytest.mark.parametrize("alphabet", [None, 3])
def test_sawtooth_batch_matches_reference(alphabet):
    rng = np.random.default_rng(5)
    V, L, n = 6, 9, 40
    batch = wt.sawtooth_batch(rng, n, V=V, L=L, alphabet=alphabet)
    tokens, targets, mask, post = batch["tokens"], batch["targets"], batch["mask"], batch["posterior"]
    assert tokens.shape == targets.shape == mask.shape == batch["query_mask"].shape == (n, 2 * L + 1)
    assert tokens.max() < V                                   # one shared vocabulary for keys and values
    keys, values, query = tokens[:, 0:2 * L:2], tokens[:, 1:2 * L:2], tokens[:, -1]
    expected_mask = np.zeros(2 * L + 1)
    expected_mask[0:2 * L:2], expected_mask[-1] = 1, 1       # every key predicts its value; the query too
    assert np.all(mask == expected_mask) and np.all(batch["query_mask"] == np.eye(2 * L + 1)[-1])
    for b in range(n):
        np.testing.assert_allclose(post[b, 0:2 * L:2], wt.bijection_posterior(keys[b], values[b], V), atol=1e-12)
        assert query[b] in keys[b]                           # the query repeats a context key ...
        answer = values[b][list(keys[b]).index(query[b])]
        assert targets[b, -1] == answer and post[b, -1, answer] == 1.0   # ... so its posterior is one-hot
        np.testing.assert_array_equal(targets[b, 0:2 * L:2], values[b])
        if alphabet:
            assert len(set(keys[b])) <= alphabet


def test_distinct_keys_distribution_by_hand():
    # 3 keys, 3 draws: 3 of the 27 sequences use 1 key, 3 * (2^3 - 2) = 18 use 2, 3! = 6 use all 3
    np.testing.assert_allclose(wt.distinct_keys_distribution(3, 3), [0, 3 / 27, 18 / 27, 6 / 27])
    np.testing.assert_allclose(wt.distinct_keys_distribution(3, 0), [1, 0, 0, 0])


def test_sawtooth_entropy_curve_and_prior_gap_by_hand():
    # V = 3: key 1 is new, H = log2 3; key 2 is new with probability 2/3, then H = log2 2 = 1;
    # key 3: one distinct key before (prob 1/3) and new (2/3) gives H = 1, two before gives H = log2 1 = 0
    np.testing.assert_allclose(wt.sawtooth_entropy_curve(3, 3), [np.log2(3), 2 / 3, 2 / 9])
    # the prior's gap over the L = V - 1 = 2 value positions (the query, H = 0, is not among them):
    # mean(log2 3 - log2 3, log2 3 - 2/3) = 0.4591; with the query it would be 0.8340, in nats 0.3182
    assert wt.prior_gap_bits("sawtooth", V=3) == pytest.approx((np.log2(3) - 2 / 3) / 2, abs=1e-12)
    assert wt.prior_gap_bits("sawtooth", V=3) == pytest.approx(0.459148, abs=1e-6)
    # format a, V = 3: H = log2 3, log2 2 at the two keys, gap = (log2 3 - 1) / 2
    assert wt.prior_gap_bits("bijection", V=3) == pytest.approx((np.log2(3) - 1) / 2, abs=1e-12)
    assert wt.prior_gap_bits("bijection") == pytest.approx(1.1073, abs=1e-4)      # the paper's V = 20
    assert wt.prior_gap_bits("sawtooth") == pytest.approx(1.8490, abs=1e-4)       # the paper's "1.85"


def test_sawtooth_entropy_curve_matches_sampled_sequences():
    batch = wt.sawtooth_batch(np.random.default_rng(6), 20000, V=8, L=12)
    H = wt.entropy_bits(batch["posterior"][:, 0:24:2]).mean(0)   # (L,)
    np.testing.assert_allclose(H, wt.sawtooth_entropy_curve(8, 12), atol=0.03)


def test_hmm_prior_gap_is_the_mean_kl_to_uniform():
    """log2 5 - H(p) = KL(p || uniform): two routes to the same Monte Carlo number, which also stays put
    between seeds (standard error about 1e-3 bits at 100,000 HMMs, 3e-3 at 20,000)."""
    gap = wt.prior_gap_bits("hmm", K=20, n=20000, seed=3)
    batch = wt.hmm_batch(np.random.default_rng(3), 10000, 20)
    post = batch["posterior"][:, wt.HMM_HEADER:]
    kl = wt.kl_bits(post, np.full(5, 0.2)).mean()
    assert abs(gap - kl) < 0.01 and abs(gap - wt.prior_gap_bits("hmm", K=20, n=20000, seed=4)) < 0.01
    assert 0.40 < gap < 0.44                                  # the authors' MLP and LSTM: 0.416


def test_sawtooth_bad_arguments():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="alphabet must lie in 1..5, got 6"):
        wt.sawtooth_batch(rng, 2, V=5, alphabet=6)
    with pytest.raises(ValueError, match="V must be >= 2, got 1"):
        wt.sawtooth_batch(rng, 2, V=1)
    with pytest.raises(ValueError, match="task 'copy': allowed are bijection, sawtooth, hmm"):
        wt.prior_gap_bits("copy")


# ----------------------------------------------------------------------------
# HMM


def test_hmm_sample_params_on_the_grid():
    rng = np.random.default_rng(5)
    for _ in range(300):
        for P in wt.hmm_sample_params(rng):
            assert P.shape == (5, 5) and P.dtype == np.float64
            hundredths = np.rint(100 * P).astype(np.int64)
            np.testing.assert_allclose(100 * P, hundredths, atol=1e-9)
            assert np.all(hundredths.sum(1) == 100), hundredths
            assert np.all(hundredths >= 5)
    T, E = wt.hmm_sample_params_batch(rng, 2000)  # (n, S, S) each
    counts = np.rint(100 * np.stack([T, E])).astype(np.int64)
    assert np.all(counts.sum(-1) == 100) and counts.min() >= 5
    assert abs(T.mean() - 0.2) < 0.002  # each row is exchangeable, so every entry has mean 1/5


def test_hmm_round_hundredths_edge_cases():
    # many entries just under 0.05 force the floor to push the sum above 100
    p = np.array([[0.041, 0.041, 0.041, 0.041, 0.836], [0.2] * 5, [0.125, 0.125, 0.125, 0.125, 0.5], [0.05, 0.05, 0.05, 0.05, 0.8]])
    counts = wt.hmm_round_hundredths(p)
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
    counts = wt.hmm_round_hundredths(q)
    assert np.all(counts.sum(1) == 100) and counts.min() >= 5
    # close to the unrounded probabilities: entries >= 4.17 hundredths, so raising up to four of them
    # to 5 costs at most 4 * 0.83 = 3.33 hundredths taken from the others
    assert np.abs(counts - 100 * q).max() < 3.4


def brute_hmm_filter(T, E, pi, obs):
    """p(s_t | o_0..o_t) by summing the joint over every path s_0..s_t."""
    S = len(pi)
    belief = np.zeros((len(obs), S))
    for t in range(len(obs)):
        paths = np.array(list(itertools.product(range(S), repeat=t + 1)))  # (S^(t+1), t+1)
        joint = pi[paths[:, 0]] * np.prod(E[paths, obs[: t + 1]], axis=1)  # (S^(t+1),)
        if t > 0:
            joint *= np.prod(T[paths[:, :-1], paths[:, 1:]], axis=1)
        belief[t] = np.bincount(paths[:, -1], weights=joint, minlength=S) / joint.sum()
    return belief


def test_hmm_filter_matches_enumeration():
    rng = np.random.default_rng(7)
    for K in [1, 2, 4, 6]:
        T, E = wt.hmm_sample_params(rng)
        pi = rng.dirichlet(np.ones(5))  # a non-uniform start tests the convention s_0 ~ pi
        obs = rng.integers(0, 5, K)
        np.testing.assert_allclose(wt.hmm_filter(T, E, pi, obs), brute_hmm_filter(T, E, pi, obs), atol=1e-12)
    # a 3-state, 2-symbol HMM with a structural zero
    T = np.array([[0.9, 0.1, 0.0], [0.0, 0.5, 0.5], [0.3, 0.3, 0.4]])
    E = np.array([[0.8, 0.2], [0.1, 0.9], [0.5, 0.5]])
    pi = np.array([0.6, 0.3, 0.1])
    obs = np.array([0, 1, 1, 0, 1, 0])
    np.testing.assert_allclose(wt.hmm_filter(T, E, pi, obs), brute_hmm_filter(T, E, pi, obs), atol=1e-12)
    batch = wt.hmm_filter_batch(T[None], E[None], pi, obs[None])[0]
    np.testing.assert_allclose(batch, brute_hmm_filter(T, E, pi, obs), atol=1e-12)


def test_hmm_filter_stable_for_long_sequences():
    rng = np.random.default_rng(8)
    T, E = wt.hmm_sample_params(rng)
    obs = rng.integers(0, 5, 5000)
    belief = wt.hmm_filter(T, E, np.full(5, 0.2), obs)
    assert belief.shape == (5000, 5)
    assert np.all(np.isfinite(belief)) and belief.min() >= 0
    np.testing.assert_allclose(belief.sum(1), 1.0, atol=1e-12)


def test_hmm_tokens_round_trip():
    rng = np.random.default_rng(9)
    for K in [0, 1, 20, 50]:
        T, E = wt.hmm_sample_params(rng)
        obs = rng.integers(0, 5, K)
        tokens = wt.hmm_tokens(T, E, obs)
        assert tokens.shape == (wt.HMM_HEADER + K,) and tokens.dtype == np.int64
        assert tokens.min() >= 0 and tokens.max() < wt.HMM_VOCAB
        assert tokens[25] == tokens[51] == 96 and np.all(tokens[52:] == 97 + obs)
        T2, E2, obs2 = wt.hmm_detokenize(tokens)
        assert np.array_equal(T, T2) and np.array_equal(E, E2) and np.array_equal(obs, obs2)
    # token id -> value (id + 5) / 100 at the extremes
    T = np.full((5, 5), 0.05)
    T[:, 0] = 0.80
    tokens = wt.hmm_tokens(T, T, [0])
    assert tokens[0] == 75 and tokens[1] == 0
    assert wt.HMM_S == 5 and wt.HMM_VOCAB == 102 and wt.HMM_HEADER == 52


def test_hmm_batch_matches_filter():
    rng = np.random.default_rng(10)
    n, K = 64, 20
    batch = wt.hmm_batch(rng, n, K=K)
    tokens, targets, mask, posterior = batch["tokens"], batch["targets"], batch["mask"], batch["posterior"]
    assert tokens.shape == targets.shape == mask.shape == (n, 52 + K)
    assert posterior.shape == (n, 52 + K, 5)
    assert tokens.dtype == targets.dtype == np.int64 and mask.dtype == posterior.dtype == np.float64
    assert np.all(mask[:, :52] == 0) and np.all(mask[:, 52:] == 1)
    assert np.all(posterior[:, :52] == 0) and np.all(targets[:, :52] == 0)
    assert targets.min() >= 0 and targets.max() < 5
    np.testing.assert_allclose(posterior[:, 52:].sum(-1), 1.0, atol=1e-12)
    for b in range(n):
        T, E, obs = wt.hmm_detokenize(tokens[b])
        np.testing.assert_allclose(posterior[b, 52:], wt.hmm_filter(T, E, np.full(5, 0.2), obs), atol=1e-12)


def test_hmm_batch_is_calibrated():
    # the true states are drawn from the same model the filter assumes: E[p(s_true)] = E[sum_s p(s)^2]
    rng = np.random.default_rng(11)
    batch = wt.hmm_batch(rng, 3000, K=10)
    at = batch["mask"] == 1
    p_true = np.take_along_axis(batch["posterior"], batch["targets"][..., None], -1)[..., 0][at]
    p = batch["posterior"][at]
    assert abs(p_true.mean() - (p**2).sum(-1).mean()) < 0.01
    assert abs(-np.log2(p_true).mean() - wt.entropy_bits(p).mean()) < 0.03


def test_hmm_bad_arguments():
    rng = np.random.default_rng(0)
    T, E = wt.hmm_sample_params(rng)
    with pytest.raises(ValueError, match="n must be >= 1"):
        wt.hmm_batch(rng, 0)
    with pytest.raises(ValueError, match="K must be >= 1"):
        wt.hmm_batch(rng, 4, K=0)
    with pytest.raises(ValueError, match="symbols in 0..4"):
        wt.hmm_filter(T, E, np.full(5, 0.2), [0, 5])
    with pytest.raises(ValueError, match="rows summing to 1"):
        wt.hmm_filter(T * 2, E, np.full(5, 0.2), [0])
    with pytest.raises(ValueError, match="pi must be a distribution"):
        wt.hmm_filter(T, E, np.full(5, 0.3), [0])
    with pytest.raises(ValueError, match="zero probability"):
        wt.hmm_filter(np.eye(2), np.eye(2), [1.0, 0.0], [0, 1])
    with pytest.raises(ValueError, match="multiples of 0.01"):
        wt.hmm_tokens(np.full((5, 5), 0.2) + [0.001, -0.001, 0, 0, 0], E, [0])
    with pytest.raises(ValueError, match="rows must sum to exactly 1.00"):
        wt.hmm_tokens(np.full((5, 5), 0.21), E, [0])
    with pytest.raises(ValueError, match=r"\[0.05, 1.00\]"):
        wt.hmm_tokens(np.eye(5), E, [0])
    tokens = wt.hmm_tokens(T, E, [1, 2])
    with pytest.raises(ValueError, match="SEP"):
        wt.hmm_detokenize(np.r_[tokens[:25], 0, tokens[26:]])
    with pytest.raises(ValueError, match="at least 52"):
        wt.hmm_detokenize(tokens[:40])


# ----------------------------------------------------------------------------
# sticky Markov chain


def test_sticky_transition():
    P = wt.sticky_transition()
    assert P.shape == (8, 8)
    np.testing.assert_allclose(P.sum(1), 1.0)
    np.testing.assert_allclose(np.diag(P), 0.3)
    # row 0: weights 1/d for d = 1, 2, 3, 4, 3, 2, 1 over symbols 1..7
    w = 1 / np.array([1, 2, 3, 4, 3, 2, 1])
    np.testing.assert_allclose(P[0, 1:], 0.7 * w / w.sum())
    np.testing.assert_allclose(P, P.T)  # circulant and symmetric
    # stationary distribution is uniform, so H(Y'|Y) is the entropy of one row
    np.testing.assert_allclose(wt.sticky_conditional_entropy_bits(P), wt.entropy_bits(P[0]))
    P3 = wt.sticky_transition(3, 0.5)
    np.testing.assert_allclose(P3, [[0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.25, 0.25, 0.5]])
    with pytest.raises(ValueError, match="n_symbols must be >= 2, got 1"):
        wt.sticky_transition(1)
    with pytest.raises(ValueError, match="self_prob must be in"):
        wt.sticky_transition(8, 1.5)


def test_sticky_authors_self_prob():
    # by hand for 8 symbols: distances 1, 1, 2, 2, 3, 3, 4 sum to 47/12 in reciprocal, S = 0.3 + 47/12,
    # P[i, i] = 0.3 + 0.3 * 0.7 / S = 0.349802
    assert wt.sticky_authors_self_prob(8, 0.3) == pytest.approx(0.3 + 0.21 / (0.3 + 47 / 12), abs=1e-15)
    assert wt.sticky_authors_self_prob(8, 0.3) == pytest.approx(0.349802, abs=1e-6)
    # the same row built the authors' way: 0.3 on the diagonal, 1 / distance elsewhere, normalised, scaled
    # by 0.7, plus 0.3 on the diagonal
    row = np.array([0.3] + [1 / min(j, 8 - j) for j in range(1, 8)])
    row = row / row.sum() * 0.7 + np.eye(8)[0] * 0.3
    np.testing.assert_allclose(wt.sticky_transition(8, wt.sticky_authors_self_prob())[0], row, atol=1e-15)
    assert wt.sticky_conditional_entropy_bits(wt.sticky_transition(8, wt.sticky_authors_self_prob())) == \
        pytest.approx(2.639, abs=1e-3)                      # the authors' bound, against 2.717 at exactly 0.3


def test_sticky_conditional_entropy_non_uniform_stationary():
    P = np.array([[0.9, 0.1], [0.5, 0.5]])  # stationary (5/6, 1/6)
    H = lambda p: -sum(x * math.log2(x) for x in p)
    expected = 5 / 6 * H([0.9, 0.1]) + 1 / 6 * H([0.5, 0.5])
    assert abs(wt.sticky_conditional_entropy_bits(P) - expected) < 1e-12


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
    mu = wt.sticky_means(rng, 3, 4)  # (3, 4)
    for T in [1, 2, 3, 4]:
        for sigma in [0.5, 1.0, 2.0]:
            x, y = wt.sticky_sample(rng, P, mu, T, n=1, sigma=sigma)
            ref = brute_sticky_posterior(P, mu, x[0], sigma)
            post = wt.sticky_posterior(P, mu, x[0], sigma)
            assert post.shape == (T, 3)
            np.testing.assert_allclose(post, ref, atol=1e-12)
            np.testing.assert_allclose(post.sum(1), 1.0, atol=1e-12)
            np.testing.assert_allclose(wt.sticky_posterior_batch(P, mu, x, sigma)[0], ref, atol=1e-12)


def test_sticky_batch_matches_reference_and_is_stable():
    rng = np.random.default_rng(13)
    P = wt.sticky_transition()
    mu = wt.sticky_means(rng)
    x, y = wt.sticky_sample(rng, P, mu, 30, n=20, sigma=1.0)
    assert x.shape == (20, 30, 20) and y.shape == (20, 31)
    assert x.dtype == np.float64 and y.dtype == np.int64
    batch = wt.sticky_posterior_batch(P, mu, x, 1.0)  # (n, T, M)
    for b in range(20):
        np.testing.assert_allclose(batch[b], wt.sticky_posterior(P, mu, x[b], 1.0), atol=1e-12)
    # tiny noise makes huge log-likelihoods: still finite, and the filter knows y_t, so it predicts P[y_t]
    x, y = wt.sticky_sample(rng, P, mu, 2000, n=2, sigma=1e-3)
    post = wt.sticky_posterior_batch(P, mu, x, 1e-3)
    assert np.all(np.isfinite(post))
    np.testing.assert_allclose(post, P[y[:, :-1]], atol=1e-9)


def test_sticky_sample_statistics():
    rng = np.random.default_rng(14)
    P = wt.sticky_transition()
    mu = wt.sticky_means(rng)
    x, y = wt.sticky_sample(rng, P, mu, 200, n=100, sigma=0.7)
    counts = np.zeros((8, 8))
    np.add.at(counts, (y[:, :-1], y[:, 1:]), 1)
    np.testing.assert_allclose(counts / counts.sum(1, keepdims=True), P, atol=0.03)
    noise = x - mu[y[:, :-1]]  # x[t] is a view of the current symbol y_t
    assert abs(noise.std() - 0.7) < 0.01 and abs(noise.mean()) < 0.01


def test_sticky_posterior_is_calibrated():
    rng = np.random.default_rng(15)
    P = wt.sticky_transition()
    mu = wt.sticky_means(rng)
    x, y = wt.sticky_sample(rng, P, mu, 20, n=2000, sigma=3.0)
    post = wt.sticky_posterior_batch(P, mu, x, 3.0)  # (n, T, M)
    p_true = np.take_along_axis(post, y[:, 1:, None], -1)[..., 0]  # (n, T) targets are y[:, 1:]
    assert abs(p_true.mean() - (post**2).sum(-1).mean()) < 0.01
    # the exact predictor never beats the bound that sees y_t itself
    assert wt.entropy_bits(post).mean() >= wt.sticky_conditional_entropy_bits(P) - 1e-9


def test_sticky_bad_arguments():
    rng = np.random.default_rng(0)
    P = wt.sticky_transition()
    mu = wt.sticky_means(rng)
    with pytest.raises(ValueError, match="sigma must be a finite number > 0"):
        wt.sticky_sample(rng, P, mu, 5, sigma=0.0)
    with pytest.raises(ValueError, match="same M"):
        wt.sticky_sample(rng, P, mu[:5], 5)
    with pytest.raises(ValueError, match="T must be >= 1"):
        wt.sticky_sample(rng, P, mu, 0)
    with pytest.raises(ValueError, match="rows summing to 1"):
        wt.sticky_posterior(P * 0.5, mu, np.zeros((3, 20)), 1.0)
    with pytest.raises(ValueError, match=r"x must be \(T, 20\)"):
        wt.sticky_posterior(P, mu, np.zeros((3, 4)), 1.0)
    with pytest.raises(ValueError, match=r"x must be \(n, T, 20\)"):
        wt.sticky_posterior_batch(P, mu, np.zeros((3, 20)), 1.0)
