"""Mixed-task batches (openbook/mixed.py): LoRA tasks on one base share a forward, and each row keeps
its own task's answer."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.methods import build_method
from openbook.methods.lora import adapter_parameters
from openbook.mixed import MixedForward, lora_updates, stack
from openbook.prompting import Template, Verbalizer

TEXTS = [
    "the movie was great and fun",
    "it was terrible and boring",
    "a good film",
    "a bad film , it was awful",
]
# Float32 throughout. A row padded wider than in its own batch attends to more masked positions, whose
# softmax weights are exactly zero; what changes is only the order of float32 sums, ~1e-7 relative.
ATOL = 1e-5


def lora_task(base: Backbone, template: str, labels: str, seed: int) -> Classifier:
    """A LoRA task on `base` with random adapters (B starts at zero, which would leave every task alike)."""
    method = build_method("lora")
    classifier = method.prepare(Classifier(base, Template(template), Verbalizer.parse(labels)))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in adapter_parameters(classifier.backbone).values():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return classifier


@pytest.fixture
def tasks(backbone: Backbone) -> list[Classifier]:
    found = [
        lora_task(backbone, "{text} It was {mask}", "neg=bad,pos=good", seed=1),
        lora_task(
            backbone, "{text} It was {mask}", "neg=bad,pos=good", seed=2
        ),  # same prompt, other adapters
        lora_task(backbone, "{text} The film was {mask}", "a=great,b=terrible,c=fun", seed=3),
    ]
    found[0].add_examples(TEXTS[:2], ["pos", "neg"])
    found[2].add_examples(TEXTS, ["a", "b", "c", "b"])
    return found


def test_each_row_gets_its_own_tasks_prediction(backbone: Backbone, tasks: list[Classifier]) -> None:
    parts = [(tasks[0], TEXTS[:3]), (tasks[1], TEXTS), (tasks[2], TEXTS[1:])]
    mixer = MixedForward(backbone)
    assert all(mixer.mixes(task) for task in tasks)
    mixed = mixer.predict(parts)
    for (task, texts), got in zip(parts, mixed, strict=True):
        alone = task.predict(texts)
        assert [p.label for p in got] == [p.label for p in alone]
        for g, a in zip(got, alone, strict=True):
            for field in ("probabilities", "p_lm"):
                np.testing.assert_allclose(
                    list(getattr(g, field).values()), list(getattr(a, field).values()), atol=ATOL
                )
            assert [n.id for n in g.neighbours] == [n.id for n in a.neighbours]
    # The two tasks with one prompt differ only in their adapters: the same text, two answers.
    first, second = mixed[0][0].p_lm["pos"], mixed[1][0].p_lm["pos"]
    assert abs(first - second) > 1e-3


def test_slot_vectors_match_each_tasks_own_forward(backbone: Backbone, tasks: list[Classifier]) -> None:
    mixer = MixedForward(backbone)
    parts = [(task, TEXTS) for task in tasks]
    for (task, texts), got in zip(parts, mixer.embed(parts), strict=True):
        alone = task.embed(texts, vectors_only=True)
        np.testing.assert_allclose(got.vectors, alone.vectors, atol=ATOL)
        np.testing.assert_allclose(got.lm_log_probs, alone.lm_log_probs, atol=ATOL)


def test_the_base_and_its_other_tasks_are_untouched(backbone: Backbone, tasks: list[Classifier]) -> None:
    plain = Classifier(backbone, Template("{text} It was {mask}"), Verbalizer.parse("neg=bad,pos=good"))
    before = plain.embed(TEXTS).lm_log_probs
    MixedForward(backbone).predict([(task, TEXTS) for task in tasks])
    np.testing.assert_array_equal(plain.embed(TEXTS).lm_log_probs, before)
    assert not lora_updates(backbone)  # no adapter was injected into the base itself


def test_only_lora_tasks_on_this_base_mix(
    backbone: Backbone, causal_backbone: Backbone, masked_backbone: Backbone
):
    mixer = MixedForward(backbone)
    plain = Classifier(backbone, Template("{text} It was {mask}"), Verbalizer.parse("neg=bad,pos=good"))
    assert not mixer.mixes(plain)  # no adapters: runs on its own
    prompted = build_method("dart").prepare(Classifier(backbone, plain.template, plain.verbalizer))
    assert not mixer.mixes(prompted)  # a trainable prompt changes the input, not the projections
    other = causal_backbone if backbone is masked_backbone else masked_backbone
    assert not mixer.mixes(lora_task(other, "{text} It was {mask}", "neg=bad,pos=good", seed=1))
    adapted = lora_task(backbone, "{text} It was {mask}", "neg=bad,pos=good", seed=1)
    assert mixer.mixes(adapted)
    adapted.label_scoring = "vectors"
    assert not mixer.mixes(adapted)  # the shared forward scores every part's words exactly
    adapted.label_scoring = "exact"
    adapted.reader = object()  # type: ignore[assignment]  # any reader: its embeddings are its own forward
    assert not mixer.mixes(adapted)


def test_stack_pads_each_batch_to_the_widest(backbone: Backbone, tasks: list[Classifier]) -> None:
    short, long = tasks[0].encoder.encode(["a good film"]), tasks[2].encoder.encode([TEXTS[3]])
    left = backbone.kind == "causal"
    batch = stack([short, long], tasks[0].encoder.pad_id, left=left)
    width = long.input_ids.shape[1]
    assert batch.input_ids.shape == (2, width)
    extra = width - short.input_ids.shape[1]
    assert int(batch.attention_mask[0].sum()) == int(short.attention_mask.sum())
    slot = int(batch.slot_index[0])
    assert int(batch.input_ids[0, slot]) == int(short.input_ids[0, int(short.slot_index[0])])
    assert slot == int(short.slot_index[0]) + (extra if left else 0)


def test_a_mixer_forgets_the_adapters_of_a_dropped_task(backbone: Backbone) -> None:
    # A replica's classifiers come and go with hot swaps; the mixer must not keep the old ones alive.
    mixer = MixedForward(backbone)
    task = lora_task(backbone, "{text} It was {mask}", "neg=bad,pos=good", seed=4)
    assert mixer.mixes(task) and len(mixer._seen) == 1
    del task
    gc.collect()
    assert len(mixer._seen) == 0


def test_parts_tokenized_by_their_encoders_are_not_tokenized_again(
    backbone: Backbone, tasks: list[Classifier], count_tokenized
) -> None:
    mixer = MixedForward(backbone)
    parts = [(tasks[0], TEXTS[:3]), (tasks[2], TEXTS[1:])]
    seen = count_tokenized(tasks[0].encoder.tokenizer)
    assert tasks[2].encoder.tokenizer is tasks[0].encoder.tokenizer
    expected = mixer.predict(parts)
    assert sum(seen.values()) == 6  # each part's texts, once
    tokenized = [(task, task.encoder.tokenize(texts)) for task, texts in parts]
    seen.clear()
    got = mixer.predict(tokenized)
    assert sum(seen.values()) == 0
    for g, e in zip(got, expected, strict=True):
        assert [p.probabilities for p in g] == [p.probabilities for p in e]  # bit for bit
