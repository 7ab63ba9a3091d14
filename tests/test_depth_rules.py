"""The depth experiment's rules (primitives/depth_rules.py), every branch, on reach tables written by hand:
among them a referee's counterexamples to the earlier rules and to a first version of these, seeds that
disagree, and a table for each plausible mutation of the rules (min for max, a condition dropped)."""
import pytest

from primitives import depth_rules as dr

S, N, U = dr.SUPPORTED, dr.NOT_SUPPORTED, dr.UNDECIDED


def test_lookup_reach_counts_the_hops_done_from_the_first():
    assert dr.lookup_reach({1: 0.95, 2: 0.92, 3: 0.5, 4: 0.99}) == 2      # h = 4 done, h = 3 not: reach 2
    assert dr.lookup_reach({1: 0.9, 2: 0.89}) == 1                        # DOES is a closed threshold
    assert dr.lookup_reach({1: 0.85, 2: 1.0}) == 0
    assert dr.lookup_reach({1: None, 2: 1.0}) == 0 and dr.lookup_reach({2: 1.0}) == 0
    assert dr.lookup_reach({1: 1.0, 2: 1.0, 3: 1.0}) == 3


def test_the_prediction_binding_then_pointer_doubling():
    """1 + ceil(log2(h + 1)) layers for h hops: L layers reach 2^(L-1) - 1 (one hop needs 2, three need 3,
    seven need 4); the short depths of 4 hops are 2 and 3."""
    assert [dr.predicted_reach(L, 7) for L in (1, 2, 3, 4, 5)] == [0, 1, 3, 7, 7]
    assert [dr.predicted_reach(L, 4) for L in (1, 2, 3, 4, 5)] == [0, 1, 3, 4, 4]
    assert dr.short_depths((1, 2, 3, 4, 5), 4) == [2, 3] and dr.short_depths((1, 2, 3, 4), 3) == [2]


def table(reaches, depths=(1, 2, 3, 4, 6), seeds=2):
    return {L: [r] * seeds if isinstance(r, int) else list(r) for L, r in zip(depths, reaches)}


@pytest.mark.parametrize("reach, verdict", [
    # as predicted for 4 hops: one hop at 2 layers, three at 3, all four from 4
    ({1: [0, 0], 2: [1, 1], 3: [3, 3], 4: [4, 4], 5: [4, 4]}, S),
    ({2: [1, 1], 3: [3, 3], 4: [4, 4]}, S),                              # (catches "L > full" for "L >= full")
    # the referee's "only 2 layers do one hop" (0, 1, 0, 0, 0): 3 layers did no hop though one fits
    (table((0, 1, 0, 0, 0)), U),
    # the referee's "2 layers do every hop" (0, 4, 4, 4, 4): two layers did what the prediction gives four
    (table((0, 4, 4, 4, 4)), N),
    ({2: [1, 2], 3: [3, 3], 4: [4, 4]}, N),                              # one seed over the prediction is enough
    # a second referee's tables: shallow depths idle, the full one able
    ({1: [0, 0], 2: [0, 0], 3: [0, 0], 4: [4, 4]}, U),
    ({4: [4, 4], 5: [4, 4]}, U),                                          # no short depth trained
    ({2: [1, 1], 3: [0, 0], 4: [4, 4]}, U),                               # deeper does less
    ({1: [0, 0, 0], 2: [1, 0, 1], 3: [3, 3, 3], 4: [4, 4, 4]}, U),        # a seed at 0 where a hop fits
    ({2: [0, 1], 3: [3, 3], 4: [4, 4]}, U),                               # (catches max for min in "did no hop")
    # the seeds disagree: 3 layers' smallest is not above 2 layers' largest
    ({2: [1, 1], 3: [1, 3], 4: [4, 4]}, U),
    ({2: [1, 1], 3: [2, 3], 4: [3, 4], 5: [4, 4]}, U),                   # (catches min for max on the shallower)
    ({2: [1, 1], 3: [2, 2], 4: [3, 4]}, U),                               # no depth does all four in every seed
    ({2: [1, 1], 3: [3, 3]}, U),                                          # (catches dropping "some depth does all")
    (table((0, 0, 0, 0, 0)), U),                                          # nothing learned
])
def test_runs_out_every_branch(reach, verdict):
    got, why = dr.runs_out(reach, 4)
    assert got == verdict, why
    assert why


@pytest.mark.parametrize("direct, cot, verdict", [
    ({2: [1, 1], 3: [3, 3]}, {2: [4, 4], 3: [4, 4]}, S),
    ({2: [1, 1], 3: [3, 3]}, {2: [1, 1], 3: [3, 3]}, N),
    ({2: [1, 1], 3: [3, 3]}, {2: [1, 0], 3: [2, 2]}, N),                  # worse is not further
    ({2: [1, 1], 3: [3, 3]}, {2: [4, 1], 3: [4, 4]}, U),                  # seeds disagree at 2 layers
    ({2: [1, 1], 3: [3, 3]}, {2: [4, 4], 3: [3, 3]}, U),                  # further at one short depth only
    ({2: [0, 0], 3: [3, 3]}, {2: [1, 1], 3: [4, 4]}, U),                  # the direct model did not learn what fits
    ({2: [1, 1], 3: [2, 3]}, {2: [4, 4], 3: [3, 4]}, U),                  # (catches min for max on the direct, S)
    ({2: [1, 1], 3: [3, 3]}, {2: [1, 2], 3: [3, 3]}, U),                  # (catches min-cot <= max-direct, N)
    ({2: [1, 1], 3: [2, 3]}, {2: [1, 1], 3: [3, 3]}, U),                  # (catches max for min on the direct, N)
    ({1: [0, 0], 4: [4, 4], 5: [4, 4]}, {1: [0, 0], 4: [4, 4], 5: [4, 4]}, U),   # no short depth both ways
    ({2: [1, 1]}, {}, U),
])
def test_cot_extends_every_branch(direct, cot, verdict):
    got, why = dr.cot_extends(direct, cot, 4)
    assert got == verdict, why


def test_every_verdict_is_reachable():
    outs = {dr.runs_out(r, 4)[0] for r in ({2: [1, 1], 3: [3, 3], 4: [4, 4]}, table((0, 4, 4, 4, 4)),
                                           table((0, 1, 0, 0, 0)))}
    cots = {dr.cot_extends({2: [1, 1], 3: [3, 3]}, c, 4)[0] for c in ({2: [4, 4], 3: [4, 4]}, {2: [1, 1], 3: [3, 3]},
                                                                      {2: [4, 1], 3: [4, 4]})}
    assert outs == cots == {S, N, U}
