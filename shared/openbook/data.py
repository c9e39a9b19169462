"""Reading the standard k-shot text-classification splits (LM-BFF layout).

Layout: ``<data_dir>/<task>/<shots>-<seed>/{train,dev}.{tsv,csv}`` plus one shared
``<data_dir>/<task>/test.{tsv,csv}``.

* ``.tsv`` files have a header; the ``label`` column is the label, an index column
  (``index``/``idx``/``id``) is ignored, and the remaining one or two columns are the text
  (or text pair, in column order).
* ``.csv`` files have no header: ``label,text`` or ``label,text_a,text_b``.
* ``.jsonl`` files (a user's examples, `read_split`; not a k-shot layout's splits) hold one object a
  line, ``{"text": ..., "label": ...}``: the text a string or a pair of strings, the label a string
  or an integer; other keys (an ``id``, as the service's examples carry) are ignored.

Labels stay the raw strings found in the file; mapping them to ids is the caller's job. Texts stay as
they are, a blank one included: some published splits have them (CR's has three), and a blank text
is still a prompt (the template alone), so dropping or refusing the row would change the benchmark.
"""

from __future__ import annotations

import csv
import json
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from openbook.classifier import Classifier

TextInput = str | tuple[str, str]
CsvQuoting = Literal[0, 1, 2, 3]  # csv.QUOTE_MINIMAL, QUOTE_ALL, QUOTE_NONNUMERIC, QUOTE_NONE

# The root of the evaluation data: k-shot/<task>/<shots>-<seed>/ and full/<task>/ below it.
DATA_ENV = "OPENBOOK_DATA"

INDEX_COLUMNS = frozenset({"index", "idx", "id"})
LABEL_COLUMN = "label"
SPLIT_SUFFIXES = (".tsv", ".csv")  # order is the preference when both exist
EXAMPLE_SUFFIXES = (*SPLIT_SUFFIXES, ".jsonl")  # what `read_split` reads


@dataclass(frozen=True)
class Example:
    text: TextInput
    label: str
    source: str  # "path:line", so later errors can point back at the data


class DataError(ValueError):
    """Raised for malformed data; the message names the file and the 1-based line number."""


def data_root(given: str | os.PathLike[str] | None = None) -> Path:
    """`given`, else `$OPENBOOK_DATA`: the directory holding k-shot/ and full/."""
    root = given or os.environ.get(DATA_ENV)
    if not root:
        raise DataError(f"give --data, or set {DATA_ENV} to the directory that holds k-shot/ and full/")
    return Path(root)


@dataclass(frozen=True)
class KShotSplits:
    train: list[Example]
    dev: list[Example]
    test: list[Example] | None  # None: not read (a dev-only evaluation: the lab's `eval --no-test`)
    # Test queries that fit none of the task's labels (its `oos_test` split, read with test): scored for
    # refusal only (clinc150's out-of-scope set); empty for a task without one.
    out_of_scope: list[Example] = field(default_factory=list)


def _error(path: Path, line: int, problem: str) -> DataError:
    return DataError(f"{path}:{line}: {problem}")


def _rows(
    path: Path, delimiter: str = ",", quoting: CsvQuoting = csv.QUOTE_MINIMAL
) -> Iterator[tuple[int, list[str]]]:
    """Yield (first physical line of the row, fields), skipping blank lines.

    utf-8-sig drops a byte-order mark that would otherwise corrupt the first header name;
    errors="replace" because some public dumps contain stray Latin-1 bytes.
    """
    with path.open(encoding="utf-8-sig", errors="replace", newline="") as handle:
        reader = csv.reader(handle, delimiter=delimiter, quoting=quoting)
        previous_end = 0
        for fields in reader:
            start_line = previous_end + 1
            # A quoted CSV field may span lines; the next row starts after this one ends.
            previous_end = reader.line_num
            if fields:
                yield start_line, fields


def _make_example(path: Path, line: int, texts: list[str], label: str) -> Example:
    if not label.strip():
        raise _error(path, line, "empty label field")
    text: TextInput = texts[0] if len(texts) == 1 else (texts[0], texts[1])
    return Example(text=text, label=label, source=f"{path}:{line}")


def _read_tsv(path: Path) -> list[Example]:
    # Real GLUE TSVs contain unbalanced quote characters inside sentences, so quoting must be off.
    rows = _rows(path, delimiter="\t", quoting=csv.QUOTE_NONE)
    header_line, header = next(rows, (1, []))
    if not header:
        raise _error(path, 1, "empty file: expected a header row")
    columns = [name.strip() for name in header]
    if LABEL_COLUMN not in columns:
        raise _error(path, header_line, f"header has no {LABEL_COLUMN!r} column (found {columns})")
    label_position = columns.index(LABEL_COLUMN)
    text_positions = [
        position
        for position, name in enumerate(columns)
        if name != LABEL_COLUMN and name.lower() not in INDEX_COLUMNS
    ]
    if not 1 <= len(text_positions) <= 2:
        text_names = [columns[position] for position in text_positions]
        raise _error(
            path, header_line, f"expected 1 or 2 text columns, found {len(text_positions)}: {text_names}"
        )

    examples = []
    for line, fields in rows:
        if len(fields) != len(columns):
            raise _error(path, line, f"expected {len(columns)} tab-separated fields, found {len(fields)}")
        texts = [fields[position] for position in text_positions]
        examples.append(_make_example(path, line, texts, fields[label_position]))
    if not examples:
        raise _error(path, header_line + 1, "no examples after the header")
    return examples


def _read_csv(path: Path) -> list[Example]:
    examples = []
    expected_fields: int | None = None
    for line, fields in _rows(path):
        if expected_fields is None:
            # The first row fixes single-text vs pair, so a file cannot mix the two.
            if len(fields) not in (2, 3):
                raise _error(
                    path, line, f"expected label,text or label,text_a,text_b; found {len(fields)} fields"
                )
            expected_fields = len(fields)
        elif len(fields) != expected_fields:
            raise _error(
                path, line, f"expected {expected_fields} fields like the first row, found {len(fields)}"
            )
        examples.append(_make_example(path, line, fields[1:], fields[0]))
    if not examples:
        raise _error(path, 1, "empty file: no examples")
    return examples


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _read_jsonl(path: Path) -> list[Example]:
    examples: list[Example] = []
    with path.open(encoding="utf-8-sig", errors="replace") as handle:
        for line, row in enumerate(handle, start=1):
            if not row.strip():
                continue
            try:
                record = json.loads(row)
            except json.JSONDecodeError as error:
                raise _error(path, line, f"not a JSON object: {error.msg}") from None
            if not isinstance(record, dict) or "text" not in record or "label" not in record:
                raise _error(path, line, 'expected an object with "text" and "label"')
            text, label = record["text"], record["label"]
            texts = [text] if isinstance(text, str) else text
            if not isinstance(texts, list) or len(texts) not in (1, 2) or not all(map(_is_str, texts)):
                raise _error(path, line, '"text" must be a string or a pair of strings')
            if isinstance(label, bool) or not isinstance(label, str | int):
                raise _error(path, line, '"label" must be a string or an integer')
            example = _make_example(path, line, texts, str(label))
            if examples and _is_pair(example) != _is_pair(examples[0]):  # as a .csv's first row decides
                raise _error(path, line, "a file holds single texts or pairs, not both")
            examples.append(example)
    if not examples:
        raise _error(path, 1, "empty file: no examples")
    return examples


def read_split(path: str | Path) -> list[Example]:
    """Read one ``.tsv``, ``.csv`` or ``.jsonl`` file of labelled examples, in file order."""
    path = Path(path)
    if path.suffix == ".tsv":
        return _read_tsv(path)
    if path.suffix == ".csv":
        return _read_csv(path)
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    raise _error(path, 1, f"unsupported file type {path.suffix!r}; expected one of {EXAMPLE_SUFFIXES}")


def find_split(directory: Path, name: str) -> Path:
    """Return ``directory/name.tsv`` or, failing that, ``directory/name.csv``."""
    candidates = [Path(directory) / f"{name}{suffix}" for suffix in SPLIT_SUFFIXES]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    looked_for = ", ".join(str(candidate) for candidate in candidates)
    raise FileNotFoundError(f"no {name!r} split found; looked for {looked_for}")


def _task_dir(data_dir: str | Path, task: str) -> Path:
    task_dir = Path(data_dir) / task
    if not task_dir.is_dir():
        raise FileNotFoundError(f"task directory not found: {task_dir}")
    return task_dir


def list_seeds(data_dir: str | Path, task: str, shots: int = 16) -> list[int]:
    """Seeds available for ``task``, read from its ``<shots>-<seed>`` directory names, sorted."""
    task_dir = _task_dir(data_dir, task)
    prefix = f"{shots}-"
    seeds = []
    for entry in task_dir.iterdir():
        suffix = entry.name.removeprefix(prefix)
        if entry.is_dir() and entry.name.startswith(prefix) and suffix.isdigit():
            seeds.append(int(suffix))
    if not seeds:
        # An empty list would let an evaluation loop silently run zero seeds.
        raise FileNotFoundError(f"no {prefix}<seed> directories in {task_dir}")
    return sorted(seeds)


def _is_pair(example: Example) -> bool:
    return isinstance(example.text, tuple)


def load_kshot(
    data_dir: str | Path, task: str, seed: int, shots: int = 16, *, test: bool = True
) -> KShotSplits:
    """Load train/dev of one seed plus the task's shared test split and out-of-scope queries where it has
    them (`oos_test`; neither opened with `test=False`)."""
    train, dev = load_train_dev(data_dir, task, seed, shots)
    test_split, out_of_scope = None, []
    if test:
        test_split = read_split(find_split(_task_dir(data_dir, task), "test"))
        _check_same_kind(train, test_split)
        if any((_task_dir(data_dir, task) / f"oos_test{suffix}").is_file() for suffix in SPLIT_SUFFIXES):
            out_of_scope = read_split(find_split(_task_dir(data_dir, task), "oos_test"))
            _check_same_kind(train, out_of_scope)
    return KShotSplits(train=train, dev=dev, test=test_split, out_of_scope=out_of_scope)


def load_train_dev(
    data_dir: str | Path, task: str, seed: int, shots: int = 16
) -> tuple[list[Example], list[Example]]:
    """Train and dev of one seed, and not the test split: for checks that must never read test."""
    seed_dir = _task_dir(data_dir, task) / f"{shots}-{seed}"
    if not seed_dir.is_dir():
        raise FileNotFoundError(f"seed directory not found: {seed_dir}")
    train = read_split(find_split(seed_dir, "train"))
    dev = read_split(find_split(seed_dir, "dev"))
    _check_same_kind(train, dev)
    return train, dev


def _check_same_kind(train: list[Example], split: list[Example]) -> None:
    """A pair task scored with single-text files (or vice versa) would fail much later and obscurely."""
    if _is_pair(split[0]) != _is_pair(train[0]):
        expected = "text pairs" if _is_pair(train[0]) else "single texts"
        raise DataError(f"{split[0].source}: expected {expected} like {train[0].source}")


def blank_texts(examples: Iterable[Example]) -> int:
    """How many of `examples` have a blank text (whitespace alone, or a pair with such a part)."""
    parts = ((e.text,) if isinstance(e.text, str) else e.text for e in examples)
    return sum(any(not part.strip() for part in text) for text in parts)


def example_labels(classifier: Classifier, examples: Sequence[Example]) -> np.ndarray:
    """The label indices of data examples under the classifier's labels; an unknown label is an error
    naming its file and line."""
    from openbook.prompting import PromptError

    indices = []
    for example in examples:
        try:
            indices.append(classifier.verbalizer.index(example.label))
        except PromptError as error:
            raise PromptError(f"{example.source}: {error}") from None
    return np.array(indices, dtype=np.int64)


def fixed_sample(examples: Sequence[Example], size: int | None) -> list[Example]:
    """At most `size` of `examples`, in file order: a sample fixed by seed 0, whatever the run's seed.

    Used where a test split is too large for the budget (QNLI's 5463 pairs): every method and seed is
    then scored on the same documented subset. `None` keeps them all.
    """
    if size is not None and size < 1:
        raise DataError(f"a test sample needs at least 1 example, got {size}")
    if size is None or size >= len(examples):
        return list(examples)
    keep = np.sort(np.random.default_rng(0).permutation(len(examples))[:size])
    return [examples[i] for i in keep]


def label_set(examples: Iterable[Example]) -> list[str]:
    """Distinct labels, sorted numerically when all are integers ("2" < "10"), else as strings."""
    labels = {example.label for example in examples}

    def is_integer(label: str) -> bool:
        try:
            int(label)
        except ValueError:
            return False
        return True

    if labels and all(is_integer(label) for label in labels):
        return sorted(labels, key=lambda label: int(label))
    return sorted(labels)


# The fully supervised setting: the original training sets in `full/` (one example per line,
# `label<space>text`). Which file plays which part, per task: the test file is the one the k-shot
# splits test on, so a full-data run and a 16-shot run are scored on the same sentences. For SST-2
# that is stsa.binary.dev (the 872 GLUE dev sentences that k-shot/SST-2/test holds), and dev is drawn
# from stsa.binary.test instead; for SST-5, test is stsa.fine.test (2210 sentences, as in k-shot).
FULL_LAYOUT: dict[str, tuple[str, str, str]] = {  # task -> (train, dev, test) file names
    "SST-2": ("stsa.binary.train", "stsa.binary.test", "stsa.binary.dev"),
    "sst-5": ("stsa.fine.train", "stsa.fine.dev", "stsa.fine.test"),
}


def read_full_split(path: str | Path, *, skip_blank_texts: bool = False) -> list[Example]:
    """Read a `label<space>text` file of `full/` (stray Latin-1 bytes are replaced). A line with a label
    and no text is an error, or skipped with `skip_blank_texts` (mpqa.all has one)."""
    path = Path(path)
    examples = []
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            label, _, text = line.rstrip("\n").partition(" ")
            if skip_blank_texts and label.strip() and not text.strip():
                continue
            if not label.strip() or not text.strip():
                raise _error(path, number, "expected 'label text'")
            examples.append(_make_example(path, number, [text.strip()], label.strip()))
    if not examples:
        raise DataError(f"{path}: no examples")
    return examples


def load_full(
    data_dir: str | Path, task: str, seed: int, dev_size: int = 256, *, test: bool = True
) -> KShotSplits:
    """The full training set of `task` from `data_dir` (the `full/` layout, see FULL_LAYOUT).

    Dev is a fixed random sample of `dev_size` examples of the dev file, drawn with `seed`, so that
    the dev checks during training stay cheap; test is read whole (never opened with `test=False`).
    """
    if task not in FULL_LAYOUT:
        raise DataError(f"no full-data layout for task {task!r}; known: {', '.join(FULL_LAYOUT)}")
    if dev_size < 1:
        raise DataError(f"dev_size must be at least 1, got {dev_size}")
    train_name, dev_name, test_name = FULL_LAYOUT[task]
    names = (train_name, dev_name, test_name) if test else (train_name, dev_name)
    paths = [Path(data_dir) / name for name in names]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"full-data split not found: {path}")
    train, dev, *tests = (read_full_split(path) for path in paths)
    rng = random.Random(seed)
    dev = [dev[i] for i in sorted(rng.sample(range(len(dev)), min(dev_size, len(dev))))]
    return KShotSplits(train=train, dev=dev, test=tests[0] if test else None)


# A training file and the test file for the tasks whose full training set is in `full/`: SST-2 and sst-5
# as in FULL_LAYOUT, and TREC, whose test file is the 500 questions that k-shot/trec tests on.
FULL_TRAIN_TEST: dict[str, tuple[str, str]] = {
    **{task: (train, test) for task, (train, _, test) in FULL_LAYOUT.items()},
    "trec": ("TREC.train.all", "TREC.test.all"),
}


def load_full_train_test(data_dir: str | Path, task: str) -> tuple[list[Example], list[Example]]:
    """(train, test) of `task` read whole from the `full/` directory `data_dir` (see FULL_TRAIN_TEST)."""
    names = {name.lower(): files for name, files in FULL_TRAIN_TEST.items()}
    if task.lower() not in names:
        raise DataError(f"no full training set for task {task!r}; known: {', '.join(FULL_TRAIN_TEST)}")
    paths = [Path(data_dir) / name for name in names[task.lower()]]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"full-data split not found: {path}")
    train, test = (read_full_split(path) for path in paths)
    return train, test
