"""`openbook train` on tiny backbones: the checkpoint it writes, and its refusals."""

import json

import pytest

from services.cli import main


@pytest.fixture
def train_args(training_flags):
    """`train_args(data, out, model_dir, *extra)`: `openbook train` on the toy task, seed 1, a few steps."""

    def build(data, out, model_dir, *extra):
        return [
            "train", "--data", str(data), "--task", "toy", "--seed", "1", "--out", str(out),
            "--template", "{text} It was {mask}", "--labels", "0=bad,1=good", "--backbone", str(model_dir),
            *training_flags, *extra,
        ]  # fmt: skip

    return build


def test_train_writes_a_checkpoint_that_classify_reads(tmp_path, causal_dir, capsys, train_args, toy_dataset):
    data = toy_dataset(tmp_path / "data")
    out = tmp_path / "ckpt"
    assert main(train_args(data, out, causal_dir, "--method", "retroprompt", "--knn-loss")) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["method"] == "retroprompt/knn-loss" and "accuracy_with_knn" in summary["dev"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["spec"] == "retroprompt/knn-loss" and manifest["labels"] == ["0", "1"]
    assert manifest["backbone"]["name"] == str(causal_dir) and len(manifest["training_data_sha256"]) == 64
    assert "weights.safetensors" in manifest["files"]
    assert main(["classify", "--checkpoint", str(out), "a good film"]) == 0
    prediction = json.loads(capsys.readouterr().out)
    assert prediction["label"] in {"0", "1"} and len(prediction["neighbours"]) == manifest["knn"]["k"]

    assert main(train_args(data, out, causal_dir, "--method", "retroprompt")) == 2
    assert "exists" in capsys.readouterr().err


def test_train_with_a_reader_writes_a_checkpoint_that_classify_reads_with_it(
    tmp_path, causal_dir, reader_mpnet_dir, capsys, train_args, toy_dataset
):
    data = toy_dataset(tmp_path / "data")
    out = tmp_path / "ckpt"
    assert (
        main(train_args(data, out, causal_dir, "--method", "prompt-ft", "--reader", str(reader_mpnet_dir)))
        == 0
    )
    capsys.readouterr()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["reader"]["tuned"] and manifest["reader"]["base"]["name"] == str(reader_mpnet_dir)
    assert manifest["knn"]["lam"] is not None  # chosen on dev: prompt-ft mixes the reader's neighbours
    assert main(["classify", "--checkpoint", str(out), "a good film"]) == 0
    assert json.loads(capsys.readouterr().out)["p_knn"] is not None
    again = train_args(data, tmp_path / "again", causal_dir, "--method", "prompt-ft", "--reader", "mpnet")
    assert main([*again, "--init", str(out)]) == 2
    assert "drop --reader" in capsys.readouterr().err


def test_train_bad_inputs_are_clear_errors_and_write_nothing(
    tmp_path, causal_dir, capsys, train_args, toy_dataset
):
    data = toy_dataset(tmp_path / "data")
    assert main(train_args(data, tmp_path / "a", causal_dir, "--method", "prompt-ft", "--no-demos")) == 2
    assert "prompt-ft has no option 'demos'" in capsys.readouterr().err  # --no-demos asks for demos=none

    one_class = toy_dataset(tmp_path / "one")
    train_csv = one_class / "toy" / "16-1" / "train.csv"
    train_csv.write_text(
        "".join(line for line in train_csv.read_text().splitlines(True) if line.startswith("1"))
    )
    assert main(train_args(one_class, tmp_path / "b", causal_dir, "--method", "prompt-ft")) == 2
    assert "fewer than 2 classes" in capsys.readouterr().err

    empty = toy_dataset(tmp_path / "empty")
    (empty / "toy" / "16-1" / "dev.csv").write_text("")
    assert main(train_args(empty, tmp_path / "c", causal_dir, "--method", "prompt-ft")) == 2
    assert "dev.csv" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in "abc")


def test_checkpoint_problems_are_named(tmp_path, causal_dir, capsys, train_args, toy_dataset):
    data = toy_dataset(tmp_path / "data")
    ckpt = tmp_path / "ckpt"
    assert main(train_args(data, ckpt, causal_dir, "--method", "prompt-ft")) == 0
    capsys.readouterr()

    other = toy_dataset(tmp_path / "other")
    for split in ("train", "dev"):
        path = other / "toy" / "16-1" / f"{split}.csv"
        path.write_text(path.read_text().replace("0,", "2,"))
    args = train_args(other, tmp_path / "next", causal_dir, "--method", "prompt-ft", "--init", str(ckpt))
    assert main(args) == 2
    assert "differ from the data's labels" in capsys.readouterr().err

    weights = ckpt / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    assert main(["classify", "--checkpoint", str(ckpt), "a good film"]) == 2
    assert "sha256 mismatch for weights.safetensors" in capsys.readouterr().err
    (ckpt / "store" / "ids.npy").unlink()
    assert main(["classify", "--checkpoint", str(ckpt), "a good film"]) == 2
    assert "missing" in capsys.readouterr().err and not (tmp_path / "next").exists()


def test_train_flags_are_the_method_options_they_name() -> None:
    from openbook.methods import build_method

    from services.cli import build_parser

    argv = ["train", "--task", "t", "--method", "retroprompt", "--seed", "1", "--out", "o"]
    args = build_parser().parse_args([*argv, "--no-demos", "--knn-loss", "--no-knn-infer"])
    spec = "/".join([args.method, *args.options])
    assert build_method(spec).spec == "retroprompt/knn-loss/no-knn-infer"  # no demonstrations: the default


def test_init_trains_a_checkpoint_on_naming_its_base_weights(
    tmp_path, causal_dir, capsys, train_args, toy_dataset
) -> None:
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.checkpoints import load_classifier
    from openbook.methods import weights_sha256
    from safetensors.torch import load_file

    data = toy_dataset(tmp_path / "data")
    first, then = tmp_path / "first", tmp_path / "then"
    assert main(train_args(data, first, causal_dir, "--method", "prompt-ft")) == 0
    assert main(train_args(data, then, causal_dir, "--method", "prompt-ft", "--init", str(first))) == 0
    capsys.readouterr()
    manifests = [json.loads((path / "manifest.json").read_text()) for path in (first, then)]
    # the base weights are the backbone's as loaded, not the first run's trained ones: `then` loads on them
    base = manifests[0]["backbone"]["weights_sha256"]
    assert manifests[1]["backbone"]["weights_sha256"] == base
    assert weights_sha256(load_backbone(BackboneConfig(name=str(causal_dir), max_length=48)).model) == base
    load_classifier(then)  # verified against those base weights
    trained = [load_file(path / "weights.safetensors") for path in (first, then)]
    # the same data and seed from the base weights would give the first run's weights again
    assert any(not (trained[0][k] == trained[1][k]).all() for k in trained[0])
