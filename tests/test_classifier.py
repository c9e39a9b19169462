import dataclasses
from math import comb

import numpy as np
import pytest
import torch
from openbook.classifier import Classifier
from openbook.knn import KnnConfig
from openbook.prompting import PromptError, Template, Verbalizer

TEMPLATE = Template("{text} It was {mask}")
VERBALIZER = Verbalizer.parse("neg=bad,pos=good")
TRAIN = [
    "the movie was great and fun",
    "a good film with a great cast",
    "it was terrible and boring",
    "a bad film",
]
TRAIN_LABELS = ["pos", "pos", "neg", "neg"]


@pytest.fixture()
def classifier(backbone):
    return Classifier(backbone, TEMPLATE, VERBALIZER, knn=KnnConfig(k=3, temperature=0.5, lam=0.4))


def test_prediction_carries_lm_knn_and_neighbours(classifier):
    ids = classifier.add_examples(TRAIN, TRAIN_LABELS, ids=[10, 11, 12, 13])
    assert ids.tolist() == [10, 11, 12, 13] and len(classifier.store) == 4
    assert classifier.store.texts_of(ids) == TRAIN  # kept with the entries, for textual demonstrations
    (prediction,) = classifier.predict(["the movie was great and fun"])
    assert len(prediction.neighbours) == 3
    top = prediction.neighbours[0]
    assert top.id == 10 and top.label == "pos" and top.similarity == pytest.approx(1.0, abs=1e-5)
    assert prediction.p_knn is not None
    for label in ("neg", "pos"):
        expected = 0.4 * prediction.p_knn[label] + 0.6 * prediction.p_lm[label]
        assert prediction.probabilities[label] == pytest.approx(expected, abs=1e-6)
    assert prediction.label == max(prediction.probabilities, key=prediction.probabilities.get)
    assert sum(prediction.probabilities.values()) == pytest.approx(1.0, abs=1e-6)


def test_empty_store_predicts_from_the_lm_alone(classifier):
    (prediction,) = classifier.predict(["a good film"])
    assert prediction.p_knn is None and prediction.neighbours == ()
    assert prediction.probabilities == pytest.approx(prediction.p_lm)


def test_label_bias_shifts_p_lm(classifier):
    plain = classifier.predict(["a good film"])[0].p_lm
    classifier.label_bias = np.array([0.0, np.log(4.0)], dtype=np.float32)
    shifted = classifier.predict(["a good film"])[0].p_lm
    ratio_plain = plain["pos"] / plain["neg"]
    assert shifted["pos"] / shifted["neg"] == pytest.approx(ratio_plain / 4, rel=1e-4)


def test_leave_one_out_scores_never_use_the_query_itself(classifier):
    ids = classifier.add_examples(TRAIN, TRAIN_LABELS)
    embeddings = classifier.embed(TRAIN)
    scores = classifier.score(embeddings, exclude_ids=ids)
    assert scores.hits is not None
    assert not (scores.hits.ids == ids[:, None]).any()
    with_self = classifier.score(embeddings)
    assert with_self.hits is not None and (with_self.hits.ids[:, 0] == ids).all()


def test_unknown_label_and_a_text_of_the_wrong_shape_leave_the_store_untouched(classifier):
    classifier.add_examples(TRAIN[:2], TRAIN_LABELS[:2])
    with pytest.raises(PromptError, match="unknown label"):
        classifier.add_examples(["a text", "another"], ["pos", "meh"])
    with pytest.raises(PromptError, match="must be a string"):
        classifier.add_examples(["a text", ("a", "pair")], ["pos", "neg"])
    assert len(classifier.store) == 2


def test_truncation_is_reported(classifier):
    (prediction,) = classifier.predict([" ".join(["the movie was great"] * 50)])
    assert prediction.truncated


def test_demonstrations_change_p_lm_but_not_the_store_keys(backbone):
    from openbook.demonstrations import DemoConfig

    plain = Classifier(backbone, TEMPLATE, VERBALIZER)
    demo = Classifier(backbone, TEMPLATE, VERBALIZER, demos=DemoConfig(m=2, temperature=0.5))
    for c in (plain, demo):
        c.add_examples(TRAIN, TRAIN_LABELS)
    query = ["a good film with a great cast , fun"]
    with torch.no_grad():
        a, b = plain.embed(query), demo.embed(query)
    np.testing.assert_allclose(a.vectors, b.vectors, atol=1e-5)  # kNN keys/queries: plain prompt
    assert not np.allclose(a.lm_log_probs, b.lm_log_probs)


def test_store_keys_are_embedded_without_scoring_a_label(backbone, monkeypatch):
    """`embed_vectors` gives `embed`'s vectors, and adding examples never asks for label scores."""
    task = Classifier(backbone, TEMPLATE, Verbalizer.parse("neg=boring,pos=wonderful"), batch_size=3)
    embedded = task.embed(TRAIN)
    keys = task.embed_vectors(TRAIN)
    np.testing.assert_allclose(keys.vectors, embedded.vectors, atol=1e-6, rtol=0)
    np.testing.assert_array_equal(keys.truncated, embedded.truncated)

    def no_scoring(*_args, **_kwargs):
        raise AssertionError("label scores were computed for store keys")

    monkeypatch.setattr(backbone, "forward", no_scoring)
    ids = task.add_examples(TRAIN, TRAIN_LABELS)
    np.testing.assert_allclose(task.store.vectors_of(ids), embedded.vectors, atol=1e-6, rtol=0)


def test_with_demonstrations_only_the_demonstration_pass_scores_labels(backbone, monkeypatch):
    """The first pass only finds the retrieval query; the labels are scored once, with the demonstrations."""
    from openbook.demonstrations import DemoConfig

    task = Classifier(backbone, TEMPLATE, VERBALIZER, demos=DemoConfig(m=2, temperature=0.5), batch_size=2)
    task.add_examples(TRAIN, TRAIN_LABELS)
    expected = task.embed(TRAIN)
    scored = []
    forward = backbone.forward

    def counted(batch, *args, **kwargs):
        scored.append(batch)
        return forward(batch, *args, **kwargs)

    monkeypatch.setattr(backbone, "forward", counted)
    got = task.embed(TRAIN)
    assert len(scored) == 2 and all(b.demo_index is not None for b in scored)  # 2 batches, demo layout
    np.testing.assert_allclose(got.lm_log_probs, expected.lm_log_probs, atol=1e-6)


def test_label_scoring_is_a_checked_option_that_reaches_the_backbone(backbone):
    with pytest.raises(ValueError, match="label_scoring must be one of exact, vectors"):
        Classifier(backbone, TEMPLATE, VERBALIZER, label_scoring="approximate")  # type: ignore[arg-type]
    words = Verbalizer.parse("neg=boring,pos=wonderful")
    exact = Classifier(backbone, TEMPLATE, words)
    vectors = Classifier(backbone, TEMPLATE, words, label_scoring="vectors")
    batch = exact.encoder.encode(TRAIN)
    with torch.no_grad():
        expected = backbone.forward(batch, exact.encoder.label_token_ids, scoring="vectors").label_log_probs
    got = vectors.embed(TRAIN)
    np.testing.assert_allclose(got.lm_log_probs, expected.numpy(), atol=1e-6)
    np.testing.assert_allclose(got.vectors, exact.embed(TRAIN).vectors, atol=1e-6)  # keys do not change
    assert not np.allclose(got.lm_log_probs, exact.embed(TRAIN).lm_log_probs, atol=1e-3)


def test_a_class_without_examples_is_injected_at_the_mean_embedding_the_model_reads(any_backbone):
    """The inputs_embeds the model receives hold, at the placeholder of a class with no examples, the mean
    of the embedding module's outputs (on Gemma 3 the table times sqrt(hidden size), not the raw rows)."""
    from openbook.demonstrations import DemoConfig

    backbone = any_backbone
    demo = Classifier(backbone, TEMPLATE, VERBALIZER, demos=DemoConfig(m=2))
    demo.add_examples(TRAIN[:2], TRAIN_LABELS[:2])  # "pos" only
    seen: list[torch.Tensor] = []
    hook = backbone.model.register_forward_pre_hook(
        lambda _m, _args, kwargs: seen.append(kwargs["inputs_embeds"]), with_kwargs=True
    )
    try:
        with torch.no_grad():
            demo.embed(["a bad film"])
    finally:
        hook.remove()
    batch = demo.demo_encoder.encode(["a bad film"])
    vocabulary = torch.arange(len(backbone.tokenizer), device=backbone.device)
    token_mean = backbone.input_embeddings(vocabulary).float().mean(0)
    neg = demo.labels.index("neg")
    injected = seen[-1][0, batch.demo_index[0, neg]]  # the last pass is the one with demonstrations
    torch.testing.assert_close(injected.float(), token_mean, atol=1e-5, rtol=1e-4)


def test_an_empty_batch_is_a_clear_error(classifier):
    with pytest.raises(PromptError, match="no texts"):
        classifier.predict([])


def binomial_tail(successes: int, trials: int, p: float = 0.5) -> float:
    """The chance of at least `successes` of `trials` right by coin flips."""
    return sum(comb(trials, k) * p**k * (1 - p) ** (trials - k) for k in range(successes, trials + 1))


@pytest.mark.real_backbone
def test_zero_shot_sst2_beats_chance_on_the_default_backbone(datasets_root):
    """One smoke test on the real default backbone and real data: zero-shot beats chance.

    "Beats chance" is a one-sided binomial test at the 5% level: the chance of
    getting at least this many of 64 balanced-ish sentences right by coin flips.
    """
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.data import read_split
    from openbook.prompting import get_preset

    sst2 = datasets_root / "k-shot" / "SST-2"
    backbone = load_backbone(BackboneConfig(max_length=128))  # the default, converted once into the cache
    preset = get_preset("SST-2")
    classifier = Classifier(backbone, *preset.prompt(backbone.kind))
    # Domain calibration (the eval default, chosen on dev): the mean prediction over the unlabelled
    # 16-shot training texts of one seed.
    train_texts = [e.text for e in read_split(sst2 / "16-13" / "train.tsv")]
    classifier.label_bias = classifier.calibration_bias("domain", classifier.embed(train_texts).lm_log_probs)
    test = read_split(sst2 / "test.tsv")[:64]
    gold = classifier.label_indices([e.label for e in test])
    predictions = classifier.predict([e.text for e in test])
    predicted = classifier.label_indices([p.label for p in predictions])
    correct = int((predicted == gold).sum())
    majority = max(np.bincount(gold)) / len(gold)
    assert correct / len(gold) > majority, f"{correct}/64 does not beat the majority class ({majority:.2f})"
    assert binomial_tail(correct, len(gold)) < 0.05, f"{correct}/64 is not significantly above chance"


def test_binomial_tail():
    assert binomial_tail(0, 10) == pytest.approx(1.0)
    assert binomial_tail(10, 10) == pytest.approx(0.5**10)


def _packaged_backbone(name: str):
    """A registered backbone; the test is skipped where its weights' package is not installed."""
    import importlib.metadata

    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.models import PACKAGED_MODELS, model_cache_dir

    packaged = PACKAGED_MODELS[name]
    converted = (model_cache_dir() / name / "config.json").exists()
    try:
        importlib.metadata.distribution(packaged.distribution)
    except importlib.metadata.PackageNotFoundError:
        if not converted:
            pytest.skip(f"{name} is not installed ({packaged.install_hint})")
    return load_backbone(BackboneConfig(name=name))


# Plain probes a backbone gets wrong, as measured and reported (docs/results.md, "Where the accuracy
# targets stand": the first-use target is missed on gemma3-270m by this probe). Listed so that the test
# fails when one of them comes out right too, and the report has to change with it.
FIRST_USE_MISSES = {"gemma3-270m": {"It broke the first time I used it."}}


@pytest.fixture(scope="module", params=["gemma3-270m", "smollm2-135m"])
def fresh_task(request: pytest.FixtureRequest):
    """A fresh task as the service starts one (content-free calibration, the default kNN settings), with
    four examples per label and λ chosen on them (`experiments.first_use_probes`)."""
    from research.experiments.first_use_probes import fresh_task

    classifier, ids = fresh_task(_packaged_backbone(request.param))
    assert dataclasses.replace(classifier.knn, lam=KnnConfig().lam) == KnnConfig()  # the defaults but λ
    return request.param, classifier, ids


@pytest.mark.real_backbone
def test_a_fresh_task_knows_near_paraphrases_of_its_examples(fresh_task):
    """Nothing trained: a near-paraphrase of an example is classified right, its nearest neighbour is that
    example, and P_kNN puts at least 0.8 on its label."""
    from research.experiments.first_use_probes import EXAMPLES, PARAPHRASES

    _, classifier, ids = fresh_task
    paraphrased = classifier.predict(PARAPHRASES)
    for (example, label), example_id, prediction in zip(EXAMPLES, ids, paraphrased, strict=True):
        assert prediction.label == label, example
        assert prediction.neighbours[0].id == example_id, example  # the example it restates
        assert prediction.p_knn is not None and prediction.p_knn[label] >= 0.8, (example, prediction.p_knn)


@pytest.mark.real_backbone
def test_a_fresh_task_classifies_plain_probes(fresh_task):
    """Nothing trained: plain probes are classified right, but for the misses reported for the backbone."""
    from research.experiments.first_use_probes import PROBES

    name, classifier, _ = fresh_task
    probes = classifier.predict([text for text, _ in PROBES])
    wrong = {text for (text, label), p in zip(PROBES, probes, strict=True) if p.label != label}
    assert wrong == FIRST_USE_MISSES.get(name, set())


def test_auto_label_scoring_is_exact_up_to_16_labels_and_label_vectors_above():
    from openbook.word_scores import VECTORS_ABOVE, resolve_label_scoring

    assert VECTORS_ABOVE == 16  # the rule's threshold (docs/decisions.md, "Many labels")
    assert [resolve_label_scoring("auto", n) for n in (2, 16, 17, 150)] == [
        "exact",
        "exact",
        "vectors",
        "vectors",
    ]
    assert resolve_label_scoring("exact", 150) == "exact" and resolve_label_scoring("vectors", 2) == "vectors"
    with pytest.raises(ValueError, match="one of auto, exact, vectors"):
        resolve_label_scoring("fast", 2)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", [None, "neural", "text"])
def test_a_text_is_tokenized_once_per_predict_and_tokenized_texts_not_again(backbone, mode, count_tokenized):
    from openbook.demonstrations import DemoConfig

    demos = None if mode is None else DemoConfig(m=2, temperature=0.5, mode=mode)
    task = Classifier(backbone, TEMPLATE, VERBALIZER, demos=demos, batch_size=2)  # several chunks
    task.add_examples(TRAIN, TRAIN_LABELS)
    texts = ["great fun", "a terrible film , boring", "what is the answer", "yes it is true", "no"]
    seen = count_tokenized(backbone.tokenizer)
    expected = task.predict(texts)
    assert {text: seen[text] for text in texts} == dict.fromkeys(texts, 1)
    tokenized = task.encoder.tokenize(texts)  # as a server does, to size its batch
    seen.clear()
    got = task.predict(tokenized)
    assert not any(seen[text] for text in texts)
    assert [p.probabilities for p in got] == [p.probabilities for p in expected]  # bit for bit
    assert [p.neighbours for p in got] == [p.neighbours for p in expected]
