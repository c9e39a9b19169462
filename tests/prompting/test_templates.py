"""Templates and verbalizers: what they parse, and what they refuse with a message saying why."""

import pytest
from openbook.prompting import PromptError, Template, Verbalizer


def test_template_parses_fields_and_slot():
    single = Template("{text} It was {mask} .")
    assert not single.is_pair and not single.slot_at_end
    pair = Template("{text_a} ? {mask} , {text_b}")
    assert pair.is_pair
    assert Template("{text} It was {mask}  ").slot_at_end


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{text} It was", "exactly one {mask}"),
        ("{text} {mask} {mask}", "exactly one {mask}"),
        ("It was {mask}", "{text}"),
        ("{text_a} {mask}", "{text_a} and {text_b}"),
        ("{text} {mask} {label}", "unknown placeholder"),
    ],
)
def test_bad_templates_say_what_is_wrong(source, message):
    with pytest.raises(PromptError, match=message.replace("{", r"\{").replace("}", r"\}")):
        Template(source)


def test_verbalizer_parse_and_errors():
    verbalizer = Verbalizer.parse("0=terrible, 1=great")
    assert verbalizer.labels == ("0", "1") and verbalizer.words == ("terrible", "great")
    assert verbalizer.index("1") == 1
    with pytest.raises(PromptError, match="unknown label"):
        verbalizer.index("2")
    with pytest.raises(PromptError, match="label=word"):
        Verbalizer.parse("0=bad,1:good")  # a word for one label and not for the other
    with pytest.raises(PromptError, match="at least 2 labels"):
        Verbalizer.parse("0=bad")
    with pytest.raises(PromptError, match="same word"):
        Verbalizer.parse("0=bad,1=bad")


def test_verbalizer_parses_label_names_alone_into_their_readable_words():
    verbalizer = Verbalizer.parse("book_flight, transferMoney,what-is-your-name")
    assert verbalizer.labels == ("book_flight", "transferMoney", "what-is-your-name")
    assert verbalizer.words == ("book flight", "transfer money", "what is your name")
    with pytest.raises(PromptError, match="both make the word 'book flight'"):
        Verbalizer.parse("book_flight,BookFlight")
    with pytest.raises(PromptError, match="empty"):
        Verbalizer.parse("book_flight,,transfer")
