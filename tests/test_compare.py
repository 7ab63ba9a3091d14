"""harness/compare.py: finished runs side by side, read from their metrics.json."""
import json
import os

import pytest

from harness import compare


def metrics(task="hmm", model="transformer", n=3, variants=True):
    rows = [dict(position=i + 1, H_model=1.0 + 0.2 * i, H_bayes=0.9 + 0.1 * i, kl=0.01 * (i + 1), impossible_mass=0.0)
            for i in range(n)]
    m = dict(task=task, model=model, steps=40, kl_bits=0.05, entropy_mae_bits=0.1, per_position=rows)
    if variants:
        m.update(length_generalization={"3": 0.02, "5": 0.03},
                 length_generalization_curves={"3": rows, "5": rows + [dict(rows[-1], position=n + 1)] * 2})
    return m


def write(tmp_path, name, m):
    os.makedirs(tmp_path / name)
    json.dump(m, open(tmp_path / name / "metrics.json", "w"))
    return str(tmp_path / name)


def test_runs_are_labelled_by_model_and_told_apart_by_directory(tmp_path):
    a, b = write(tmp_path, "a", metrics()), write(tmp_path, "b", metrics())
    assert list(compare.labelled([a, b])) == ["transformer (a)", "transformer (b)"]
    c = write(tmp_path, "c", metrics(model="lstm"))
    assert list(compare.labelled([a, c])) == ["transformer", "lstm"]
    assert list(compare.labelled([a, c], ["T", "L"])) == ["T", "L"]
    with pytest.raises(ValueError, match="^1 labels for 2 runs"):
        compare.labelled([a, c], ["T"])


def test_runs_that_do_not_line_up_are_refused_in_one_line(tmp_path):
    a, d = write(tmp_path, "a", metrics()), write(tmp_path, "d", metrics(task="bijection"))
    with pytest.raises(ValueError, match="^the runs differ in task, settings or answers \\(hmm against bijection\\)"):
        compare.labelled([a, d])
    e = write(tmp_path, "e", metrics(n=4))                            # another length: the answers differ
    with pytest.raises(ValueError, match="differ in task, settings or answers"):
        compare.labelled([a, e])
    with pytest.raises(ValueError, match="no metrics.json to read"):
        compare.labelled([str(tmp_path / "nowhere")])


def test_both_figures_are_drawn_and_a_run_without_variants_is_refused(tmp_path, capsys):
    a, c = write(tmp_path, "a", metrics()), write(tmp_path, "c", metrics(model="lstm"))
    for figure in ("calibration", "variants"):
        out = str(tmp_path / "figs" / f"{figure}.png")
        assert compare.main([figure, a, c, "--out", out]) == out and os.path.exists(out)
    n = write(tmp_path, "n", metrics(model="ssm", variants=False))
    with pytest.raises(SystemExit) as e:
        compare.main(["variants", a, n, "--out", str(tmp_path / "x.png")])
    assert e.value.code == 2 and "python -m harness.compare: error: ssm has no held-out variants" in capsys.readouterr().err


def test_the_answer_groups_figure_is_drawn_for_each_model(tmp_path):
    from harness import plots
    g = lambda kl: {"stored": dict(h_model_bits=0.1, h_bayes_bits=0.0, kl_bits=kl, accuracy=0.9, one_hot=1.0),
                    "not stored": dict(h_model_bits=4.9, h_bayes_bits=5.0, kl_bits=kl / 2, one_hot=0.0)}
    path = plots.plot_groups({"transformer": dict(groups=g(0.01)), "lstm": dict(groups=g(0.5))}, "recall",
                             str(tmp_path / "groups.png"))
    assert os.path.exists(path) and os.path.getsize(path) > 0
