"""Label words from label names (`label_names.py`): the rules one by one, and the sets refused."""

from __future__ import annotations

import pytest
from openbook.label_names import LabelNameError, readable_word, words_for_names


@pytest.mark.parametrize(
    ("name", "word"),
    [
        ("book_flight", "book flight"),
        ("what_is_your_name", "what is your name"),
        ("what-is-your-name", "what is your name"),
        ("  book   flight ", "book flight"),
        ("__book__flight__", "book flight"),
        ("camelCase", "camel case"),
        ("BookFlight", "book flight"),
        ("transferMoney2Savings", "transfer money2 savings"),
        ("HTTPError", "HTTP error"),
        ("report_SMS_fraud", "report SMS fraud"),
        ("rollover_401k", "rollover 401k"),
        ("Positive", "positive"),
        ("positive", "positive"),
        ("A", "A"),
        ("0", "0"),
        ("ÉtéChaud", "été chaud"),
    ],
)
def test_readable_word(name: str, word: str) -> None:
    assert readable_word(name) == word


@pytest.mark.parametrize("name", ["", " ", "_", "-_- "])
def test_a_name_with_no_word_in_it_is_refused(name: str) -> None:
    with pytest.raises(LabelNameError, match="no word"):
        readable_word(name)


def test_words_for_names_keeps_the_order_given() -> None:
    names = ["transfer", "book_flight", "whatIsYourName"]
    words = words_for_names(names)
    assert list(words) == names
    assert list(words.values()) == ["transfer", "book flight", "what is your name"]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["book_flight", "transfer", "book_flight"], "'book_flight' appears twice"),
        (["book_flight", " "], "empty"),
        (["book_flight", "___"], "no word"),
        (["book_flight", "transfer", "BookFlight"], "'book_flight' and 'BookFlight' both make the word"),
        (["book-flight", "book_flight"], "both make the word 'book flight'"),
    ],
)
def test_words_for_names_refuses(names: list[str], message: str) -> None:
    with pytest.raises(LabelNameError, match=message):
        words_for_names(names)
