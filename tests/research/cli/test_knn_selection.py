"""`python -m research knn-selection` on a tiny backbone: train and dev only, cached embeddings, frozen
and trained."""

import json

import numpy as np

from research.cli import main
from research.experiments.knn_selection import RULES


def _args(data, out, causal_dir, *extra):
    return [
        "knn-selection", "--data", str(data), "--task", "toy", "--seeds", "1,2", "--splits", "2",
        "--template", "{text} It was {mask}", "--labels", "0=bad,1=good", "--backbone", str(causal_dir),
        "--out", str(out), *extra,
    ]  # fmt: skip


def test_the_check_reads_no_test_file_and_embeds_each_seed_once(tmp_path, causal_dir, capsys, toy_dataset):
    data = toy_dataset(tmp_path / "data")
    (data / "toy" / "test.csv").unlink()  # it must not be needed
    out = tmp_path / "out"
    assert main(_args(data, out, causal_dir)) == 0
    records = json.loads((out / "results.json").read_text())
    assert {(r["seed"], r["rule"]) for r in records} == {(s, rule.name) for s in (1, 2) for rule in RULES}
    assert all(0.0 <= r["held_out_accuracy"] <= 1.0 and len(r["chosen"]) == 4 for r in records)
    table = (out / "results.md").read_text()
    assert (
        "| λ, train LOO + dev, accuracy |" in table and "Command: `python -m research knn-selection" in table
    )
    assert "frozen prompt" in capsys.readouterr().out
    cached = {path.name: path.stat().st_mtime_ns for path in (out / "embeddings").iterdir()}
    assert set(cached) == {"toy-1.npz", "toy-2.npz"}

    assert main(_args(data, out, causal_dir)) == 0  # again: the cache answers
    assert {path.name: path.stat().st_mtime_ns for path in (out / "embeddings").iterdir()} == cached
    assert json.loads((out / "results.json").read_text()) == records

    assert main(_args(data, out, causal_dir, "--layer", "1")) == 2  # other embeddings: another --out
    assert "other settings (layer" in capsys.readouterr().err


def test_the_check_of_a_trained_method(tmp_path, causal_dir, capsys, training_flags, toy_dataset):
    data = toy_dataset(tmp_path / "data")
    out = tmp_path / "out"
    args = _args(data, out, causal_dir, "--trained", "retroprompt", *training_flags)
    args[args.index("--seeds") + 1] = "1"
    assert main(args) == 0
    assert "trained: retroprompt" in (out / "results.md").read_text()
    assert json.loads((out / "settings.json").read_text())["trained"] == "retroprompt"
    frozen = tmp_path / "frozen"  # the same seed under the frozen prompt: other keys, other scores
    frozen_args = _args(data, frozen, causal_dir)
    frozen_args[frozen_args.index("--seeds") + 1] = "1"
    assert main(frozen_args) == 0
    trained_keys, frozen_keys = (
        np.load(d / "embeddings" / "toy-1.npz")["train_vectors"] for d in (out, frozen)
    )
    assert trained_keys.shape == frozen_keys.shape and np.abs(trained_keys - frozen_keys).max() > 1e-3
    other = tmp_path / "other"
    assert main(_args(data, other, causal_dir, "--trained", "no-such-method")) == 2
    assert "unknown method" in capsys.readouterr().err and not other.exists()
