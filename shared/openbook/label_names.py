"""Label words from label names: `book_flight` is scored as "book flight".

Real label sets name their labels for code (`book_flight`, `what-is-your-name`, `transferMoney`), while
the LM scores a label by a word it can read. `readable_word` turns one into the other, so that a task can
be given its label names alone:

- `_`, `-` and runs of whitespace separate words (`book_flight`, `book-flight` -> "book flight");
- a capital after a lower-case letter or a digit starts a word (`transferMoney` -> "transfer money"), as
  does the last capital of a run before a lower-case letter (`HTTPError` -> "HTTP error");
- a word that is a capital followed by lower-case letters is lower-cased (`BookFlight` -> "book
  flight"), and every other word is kept as it is: acronyms (`SMS`), digits (`401k`), lower case.

Two names may become the same word (`book_flight`, `BookFlight`): `words_for_names` refuses such a set,
since two labels scored by one word cannot be told apart by the LM.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_SEPARATORS = re.compile(r"[\s_\-]+")


class LabelNameError(ValueError):
    """A label name that is empty, repeated, or has no word in it, or two names that make one word."""


def readable_word(name: str) -> str:
    """The word a label called `name` is scored by (the module's docstring has the rules)."""
    words = [_as_word(piece) for part in _SEPARATORS.split(name) for piece in _camel_pieces(part)]
    word = " ".join(w for w in words if w)
    if not word:
        raise LabelNameError(f"label name {name!r} has no word in it (only separators: _ - and spaces)")
    return word


def words_for_names(names: Sequence[str]) -> dict[str, str]:
    """Label name -> its readable word, in the order given; LabelNameError if a name is empty, repeats,
    or makes the same word as another."""
    words: dict[str, str] = {}
    named: dict[str, str] = {}  # word -> the first name that made it
    for name in names:
        if not name.strip():
            raise LabelNameError("a label name is empty")
        if name in words:
            raise LabelNameError(f"label name {name!r} appears twice")
        word = readable_word(name)
        if word in named:
            raise LabelNameError(
                f"label names {named[word]!r} and {name!r} both make the word {word!r}: give the labels "
                "as an object of label -> word to tell them apart"
            )
        words[name], named[word] = word, name
    return words


def _camel_pieces(part: str) -> list[str]:
    """`part` cut before each capital that starts a word (see the module's docstring)."""
    pieces, start = [], 0
    for i in range(1, len(part)):
        before, here, after = part[i - 1], part[i], part[i + 1 : i + 2]
        if here.isupper() and (
            before.islower() or before.isdigit() or (before.isupper() and after.islower())
        ):
            pieces.append(part[start:i])
            start = i
    pieces.append(part[start:])
    return pieces


def _as_word(piece: str) -> str:
    return piece.lower() if piece[:1].isupper() and piece[1:].islower() else piece
