"""The hand-built transformer of primitives/construction.py: h hops of the hops task in h + 1 layers (one to
bind, one a hop: an upper bound; the prediction, by pointer doubling, is fewer), and what it does with fewer."""
import numpy as np
import pytest

from primitives import construction as cn
from tunnels import hops

S = dict(hops.SETTINGS, n_symbols=16, hidden=3, max_hops=4)


@pytest.fixture(scope="module")
def held_out():
    return hops.sample(np.random.default_rng(7), 400, S)


def test_the_prediction_and_the_sequential_construction():
    """The prediction, binding then pointer doubling: 2, 3, 3, 4, 4 layers for 1..5 hops (a nats-like slip,
    log instead of log2, or h for h + 1, gives other lists); the construction here takes h + 1."""
    assert [cn.layers_needed(h) for h in (1, 2, 3, 4, 5, 7, 8)] == [2, 3, 3, 4, 4, 4, 5]
    assert [cn.sequential_layers(h) for h in (1, 2, 3, 4)] == [2, 3, 4, 5]


def test_at_the_predicted_depth_every_lookup_is_answered(held_out):
    """5 layers, h = 1..4: at least 99% of the answers whose exact posterior is one-hot are right (the lookup
    reading), confidently (KL under 0.01 bit); past a hidden key it does what the lookup-only predictor does
    (its elimination KL is that predictor's, to 1e-6): a construction of lookups, not of elimination."""
    cfg, _ = cn.params(S)
    assert cfg.n_layers == 5
    r = hops.readings(held_out, cn.predict(S, held_out["tokens"]), S)
    assert sorted(r) == [1, 2, 3, 4]
    for h, e in r.items():
        assert e["lookup"]["n"] > 40 and e["lookup"]["accuracy"] >= 0.99, (h, e["lookup"])
        assert e["lookup"]["kl_bits"] < 0.01, (h, e["lookup"])
        assert e["elimination"]["kl_bits"] == pytest.approx(e["follow_shown"]["elimination_kl_bits"], abs=1e-6)


@pytest.mark.ci_only
@pytest.mark.parametrize("layers", [2, 3, 4])
def test_with_fewer_layers_it_answers_only_the_hops_it_has_layers_for(held_out, layers):
    """Cut to L layers, the construction answers h <= L - 1 as before and the deeper hops at chance (its
    lookup accuracy there under 0.2, where chance is 1/16): its layers are its hops. (This shows how it is
    wired, not that fewer layers cannot: pointer doubling can.)"""
    r = hops.readings(held_out, cn.predict(S, held_out["tokens"], n_layers=layers), S)
    for h, e in r.items():
        if h <= layers - 1:
            assert e["lookup"]["accuracy"] >= 0.99, (layers, h)
        else:
            assert e["lookup"]["accuracy"] < 0.2, (layers, h, e["lookup"])
