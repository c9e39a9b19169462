"""The one builder of a classifier, `build_classifier`, and how it predicts before it is trained: the
defaults that `create_classifier`, the `openbook` commands (`cli/common.classifier_from_args`) and the
service's tasks (`services/engine/task_spec.task_classifier`) share.

- P_LM calibrated by the content-free prior: a new task has no texts to measure a domain prior on, and
  once it holds examples the domain prior over them was not the 1 point better on dev that replacing it
  asked for;
- kNN at `KnnConfig`'s k and T (16, 0.1) and similarity (centred cosine);
- lambda, unless one is given, chosen on the stored examples, each scored leave-one-out
  (`selection.lambda_on_store`), which replaced a fixed 0.5 by the same check on dev: `knn.lam` None,
  which the classifier keeps level with its store (`lambda_on_store.py`).

Both choices: docs/experiments/untrained-task-calibration.md (`python -m research first-use`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from openbook.backbone import Backbone
from openbook.calibration import CalibrationMode
from openbook.classifier import Classifier
from openbook.knn import KnnConfig
from openbook.prompting import Template, Verbalizer
from openbook.sentence_reader import SentenceReader
from openbook.word_scores import LabelScoringChoice, resolve_label_scoring

# Lambda None: chosen on the stored examples (`lambda_on_store.py`); with no neighbour to mix, P_LM alone is
# served whatever lambda is. Training chooses a trained classifier's on dev (`fitting.py`).
UNTRAINED_KNN = KnnConfig(lam=None)
UNTRAINED_CALIBRATION: CalibrationMode = "content-free"


def build_classifier(
    backbone: Backbone,
    template: str | Template,
    labels: Mapping[str, str] | Sequence[str] | Verbalizer,
    *,
    knn: KnnConfig = UNTRAINED_KNN,
    calibration: CalibrationMode = UNTRAINED_CALIBRATION,
    batch_size: int = Classifier.batch_size,
    label_scoring: LabelScoringChoice = "auto",
    reader: SentenceReader | None = None,
) -> Classifier:
    """A classifier with an empty store and the untrained defaults (bad templates or label words raise
        PromptError); `labels` as label -> word, or label names alone (each scored by its readable word).

        The content-free prior is measured here (a forward); "none" sets no bias, for a caller that measures
        or resets it itself; a domain prior needs texts, so "domain" leaves the bias for the caller to set
        from them. `label_scoring` "auto" scores the label words exactly up to 16 labels and by label vectors
        above (`word_scores.resolve_label_scoring`). With a sentence `reader`, P_kNN reads the store's
    examples keyed by its embeddings (`classifier.py`)."""
    verbalizer = labels if isinstance(labels, Verbalizer) else Verbalizer.of(labels)
    template = template if isinstance(template, Template) else Template(template)
    scoring = resolve_label_scoring(label_scoring, len(verbalizer.labels))
    classifier = Classifier(
        backbone, template, verbalizer, knn=knn, batch_size=batch_size, label_scoring=scoring, reader=reader
    )
    if calibration != "domain":
        classifier.label_bias = classifier.calibration_bias(calibration)
    return classifier
