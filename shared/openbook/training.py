"""The training loop shared by every trainable prompt method.

AdamW with linear warmup and decay, gradient clipping, seeded shuffling, and the budget run out to
its last weights; or, with `keep="best"`, dev evaluations that keep the best weights (dev accuracy, ties
broken by dev log-likelihood) and early stopping after `patience` evaluations without improvement. The
run's budget, and what it keeps, are its `TrainConfig` (train_config.py).

A run computes in float32 unless `precision` is "bfloat16": then its forwards and backwards run under
autocast (matrix products in bfloat16, reductions such as the log-softmax in float32) while the weights,
their gradients and AdamW's moments stay float32, the mixed precision of most LLM fine-tuning. That is
everything between loading and the kept weights: the store's first keys, the calibration, the steps,
the dev checks and re-embeddings. It pays where the device multiplies bfloat16 natively (CUDA; x86
CPUs with AVX512-BF16 or AMX) and costs elsewhere. It is an option, not the default: its dev rule found
one unit 6 points under float32 (docs/decisions.md, "Mixed precision in training").

Before the first step the training examples are embedded into the store (ids
0..N-1) and, with `calibration="domain"`, the label log-prior of the untrained
prompt is measured on the training texts and then held fixed: training and
inference both read softmax(score - b), so fine-tuning starts from the
calibrated zero-shot classifier instead of the raw one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from openbook.backbone import float32_weights
from openbook.calibration import calibrated_p_lm, mean_prediction_bias
from openbook.classifier import Classifier
from openbook.devices import precision_context
from openbook.methods.base import Method, TrainBatch, only_these_train
from openbook.predictions import Embeddings
from openbook.prompting import PromptError, TextInput
from openbook.store import KnowledgeStore
from openbook.train_config import TrainConfig

_QUIET_EMBED = 512  # a store pass over more texts than this (the full-data runs) shows a progress bar


class TrainingDiverged(ValueError):
    """A step's gradients were not finite: training stops before they reach the weights."""


# What a training run is doing, in order (`train(on_stage=...)`; a job record's `stage`). On a large task
# with many labels the first and last can take longer than the steps: preparing builds the store and the
# domain calibration and scores the untrained weights on dev; finishing re-embeds the store under the
# kept weights (unless the last epoch's re-embedding was already under them, as served).
TRAIN_STAGES = ("preparing", "training", "finishing")


@dataclass(frozen=True)
class DevScore:
    """A score on dev, ranked by accuracy, then the gold labels' mean log-likelihood: training's dev
    checks (of the prompt's P_LM, at a `step`) and the promotion gate's (of the final distribution, as
    it serves: `fitting.dev_check`) alike."""

    step: int | None  # the training step checked; None: a classifier as it serves
    accuracy: float
    log_likelihood: float  # mean log P(gold) on dev

    @classmethod
    def of(cls, probabilities: np.ndarray, gold: np.ndarray, step: int | None = None) -> DevScore:
        """From (N, C) distributions and the (N,) gold label indices."""
        p_gold = probabilities[np.arange(len(gold)), gold]
        accuracy = float((probabilities.argmax(-1) == gold).mean())
        return cls(step, accuracy, float(np.log(np.maximum(p_gold, 1e-12)).mean()))

    def key(self) -> tuple[float, float]:
        return (self.accuracy, self.log_likelihood)


@dataclass
class TrainResult:
    best: DevScore
    history: list[dict] = field(default_factory=list)  # one entry per dev evaluation
    losses: list[float] = field(default_factory=list)  # one per step
    step_budget: int = 0  # the steps the run was given (`TrainConfig.total_steps`)
    check_every: int = 0  # the steps between its dev checks (`TrainConfig.check_every`)
    steps_run: int = 0  # fewer than the budget when early stopping ended the run
    seconds: float = 0.0
    # dev's embeddings as the trained classifier serves them, when the last check took them so (the kept
    # step is the last, its store's keys embedded before the check, in float32 without autocast): what
    # choosing k, T and lambda and scoring dev read next, without another pass (`fitting.fit_classifier`)
    dev_embeddings: Embeddings | None = None


def train(
    classifier: Classifier,
    method: Method,
    train_texts: Sequence[TextInput],
    train_labels: np.ndarray,
    dev_texts: Sequence[TextInput],
    dev_labels: np.ndarray,
    config: TrainConfig,
    *,
    progress: bool = True,
    on_step: Callable[[int, int, float], None] | None = None,  # (step, steps, loss), e.g. a job record
    on_stage: Callable[[str], None] | None = None,  # each of TRAIN_STAGES as it begins, e.g. a job record
) -> TrainResult:
    """Train `classifier` (already `method.prepare`d) in place; it ends with the best dev weights."""
    _check_data(train_labels, dev_labels, len(classifier.labels))
    stage = on_stage or (lambda name: None)
    stage("preparing")
    steps = config.total_steps(len(train_texts))
    check_every = config.check_every(len(train_texts))
    started = time.perf_counter()
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    ids = np.arange(len(train_texts), dtype=np.int64)
    # Training updates float32 weights even on a half-precision backbone (see `float32_weights`);
    # the kept weights are cast back and the store re-embedded in the serving dtype below.
    with (
        float32_weights(classifier.backbone.model, classifier.prompt),
        precision_context(config.precision, classifier.backbone.device),
    ):
        classifier.store = KnowledgeStore(classifier.backbone.hidden_size, device=classifier.backbone.device)
        classifier.label_bias = None
        # Domain calibration on the plain prompt reads the store pass's own label scores.
        plain = config.calibration == "domain" and classifier.demo_encoder is None
        keys, log_probs = reembed(classifier, train_texts, train_labels, progress=progress, scored=plain)
        if config.calibration == "domain":
            if log_probs is None:  # with demonstrations shown, as the classifier will be asked; the
                # store's keys are the texts' own retrieval queries, under the same weights
                bar = "calibrate" if progress and len(train_texts) > _QUIET_EMBED else False
                embedded = classifier.embed(train_texts, exclude_ids=ids, queries=keys, progress=bar)
                log_probs = embedded.lm_log_probs
            classifier.label_bias = mean_prediction_bias(log_probs)

        parameters = method.trainable_parameters(classifier)
        with only_these_train(classifier, parameters):
            optimizer = torch.optim.AdamW(
                method.parameter_groups(classifier, config.lr),
                lr=config.lr,
                weight_decay=config.weight_decay,
                fused=fused_adam_supported(parameters),
            )
            warmup = int(config.warmup_ratio * steps)
            schedule = torch.optim.lr_scheduler.LambdaLR(
                optimizer,
                lambda step: (
                    (step + 1) / max(1, warmup) if step < warmup else (steps - step) / (steps - warmup)
                ),
            )
            gold_all = torch.as_tensor(train_labels, dtype=torch.long, device=classifier.backbone.device)
            reembed_every = config.reembed_every or config.steps_per_epoch(len(ids))

            first, _ = evaluate_dev(classifier, dev_texts, dev_labels, step=0)
            result = TrainResult(best=first, step_budget=steps, check_every=check_every)
            result.history.append(vars(result.best) | {"loss": None})
            # the best check's weights, copied as they come; the last are the model's own at the end
            best_tensors = _snapshot(method.trained_tensors(classifier)) if config.keep == "best" else None
            keys_step: int | None = None  # the step whose weights the store's keys were embedded under
            dev_embedded: Embeddings | None = None  # the last dev check's
            stale = 0
            order = np.empty(0, dtype=np.int64)
            stage("training")
            bar = tqdm(range(1, steps + 1), desc=f"train {method.spec}", disable=not progress)
            for step in bar:
                if len(order) == 0:
                    order = rng.permutation(ids)
                rows, order = order[: config.batch_size], order[config.batch_size :]
                _set_training(classifier, True)
                loss = method.loss(
                    classifier, TrainBatch([train_texts[i] for i in rows], gold_all[rows], rows)
                )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(parameters, config.max_grad_norm)
                if not torch.isfinite(norm):  # one such step would turn every trained weight into NaN
                    _set_training(classifier, False)
                    raise TrainingDiverged(
                        f"{method.spec}, step {step}: the gradient norm is {float(norm)} (loss "
                        f"{float(loss.detach())}); stopped before this step changed any weight"
                    )
                optimizer.step()
                schedule.step()
                _set_training(classifier, False)
                result.losses.append(float(loss.detach()))
                result.steps_run = step
                if on_step is not None:
                    on_step(step, steps, result.losses[-1])
                if method.uses_store_in_training and step % reembed_every == 0:
                    reembed(classifier, train_texts, train_labels, progress=progress)
                    keys_step = step
                checks = config.keep == "best" and step % check_every == 0
                if checks or step == steps:
                    score, dev_embedded = evaluate_dev(classifier, dev_texts, dev_labels, step=step)
                    result.history.append(
                        vars(score) | {"loss": float(np.mean(result.losses[-check_every:]))}
                    )
                    if config.keep == "last":
                        result.best = score
                    elif score.key() > result.best.key():
                        result.best, stale = score, 0
                        best_tensors = _snapshot(method.trained_tensors(classifier))
                    else:
                        stale += 1
                    bar.set_postfix(loss=f"{result.losses[-1]:.3f}", dev=f"{score.accuracy:.3f}")
                    if stale >= config.patience:
                        break
                else:
                    bar.set_postfix(loss=f"{result.losses[-1]:.3f}", dev=f"{result.best.accuracy:.3f}")
            bar.close()
    stage("finishing")
    if best_tensors is not None:
        method.load_trained(classifier, best_tensors)
    # The store's keys under the kept weights, as they serve; unless the keys are those already: embedded
    # after the kept (last) step, in float32 weights without autocast, as the classifier serves them.
    served_as_trained = config.precision == "float32" and classifier.backbone.dtype == torch.float32
    if served_as_trained and keys_step == result.best.step == result.steps_run:
        result.dev_embeddings = dev_embedded  # the last check's, under these weights and keys
    else:
        reembed(classifier, train_texts, train_labels, progress=progress)
    result.seconds = time.perf_counter() - started
    return result


def reembed(
    classifier: Classifier,
    texts: Sequence[TextInput],
    labels: np.ndarray,
    *,
    progress: bool = False,
    scored: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Replace the store's keys (ids 0..N-1) with the slot vectors under the current weights; the texts
    are kept with them (textual demonstrations write them out). Returns the (N, H) keys as embedded.

    No label is scored unless `scored`: then the same forward scores them, and the plain prompt's
    (N, C) label scores (no demonstrations) are returned beside the keys. A progress bar is shown for a
    large set (the full-data runs), where a pass takes minutes.
    """
    classifier.backbone.model.eval()
    bar = "embed store" if progress and len(texts) > _QUIET_EMBED else False
    if scored:
        embedded = classifier.embed(texts, vectors_only=True, progress=bar)
        vectors, log_probs = embedded.vectors, embedded.lm_log_probs
    else:
        vectors, log_probs = classifier.embed_vectors(texts, progress=bar).vectors, None
    classifier.store.add(np.arange(len(texts), dtype=np.int64), vectors, labels, texts)
    return vectors, log_probs


def evaluate_dev(
    classifier: Classifier, texts: Sequence[TextInput], labels: np.ndarray, *, step: int
) -> tuple[DevScore, Embeddings]:
    """Dev accuracy and mean gold log-likelihood of the prompt's (calibrated) P_LM, and the embeddings
    they were read from."""
    embedded = classifier.embed(
        texts, with_reader=False
    )  # P_LM alone is read here: no sentence reader's pass
    return DevScore.of(calibrated_p_lm(embedded.lm_log_probs, classifier.label_bias), labels, step), embedded


def _set_training(classifier: Classifier, mode: bool) -> None:
    classifier.backbone.model.train(mode)
    if classifier.prompt is not None:
        classifier.prompt.train(mode)


def _snapshot(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in tensors.items()}


def _check_data(train_labels: np.ndarray, dev_labels: np.ndarray, num_labels: int) -> None:
    if len(train_labels) == 0 or len(dev_labels) == 0:
        raise PromptError("training needs a non-empty train split and a non-empty dev split")
    if len(np.unique(train_labels)) < 2:
        raise PromptError(
            f"the training data has fewer than 2 classes (labels seen: {np.unique(train_labels)})"
        )
    if train_labels.max() >= num_labels:
        raise PromptError("a training label is outside the verbalizer")


def fused_adam_supported(parameters: list[torch.nn.Parameter]) -> bool:
    """The fused AdamW kernel (about 5x faster a step on CPU) takes float parameters on CPU or CUDA."""
    return all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in parameters)
