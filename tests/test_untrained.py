"""`untrained.py`: the one builder, whatever form the prompt comes in, and the calibration it sets."""

from __future__ import annotations

import numpy as np
import pytest
from openbook.prompting import PromptError, Template, Verbalizer
from openbook.untrained import UNTRAINED_KNN, build_classifier


def test_strings_and_label_names_build_what_the_prompt_objects_build(causal_backbone) -> None:
    from_strings = build_classifier(causal_backbone, "{text} It was {mask}", ["good_film", "bad_film"])
    from_objects = build_classifier(
        causal_backbone,
        Template("{text} It was {mask}"),
        Verbalizer.of({"good_film": "good film", "bad_film": "bad film"}),
    )
    assert from_strings.verbalizer.words == from_objects.verbalizer.words == ("good film", "bad film")
    assert from_strings.template == from_objects.template
    assert from_strings.knn == UNTRAINED_KNN and len(from_strings.store) == 0
    assert from_strings.label_bias is not None
    np.testing.assert_array_equal(from_strings.label_bias, from_objects.label_bias)


@pytest.mark.parametrize("mode", ["none", "content-free", "domain"])
def test_only_the_content_free_prior_is_measured_here(causal_backbone, mode) -> None:
    classifier = build_classifier(
        causal_backbone, "{text} It was {mask}", {"0": "bad", "1": "good"}, calibration=mode
    )
    if mode == "content-free":
        np.testing.assert_allclose(
            classifier.label_bias, classifier.calibration_bias("content-free"), atol=1e-6
        )
    else:  # none: no prior; domain: the caller measures it on its texts
        assert classifier.label_bias is None


def test_a_template_without_a_slot_raises(causal_backbone) -> None:
    with pytest.raises(PromptError):
        build_classifier(causal_backbone, "{text} It was", {"0": "bad", "1": "good"})
