"""Growing a live classifier's label set: one more label, scored by its word until the next training.

Users of a few-shot classifier meet a new class long after they trained it. Retraining waits for
examples; the open book does not: the new label can be served at once.

- P_LM: the verbalizer grows, so the LM scores the new label by its word at the slot, exactly as
  it scores the others (the word must tokenise, differ from the others' words, and leave the
  prompt room, by the rules `Verbalizer` and the prompt encoder apply to every word). A method
  whose prompt scores the labels itself (DART's label vectors, the linear probe's head) starts
  the new label's row from the word's LM-head row (`SoftPrompt.with_label`); every other method
  (prompt-ft, retroprompt, IPT, L2P, the PEFT prompts) reads no label but through its words.
- Demonstrations are retrieved per class from the store: with vectors (neural, words) the new
  class has its pair in the prompt (in a row's nearest classes, once the task has more labels than
  a row shows) and, until it has examples, sits at the mean token embedding (no evidence either
  way, `demonstrations.to_input_space`); textual ones show it once it has one.
- The calibration log-prior (`label_bias`) takes the mean of the existing labels' values: the
  new label is corrected as much as a typical label, neither favoured nor held back.
- P_kNN: the store keys each example by its label's index, and the old labels keep theirs, so the
  store serves on unchanged and the new label's examples take index C.

The grown classifier shares the backbone and the store with the one it grew from (whose labels
no longer cover the store once an example of the new label is in it: use the grown one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from openbook.classifier import Classifier
from openbook.prompting import PromptError, Verbalizer


class LabelError(PromptError):
    """A label already there, a label word that cannot be scored, or a label set that is no extension."""


def add_label(classifier: Classifier, label: str, word: str) -> Classifier:
    """`classifier` with one more label, scored by `word`; raises LabelError (nothing changed) if it
    cannot be. Works on an untrained classifier and on one loaded from any method's checkpoint."""
    return add_labels(classifier, {label: word})


def add_labels(classifier: Classifier, labels: Mapping[str, str]) -> Classifier:
    """`classifier` with more labels (label -> word, in the order they take), all or none: LabelError
    (nothing changed) if one cannot be added. As `add_label` for each, with the prompt encoders built
    once for the whole set rather than once per label."""
    words = dict(zip(classifier.verbalizer.words, classifier.labels, strict=True))  # word -> its label
    for label, word in labels.items():
        if label in classifier.labels:
            raise LabelError(f"label {label!r} exists; labels: {list(classifier.labels)}")
        if word in words:
            raise LabelError(f"label {label!r} would have the same word as label {words[word]!r}: {word!r}")
        words[word] = label
    bias = classifier.label_bias
    try:
        verbalizer = Verbalizer(
            (*classifier.labels, *labels), (*classifier.verbalizer.words, *labels.values())
        )
        # replace() runs __post_init__, whose prompt encoders tokenise every word (the new ones included)
        grown = dataclasses.replace(
            classifier,
            verbalizer=verbalizer,
            label_bias=None
            if bias is None
            else np.append(bias, np.full(len(labels), bias.mean())).astype(bias.dtype),
        )
    except PromptError as error:
        added = ", ".join(f"{label!r} with word {word!r}" for label, word in labels.items())
        raise LabelError(f"label {added}: {error}" if len(labels) == 1 else str(error)) from None
    prompt = classifier.prompt
    if prompt is not None:
        for ids in grown.encoder.label_token_ids[len(classifier.labels) :]:
            prompt = prompt.with_label(classifier.backbone, ids)
        grown.prompt = prompt
    return grown


def fit_to_labels(classifier: Classifier, labels: Mapping[str, str]) -> Classifier:
    """`classifier` grown to `labels` (label -> word, in label order), which must begin with the
    classifier's own labels and words, in order; the classifier itself when they are the same.

    This is how a checkpoint trained before labels were added serves the task as it is now.
    """
    own = list(zip(classifier.labels, classifier.verbalizer.words, strict=True))
    given = list(labels.items())
    if given[: len(own)] != own:
        raise LabelError(
            f"labels {dict(given)} do not extend the classifier's {dict(own)}: a label was removed, "
            "renamed, reordered or given another word"
        )
    return add_labels(classifier, dict(given[len(own) :])) if len(given) > len(own) else classifier
