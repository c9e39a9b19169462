"""The prompt encoder on the tiny backbones: slot positions, padding, label words, truncation, demo blocks."""

import pytest
from openbook.prompting import PromptEncoder, PromptError, Template, Verbalizer


def test_causal_backbone_needs_slot_at_end(causal_backbone):
    with pytest.raises(PromptError, match="must be the last thing"):
        causal_backbone.encoder(Template("{text} It was {mask} ."), Verbalizer.parse("0=bad,1=good"))


def test_masked_backbone_accepts_text_after_slot(masked_backbone):
    encoder = masked_backbone.encoder(Template("{mask} : {text}"), Verbalizer.parse("0=bad,1=good"))
    batch = encoder.encode(["what is the answer"])
    assert batch.input_ids[0, batch.slot_index[0]] == masked_backbone.tokenizer.mask_token_id
    assert batch.slot_index[0] == 1  # right after [CLS]


def test_label_word_that_tokenizes_to_nothing_is_refused(causal_backbone):
    with pytest.raises(PromptError, match="tokenizes to nothing"):
        PromptEncoder(
            _EmptyWordTokenizer(causal_backbone.tokenizer),
            Template("{text} It was {mask}"),
            Verbalizer.parse("0=bad,1=\u200b"),
            "causal",
            48,
        )


class _EmptyWordTokenizer:
    """Wraps a tokenizer so that a zero-width space tokenizes to nothing (as many vocabularies do)."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __call__(self, text, **kwargs):
        if isinstance(text, str) and text.strip("\u200b ") == "":
            return {"input_ids": []}
        return self._inner(text, **kwargs)


def test_causal_slot_is_last_position_with_left_padding(causal_backbone):
    encoder = causal_backbone.encoder(Template("{text} It was {mask}"), Verbalizer.parse("0=bad,1=good"))
    batch = encoder.encode(["good", "the movie was great and fun , a good film"])
    width = batch.input_ids.shape[1]
    assert batch.slot_index.tolist() == [width - 1, width - 1]
    assert batch.attention_mask[0, 0] == 0 and batch.attention_mask[0, -1] == 1  # left padded
    assert batch.position_ids is not None
    assert batch.position_ids[0, -1] == batch.attention_mask[0].sum() - 1
    tokens = causal_backbone.tokenizer.convert_ids_to_tokens(batch.input_ids[1, -3:].tolist())
    assert "".join(tokens).replace("Ġ", " ").endswith("It was")


def test_label_words_take_the_space_before_the_slot(causal_backbone):
    tokenizer = causal_backbone.tokenizer
    encoder = causal_backbone.encoder(Template("{text} It was {mask}"), Verbalizer.parse("0=bad,1=good"))
    assert encoder.label_token_ids[1] == tokenizer(" good", add_special_tokens=False)["input_ids"]
    glued = causal_backbone.encoder(Template("{text} It was:{mask}"), Verbalizer.parse("0=bad,1=good"))
    assert glued.label_token_ids[1] == tokenizer("good", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("kind", ["masked", "causal"])
def test_truncation_shortens_only_the_text(kind, request):
    backbone = request.getfixturevalue(f"{kind}_backbone")
    template = Template("{text} It was {mask}")
    encoder = backbone.encoder(template, Verbalizer.parse("0=bad,1=good"))
    long_text = " ".join(["the movie was great and fun"] * 40)
    batch = encoder.encode([long_text, "a bad film"])
    assert batch.truncated.tolist() == [True, False]
    assert int(batch.attention_mask[0].sum()) == backbone.config.max_length
    row = batch.input_ids[0][batch.attention_mask[0].bool()].tolist()
    suffix = backbone.tokenizer(" It was", add_special_tokens=False)["input_ids"]
    tail = row[-len(suffix) :] if kind == "causal" else row[-len(suffix) - 2 : -2]  # masked: ... [MASK] [SEP]
    assert tail == suffix
    assert row[batch.slot_index[0] - (batch.input_ids.shape[1] - len(row) if kind == "causal" else 0)] == (
        row[-1] if kind == "causal" else backbone.tokenizer.mask_token_id
    )


def test_pair_truncation_cuts_the_longest_text_first(masked_backbone):
    encoder = masked_backbone.encoder(
        Template("{text_a} ? {mask} , {text_b}"), Verbalizer.parse("a=yes,b=no")
    )
    short = "yes it is true"
    batch = encoder.encode([(" ".join(["the movie was great"] * 30), short)])
    assert batch.truncated.tolist() == [True]
    row = batch.input_ids[0].tolist()
    short_ids = masked_backbone.tokenizer(short, add_special_tokens=False)["input_ids"]
    assert row[-len(short_ids) - 1 : -1] == short_ids  # text_b intact, before [SEP]


def test_template_too_long_for_max_length_is_refused(causal_backbone):
    words = " ".join(["the movie was great"] * 20)
    with pytest.raises(PromptError, match="no room for the input"):
        causal_backbone.encoder(Template(words + " {text} It was {mask}"), Verbalizer.parse("0=bad,1=good"))


@pytest.mark.parametrize("template", ["{text} It was {mask}", "Review: {text} It was {mask}"])
def test_a_blank_text_is_the_template_alone(backbone, template):
    encoder = backbone.encoder(Template(template), Verbalizer.parse("0=bad,1=good"))
    batch = encoder.encode(["", "   ", "\t"])
    rows = [ids[mask == 1].tolist() for ids, mask in zip(batch.input_ids, batch.attention_mask, strict=True)]
    assert rows[0] == rows[1] == rows[2]
    tokens = [i for i in rows[0] if i not in (*encoder.prefix, *encoder.suffix)]
    mask_id = [backbone.tokenizer.mask_token_id] if backbone.kind == "masked" else []
    words = backbone.tokenizer(template.split("{text}")[0].strip(), add_special_tokens=False)["input_ids"]
    assert (
        tokens
        == (words if "Review" in template else [])
        + backbone.tokenizer(" It was", add_special_tokens=False)["input_ids"]
        + mask_id
    )  # no stray token where the text would be, not even its space


def test_a_blank_text_with_nothing_else_to_read_is_refused(causal_backbone):
    encoder = causal_backbone.encoder(Template("{text}{mask}"), Verbalizer.parse("0=bad,1=good"))
    if encoder.prefix:
        pytest.skip("this tokenizer starts every prompt with a special token")
    with pytest.raises(PromptError, match="a blank text leaves this template an empty prompt"):
        encoder.encode(["fine", " "])


@pytest.mark.parametrize("bad", [5, ("a", "b"), None])
def test_a_text_of_the_wrong_type_is_refused(causal_backbone, bad):
    encoder = causal_backbone.encoder(Template("{text} It was {mask}"), Verbalizer.parse("0=bad,1=good"))
    with pytest.raises(PromptError, match="input 1"):
        encoder.encode(["fine", bad])


def test_demo_block_positions(backbone):
    verbalizer = Verbalizer.parse("0=bad,1=good,2=okay")
    encoder = backbone.encoder(Template("{text} It was {mask}"), verbalizer, demonstrations=True)
    batch = encoder.encode(["a bad film", "the movie was great and fun"])
    assert batch.demo_index is not None and batch.demo_index.shape == (2, 3)
    for row in range(2):
        for label, ids in enumerate(encoder.label_token_ids):
            start = int(batch.demo_index[row, label]) + 1  # the label word follows its placeholder
            assert batch.input_ids[row, start : start + len(ids)].tolist() == ids
    if backbone.kind == "causal":
        assert (batch.demo_index < batch.slot_index[:, None]).all()  # demos precede the causal slot
    else:
        assert (batch.demo_index > batch.slot_index[:, None]).all()
