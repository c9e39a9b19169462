"""Train a method, decide how the trained classifier predicts, and save it: the one fit pipeline.

`Estimator.fit` and `Estimator.save` (estimator.py) run it for every caller: a library user, `openbook
train` (cli/train.py) and the service's trainer (services/trainer/worker.py). The steps:

0. labelled examples under ids become the sets training reads (`FitSets.of`): dev held out by a hash of
   the ids (`dev_split.split_dev`, the service's split), or given apart (`openbook train`'s k-shot dev);
0b. a classifier with a sentence reader has it tuned on the train examples (`tune_reader`), which choose
    how it predicts (step 2) as the prompt's training does;
1. `training.train` (the kept weights are the best on dev);
2. how the classifier predicts: a method that interpolates with kNN (or any, with a sentence reader) gets its
   k, T and lambda chosen on dev alone (`choose_knn_on_dev`: the training examples
   are no evidence once the prompt has been fitted to them; lambda is set to `TrainConfig.few_dev_lam`
   instead, where given, if dev holds fewer than FEW_DEV_PER_LABEL examples per label), any other
   predicts from the prompt alone (lambda = 0);
2b. its confidence: dev is scored as it will serve (with a store of the
   training examples), and temperature scaling is adopted if it lowers the
   cross-validated ECE on dev (`quality.calibrate`); those dev scores are kept
   with the checkpoint, for the version's quality report;
2c. with a sentence reader, where a query stops being in scope: the similarity to its nearest stored
   example below which at most 3 points of dev accuracy are lost, refusals counted as errors
   (`min_similarity_on_dev`, `out_of_scope.py`), kept as `Classifier.min_similarity`;
3. the store rebuilt from every example given to fit, under its id, with the trained weights (`serve_store`:
   a dev held out of them included, a dev given apart not); where a dev was held out, the sentence
   reader is first tuned again, from the untuned one, on every example (step 3a): the served reader
   learns dev's examples too, and k, T, lambda, the calibration and the refusal threshold chosen in
   step 2 carry over;
4. `save_fitted` (`Estimator.save`): `checkpoints.save_classifier`, atomically.

`dev_check` scores a trained classifier on dev as it would serve (accuracy, then the
gold label's log-likelihood: `training.DevScore`), for the service's promotion gate; a job's own
candidate is scored from the dev scores of step 2b (`served_dev_score`), so dev is scored once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from openbook.calibration import calibrated_p_lm, with_temperature
from openbook.checkpoints import examples_sha256, save_classifier
from openbook.classifier import Classifier
from openbook.data import Example
from openbook.dev_split import DEV_FRACTION, Examples, split_dev
from openbook.knn import KnnConfig, knn_search
from openbook.methods import Method
from openbook.out_of_scope import REFUSAL_COST, threshold_within_cost
from openbook.predictions import Embeddings, SlotVectors
from openbook.prompting import TextInput
from openbook.quality import Scored, calibrate, score_examples
from openbook.reader_book import as_string
from openbook.selection import DEFAULT_RULE, Evidence, SelectionRule, Split, select
from openbook.sentence_reader import ReaderConfig, SentenceReader, job_tuning, shared_encoder
from openbook.store import KnowledgeStore
from openbook.train_config import FEW_DEV_PER_LABEL, TrainConfig
from openbook.training import DevScore, TrainResult, train

# The stage of step 3a, a job's reader tuned again on every example (a dev held out of them included).
READER_AGAIN = "reader-again"


@dataclass(frozen=True)
class LabelledTexts:
    texts: Sequence[TextInput]
    labels: np.ndarray  # (N,) label indices
    ids: np.ndarray | None = None  # (N,) the examples' own ids, for reports; None: their positions

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.labels) or (self.ids is not None and len(self.ids) != len(self.texts)):
            raise ValueError(f"{len(self.texts)} texts but {len(self.labels)} labels (or ids)")

    def example_ids(self) -> np.ndarray:
        return np.arange(len(self.texts), dtype=np.int64) if self.ids is None else np.asarray(self.ids)


@dataclass(frozen=True)
class StoreExamples:
    """What the saved store holds instead of the training examples."""

    texts: Sequence[TextInput]
    labels: Sequence[str]
    ids: np.ndarray  # (N,) int64


@dataclass(frozen=True)
class FitSets:
    """Labelled examples under ids, as training reads them (`of`)."""

    train: LabelledTexts  # in id order (held out by hash) or as given (with dev given apart)
    dev: LabelledTexts  # what the dev checks and the choice of k, T and lambda score
    store: StoreExamples  # every example given to fit, under its id: what the trained classifier serves
    dev_held_out: bool  # False: no dev example, and the train examples stand in for dev

    @classmethod
    def of(cls, classifier: Classifier, examples: Examples, dev: float | Examples = DEV_FRACTION) -> FitSets:
        """The sets of `examples` (id -> (text, label)) and `dev`: the share of them held out by a hash of
        their ids (`split_dev`), as the service's trainer holds it out, or dev examples given apart, which
        choose and calibrate but are not stored. Label strings become `classifier`'s indices (PromptError
        for a label it does not know)."""
        if isinstance(dev, Mapping):  # read in the order given, as a k-shot split's files list them
            train_ids, dev_ids, dev_examples = list(examples), list(dev), dev
        else:
            (train_ids, dev_ids), dev_examples = split_dev(examples, dev), examples

        def labelled(source: Examples, ids: list[int]) -> LabelledTexts:
            return LabelledTexts(
                [source[i][0] for i in ids],
                classifier.label_indices([source[i][1] for i in ids]),
                np.array(ids, dtype=np.int64),
            )

        everything = sorted(examples)
        store = StoreExamples(
            [examples[i][0] for i in everything],
            [examples[i][1] for i in everything],
            np.array(everything, dtype=np.int64),
        )
        # with no dev example yet (a tiny set), the train examples stand in for it
        checked = labelled(dev_examples, dev_ids) if dev_ids else labelled(examples, train_ids)
        return cls(labelled(examples, train_ids), checked, store, bool(dev_ids))

    def dev_ids(self) -> list[int]:
        """The dev examples' ids; none where the train examples stood in for dev."""
        return self.dev.example_ids().tolist() if self.dev_held_out else []

    def training_data_sha256(self) -> str:
        """`checkpoints.examples_sha256` of the stored examples (a dev held out of them included), in id
        order."""
        return examples_sha256(
            [
                Example(text, label, f"id {i}")
                for text, label, i in zip(self.store.texts, self.store.labels, self.store.ids, strict=True)
            ]
        )

    def dev_scored_on(self) -> str:
        """What a saved version's dev scores were taken on, for its quality report."""
        return "dev" if self.dev_held_out else "train"


@dataclass(frozen=True)
class TrainingRecord:
    """What a checkpoint says of the training that made its classifier, besides the classifier itself."""

    base_weights_sha256: str  # the backbone's weights before training
    training_data_sha256: str
    train_config: TrainConfig
    dev_metrics: dict[str, Any]
    dev_scores: Scored | None


def save_fitted(
    path: str | Path,
    classifier: Classifier,
    method: Method,
    record: TrainingRecord,
    *,
    extra: dict[str, Any] | None = None,  # more manifest entries (see `save_classifier`)
    overwrite: bool = False,
) -> Path:
    """Step 4: `checkpoints.save_classifier`, with the dev scores kept for the version's report."""
    dev_scores = None if record.dev_scores is None else scores_record(record.dev_scores)
    return save_classifier(
        path,
        classifier,
        method,
        base_weights_sha256=record.base_weights_sha256,
        train_config=record.train_config,
        training_data_sha256=record.training_data_sha256,
        dev_metrics=record.dev_metrics,
        overwrite=overwrite,
        extra={**(extra or {}), "dev_scores": dev_scores},
    )


def fit_classifier(
    classifier: Classifier,
    method: Method,
    sets: FitSets,
    config: TrainConfig,
    *,
    progress: bool = True,
    on_step: Callable[[int, int, float], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], TrainResult, Scored | None]:
    """Steps 1-3 (`Estimator.fit`): train `classifier` (already `method.prepare`d) in place, choose its
    inference and confidence on dev and store every example; returns the dev metrics, the training
    result and the dev scores (None with fewer than 2 dev examples). `on_step` and `on_stage` are
    `training.train`'s: an exception they raise stops training there, and comes out of here."""
    train_set, dev_set = sets.train, sets.dev
    untuned_reader, tuning = classifier.reader, None
    if untuned_reader is not None:  # one tuning for both of the job's (step 3a's too): by all its examples
        tuning = job_reader_tuning(untuned_reader, len(sets.store.ids))
        tune_reader(classifier, train_set, config.seed, tuning, on_step=on_step, on_stage=on_stage)
    result = train(
        classifier,
        method,
        train_set.texts,
        train_set.labels,
        dev_set.texts,
        dev_set.labels,
        config,
        progress=progress,
        on_step=on_step,
        on_stage=on_stage,
    )
    dev_metrics: dict[str, Any] = {
        "accuracy": result.best.accuracy,
        "best_step": result.best.step,
        "step_budget": result.step_budget,
        "steps_run": result.steps_run,
    }
    # dev as the trained classifier serves it, embedded once for the choice of k, T and lambda, the
    # calibration and the served store (the last dev check's embeddings, where they are these already)
    dev = result.dev_embeddings
    if dev is None and len(dev_set.texts):
        dev = classifier.embed(dev_set.texts)
    elif dev is not None and classifier.reader is not None:  # the dev checks read P_LM alone: once, here
        dev = dataclasses.replace(
            dev, reader_vectors=classifier.reader.embed([as_string(t) for t in dev_set.texts])
        )
    if method.inference == "knn-interp" or classifier.reader is not None:
        rule = DEFAULT_RULE
        if config.few_dev_lam is not None and len(dev_set.texts) < FEW_DEV_PER_LABEL * len(classifier.labels):
            rule = dataclasses.replace(DEFAULT_RULE, lambdas=(config.few_dev_lam,))  # set, not chosen
            dev_metrics["lam_set"] = config.few_dev_lam
        classifier.knn, dev_metrics["accuracy_with_knn"] = choose_knn_on_dev(
            classifier, dev_set.texts, dev_set.labels, rule, embedded=dev
        )
        if dev is not None:  # each reader alone: the prompt's is `accuracy`, the neighbours' this
            p_knn = classifier.score(dev).p_knn
            dev_metrics["accuracy_knn_alone"] = float(np.mean(p_knn.argmax(1) == dev_set.labels))
    else:
        classifier.knn = dataclasses.replace(classifier.knn, lam=0.0)  # the prompt alone
    dev_scores = None
    if len(dev_set.texts) >= 2:
        dev_metrics["calibration"], dev_scores = calibrate_on_dev(classifier, dev_set, embedded=dev)
    if classifier.reader is not None and dev is not None and len(dev_set.texts) >= 2:  # step 2c
        classifier.min_similarity = min_similarity_on_dev(classifier, dev, dev_set.labels)
        dev_metrics["min_similarity"] = classifier.min_similarity
    if untuned_reader is not None and len(sets.store.ids) > len(train_set.texts):  # step 3a: dev's too
        classifier.reader = untuned_reader
        stored = LabelledTexts(sets.store.texts, classifier.label_indices(sets.store.labels), sets.store.ids)
        tune_reader(
            classifier, stored, config.seed, tuning, on_step=on_step, on_stage=on_stage, stage=READER_AGAIN
        )
        dev_metrics["reader_tuned_on"] = len(stored.texts)
    serve_store(classifier, sets.store, train_set, dev_set, dev)
    return dev_metrics, result, dev_scores


def min_similarity_on_dev(classifier: Classifier, dev: Embeddings, labels: np.ndarray) -> float | None:
    """Step 2c: the threshold on a query's similarity to its nearest stored example (the book as served)
    whose refusals cost at most REFUSAL_COST of dev accuracy (`out_of_scope.threshold_within_cost`);
    None with an empty store."""
    scores = classifier.score(dev)
    if scores.hits is None:
        return None
    correct = scores.probabilities.argmax(1) == np.asarray(labels)
    return threshold_within_cost(scores.hits.similarities[:, 0], correct, REFUSAL_COST)


def reader_config(reader: SentenceReader) -> ReaderConfig:
    """The settings `reader` was made or tuned with (its base's defaults where it has none)."""
    base = reader.base
    return reader.config or ReaderConfig(
        encoder=base.name, top_layers=base.top_layers, max_length=base.max_length
    )


def job_reader_tuning(reader: SentenceReader, examples: int) -> ReaderConfig:
    """How a job that holds `examples` examples tunes `reader` (`sentence_reader.job_tuning` on its
    settings, `reader_config`)."""
    return job_tuning(reader_config(reader), len(reader.base.layers), examples)


def tune_reader(
    classifier: Classifier,
    train_set: LabelledTexts,
    seed: int,
    tuning: ReaderConfig | None = None,
    *,
    on_step: Callable[[int, int, float], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
    stage: str = "reader",
) -> None:
    """Step 0b: the classifier's sentence reader, a copy of its own (the untrained one's is left as it
    was), tuned on the train examples by the contrastive loss (`SentenceReader.tune`), at `tuning` (its
    own config's settings where None: `reader_config`) and the training's seed. Tuning other top layers
    than the reader's base cuts at starts from the encoder's own, on the process's base of that cut. Its
    book is re-keyed by the tuned reader when next read. Step 3a calls it again, on every example, as
    `stage` READER_AGAIN."""
    reader = classifier.reader
    assert reader is not None
    if on_stage is not None:
        on_stage(stage)
    tuning = dataclasses.replace(tuning or reader_config(reader), seed=seed)
    report = None if on_step is None else (lambda step, loss: on_step(step + 1, tuning.steps, loss))
    if tuning.top_layers != reader.base.top_layers:
        reader = SentenceReader(shared_encoder(tuning, str(reader.base.device)))
    tuned = reader.copy()
    tuned.tune(
        [as_string(text) for text in train_set.texts], _label_names(classifier, train_set), tuning, report
    )
    classifier.reader = tuned


def choose_knn_on_dev(
    classifier: Classifier,
    dev_texts: Sequence[TextInput],
    dev_labels: np.ndarray,
    rule: SelectionRule = DEFAULT_RULE,
    *,
    embedded: Embeddings | None = None,
) -> tuple[KnnConfig, float]:
    """Step 2: k, T and lambda for a trained classifier's kNN interpolation, chosen on dev
    (`selection.py`); with dev accuracy.

    Dev alone is the evidence: the classifier was trained on the examples its store holds. Neighbours
    are scored as `classifier.knn` scores them. `embedded`: dev's embeddings under the classifier as it
    stands, when already taken.
    """
    base = classifier.knn
    dev = classifier.embed(dev_texts) if embedded is None else embedded
    k = min(max(rule.ks), len(classifier.store))
    hits = knn_search(classifier.knn_book(), classifier.knn_queries(dev), k, base.similarity)
    p_lm_dev = calibrated_p_lm(dev.lm_log_probs, classifier.label_bias)
    return select(Evidence(p_lm_dev, Split(dev_labels, hits)), rule, len(classifier.store), base)


def serve_store(
    classifier: Classifier,
    examples: StoreExamples,
    train_set: LabelledTexts,
    dev_set: LabelledTexts,
    dev: Embeddings | None,
) -> None:
    """Replace the training store (the train examples under their positions) with `examples` under their
    own ids, as the trained classifier serves. The keys already taken under the kept weights are kept: the
    training store's, and dev's (`dev`); only the examples in neither are embedded (a dev given apart may
    share ids with the train examples: theirs win)."""
    known: dict[int, tuple[TextInput, np.ndarray]] = {}
    if dev is not None:
        known.update(
            zip(dev_set.example_ids().tolist(), zip(dev_set.texts, dev.vectors, strict=True), strict=True)
        )
    train_keys = classifier.store.vectors_of(np.arange(len(train_set.texts), dtype=np.int64))
    known.update(
        zip(train_set.example_ids().tolist(), zip(train_set.texts, train_keys, strict=True), strict=True)
    )
    ids = np.asarray(examples.ids, dtype=np.int64)
    vectors = np.zeros((len(ids), classifier.backbone.hidden_size), dtype=np.float32)
    missing = []
    for row, (example_id, text) in enumerate(zip(ids.tolist(), examples.texts, strict=True)):
        if example_id in known and known[example_id][0] == text:
            vectors[row] = known[example_id][1]
        else:
            missing.append(row)
    if missing:
        vectors[missing] = classifier.embed_vectors([examples.texts[row] for row in missing]).vectors
    classifier.store = KnowledgeStore(classifier.backbone.hidden_size, device=classifier.backbone.device)
    classifier.add_embeddings(
        SlotVectors(vectors, np.zeros(len(ids), dtype=bool)), examples.labels, ids, texts=examples.texts
    )


def calibrate_on_dev(
    classifier: Classifier, dev_set: LabelledTexts, *, embedded: Embeddings | None = None
) -> tuple[dict[str, Any], Scored]:
    """Score dev as the classifier serves (its store holds the training examples), and adopt temperature
    scaling if it lowers the cross-validated ECE (`quality.calibrate`). Returns the calibration's record
    and the dev scores before it (T = 1), which the checkpoint keeps for the version's report. `embedded`:
    dev's embeddings under the classifier as it stands, when already taken."""
    classifier.confidence_temperature = 1.0
    scored = score_examples(
        classifier, dev_set.texts, _label_names(classifier, dev_set), dev_set.example_ids(), embedded=embedded
    )
    calibration = calibrate(scored)
    classifier.confidence_temperature = calibration.temperature
    return {key: round(v, 6) if isinstance(v, float) else v for key, v in vars(calibration).items()}, scored


def scores_record(scored: Scored) -> dict[str, list]:
    """Scored examples as JSON keeps them (probabilities to 6 decimals); `scored_from_record` reads them."""
    return {
        "ids": scored.ids.tolist(),
        "gold": scored.gold.tolist(),
        "probabilities": np.round(scored.probabilities.astype(np.float64), 6).tolist(),
    }


def scored_from_record(record: dict[str, list]) -> Scored:
    return Scored(
        np.asarray(record["ids"], dtype=np.int64),
        np.asarray(record["gold"], dtype=np.int64),
        np.asarray(record["probabilities"], dtype=np.float64).reshape(len(record["ids"]), -1),
    )


def _label_names(classifier: Classifier, texts: LabelledTexts) -> list[str]:
    return [classifier.labels[int(i)] for i in texts.labels]


def dev_check(classifier: Classifier, train: StoreExamples, dev: LabelledTexts) -> DevScore | None:
    """The final prediction (kNN interpolation included) scored on dev; None with no dev example.

    The classifier predicts with a store of the train examples alone, embedded by its own weights, so no
    dev example is its own neighbour. The classifier itself is left as it was. `fit_classifier` scores
    dev this way too (its `Scored` dev scores): `served_dev_score` reads a job's score from them.
    """
    if len(dev.texts) == 0:
        return None
    store = KnowledgeStore(classifier.backbone.hidden_size, device=classifier.backbone.device)
    scoring = dataclasses.replace(classifier, store=store)
    scoring.add_examples(train.texts, train.labels, ids=train.ids)
    scored = score_examples(scoring, dev.texts, _label_names(scoring, dev), dev.example_ids())
    return DevScore.of(scored.probabilities, scored.gold)


def served_dev_score(dev_scores: Scored, temperature: float, ids: Sequence[int] | None = None) -> DevScore:
    """`dev_check`'s score, from the dev scores `fit_classifier` took before calibration (T = 1) and the
    confidence temperature it then adopted: the same distributions, without scoring dev again. `ids`: the
    dev examples to read (the promotion gate's, where the serving version learnt some); default all."""
    rows = slice(None) if ids is None else np.isin(dev_scores.ids, np.asarray(ids, dtype=np.int64))
    return DevScore.of(with_temperature(dev_scores.probabilities[rows], temperature), dev_scores.gold[rows])


def dev_accuracy(classifier: Classifier, train: StoreExamples, dev: LabelledTexts) -> float | None:
    """`dev_check`'s accuracy; None with no dev example."""
    check = dev_check(classifier, train, dev)
    return None if check is None else check.accuracy
