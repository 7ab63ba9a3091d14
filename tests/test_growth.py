"""The depth experiment's growth control: a transformer grown from a trained shallower one computes exactly what
that one computes (its new blocks' output maps at zero), through bayesattn.grow, models.grow and train.py
--grow-from, and every input it cannot take is refused in one line before anything is written."""
from dataclasses import replace

import numpy as np
import pytest

import bayesattn as ba
import models
import train
from harness import flags

CFG = ba.Config(vocab_size=9, n_classes=5, max_len=7, d_model=8, n_layers=2, n_heads=2, dtype="float64", init="fan-in")
TOKENS = np.random.default_rng(0).integers(0, 9, (3, 7))


def test_grown_blocks_add_nothing_until_trained():
    p0 = ba.init_params(CFG, 1)
    deeper = replace(CFG, n_layers=4)
    grown = ba.grow(p0, CFG, deeper, seed=3)
    before, after = ba.forward(p0, TOKENS, CFG)[0], ba.forward(grown, TOKENS, deeper)[0]
    assert np.abs(before - after).max() == 0.0
    assert all(np.array_equal(grown[k], v) for k, v in p0.items())                  # the trained ones, as they were
    assert np.abs(grown["blocks.3.attn.wq"]).max() > 0                              # the new ones drawn, but
    assert not any(grown[f"blocks.{l}.{n}"].any() for l in (2, 3) for n in ("attn.wo", "attn.bo", "mlp.w2", "mlp.b2"))
    drawn = {**grown, "blocks.2.attn.wo": ba.init_params(deeper, 3)["blocks.2.attn.wo"]}   # the check can fail:
    assert np.abs(ba.forward(drawn, TOKENS, deeper)[0] - before).max() > 1e-3             # one map left drawn


@pytest.mark.parametrize("cfg", [replace(CFG, n_layers=2), replace(CFG, n_layers=1), replace(CFG, n_layers=3, d_model=12)])
def test_a_model_grows_by_layers_only(cfg):
    with pytest.raises(ValueError, match="a model grows by layers only"):
        ba.grow(ba.init_params(CFG, 0), CFG, cfg)


def test_a_family_without_grow_is_refused_in_one_line():
    cfg = models.make_config("lstm", vocab_size=9, n_classes=5, max_len=7, d_model=8, n_layers=1)
    with pytest.raises(ValueError, match="model 'lstm' cannot grow from a shallower checkpoint"):
        models.grow("lstm", models.init_params("lstm", cfg), cfg, replace(cfg, n_layers=2))


QUICK = ["--task", "hops", "--preset", "quick", "--steps", "3", "--eval-seqs", "8", "--no-baseline", "--no-geometry",
         "--quiet"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    out = tmp_path_factory.mktemp("grow") / "one-layer"
    train.main([*QUICK, "--layers", "1", "--out", str(out)])
    return str(out / "checkpoint.npz")


def test_grow_from_starts_where_the_checkpoint_is_and_is_part_of_the_run(source, tmp_path, capsys):
    """train.grown: the 2-layer start computes the trained 1-layer model's logits; the run records --grow-from
    in its meta, so a --resume with another --grow-from is refused."""
    from harness.checkpoints import load_checkpoint
    args = flags.parse_args([*QUICK, "--layers", "2", "--grow-from", source, "--out", str(tmp_path / "two")])
    from tunnels import tasks
    cfg = flags.model_config(args, tasks.sizes("hops", args.settings), "transformer")
    params = train.grown(args, cfg)
    p1, cfg1, _, _ = load_checkpoint(source)
    tok = np.random.default_rng(1).integers(0, cfg.vocab_size, (4, cfg.max_len))
    np.testing.assert_array_equal(ba.forward(params, tok, cfg)[0], ba.forward(p1, tok, cfg1)[0])
    train.main([*QUICK, "--layers", "2", "--grow-from", source, "--stop-after", "1", "--out", str(tmp_path / "two")])
    assert load_checkpoint(str(tmp_path / "two" / "checkpoint.npz"))[2]["grow_from"] == source
    capsys.readouterr()
    with pytest.raises(SystemExit):
        train.main([*QUICK, "--layers", "2", "--resume", "--out", str(tmp_path / "two")])   # without it: another run
    assert f"has grow_from={source!r} but this run asks for None" in capsys.readouterr().err


@pytest.mark.parametrize("extra, expected", [
    (["--layers", "1"], "a model grows by layers only: 1 layers of width 32 cannot become 1 layers"),
    (["--layers", "3", "--width", "64"], "cannot become 3 layers of width 64"),
    (["--layers", "2", "--model", "lstm"], "a 'transformer' trained on 'hops', not the lstm on hops asked for"),
    (["--layers", "2", "--max-hops", "2"], "trained on other hops settings"),
])
def test_what_cannot_grow_is_refused_before_anything_is_written(source, tmp_path, capsys, extra, expected):
    args = [a for a in QUICK]
    if "--model" in extra:                                   # the LSTM has no --layers of the transformer's kind
        extra = ["--model", "lstm"]
    with pytest.raises(SystemExit) as stop:
        train.main([*args, *extra, "--grow-from", source, "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "r").exists()
