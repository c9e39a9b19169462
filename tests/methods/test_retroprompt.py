"""RetroPrompt's own parts: the kNN-guided loss weights, the demos option and its backbone checks, and
each demonstration mode trained, predicting and reloaded.

Its training and checkpoint round trip run beside prompt-ft's in tests/test_training.py; here, that the
default, which reads the store only at inference, trains as prompt-ft does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from openbook.demonstrations import DemoConfig
from openbook.methods.retroprompt import RetroPromptConfig, knn_guided_weights
from openbook.store import KnowledgeStore
from openbook.train_config import TrainConfig
from openbook.training import train

from tests.test_checkpoints import HALF_PROBABILITY_ATOL


def test_knn_guided_weights_are_leave_one_out() -> None:
    store = KnowledgeStore(2)
    vectors = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=np.float32)
    store.add(np.arange(3), vectors, np.array([0, 1, 1]))
    gold = torch.tensor([0, 1])
    config = RetroPromptConfig(knn_loss=True, loss_k=2, loss_temperature=0.1, min_p_knn=1e-6, beta=1.0)
    weights = knn_guided_weights(store, vectors[:2], np.array([0, 1]), gold, 2, config)
    # Example 0 is the only label-0 item: without itself its neighbours are all label 1, so p_kNN(gold) is
    # tiny and the weight large. Example 1 still has example 2 (same vector, label 1) as a neighbour.
    assert weights[0] > 10.0
    assert weights[1] < 1.5


def test_demonstrations_refuse_a_backbone_whose_embeddings_are_not_the_slot_size(
    albert_dir: Path, fresh_classifier
) -> None:
    with pytest.raises(ValueError, match="demos=text or retroprompt, which shows none"):
        fresh_classifier(albert_dir, "retroprompt/demos=neural")
    classifier, _ = fresh_classifier(albert_dir, "retroprompt")
    assert classifier.demos is None


def test_demos_option_parses_its_modes() -> None:
    from openbook.methods import build_method
    from openbook.methods.base import MethodError

    assert RetroPromptConfig().demos == "none"  # chosen on the judge set; the paper's are neural
    assert build_method("retroprompt/demos=none").spec == "retroprompt"  # written as the default it is
    assert build_method("retroprompt/demos=neural").spec == "retroprompt/demos=neural"
    text = build_method("retroprompt/demos=text/demo-texts=2").config
    assert text.demo_config() == DemoConfig(m=2, mode="text")
    assert build_method("retroprompt/demos=words").config.demo_config() == DemoConfig(m=4, mode="words")
    assert build_method("retroprompt/demos=none").config.demo_config() is None
    for bad, match in [
        ("retroprompt/demos=vectors", "demos must be one of neural, words, text, none"),
        ("retroprompt/demo-texts=2", "add demos=text"),
        ("retroprompt/demos=text/demo-m=2", "demo_m apply to neural and words"),
        ("retroprompt/demo-m=2", "demo-m set demonstrations, which are off: add demos=neural"),
        ("retroprompt/demo-temperature=0.5", "demo-temperature set demonstrations, which are off"),
        ("retroprompt/demos=text/demo-texts=0", "at least 1"),
    ]:
        with pytest.raises(MethodError, match=match):
            build_method(bad)


def test_word_demonstrations_refuse_a_head_narrower_than_the_slot(albert_dir: Path, fresh_classifier) -> None:
    with pytest.raises(ValueError, match="demos=words reads slot vectors"):
        fresh_classifier(albert_dir, "retroprompt/demos=words")
    classifier, _ = fresh_classifier(albert_dir, "retroprompt/demos=text")  # texts fit any backbone
    assert classifier.demos is not None and classifier.demos.mode == "text"


DISTINCT = [  # no text twice, so a retrieved text that equals the row's own would be the row itself
    "the movie was great and fun",
    "a good film with a great cast",
    "it was terrible and boring",
    "a bad film , it was awful",
    "great fun",
    "a good film",
    "it was awful",
    "a bad film",
]
QUICK = TrainConfig(steps=2, batch_size=4, lr=1e-3, eval_every=2, patience=5, warmup_ratio=0.0)


def test_text_demonstrations_in_training_never_show_an_example_itself(
    causal_dir: Path, toy, fresh_classifier, monkeypatch
) -> None:
    classifier, method = fresh_classifier(causal_dir, "retroprompt/demos=text/demo-texts=2")
    assert classifier.demo_encoder is not None
    shown: list[tuple[list, list]] = []
    encode = classifier.demo_encoder.encode

    def recording(texts, demos=None):
        shown.append((list(texts), [list(row) for row in demos]))
        return encode(texts, demos=demos)

    monkeypatch.setattr(classifier.demo_encoder, "encode", recording)
    labels = np.array([1, 1, 0, 0, 1, 1, 0, 0])
    dev = ["a great cast", "boring"]  # not in the store: no dev row can be shown its own text either
    train(classifier, method, DISTINCT, labels, dev, labels[:2], QUICK, progress=False)
    rows = [(text, row) for texts, demos in shown for text, row in zip(texts, demos, strict=True)]
    # calibration's pass over every training text, dev at steps 0 and 2, two steps of 4
    assert len(rows) == len(DISTINCT) + 2 * len(dev) + QUICK.steps * QUICK.batch_size
    for text, row in rows:
        assert text not in [demo for demo, _ in row]
        assert [label for _, label in row] == [0, 1, 0, 1]  # nearest of each class, then the second


@pytest.mark.parametrize(
    "spec", ["retroprompt/demos=neural", "retroprompt/demos=words", "retroprompt/demos=text"]
)
def test_each_demos_mode_trains_predicts_and_round_trips(
    model_dir: Path, spec: str, tmp_path: Path, toy, fresh_classifier, save_and_reload
) -> None:
    from openbook.methods import weights_sha256

    classifier, method = fresh_classifier(model_dir, spec)
    base_sha = weights_sha256(classifier.backbone.model)
    result = train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, QUICK, progress=False)
    assert len(result.losses) == QUICK.steps and np.isfinite(result.losses).all()
    plain = fresh_classifier(model_dir, "retroprompt")[0]
    plain.backbone.model.load_state_dict(classifier.backbone.model.state_dict())
    plain.store, plain.label_bias = classifier.store, classifier.label_bias
    before = classifier.predict(toy.texts[:4])
    assert [p.p_lm for p in before] != [p.p_lm for p in plain.predict(toy.texts[:4])]  # the demos are read
    loaded, _ = save_and_reload(classifier, method, model_dir, tmp_path, QUICK, result, base_sha)
    assert loaded.demos == classifier.demos
    # demos=text reads the neighbours' texts from the reloaded store (a missing one is a KeyError)
    for a, b in zip(loaded.predict(toy.texts[:4]), before, strict=True):
        assert a.label == b.label and a.p_lm == pytest.approx(b.p_lm, abs=HALF_PROBABILITY_ATOL)


def test_the_default_trains_as_prompt_ft_and_embeds_its_store_once(
    causal_dir: Path, toy, fresh_classifier, monkeypatch
) -> None:
    """The default retroprompt reads the store only at inference: its training is prompt-ft's, weight for
    weight, with no re-embedding on the way; the store is embedded from the start and under the kept
    weights, and holds their keys."""
    import dataclasses

    import openbook.training as training
    from openbook.methods import build_method, weights_sha256

    from tests.test_training import CONFIG

    calls: list[int] = []
    reembed = training.reembed
    monkeypatch.setattr(training, "reembed", lambda *a, **k: calls.append(1) or reembed(*a, **k))
    epoch = CONFIG.steps_per_epoch(len(toy.texts))
    config = dataclasses.replace(CONFIG, steps=3 * epoch, eval_every=epoch)
    trained = {}
    for spec in ("retroprompt", "prompt-ft"):
        classifier, method = fresh_classifier(causal_dir, spec)
        train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, config, progress=False)
        trained[spec] = (classifier, weights_sha256(classifier.backbone.model))
        if spec == "retroprompt":
            assert not method.uses_store_in_training and len(calls) == 2  # the first keys and the kept's
    assert trained["retroprompt"][1] == trained["prompt-ft"][1]
    classifier = trained["retroprompt"][0]
    keys = classifier.store.vectors_of(np.arange(len(toy.texts)))
    np.testing.assert_allclose(keys, classifier.embed_vectors(toy.texts).vectors, atol=1e-6)
    for spec in ("retroprompt/demos=neural", "retroprompt/knn-loss", "retroprompt/contrastive=1"):
        assert build_method(spec).uses_store_in_training, spec


MANY_LABELS_LENGTH = 128  # a tiny backbone's prompt room: 150 intents' pairs alone take over 400 tokens


def _intent_task(directory: Path, intent_names, spec: str):
    """A 150-intent task on a fresh tiny backbone at MANY_LABELS_LENGTH, prepared by `spec`'s method."""
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.classifier import Classifier
    from openbook.methods import build_method
    from openbook.prompting import Template, Verbalizer

    backbone = load_backbone(BackboneConfig(name=str(directory), max_length=MANY_LABELS_LENGTH))
    names = intent_names(backbone.tokenizer)
    verbalizer = Verbalizer(tuple(name.replace(" ", "_") for name in names), tuple(names))
    method = build_method(spec)
    return method.prepare(Classifier(backbone, Template("{text} It was {mask}"), verbalizer)), method, names


def test_the_default_method_trains_and_classifies_150_intents(causal_dir: Path, intent_names) -> None:
    """150 intents at max_length 128 with the default method, which shows no demonstrations: one forward
    a row, in training and in classify, and every label scored."""
    classifier, method, names = _intent_task(causal_dir, intent_names, "retroprompt")
    assert classifier.demos is None and classifier.demo_encoder is None
    texts = [f"please {name}" for name in names]
    labels = np.arange(len(names))
    result = train(classifier, method, texts, labels, texts[::15], labels[::15], QUICK, progress=False)
    assert len(result.losses) == QUICK.steps and np.isfinite(result.losses).all()
    predictions = classifier.predict(["please book the movie", "who wrote the book"])
    assert all(
        len(p.probabilities) == 150 and sum(p.probabilities.values()) == pytest.approx(1) for p in predictions
    )


@pytest.mark.parametrize("kind", ["masked", "causal"])
def test_neural_demonstrations_train_and_classify_150_intents(kind: str, request, intent_names, monkeypatch):
    """150 intents at max_length 128: each row shows its 16 nearest classes (every class its neighbours
    vote for among them), training steps and classifies with every label scored."""
    from openbook.knn import knn_distribution, knn_search

    classifier, method, names = _intent_task(
        request.getfixturevalue(f"{kind}_dir"), intent_names, "retroprompt/demos=neural"
    )
    assert classifier.demo_encoder is not None and classifier.demo_encoder.demo_classes == 16
    texts = [f"please {name}" for name in names]  # one example per intent
    labels = np.arange(len(names))
    dev = [f"{name} now" for name in names[::15]]
    shown: list[tuple[list, np.ndarray]] = []
    encode = classifier.demo_encoder.encode

    def recording(texts, demos=None, classes=None):
        shown.append((list(texts), classes))
        return encode(texts, demos=demos, classes=classes)

    monkeypatch.setattr(classifier.demo_encoder, "encode", recording)
    result = train(classifier, method, texts, labels, dev, labels[::15], QUICK, progress=False)
    assert len(result.losses) == QUICK.steps and np.isfinite(result.losses).all()
    assert shown and all(classes.shape == (len(rows), 16) for rows, classes in shown)
    shown.clear()
    queries = ["please book the movie", "good film now", "who wrote the book"]
    predictions = classifier.predict(queries)
    assert all(len(p.probabilities) == len(p.p_lm) == 150 for p in predictions)
    assert all(
        p.label in classifier.labels and sum(p.probabilities.values()) == pytest.approx(1)
        for p in predictions
    )
    ((encoded, classes),) = shown
    assert sorted(encoded) == sorted(queries)
    order = [queries.index(text) for text in encoded]
    vectors = classifier.embed(queries, vectors_only=True).vectors[order]
    knn = classifier.knn
    hits = knn_search(classifier.store, vectors, knn.k, knn.similarity)
    p_knn = knn_distribution(
        torch.from_numpy(hits.similarities),
        torch.from_numpy(hits.labels),
        150,
        knn.temperature,
        knn.standardise,
    )
    for row, p in enumerate(p_knn.numpy()):
        assert (np.diff(classes[row]) > 0).all()  # 16 distinct classes, in label order
        assert set(np.flatnonzero(p)) <= set(classes[row].tolist())  # every class P_kNN weighs is shown


def test_a_task_of_few_labels_shows_every_class_as_before(
    model_dir: Path, toy, fresh_classifier, monkeypatch
):
    """Up to `demo_classes` labels the demonstration pass is the one every class always had: no class is
    ranked, each label's pair in label order, each class vector the full retrieval's."""
    from openbook.classifier import Classifier
    from openbook.demonstrations import retrieve_demonstrations, to_input_space

    classifier, method = fresh_classifier(model_dir, "retroprompt/demos=neural")
    train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, QUICK, progress=False)

    def never(*_args, **_kwargs):
        raise AssertionError("a task of few labels ranks no class")

    monkeypatch.setattr(Classifier, "_p_knn", never)
    queries = classifier.embed(toy.texts[:4], vectors_only=True).vectors
    with torch.inference_mode():
        got, _ = classifier.label_scores(toy.texts[:4], queries)
        demos = retrieve_demonstrations(classifier.store, queries, 2, classifier.demos)  # every class
        assert classifier.demo_encoder is not None
        batch = classifier.demo_encoder.encode(toy.texts[:4])  # every class, in label order
        backbone = classifier.backbone
        injected = to_input_space(
            demos.vectors, backbone.input_embedding_table(), backbone.input_embedding_scale
        )
        expected = backbone.forward(batch, classifier.demo_encoder.label_token_ids, demo_vectors=injected)
    assert torch.equal(got, expected.label_log_probs)  # bit for bit


def test_demo_classes_option_and_the_prompt_check(causal_dir: Path, intent_names) -> None:
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.methods import build_method, check_prompt_fits
    from openbook.methods.base import MethodError
    from openbook.prompting import PromptError, Template, Verbalizer

    assert build_method("retroprompt").config.demo_config() is None  # none shown by default
    assert build_method("retroprompt/demos=neural").config.demo_config() == DemoConfig(classes=16)
    assert build_method("retroprompt/demos=neural/demo-classes=4").config.demo_config() == DemoConfig(
        classes=4
    )
    assert build_method("retroprompt/demos=text/demo-classes=4").config.demo_config() == DemoConfig(
        m=1, mode="text", classes=4
    )
    for bad, match in [
        ("retroprompt/demos=neural/demo-classes=0", "classes must be at least 1"),
        ("retroprompt/demo-classes=4", "demo-classes set demonstrations, which are off"),
    ]:
        with pytest.raises(MethodError, match=match):
            build_method(bad)
    backbone = load_backbone(BackboneConfig(name=str(causal_dir), max_length=48))
    names = intent_names(backbone.tokenizer)
    many = Verbalizer(tuple(map(str, range(150))), tuple(names))
    template = Template("{text} It was {mask}")
    for spec in (
        "retroprompt/demos=neural",
        "retroprompt/demos=text",
        "prompt-ft",
    ):  # 150 fit by showing fewer
        check_prompt_fits(backbone, template, many, build_method(spec))
    plain_budget = backbone.encoder(template, many).text_budget
    crowded = Template(" ".join(["the"] * (plain_budget - 2)) + " {text} It was {mask}")  # no room for a pair
    with pytest.raises(PromptError, match="template and one demonstration take"):
        check_prompt_fits(backbone, crowded, many, build_method("retroprompt/demos=neural"))
    for spec in ("retroprompt", "retroprompt/demos=text", "prompt-ft"):  # no pair to fit
        check_prompt_fits(backbone, crowded, many, build_method(spec))
    with pytest.raises(PromptError, match="no room for the input"):  # the template alone does not fit
        check_prompt_fits(
            backbone, Template(" ".join(["the"] * 60) + " {text} {mask}"), many, build_method("prompt-ft")
        )


@pytest.mark.real_backbone
def test_clinc150_builds_its_prompt_and_classifies_on_the_default_backbone(datasets_root: Path, monkeypatch):
    """clinc150's 150 intents on gemma3-270m at max_length 256 with neural demonstrations: the prompt
    (which showed every class's pair, 457 tokens, before) is built, and texts are classified with them."""
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.classifier import Classifier
    from openbook.data import read_split
    from openbook.methods import build_method
    from openbook.prompting import Template, Verbalizer

    root = datasets_root / "k-shot" / "clinc150"
    intents = dict(line.split("=", 1) for line in (root / "labels.txt").read_text().splitlines() if line)
    verbalizer = Verbalizer(tuple(intents), tuple(intents.values()))
    backbone = load_backbone(BackboneConfig(max_length=256))
    classifier = build_method("retroprompt/demos=neural").prepare(
        Classifier(backbone, Template("Query: {text}\nIntent: {mask}"), verbalizer)
    )
    assert classifier.demo_encoder is not None and classifier.demo_encoder.demo_classes == 16
    train = read_split(root / "10-13" / "train.csv")[:2]  # two examples of two intents: P_kNN weighs both
    classifier.add_examples([e.text for e in train], [e.label for e in train])
    encoded = []
    encode = classifier.demo_encoder.encode
    monkeypatch.setattr(
        classifier.demo_encoder,
        "encode",
        lambda texts, classes=None: encoded.append(classes) or encode(texts, classes=classes),
    )
    texts = [e.text for e in read_split(root / "test.csv")[:2]]
    predictions = classifier.predict(texts)
    (classes,) = encoded
    assert classes.shape == (2, 16)
    stored = set(classifier.label_indices([e.label for e in train]).tolist())
    assert all(stored <= set(row.tolist()) for row in classes)  # the neighbours' intents are all shown
    assert all(len(p.probabilities) == 150 and p.label in intents for p in predictions)
