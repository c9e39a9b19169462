import pytest
import torch
import torch.nn.functional as F
from openbook.backbone import detect_kind
from openbook.prompting import Template, Verbalizer

TEMPLATE = Template("{text} It was {mask}")
VERBALIZER = Verbalizer.parse("0=terrible,1=great")


def test_kind_is_detected_from_the_saved_model(masked_backbone, causal_backbone):
    assert masked_backbone.kind == "masked"
    assert causal_backbone.kind == "causal"
    assert detect_kind(masked_backbone.model.config, masked_backbone.tokenizer) == "masked"


def test_slot_outputs_have_batch_and_label_shapes(any_backbone):
    backbone = any_backbone
    encoder = backbone.encoder(TEMPLATE, VERBALIZER)
    batch = encoder.encode(["the movie was great", "a bad film"])
    with torch.no_grad():
        out = backbone.forward(batch, encoder.label_token_ids)
    assert out.hidden.shape == (2, backbone.hidden_size)
    assert out.label_log_probs.shape == (2, 2)
    assert torch.all(out.label_log_probs <= 0)


def test_padding_does_not_change_a_row(any_backbone):
    """A short text scores the same alone and padded next to a long one."""
    backbone = any_backbone
    encoder = backbone.encoder(TEMPLATE, VERBALIZER)
    with torch.no_grad():
        alone = backbone.forward(encoder.encode(["a bad film"]), encoder.label_token_ids)
        padded = backbone.forward(
            encoder.encode(["a bad film", "the movie was great and fun , a good film"]),
            encoder.label_token_ids,
        )
    torch.testing.assert_close(alone.hidden[0], padded.hidden[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(alone.label_log_probs[0], padded.label_log_probs[0], atol=1e-4, rtol=1e-4)


def test_input_embedding_scale_is_what_the_embedding_module_applies(any_backbone):
    ids = torch.arange(len(any_backbone.tokenizer), device=any_backbone.device)
    table = any_backbone.input_embeddings.weight
    expected = table[ids] * any_backbone.input_embedding_scale
    torch.testing.assert_close(any_backbone.input_embeddings(ids), expected)


def test_gemma_scales_its_embeddings_and_the_slot_scores_are_its_own(gemma_backbone):
    """Gemma 3's embedding module multiplies by sqrt(hidden size); the backbone's label scores, read from
    the inputs_embeds it builds, are those of the model run on the token ids."""
    assert gemma_backbone.input_embedding_scale == pytest.approx(gemma_backbone.hidden_size**0.5)
    encoder = gemma_backbone.encoder(TEMPLATE, VERBALIZER)
    batch = encoder.encode(["a bad film", "the movie was great and fun , a good film"])
    with torch.no_grad():
        out = gemma_backbone.forward(batch, encoder.label_token_ids)
        logits = gemma_backbone.model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).logits[:, -1]
    assert all(len(ids) == 1 for ids in encoder.label_token_ids)
    words = torch.tensor([ids[0] for ids in encoder.label_token_ids])
    torch.testing.assert_close(out.label_log_probs, F.log_softmax(logits, -1)[:, words])


def test_slot_vectors_are_the_forward_hidden_and_score_no_label(any_backbone):
    """The vector-only path gives `forward`'s slot vectors, running the body once and never the LM head
    (so no label word, single or multi-token, is scored)."""
    backbone = any_backbone
    encoder = backbone.encoder(TEMPLATE, Verbalizer.parse("0=boring,1=wonderful,2=great"))
    assert max(len(ids) for ids in encoder.label_token_ids) > 1
    batch = encoder.encode(["a bad film", "the movie was great and fun , a good film"])  # padded rows
    with torch.no_grad():
        out = backbone.forward(batch, encoder.label_token_ids)
    body, head = [], []
    hooks = [
        backbone.model.base_model.register_forward_pre_hook(lambda *_: body.append(1)),
        backbone.output_head.register_forward_pre_hook(lambda *_: head.append(1)),
    ]
    try:
        with torch.no_grad():
            vectors = backbone.slot_vectors(batch)
    finally:
        for hook in hooks:
            hook.remove()
    assert vectors.dtype == torch.float32
    torch.testing.assert_close(vectors, out.hidden, atol=1e-6, rtol=0)
    assert (len(body), len(head)) == (1, 0)


def _reference_sequence_log_prob(backbone, prompt_ids: list[int], word_ids: list[int]) -> float:
    """log P(word | prompt) by a plain full forward over prompt + word (no cache, no padding)."""
    ids = torch.tensor([prompt_ids + word_ids], device=backbone.device)
    with torch.no_grad():
        logits = backbone.model(input_ids=ids).logits[0]  # (T, V)
    log_probs = F.log_softmax(logits.float(), dim=-1)
    start = len(prompt_ids) - 1
    return sum(float(log_probs[start + i, tok]) for i, tok in enumerate(word_ids))


def test_causal_multi_token_label_scores_are_exact_sequence_log_probs(causal_backbone):
    verbalizer = Verbalizer.parse("0=boring,1=wonderful")  # rare in the tiny corpus: several BPE pieces
    encoder = causal_backbone.encoder(TEMPLATE, verbalizer)
    assert max(len(ids) for ids in encoder.label_token_ids) > 1
    texts = ["the movie was great", "a bad film , it was awful"]
    batch = encoder.encode(texts)
    with torch.no_grad():
        out = causal_backbone.forward(batch, encoder.label_token_ids)
    for row in range(len(texts)):
        prompt = batch.input_ids[row][batch.attention_mask[row].bool()].tolist()
        for label, word_ids in enumerate(encoder.label_token_ids):
            expected = _reference_sequence_log_prob(causal_backbone, prompt, word_ids)
            assert out.label_log_probs[row, label].item() == pytest.approx(expected, abs=1e-4)


def test_masked_multi_token_label_is_mean_of_piece_log_probs(masked_backbone):
    verbalizer = Verbalizer.parse("0=boringly,1=wonderful")
    encoder = masked_backbone.encoder(TEMPLATE, verbalizer)
    multi = [i for i, ids in enumerate(encoder.label_token_ids) if len(ids) > 1]
    assert multi, "expected a multi-piece word with the tiny vocabulary"
    batch = encoder.encode(["the movie was great"]).to(masked_backbone.device)
    with torch.no_grad():
        out = masked_backbone.forward(batch, encoder.label_token_ids)
        logits = masked_backbone.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    log_probs = F.log_softmax(logits[0, batch.slot_index[0]], dim=-1)
    label = multi[0]
    expected = log_probs[encoder.label_token_ids[label]].mean()
    assert out.label_log_probs[0, label].item() == pytest.approx(expected.item(), abs=1e-5)


def test_demo_vectors_reach_the_model_at_the_placeholders(backbone):
    encoder = backbone.encoder(TEMPLATE, VERBALIZER, demonstrations="vectors")
    batch = encoder.encode(["the movie was great", "a bad film"]).to(backbone.device)
    captured = {}
    hook = backbone.input_embeddings.register_forward_hook(lambda _m, _i, out: captured.setdefault("e", out))
    demo = torch.randn(2, 2, backbone.hidden_size, device=backbone.device)
    seen = []
    layer0 = backbone.model.base_model.layers[0] if backbone.kind == "causal" else None
    handle = None
    if layer0 is not None:
        handle = layer0.register_forward_pre_hook(
            lambda _m, args, kwargs: seen.append(args[0] if args else kwargs["hidden_states"]),
            with_kwargs=True,
        )
    try:
        with torch.no_grad():
            out_demo = backbone.forward(batch, encoder.label_token_ids, demo_vectors=demo)
            out_plain = backbone.forward(batch, encoder.label_token_ids)
    finally:
        hook.remove()
        if handle:
            handle.remove()
    assert not torch.allclose(out_demo.hidden, out_plain.hidden)
    if seen:  # causal: the first decoder layer receives exactly the injected vectors there
        rows = torch.arange(2, device=backbone.device)[:, None]
        torch.testing.assert_close(seen[0][rows, batch.demo_index], demo)


def test_the_default_device_comes_from_the_environment(monkeypatch):
    from openbook.backbone import BackboneConfig
    from openbook.devices import default_device, resolve_device

    monkeypatch.delenv("OPENBOOK_DEVICE", raising=False)
    # unset: auto, a GPU when one is visible
    assert BackboneConfig().device == default_device() == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("OPENBOOK_DEVICE", "cuda:1")
    assert BackboneConfig().device == "cuda:1"
    assert BackboneConfig(device="cpu").device == "cpu"  # an explicit device wins
    monkeypatch.setenv("OPENBOOK_DEVICE", "auto")
    assert BackboneConfig().device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cuda:0") == "cuda:0"


def test_a_backbone_or_device_that_is_not_there_is_named_before_any_weights_load(tmp_path):
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.devices import resolve_device

    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")
    with pytest.raises(ValueError, match=r"no backbone .*name one of smollm2-135m, gemma3-270m"):
        load_backbone(BackboneConfig(name=str(tmp_path / "gone"), device="cpu"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="a directory holding a Hugging Face model"):
        load_backbone(BackboneConfig(name=str(tmp_path / "empty"), device="cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
            load_backbone(BackboneConfig(name=str(tmp_path / "gone"), device="cuda"))
