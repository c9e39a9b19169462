"""`openbook train`, `openbook methods` and trainable methods in `openbook eval`, on tiny backbones."""

import json

from openbook.cli import main

from tests.cli.test_evaluate import make_toy_dataset

TRAINING = [
    "--steps",
    "4",
    "--eval-every",
    "2",
    "--train-batch-size",
    "4",
    "--lr",
    "1e-3",
    "--max-length",
    "48",
]


def _train_args(data, out, model_dir, *extra):
    return [
        "train", "--data", str(data), "--task", "toy", "--seed", "1", "--out", str(out),
        "--template", "{text} It was {mask}", "--labels", "0=bad,1=good", "--backbone", str(model_dir),
        *TRAINING, *extra,
    ]  # fmt: skip


def test_methods_lists_inference_and_trainable_methods(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in ("zero-shot", "knn-interp", "prompt-ft", "retroprompt"):
        assert name in out


def test_train_writes_a_checkpoint_that_classify_reads(tmp_path, causal_dir, capsys):
    data = make_toy_dataset(tmp_path / "data")
    out = tmp_path / "ckpt"
    assert main(_train_args(data, out, causal_dir, "--method", "retroprompt", "--no-knn-loss")) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["method"] == "retroprompt/no-knn-loss" and "accuracy_with_knn" in summary["dev"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["spec"] == "retroprompt/no-knn-loss" and manifest["labels"] == ["0", "1"]
    assert manifest["backbone"]["name"] == str(causal_dir) and len(manifest["training_data_sha256"]) == 64
    assert "weights.safetensors" in manifest["files"]
    assert main(["classify", "--checkpoint", str(out), "a good film"]) == 0
    prediction = json.loads(capsys.readouterr().out)
    assert prediction["label"] in {"0", "1"} and len(prediction["neighbours"]) == manifest["knn"]["k"]

    assert main(_train_args(data, out, causal_dir, "--method", "retroprompt")) == 2
    assert "exists" in capsys.readouterr().err


def test_train_bad_inputs_are_clear_errors_and_write_nothing(tmp_path, causal_dir, capsys):
    data = make_toy_dataset(tmp_path / "data")
    assert main(_train_args(data, tmp_path / "a", causal_dir, "--method", "prompt-ft", "--no-demos")) == 2
    assert "prompt-ft has no option 'no-demos'" in capsys.readouterr().err

    one_class = make_toy_dataset(tmp_path / "one")
    train_csv = one_class / "toy" / "16-1" / "train.csv"
    train_csv.write_text(
        "".join(line for line in train_csv.read_text().splitlines(True) if line.startswith("1"))
    )
    assert main(_train_args(one_class, tmp_path / "b", causal_dir, "--method", "prompt-ft")) == 2
    assert "fewer than 2 classes" in capsys.readouterr().err

    empty = make_toy_dataset(tmp_path / "empty")
    (empty / "toy" / "16-1" / "dev.csv").write_text("")
    assert main(_train_args(empty, tmp_path / "c", causal_dir, "--method", "prompt-ft")) == 2
    assert "dev.csv" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in "abc")


def test_checkpoint_problems_are_named(tmp_path, causal_dir, capsys):
    data = make_toy_dataset(tmp_path / "data")
    ckpt = tmp_path / "ckpt"
    assert main(_train_args(data, ckpt, causal_dir, "--method", "prompt-ft")) == 0
    capsys.readouterr()

    other = make_toy_dataset(tmp_path / "other")
    for split in ("train", "dev"):
        path = other / "toy" / "16-1" / f"{split}.csv"
        path.write_text(path.read_text().replace("0,", "2,"))
    args = _train_args(other, tmp_path / "next", causal_dir, "--method", "prompt-ft", "--init", str(ckpt))
    assert main(args) == 2
    assert "differ from the data's labels" in capsys.readouterr().err

    weights = ckpt / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    assert main(["classify", "--checkpoint", str(ckpt), "a good film"]) == 2
    assert "sha256 mismatch for weights.safetensors" in capsys.readouterr().err
    (ckpt / "store" / "ids.npy").unlink()
    assert main(["classify", "--checkpoint", str(ckpt), "a good film"]) == 2
    assert "missing" in capsys.readouterr().err and not (tmp_path / "next").exists()


def test_eval_trains_methods_and_resumes(tmp_path, causal_dir, capsys):
    data = make_toy_dataset(tmp_path / "data")
    out = tmp_path / "out"
    args = [
        "eval", "--data", str(data), "--task", "toy", "--seeds", "1,2", "--out", str(out),
        "--template", "{text} It was {mask}", "--labels", "0=bad,1=good", "--backbone", str(causal_dir),
        "--methods", "zero-shot,prompt-ft,retroprompt,retroprompt/no-knn-infer", *TRAINING,
    ]  # fmt: skip
    args[args.index("--seeds") + 1] = "1"
    assert main(args) == 0
    first = json.loads((out / "results.json").read_text())
    assert {r["method"] for r in first} == {
        "zero-shot",
        "prompt-ft",
        "retroprompt",
        "retroprompt/no-knn-infer",
    }
    shared = {r["method"]: r["params"] for r in first if r["method"].startswith("retroprompt")}
    assert shared["retroprompt"]["shared_training"] == ["retroprompt/no-knn-infer"]
    assert shared["retroprompt"]["inference"] == "knn-interp"
    assert shared["retroprompt/no-knn-infer"]["inference"] == "zero-shot"
    assert (out / "results.png").read_bytes()[:4] == b"\x89PNG"

    args[args.index("--seeds") + 1] = "1,2"  # resume: only seed 2 runs
    assert main(args) == 0
    second = json.loads((out / "results.json").read_text())
    assert second[: len(first)] == first
    assert sorted((r["method"], r["seed"]) for r in second[len(first) :]) == sorted(
        (r["method"], 2) for r in first
    )
    capsys.readouterr()
    args[args.index("--lr") + 1] = "1e-2"
    assert main(args) == 2
    assert "other settings (lr" in capsys.readouterr().err


def test_eval_full_trains_on_the_whole_training_set(tmp_path, causal_dir, capsys):
    from tests.cli.test_evaluate import NEGATIVE, POSITIVE

    full = tmp_path / "full"
    full.mkdir()
    lines = [f"1 {t}" for t in POSITIVE] + [f"0 {t}" for t in NEGATIVE]
    (full / "stsa.binary.train").write_text("\n".join(lines * 2) + "\n")
    (full / "stsa.binary.test").write_text("\n".join(lines) + "\n")  # dev, by FULL_LAYOUT
    (full / "stsa.binary.dev").write_text("1 fun and good\n0 awful and boring\n")  # test
    out = tmp_path / "out"
    args = [
        "eval", "--full", "--full-dev-size", "4", "--data", str(full), "--task", "SST-2", "--seeds", "13",
        "--out", str(out), "--template", "{text} It was {mask}", "--labels", "0=bad,1=good",
        "--backbone", str(causal_dir), "--methods", "prompt-ft", *TRAINING,
    ]  # fmt: skip
    assert main(args) == 0
    records = json.loads((out / "results.json").read_text())
    assert [(r["task"], r["method"], r["seed"]) for r in records] == [("SST-2", "prompt-ft", 13)]
    assert records[0]["accuracy"] in (0.0, 0.5, 1.0)  # scored on the two test sentences
    assert json.loads((out / "settings.json").read_text())["full"] is True
    assert (out / "results.md").read_text().startswith("# Full-data evaluation")

    capsys.readouterr()
    args[args.index("--methods") + 1] = "zero-shot,prompt-ft"
    assert main(args) == 2
    assert "--full evaluates trainable methods only; drop zero-shot" in capsys.readouterr().err
