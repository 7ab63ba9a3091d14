"""Every figure the project draws keeps the figure rules (harness/plots.figure_problems: no text outside the image,
no two texts over each other, no series of one point without a marker, no legend on the data), checked from
matplotlib's own text extents whenever a test draws it in its own process (conftest.py sets plots.STRICT, and
plots._save raises on a broken rule). Here: the index of where each figure function is drawn that way, so that
a new figure function without a test that draws it fails, and the figures no other test draws in its process,
drawn here with the longest labels they can be given. That each is in fact drawn is checked at the end of the
README's whole command (conftest.py's pytest_sessionfinish fails the session naming any figure function no test
drew in the tests' own process)."""

import os
import re

import pytest

from harness import plots
from tunnels import hmm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository's folder

# figure function -> a test that draws it in the tests' own process, so under the rules (found by recording every
# plots._save call of a full run of the README's test command; the geometry figures with the longest verdict
# labels, tests/test_manifold.py's longest_labels)
DRAWN_BY = {
    "plot_calibration": "tests/test_train.py::test_a_direct_run_reports_its_readings_and_prints_them",
    "plot_traces": "tests/test_train.py::test_a_direct_run_reports_its_readings_and_prints_them",
    "plot_groups": "tests/test_compare.py::test_the_answer_groups_figure_is_drawn_for_each_model",
    "plot_free": "tests/test_cot.py::test_the_companion_figures_sequences_are_uncertain_ones_first",
    "plot_variants": "tests/test_figures.py::test_the_variants_figure_with_the_longest_labels",
    "plot_primitives": "tests/test_matrix.py::test_row_labels_and_the_primitives_figure_with_a_depth_row_that_is_the_preset",
    "plot_memory": "tests/test_matrix.py::test_the_command_reads_every_mark_against_its_tasks_shortcut",
    "plot_variants_across": "tests/test_compare.py::test_both_figures_are_drawn_and_a_run_without_variants_is_refused",
    "plot_learning_curves": "tests/test_matrix.py::test_the_command_reads_every_mark_against_its_tasks_shortcut",
    "plot_sweep": "tests/test_matrix.py::test_the_sweep_figure_is_drawn_with_a_family_sitting_out",
    "plot_layers": "tests/test_depth.py::test_details_put_the_seeds_side_by_side_in_every_mode",
    "plot_depth_sweep": "tests/test_depth_sweep.py::test_the_sweeps_figure_draws_every_seed",
    "plot_key_frame": "tests/test_manifold.py::test_analyze_smoke_bijection",
    "plot_attention_maps": "tests/test_manifold.py::test_analyze_smoke_bijection",
    "plot_attention_entropy": "tests/test_manifold.py::test_analyze_smoke_bijection",
    "plot_manifold": "tests/test_manifold.py::test_analyze_smoke_bijection",
    "plot_logit_lens": "tests/test_manifold.py::test_analyze_smoke_bijection",
    "plot_ablations": "tests/test_manifold.py::test_analyze_smoke_bijection",
    "plot_frame_precision": "tests/test_manifold.py::test_analyze_smoke_bijection",
    "plot_em_vs_sgd": "tests/test_dynamics.py::test_compare_em_quick_writes_everything",
    "plot_two_timescales": "tests/test_dynamics.py::test_compare_em_quick_writes_everything",
    "plot_deep_variant": "tests/test_dynamics.py::test_run_deep_writes_its_numbers_and_its_figure",
}


def test_every_figure_function_is_drawn_under_the_rules_by_a_named_test(figure_function_names):
    """A figure function without a test drawing it in this process fails here; each named test exists."""
    assert figure_function_names == set(DRAWN_BY), (
        f"figure functions without a test that draws them: {sorted(figure_function_names - set(DRAWN_BY))}; "
        f"names here that draw nothing any more: {sorted(set(DRAWN_BY) - figure_function_names)}")
    for name, test in DRAWN_BY.items():
        path, func = test.split("::")
        text = open(os.path.join(ROOT, path)).read()
        assert re.search(rf"^def {func}\(", text, flags=re.M), f"{name}: {test} does not exist"


def test_the_figure_rules_can_fail(tmp_path):
    """The rules are not vacuous: a title wider than its figure, two labels at one place, a one-point line
    without a marker, a legend on the data: each named."""
    plt = plots._plt()
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_title("a title far wider than the three inches of this figure, so it runs off both edges")
    ax.plot([0.5], [0.5], "-", label="one point")
    ax.plot([0.0, 1.0], [0.0, 1.0], label="diagonal")
    ax.text(0.2, 0.8, "here")
    ax.text(0.2, 0.8, "here")
    ax.legend(loc="center")
    found = " | ".join(plots.figure_problems(fig))
    plt.close(fig)
    assert "runs outside the image" in found and "drawn over each other" in found
    assert "a series of one point without a marker ('one point')" in found
    assert "the legend sits on the points of 'one point'" in found    # the centre: the one point, first
    with pytest.raises(ValueError, match="runs outside the image"):
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.set_title("a title far wider than the three inches of this figure, so it runs off both edges")
        plots._save(fig, str(tmp_path / "bad.png"))
    assert not (tmp_path / "bad.png").exists()                  # a broken figure is not written


def test_the_variants_figure_with_the_longest_labels(tmp_path):
    """The HMM's length generalisation (train.py draws it only on the HMM, in no test's process): three
    variants with the task's own label format and title, and KLs whose labels are the longest %.2g gives."""
    per = lambda n, kl: [dict(position=i + 1, kl=kl * (1 + i / n)) for i in range(n)]
    curves = {20: dict(per_position=per(20, 1.2e-5), kl_bits=1.2345e-05),
              30: dict(per_position=per(30, 0.0123), kl_bits=0.012345),
              50: dict(per_position=per(50, 0.123), kl_bits=0.12345)}
    path = plots.plot_variants(curves, str(tmp_path / "variants.png"), hmm.VARIANT_FORMAT, hmm.ANSWER_LABEL,
                               hmm.VARIANT_TITLE)
    assert os.path.getsize(path) > 10_000
