"""`openbook eval`: one classifier scored on a user's labelled data, a file or a k-shot split's test set,
as it serves them; and its user errors."""

import json

import pytest
from openbook.data import read_split

from services.cli import main

PROMPT = ["--template", "{text} It was {mask}", "--labels", "0=bad,1=good"]
STORE = [("a good film", "1"), ("a bad film", "0"), ("great fun", "1"), ("boring and bad", "0")]
SCORED = [
    ("a good film with a great cast", "1"),
    ("it was terrible and boring", "0"),
    ("fun", "1"),
    ("dull", "0"),
]


def _served_accuracy(capsys, argv: list[str], rows: list[tuple[str, str]]) -> float:
    """The share of `rows` that `openbook classify` (with `argv`) labels right."""
    assert main(["classify", *argv, *(text for text, _ in rows)]) == 0
    predicted = [json.loads(line)["label"] for line in capsys.readouterr().out.splitlines()]
    return sum(p == label for p, (_, label) in zip(predicted, rows, strict=True)) / len(rows)


def test_eval_scores_the_untrained_task_that_classify_serves(tmp_path, causal_dir, capsys):
    examples, data = tmp_path / "examples.tsv", tmp_path / "data.csv"
    examples.write_text("sentence\tlabel\n" + "".join(f"{text}\t{label}\n" for text, label in STORE))
    data.write_text("".join(f'{label},"{text}"\n' for text, label in SCORED))
    untrained = [*PROMPT, "--backbone", str(causal_dir), "--examples", str(examples), "--k", "2"]
    assert main(["eval", *untrained, "--data", str(data), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["examples"], report["scored_by"], report["model_version"]) == (4, str(data), "base")
    assert report["accuracy"] == pytest.approx(_served_accuracy(capsys, untrained, SCORED))
    assert sum(scores["support"] for scores in report["per_label"].values()) == 4
    assert all(
        s["text"] in dict(SCORED) and s["source"].startswith(f"{data}:") for s in report["suspect_examples"]
    )

    assert main(["eval", *untrained, "--data", str(data)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("the untrained task: version base, 4 examples scored by ")
    assert f"accuracy {report['accuracy']:.3f}   macro-F1 {report['macro_f1']:.3f}" in printed
    assert "confusion (rows: gold, columns: predicted)" in printed  # the report `openbook report` prints


def test_eval_scores_a_checkpoint_on_a_kshot_splits_test_set(
    tmp_path, causal_dir, capsys, training_flags, toy_dataset
):
    data = toy_dataset(tmp_path / "data")
    out = tmp_path / "ckpt"
    train = ["train", "--data", str(data), "--task", "toy", "--seed", "1", "--out", str(out)]
    assert (
        main([*train, "--method", "prompt-ft", *PROMPT, "--backbone", str(causal_dir), *training_flags]) == 0
    )
    capsys.readouterr()
    split = ["--data", str(data), "--task", "toy", "--seed", "1"]
    assert main(["eval", "--checkpoint", str(out), *split, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert report["checkpoint"] == str(out) and report["model_version"] == manifest.get("version", "ckpt")
    assert report["examples"] == 10 and report["scored_by"] == f"{data / 'toy'} test (split 16-1)"
    test = [(example.text, example.label) for example in read_split(data / "toy" / "test.csv")]
    assert report["accuracy"] == pytest.approx(_served_accuracy(capsys, ["--checkpoint", str(out)], test))
    # the checkpoint's own temperature reads the scores, as the service's report reads them
    assert report["calibration"]["temperature"] == pytest.approx(manifest["confidence_temperature"])


def test_eval_reads_jsonl_and_its_errors_are_one_line(tmp_path, causal_dir, capsys, toy_dataset):
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(
            json.dumps({"id": i, "text": text, "label": int(label)}) + "\n"
            for i, (text, label) in enumerate(SCORED)
        )
    )
    untrained = [*PROMPT, "--backbone", str(causal_dir)]
    assert main(["eval", *untrained, "--data", str(data), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["examples"] == 4  # the prompt alone: an empty store

    data.write_text(data.read_text() + json.dumps({"text": "meh", "label": "2"}) + "\n")
    assert main(["eval", *untrained, "--data", str(data)]) == 2
    said = capsys.readouterr().err.splitlines()[-1]  # after the model's loading bar: one line
    assert said.startswith("openbook eval: error: ") and f"{data}:5: unknown label '2'" in said

    kshot = toy_dataset(tmp_path / "kshot")
    assert main(["eval", *untrained, "--data", str(kshot), "--task", "toy"]) == 2
    assert "give --task and --seed" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(tmp_path), "--examples", str(data), "--data", str(data)]) == 2
    assert "a checkpoint brings its own" in capsys.readouterr().err
