"""The depth experiment's rules (primitives/depth_rules.py), every branch, on reach tables written by hand:
among them a referee's counterexamples to the earlier rules, and seeds that disagree."""
import pytest

from primitives import depth_rules as dr

S, N, U = dr.SUPPORTED, dr.NOT_SUPPORTED, dr.UNDECIDED


def test_lookup_reach_counts_the_hops_done_from_the_first():
    assert dr.lookup_reach({1: 0.95, 2: 0.92, 3: 0.5, 4: 0.99}) == 2      # h = 4 done, h = 3 not: reach 2
    assert dr.lookup_reach({1: 0.9, 2: 0.89}) == 1                        # DOES is a closed threshold
    assert dr.lookup_reach({1: 0.85, 2: 1.0}) == 0
    assert dr.lookup_reach({1: None, 2: 1.0}) == 0 and dr.lookup_reach({2: 1.0}) == 0
    assert dr.lookup_reach({1: 1.0, 2: 1.0, 3: 1.0}) == 3


def test_the_prediction_one_layer_to_bind_and_one_a_hop():
    assert [dr.predicted_reach(L, 4) for L in (1, 2, 3, 4, 5, 6)] == [0, 1, 2, 3, 4, 4]


FIVE = (1, 2, 3, 4, 6)


def table(reaches, seeds=2, depths=FIVE):
    return {L: [r] * seeds if isinstance(r, int) else list(r) for L, r in zip(depths, reaches)}


@pytest.mark.parametrize("reach, verdict", [
    # as predicted: reach L - 1 up to the full depth (5 layers for 4 hops), all four past it
    ({1: [0, 0], 2: [1, 1], 3: [2, 2], 4: [3, 3], 5: [4, 4], 6: [4, 4]}, S),
    # the referee's "only 2 layers do one hop" (0, 1, 0, 0, 0): one depth does a hop, nothing grows: undecided
    (table((0, 1, 0, 0, 0)), U),
    # the referee's "2 layers do every hop" (0, 4, 4, 4, 4): two layers did what the prediction gives five
    (table((0, 4, 4, 4, 4)), N),
    # one seed over the prediction is enough: 3 layers cannot do 3 hops
    ({2: [1, 1], 3: [2, 3], 4: [3, 3], 5: [4, 4]}, N),
    # the seeds disagree at 3 layers: its smallest reach is not above 2 layers' largest
    ({2: [1, 1], 3: [2, 1], 4: [3, 3], 5: [4, 4]}, U),
    # deeper does no more than shallower: optimisation, not depth
    ({2: [1, 1], 3: [1, 1], 4: [3, 3], 5: [4, 4]}, U),
    # the full depth never learns all four hops
    ({2: [1, 1], 3: [2, 2], 4: [3, 3], 5: [3, 3]}, U),
    # nothing learned a hop
    (table((0, 0, 0, 0, 0)), U),
    # the depth sweep's matched-budget development data, read this way: no depth did a hop in every seed
    (table(((0, 0), (1, 0), (1, 1), (0, 1), (0, 1))), U),
])
def test_runs_out_every_branch(reach, verdict):
    got, why = dr.runs_out(reach, 4)
    assert got == verdict, why
    assert why


def test_runs_out_can_come_out_every_way_and_reads_the_seeds_by_their_extremes():
    """Every verdict is reachable; and reading a depth by its best seed instead of its worst (a plausible
    mistake) would turn the disagreeing table above into "supported": the rule does not."""
    outcomes = {dr.runs_out(r, 4)[0] for r in (
        {2: [1, 1], 3: [2, 2], 4: [3, 3], 5: [4, 4]}, table((0, 4, 4, 4, 4)), table((0, 1, 0, 0, 0)))}
    assert outcomes == {S, N, U}
    best_seed = {L: [max(r)] * 2 for L, r in {2: [1, 1], 3: [2, 1], 4: [3, 3], 5: [4, 4]}.items()}
    assert dr.runs_out(best_seed, 4)[0] == S and dr.runs_out({2: [1, 1], 3: [2, 1], 4: [3, 3], 5: [4, 4]}, 4)[0] == U


@pytest.mark.parametrize("direct, cot, verdict", [
    ({2: [1, 1], 3: [2, 2], 4: [3, 3]}, {2: [4, 4], 3: [4, 4], 4: [4, 4]}, S),
    ({2: [1, 1], 3: [2, 2], 4: [3, 3]}, {2: [1, 1], 3: [2, 2], 4: [3, 3]}, N),
    ({2: [1, 1], 3: [2, 2], 4: [3, 3]}, {2: [1, 0], 3: [0, 0], 4: [3, 2]}, N),      # worse is not further
    # mixed seeds at one short depth: the chain's smallest (1) is not above the direct's largest (1)
    ({2: [1, 1], 3: [2, 2]}, {2: [4, 1], 3: [4, 4]}, U),
    # further at one short depth, not at the other
    ({2: [1, 1], 3: [2, 2]}, {2: [4, 4], 3: [2, 2]}, U),
    # only depths the prediction does not call short (1 layer: no lookup; 5 and 6: every hop) trained both ways
    ({1: [0, 0], 5: [4, 4], 6: [4, 4]}, {1: [0, 0], 5: [4, 4], 6: [4, 4]}, U),
    ({2: [1, 1]}, {}, U),
])
def test_cot_extends_every_branch(direct, cot, verdict):
    got, why = dr.cot_extends(direct, cot, 4)
    assert got == verdict, why


def test_cot_extends_reads_short_by_the_prediction_and_seeds_by_their_extremes():
    """A "short in some seed" or "best seed" reading (max for min) would call the mixed table supported."""
    direct, cot = {2: [1, 1], 3: [2, 2]}, {2: [4, 1], 3: [4, 4]}
    assert dr.cot_extends(direct, cot, 4)[0] == U
    assert all(max(cot[L]) > min(direct[L]) for L in direct)                  # what the mistake would read
