"""The prompt encoder on the tiny backbones: slot positions, padding, label words, truncation, demo blocks."""

import numpy as np
import pytest
import torch
from openbook.prompting import PromptEncoder, PromptError, Template, TokenizedTexts, Verbalizer, join_texts


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
    with pytest.raises(PromptError, match="a blank text leaves this template an empty prompt"):
        encoder.prompt_lengths(["fine", " "])  # as a server counts it, before the forward


@pytest.mark.parametrize("bad", [5, ("a", "b"), None])
def test_a_text_of_the_wrong_type_is_refused(causal_backbone, bad):
    encoder = causal_backbone.encoder(Template("{text} It was {mask}"), Verbalizer.parse("0=bad,1=good"))
    with pytest.raises(PromptError, match="input 1"):
        encoder.encode(["fine", bad])


def test_demo_block_positions(backbone):
    verbalizer = Verbalizer.parse("0=bad,1=good,2=okay")
    encoder = backbone.encoder(Template("{text} It was {mask}"), verbalizer, demonstrations="vectors")
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


def _row(batch, i=0):
    return batch.input_ids[i][batch.attention_mask[i].bool()].tolist()


def _filled(backbone, template, verbalizer, text, label=None):
    """The template instance of `text` (no specials), its slot holding `label`'s word, or the mask/nothing."""
    plain = backbone.encoder(template, verbalizer)
    row = _row(plain.encode([text]))
    body = row[len(plain.prefix) : len(row) - len(plain.suffix)]
    if label is None:
        return body
    if backbone.kind == "causal":
        return body + plain.label_token_ids[label]
    slot = body.index(backbone.tokenizer.mask_token_id)
    return body[:slot] + plain.label_token_ids[label] + body[slot + 1 :]


@pytest.mark.parametrize("pair", [False, True])
def test_text_demonstrations_are_filled_templates_in_the_given_order(backbone, pair):
    template = Template("{text_a} ? {mask} , {text_b}" if pair else "{text} It was {mask}")
    if backbone.kind == "causal" and pair:
        template = Template("{text_a} ? {text_b} , {mask}")
    verbalizer = Verbalizer.parse("0=bad,1=good,2=okay")
    encoder = backbone.encoder(template, verbalizer, demonstrations="text")
    texts = [("a bad film", "no"), ("great fun", "yes"), ("it was okay", "yes")]  # all fit in max_length
    texts = texts if pair else [a for a, _ in texts]
    query = ("what is it", "the book") if pair else "what is the answer"
    demos = [(texts[2], 2), (texts[0], 0), (texts[1], 1)]  # shown exactly in the order given
    batch = encoder.encode([query], demos=[demos])
    separator = backbone.tokenizer("\n", add_special_tokens=False)["input_ids"]
    instances = [_filled(backbone, template, verbalizer, text, label) for text, label in demos]
    own = _filled(backbone, template, verbalizer, query)
    if backbone.kind == "causal":
        expected = encoder.prefix + [t for i in instances for t in i + separator] + own
        assert batch.slot_index[0] == batch.input_ids.shape[1] - 1
    else:
        expected = encoder.prefix + own + [t for i in instances for t in separator + i] + encoder.suffix
        assert batch.input_ids[0, batch.slot_index[0]] == backbone.tokenizer.mask_token_id
    assert _row(batch) == expected
    assert batch.truncated.tolist() == [False] and batch.demo_index is None


def test_text_demonstrations_are_cut_to_fit_and_never_the_input(causal_backbone):
    template, verbalizer = Template("{text} It was {mask}"), Verbalizer.parse("0=bad,1=good")
    encoder = causal_backbone.encoder(template, verbalizer, demonstrations="text")
    max_length = causal_backbone.config.max_length
    long_demo = " ".join(["the movie was great and fun"] * 10)
    query = "a bad film , it was awful"
    own = _filled(causal_backbone, template, verbalizer, query)
    word = encoder.label_token_ids
    # Both demonstrations kept, their texts shortened: the row fills max_length exactly.
    batch = encoder.encode([query], demos=[[(long_demo, 0), (long_demo, 1)]])
    row = _row(batch)
    assert len(row) == max_length and row[-len(own) :] == own and batch.truncated.tolist() == [False]
    assert row.count(word[0][0]) >= 1 and row.count(word[1][0]) >= 1  # each still shows its label word
    # An input that takes all the room: every demonstration goes, the input is cut as without them.
    long_query = " ".join(["it was terrible and boring"] * 20)
    alone = causal_backbone.encoder(template, verbalizer).encode([long_query])
    crowded = encoder.encode([long_query], demos=[[(long_demo, 0), (long_demo, 1)]])
    assert _row(crowded) == _row(alone) and crowded.truncated.tolist() == [True]
    # Room for one demonstration at one token of text but not for two: the last one is dropped.
    filled = len(_filled(causal_backbone, template, verbalizer, "great", 0)) + len(encoder._separator)
    fits_one = " ".join(["fun"] * (max_length - len(encoder.prefix) - filled - 10))
    one = _row(encoder.encode([fits_one], demos=[[("great", 0), ("great", 1)]]))
    assert len(one) <= max_length and word[0][0] in one and word[1][0] not in one


def test_text_layout_needs_its_demonstrations(causal_backbone):
    template, verbalizer = Template("{text} It was {mask}"), Verbalizer.parse("0=bad,1=good")
    with pytest.raises(ValueError, match="one list of demonstrations per text"):
        causal_backbone.encoder(template, verbalizer, demonstrations="text").encode(["a film"])
    with pytest.raises(ValueError, match="one list of demonstrations per text"):
        causal_backbone.encoder(template, verbalizer).encode(["a film"], demos=[[("great", 1)]])


def _padded_row_by_row(encoder, rows, slots, literals):
    """The batch padded one row at a time: the reference the vectorised `_pad` must reproduce."""
    width = max(len(r) for r in rows)
    left = encoder.kind == "causal"
    ids = torch.full((len(rows), width), encoder.pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    template_mask = torch.zeros((len(rows), width), dtype=torch.bool)
    shifts = []
    for i, row in enumerate(rows):
        shift = width - len(row) if left else 0
        ids[i, shift : shift + len(row)] = torch.tensor(row)
        mask[i, shift : shift + len(row)] = 1
        template_mask[i, [shift + p for p in literals[i]]] = True
        shifts.append(shift)
    return ids, mask, template_mask, torch.tensor(slots) + torch.tensor(shifts)


def test_padding_a_batch_at_once_matches_padding_row_by_row(backbone):
    encoder = backbone.encoder(Template("{text} It was {mask}"), Verbalizer.parse("0=bad,1=good"))
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, size=300)
    rows = [rng.integers(5, 90, size=n).tolist() for n in lengths]
    literals = [sorted(rng.choice(n, size=rng.integers(0, n + 1), replace=False).tolist()) for n in lengths]
    slots = [int(rng.integers(0, n)) for n in lengths]
    batch = encoder._pad(rows, slots, [0] * len(rows), literals, [False] * len(rows), None)
    ids, mask, template_mask, slot_index = _padded_row_by_row(encoder, rows, slots, literals)
    assert torch.equal(batch.input_ids, ids)
    assert torch.equal(batch.attention_mask, mask)
    assert torch.equal(batch.template_mask, template_mask)
    assert torch.equal(batch.slot_index, slot_index)
    assert (batch.position_ids is not None) == (encoder.kind == "causal")


def _pairs_block(encoder, classes):
    """The `vectors` block as each class's placeholder then label word, for `classes` in the order given."""
    return [t for c in classes for t in (encoder.pad_id, *encoder.label_token_ids[c])]


def _block_of(batch, row, length):
    """Row `row`'s `length` tokens from its first demonstration placeholder on."""
    at = int(batch.demo_index[row, 0])
    return batch.input_ids[row, at : at + length].tolist()


def _fields(batch):
    return [batch.input_ids, batch.attention_mask, batch.slot_index, batch.demo_index, batch.template_mask]


@pytest.mark.parametrize("labels", ["0=bad,1=good", "0=bad,1=good,2=okay,3=what,4=who,5=where"])
def test_every_class_shown_is_each_labels_pair_in_label_order(backbone, labels):
    """A task of no more labels than `demo_classes` gets the block it always had: every label's pair, in
    label order, in one place (before the causal body, after the masked one), the text cut to fit."""
    verbalizer, template = Verbalizer.parse(labels), Template("{text} It was {mask}")
    encoder = backbone.encoder(template, verbalizer, demonstrations="vectors", demo_classes=16)
    plain = backbone.encoder(template, verbalizer)
    texts = ["a bad film", "the movie was great and fun", " ".join(["it was awful"] * 30)]
    batch = encoder.encode(texts)
    count = len(verbalizer.labels)
    block = _pairs_block(encoder, range(count))
    assert encoder.demo_classes == count and encoder.text_budget == plain.text_budget - len(block)
    assert batch.demo_index is not None
    for row, text in enumerate(texts):
        got, own = _row(batch, row), _row(plain.encode([text]))
        at = int(batch.demo_index[row, 0]) - (
            batch.input_ids.shape[1] - len(got) if backbone.kind == "causal" else 0
        )
        assert got[at : at + len(block)] == block
        if backbone.kind == "causal":
            assert at == len(encoder.prefix)
        else:
            assert got[at + len(block) :] == encoder.suffix
        assert len(got) == min(len(own) + len(block), backbone.config.max_length)
    sizes = [1 + len(ids) for ids in encoder.label_token_ids]
    offsets = (batch.demo_index - batch.demo_index[:, :1]).tolist()
    assert offsets == [[sum(sizes[:c]) for c in range(count)]] * len(texts)
    # every class given, in label order: the same rows
    given = encoder.encode(texts, classes=np.tile(np.arange(count), (len(texts), 1)))
    assert all(torch.equal(a, b) for a, b in zip(_fields(given), _fields(batch), strict=True))


def test_each_row_shows_the_pairs_of_its_own_classes(backbone):
    verbalizer = Verbalizer.parse("0=bad,1=good,2=okay,3=what,4=who")
    template = Template("{text} It was {mask}")
    encoder = backbone.encoder(template, verbalizer, demonstrations="vectors", demo_classes=2)
    assert encoder.demo_classes == 2
    longest_two = sorted((1 + len(ids) for ids in encoder.label_token_ids), reverse=True)[:2]
    assert encoder.text_budget == backbone.encoder(template, verbalizer).text_budget - sum(longest_two)
    classes = np.array([[0, 3], [4, 1]])
    batch = encoder.encode(["a bad film", "who wrote the book"], classes=classes)
    assert batch.demo_index is not None and batch.demo_index.shape == (2, 2)
    for row in range(2):
        block = _pairs_block(encoder, classes[row])
        assert _block_of(batch, row, len(block)) == block
        second = int(batch.demo_index[row, 1])  # the second class's placeholder follows the first's word
        assert second == int(batch.demo_index[row, 0]) + 1 + len(encoder.label_token_ids[classes[row, 0]])
    with pytest.raises(ValueError, match="give each row's classes"):
        encoder.encode(["a bad film"])
    with pytest.raises(ValueError, match=r"classes must be \(1, K\) with 1 <= K <= 2"):
        encoder.encode(["a bad film"], classes=np.array([[0, 1, 2]]))
    with pytest.raises(ValueError, match="label indices below 5"):
        encoder.encode(["a bad film"], classes=np.array([[0, 5]]))
    with pytest.raises(ValueError, match="only an encoder with the vectors layout"):
        backbone.encoder(template, verbalizer).encode(["a bad film"], classes=classes[:1])


def test_many_labels_show_as_many_classes_as_fit(causal_backbone, intent_names):
    """150 intents' pairs cannot fit max_length 48: the encoder shows the most classes whose longest pairs
    still leave a token for the text, and a row of any of them fits."""
    names = intent_names(causal_backbone.tokenizer)
    verbalizer = Verbalizer(tuple(map(str, range(150))), tuple(names))
    template = Template("{text} It was {mask}")
    with pytest.raises(ValueError, match="demo_classes must be at least 1"):
        causal_backbone.encoder(template, verbalizer, demonstrations="vectors", demo_classes=0)
    encoder = causal_backbone.encoder(template, verbalizer, demonstrations="vectors", demo_classes=16)
    room = causal_backbone.encoder(template, verbalizer).text_budget - 1  # one token left for the text
    widest = np.sort([1 + len(ids) for ids in encoder.label_token_ids])[::-1]
    shown = encoder.demo_classes
    assert 1 <= shown < 16 and widest[:shown].sum() <= room < widest[: shown + 1].sum()
    longest = np.argsort([-len(ids) for ids in encoder.label_token_ids], kind="stable")[:shown]
    batch = encoder.encode([" ".join(["the movie was great and fun"] * 20)], classes=np.sort(longest)[None])
    assert int(batch.attention_mask.sum()) == causal_backbone.config.max_length and batch.truncated.all()
    assert len(_row(batch)) == causal_backbone.config.max_length


def test_a_template_with_no_room_for_one_demonstration_is_refused(causal_backbone):
    verbalizer = Verbalizer.parse("0=bad,1=good")
    plain_budget = causal_backbone.encoder(Template("{text} It was {mask}"), verbalizer).text_budget
    filler = " ".join(["the"] * (plain_budget - 2))  # leaves the text 2 tokens: no room for a pair and text
    template = Template(filler + " {text} It was {mask}")
    assert causal_backbone.encoder(template, verbalizer).text_budget >= 1  # the plain prompt fits
    with pytest.raises(PromptError, match=r"template and one demonstration take .* no room for the input"):
        causal_backbone.encoder(template, verbalizer, demonstrations="vectors")
    texts = causal_backbone.encoder(template, verbalizer, demonstrations="text")  # drops what does not fit
    assert texts.text_budget >= 1


def _same_batch(a, b) -> None:
    for name in ("input_ids", "attention_mask", "position_ids", "slot_index", "truncated", "template_mask"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None and y is None) or torch.equal(x, y), name


LONG = " ".join(["the plot was okay , not good , not bad"] * 8)  # over max_length: cut to fit


@pytest.mark.parametrize("pair", [False, True])
def test_tokenized_texts_encode_as_the_texts_do_and_are_not_tokenized_again(backbone, pair, count_tokenized):
    template = Template("{text_a} ? {text_b} , {mask}" if pair else "Review: {text} It was {mask}")
    encoder = backbone.encoder(template, Verbalizer.parse("0=bad,1=good"))
    texts = [("yes", "a good film"), (LONG, "no"), ("what is it", LONG)] if pair else ["yes", LONG, "a film"]
    expected = encoder.encode(texts)
    seen = count_tokenized(backbone.tokenizer)
    tokenized = encoder.tokenize(texts)
    assert list(tokenized) == texts and len(tokenized) == 3 and tokenized[1] == texts[1]
    assert sum(seen.values()) == 3 * (2 if pair else 1)  # each field of each text, once
    seen.clear()
    _same_batch(encoder.encode(tokenized), expected)
    _same_batch(encoder.encode(tokenized[1:]), encoder.encode(texts[1:]))  # a slice keeps its tokens
    _same_batch(encoder.encode(tokenized.select([2, 0])), encoder.encode([texts[2], texts[0]]))
    seen.clear()
    encoder.encode(tokenized.select([2, 0]))
    assert encoder.tokenize(tokenized) is tokenized and sum(seen.values()) == 0
    # what the prompts take, before padding: the encoder's own rows, the cut one at max_length
    lengths = encoder.prompt_lengths(tokenized)
    assert lengths.tolist() == expected.attention_mask.sum(dim=1).tolist()
    assert lengths[1] == encoder.max_length and bool(expected.truncated[1])


def test_an_encoder_with_demonstrations_reads_the_plain_encoders_tokens(causal_backbone, count_tokenized):
    template, verbalizer = Template("{text} It was {mask}"), Verbalizer.parse("0=bad,1=good")
    plain = causal_backbone.encoder(template, verbalizer)
    demo = causal_backbone.encoder(template, verbalizer, demonstrations="text")
    texts, demos = ["a good film", LONG], [[("great fun", 1)], [("boring", 0)]]
    expected = demo.encode(texts, demos=demos)
    tokenized = plain.tokenize(texts)
    seen = count_tokenized(causal_backbone.tokenizer)
    _same_batch(demo.encode(tokenized, demos=demos), expected)
    assert seen == {"great fun": 1, "boring": 1}  # the demonstrations' texts only
    with pytest.raises(ValueError, match="as long as what is retrieved"):
        demo.prompt_lengths(tokenized)


def test_texts_tokenized_for_another_template_or_tokenizer_are_tokenized_again(
    causal_backbone, masked_backbone, count_tokenized
):
    verbalizer = Verbalizer.parse("0=bad,1=good")
    texts = ["a good film", "it was terrible and boring"]
    first = causal_backbone.encoder(Template("{text} It was {mask}"), verbalizer)
    spaced = causal_backbone.encoder(Template("Review: {text} It was {mask}"), verbalizer)  # " a good film"
    masked = masked_backbone.encoder(Template("{text} It was {mask}"), verbalizer)
    tokenized = first.tokenize(texts)
    for other in (spaced, masked):
        seen = count_tokenized(other.tokenizer)
        _same_batch(other.encode(tokenized), other.encode(texts))
        assert seen["a good film"] == 2  # tokenized anew each time: the first encoder's ids do not fit


def test_joined_texts_keep_their_tokens_only_where_one_encoder_made_them_all(causal_backbone):
    verbalizer = Verbalizer.parse("0=bad,1=good")
    encoder = causal_backbone.encoder(Template("{text} It was {mask}"), verbalizer)
    other = causal_backbone.encoder(Template("Review: {text} It was {mask}"), verbalizer)
    a, b = encoder.tokenize(["a good film"]), encoder.tokenize(["boring", LONG])
    joined = join_texts([a, b])
    assert isinstance(joined, TokenizedTexts) and list(joined) == ["a good film", "boring", LONG]
    _same_batch(encoder.encode(joined), encoder.encode(list(joined)))
    assert join_texts([a]) is a
    for parts in ([a, other.tokenize(["boring"])], [a, ["boring"]]):
        mixed = join_texts(parts)
        assert not isinstance(mixed, TokenizedTexts) and mixed == ["a good film", "boring"]
