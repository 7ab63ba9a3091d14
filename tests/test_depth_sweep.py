"""The depth sweep's driver (primitives/depth_sweep.py): its grid, the matched supervision, the choice of a
setting per depth and seed, the growth control's part in the reach; on fake metrics, and end to end on the
quick preset (ci_only)."""
import json
import os

import pytest

from harness import drivers
from primitives import depth_sweep as ds
from primitives import depth_rules as dr


def test_the_direct_format_is_asked_as_many_answers_as_a_chain_of_thought_gives():
    assert [ds.queries(h) for h in (1, 2, 3, 4)] == [1, 2, 2, 3]        # (H + 1) / 2, rounded up


def test_the_grid():
    g = ds.PRESETS["default"]
    cells = ds.grid_cells(g)
    assert ds.short_depths(g["depths"], g["max_hops"]) == [2, 3]
    assert len(cells) == (5 + 2) * 3 * 2 * 3                             # depths (direct, cot) x rates x inits x seeds
    assert set(g["seeds"]).isdisjoint({0, 1})                            # fresh: not the development runs' seeds
    assert len({c["name"] for c in cells}) == len(cells)
    direct = next(c for c in cells if not c["cot"])
    assert direct["flags"][:4] == ["--max-hops", "4", "--queries", "3"] and "--cot" not in direct["flags"]


def metrics(kl, acc, cot=False):
    groups = {f"h={h}": {"accuracy": a} for h, a in enumerate(acc, 1)}
    return {"kl_bits": kl, "steps": 10, **({"free_run": {"free": {"groups": groups}}} if cot else {"groups": groups})}


def test_a_setting_is_chosen_by_held_out_kl_and_a_grown_run_can_only_raise_the_reach():
    """Two settings at 2 layers, seed 2: the lower KL (0.3) is chosen, though the other reads more hops; its
    4x run stands in for it. At 3 layers the grown run reaches 2 where the scratch run reached 0: reach 2,
    and the line names it optimisation."""
    g = dict(depths=(2, 3), seeds=(2,), max_hops=3)
    a = dict(layers=2, cot=False, seed=2, name="a")
    b = dict(layers=2, cot=False, seed=2, name="b")
    c = dict(layers=3, cot=False, seed=2, name="c")
    results = {"a": metrics(0.5, [1.0, 0.95, 0.2]), "b": metrics(0.4, [1.0, 0.5, 0.1]),
               "b-4x": metrics(0.3, [1.0, 0.3, 0.1]), "c": metrics(0.9, [0.1, 0.1, 0.1]),
               "c-grown": metrics(0.2, [1.0, 0.99, 0.5])}
    best = ds.choose(results, [a, b, c])
    assert best[(2, False, 2)][1] == "b-4x" and best[(3, False, 2)][1] == "c"
    direct, cot, optimisation = ds.reaches(best, results, {(3, 2): {"name": "c-grown"}}, g)
    assert direct == {2: [1], 3: [2]} and cot == {} and optimisation == [(3, 2)]
    direct, _, optimisation = ds.reaches(best, results, {}, g)           # without the growth control
    assert direct == {2: [1], 3: [0]} and optimisation == []


def test_a_chain_of_thought_is_read_from_its_free_running_answers():
    best = {(2, True, 2): (None, "x", metrics(0.1, [1.0, 0.97, 0.4], cot=True))}
    _, cot, _ = ds.reaches(best, {}, {}, dict(depths=(2,), seeds=(2,), max_hops=3))
    assert cot == {2: [2]}


@pytest.mark.ci_only
def test_the_quick_sweep_runs_end_to_end(tmp_path):
    """Every cell through train.py (direct with two queries, the chain of thought at the short depth, the
    grown run), the summary written with both claims judged by depth_rules."""
    summary = ds.run("quick", str(tmp_path / "sweep"), jobs=2, figures=str(tmp_path / "figures"))
    written = json.loads((tmp_path / "sweep" / "depth-sweep.json").read_text())
    assert written["queries"] == 2 and set(written["claims"]) == {"runs out", "extends", "without hallucinating"}
    assert all(v["verdict"] in (dr.SUPPORTED, dr.NOT_SUPPORTED, dr.UNDECIDED) for v in written["claims"].values())
    assert os.path.isdir(tmp_path / "sweep" / "L2-grown-from-L1-direct-lr0.003-fan-in-s0")
    assert summary["direct"] and summary["cot"]
    assert os.path.exists(tmp_path / "figures" / "depth-sweep-quick.png")
    from primitives import chainsteps
    chainsteps.main(["--sweep", str(tmp_path / "sweep"), "--seqs", "40"])     # the geometric claim on its runs
    judged = json.loads((tmp_path / "sweep" / "chainsteps-L2.json").read_text())
    assert judged["layers"] == 2 and judged["verdict"] in (dr.SUPPORTED, dr.NOT_SUPPORTED, dr.UNDECIDED)


def test_claim_three_reads_the_chains_free_answers_past_the_direct_reach():
    """At 2 layers (direct reach 1 in both seeds) each seed's chosen chain: its h = 2 and 3 answers count, its
    h = 1 answers do not; 1 of 100 hallucinated (at most 2) in one seed, 0 of 100 in the other."""
    g = dict(depths=(1, 2, 3, 4), seeds=(2, 3), max_hops=3)
    group = lambda hall, upper: {"n_answers": 50, "hallucinated": hall, "hallucinated_upper": upper,
                                 "h_bayes_bits": 1.0}
    free = lambda a, b: {"config": {"n_classes": 16}, "free_run": {"free": {"groups": {
        "h=1": group(0.5, 0.5), "h=2": group(a, a), "h=3": group(b, 2 * b)}}}}
    best = {(2, True, 2): (None, "x", free(0.0, 0.02)), (2, True, 3): (None, "y", free(0.0, 0.0))}
    counts = ds.hallucinated(best, {2: [1, 1]}, g)
    assert [tuple(round(v, 9) for v in c) for c in counts] == [(1.0, 2.0, 100.0), (0.0, 0.0, 100.0)]


def write_run(path, accuracies, readings=None):
    os.makedirs(path, exist_ok=True)
    groups = {f"h={h}": {"accuracy": a} for h, a in enumerate(accuracies, 1)}
    with open(os.path.join(path, "metrics.json"), "w") as f:
        json.dump({"task": "hops", "model": "transformer", "steps": 10, "kl_bits": 0.5, "groups": groups,
                   "readings": readings or {}}, f)


def test_the_geometric_claim_reads_the_sweeps_chosen_runs(tmp_path):
    """chainsteps --sweep: at 2 layers, seed 2's chosen direct run does one hop (lookup accuracy 0.97, then 0.4
    and 0.1): it fails h = 2 and 3 (past its reach, whatever the older score says); seed 3 has no chosen chain
    and is left out; a directory without depth-sweep.json is one line."""
    from primitives import chainsteps
    write_run(tmp_path / "d2", [0.97, 0.4, 0.1])
    summary = dict(grid=dict(depths=[1, 2, 3], seeds=[2, 3], max_hops=3),
                   chosen={"L2-direct-s2": "d2", "L2-cot-s2": "c2", "L2-direct-s3": "d2"})
    (tmp_path / "depth-sweep.json").write_text(json.dumps(summary))
    pairs, _ = chainsteps.sweep_runs(str(tmp_path), 2, [2, 3])
    assert pairs == [(2, str(tmp_path / "d2"), str(tmp_path / "c2"), [2, 3])]
    with pytest.raises(drivers.Refused, match="no depth sweep"):
        chainsteps.sweep_runs(str(tmp_path / "nowhere"), 2, [2])


def test_the_sweeps_figure_draws_every_seed(tmp_path):
    from harness import plots
    entry = lambda acc, kl: {"lookup": {"accuracy": acc}, "elimination": {"kl_bits": kl},
                             "follow_shown": {"elimination_kl_bits": 2.5}, "eliminate_each_hop": {"elimination_kl_bits": 0.1}}
    readings = {"a": {"1": entry(1.0, 0.2), "2": entry(0.3, 1.0)}, "b": {"1": entry(0.06, 2.4), "2": entry(None, 2.5)}}
    summary = dict(grid=dict(depths=[2, 3], seeds=[2, 3], max_hops=2), readings=readings, n_symbols=16, does=0.9,
                   chosen={"L2-direct-s2": "a", "L2-direct-s3": "b", "L3-direct-s2": "a"})
    assert os.path.exists(plots.plot_depth_sweep(summary, str(tmp_path / "s.png")))
