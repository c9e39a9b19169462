"""`openbook classify`: explained predictions from a prompt and an examples file, and its user errors."""

import json

from services.cli import main


def _classify_args(causal_dir, examples, *texts):
    return [
        "classify", "--template", "{text} It was {mask}", "--labels", "0=bad,1=good",
        "--backbone", str(causal_dir), "--examples", str(examples), "--k", "2", *texts,
    ]  # fmt: skip


def test_classify_prints_explained_predictions(tmp_path, causal_dir, capsys):
    examples = tmp_path / "examples.tsv"
    examples.write_text("sentence\tlabel\na good film\t1\na bad film\t0\ngreat fun\t1\n")
    assert main(_classify_args(causal_dir, examples, "a good film", "boring")) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["text"] for line in lines] == ["a good film", "boring"]
    first = lines[0]
    assert first["label"] in {"0", "1"} and len(first["neighbours"]) == 2
    assert first["neighbours"][0]["id"] == 0 and first["neighbours"][0]["label"] == "1"
    assert abs(sum(first["probabilities"].values()) - 1) < 1e-5


def test_classify_with_a_reader_finds_each_text_its_own_example_first(
    tmp_path, causal_dir, reader_mpnet_dir, capsys
):
    examples = tmp_path / "examples.tsv"
    examples.write_text("sentence\tlabel\na good film\t1\na bad film\t0\ngreat fun\t1\n")
    args = _classify_args(causal_dir, examples, "great fun", "a bad film")
    assert main([*args, "--reader", str(reader_mpnet_dir), "--lam", "0.5"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["neighbours"][0]["id"] for line in lines] == [2, 1]  # in the reader's space, itself
    assert all(abs(line["neighbours"][0]["similarity"] - 1) < 1e-4 for line in lines)
    assert main([*args, "--reader", "mpnet", "--checkpoint", str(tmp_path)]) == 2
    assert "drop --reader" in capsys.readouterr().err


def test_classify_with_an_unknown_example_label_is_a_clear_error(tmp_path, causal_dir, capsys):
    examples = tmp_path / "examples.tsv"
    examples.write_text("sentence\tlabel\na good film\t1\na bad film\tmeh\n")
    assert main(_classify_args(causal_dir, examples, "a good film")) == 2
    error = capsys.readouterr().err
    assert "examples.tsv:3" in error and "unknown label 'meh'" in error


def test_missing_prompt_is_a_clear_error(causal_dir, capsys):
    assert main(["classify", "--backbone", str(causal_dir), "some text"]) == 2
    assert "--task" in capsys.readouterr().err


def test_untrained_classify_serves_as_an_untrained_service_task(tmp_path, causal_dir, capsys):
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.selection import lambda_on_store

    from services.engine.task_spec import Task, task_classifier

    rows = [("a good film", "1"), ("a bad film", "0"), ("great fun", "1"), ("boring and bad", "0")] * 3
    examples = tmp_path / "examples.tsv"
    examples.write_text("sentence\tlabel\n" + "".join(f"{text}\t{label}\n" for text, label in rows))
    queries = ["a good film with a great cast", "it was terrible and boring"]
    arguments = ["classify", "--template", "{text} It was {mask}", "--labels", "0=bad,1=good"]
    assert main([*arguments, "--backbone", str(causal_dir), "--examples", str(examples), *queries]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    # the service's untrained task on the same examples: its defaults, lambda chosen leave-one-out
    task = Task(name="t", template="{text} It was {mask}", labels={"0": "bad", "1": "good"}, backbone="b")
    service = task_classifier(task, load_backbone(BackboneConfig(name=str(causal_dir), max_length=128)))
    embedded = service.embed([text for text, _ in rows])
    ids = service.add_embeddings(embedded, [label for _, label in rows], texts=[text for text, _ in rows])
    service.knn = lambda_on_store(service, ids, embedded.lm_log_probs)
    for line, prediction in zip(printed, service.predict(queries), strict=True):
        assert len(line["neighbours"]) == len(rows)  # k 16 covers all 12 (the old default, 8, did not)
        assert line["probabilities"] == prediction.probabilities
        assert [n["id"] for n in line["neighbours"]] == [n.id for n in prediction.neighbours]
