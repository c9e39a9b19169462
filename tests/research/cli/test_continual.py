"""`python -m research continual` on a tiny backbone: its records, resuming, and a changed setting refused."""

from __future__ import annotations

import json
from pathlib import Path

from research.cli import main


def test_continual_cli_writes_records_and_resumes(
    tmp_path: Path, causal_dir: Path, capsys, toy_dataset
) -> None:
    data = toy_dataset.two_stages(tmp_path / "data")
    out = tmp_path / "out"
    args = [
        "continual", "--data", str(data), "--stages", "toy,qs", "--methods", "l2p", "--seeds", "1",
        "--out", str(out), "--backbone", str(causal_dir), "--labels", toy_dataset.stage_labels,
        "--test-size", "4", "--template", "{text} It was {mask}", "--steps", "2", "--eval-every", "2",
        "--train-batch-size", "4", "--max-length", "48",
    ]  # fmt: skip
    assert main(args) == 0
    records = json.loads((out / "continual.json").read_text())
    assert len(records) == 1
    assert set(records[0]) == {
        "method", "seed", "stages", "test_size", "accuracy", "average_accuracy", "forgetting", "params",
        "seconds",
    }  # fmt: skip
    table = (out / "continual.md").read_text()
    assert "| l2p |" in table and "final qs" in table
    written = (out / "continual.json").read_text()
    assert main(args) == 0  # resumed: nothing left to run
    assert (out / "continual.json").read_text() == written
    capsys.readouterr()
    args[args.index("--test-size") + 1] = "3"
    assert main(args) == 2
    assert "other stages or test sizes" in capsys.readouterr().err
    args[args.index("--test-size") + 1] = "4"

    # The kNN scoring is recorded: a directory made before it was (plain cosine then) is refused.
    settings = json.loads((out / "settings.json").read_text())
    assert settings["knn"]["similarity"] == "centred"
    del settings["knn"]
    (out / "settings.json").write_text(json.dumps(settings))
    assert main(args) == 2
    assert "knn" in capsys.readouterr().err and (out / "continual.json").read_text() == written
