"""The sentence reader and its base (`split_encoder.py`): the split encoder against sentence-transformers'
own `encode`, the lower cache, the contrastive tuning of a task's top layers, their packing, saving and
loading, on a tiny random MPNet; and the split and a task's state size on the real all-mpnet-base-v2
where it is installed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from openbook.sentence_reader import CONFIG_FILE, STATE_FILE, ReaderConfig, SentenceReader
from openbook.split_encoder import (
    MATRIX_DTYPE,
    SCALE_SUFFIX,
    SERVING_MODULES,
    STATE_DTYPE,
    SharedEncoder,
    adapter_rank,
    pack_state,
    truncated_adapters,
)

# Four labels the tiny model's corpus reads apart by their words.
TOY = {
    "praise": ["the movie was great and fun", "a good film with a great cast", "the plot was great fun"],
    "complaint": ["it was terrible and boring", "a bad film , it was awful", "the cast was awful"],
    "question": ["what is the answer to this question", "who wrote the book about the river"],
    "verdict": ["yes it is true", "no it is false", "it is true , not false"],
}
TOY_TEXTS = [text for texts in TOY.values() for text in texts]
TOY_LABELS = [label for label, texts in TOY.items() for _ in texts]
TUNING = {"steps": 30, "batch_size": 8, "lr": 1e-3}  # the tiny model moves in a few steps at a larger lr


def _config(directory: Path, **changes) -> ReaderConfig:
    """A reader of the tiny MPNet's top 2 layers, owned whole (no adapters) unless `changes` say."""
    return ReaderConfig(
        **({"encoder": str(directory), "max_length": 64, "top_layers": 2, "adapters": 0} | changes)
    )


@pytest.fixture
def base(sentence_mpnet_dir: Path) -> SharedEncoder:
    return SharedEncoder.load(_config(sentence_mpnet_dir), "cpu")


def _count_lower_rows(base: SharedEncoder) -> list[int]:
    """A list that grows by the rows of every batch the lower layers run."""
    rows: list[int] = []
    base.auto.embeddings.register_forward_hook(
        lambda module, args, kwargs, out: rows.append(out.shape[0]), with_kwargs=True
    )
    return rows


@pytest.mark.parametrize(
    "changes",
    [
        {"top_layers": 0},
        {"max_length": 0},
        {"steps": 0},
        {"batch_size": 1},
        {"lr": 0.0},
        {"temperature": 0.0},
        {"encoder": ""},
        {"precision": "float16"},
        {"adapters": -1},
        {"adapters_from": "qr"},
    ],
)
def test_config_refuses_bad_values(changes):
    with pytest.raises(ValueError):
        ReaderConfig(**changes)


@pytest.mark.parametrize("top_layers", [1, 2, 3])
def test_the_split_reproduces_encode(sentence_mpnet_dir: Path, top_layers: int):
    base = SharedEncoder.load(_config(sentence_mpnet_dir, top_layers=top_layers), "cpu")
    texts = [*TOY_TEXTS, "a", "the movie " * 40]  # the last is cut at max_length
    expected = base.model.encode(texts, convert_to_numpy=True, normalize_embeddings=True)
    assert np.abs(SentenceReader(base).embed(texts) - expected).max() < 1e-5


def test_a_text_runs_through_the_lower_layers_once(base: SharedEncoder, sentence_mpnet_dir: Path):
    rows = _count_lower_rows(base)
    reader = SentenceReader(base)
    first = reader.embed(TOY_TEXTS[:5] + TOY_TEXTS[:2])  # a text twice in one call: run once
    assert sum(rows) == 5
    reader.tune(TOY_TEXTS, TOY_LABELS, _config(sentence_mpnet_dir, **TUNING))
    reader.embed(TOY_TEXTS)
    assert sum(rows) == len(TOY_TEXTS)
    assert not np.allclose(reader.embed(TOY_TEXTS[:5]), first[:5])  # the upper layers did run again


def test_the_lower_cache_keeps_the_most_recent_texts_within_its_bound(sentence_mpnet_dir: Path):
    config = _config(sentence_mpnet_dir)
    sizes = [s.numel() * s.element_size() for s in SharedEncoder.load(config, "cpu").lower(TOY_TEXTS)]
    base = SharedEncoder.load(config, "cpu", cache_bytes=sum(sizes[-3:]))
    rows = _count_lower_rows(base)
    base.lower(TOY_TEXTS)
    base.lower(TOY_TEXTS[-3:])  # the three most recent are kept
    assert sum(rows) == len(TOY_TEXTS)
    base.lower(TOY_TEXTS[:1])  # the older were dropped, so it runs again
    assert sum(rows) == len(TOY_TEXTS) + 1


def _cosines(embeddings: np.ndarray) -> tuple[float, float]:
    """The mean cosine of pairs of TOY texts of one label, and of pairs of different labels."""
    labels = np.array(TOY_LABELS)
    cosine = embeddings @ embeddings.T
    same = labels[:, None] == labels[None, :]
    off_diagonal = ~np.eye(len(labels), dtype=bool)
    return float(cosine[same & off_diagonal].mean()), float(cosine[~same].mean())


def _tune_pulls_each_label_together(reader: SentenceReader, config: ReaderConfig) -> None:
    """Tune `reader` on the TOY texts: its loss falls, and each label's texts come together."""
    same_before, different_before = _cosines(reader.embed(TOY_TEXTS))
    losses = reader.tune(TOY_TEXTS, TOY_LABELS, config)
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])
    same_after, different_after = _cosines(reader.embed(TOY_TEXTS))
    assert same_after - different_after > 2 * (same_before - different_before)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_tuning_lowers_the_loss_and_pulls_each_label_together(
    base: SharedEncoder, sentence_mpnet_dir: Path, precision: str
):
    reader = SentenceReader(base)
    same_before, different_before = _cosines(reader.embed(TOY_TEXTS))
    steps: list[int] = []
    config = _config(sentence_mpnet_dir, **TUNING, precision=precision)
    losses = reader.tune(TOY_TEXTS, TOY_LABELS, config, on_step=lambda s, _: steps.append(s))
    assert steps == list(range(TUNING["steps"])) and len(losses) == TUNING["steps"]
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])
    same_after, different_after = _cosines(reader.embed(TOY_TEXTS))
    assert same_after > same_before and different_after < different_before
    assert same_after - different_after > 2 * (same_before - different_before)


def test_tuning_is_seeded_and_leaves_the_callers_rng_alone(base: SharedEncoder, sentence_mpnet_dir: Path):
    config = _config(sentence_mpnet_dir, **TUNING)
    torch.manual_seed(0)
    expected_draw = torch.rand(3)
    torch.manual_seed(0)
    first, second, other = SentenceReader(base), SentenceReader(base), SentenceReader(base)
    assert first.tune(TOY_TEXTS, TOY_LABELS, config) == second.tune(TOY_TEXTS, TOY_LABELS, config)
    assert torch.equal(torch.rand(3), expected_draw)
    assert all(torch.equal(first.layers[key], second.layers[key]) for key in first.layers)
    other.tune(TOY_TEXTS, TOY_LABELS, _config(sentence_mpnet_dir, **(TUNING | {"seed": 14})))
    assert not all(torch.equal(first.layers[key], other.layers[key]) for key in first.layers)


def test_bfloat16_tuning_computes_in_bfloat16_and_keeps_the_layers_as_float32s_are_kept(
    base: SharedEncoder, sentence_mpnet_dir: Path
):
    full, mixed = SentenceReader(base), SentenceReader(base)
    full.tune(TOY_TEXTS, TOY_LABELS, _config(sentence_mpnet_dir, **TUNING, precision="float32"))
    mixed.tune(TOY_TEXTS, TOY_LABELS, _config(sentence_mpnet_dir, **TUNING, precision="bfloat16"))
    assert (full.tuned_in, mixed.tuned_in) == ("float32", "bfloat16")
    assert {k: (t.shape, t.dtype) for k, t in mixed.layers.items()} == {
        k: (t.shape, t.dtype) for k, t in full.layers.items()
    }
    assert not all(torch.equal(full.layers[key], mixed.layers[key]) for key in full.layers)
    assert mixed.embed(TOY_TEXTS).dtype == np.float32


@pytest.mark.parametrize("native", [True, False])
def test_auto_tunes_in_bfloat16_only_where_the_device_multiplies_it_natively(
    base: SharedEncoder, sentence_mpnet_dir: Path, tmp_path: Path, monkeypatch, native: bool
):
    import openbook.sentence_reader as module

    monkeypatch.setattr(module, "resolve_precision", lambda name, device: resolve_precision_as(name, native))
    expected = "bfloat16" if native else "float32"
    auto, explicit = SentenceReader(base), SentenceReader(base)
    auto.tune(TOY_TEXTS, TOY_LABELS, _config(sentence_mpnet_dir, **TUNING))  # precision "auto"
    explicit.tune(TOY_TEXTS, TOY_LABELS, _config(sentence_mpnet_dir, **TUNING, precision=expected))
    assert auto.config.precision == "auto" and auto.tuned_in == expected
    assert all(torch.equal(auto.layers[key], explicit.layers[key]) for key in auto.layers)
    loaded = SentenceReader.load(auto.save(tmp_path / "reader"), base)  # what ran is kept with it
    assert loaded.tuned_in == expected and loaded.copy().tuned_in == expected
    assert loaded.description()["config"]["precision"] == "auto"


def resolve_precision_as(name: str, native: bool) -> str:
    """`devices.resolve_precision` on a device that does (or does not) multiply bfloat16 natively."""
    return ("bfloat16" if native else "float32") if name == "auto" else name


def test_tasks_share_the_base_and_never_change_it(base: SharedEncoder, sentence_mpnet_dir: Path):
    before = {key: value.clone() for key, value in base.model.state_dict().items()}
    frozen = SentenceReader(base)
    untuned = frozen.embed(TOY_TEXTS)
    praise_first, questions_first = SentenceReader(base), SentenceReader(base)
    praise_first.tune(TOY_TEXTS, TOY_LABELS, _config(sentence_mpnet_dir, **TUNING))
    swapped = [{"praise": "question", "question": "praise"}.get(label, label) for label in TOY_LABELS]
    questions_first.tune(
        TOY_TEXTS[::-1], swapped[::-1], _config(sentence_mpnet_dir, **(TUNING | {"seed": 5}))
    )
    assert praise_first.base is questions_first.base is base
    after = base.model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[key], after[key]) for key in before)
    assert np.array_equal(frozen.embed(TOY_TEXTS), untuned)
    assert not np.allclose(praise_first.embed(TOY_TEXTS), questions_first.embed(TOY_TEXTS))


def test_a_saved_state_loads_to_the_same_embeddings(
    base: SharedEncoder, sentence_mpnet_dir: Path, tmp_path: Path
):
    reader = SentenceReader(base)
    config = _config(sentence_mpnet_dir, **TUNING)
    reader.tune(TOY_TEXTS, TOY_LABELS, config)
    texts = [*TOY_TEXTS, "where is the river"]
    expected = reader.embed(texts)
    saved = reader.save(tmp_path / "reader")
    loaded = SentenceReader.load(saved, base)
    assert loaded.config == config
    assert np.array_equal(loaded.embed(texts), expected)
    state = loaded.state_dict()
    assert {t.dtype for key, t in state.items() if key + SCALE_SUFFIX in state} == {MATRIX_DTYPE}
    assert {t.dtype for key, t in state.items() if key + SCALE_SUFFIX not in state} == {STATE_DTYPE}
    # another process's copy of the encoder: the lower states of other batches may differ in the last bits
    elsewhere = SentenceReader.load(saved, SharedEncoder.load(config, "cpu"))
    assert np.abs(elsewhere.embed(texts) - expected).max() < 1e-6


# every layer of the tiny model, through rank-4 adapters, which move it at a larger lr than its layers
ADAPTERS = {"top_layers": 3, "adapters": 4, "adapters_from": "lora", "lr": 1e-2}


def test_fresh_adapters_read_as_the_base_and_tuned_ones_pull_each_label_together(sentence_mpnet_dir: Path):
    config = _config(sentence_mpnet_dir, **(TUNING | ADAPTERS))
    base = SharedEncoder.load(config, "cpu")
    before = {key: value.clone() for key, value in base.model.state_dict().items()}
    fresh = base.adapted_module(None, 4)
    states = base.lower(TOY_TEXTS)
    with torch.no_grad():
        plain, adapted = base.upper(states, base.top_module(None)), base.upper(states, fresh)
    assert torch.allclose(plain, adapted, atol=1e-6)  # B starts at zero: the base's own answer

    reader = SentenceReader(base)
    _tune_pulls_each_label_together(reader, config)
    assert all(torch.equal(before[key], value) for key, value in base.model.state_dict().items())
    # the task owns the adapters alone: a fraction of the layers they adapt
    assert adapter_rank(reader.layers) == 4 and all("lora_" in key for key in reader.layers)
    owned = sum(t.numel() for t in reader.layers.values())
    layers = sum(t.numel() for t in pack_state(base.top_state()).values())
    assert owned < layers / 2
    untuned = SentenceReader(base)
    assert np.allclose(untuned.embed(TOY_TEXTS), plain.numpy(), atol=1e-6)  # the base's reader unchanged


def test_saved_adapters_load_to_the_same_embeddings_and_others_are_refused(
    sentence_mpnet_dir: Path, tmp_path: Path
):
    config = _config(sentence_mpnet_dir, **(TUNING | ADAPTERS))
    base = SharedEncoder.load(config, "cpu")
    reader = SentenceReader(base)
    reader.tune(TOY_TEXTS, TOY_LABELS, config)
    texts = [*TOY_TEXTS, "where is the river"]
    expected = reader.embed(texts)
    saved = reader.save(tmp_path / "reader")
    loaded = SentenceReader.load(saved, base)
    assert loaded.config == config and np.array_equal(loaded.embed(texts), expected)
    again = loaded.copy()  # going on from its adapters: the same rank only
    again.tune(TOY_TEXTS, TOY_LABELS, replace(config, steps=2))
    with pytest.raises(ValueError, match="not adapters of rank 8"):
        loaded.copy().tune(TOY_TEXTS, TOY_LABELS, replace(config, adapters=8))
    whole = SentenceReader(base)
    whole.tune(TOY_TEXTS, TOY_LABELS, replace(config, adapters=0))
    with pytest.raises(ValueError, match="not adapters of rank 4"):
        whole.tune(TOY_TEXTS, TOY_LABELS, config)
    truncated = {key: t for key, t in loaded.layers.items() if not key.startswith("0.")}  # a layer's lost
    description = loaded.description()
    with pytest.raises(ValueError, match="adapters of rank 4"):
        SentenceReader.restore(description, truncated, base)


def test_extracted_adapters_keep_a_low_rank_change_exactly_and_its_best_approximation_below(
    sentence_mpnet_dir: Path,
):
    config = _config(sentence_mpnet_dir, top_layers=3)
    base = SharedEncoder.load(config, "cpu")
    changed = base.top_module(None, trainable=True)
    generator = torch.Generator().manual_seed(0)
    weight = changed[1].attention.attn.q.weight  # (32, 32): a change of rank 2, singular values 3 and 1
    u, _ = torch.linalg.qr(torch.randn(32, 2, generator=generator))
    v, _ = torch.linalg.qr(torch.randn(32, 2, generator=generator))
    with torch.no_grad():
        weight += u @ torch.diag(torch.tensor([3.0, 1.0])) @ v.T
    states = base.lower(TOY_TEXTS)
    with torch.no_grad():
        expected = base.upper(states, changed.eval())  # no dropout
        adapters = pack_state(base.extracted_adapters(changed, 2))
        at_rank_2 = base.upper(states, base.adapted_module(adapters, 2))
    assert torch.allclose(at_rank_2, expected, atol=2e-3)  # only int8 packing's rounding between them
    with torch.no_grad():  # served merged into dense layers: the same embeddings as through peft's
        assert torch.allclose(base.upper(states, base.serving_module(adapters)), at_rank_2, atol=1e-5)
    four = base.extracted_adapters(changed, 4)  # every other matrix unchanged: its factors are zero
    assert all(t.abs().max() < 1e-5 for k, t in four.items() if "1.attention.attn.q." not in k)
    merged = base.merged_state(pack_state(truncated_adapters(four, 1)))
    assert merged is not None
    error = merged["1.attention.attn.q.weight"] - weight.detach()
    assert abs(torch.linalg.matrix_norm(error) - 1.0) < 0.02  # Eckart-Young: the second singular value


def test_adapters_from_the_full_tuning_pull_each_label_together_and_load_to_the_same_embeddings(
    sentence_mpnet_dir: Path, tmp_path: Path
):
    config = _config(sentence_mpnet_dir, **TUNING, top_layers=3, adapters=4, adapters_from="svd")
    base = SharedEncoder.load(config, "cpu")
    reader = SentenceReader(base)
    _tune_pulls_each_label_together(reader, config)
    assert adapter_rank(reader.layers) == 4 and all("lora_" in key for key in reader.layers)
    loaded = SentenceReader.load(reader.save(tmp_path / "reader"), base)
    assert loaded.config == config and np.array_equal(loaded.embed(TOY_TEXTS), reader.embed(TOY_TEXTS))
    before = {key: value.clone() for key, value in base.model.state_dict().items()}
    again = loaded.copy()  # going on from its adapters, merged into the layers it tunes in full
    again.tune(TOY_TEXTS, TOY_LABELS, replace(config, steps=2))
    assert adapter_rank(again.layers) == 4
    assert all(torch.equal(before[key], value) for key, value in base.model.state_dict().items())
    assert not np.array_equal(again.embed(TOY_TEXTS), reader.embed(TOY_TEXTS))


def test_the_layers_read_most_recently_are_kept_unpacked(base: SharedEncoder):
    states = [pack_state(base.top_state()) for _ in range(SERVING_MODULES + 1)]  # tasks' own, alike
    first = base.serving_module(states[0])
    assert base.serving_module(states[0]) is first  # read again: not unpacked again
    for state in states[1:]:
        base.serving_module(state)
    assert base.serving_module(states[-1]) is base.serving_module(states[-1])
    assert base.serving_module(states[0]) is not first  # the least recent was let go


def test_an_untuned_reader_saves_no_tensors(base: SharedEncoder, tmp_path: Path):
    saved = SentenceReader(base).save(tmp_path / "reader")
    assert sorted(p.name for p in saved.iterdir()) == [CONFIG_FILE]
    loaded = SentenceReader.load(saved, base)
    assert loaded.layers is None and loaded.state_dict() == {}
    assert np.array_equal(loaded.embed(TOY_TEXTS), SentenceReader(base).embed(TOY_TEXTS))


def test_the_saved_state_is_the_top_layers_only(
    base: SharedEncoder, sentence_mpnet_dir: Path, tmp_path: Path
):
    reader = SentenceReader(base)
    reader.tune(TOY_TEXTS, TOY_LABELS, _config(sentence_mpnet_dir, **(TUNING | {"steps": 2})))
    top = base.top_state()
    state = reader.state_dict()
    matrices = {key for key, t in top.items() if t.dim() == 2}
    assert state.keys() == top.keys() | {key + SCALE_SUFFIX for key in matrices}
    # a byte per matrix entry, two per row scale and per entry of every other tensor
    tensor_bytes = sum(t.numel() * (1 if key in matrices else 2) for key, t in top.items())
    tensor_bytes += 2 * sum(top[key].shape[0] for key in matrices)
    assert sum(t.numel() * t.element_size() for t in state.values()) == tensor_bytes
    size = (reader.save(tmp_path / "reader") / STATE_FILE).stat().st_size
    assert tensor_bytes < size < tensor_bytes + 16_384  # the tensors and safetensors' header


def _perturbed_copy(source: Path, target: Path) -> Path:
    """The same encoder folder with one weight changed: another base."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    weights = load_file(str(target / "model.safetensors"))
    name = next(iter(weights))
    weights[name] = weights[name] + 1
    save_file(weights, str(target / "model.safetensors"))
    return target


@pytest.mark.parametrize("other", ["weights", "top_layers", "max_length"])
def test_loading_onto_another_base_is_refused(
    base: SharedEncoder, sentence_mpnet_dir: Path, tmp_path: Path, other: str
):
    reader = SentenceReader(base)
    reader.tune(TOY_TEXTS, TOY_LABELS, _config(sentence_mpnet_dir, **(TUNING | {"steps": 2})))
    saved = reader.save(tmp_path / "reader")
    if other == "weights":
        config = _config(_perturbed_copy(sentence_mpnet_dir, tmp_path / "other"))
    else:
        config = _config(sentence_mpnet_dir, **{other: {"top_layers": 1, "max_length": 32}[other]})
    with pytest.raises(ValueError, match="another base"):
        SentenceReader.load(saved, SharedEncoder.load(config, "cpu"))


@pytest.mark.parametrize("changes", [{"top_layers": 1}, {"max_length": 32}, {"encoder": "mpnet"}])
def test_tuning_with_a_config_of_another_base_is_refused(
    base: SharedEncoder, sentence_mpnet_dir: Path, changes
):
    with pytest.raises(ValueError, match="this base is"):
        SentenceReader(base).tune(TOY_TEXTS, TOY_LABELS, replace(_config(sentence_mpnet_dir), **changes))


def test_tuning_needs_a_pair_of_one_label(base: SharedEncoder, sentence_mpnet_dir: Path):
    with pytest.raises(ValueError, match="two texts"):
        SentenceReader(base).tune(TOY_TEXTS[:3], ["a", "b", "c"], _config(sentence_mpnet_dir))


def test_a_pooling_it_does_not_implement_is_refused(base: SharedEncoder, sentence_mpnet_dir: Path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    for pooling in ("cls", "max", ("mean", "max")):
        model = SentenceTransformer(modules=[base.model[0], Pooling(32, pooling), Normalize()], device="cpu")
        with pytest.raises(ValueError, match="pools by"):
            SharedEncoder(model, name="x", weights_file=Path("x"), top_layers=1, max_length=64)


def test_a_max_length_past_the_models_positions_is_refused(sentence_mpnet_dir: Path):
    with pytest.raises(ValueError, match="max_length must be at most 64"):
        SharedEncoder.load(_config(sentence_mpnet_dir, max_length=65), "cpu")  # 66 positions from id 2


def test_an_encoder_that_is_no_model_folder_is_refused(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="neither a registered encoder nor a model folder"):
        SharedEncoder.load(ReaderConfig(encoder=str(tmp_path)), "cpu")


@pytest.mark.real_backbone
def test_the_real_encoders_split_reproduces_encode_and_a_task_owns_under_50_mb(tmp_path: Path):
    from openbook.encoders import check_installed

    try:
        check_installed("mpnet")
    except FileNotFoundError as missing:
        pytest.skip(f"all-mpnet-base-v2 is not installed: {missing}")
    config = ReaderConfig(steps=1, batch_size=4)
    base = SharedEncoder.load(config, "cpu")
    texts = ["What is the capital of France ?", "Who wrote Hamlet ?", "How many feet are in a mile ?"]
    expected = base.model.encode(texts, convert_to_numpy=True, normalize_embeddings=True)
    assert np.abs(SentenceReader(base).embed(texts) - expected).max() < 1e-5
    reader = SentenceReader(base)
    reader.tune([*texts, "Who painted the Mona Lisa ?"], ["what", "who", "what", "who"], config)
    size = (reader.save(tmp_path / "reader") / STATE_FILE).stat().st_size
    print(f"a task's state at top_layers={config.top_layers}: {size:,} bytes")
    assert size <= 50_000_000
