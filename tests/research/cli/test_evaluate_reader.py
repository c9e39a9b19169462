"""`python -m research eval --reader` on the tiny causal LM and the tiny MPNet: a trained run tunes the
reader and reads its training both ways (the reader's book and the slot store) and with probe 2's head;
the untrained methods read the untuned reader's book, each with the slot store beside it."""

import json

import numpy as np
import pytest

from research.cli import main
from research.experiments.distributions import read_distributions


def test_eval_with_a_reader_tunes_it_and_reads_the_book_in_its_space(
    tmp_path, causal_dir, reader_mpnet_dir, capsys, training_flags, toy_dataset
):
    data = toy_dataset(tmp_path / "data")
    out = tmp_path / "out"
    args = [
        "eval", "--data", str(data), "--task", "toy", "--seeds", "1", "--out", str(out),
        "--template", "{text} It was {mask}", "--labels", "0=bad,1=good", "--backbone", str(causal_dir),
        "--methods", "retroprompt", "--reader", str(reader_mpnet_dir), "--keep-distributions",
        *training_flags,
    ]  # fmt: skip
    assert main(args) == 0
    (record,) = json.loads((out / "results.json").read_text())
    assert record["params"]["reader_seconds"] > 0
    readings, slots = record["params"]["readings"], record["params"]["slot_readings"]
    assert set(slots) == {"zero-shot", "knn", "knn-interp"}
    assert set(readings) == set(slots) | {"head", "head-mix"}  # probe 2's head on the tuned reader
    assert all(
        0 <= readings[name][key] <= 1 for name in ("head", "head-mix") for key in ("accuracy", "dev_accuracy")
    )
    assert readings["zero-shot"] == slots["zero-shot"]  # one prompt, its book read two ways
    assert record["accuracy"] == readings["knn-interp"]["accuracy"]
    assert json.loads((out / "settings.json").read_text())["reader"] == str(reader_mpnet_dir)
    # each reading's distributions kept for rules read later (asked for: large at many labels), what the
    # record scored, row by row
    plain = [a for a in args if a != "--keep-distributions"]
    plain[plain.index("--out") + 1] = str(tmp_path / "plain")
    assert main(plain) == 0
    assert (tmp_path / "plain" / "results.json").exists() and not (
        tmp_path / "plain" / "distributions"
    ).exists()
    (kept,) = read_distributions(out)
    assert (kept["task"], kept["seed"], kept["labels"]) == ("toy", 1, ["0", "1"])
    assert set(kept["readings"]) == {"zero-shot", "knn", "knn-interp", "book", "slot:knn", "slot:knn-interp"}
    both, gold = kept["readings"]["knn-interp"], kept["gold"]["test"]
    assert both["params"]["lam"] == record["params"]["lam"]
    lam, prompt, book = both["params"]["lam"], kept["readings"]["zero-shot"], kept["readings"]["book"]
    assert np.allclose(both["test"], lam * book["test"] + (1 - lam) * prompt["test"], atol=1e-3)
    assert both["test"].shape == (len(gold), 2) and np.allclose(both["test"].sum(axis=1), 1, atol=1e-3)
    assert abs((both["test"].argmax(axis=1) == gold).mean() - record["accuracy"]) <= 1 / len(gold)
    # the untrained methods read the untuned reader's neighbours; a peer reads no book of ours
    frozen = [*args, "--methods", "zero-shot,knn,knn-interp"]
    frozen[frozen.index("--out") + 1] = str(tmp_path / "frozen")
    assert main(frozen) == 0
    records = {r["method"]: r for r in json.loads((tmp_path / "frozen" / "results.json").read_text())}
    assert set(records) == {"zero-shot", "knn", "knn-interp"}
    # each read with the slot vectors' store too: the prompt alone is one reading either way
    assert records["zero-shot"]["params"]["slot"]["accuracy"] == records["zero-shot"]["accuracy"]
    assert 0 <= records["knn"]["params"]["slot"]["accuracy"] <= 1
    refused = [*args, "--methods", "setfit"]
    refused[refused.index("--out") + 1] = str(tmp_path / "refused")
    assert main(refused) == 2
    assert "--reader keys our book, not a peer's" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()


def test_a_trained_run_with_a_reader_reads_each_refusal_score_on_out_of_scope_queries(
    tmp_path, causal_dir, reader_mpnet_dir, training_flags, toy_dataset
):
    data = toy_dataset(tmp_path / "data")
    toy_dataset.write_csv(
        data / "toy" / "oos_test.csv", [("-1", "who wrote the book"), ("-1", "where is it")]
    )
    out = tmp_path / "out"
    args = [
        "eval", "--data", str(data), "--task", "toy", "--seeds", "1", "--out", str(out),
        "--template", "{text} It was {mask}", "--labels", "0=bad,1=good", "--backbone", str(causal_dir),
        "--methods", "retroprompt", "--reader", str(reader_mpnet_dir), *training_flags,
    ]  # fmt: skip
    assert main(args) == 0
    (record,) = json.loads((out / "results.json").read_text())
    refusals = record["params"]["refusals"]
    assert set(refusals) == {"confidence", "nearest", "neighbours"}
    assert refusals["confidence"] == record["params"]["out_of_scope"]  # today's refusal, read the same way
    for name in ("nearest", "neighbours"):
        read = refusals[name]
        assert -1.0 - 1e-6 <= read["threshold"] <= 1.0 + 1e-6  # a cosine similarity, not a probability
        assert read["recall"] in (0.0, 0.5, 1.0) and read["max_cost"] == 0.03
        assert read["in_scope_accuracy_answering_all"] == record["accuracy"]
        assert read["in_scope_accuracy"] <= record["accuracy"]


def test_reader_tuning_names_the_readers_config_and_a_bad_one_writes_nothing(
    tmp_path, causal_dir, reader_mpnet_dir, capsys, monkeypatch, training_flags, toy_dataset
):
    from openbook.sentence_reader import SentenceReader

    tuned = []
    tune = SentenceReader.tune

    def recording(self, texts, labels, config, on_step=None):
        tuned.append(config)
        return tune(self, texts, labels, config, on_step)

    monkeypatch.setattr(SentenceReader, "tune", recording)
    data = toy_dataset(tmp_path / "data")
    args = [
        "eval", "--data", str(data), "--task", "toy", "--seeds", "1", "--template", "{text} It was {mask}",
        "--labels", "0=bad,1=good", "--backbone", str(causal_dir), "--methods", "retroprompt",
        "--reader", str(reader_mpnet_dir), *training_flags,
    ]  # fmt: skip
    tuning = "top_layers=5,adapters=4,adapters_from=svd,lr=2e-5,few_examples=0"  # 0: as named, however few
    assert main([*args, "--out", str(tmp_path / "s5"), "--reader-tuning", tuning]) == 0
    # tuned on the training part, then on every example, both times at the named settings
    assert tuned and {(c.top_layers, c.adapters, c.adapters_from, c.lr) for c in tuned} == {
        (5, 4, "svd", 2e-5)
    }
    settings = json.loads((tmp_path / "s5" / "settings.json").read_text())
    assert settings["reader_tuning"] == {
        "top_layers": 5, "adapters": 4, "adapters_from": "svd", "lr": 2e-5, "few_examples": 0
    }  # fmt: skip
    out = tmp_path / "bad"
    assert (
        main([*args, "--out", str(out), "--reader-tuning", "adapters_from=pca"]) == 2
    )  # the config's own check
    assert "adapters_from must be one of" in capsys.readouterr().err and not out.exists()
    for bad, says in [("layers=5", "expected name=value"), ("lr=fast", "could not convert")]:
        with pytest.raises(SystemExit) as parsed:  # argparse's usage error
            main([*args, "--out", str(out), "--reader-tuning", bad])
        assert parsed.value.code == 2 and says in capsys.readouterr().err and not out.exists()
