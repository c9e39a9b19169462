"""The per-task prompt presets: every one builds on both kinds of backbone."""

import pytest
from openbook.prompting import PromptError, get_preset
from openbook.prompting.presets import PRESETS


def test_every_preset_builds_for_both_kinds(masked_backbone, causal_backbone):
    for preset in PRESETS.values():
        for backbone in (masked_backbone, causal_backbone):
            encoder = backbone.encoder(*preset.prompt(backbone.kind))
            text = ("a question", "an answer") if encoder.template.is_pair else "a text"
            assert encoder.encode([text]).input_ids.shape[0] == 1
    assert get_preset("sst-2").name == "SST-2"
    with pytest.raises(PromptError, match="--template"):
        get_preset("unknown-task")
