"""The hand-built transformer of primitives/construction.py: binding, then pointer doubling with two-hop maps,
h hops in the predicted 1 + ceil(log2(h + 1)) layers up to 5 hops, and what it does with fewer."""
import numpy as np
import pytest

from primitives import construction as cn
from tunnels import hops

S = dict(hops.SETTINGS, n_symbols=16, hidden=3, max_hops=4)
SMALL = dict(hops.SETTINGS, n_symbols=6, hidden=2, max_hops=3)     # every order of a chain's pairs, often


@pytest.fixture(scope="module")
def held_out():
    return hops.sample(np.random.default_rng(7), 500, S)


def answers(batch, q, s):
    """The direct answers' rows: the model's (n Q, V), follow_shown's (n Q, V), h (n Q,)."""
    f_shown, x, h = hops.shown_map(batch["tokens"], s)
    t = 2 * s["n_symbols"] + 2 + 3 * np.arange(x.shape[1])
    model = q[:, t].reshape(-1, q.shape[-1])
    f_shown, x, h = np.repeat(f_shown, x.shape[1], axis=0), x.reshape(-1), h.reshape(-1)
    return model, hops.follow_shown(f_shown, x, h), h


def test_the_prediction_and_the_construction_depths():
    """The prediction, binding then pointer doubling: 2, 3, 3, 4, 4, 4, 4, 5 layers for 1..8 hops (log for log2,
    or h for h + 1, gives other lists); the construction, with two-hop maps, reaches 1, 3, 5, 7 hops with 2, 3,
    4, 5 layers (2L - 3), so it takes the predicted depth up to 5 hops and one more layer for 6 and 7."""
    assert [cn.layers_needed(h) for h in range(1, 9)] == [2, 3, 3, 4, 4, 4, 4, 5]
    assert [cn.reach(L) for L in range(1, 7)] == [0, 1, 3, 5, 7, 9]
    assert [cn.layers_for(h) for h in range(1, 8)] == [2, 3, 3, 4, 4, 5, 5]
    assert all(cn.layers_for(h) == cn.layers_needed(h) for h in range(1, 6))


def test_the_plan_reads_each_hop_from_two_back_where_it_can():
    """Block 2 makes hop 2 by a lookup from hop 1 and hop 3 by a two-hop map from hop 1; block 3 makes 4 and 5
    by two-hop maps from 2 and 3; at max_hops 4 block 3 makes only 4. Block 1 is x's first hop (its heads are
    fixed: x's lookup, the forward and the backward maps)."""
    assert cn.plan(5, 7) == {1: {}, 2: {2: (1, 1), 3: (1, 2)}, 3: {4: (2, 2), 5: (3, 2)}, 4: {6: (4, 2), 7: (5, 2)}}
    assert cn.plan(4, 4) == {1: {}, 2: {2: (1, 1), 3: (1, 2)}, 3: {4: (2, 2)}}
    assert [len(v) for v in cn.heads(4, 4).values()] == [0, 3, 2, 2]


@pytest.mark.parametrize("s, n", [(SMALL, 2000), (dict(SMALL, queries=3), 600)])
def test_it_computes_the_lookup_only_predictor_exactly(s, n):
    """6 symbols, 2 hidden, 3 hops in 3 layers (the prediction's depth for 3 hops), one query a sequence and
    three: every answer's distribution is follow_shown's to 1e-3 (one-hot where the chain meets no hidden key,
    uniform where it does), at every h, over 2,000 sequences that hold every order of a chain's pairs and
    every fixed point; the answer's logit stands CONFIDENT above the others, not twice that (a fixed point's
    map is read once, not by both the forward and the backward head)."""
    b = hops.sample(np.random.default_rng(3), n, s)
    cfg, prm = cn.params(s)
    assert cfg.n_layers == 3
    model, want, h = answers(b, cn.predict(s, b["tokens"]), s)
    assert sorted(set(h.tolist())) == [1, 2, 3]
    assert np.abs(model - want).max() < 1e-3
    sure = want.max(-1) == 1.0
    top = np.sort(np.log(model[sure]), axis=-1)
    assert sure.sum() > n / 3
    assert np.abs(top[:, -1] - top[:, -2] - cn.CONFIDENT).max() < 0.1 * cn.CONFIDENT


def test_at_the_predicted_depth_every_lookup_is_answered(held_out):
    """The depth sweep's task (16 symbols, 3 hidden, h = 1..4) in 4 layers, the prediction's depth for 4 hops:
    at least 99% of the answers whose exact posterior is one-hot are right (the lookup reading), confidently
    (KL under 0.01 bit); past a hidden key it does what the lookup-only predictor does (its elimination KL is
    that predictor's, to 1e-6): a construction of lookups, not of elimination."""
    cfg, _ = cn.params(S)
    assert cfg.n_layers == 4
    r = hops.readings(held_out, cn.predict(S, held_out["tokens"]), S)
    assert sorted(r) == [1, 2, 3, 4]
    for h, e in r.items():
        assert e["lookup"]["n"] > 30 and e["lookup"]["accuracy"] >= 0.99, (h, e["lookup"])
        assert e["lookup"]["kl_bits"] < 0.01, (h, e["lookup"])
        assert e["elimination"]["kl_bits"] == pytest.approx(e["follow_shown"]["elimination_kl_bits"], abs=1e-6)


@pytest.mark.ci_only
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_with_fewer_layers_it_answers_only_the_hops_it_has_layers_for(held_out, layers):
    """Cut to L layers, the construction answers h <= reach(L) (0, 1, 3) as before and the deeper hops at
    chance (its lookup accuracy there under 0.2, where chance is 1/16). This shows how it is wired; that no
    weights do more is the prediction's argument (a layer at most doubles the composition a position holds),
    and the trained models of the depth sweep are its test."""
    r = hops.readings(held_out, cn.predict(S, held_out["tokens"], n_layers=layers), S)
    for h, e in r.items():
        if h <= cn.reach(layers):
            assert e["lookup"]["accuracy"] >= 0.99, (layers, h)
        else:
            assert e["lookup"]["accuracy"] < 0.2, (layers, h, e["lookup"])
