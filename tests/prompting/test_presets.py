"""The per-task prompt presets: every one builds on both kinds of backbone."""

from pathlib import Path

import pytest
from openbook.prompting import PromptError, get_preset
from openbook.prompting.presets import PRESETS


@pytest.fixture
def intents_dir(tmp_path: Path) -> Path:
    """A task folder that names its labels, as k-shot/clinc150 does."""
    (tmp_path / "labels.txt").write_text("0=accept reservations\n1=account blocked\n\n2=alarm\n")
    return tmp_path


def test_every_preset_builds_for_both_kinds(masked_backbone, causal_backbone, intents_dir):
    for preset in PRESETS.values():
        for backbone in (masked_backbone, causal_backbone):
            encoder = backbone.encoder(*preset.prompt(backbone.kind, intents_dir))
            text = ("a question", "an answer") if encoder.template.is_pair else "a text"
            assert encoder.encode([text]).input_ids.shape[0] == 1
    assert get_preset("sst-2").name == "SST-2"
    with pytest.raises(PromptError, match="--template"):
        get_preset("unknown-task")


def test_a_task_that_names_its_labels_reads_them_from_its_folder(intents_dir, tmp_path):
    preset = get_preset("clinc150")
    verbalizer = preset.verbalizer("causal", intents_dir)
    assert verbalizer.labels == ("0", "1", "2")
    assert verbalizer.words == ("accept reservations", "account blocked", "alarm")
    assert preset.template("causal").source == "Customer message: {text}\nIntent: {mask}"
    with pytest.raises(PromptError, match="give --data"):
        preset.verbalizer("causal")
    (intents_dir / "labels.txt").write_text("0=alarm\nno separator here\n")
    with pytest.raises(PromptError, match="no separator here"):
        preset.verbalizer("causal", intents_dir)
    with pytest.raises(PromptError, match="cannot read"):
        preset.verbalizer("causal", tmp_path / "missing")
