"""README.md's library example runs as written: it trains, prints, saves and loads, and a fresh process that
loads its checkpoint predicts what it printed.

Only the backbone and the reader differ, through the variables a user sets to change them
(`$OPENBOOK_DEFAULT_BACKBONE`, `$OPENBOOK_DEFAULT_READER`): the tiny random causal model and sentence
encoder, so that the test takes seconds and needs no packaged weights. Each process
runs in a temporary directory, where the example's relative `ckpt/sentiment` lands.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
INTRODUCTION = "The library, with no service"


def library_example() -> str:
    """The first ```python block after the sentence that introduces it."""
    text = README.read_text()
    start = text.index(INTRODUCTION)
    match = re.search(r"```python\n(.*?)```", text[start:], re.DOTALL)
    assert match is not None, f"no python block after {INTRODUCTION!r} in README.md"
    return match.group(1)


def run_python(code: str, cwd: Path, backbone: Path, reader: Path) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "OPENBOOK_DEFAULT_BACKBONE": str(backbone),
        "OPENBOOK_DEFAULT_READER": str(reader),
        "OPENBOOK_DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
    }
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True)
    assert out.returncode == 0, f"exit status {out.returncode}:\n{out.stderr[-3000:]}"
    return out.stdout


def test_the_readme_library_example_runs_and_its_checkpoint_predicts_the_same_in_a_fresh_process(
    causal_dir: Path, reader_mpnet_dir: Path, tmp_path: Path
) -> None:
    example = library_example()
    saved = re.search(r'clf\.save\("([^"]+)"\)', example)
    query = re.search(r"clf\.predict\((\[.*?\])\)", example)
    assert saved is not None and query is not None, "the example no longer saves and predicts"

    printed = run_python(example, tmp_path, causal_dir, reader_mpnet_dir).splitlines()
    assert len(printed) == 2, printed  # dev accuracy, then the prediction
    assert 0.0 <= float(printed[0]) <= 1.0
    checkpoint = tmp_path / saved.group(1)
    assert (checkpoint / "manifest.json").is_file()
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert manifest["reader"]["config"]["encoder"] == str(reader_mpnet_dir)  # the default, tuned and saved

    reload = (
        "import openbook\n"
        f"p = openbook.load({str(checkpoint)!r}).predict({query.group(1)})[0]\n"
        "print(p.label, p.probabilities)\n"
    )
    fresh = run_python(reload, tmp_path, causal_dir, reader_mpnet_dir).strip()
    first = re.match(r"(\S+) (\{.*?\})", printed[1])
    assert first is not None, printed[1]  # the example prints the label, then its probabilities
    label, probabilities = fresh.split(" ", 1)
    assert label == first.group(1) and label in {"0", "1"}
    # The same probabilities too, to float32 rounding: the checkpoint holds all the first process used.
    before, after = ast.literal_eval(first.group(2)), ast.literal_eval(probabilities)
    assert before.keys() == after.keys() == {"0", "1"}
    assert all(abs(before[k] - after[k]) < 1e-4 for k in before), (before, after)
