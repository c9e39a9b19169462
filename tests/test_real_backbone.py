"""One smoke test on the real default backbone and real data: zero-shot beats chance.

"Beats chance" is a one-sided binomial test at the 5% level: the chance of
getting at least this many of 64 balanced-ish sentences right by coin flips.
"""

from math import comb

import numpy as np
import pytest
from openbook.data import read_split

from tests.conftest import SHARED_DATASETS

SST2 = SHARED_DATASETS / "k-shot" / "SST-2"

pytestmark = pytest.mark.real_backbone


def binomial_tail(successes: int, trials: int, p: float = 0.5) -> float:
    return sum(comb(trials, k) * p**k * (1 - p) ** (trials - k) for k in range(successes, trials + 1))


@pytest.mark.skipif(not SST2.exists(), reason=f"real data not found at {SST2} (../shared/datasets is absent)")
def test_zero_shot_sst2_beats_chance_on_the_default_backbone():
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.classifier import Classifier
    from openbook.prompting import get_preset

    backbone = load_backbone(BackboneConfig(max_length=128))  # smollm2-135m, converted once into the cache
    preset = get_preset("SST-2")
    classifier = Classifier(backbone, *preset.prompt(backbone.kind))
    # Domain calibration (the eval default, chosen on dev): the mean prediction over the unlabelled
    # 16-shot training texts of one seed.
    train_texts = [e.text for e in read_split(SST2 / "16-13" / "train.tsv")]
    classifier.label_bias = classifier.calibration_bias("domain", classifier.embed(train_texts).lm_log_probs)
    test = read_split(SST2 / "test.tsv")[:64]
    gold = classifier.label_indices([e.label for e in test])
    predictions = classifier.predict([e.text for e in test])
    predicted = classifier.label_indices([p.label for p in predictions])
    correct = int((predicted == gold).sum())
    majority = max(np.bincount(gold)) / len(gold)
    assert correct / len(gold) > majority, f"{correct}/64 does not beat the majority class ({majority:.2f})"
    assert binomial_tail(correct, len(gold)) < 0.05, f"{correct}/64 is not significantly above chance"


def test_binomial_tail():
    assert binomial_tail(0, 10) == pytest.approx(1.0)
    assert binomial_tail(10, 10) == pytest.approx(0.5**10)
