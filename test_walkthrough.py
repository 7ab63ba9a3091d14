"""WALKTHROUGH.md's commands, run in order as a student would (each takes under a minute), so the
document cannot drift from the code. They run in a temporary folder with the repository on the path."""

import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def blocks():
    """The ```bash blocks of WALKTHROUGH.md, in order."""
    text = open(os.path.join(HERE, "WALKTHROUGH.md")).read()
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def test_the_walkthrough_has_commands_for_every_section():
    assert len(blocks()) >= 10


def test_every_walkthrough_command_runs(tmp_path):
    env = {**os.environ, "PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for block in blocks():
        # the repository's scripts and tests by their full path; everything else as written
        script = re.sub(r"\bpython (\w+\.py)", lambda m: f"{sys.executable} {os.path.join(HERE, m.group(1))}", block)
        script = re.sub(r"-m pytest -q (test_\w+\.py)", lambda m: f"-m pytest -q {os.path.join(HERE, m.group(1))}",
                        script)
        script = re.sub(r"^python ", sys.executable + " ", script, flags=re.M)
        proc = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f"{block}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        if "value_update = lambda" in block:                  # exercise 1 must flag the broken M-step's tensor
            assert "blocks.1.attn.wv" in proc.stdout and "blocks.1.attn.wq" not in proc.stdout, proc.stdout
        if "row sums of ds" in block:
            sums = [float(x) for x in re.findall(r"[-+]?\d+\.\d+(?:e[-+]?\d+)?", proc.stdout)]
            assert sums and max(abs(x) for x in sums) < 1e-12, proc.stdout
