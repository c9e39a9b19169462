"""Two readers of one book: a classifier with a sentence reader reads P_kNN from the store's examples keyed
by the reader's embeddings (`reader_book.py`), `fit` tunes the reader (`fitting.tune_reader`), and a
checkpoint keeps its top layers; on the tiny causal LM and the tiny random MPNet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openbook
import pytest
import torch
from openbook.artifacts import CheckpointError
from openbook.backbone import BackboneConfig, load_backbone
from openbook.knn import KnnConfig
from openbook.sentence_reader import ReaderConfig, shared_encoder

TEMPLATE = "{text} It was {mask}"
LABELS = {"0": "bad", "1": "good"}
TEXTS = [
    "the movie was great and fun",
    "a good film with a great cast",
    "the plot was great fun",
    "it was terrible and boring",
    "a bad film , it was awful",
    "the cast was awful",
] * 2
GOLD = ["1", "1", "1", "0", "0", "0"] * 2
QUERIES = ["a great film", "an awful movie"]
TRAIN = {"steps": 3, "eval_every": 3, "batch_size": 4, "lr": 1e-3}


def _reader(reader_mpnet_dir: Path, **changes) -> ReaderConfig:
    return ReaderConfig(
        **({"encoder": str(reader_mpnet_dir), "max_length": 64, "steps": 8, "batch_size": 6} | changes)
    )


def _estimator(causal_dir: Path, reader_mpnet_dir: Path, method: str = "prompt-ft") -> openbook.Estimator:
    backbone = load_backbone(BackboneConfig(name=str(causal_dir), max_length=48))
    return openbook.create_classifier(
        TEMPLATE, LABELS, backbone=backbone, method=method, reader=_reader(reader_mpnet_dir)
    )


def test_the_reader_keys_the_book_and_p_knn_reads_its_neighbours(causal_dir: Path, reader_mpnet_dir: Path):
    classifier = _estimator(causal_dir, reader_mpnet_dir).classifier
    classifier.knn = KnnConfig(lam=0.5)
    ids = classifier.add_examples(TEXTS[:6], GOLD[:6])
    book = classifier.knn_book()
    reader = classifier.reader
    assert reader is not None and book is not classifier.store
    assert book.dim == reader.base.hidden_size
    np.testing.assert_array_equal(book.ids(), ids)
    np.testing.assert_allclose(book.vectors_of(ids), reader.embed(TEXTS[:6]), atol=1e-6)

    prediction = classifier.predict([TEXTS[0]])[0]
    # the query's nearest neighbour in the reader's space is its own stored copy
    assert prediction.neighbours[0].id == ids[0] and prediction.neighbours[0].similarity == pytest.approx(
        1, abs=1e-5
    )
    assert prediction.p_knn is not None
    mixed = {label: 0.5 * prediction.p_knn[label] + 0.5 * prediction.p_lm[label] for label in LABELS}
    assert prediction.probabilities == pytest.approx(mixed, abs=1e-5)


def test_the_book_follows_the_store(causal_dir: Path, reader_mpnet_dir: Path):
    classifier = _estimator(causal_dir, reader_mpnet_dir).classifier
    classifier.knn = KnnConfig(lam=0.5)
    ids = classifier.add_examples(TEXTS[:6], GOLD[:6])
    classifier.remove_examples(ids[:2])
    np.testing.assert_array_equal(classifier.knn_book().ids(), ids[2:])
    classifier.add_examples(["a great film"], ["1"], ids=[ids[3]])  # replaced: new text, new label
    book = classifier.knn_book()
    assert book.labels_of([ids[3]]).tolist() == [1]
    np.testing.assert_allclose(
        book.vectors_of([ids[3]]), classifier.reader.embed(["a great film"]), atol=1e-6
    )


def test_lambda_on_the_store_reads_the_readers_neighbours(causal_dir: Path, reader_mpnet_dir: Path):
    classifier = _estimator(causal_dir, reader_mpnet_dir).classifier  # untrained: lambda chosen on the store
    assert classifier.knn.lam is None
    classifier.add_examples(TEXTS[:6], GOLD[:6])
    lam = classifier.served_knn().lam
    assert lam is not None and 0 <= lam <= 1


def test_fit_tunes_a_copy_of_the_reader_and_a_checkpoint_keeps_it(
    causal_dir: Path, reader_mpnet_dir: Path, tmp_path: Path
):
    estimator = _estimator(causal_dir, reader_mpnet_dir)
    untrained_reader = estimator.classifier.reader
    stages: list[str] = []
    report = estimator.fit(TEXTS, GOLD, dev=0.25, seed=1, on_stage=stages.append, **TRAIN)
    reader = estimator.classifier.reader
    assert stages[0] == "reader" and untrained_reader.layers is None  # the untrained one untouched
    assert reader is not None and reader.layers is not None
    # 12 examples: all the encoder's layers tuned, kept at rank 32, on a base over the same weights
    assert (reader.base.top_layers, reader.config.adapters, reader.config.adapters_from) == (5, 32, "svd")
    assert reader.base.model is untrained_reader.base.model and untrained_reader.base.top_layers == 4
    assert estimator.classifier.knn.lam is not None  # chosen on dev: prompt-ft mixes the reader's neighbours
    assert 0 <= report.dev_metrics["accuracy_knn_alone"] <= 1  # each reader alone: the neighbours' too
    np.testing.assert_array_equal(estimator.classifier.knn_book().ids(), estimator.classifier.store.ids())

    first = openbook.load(estimator.save(tmp_path / "a"))
    second = openbook.load(estimator.save(tmp_path / "b"))
    assert first.classifier.reader is not None and second.classifier.reader is not None
    assert first.classifier.reader.base is second.classifier.reader.base  # one base encoder in memory
    for key, tensor in reader.state_dict().items():
        assert torch.equal(first.classifier.reader.state_dict()[key], tensor)
    before = estimator.predict(QUERIES)
    after = first.predict(QUERIES)
    for b, a in zip(before, after, strict=True):
        assert a.label == b.label and a.probabilities == pytest.approx(b.probabilities, abs=1e-5)
        assert [n.id for n in a.neighbours] == [n.id for n in b.neighbours]


def test_a_job_tunes_all_the_layers_where_its_examples_are_few_and_its_own_top_layers_above(
    causal_dir: Path, reader_mpnet_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    from openbook.sentence_reader import SentenceReader

    tunings: list[ReaderConfig] = []
    tune = SentenceReader.tune
    monkeypatch.setattr(
        SentenceReader, "tune", lambda self, *args, **kw: tunings.append(args[2]) or tune(self, *args, **kw)
    )
    for few, expected in [(12, (5, 32, "svd", 2e-5)), (11, (4, 0, "lora", 1e-4)), (0, (4, 0, "lora", 1e-4))]:
        tunings.clear()  # 12 examples, 3 held out for dev: both tunings by the job's 12
        backbone = load_backbone(BackboneConfig(name=str(causal_dir), max_length=48))
        reader = _reader(reader_mpnet_dir, few_examples=few)
        estimator = openbook.create_classifier(TEMPLATE, LABELS, backbone=backbone, reader=reader)
        estimator.fit(TEXTS, GOLD, dev=0.25, seed=1, **TRAIN)
        assert [(c.top_layers, c.adapters, c.adapters_from, c.lr) for c in tunings] == [expected] * 2, few
        assert estimator.classifier.reader.base.top_layers == expected[0]


def test_a_held_out_dev_chooses_and_then_the_served_reader_learns_every_example(
    causal_dir: Path, reader_mpnet_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    from openbook.sentence_reader import SentenceReader

    tuned_on: list[tuple[int, bool]] = []  # (texts, whether it started from the untuned layers)
    tune = SentenceReader.tune

    def spy(self, texts, labels, config, on_step=None):
        tuned_on.append((len(texts), self.layers is None))
        return tune(self, texts, labels, config, on_step)

    monkeypatch.setattr(SentenceReader, "tune", spy)
    estimator = _estimator(causal_dir, reader_mpnet_dir)
    stages: list[str] = []
    report = estimator.fit(TEXTS, GOLD, dev=0.25, seed=1, on_stage=stages.append, **TRAIN)
    held_out = len(report.dev_ids)
    assert 0 < held_out < len(TEXTS)
    assert tuned_on == [(len(TEXTS) - held_out, True), (len(TEXTS), True)]  # both from the untuned layers
    assert stages.index("reader-again") > stages.index("training")
    assert report.dev_metrics["reader_tuned_on"] == len(TEXTS)
    classifier = estimator.classifier
    ids = classifier.store.ids()
    np.testing.assert_allclose(
        classifier.knn_book().vectors_of(ids), classifier.reader.embed(TEXTS), atol=1e-5
    )

    tuned_on.clear()  # a dev given apart is not stored: nothing more to learn from, one tuning
    given = _estimator(causal_dir, reader_mpnet_dir).fit(
        TEXTS[:8], GOLD[:8], dev=(TEXTS[8:], GOLD[8:]), **TRAIN
    )
    assert tuned_on == [(8, True)] and "reader_tuned_on" not in given.dev_metrics


def test_a_reader_on_another_base_is_refused(causal_dir: Path, reader_mpnet_dir: Path, tmp_path: Path):
    estimator = _estimator(causal_dir, reader_mpnet_dir)
    estimator.fit(TEXTS, GOLD, dev=0.25, seed=1, **TRAIN)
    path = estimator.save(tmp_path / "ckpt")
    other = shared_encoder(_reader(reader_mpnet_dir, top_layers=1), "cpu")
    assert other is not estimator.classifier.reader.base
    manifest = (path / "manifest.json").read_text().replace('"top_layers": 5', '"top_layers": 1')
    (path / "manifest.json").write_text(manifest)
    with pytest.raises(CheckpointError, match="top layers"):
        openbook.load(path)


def test_fit_chooses_where_queries_stop_being_in_scope_and_a_checkpoint_keeps_it(
    causal_dir: Path, reader_mpnet_dir: Path, tmp_path: Path
):
    estimator = _estimator(causal_dir, reader_mpnet_dir)
    assert estimator.classifier.min_similarity is None  # untrained: nothing is out of scope
    report = estimator.fit(TEXTS, GOLD, dev=0.25, seed=1, **TRAIN)
    chosen = estimator.classifier.min_similarity
    assert chosen is not None and report.dev_metrics["min_similarity"] == chosen
    loaded = openbook.load(estimator.save(tmp_path / "fitted"))
    assert loaded.classifier.min_similarity == chosen

    predictions = loaded.predict(QUERIES)
    for prediction in predictions:
        assert prediction.out_of_scope == (prediction.neighbours[0].similarity < chosen)
    loaded.classifier.min_similarity = 2.0  # above any cosine: every query out of scope
    assert all(p.out_of_scope for p in loaded.predict(QUERIES))
    loaded.classifier.min_similarity = None
    assert not any(p.out_of_scope for p in loaded.predict(QUERIES))
