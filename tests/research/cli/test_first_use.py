"""`python -m research first-use` on a tiny backbone: train and dev only, every count, calibration and λ
rule."""

import json

from research.cli import main


def test_the_check_reads_no_test_file_and_scores_every_setting(tmp_path, causal_dir, capsys, toy_dataset):
    data = toy_dataset(tmp_path / "data")
    (data / "toy" / "test.csv").unlink()  # it must not be needed
    out = tmp_path / "out"
    args = [
        "first-use", "--data", str(data), "--task", "toy", "--seeds", "1,2", "--per-class", "1,2",
        "--template", "{text} It was {mask}", "--labels", "0=bad,1=good", "--backbone", str(causal_dir),
        "--out", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    records = json.loads((out / "results.json").read_text())
    settings = {(r["seed"], r["per_class"], r["calibration"], r["lam_rule"]) for r in records}
    assert len(records) == len(settings) == 2 * 2 * 2 * 2
    assert all(0.0 <= r[key] <= 1.0 for r in records for key in ("served", "p_lm", "p_knn"))
    assert {r["lam"] for r in records if r["lam_rule"] == "default"} == {0.5}
    # One example per class: each one's only neighbour, left out of its own, has the other label, so
    # P_kNN is always wrong on the store's examples and the rule gives it no weight.
    assert {r["lam"] for r in records if r["lam_rule"] == "leave-one-out" and r["per_class"] == 1} == {0.0}
    table = (out / "results.md").read_text()
    assert "| 2 | domain | LOO, mean" in table and "Command: `python -m research first-use" in table
    assert table in capsys.readouterr().out


def test_counts_below_one_are_refused(tmp_path, capsys, toy_dataset):
    data = toy_dataset(tmp_path / "data")
    out = tmp_path / "o"
    args = ["first-use", "--data", str(data), "--task", "toy", "--per-class", "0,2", "--out", str(out)]
    assert main(args) == 2
    assert "--per-class" in capsys.readouterr().err and not out.exists()


def test_probes_write_a_fresh_tasks_answers_per_backbone(tmp_path, causal_dir, capsys):
    out = tmp_path / "out"
    args = ["first-use", "--probes", "--backbone", str(causal_dir), "--out", str(out)]
    assert main(args) == 0
    assert main(args) == 0  # run again: the backbone's record is replaced, not added
    (record,) = json.loads((out / "probes.json").read_text())
    assert record["backbone"] == str(causal_dir) and record["command"].startswith(
        "python -m research first-use --probes"
    )
    assert len(record["paraphrases"]) == 8 and len(record["probes"]) == 6
    assert record["probes_right"] == sum(p["predicted"] == p["label"] for p in record["probes"])
    assert 0 <= record["paraphrases_known"] <= 8 and 0.0 <= record["lam"] <= 1.0
    assert f"{record['probes_right']} of 6 plain probes right" in capsys.readouterr().out
