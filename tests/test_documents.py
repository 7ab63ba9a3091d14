"""Every command the README and docs/USAGE.md give is run, in a scratch checkout of the repository, from its
folder, as a user types it: the documented line with short settings added where it trains (fewer steps, fewer
held-out sequences, the quick preset, a folder of its own), after the runs it needs. The walkthrough's commands
are tests/test_walkthrough.py's. A command a document adds without a short form here fails the first test, so
no documented command goes unrun; a short form no document gives any more fails it too."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository's folder
DOCUMENTS = ("README.md", os.path.join("docs", "USAGE.md"))
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+ )*python (?:-m \S+|\S+\.py)")   # env, python, a module or a script

# what is not run here, and why
NOT_RUN = {
    "python -m pytest -q": "the test suite itself (.ci/run runs it)",
    "BAYESATTN_CI_ONLY=1 python -m pytest -q -m ci_only": "the slower tests (.ci/run runs them)",
    "python -m wing.module": "the pattern of a wing's command, not a command",
}

T = "--steps 3 --eval-seqs 8 --quiet"                     # a training run of train.py, short
BIJ = "runs/made-first"                                    # made first: the run other commands read
DEPTH = "runs/depth-quick"
# documented command -> the shell lines that run it short (in order; later lines may read what earlier ones wrote)
SHORT = {
    # train.py, every form the documents give
    "python train.py --preset quick": f"python train.py --preset quick {T} --baseline-steps 3 --no-geometry",
    "python train.py": f"python train.py {T} --baseline-steps 3 --no-geometry",
    "python train.py --model mlp": f"python train.py --model mlp {T} --no-geometry",
    "python train.py --preset paper --no-baseline": f"python train.py --preset paper --no-baseline {T} --no-geometry",
    "python train.py --task sawtooth": f"python train.py --task sawtooth {T} --baseline-steps 3 --no-geometry",
    "python train.py --task sawtooth --preset first": f"python train.py --task sawtooth --preset first {T} "
                                                      "--baseline-steps 3",          # with its geometry probes
    "python train.py --task sawtooth --preset paper --no-baseline": f"python train.py --task sawtooth --preset paper "
                                                                    f"--no-baseline {T} --no-geometry",
    "python train.py --task hmm --soft": f"python train.py --task hmm --soft {T} --baseline-steps 3 --no-geometry",
    "python train.py --task hmm --preset paper --soft --no-baseline": f"python train.py --task hmm --preset paper "
                                                                      f"--soft --no-baseline {T} --no-geometry",
    "python train.py --task recall": f"python train.py --task recall {T} --baseline-steps 3 --no-geometry",
    "python train.py --task hops [--cot]": f"python train.py --task hops --preset quick {T} --no-baseline --no-geometry"
                                           f"\npython train.py --task hops --cot --preset quick {T} --no-baseline "
                                           "--no-geometry",
    "python train.py [--task T] [--model M] [--preset quick\\|first\\|default\\|paper]":
        f"python train.py --task recall --model lstm --preset quick {T} --no-baseline --no-geometry",
    "python train.py --resume --out runs/<name>": f"python train.py --preset quick {T} --no-baseline --no-geometry "
                                                  "--stop-after 1 --out runs/stopped\npython train.py --preset quick "
                                                  f"{T} --no-baseline --no-geometry --resume --out runs/stopped",
    "python train.py --eval-only runs/<name>/checkpoint.npz": f"python train.py --eval-only {BIJ}/checkpoint.npz "
                                                             "--eval-seqs 8",
    "python train.py --eval-only runs/<name>/checkpoint.npz [--figures DIR]":
        f"python train.py --eval-only {BIJ}/checkpoint.npz --eval-seqs 8 --figures figures",
    # geometry
    "python -m geometry.run": "python -m geometry.run --help",
    "python -m geometry.run --definitions": "python -m geometry.run --definitions",
    "python -m geometry.run runs/<name>/checkpoint.npz": f"python -m geometry.run {BIJ}/checkpoint.npz --n-seqs 20",
    # Paper II
    "python -m dynamics.run": "python -m dynamics.run --steps 3",
    "python -m dynamics.run [--steps N]": "python -m dynamics.run --steps 3 --out runs/one-head-3",
    "python -m dynamics.run --compare-em": "python -m dynamics.run --compare-em --preset quick --stop-after 1",
    "python -m dynamics.run --compare-em --chain authors": "python -m dynamics.run --compare-em --chain authors "
                                                           "--preset quick --stop-after 1",
    "python -m dynamics.run --compare-em [--chain authors]": "python -m dynamics.run --compare-em --preset quick "
                                                             "--stop-after 1 --out runs/em-again",
    "python -m dynamics.run --deep [--chain authors]": "python -m dynamics.run --deep --chain authors --steps 2 "
                                                       "--stop-after 1",
    # compare
    "python -m harness.compare calibration RUN... --out FILE.png":
        f"python -m harness.compare calibration {BIJ} runs/stopped --out figures/compared.png",
    "python -m harness.compare variants RUN... --out FILE.png":
        f"python train.py --task hmm --preset quick {T} --no-baseline --no-geometry --out runs/hmm-a\n"
        f"python train.py --task hmm --preset quick {T} --no-baseline --no-geometry --seed 1 --out runs/hmm-b\n"
        "python -m harness.compare variants runs/hmm-a runs/hmm-b --out figures/variants.png",
    # the drivers of many runs (the quick presets: every family on every task, the depth cells)
    # (--confirm: three seeds of every cell and 4x runs, end to end on stand-in cells in tests/test_matrix.py)
    "python -m primitives.matrix [--preset quick]": "python -m primitives.matrix --preset quick",
    "python -m primitives.matrix [--preset quick] [--seeds 0 1] [--jobs 2] [--confirm]":
        "python -m primitives.matrix --preset quick",
    "python -m primitives.matrix --confirm": "python -m primitives.matrix --preset quick",
    "python -m primitives.depth": f"python -m primitives.depth --preset quick --confirm --out {DEPTH}",
    "python -m primitives.depth --confirm": f"python -m primitives.depth --preset quick --confirm --out {DEPTH}",
    "python -m primitives.depth [--preset quick]": f"python -m primitives.depth --preset quick --confirm --out {DEPTH}",
    "python -m primitives.depth [--preset quick] [--seeds 0 1] [--jobs 2] [--max-hops 4] [--confirm]":
        f"python -m primitives.depth --preset quick --confirm --out {DEPTH}",
    "python -m primitives.chainsteps": f"python -m primitives.chainsteps --runs {DEPTH} --layers 2 --seeds 0 --seqs 100",
    "python -m primitives.chainsteps [--runs runs/depth] [--layers 4] [--seeds 0 1] [--seqs 500]":
        f"python -m primitives.chainsteps --runs {DEPTH} --layers 2 --seeds 0 --seqs 100",
    "python -m primitives.matrix --sweep capacity": None,      # see SWEEP below
    # the benches
    "python -m bench.transformer": "python -m bench.transformer --quick",
    "python -m bench.transformer --sgemm": "python -m bench.transformer --sgemm",
    "python -m bench.recurrent": "python -m bench.recurrent --quick",
    "python -m bench.scaling": "python -m bench.scaling --quick",
}
SWEEP = ("the recall sweeps train 25 cells of 4,000 steps or more each at the default sizes and take no shorter "
         "settings; their machinery is tests/test_matrix.py's")
FIRST = f"python train.py --preset quick {T} --baseline-steps 3 --no-geometry --out {BIJ}"   # what others read


def documented():
    """The commands the documents give: code spans and lines of ```bash blocks that start with python (after
    any environment settings), without a quoted error message's text."""
    found = set()
    for doc in DOCUMENTS:
        text = open(os.path.join(ROOT, doc)).read()
        spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
        lines = [line.strip() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)
                 for line in block.splitlines()]
        for cmd in spans + [re.sub(r"\s+#.*", "", line) for line in lines]:
            cmd = " ".join(cmd.split())
            if COMMAND.match(cmd) and ": error:" not in cmd:
                found.add(cmd)
    return found


def test_every_documented_command_has_its_short_form_here():
    docs = documented()
    missing = sorted(docs - set(SHORT) - set(NOT_RUN))
    assert not missing, f"a documented command without a short form in SHORT (or a reason in NOT_RUN): {missing}"
    stale = sorted(set(SHORT) - docs)
    assert not stale, f"SHORT holds commands no document gives any more: {stale}"
    # the check can fail: a document's command that is not in the table is found
    assert COMMAND.match("python -m primitives.matrix --preset quick") and COMMAND.match("NUMBA_NUM_THREADS=1 python x.py")
    assert not COMMAND.match("pip install -r requirements.txt")


def short_forms():
    """The distinct short forms, in the table's order (several documented lines share one)."""
    seen = []
    for line in SHORT.values():
        if line is not None and line not in seen:
            seen.append(line)
    return seen


@pytest.mark.ci_only
def test_every_documented_command_runs(checkout):
    """Each short form in the scratch checkout, from its folder: exit code 0 (a --help exits 0 too)."""
    for script in [FIRST, *short_forms()]:
        for line in script.splitlines():
            proc = subprocess.run([sys.executable, *line.split()[1:]], cwd=checkout, capture_output=True, text=True,
                                  timeout=900)
            assert proc.returncode == 0, f"{line}\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}"


def readme_test_count(text):
    """The README's sentence on its test command -> (tests run, skipped), or None where it has none."""
    m = re.search(r"it ran ([\d,]+) tests \((\d+) skipped\)", text)
    return None if m is None else (int(m.group(1).replace(",", "")), int(m.group(2)))


def test_the_readmes_test_count_is_what_its_command_collects(request, readme_command):
    """Under the README's own command (python -m pytest -q, which collects every test), the tests it says ran plus
    those it says were skipped are the tests collected: a test added or removed without the README's sentence
    moving fails here. Under another selection (-k, a file, -m) only the sentence's form is checked."""
    text = open(os.path.join(ROOT, "README.md")).read()
    ran = readme_test_count(text)
    assert ran is not None, "the README no longer says how many tests its command runs ('it ran N tests (S skipped)')"
    assert readme_test_count("it ran 1,002 tests (12 skipped)") == (1002, 12)        # the form can be read
    if not readme_command:                             # conftest.full_run
        pytest.skip("a selection of the tests (arguments, -k, -m, PYTEST_ADDOPTS, another folder): not the README's "
                    "command, so not every test")
    assert sum(ran) == len(request.session.items), (
        f"the README says {ran[0]} tests ran and {ran[1]} were skipped ({sum(ran)}); the command collects "
        f"{len(request.session.items)}: update its sentence from a run of python -m pytest -q")
