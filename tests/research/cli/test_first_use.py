"""`python -m research first-use` on a tiny backbone: train and dev only, every count, calibration and λ
rule."""

import json

from openbook.data import read_split

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


def test_the_check_with_a_reader_reads_the_book_in_its_space(
    tmp_path, causal_dir, reader_mpnet_dir, capsys, toy_dataset, monkeypatch
):
    from openbook.sentence_reader import SentenceReader

    embedded: list[str] = []  # every text the reader embeds
    embed = SentenceReader.embed
    monkeypatch.setattr(
        SentenceReader, "embed", lambda self, texts: embedded.extend(texts) or embed(self, texts)
    )
    data = toy_dataset(tmp_path / "data")
    out = tmp_path / "out"
    args = [
        "first-use", "--data", str(data), "--task", "toy", "--seeds", "1", "--per-class", "2",
        "--template", "{text} It was {mask}", "--labels", "0=bad,1=good", "--backbone", str(causal_dir),
        "--reader", str(reader_mpnet_dir), "--out", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    with_reader = json.loads((out / "results.json").read_text())
    assert f"reader {reader_mpnet_dir}" in (out / "results.md").read_text()
    args[args.index("--reader") : args.index("--reader") + 2] = []
    args[-1] = str(tmp_path / "without")
    assert main(args) == 0
    without = json.loads((tmp_path / "without" / "results.json").read_text())
    assert [r["p_lm"] for r in with_reader] == [r["p_lm"] for r in without]  # one prompt
    # the reader embedded the dev texts (the queries) and the drawn examples (the book), once each
    train, dev = (read_split(data / "toy" / "16-1" / f"{part}.csv") for part in ("train", "dev"))
    assert {e.text for e in dev} <= set(embedded) and len(set(embedded) & {e.text for e in train}) >= 2


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
