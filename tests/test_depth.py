"""primitives/depth.py's rules, every branch, on hand-made runs."""

import os

import pytest

from primitives import depth
from primitives import matrix
import models

pytestmark = pytest.mark.plain_python


def g(kl, h_bayes=1.0, n=100, hall=0.0, doubt=0.0, upper=None):
    return dict(kl_bits=kl, h_bayes_bits=h_bayes, n_answers=n, hallucinated=hall, honest_doubt=doubt,
                hallucinated_upper=hall if upper is None else upper,
                prior_kl_bits=4.0 - h_bayes)       # K = 16, as answer_groups computes it


def metrics(groups, cot=False, K=16):
    named = {f"h={h}": v for h, v in groups.items()}
    import dataclasses
    import models
    config = dataclasses.asdict(models.make_config("transformer", vocab_size=50, n_classes=K, max_len=40, d_model=8,
                                                   n_layers=1, n_heads=2))
    m = dict(config=config, params=1000, steps=10, groups={} if cot else named,
             settings=dict(n_symbols=K, hidden=3, max_hops=8, cot=cot))
    if cot:
        m["free_run"] = {"free": {"groups": named}}
    return m


def test_a_groups_score_reads_its_prior_from_its_mean_exact_entropy():
    """K = 16, mean H_Bayes 1 bit: the uniform predictor's KL is 4 - 1 = 3 bits; a KL of 0.15 scores 0.95
    (solved, the threshold itself), 0.3 scores 0.9 (not). With log2 K alone (4 bits) 0.15 would score 0.9625."""
    groups = depth.answer_groups(metrics({1: g(0.15), 2: g(0.3)}), cot=False)
    assert depth.group_score(groups[1]) == pytest.approx(0.95) and depth.group_score(groups[2]) == pytest.approx(0.9)
    assert depth.reach(groups) == 1
    cot = depth.answer_groups(metrics({1: g(0.0), 2: g(0.0)}, cot=True), cot=True)    # the free run's groups
    assert depth.reach(cot) == 2


def test_reach_stops_at_the_first_unsolved_or_missing_h():
    good, bad = g(0.01), g(2.0)
    assert depth.reach({1: good, 2: good, 3: bad, 4: good}) == 2
    assert depth.reach({1: bad, 2: good}) == 0
    assert depth.reach({1: good, 3: good}) == 1                       # no answers of 2 hops: not solved
    assert matrix.GOOD == 0.95


def test_claim_one_every_branch():
    assert depth.runs_out({1: [1, 1], 2: [3, 2], 4: [8, 8]}, 8) == depth.SUPPORTED
    assert depth.runs_out({1: [3, 3], 2: [3, 2]}, 8) == depth.NOT_SUPPORTED       # deeper never reaches further
    assert depth.runs_out({1: [1, 2], 2: [2, 3]}, 8) == depth.UNDECIDED           # a seed each way
    assert depth.runs_out({1: [8, 8], 2: [8, 8]}, 8) == depth.UNDECIDED           # the range was too small
    assert depth.runs_out({1: [0, 0], 2: [0, 0]}, 8) == depth.UNDECIDED           # nothing learned
    assert depth.short_depths({1: [0, 0], 2: [1, 2], 3: [2, 8], 4: [8, 8]}, 8) == [2]


def test_claim_two_every_branch():
    direct = {1: [1, 1], 2: [2, 2], 4: [8, 8]}
    assert depth.cot_extends(direct, {1: [3, 4], 2: [5, 5]}, 8) == depth.SUPPORTED
    assert depth.cot_extends(direct, {1: [1, 0], 2: [2, 1]}, 8) == depth.NOT_SUPPORTED
    assert depth.cot_extends(direct, {1: [3, 3], 2: [2, 2]}, 8) == depth.UNDECIDED   # extends at one depth only
    assert depth.cot_extends(direct, {2: [5, 5]}, 8) == depth.UNDECIDED              # depth 1's cot is missing
    assert depth.cot_extends({1: [8, 8]}, {1: [8, 8]}, 8) == depth.UNDECIDED         # nothing ran out
    assert depth.cot_extends({1: [0, 0], 4: [4, 4]}, {1: [1, 1]}, 4) == depth.UNDECIDED   # no hop done directly


def test_claim_three_every_branch():
    """Wilson intervals at z = 2 against CEILING 0.02, per short depth and seed. 0 of 400: high
    (0.005 + 0.005) / 1.01 = 0.0099: supported. 0 of 100: high 0.04 / 1.04 = 0.0385, low 0: undecided (and 0 of 1, the Wald interval's
    zero width, too). 2 of 400, at most 2: high (0.01 + 0.00865) / 1.01 = 0.0185: supported; at most 40 (the
    dropped mass could hallucinate): undecided. 40 of 400: low (0.105 - 0.0304) / 1.01 = 0.0738: not
    supported."""
    assert depth.wilson(0, 400)[1] == pytest.approx(0.0099, abs=1e-4)
    assert depth.wilson(2, 400) == (pytest.approx(0.00134, abs=1e-5), pytest.approx(0.01846, abs=1e-5))
    S, N, U = depth.SUPPORTED, depth.NOT_SUPPORTED, depth.UNDECIDED
    w = depth.without_hallucinating
    assert w([(0, 0, 400)], S) == S
    assert w([(0, 0, 400)], N) == U == w([(0, 0, 400)], U)          # supported only with claim 2
    assert w([(0, 0, 100)], S) == U and w([(0, 0, 1)], S) == U
    assert w([(2, 2, 400)], S) == S and w([(2, 40, 400)], S) == U
    assert w([(40, 40, 400)], S) == N == w([(40, 40, 400)], U)      # not supported needs no claim 2
    # per depth and seed, not pooled: 0 of 400 and 2 of 100 pool to 2 of 500 (high 0.0149, supported) but the
    # second alone has high (0.04 + 0.0299) / 1.04 = 0.0672: undecided; every seed above: not supported
    assert depth.wilson(2, 500)[1] < depth.CEILING < depth.wilson(2, 100)[1]
    assert w([(0, 0, 400), (2, 2, 100)], S) == U
    assert w([(40, 40, 400), (20, 20, 100)], S) == N and w([(40, 40, 400), (0, 0, 400)], S) == U
    assert w([], S) == U == w([(0, 0, 0)], S)
    assert depth.CEILING == 0.02 and depth.Z == 2.0


def test_what_happens_past_the_reach_is_pooled_over_seeds_by_answers():
    """Seed 0 reaches 1: h = 2 (100 answers, 40% hallucinated, 10% doubt) lies past it; seed 1 reaches 2: h = 3
    (300 answers, 0% and 50%). Pooled by answers: hallucinated 40 / 400 = 0.1, doubt (10 + 150) / 400 = 0.4:
    honest doubt (averaging the two seeds' shares instead: 0.2 and 0.3)."""
    seeds = [{1: g(0.0), 2: g(2.0, hall=0.4, doubt=0.1)}, {1: g(0.0), 2: g(0.0), 3: g(2.0, n=300, doubt=0.5)}]
    p = depth.behaviour_past_reach(seeds, [1, 2])
    assert p["kind"] == "honest doubt" and p["answers"] == 400
    assert (p["hallucinated"], p["honest_doubt"]) == (pytest.approx(0.1), pytest.approx(0.4))
    assert depth.behaviour_past_reach(seeds, [3, 3]) is None
    quiet = [{1: g(0.0), 2: g(2.0, hall=0.02, doubt=0.03)}]               # wrong, but neither share notable
    assert depth.behaviour_past_reach(quiet, [1])["kind"] == "neither"
    # claim 3's pool: one cut for every seed (h = 2 and 3 past 1: 40 + 0 of 100 + 100 + 300)
    assert depth.past_reach(seeds, 1) == (pytest.approx(40.0), 500)
    with pytest.raises(ValueError, match="no score"):
        depth.group_score(dict(kl_bits=0.1, prior_kl_bits=0.0))


def test_the_verdicts_of_a_whole_sweep():
    """Depth 1 reaches 1 hop directly (2 and 3 fail, half hallucinated), depth 2 all three; with cot, depth 1
    reaches 3 running free, hallucinating none of the 400 answers past the direct reach: every claim
    supported; with one transformer cell missing, every claim undecided."""
    todo = depth.cells(seeds=(0, 1), max_hops=3, depths=(1, 2), others=())
    solved, failed = g(0.01), g(2.0, hall=0.5)
    results = {}
    for c in todo:
        if c["cot"]:
            groups = {1: solved, 2: solved, 3: solved}
        else:
            groups = {1: solved, 2: failed, 3: failed} if c["layers"] == 1 else {1: solved, 2: solved, 3: solved}
        results[c["name"]] = metrics(groups, cot=c["cot"])
    rows, claims, shares = depth.verdicts(results, todo, 3)
    assert claims == {"a fixed depth runs out": depth.SUPPORTED, "chain of thought extends it": depth.SUPPORTED,
                      "without hallucinating": depth.SUPPORTED}
    assert shares["short_depths"] == [1] and shares["direct"] == (pytest.approx(200.0), 400)
    assert shares["cot"] == (0.0, 0.0, 400) and shares["missing"] == []
    one = next(r for r in rows if r["layers"] == 1 and not r["cot"])
    assert one["reach"] == [1, 1] and one["past_reach"]["kind"] == "hallucinating"
    assert any("claim: a fixed depth runs out: supported" == line for line in depth.lines(rows, claims, 3))
    # compute to the answer: the family's forward at the length read, direct 2 x 16 + 3 = 35 tokens at every
    # h, a chain of thought h - 1 more (its written hops)
    cfg = models.config_from_dict("transformer", results[todo[0]["name"]]["config"])
    fwd = lambda T: models.step_flops("transformer", cfg, 1, T) / 3
    cot_one = next(r for r in rows if r["layers"] == 1 and r["cot"])
    assert one["flops"] == {1: fwd(35), 2: fwd(35), 3: fwd(35)}
    assert cot_one["flops"] == {1: fwd(35), 2: fwd(36), 3: fwd(37)} and fwd(37) > fwd(35)
    assert len({c["name"] for c in depth.cells()}) == len(depth.cells()) == 2 * 2 * (len(depth.DEPTHS) + 2)
    del results[todo[-1]["name"]]
    _, claims, shares = depth.verdicts(results, todo, 3)
    assert set(claims.values()) == {depth.UNDECIDED} and shares["missing"] == [todo[-1]["name"]]


def test_the_4x_rule_every_branch():
    """Which depths run at 4x the steps: all when none reaches one hop in every seed, else the falling ones;
    the budget reading seed by seed; the cells, every depth in every seed."""
    assert depth.x4_depths({1: [0, 0], 2: [0, 1]}, {}) == [1, 2]                  # nothing learned: every depth
    assert depth.x4_depths({1: [1, 1], 2: [0, 1]}, {2: True}) == [1, 2]           # one falling: all (one budget)
    assert depth.x4_depths({1: [1, 1], 2: [2, 2]}, {}) == [] == depth.x4_depths({}, {})
    assert depth.budget_reading({0: 0, 1: 1}, {0: 1, 1: 2}) == "budget-limited"
    assert depth.budget_reading({0: 0, 1: 1}, {0: 2, 1: 1}) == "not the budget"   # seed by seed, not the best
    assert depth.budget_reading({0: 1, 1: 0}, {1: 1, 0: 2}) == "budget-limited"   # by seed, not by position
    assert depth.budget_reading({0: 0, 1: 1}, {0: 3}) == "incomplete"
    cells = depth.x4_cells([2, 4], (0, 1), 4, 24000)
    assert [c["name"] for c in cells] == ["hops-transformer-L2-direct-4x-s0", "hops-transformer-L2-direct-4x-s1",
                                          "hops-transformer-L4-direct-4x-s0", "hops-transformer-L4-direct-4x-s1"]
    assert matrix.expected_steps(cells[0], "default") == 24000 and cells[3]["layers"] == 4 and cells[3]["seed"] == 1


def test_confirm_trains_what_the_rule_asks_and_judges_again(tmp_path):
    """confirm on a sweep where no depth reaches a hop: both depths at 4x in both seeds (the longest first), the
    claims judged again with the 4x runs in the direct cells' places: depth 1 reaches one hop, depth 2 both,
    the chain of thought both at depth 1: every claim supported at 4x, undecided at the matched budget."""
    todo = depth.cells(seeds=(0, 1), max_hops=2, depths=(1, 2), others=())
    failed, solved, many = g(2.0), g(0.01), g(0.01, n=400)      # 400 answers a seed: an interval under 0.02
    results = {c["name"]: metrics({1: many, 2: many} if c["cot"] else {1: failed, 2: failed}, cot=c["cot"])
               for c in todo}
    rows, claims, _ = depth.verdicts(results, todo, 2)
    assert set(claims.values()) == {depth.UNDECIDED}
    for c in todo:                                           # flat training losses: no depth still falling
        (tmp_path / c["name"]).mkdir()
        (tmp_path / c["name"] / "log.csv").write_text("step,loss_bits,bayes_loss_bits\n" +
                                                      "".join(f"{i},2.0,0.0\n" for i in range(1, 41)))
    asked = []

    def run(preset, out, jobs, todo):
        asked.extend(todo)
        return {c["name"]: metrics({1: solved, 2: failed} if c["layers"] == 1 else {1: solved, 2: solved})
                for c in todo}
    x4_rows, claims_4x, shares_4x, x4_detail = depth.confirm(rows, results, todo, str(tmp_path), "default", 2, run=run)
    assert [(c["layers"], c["seed"]) for c in asked] == [(2, 0), (2, 1), (1, 0), (1, 1)]
    assert all("--steps" in c["flags"] for c in asked)
    assert [(r["layers"], r["reach"], r["budget"]) for r in x4_rows] == [(1, [1, 1], "budget-limited"),
                                                                        (2, [2, 2], "budget-limited")]
    assert claims_4x == {"a fixed depth runs out": depth.SUPPORTED, "chain of thought extends it": depth.SUPPORTED,
                         "without hallucinating": depth.SUPPORTED}
    assert shares_4x["short_depths"] == [1] and shares_4x["cot"] == (0.0, 0.0, 800)           # h = 2, two seeds of 400
    assert {r["mode"] for r in x4_detail} == {"direct, 4x"}
    table = depth.lines(rows + x4_rows, claims, 2)
    assert any(line.startswith("transformer, 1 layer") and " 4x " in line for line in table)
    # a 4x run that failed leaves its depth's cell missing: every claim at 4x undecided
    x4_rows, claims_4x, _, _ = depth.confirm(rows, results, todo, str(tmp_path), "default", 2,
                                             run=lambda preset, out, jobs, todo: {})
    assert set(claims_4x.values()) == {depth.UNDECIDED} and x4_rows == []
    # one seed's 4x run failed: that depth's budget is incomplete, every claim at 4x undecided
    partial = lambda preset, out, jobs, todo: {c["name"]: metrics({1: solved, 2: solved}) for c in todo
                                               if not (c["layers"] == 1 and c["seed"] == 1)}
    x4_rows, claims_4x, _, _ = depth.confirm(rows, results, todo, str(tmp_path), "default", 2, run=partial)
    assert [(r["layers"], r["seeds"], r["budget"]) for r in x4_rows] == [(1, [0], "incomplete"),
                                                                        (2, [0, 1], "budget-limited")]
    assert set(claims_4x.values()) == {depth.UNDECIDED}
    # a depth still falling at the matched budget sends every depth to 4x, though each reaches a hop
    reached = {c["name"]: metrics({1: solved, 2: solved} if c["cot"] or c["layers"] == 2 else {1: solved, 2: failed},
                                  cot=c["cot"]) for c in todo}
    rows1, _, _ = depth.verdicts(reached, todo, 2)
    (tmp_path / todo[0]["name"] / "log.csv").write_text("step,loss_bits,bayes_loss_bits\n" + "".join(
        f"{i},{3.0 - i / 20},0.0\n" for i in range(1, 41)))           # depth 1, seed 0: still falling
    asked.clear()
    depth.confirm(rows1, reached, todo, str(tmp_path), "default", 2, run=run)
    assert sorted({c["layers"] for c in asked}) == [1, 2]
    (tmp_path / todo[0]["name"] / "log.csv").write_text("step,loss_bits,bayes_loss_bits\n" + "".join(
        f"{i},2.0,0.0\n" for i in range(1, 41)))
    asked.clear()
    assert depth.confirm(rows1, reached, todo, str(tmp_path), "default", 2, run=run) == ([], {}, {}, []) and not asked


def test_details_put_the_seeds_side_by_side_in_every_mode(tmp_path):
    """A direct cell and a chain-of-thought cell, two seeds: the direct KLs by h, and the chain's teacher-forced,
    free and greedy groups read from their own places in metrics.json; the table joins the seeds."""
    todo = depth.cells(seeds=(0, 1), max_hops=2, depths=(2,), others=())
    results = {}
    for c in todo:
        kl = 0.5 + c["seed"]
        m = metrics({1: g(kl), 2: g(2 * kl, hall=0.25)}, cot=c["cot"])
        if c["cot"]:
            m["groups"] = {"h=1": g(0.1), "h=2": g(0.2), "hops before the last": g(9.0)}
            m["free_run"]["greedy"] = {"groups": {"h=1": g(3.0), "h=2": g(4.0)}}
        results[c["name"]] = m
    rows = depth.details(results, todo)
    by = {r["mode"]: r for r in rows}
    assert set(by) == {"direct", "teacher-forced", "free", "greedy"}
    assert by["direct"]["kl_bits"] == {1: [0.5, 1.5], 2: [1.0, 3.0]} and by["direct"]["seeds"] == [0, 1]
    assert by["teacher-forced"]["kl_bits"] == {1: [0.1, 0.1], 2: [0.2, 0.2]}        # not the hops before the last
    assert by["free"]["hallucinated"][2] == [0.25, 0.25] and by["greedy"]["kl_bits"][2] == [4.0, 4.0]
    line = next(l for l in depth.detail_lines(rows, 2) if "direct" in l)
    assert "0.5/1.5" in line and "1/3" in line and "25%/25%" in line
    x4 = depth.x4_cells([2], (0,), 2, 40)[0]
    assert depth.details({x4["name"]: metrics({1: g(0.1)})}, [x4])[0]["mode"] == "direct, 4x"
    from harness import plots
    rows_, _, _ = depth.verdicts(results, todo, 2)
    assert os.path.exists(plots.plot_layers(rows_, str(tmp_path / "layers.png"), 2))
