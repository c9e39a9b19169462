"""What every soft-prompt method shares (`soft_prompt_method.py`), checked on each registered one."""

from __future__ import annotations

import pytest
from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.methods import METHODS, MethodError, build_method
from openbook.methods.soft_prompt_method import SoftPromptMethod

SOFT_PROMPT_METHODS = sorted(name for name, cls in METHODS.items() if issubclass(cls, SoftPromptMethod))


def test_the_soft_prompt_methods_are_the_expected_ones() -> None:
    # The tests below run on each of these; a method that stops sharing the base should be noticed.
    assert SOFT_PROMPT_METHODS == ["ipt", "linear-probe", "p-tuning", "prefix-tuning", "prompt-tuning"]


@pytest.mark.parametrize("name", SOFT_PROMPT_METHODS)
def test_only_the_prompt_trains_and_at_its_own_learning_rate(
    name: str, causal_backbone: Backbone, toy
) -> None:
    method = build_method(f"{name}/prompt-lr=0.25")
    classifier = method.prepare(Classifier(causal_backbone, toy.template, toy.verbalizer))
    assert classifier.prompt is not None
    trainable = {id(p) for p in method.trainable_parameters(classifier)}
    assert trainable == {id(p) for p in classifier.prompt.parameters()}
    assert not trainable & {id(p) for p in causal_backbone.model.parameters()}  # the backbone is frozen
    groups = method.parameter_groups(classifier, lr=1e-5)  # the loop's lr is for backbone weights
    assert {g["lr"] for g in groups} == {0.25}
    assert {id(p) for g in groups for p in g["params"]} == trainable


@pytest.mark.parametrize("name", SOFT_PROMPT_METHODS)
def test_an_unprepared_classifier_is_refused(name: str, causal_backbone: Backbone, toy) -> None:
    method = build_method(name)
    with pytest.raises(MethodError, match="prepare it"):
        method.trainable_parameters(Classifier(causal_backbone, toy.template, toy.verbalizer))
