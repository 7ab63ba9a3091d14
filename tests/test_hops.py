"""The multi-hop task: its layout, and its exact posteriors against a brute force over every permutation."""
import itertools

import numpy as np
import pytest

from tunnels import hops
from tunnels import tasks

pytestmark = pytest.mark.plain_python


def brute_force(f_shown, x, h, prefix=()):
    """The posterior of f^h(x) over all V! permutations that agree with the shown pairs and send x along
    the given prefix (f(x), f^2(x), ...): written from the definition, one row."""
    V = len(f_shown)
    counts = np.zeros(V)
    for f in itertools.permutations(range(V)):
        if any(f_shown[k] >= 0 and f[k] != f_shown[k] for k in range(V)):
            continue
        walk = [x]
        for _ in range(h):
            walk.append(f[walk[-1]])
        if tuple(walk[1:1 + len(prefix)]) == tuple(prefix):
            counts[walk[h]] += 1
    return counts / counts.sum()


def test_a_hand_computed_chain_through_a_hidden_key():
    """V = 4, shown 0 -> 1 and 1 -> 2; hidden keys 2, 3, hidden values 0, 3. From 0: f = 1, f^2 = 2 (one-hot),
    f^3 = f(2) in {0, 3} (1/2 each), f^4: f(2) = 0 gives f(0) = 1, f(2) = 3 gives f(3) = 0: (1/2, 1/2, 0, 0).
    Teacher-forced with the true f(2) = 3, the fourth hop is one-hot on 0."""
    f_shown = np.array([[1, 2, -1, -1]])
    chain = np.array([[0, 1, 2, 3, 0]])                                 # the true f: 2 -> 3, 3 -> 0
    direct, cot = hops.hop_posteriors(f_shown, np.array([0]), 4, chain)
    np.testing.assert_allclose(direct[0], [[0, 1, 0, 0], [0, 0, 1, 0], [.5, 0, 0, .5], [.5, .5, 0, 0]])
    np.testing.assert_allclose(cot[0], [[0, 1, 0, 0], [0, 0, 1, 0], [.5, 0, 0, .5], [1, 0, 0, 0]])


@pytest.mark.parametrize("V,m", [(5, 2), (6, 3), (4, 4), (5, 0)])
def test_posteriors_match_a_brute_force_over_every_permutation(V, m):
    rng = np.random.default_rng(V * 10 + m)
    b = hops.batch(rng, 12, n_symbols=V, hidden=m, max_hops=4, cot=True)
    d = hops.batch(np.random.default_rng(V * 10 + m), 12, n_symbols=V, hidden=m, max_hops=4)   # the same draws
    H1, Q, _, UNSEEN = hops.tokens_of(V, 4)
    for row in range(12):
        tok = b["tokens"][row]
        P = 2 * V
        keys, values = tok[0:P:2], tok[1:P:2]
        assert sorted(keys) == list(range(V)) and (values == UNSEEN).sum() == m   # every key, m of them hidden
        f_shown = -np.ones(V, dtype=int)
        f_shown[keys[values != UNSEEN]] = values[values != UNSEEN] - V
        h, x = tok[P + 1] - H1 + 1, tok[P + 2]
        assert tok[P] == Q and np.array_equal(d["tokens"][row][:P + 3], tok[:P + 3])
        answers = np.flatnonzero(b["mask"][row])
        assert list(answers) == list(range(P + 2, P + 2 + h))
        chain = b["targets"][row][answers]                              # the true hops
        for j in range(1, h + 1):
            np.testing.assert_allclose(b["posterior"][row, P + 1 + j], brute_force(f_shown, x, j, chain[:j - 1]))
            if j > 1:
                assert tok[P + 1 + j] == chain[j - 2]                   # teacher forcing: the true hop is the input
        np.testing.assert_allclose(d["posterior"][row, P + 2], brute_force(f_shown, x, h))
        assert np.flatnonzero(d["mask"][row]).tolist() == [P + 2] and d["targets"][row, P + 2] == chain[-1]


def test_the_chain_rule_gives_the_direct_posterior():
    """Summing, over every chain, the product of its hops' cot posteriors gives the direct posterior of the
    last hop (the property free-running sampling relies on): V = 5, two hidden, h = 3, by enumeration."""
    rng = np.random.default_rng(3)
    for _ in range(5):
        f = rng.permutation(5)
        f_shown = f.copy()
        f_shown[rng.choice(5, 2, replace=False)] = -1
        x = int(rng.integers(5))
        marginal = np.zeros(5)
        for path in itertools.product(range(5), repeat=3):
            p = 1.0
            for j in range(3):
                q = brute_force(f_shown, x, j + 1, path[:j]) if p > 0 else np.zeros(5)
                p *= q[path[j]]
            marginal[path[-1]] += p
        true = np.array([[x, f[x], f[f[x]], f[f[f[x]]]]])
        direct, _ = hops.hop_posteriors(f_shown[None], np.array([x]), 3, true)
        np.testing.assert_allclose(marginal, direct[0, 2], atol=1e-12)


def test_groups_sizes_and_the_prior_gap():
    s = tasks.settings("hops", {"n_symbols": 6, "hidden": 2, "max_hops": 3})
    assert hops.sizes(s) == dict(vocab=18, classes=6, max_len=2 * 6 + 3, eval_len=15)
    assert hops.sizes({**s, "cot": True})["max_len"] == 17
    b = hops.sample(np.random.default_rng(0), 200, s)
    h = b["tokens"][:, 13] - 12 + 1
    for k in (1, 2, 3):
        assert b["groups"][f"h={k}"].sum() == (h == k).sum()
    c = hops.sample(np.random.default_rng(0), 200, {**s, "cot": True})
    assert c["groups"][hops.LAST].sum() == c["mask"].sum() - 200 == (h - 1).sum()
    # with no hidden pair every answer is one-hot: the prior gap is log2 V exactly; with all hidden, the
    # first hop is uniform over V: the gap falls
    assert hops.prior_gap_bits({**s, "hidden": 0}, n=50) == pytest.approx(np.log2(6))
    assert hops.prior_gap_bits({**s, "hidden": 6}, n=400) < np.log2(6) - 0.5


def test_bad_settings_are_refused_in_one_line():
    assert hops.check_hidden(7, {"n_symbols": 16}) == "7 hidden pairs have 5040 completions to enumerate; at most 6 (720)"
    assert hops.check_hidden(5, {"n_symbols": 4}) == "5 hidden pairs of 4 symbols"
    assert hops.check_hidden(-1, {}) and hops.check_hops(0, {}) and hops.check_symbols(1, {})
    assert hops.check_hidden(3, {"n_symbols": 16}) is None


def test_a_checkpoints_meta_takes_a_boolean_setting_as_a_boolean():
    from harness.checkpoints import meta_problem
    assert meta_problem(dict(task="hops", cot=False)) is None and meta_problem(dict(task="hops", cot=True)) is None
    assert meta_problem(dict(task="hops", cot="yes")) == "has cot='yes'; allowed is a value of type bool"
    assert meta_problem(dict(task="hops", n_symbols=True)) == "has n_symbols=True; allowed is a value of type int"
    assert meta_problem(dict(task="hops", hidden=7)).startswith("has hidden=7: 7 hidden pairs have 5040")


def test_the_curriculum_draws_fewer_symbols_where_the_task_puts_its_pairs():
    """Before step 10 the permutation acts on 4 of the 8 symbols (drawn per row), round(2 x 4 / 8) = 1 of its
    pairs hidden, its four pairs in four of the eight places (FILL FILL in the others, every place used in
    some row): each answer is the brute force's over the four (the symbols in play are the keys shown), and
    over a batch every symbol is an answer."""
    s = tasks.settings("hops", {"n_symbols": 8, "hidden": 2, "max_hops": 3, "symbol_curriculum": "4:10"})
    H1, Q, FILL, UNSEEN = hops.tokens_of(8, 3)
    b = hops.sample(np.random.default_rng(0), 60, s, step=9)
    empty = b["tokens"][:, 0:16:2] == FILL                              # (60, 8) the empty places
    assert np.all(empty.sum(1) == 4) and np.all(empty.any(0)) and np.all(b["tokens"][:, 16] == Q)
    assert np.array_equal(empty, b["tokens"][:, 1:16:2] == FILL) and np.all((b["tokens"] == UNSEEN).sum(1) == 1)
    for row in range(60):
        keys, values = b["tokens"][row, 0:16:2], b["tokens"][row, 1:16:2]
        play = keys[keys != FILL]                                       # the four symbols in play
        local = {k: i for i, k in enumerate(play)}
        f_shown = -np.ones(4, dtype=int)
        for k, v in zip(keys, values):
            if k != FILL and v != UNSEEN:
                f_shown[local[k]] = local[v - 8]
        h, x = b["tokens"][row, 17] - H1 + 1, b["tokens"][row, 18]
        expect = np.zeros(8)
        expect[play] = brute_force(f_shown, local[x], h)
        np.testing.assert_allclose(b["posterior"][row, 18], expect)
    assert set(b["targets"][b["mask"] > 0]) == set(range(8))
    full = hops.sample(np.random.default_rng(0), 20, s, step=10)        # the task itself from step 10 on
    assert not np.any(full["tokens"][:, :16] == FILL)
    assert hops.check_curriculum("1:10", {"hidden": 2}) == "every stage needs at least 2 symbols"
    assert hops.check_curriculum("2:10", {"hidden": 3}) is None             # a stage shows every pair
    assert hops.check_curriculum("3:10", {**s, "steps": 10}).startswith("its last stage ends at step 10")
    assert hops.check_curriculum("3:10,4:20", s) is None
    # the hop curriculum: h from 1 to 2 before step 10 (3 is max_hops), every h after; a stage past max_hops
    # is clipped to it
    s = {**s, "symbol_curriculum": "", "hop_curriculum": "2:10"}
    h_of = lambda b: b["tokens"][:, 17] - H1 + 1
    assert set(h_of(hops.sample(np.random.default_rng(0), 200, s, step=9))) == {1, 2}
    assert set(h_of(hops.sample(np.random.default_rng(0), 200, s, step=10))) == {1, 2, 3}
    assert set(h_of(hops.sample(np.random.default_rng(0), 200, {**s, "hop_curriculum": "9:10"}, step=9))) == {1, 2, 3}
    assert hops.check_hop_curriculum("0:10", s) == "each hops must lie in 1..64 and the steps must increase"


def test_posteriors_computed_in_chunks_of_rows_are_the_same(monkeypatch):
    f_shown = np.array([[1, 2, -1, -1], [-1, 0, 3, -1], [2, -1, -1, 1]])
    x, chain = np.array([0, 1, 3]), np.array([[0, 1, 2, 3], [1, 0, 2, 3], [3, 1, 0, 2]])
    whole = hops.hop_posteriors(f_shown, x, 3, chain)
    monkeypatch.setattr(hops, "CHUNK", 1)                               # one row at a time
    for a, b in zip(whole, hops.hop_posteriors(f_shown, x, 3, chain)):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------
# the two readings and their predictors

def test_the_two_predictors_by_hand():
    """V = 4, f = (1, 2, 3, 0) with keys 2 and 3 hidden: hidden values {3, 0}. From x = 2 for 2 hops the exact
    posterior is (1/2, 1/2, 0, 0) (2 -> 3 -> 0, or 2 -> 0 -> 1). The lookup-only predictor meets the hidden
    key at once: uniform, KL 1 bit. Elimination at each hop: (1/2 on 3, 1/2 on 0), then 3 -> {3, 0} and
    0 -> 1: (1/4, 1/2, 0, 1/4), KL 1/2 bit (a nats mistake gives 0.35; a swapped KL, infinite). From x = 0 for
    one hop both are one-hot on 1; from x = 2 for one hop the elimination is exact (1/2 on 0 and on 3)."""
    f_shown = np.array([[1, 2, -1, -1]] * 3)
    x, h = np.array([2, 0, 2]), np.array([2, 1, 1])
    look = hops.follow_shown(f_shown, x, h)
    elim = hops.eliminate_each_hop(f_shown, x, h)
    np.testing.assert_allclose(look, [[.25] * 4, [0, 1, 0, 0], [.25] * 4])
    np.testing.assert_allclose(elim, [[.25, .5, 0, .25], [0, 1, 0, 0], [.5, 0, 0, .5]])
    direct, _ = hops.hop_posteriors(f_shown[:1], x[:1], 2, np.array([[2, 3, 0]]))
    post = direct[0, 1]
    np.testing.assert_allclose(post, [.5, .5, 0, 0])
    from tunnels import windtunnels as wt
    assert wt.kl_bits(post, look[0]) == pytest.approx(1.0) and wt.kl_bits(post, elim[0]) == pytest.approx(0.5)


def test_readings_split_the_answers_and_read_each_against_its_predictor():
    """On held-out sequences, the exact posterior itself: lookup accuracy 1 and KL 0 on the one-hot answers,
    elimination KL 0 on the others; a model that only follows the shown pairs: its lookup accuracy, and on the
    uncertain answers the lookup-only predictor's KL, which is positive; the answers split into the two
    readings without loss, and the scores of the two predictors fall with h (more hops meet a hidden key)."""
    s = dict(hops.SETTINGS, n_symbols=6, hidden=2, max_hops=3)
    b = hops.sample(np.random.default_rng(0), 600, s)
    f_shown, x, h = hops.shown_map(b["tokens"], s)
    assert (f_shown < 0).sum(1).tolist() == [2] * 600 and set(h[:, 0]) == {1, 2, 3}
    x, h = x[:, 0], h[:, 0]                                          # one query a sequence
    exact = hops.readings(b, b["posterior"], s)
    t = 2 * 6 + 2
    q = b["posterior"].copy()
    q[:, t] = hops.follow_shown(f_shown, x, h)
    looked = hops.readings(b, q, s)
    for hh in (1, 2, 3):
        e, l = exact[hh], looked[hh]
        assert e["lookup"]["n"] + e["elimination"]["n"] == int((h == hh).sum())
        assert e["lookup"]["accuracy"] == 1.0 and e["lookup"]["kl_bits"] == pytest.approx(0, abs=1e-9)
        assert e["elimination"]["kl_bits"] == pytest.approx(0, abs=1e-9)
        assert l["lookup"]["accuracy"] == pytest.approx(e["follow_shown"]["accuracy"])   # (a one-hot answer
        assert l["lookup"]["accuracy"] > 0.5 and l["elimination"]["kl_bits"] > 0.5   # past a hidden key: uniform)
        assert l["elimination"]["kl_bits"] == pytest.approx(e["follow_shown"]["elimination_kl_bits"])
        assert e["eliminate_each_hop"]["elimination_kl_bits"] < e["follow_shown"]["elimination_kl_bits"]
    scores = [exact[hh]["follow_shown"]["score"] for hh in (1, 2, 3)]
    assert scores[0] > scores[1] > scores[2] and exact[1]["eliminate_each_hop"]["score"] == pytest.approx(1.0)


def test_a_reading_line_by_hand():
    import train
    r = {"lookup": dict(n=1200, accuracy=0.99, kl_bits=0.0123), "elimination": dict(n=3, kl_bits=0.5),
         "follow_shown": dict(elimination_kl_bits=1.0), "eliminate_each_hop": dict(elimination_kl_bits=0.25)}
    assert train.reading_line(r) == ("lookup (1,200 one-hot answers): accuracy 0.9900, KL 0.0123 bits; elimination "
                                     "(3 uncertain answers): KL 0.5 bits, against the lookup-only predictor's 1 bits "
                                     "and one elimination a hop's 0.25 bits")
    r["lookup"] = dict(n=0, accuracy=None, kl_bits=None)
    assert train.reading_line(r).startswith("lookup (0 one-hot answers): accuracy none, KL none;")


def test_several_queries_each_with_its_exact_posterior():
    """--queries 3 (direct): three `Q H_h x` after the same pairs, each answer's posterior the brute force's for
    its own x and h; the pairs and the first query are those of a one-query batch from the same generator (the
    extra queries are drawn last), so one query is the task as it was."""
    s = dict(hops.SETTINGS, n_symbols=5, hidden=2, max_hops=3)
    one = hops.sample(np.random.default_rng(4), 6, s)
    three = hops.sample(np.random.default_rng(4), 6, dict(s, queries=3))
    assert hops.sizes(dict(s, queries=3))["max_len"] == 2 * 5 + 9 and (three["mask"].sum(1) == 3).all()
    np.testing.assert_array_equal(three["tokens"][:, :13], one["tokens"])
    np.testing.assert_array_equal(three["posterior"][:, :13], one["posterior"])
    f_shown, x, h = hops.shown_map(three["tokens"], dict(s, queries=3))
    assert x.shape == h.shape == (6, 3)
    for b in range(6):
        for i in range(3):
            np.testing.assert_allclose(three["posterior"][b, 12 + 3 * i], brute_force(f_shown[b], x[b, i], h[b, i]))
    assert hops.check_queries(2, {"cot": True}) and hops.check_queries(0, {}) and hops.check_queries(3, {}) is None
