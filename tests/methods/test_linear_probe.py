"""The linear probe: logistic regression on frozen slot features, trained by the shared loop."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.methods import MethodError, TrainBatch, build_method, weights_sha256
from openbook.methods.linear_probe import LinearProbeHead
from openbook.prompting import Verbalizer
from openbook.train_config import TrainConfig
from openbook.training import train

CONFIG = TrainConfig(steps=40, batch_size=4, lr=1e-5, eval_every=8, patience=10, warmup_ratio=0.0)


def prepared(backbone: Backbone, toy, spec: str = "linear-probe") -> tuple[Classifier, object]:
    """A probe on an already loaded backbone (for tests that do not train)."""
    method = build_method(spec)
    return method.prepare(Classifier(backbone, toy.template, toy.verbalizer)), method


def test_loss_falls_backbone_stays_frozen_and_checkpoint_round_trips(
    model_dir: Path, tmp_path: Path, toy, fresh_classifier, save_and_reload
) -> None:
    classifier, method = fresh_classifier(model_dir, "linear-probe")  # a fresh backbone: training mutates
    base_sha = weights_sha256(classifier.backbone.model)
    weights_before = {k: v.clone() for k, v in classifier.backbone.model.state_dict().items()}
    batch = TrainBatch(toy.texts, torch.tensor(toy.labels), np.arange(len(toy.texts)))
    with torch.no_grad():
        loss_before = float(method.loss(classifier, batch))
    assert loss_before == pytest.approx(np.log(2), abs=1e-6)  # zero-initialised: uniform

    result = train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, CONFIG, progress=False)
    classifier.backbone.model.eval()
    with torch.no_grad():
        assert float(method.loss(classifier, batch)) < 0.8 * loss_before
    assert result.best.accuracy >= 0.75
    for name, tensor in classifier.backbone.model.state_dict().items():
        assert torch.equal(tensor, weights_before[name]), name
    assert set(method.trained_tensors(classifier)) == {"linear.weight", "linear.bias"}

    before = classifier.predict(toy.texts[:4])
    loaded, _ = save_and_reload(classifier, method, model_dir, tmp_path, CONFIG, result, base_sha)
    for a, b in zip(loaded.predict(toy.texts[:4]), before, strict=True):
        assert a.probabilities == b.probabilities


def test_on_a_causal_backbone_the_probe_reads_the_unit_slot_vectors(causal_backbone: Backbone, toy) -> None:
    # The LM head's input at the last position is the final normed hidden state: the store's key.
    classifier, _ = prepared(causal_backbone, toy)
    head = classifier.prompt
    assert isinstance(head, LinearProbeHead)
    torch.manual_seed(0)
    with torch.no_grad():
        head.linear.weight.normal_(std=3.0)
        head.linear.bias.normal_()
    vectors = classifier.embed(toy.texts, vectors_only=True).vectors  # (N, H) unit-norm
    weight, bias = head.linear.weight.detach().cpu().numpy(), head.linear.bias.detach().cpu().numpy()
    logits = vectors @ weight.T + bias
    expected = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(classifier.embed(toy.texts).lm_log_probs, expected, atol=1e-5)


def test_weight_decay_is_the_l2_on_the_weights_only(backbone: Backbone, toy) -> None:
    classifier, method = prepared(backbone, toy, "linear-probe/l2=0.05/prompt-lr=0.3")
    groups = method.parameter_groups(classifier, lr=1e-5)  # the loop's lr is for backbone weights
    head = classifier.prompt
    assert isinstance(head, LinearProbeHead)
    assert [(g["params"][0] is head.linear.weight, g["lr"], g["weight_decay"]) for g in groups] == [
        (True, 0.3, 0.05),
        (False, 0.3, 0.0),
    ]
    assert sum(p.numel() for p in method.trainable_parameters(classifier)) == (backbone.hidden_size + 1) * 2


def test_a_probe_for_other_labels_is_refused(causal_backbone: Backbone, toy) -> None:
    classifier, method = prepared(causal_backbone, toy)
    three = Classifier(causal_backbone, toy.template, Verbalizer.parse("0=bad,1=good,2=fun"))
    other = method.prepare(three)
    with pytest.raises(MethodError, match="does not fit"):
        method.load_trained(classifier, method.trained_tensors(other))


@pytest.mark.parametrize(
    ("spec", "match"),
    [("linear-probe/l2=-1", "l2 must be non-negative"), ("linear-probe/prompt-lr=0", "must be positive")],
)
def test_bad_options_are_clear_errors(spec: str, match: str) -> None:
    with pytest.raises(MethodError, match=match):
        build_method(spec)


def test_a_probe_reads_its_own_forward_on_a_backbone_other_tasks_use(causal_backbone: Backbone, toy) -> None:
    # Frozen-backbone tasks share one model across threads: another task's forward that runs while the
    # probe's hook is on the LM head must not be read as the probe's.
    probe, _ = prepared(causal_backbone, toy)
    with torch.no_grad():
        probe.prompt.linear.weight.normal_(std=3.0)
    other = Classifier(causal_backbone, toy.template, toy.verbalizer)
    expected = probe.embed(toy.texts).lm_log_probs
    interleaved = []

    def another_task_meanwhile(_module, _args, _output) -> None:
        if not interleaved:
            interleaved.append(True)
            thread = threading.Thread(target=other.embed, args=(["a bad film"],))
            thread.start()
            thread.join()

    handle = causal_backbone.model.get_output_embeddings().register_forward_hook(another_task_meanwhile)
    try:
        got = probe.embed(toy.texts).lm_log_probs
    finally:
        handle.remove()
    assert interleaved
    np.testing.assert_allclose(got, expected, atol=1e-6)
