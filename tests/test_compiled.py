"""The compiled forward (openbook/compiled.py): padded buckets change no answer, compiled matches eager."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from openbook.backbone import Backbone, BackboneConfig, load_backbone
from openbook.classifier import Classifier
from openbook.compiled import buckets, fit, pad_batch
from openbook.demonstrations import DemoConfig
from openbook.prompting import Template, Verbalizer

TEXTS = ["a good film", "it was terrible and boring", "great fun", "a bad film , it was awful", "fun"]
# Compiled kernels fuse operations and sum in another order than eager ones. In float32 each reordered
# sum moves by a few units of 2^-24 relative; through the tiny models' two layers and a log-softmax the
# largest change seen is 5e-7. 1e-4 leaves two orders of magnitude for other shapes and kernels while
# staying far below the gaps between label scores that decide a prediction.
ATOL = 1e-4


def classifier(backbone: Backbone, demos: DemoConfig | None = None) -> Classifier:
    return Classifier(
        backbone, Template("{text} It was {mask}"), Verbalizer.parse("neg=bad,pos=good"), demos=demos
    )


def test_buckets_and_fit() -> None:
    assert buckets(1024, base=4) == [1, 4, 16, 64, 256, 1024]
    assert buckets(100, base=4) == [1, 4, 16, 64, 100]
    assert buckets(128, step=32) == [32, 64, 96, 128]
    assert buckets(48, step=32) == [32, 48]
    assert fit(5, [1, 4, 16]) == 16 and fit(1, [1, 4]) == 1 and fit(17, [1, 4, 16]) is None


def test_padding_to_a_bucket_changes_no_real_rows_answer(backbone: Backbone) -> None:
    task = classifier(backbone)
    batch = task.encoder.encode(TEXTS)
    rows, width = batch.input_ids.shape
    padded = pad_batch(batch, rows + 3, width + 7, left=backbone.kind == "causal")
    assert padded.input_ids.shape == (rows + 3, width + 7)
    with torch.inference_mode():
        alone = backbone.forward(batch, task.encoder.label_token_ids)
        within = backbone.forward(padded, task.encoder.label_token_ids)
    np.testing.assert_allclose(within.hidden[:rows], alone.hidden, atol=1e-5)
    np.testing.assert_allclose(within.label_log_probs[:rows], alone.label_log_probs, atol=1e-5)
    assert torch.equal(within.hidden[rows:], within.hidden[rows - 1 : rows].expand(3, -1))  # repeats


def test_padding_moves_demonstration_slots_with_their_prompt(backbone: Backbone) -> None:
    task = classifier(backbone, DemoConfig())
    assert task.demo_encoder is not None
    batch = task.demo_encoder.encode(TEXTS)
    rows, width = batch.input_ids.shape
    vectors = torch.randn(rows, 2, backbone.hidden_size, generator=torch.Generator().manual_seed(0))
    padded = pad_batch(batch, rows + 3, width + 7, left=backbone.kind == "causal")
    assert batch.demo_index is not None and padded.demo_index is not None
    placed = padded.input_ids.gather(1, padded.demo_index[:rows])
    assert torch.equal(placed, batch.input_ids.gather(1, batch.demo_index))  # the same placeholders
    more = torch.cat([vectors, vectors[-1:].expand(3, -1, -1)])
    label_ids = task.demo_encoder.label_token_ids
    with torch.inference_mode():
        alone = backbone.forward(batch, label_ids, demo_vectors=vectors)
        within = backbone.forward(padded, label_ids, demo_vectors=more)
        plain = backbone.forward(batch, label_ids, demo_vectors=torch.zeros_like(vectors))
    np.testing.assert_allclose(within.hidden[:rows], alone.hidden, atol=1e-5)
    np.testing.assert_allclose(within.label_log_probs[:rows], alone.label_log_probs, atol=1e-5)
    assert not np.allclose(alone.hidden, plain.hidden, atol=1e-3)  # the vectors are read


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_compiled_forward_matches_eager(causal_dir: Path, masked_dir: Path, device: str) -> None:
    # On CUDA this compiles with "reduce-overhead": every bucket is replayed as a CUDA graph.
    for directory in (causal_dir, masked_dir):
        config = BackboneConfig(name=str(directory), max_length=48, device=device, dtype="float32")
        backbone = load_backbone(config)
        task = classifier(backbone)
        task.add_examples(TEXTS[:2], ["pos", "neg"])
        eager = task.embed(TEXTS)
        compiled = backbone.compile(max_rows=4)
        assert compiled.row_sizes == [1, 4] and compiled.lengths == [32, 48]
        calls = []
        model = compiled.model
        compiled.model = lambda calls=calls, model=model, **kwargs: (
            calls.append(kwargs["inputs_embeds"].shape[:2]) or model(**kwargs)
        )
        for texts in (TEXTS, TEXTS[:1], TEXTS[1:4]):  # 5 rows: over every bucket, so eager; then 1, 3
            got = task.embed(texts)
            want = eager.lm_log_probs[[TEXTS.index(t) for t in texts]]
            np.testing.assert_allclose(got.lm_log_probs, want, atol=ATOL)
            np.testing.assert_allclose(got.vectors, eager.vectors[[TEXTS.index(t) for t in texts]], atol=ATOL)
        assert [p.label for p in task.predict(TEXTS[1:4])] == [p.label for p in task.explain(eager)[1:4]]
        assert [rows for rows, _ in calls] == [1, 4, 4]  # 5 rows fit no bucket; 1 and 3 (padded) do
        # neural demonstrations: vectors written into the embeddings, the same buckets
        shown = classifier(backbone, DemoConfig(m=1))
        shown.add_examples(TEXTS[:2], ["pos", "neg"])
        with_demos = shown.embed(TEXTS[1:4])
        # the two stored examples, then the three queries' slot vectors and their prompts with demos
        assert [rows for rows, _ in calls[3:]] == [4, 4, 4]
        backbone.compiled = None
        np.testing.assert_allclose(with_demos.lm_log_probs, shown.embed(TEXTS[1:4]).lm_log_probs, atol=ATOL)
        assert not np.allclose(with_demos.lm_log_probs, eager.lm_log_probs[1:4], atol=1e-5)
