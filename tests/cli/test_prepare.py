"""`openbook prepare --random-weights`: a model of the backbone's shapes with fresh weights, in two steps
where the weights cannot travel (a skeleton of config and tokenizer, completed elsewhere)."""

from pathlib import Path

from openbook.backbone import BackboneConfig, load_backbone

from services.cli import main


def test_a_skeleton_completes_to_a_random_model_of_the_same_shapes(causal_dir: Path, tmp_path: Path) -> None:
    skeleton, model = tmp_path / "skeleton", tmp_path / "model"
    assert (
        main(["prepare", "--backbone", str(causal_dir), "--random-weights", str(skeleton), "--skeleton"]) == 0
    )
    assert (skeleton / "config.json").is_file() and (skeleton / "tokenizer.json").is_file()
    assert not list(skeleton.glob("*.safetensors"))  # a few files of text, no weights
    assert main(["prepare", "--backbone", str(skeleton), "--random-weights", str(model)]) == 0

    real = load_backbone(BackboneConfig(name=str(causal_dir), max_length=48)).model.state_dict()
    fresh = load_backbone(BackboneConfig(name=str(model), max_length=48)).model.state_dict()
    assert {k: v.shape for k, v in fresh.items()} == {k: v.shape for k, v in real.items()}
    assert all(v.isfinite().all() for v in fresh.values())


def test_skeleton_needs_a_directory_to_write(causal_dir: Path) -> None:
    assert main(["prepare", "--backbone", str(causal_dir), "--skeleton"]) != 0
