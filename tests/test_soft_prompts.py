"""The soft-prompt plumbing: prepended virtual tokens keep every index right, and a prompt's label head."""

from __future__ import annotations

import torch
from openbook.backbone import Backbone
from openbook.prompting import EncodedBatch, Template, Verbalizer
from openbook.soft_prompts import PromptedInput, SoftPrompt, prepend_virtual_tokens, text_mask
from torch import nn

TEXTS = ["the movie was great and fun", "bad", "a good film with a great cast , it was"]


class PrependTokens(SoftPrompt):
    """Prepends the embeddings of fixed token ids: must equal writing those tokens into the template."""

    def __init__(self, token_ids: list[int]) -> None:
        super().__init__()
        self.token_ids = torch.tensor(token_ids)

    def forward(self, embeds: torch.Tensor, batch: EncodedBatch, backbone: Backbone) -> PromptedInput:
        virtual = backbone.input_embeddings(self.token_ids.to(embeds.device)).expand(len(embeds), -1, -1)
        return prepend_virtual_tokens(embeds, batch, virtual)


class LinearLabelHead(SoftPrompt):
    scores_labels = True

    def __init__(self, hidden: int, labels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(labels, hidden))

    def label_logits(self, features: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(features @ self.weight.T, dim=-1)


def test_prepended_tokens_equal_the_same_tokens_in_the_template(causal_backbone: Backbone) -> None:
    backbone = causal_backbone
    verbalizer = Verbalizer.parse("0=bad,1=good")
    plain = backbone.encoder(Template("{text} It was {mask}"), verbalizer)
    # The tiny causal tokenizer adds no specials and each template piece is tokenized on its own (the text
    # here without a leading space), so this row is exactly "good film"'s ids followed by the plain row.
    written = backbone.encoder(Template("good film{text} It was {mask}"), verbalizer)
    prefix_ids = backbone.tokenizer("good film", add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        expected = backbone.forward(written.encode(TEXTS), written.label_token_ids)
        got = backbone.forward(plain.encode(TEXTS), plain.label_token_ids, prompt=PrependTokens(prefix_ids))
    torch.testing.assert_close(got.hidden, expected.hidden, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got.label_log_probs, expected.label_log_probs, atol=1e-5, rtol=1e-4)


def test_prepend_shifts_slot_mask_and_positions(masked_backbone: Backbone) -> None:
    encoder = masked_backbone.encoder(Template("{text} It was {mask} ."), Verbalizer.parse("0=bad,1=good"))
    batch = encoder.encode(TEXTS).to(masked_backbone.device)
    embeds = masked_backbone.input_embeddings(batch.input_ids)
    virtual = torch.zeros(len(TEXTS), 3, embeds.shape[-1], device=embeds.device)
    out = prepend_virtual_tokens(embeds, batch, virtual)
    assert out.embeds.shape == (len(TEXTS), batch.input_ids.shape[1] + 3, embeds.shape[-1])
    assert torch.equal(out.batch.slot_index, batch.slot_index + 3)
    assert torch.equal(
        out.batch.input_ids[torch.arange(len(TEXTS), device=embeds.device), out.batch.slot_index],
        batch.input_ids[torch.arange(len(TEXTS), device=embeds.device), batch.slot_index],
    )
    assert out.batch.attention_mask[:, :3].eq(1).all()
    assert out.batch.template_mask is not None and not out.batch.template_mask[:, :3].any()


def test_template_and_text_masks_partition_the_row(backbone: Backbone) -> None:
    template = Template("Review: {text} It was {mask}")
    encoder = backbone.encoder(template, Verbalizer.parse("0=bad,1=good"))
    batch = encoder.encode(TEXTS)
    assert batch.template_mask is not None
    template_ids = backbone.tokenizer("Review:", add_special_tokens=False)["input_ids"]
    first_row = batch.input_ids[0][batch.template_mask[0]].tolist()
    assert first_row[: len(template_ids)] == template_ids
    texts = text_mask(batch)
    assert not (texts & batch.template_mask).any()
    rows = torch.arange(len(TEXTS))
    assert not texts[rows, batch.slot_index].any()
    assert texts.sum(1).gt(0).all()


def test_a_prompt_can_score_the_labels_itself(backbone: Backbone) -> None:
    encoder = backbone.encoder(Template("{text} It was {mask}"), Verbalizer.parse("0=bad,1=good"))
    head = LinearLabelHead(backbone.hidden_size, 2).to(backbone.device)
    out = backbone.forward(encoder.encode(TEXTS), encoder.label_token_ids, prompt=head)
    assert out.label_log_probs.shape == (len(TEXTS), 2)
    out.label_log_probs[:, 1].sum().backward()
    assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0
