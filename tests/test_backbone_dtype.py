"""Half-precision backbones: the dtype setting, float32 at the boundary, parity with float32, training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from openbook.backbone import BackboneConfig, float32_weights, load_backbone
from openbook.checkpoints import load_classifier, save_classifier
from openbook.classifier import Classifier
from openbook.devices import default_dtype, native_bfloat16, resolve_dtype, resolve_precision
from openbook.knn import KnnConfig, Similarity
from openbook.methods import build_method, weights_sha256
from openbook.train_config import TrainConfig
from openbook.training import train

# Parity of bfloat16 with float32 on the tiny backbones (8 significant bits against 24). Measured on
# the ten distinct sentences of the tiny models' corpus with a four-example store: largest difference
# of an interpolated probability 6.1e-4 (causal) and 1.3e-3 (masked), of P_LM 4.9e-4 / 3.9e-4, of a
# label log-prob 1.2e-3 / 1.9e-3; slot vectors' cosine with their float32 selves >= 0.99998; the
# same argmax on every row, the smallest float32 margin between the two labels being 2.3e-3. The
# tolerances below leave ~8x room for other CPUs' kernels. A prediction may flip only where float32
# itself is within the noise: rows whose float32 margin exceeds twice the tolerance must agree, and
# at least 90% overall. These bound the tiny models only. On smollm2-135m (CPU, SST-2 prompt, 64
# synthetic sentences, a 64-example store embedded in each dtype) bf16 moved P_LM by up to 0.020 and
# the interpolated P by up to 0.037, flipped 1 of 64 predictions, kept slot cosines >= 0.9994 and 95%
# of the top-16 neighbours.
# Those figures are for neighbours scored by plain cosine. Centred scoring (the default) subtracts the
# store's mean key first; with four keys the residuals are small, and bf16's error in them weighs more:
# on the same sentences the interpolated P moved by up to 0.027 (causal) and 0.0043 (masked), every argmax
# the same. Its bound leaves ~4x room.
PROBABILITY_ATOL = 0.01
CENTRED_PROBABILITY_ATOL = 0.1
MIN_COSINE = 0.999
MIN_ARGMAX_AGREEMENT = 0.9


def test_the_default_dtype_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("OPENBOOK_DTYPE", raising=False)
    assert BackboneConfig().dtype == default_dtype() == "auto"
    monkeypatch.setenv("OPENBOOK_DTYPE", "float16")
    assert BackboneConfig().dtype == "float16"
    assert BackboneConfig(dtype="float32").dtype == "float32"  # an explicit dtype wins
    monkeypatch.setenv("OPENBOOK_DTYPE", "half")
    with pytest.raises(ValueError, match="OPENBOOK_DTYPE must be one of"):
        BackboneConfig()


def test_auto_is_bfloat16_on_cuda_and_float32_on_cpu():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", "cuda:1") == torch.bfloat16  # only the device's type is read
    assert resolve_dtype("auto", "auto") == (torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    assert resolve_dtype("float16", "cpu") == torch.float16  # an explicit dtype holds on any device
    with pytest.raises(ValueError, match="dtype must be one of"):
        BackboneConfig(dtype="int8")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "native"), [(True, False, True), (False, True, True), (False, False, False)]
)
def test_a_readers_auto_precision_is_bfloat16_where_the_cpu_multiplies_it(
    monkeypatch, amx, avx512_bf16, native
):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    assert native_bfloat16("cpu") is native
    assert resolve_precision("auto", "cpu") == ("bfloat16" if native else "float32")
    assert resolve_precision("float32", "cpu") == "float32"  # an explicit precision holds
    assert resolve_precision("bfloat16", "mps") == "bfloat16"
    assert native_bfloat16("mps") is False


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_weights_load_in_the_dtype_and_leave_forward_as_float32(model_dir: Path, dtype: str, toy):
    backbone = load_backbone(BackboneConfig(name=str(model_dir), max_length=48, dtype=dtype))
    assert backbone.dtype == getattr(torch, dtype)
    assert {p.dtype for p in backbone.model.parameters()} == {getattr(torch, dtype)}
    classifier = Classifier(backbone, toy.template, toy.verbalizer)
    encoder = classifier.encoder
    with torch.inference_mode():
        out = backbone.forward(encoder.encode(toy.texts[:3]), encoder.label_token_ids)
    assert out.hidden.dtype == out.label_log_probs.dtype == torch.float32
    embedded = classifier.embed(toy.texts[:3])
    assert embedded.vectors.dtype == embedded.lm_log_probs.dtype == np.float32


def _predictions(
    directory: Path, dtype: str, toy, corpus, similarity: Similarity
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(interpolated P, P_LM, slot vectors) for the distinct corpus sentences, with a small store."""
    classifier = Classifier(
        load_backbone(BackboneConfig(name=str(directory), max_length=48, dtype=dtype)),
        toy.template,
        toy.verbalizer,
        knn=KnnConfig(similarity=similarity),
    )
    classifier.add_examples(toy.texts[:4], [str(label) for label in toy.labels[:4]])
    sample = sorted(set(corpus))
    predictions = classifier.predict(sample)
    as_array = lambda attribute: np.array(  # noqa: E731
        [[getattr(p, attribute)[label] for label in classifier.labels] for p in predictions]
    )
    return as_array("probabilities"), as_array("p_lm"), classifier.embed(sample).vectors


@pytest.mark.parametrize(
    ("similarity", "atol"), [("cosine", PROBABILITY_ATOL), ("centred", CENTRED_PROBABILITY_ATOL)]
)
def test_bfloat16_predictions_agree_with_float32(
    model_dir: Path, toy, corpus, similarity: Similarity, atol: float
):
    p32, lm32, vectors32 = _predictions(model_dir, "float32", toy, corpus, similarity)
    p16, lm16, vectors16 = _predictions(model_dir, "bfloat16", toy, corpus, similarity)
    np.testing.assert_allclose(p16, p32, atol=atol)
    np.testing.assert_allclose(lm16, lm32, atol=PROBABILITY_ATOL)
    assert (vectors16 * vectors32).sum(1).min() >= MIN_COSINE
    same = p16.argmax(1) == p32.argmax(1)
    top_two = np.sort(p32, axis=1)[:, -2:]
    clear = top_two[:, 1] - top_two[:, 0] > 2 * atol
    assert same[clear].all()
    assert same.mean() >= MIN_ARGMAX_AGREEMENT


def test_float32_weights_keep_updates_that_bfloat16_rounds_away():
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64).to(torch.bfloat16)
    start = layer.weight.detach().clone()
    inputs = torch.randn(8, 64)

    def adamw_steps(count: int) -> None:
        optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-5)
        for _ in range(count):
            optimizer.zero_grad()
            layer(inputs.to(layer.weight.dtype)).sum().backward()  # the same gradient every step
            optimizer.step()

    adamw_steps(30)
    # lr 1e-5 is below half a bf16 ulp of all but the smallest weights: bf16 steps change (almost) nothing
    assert (layer.weight != start).float().mean() < 0.05  # measured: 3.4%
    with float32_weights(layer):
        assert layer.weight.dtype == layer.bias.dtype == torch.float32
        adamw_steps(30)  # ~3e-4 in all: more than half an ulp of these weights (|w| < 1/8)
    assert layer.weight.dtype == torch.bfloat16 and layer.weight.grad is None
    assert (layer.weight != start).float().mean() > 0.9  # measured: 99.8%


def test_training_a_bfloat16_backbone_updates_float32_weights_then_serves_bfloat16(
    causal_dir: Path, tmp_path: Path, toy
):
    backbone = load_backbone(BackboneConfig(name=str(causal_dir), max_length=48, dtype="bfloat16"))
    base_sha = weights_sha256(backbone.model)
    start = {name: p.detach().clone() for name, p in backbone.model.named_parameters()}
    method = build_method("prompt-ft")
    classifier = method.prepare(Classifier(backbone, toy.template, toy.verbalizer))
    seen: list[torch.dtype] = []
    config = TrainConfig(steps=4, batch_size=4, lr=3e-3, eval_every=2, patience=10, warmup_ratio=0.0)
    result = train(
        classifier,
        method,
        toy.texts,
        toy.labels,
        toy.texts,
        toy.labels,
        config,
        progress=False,
        on_step=lambda *_: seen.append(backbone.dtype),
    )
    assert seen == [torch.float32] * result.steps_run  # the optimiser stepped float32 weights
    assert backbone.dtype == torch.bfloat16 and {p.dtype for p in backbone.model.parameters()} == {
        torch.bfloat16
    }
    moved = {name for name, p in backbone.model.named_parameters() if not torch.equal(p, start[name])}
    assert moved == set(start) - {"model.embed_tokens.weight"}  # every trained weight; the table is frozen
    # the store holds keys of the bf16 weights it will be served with
    keys = classifier.store.vectors_of(np.arange(len(toy.texts)))
    np.testing.assert_allclose(keys, classifier.embed(toy.texts, vectors_only=True).vectors, atol=1e-6)

    path = save_classifier(
        tmp_path / "ckpt",
        classifier,
        method,
        base_weights_sha256=base_sha,
        train_config=config,
        training_data_sha256="0" * 64,
        dev_metrics={},
    )
    loaded, _ = load_classifier(path)  # loads its own backbone in the dtype the base hash was taken in
    assert loaded.backbone.dtype == torch.bfloat16
    before, after = classifier.predict(toy.texts[:4]), loaded.predict(toy.texts[:4])
    assert [p.probabilities for p in after] == [p.probabilities for p in before]


# Each of these failed on a bf16 backbone before the dtype work (a float32 tensor met a bf16 one); run
# by hand, every registered method trains one step and predicts on bf16 tiny backbones of both kinds.
@pytest.mark.parametrize("spec", ["dart", "ipt", "prefix-tuning"])
def test_prompt_methods_train_and_predict_on_a_bfloat16_backbone(causal_dir: Path, spec: str, toy):
    """Prompts are float32 and read float32 features; what they put into the model is in its dtype."""
    backbone = load_backbone(BackboneConfig(name=str(causal_dir), max_length=48, dtype="bfloat16"))
    method = build_method(spec)
    classifier = method.prepare(Classifier(backbone, toy.template, toy.verbalizer))
    config = TrainConfig(steps=1, batch_size=4, eval_every=1, warmup_ratio=0.0)
    train(
        classifier,
        method,
        toy.texts[:4],
        toy.labels[:4],
        toy.texts[:4],
        toy.labels[:4],
        config,
        progress=False,
    )
    assert backbone.dtype == torch.bfloat16
    if classifier.prompt is not None:
        assert {p.dtype for p in classifier.prompt.parameters()} == {torch.float32}
    probabilities = [p.probabilities for p in classifier.predict(toy.texts[:2])]
    assert all(np.isclose(sum(row.values()), 1.0, atol=1e-5) for row in probabilities)
