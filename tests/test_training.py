"""Training on tiny random backbones: the loss falls, checkpoints round-trip to identical predictions."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from openbook.methods import weights_sha256
from openbook.prompting import PromptError
from openbook.train_config import (
    TrainConfig,
)
from openbook.training import TRAIN_STAGES, train

from tests.test_checkpoints import HALF_PROBABILITY_ATOL

# 60 steps: retroprompt with neural demonstrations takes longer than 40 on the tiny masked model to bring
# its loss below 0.7 of where it started. Most of these tests are about what the dev checks choose, so
# here they keep the best weights.
CONFIG = TrainConfig(
    steps=60, batch_size=4, lr=3e-3, eval_every=6, patience=10, warmup_ratio=0.0, keep="best"
)


@pytest.mark.parametrize(
    ("spec", "precision"),
    [
        ("prompt-ft", "float32"),
        ("retroprompt", "float32"),
        ("retroprompt/demos=neural/knn-loss", "float32"),  # the paper's configuration
        # each step's forward reads the weights the last step left (autocast's cast cache would not)
        ("retroprompt", "bfloat16"),
    ],
)
def test_loss_falls_and_checkpoint_round_trips(
    model_dir: Path, spec: str, precision: str, tmp_path: Path, toy, fresh_classifier, save_and_reload
) -> None:
    classifier, method = fresh_classifier(model_dir, spec)
    base_sha = weights_sha256(classifier.backbone.model)
    config = dataclasses.replace(CONFIG, precision=precision)
    result = train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, config, progress=False)
    assert np.mean(result.losses[-4:]) < 0.7 * np.mean(result.losses[:4])
    assert result.best.accuracy == 1.0
    before = classifier.predict(toy.texts[:4])

    loaded, loaded_method = save_and_reload(classifier, method, model_dir, tmp_path, config, result, base_sha)
    assert loaded_method.spec == method.spec
    assert loaded.demos == classifier.demos and loaded.knn == classifier.knn
    after = loaded.predict(toy.texts[:4])
    assert [p.label for p in after] == [p.label for p in before]
    for a, b in zip(after, before, strict=True):
        # the weights went to disk in float16 (tests/test_checkpoints.py); store and bias exactly
        assert a.probabilities == pytest.approx(b.probabilities, abs=HALF_PROBABILITY_ATOL)
        # the same neighbours at the same similarities; exact ties (a trained store's centred cosines sit
        # at +-1) may come back in another order
        reloaded, trained = ({n.id: n.similarity for n in p.neighbours} for p in (a, b))
        assert len(reloaded) == len(a.neighbours) and reloaded == pytest.approx(trained, abs=1e-3)


def test_retroprompt_ends_with_its_store_reembedded_under_the_kept_weights(
    causal_dir: Path, toy, fresh_classifier
) -> None:
    classifier, method = fresh_classifier(causal_dir, "retroprompt")
    config = dataclasses.replace(CONFIG, steps=4)
    untrained = classifier.embed(toy.texts, vectors_only=True).vectors
    train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, config, progress=False)
    keys = classifier.store.vectors_of(np.arange(len(toy.texts)))
    fresh = classifier.embed(toy.texts, vectors_only=True).vectors
    np.testing.assert_allclose(keys, fresh, atol=1e-5)  # the store holds the kept weights' keys
    assert np.abs(keys - untrained).max() > 1e-3  # not the untrained ones it started from


@pytest.mark.parametrize(
    ("best", "precision"), [("last", "float32"), ("first", "float32"), ("last", "bfloat16")]
)
def test_the_kept_weights_keys_are_embedded_once(
    causal_dir: Path, toy, fresh_classifier, monkeypatch, best: str, precision: str
) -> None:
    """The store ends with the kept weights' keys. Where the last epoch's re-embedding already gave them
    (the kept step is the last, in float32 without autocast), training does not embed them again, and
    hands on the last dev check's embeddings, which are then dev's as the classifier serves it."""
    import openbook.training as training
    from openbook.training import DevScore

    calls: list[int] = []
    reembed = training.reembed
    monkeypatch.setattr(training, "reembed", lambda *a, **k: calls.append(1) or reembed(*a, **k))
    sign = 1 if best == "last" else -1  # each check better (or worse) than the one before
    monkeypatch.setattr(
        training, "evaluate_dev", lambda c, t, g, step: (DevScore(step, sign * step / 100, 0.0), c.embed(t))
    )
    classifier, method = fresh_classifier(causal_dir, "retroprompt/demos=neural")  # reads the store
    epoch = CONFIG.steps_per_epoch(len(toy.texts))
    config = dataclasses.replace(CONFIG, steps=2 * epoch, eval_every=epoch, precision=precision)
    result = train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, config, progress=False)
    assert result.steps_run == 2 * epoch and result.best.step == (2 * epoch if best == "last" else 0)
    # the first keys, one re-embedding an epoch, and the kept weights' unless the last epoch's were they
    assert len(calls) == 1 + 2 + (best != "last" or precision != "float32")
    keys = classifier.store.vectors_of(np.arange(len(toy.texts)))
    np.testing.assert_allclose(keys, classifier.embed_vectors(toy.texts).vectors, atol=1e-6)
    reused = result.dev_embeddings
    assert (reused is not None) == (best == "last" and precision == "float32")
    if reused is not None:
        fresh = classifier.embed(toy.texts)
        np.testing.assert_allclose(reused.vectors, fresh.vectors, atol=1e-6)
        np.testing.assert_allclose(reused.lm_log_probs, fresh.lm_log_probs, atol=1e-5)


def test_training_refuses_one_class(causal_dir: Path, toy, fresh_classifier) -> None:
    classifier, method = fresh_classifier(causal_dir, "prompt-ft")
    texts, labels = toy.texts, toy.labels
    with pytest.raises(PromptError, match="fewer than 2 classes"):
        train(classifier, method, texts[:2], labels[:2], texts, labels, CONFIG, progress=False)
    with pytest.raises(PromptError, match="non-empty"):
        train(classifier, method, texts, labels, [], np.array([], dtype=np.int64), CONFIG, progress=False)


def test_training_is_deterministic_for_a_seed(causal_dir: Path, toy, fresh_classifier) -> None:
    runs = []
    for seed in (5, 5, 6):
        classifier, method = fresh_classifier(causal_dir, "retroprompt")
        config = dataclasses.replace(CONFIG, steps=6, seed=seed)
        result = train(
            classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, config, progress=False
        )
        runs.append(result.losses)
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]  # another seed shuffles differently


def test_bfloat16_precision_multiplies_in_bfloat16_and_updates_float32_weights(
    causal_dir: Path, toy, fresh_classifier
) -> None:
    seen: dict[str, set] = {"float32": set(), "bfloat16": set()}
    for precision, dtypes in seen.items():
        classifier, method = fresh_classifier(causal_dir, "retroprompt")
        linears = [m for m in classifier.backbone.model.modules() if isinstance(m, torch.nn.Linear)]

        def record(module: torch.nn.Module, inputs: Any, out: torch.Tensor, dtypes: set = dtypes) -> None:
            dtypes.add((out.dtype, module.weight.dtype))

        hooks = [m.register_forward_hook(record) for m in linears]
        config = dataclasses.replace(CONFIG, steps=12, precision=precision)
        before = {k: v.clone() for k, v in method.trained_tensors(classifier).items()}
        result = train(
            classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, config, progress=False
        )
        for hook in hooks:
            hook.remove()
        assert all(np.isfinite(result.losses))
        trained = method.trained_tensors(classifier)
        assert any(not torch.equal(trained[k], before[k]) for k in before)  # the steps changed weights
        after = {p.dtype for p in classifier.backbone.model.parameters()}
        assert after == {torch.float32}  # the tiny model's serving dtype, restored
    assert seen["float32"] == {(torch.float32, torch.float32)}
    # under autocast the products come out in bfloat16 while the weights they read stay float32
    assert (torch.bfloat16, torch.float32) in seen["bfloat16"]
    assert all(weight == torch.float32 for _, weight in seen["bfloat16"])


@pytest.mark.parametrize("scoring", ["exact", "vectors"])
def test_bfloat16_precision_trains_under_either_label_scoring(
    causal_dir: Path, scoring: str, toy, fresh_classifier
) -> None:
    from openbook.devices import precision_context

    classifier, method = fresh_classifier(causal_dir, "retroprompt")
    classifier = dataclasses.replace(classifier, label_scoring=scoring)
    config = dataclasses.replace(CONFIG, steps=4, precision="bfloat16")
    train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, config, progress=False)
    with precision_context("bfloat16", classifier.backbone.device):
        scored = classifier.embed(toy.texts[:3])
    # what leaves a forward is float32 under autocast too: the store and numpy take it as it is
    assert scored.vectors.dtype == np.float32 and scored.lm_log_probs.dtype == np.float32


def test_an_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="precision must be one of float32, bfloat16"):
        TrainConfig(precision="float16")  # type: ignore[arg-type]  # what a bad config file would hold


@pytest.mark.parametrize("spec", ["prompt-ft", "retroprompt", "retroprompt/demos=neural/knn-loss"])
def test_domain_bias_comes_from_the_untrained_weights(
    causal_dir: Path, spec: str, toy, fresh_classifier
) -> None:
    from openbook.calibration import mean_prediction_bias
    from openbook.store import KnowledgeStore
    from openbook.training import reembed

    reference, _ = fresh_classifier(causal_dir, spec)
    reference.store = KnowledgeStore(reference.backbone.hidden_size)
    keys, plain = reembed(reference, toy.texts, toy.labels, scored=True)  # it scores the plain prompt too
    np.testing.assert_array_equal(keys, reference.embed_vectors(toy.texts).vectors)
    assert plain is not None
    with_demos = reference.embed(toy.texts, exclude_ids=np.arange(len(toy.texts))).lm_log_probs
    assert (reference.demo_encoder is None) == np.array_equal(plain, with_demos)
    classifier, method = fresh_classifier(causal_dir, spec)
    config = dataclasses.replace(CONFIG, steps=2)
    train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, config, progress=False)
    np.testing.assert_allclose(classifier.label_bias, mean_prediction_bias(with_demos), atol=1e-6)


def test_a_non_finite_gradient_stops_training_before_the_weights_change(
    causal_dir: Path, toy, fresh_classifier
) -> None:
    from openbook.training import TrainingDiverged

    classifier, method = fresh_classifier(causal_dir, "prompt-ft")
    before = weights_sha256(classifier.backbone.model)
    finite_loss = method.loss

    def loss_with_nan_gradient(classifier, batch):
        loss = finite_loss(classifier, batch)
        return loss + 0.0 * torch.sqrt(loss - loss)  # still finite going forward; d sqrt(x)/dx at 0 is inf

    method.loss = loss_with_nan_gradient
    with pytest.raises(TrainingDiverged, match=r"prompt-ft, step 1: the gradient norm is nan"):
        train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, CONFIG, progress=False)
    assert weights_sha256(classifier.backbone.model) == before
    assert not classifier.backbone.model.training


def test_an_epoch_budget_runs_its_steps_and_checks_dev_at_the_last(
    causal_dir: Path, toy, fresh_classifier
) -> None:
    classifier, method = fresh_classifier(causal_dir, "prompt-ft")
    config = dataclasses.replace(CONFIG, steps=None, epochs=2.5, eval_every=4)  # 8 examples, batch 4
    reported: list[tuple[int, int] | str] = []

    def report(step: int, steps: int, loss: float) -> None:
        reported.append((step, steps))

    texts, labels = toy.texts, toy.labels
    result = train(
        classifier, method, texts, labels, texts, labels, config,
        progress=False, on_step=report, on_stage=reported.append,
    )  # fmt: skip
    assert result.step_budget == result.steps_run == 5  # ceil(2.5 * 8 / 4), patience never ran out
    # progress is out of the budget, and each stage is announced as it begins, around the steps
    assert reported == ["preparing", "training", *((step, 5) for step in range(1, 6)), "finishing"]
    assert tuple(r for r in reported if isinstance(r, str)) == TRAIN_STAGES
    assert [check["step"] for check in result.history] == [0, 4, 5]  # every 4 steps, and the last


def test_an_epoch_budget_checks_dev_at_the_end_of_every_epoch(
    causal_dir: Path, toy, fresh_classifier
) -> None:
    classifier, method = fresh_classifier(causal_dir, "prompt-ft")
    config = dataclasses.replace(CONFIG, steps=None, epochs=3.0, eval_every=None)
    texts, labels = toy.texts[:6], toy.labels[:6]  # 6 examples in batches of 4: epochs of 2 steps (4 + 2)
    result = train(classifier, method, texts, labels, toy.texts, toy.labels, config, progress=False)
    assert (result.step_budget, result.steps_run, result.check_every) == (6, 6, 2)
    assert [check["step"] for check in result.history] == [0, 2, 4, 6]


def test_patience_counts_epochs_without_a_better_dev_score(causal_dir: Path, toy, fresh_classifier) -> None:
    classifier, method = fresh_classifier(causal_dir, "prompt-ft")
    # a learning rate too small to move a float32 weight: every check scores as step 0 did, none better
    config = dataclasses.replace(CONFIG, steps=None, epochs=10.0, eval_every=None, patience=3, lr=1e-30)
    texts, labels = toy.texts, toy.labels  # 8 examples in batches of 4: epochs of 2 steps
    result = train(classifier, method, texts, labels, texts, labels, config, progress=False)
    assert result.step_budget == 20
    assert [check["step"] for check in result.history] == [0, 2, 4, 6]  # three epochs without gain
    assert result.steps_run == 6 and result.best.step == 0


def test_keep_last_runs_the_budget_and_keeps_the_last_weights(
    causal_dir: Path, toy, fresh_classifier
) -> None:
    classifier, method = fresh_classifier(causal_dir, "prompt-ft")
    # patience 1 would stop a run that keeps the best at its first check without gain; this one ignores it
    config = dataclasses.replace(CONFIG, steps=None, epochs=10.0, eval_every=None, patience=1, keep="last")
    texts, labels = toy.texts, toy.labels  # 8 examples in batches of 4: a budget of 20 steps
    result = train(classifier, method, texts, labels, texts, labels, config, progress=False)
    assert result.steps_run == result.step_budget == 20
    assert [check["step"] for check in result.history] == [0, 20]  # dev scored at the start and the end alone
    assert result.best.step == 20
    trained = {name: t.clone() for name, t in method.trained_tensors(classifier).items()}
    fresh, _ = fresh_classifier(causal_dir, "prompt-ft")
    moved = [not torch.equal(t, method.trained_tensors(fresh)[name]) for name, t in trained.items()]
    assert any(moved)  # the last weights, not step 0's
    with pytest.raises(ValueError, match="keep must be one of best, last"):
        TrainConfig(keep="first")  # type: ignore[arg-type]


def test_the_step_cap_ends_an_epoch_budget_and_checks_its_last_step(
    causal_dir: Path, toy, fresh_classifier
) -> None:
    classifier, method = fresh_classifier(causal_dir, "prompt-ft")
    config = dataclasses.replace(CONFIG, steps=None, epochs=10.0, max_steps=5, eval_every=None)
    reported: list[int] = []
    texts, labels = toy.texts, toy.labels
    result = train(
        classifier, method, texts, labels, texts, labels, config, progress=False,
        on_step=lambda step, steps, loss: reported.append(steps),
    )  # fmt: skip
    assert result.step_budget == result.steps_run == 5  # 20 planned, capped; patience (10) never ran out
    assert set(reported) == {5}  # progress is out of the capped budget
    assert [check["step"] for check in result.history] == [0, 2, 4, 5]  # each epoch, and the last step
