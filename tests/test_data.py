"""Tests for openbook.data: tiny generated files, plus one check against the real k-shot splits."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from openbook.data import (
    DATA_ENV,
    DataError,
    Example,
    KShotSplits,
    blank_texts,
    data_root,
    find_split,
    label_set,
    list_seeds,
    load_full,
    load_kshot,
    load_train_dev,
    read_split,
)


def write(path: Path, content: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    return path


def assert_data_error(path: Path, line: int, fragment: str) -> None:
    with pytest.raises(DataError) as raised:
        read_split(path)
    message = str(raised.value)
    assert path.name in message
    assert re.search(rf":{line}:", message), message
    assert fragment in message


def test_tsv_single_text_keeps_quotes_and_raw_labels(tmp_path: Path) -> None:
    path = write(tmp_path / "train.tsv", 'sentence\tlabel\n"great" fun , isn\'t it .\t1\na dud .\t0\n')
    examples = read_split(path)
    assert examples == [
        Example(text='"great" fun , isn\'t it .', label="1", source=f"{path}:2"),
        Example(text="a dud .", label="0", source=f"{path}:3"),
    ]


def test_tsv_pair_ignores_index_column_and_keeps_column_order(tmp_path: Path) -> None:
    path = write(
        tmp_path / "dev.tsv",
        'index\tquestion\tsentence\tlabel\n7\tWho won?\tThe "Reds" won.\tentailment\n',
    )
    [example] = read_split(path)
    assert example.text == ("Who won?", 'The "Reds" won.')
    assert example.label == "entailment"


def test_tsv_label_column_need_not_be_last(tmp_path: Path) -> None:
    path = write(tmp_path / "x.tsv", "label\tidx\ttext\nneg\t0\tbad\n")
    assert read_split(path) == [Example(text="bad", label="neg", source=f"{path}:2")]


def test_csv_single_text_with_quoted_commas(tmp_path: Path) -> None:
    path = write(tmp_path / "test.csv", '3,"slow , but \'s fine , really"\n0,plain text\n')
    examples = read_split(path)
    assert [example.text for example in examples] == ["slow , but 's fine , really", "plain text"]
    assert [example.label for example in examples] == ["3", "0"]
    assert examples[1].source == f"{path}:2"


def test_csv_pair(tmp_path: Path) -> None:
    path = write(tmp_path / "train.csv", '1,first part,"second, part"\n')
    assert read_split(path) == [Example(text=("first part", "second, part"), label="1", source=f"{path}:1")]


def test_csv_line_numbers_follow_multiline_quoted_fields(tmp_path: Path) -> None:
    path = write(tmp_path / "train.csv", '1,"spans\ntwo lines"\n0,next\n')
    examples = read_split(path)
    assert examples[0].text == "spans\ntwo lines"
    assert examples[1].source == f"{path}:3"


def test_latin1_bytes_are_replaced_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "train.csv"
    path.write_bytes(b"1,caf\xe9 au lait\n")
    [example] = read_split(path)
    assert example.text == "caf\ufffd au lait"


def test_tsv_wrong_field_count(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.tsv", "sentence\tlabel\nfine\t1\ntoo\tmany\t0\n")
    assert_data_error(path, 3, "expected 2")


def test_csv_wrong_field_count(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.csv", "1,one text\n0,a,pair\n")
    assert_data_error(path, 2, "found 3")


def test_csv_first_row_with_only_a_label(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.csv", "1\n")
    assert_data_error(path, 1, "found 1 fields")


@pytest.mark.parametrize(
    ("file_name", "content", "line"),
    [
        ("blank.tsv", "sentence\tlabel\nok\t1\n   \t0\n", 3),
        ("blank.csv", '1,ok\n0,""\n', 2),
        ("blank_pair.tsv", "index\tsentence1\tsentence2\tlabel\n0\tpremise\t \tentailment\n", 2),
    ],
)
def test_a_blank_text_is_kept_as_it_is_and_counted(
    tmp_path: Path, file_name: str, content: str, line: int
) -> None:
    examples = read_split(write(tmp_path / file_name, content))
    blank = next(e for e in examples if e.source.endswith(f":{line}"))
    assert blank.text in ("   ", "", ("premise", " "))  # not stripped, not dropped
    assert blank_texts(examples) == 1


def test_empty_label_field(tmp_path: Path) -> None:
    assert_data_error(write(tmp_path / "nolabel.csv", ",some text\n"), 1, "empty label")


def test_tsv_missing_label_column(tmp_path: Path) -> None:
    assert_data_error(write(tmp_path / "h.tsv", "sentence\ttarget\nok\t1\n"), 1, "'label'")


def test_tsv_without_text_columns(tmp_path: Path) -> None:
    assert_data_error(write(tmp_path / "h.tsv", "index\tlabel\n0\t1\n"), 1, "found 0")


def test_tsv_with_three_text_columns(tmp_path: Path) -> None:
    assert_data_error(write(tmp_path / "h.tsv", "a\tb\tc\tlabel\nx\ty\tz\t1\n"), 1, "found 3")


@pytest.mark.parametrize(
    ("file_name", "content", "line", "fragment"),
    [
        ("empty.tsv", "", 1, "empty file"),
        ("header_only.tsv", "sentence\tlabel\n", 2, "no examples"),
        ("empty.csv", "", 1, "empty file"),
    ],
)
def test_empty_split_file(tmp_path: Path, file_name: str, content: str, line: int, fragment: str) -> None:
    assert_data_error(write(tmp_path / file_name, content), line, fragment)


def test_jsonl_reads_texts_pairs_and_integer_labels_ignoring_other_keys(tmp_path: Path) -> None:
    rows = '{"id": 7, "text": "a good film", "label": 1}\n\n{"text": "a bad, \\"dull\\" film", "label": "0"}'
    examples = read_split(write(tmp_path / "mine.jsonl", rows + "\n"))
    assert [(e.text, e.label, e.source.rsplit(":", 1)[1]) for e in examples] == [
        ("a good film", "1", "1"),
        ('a bad, "dull" film', "0", "3"),  # a blank line is skipped, the numbering kept
    ]
    pairs = read_split(write(tmp_path / "pairs.jsonl", '{"text": ["a", "b"], "label": "entailment"}\n'))
    assert pairs[0].text == ("a", "b")


@pytest.mark.parametrize(
    ("content", "line", "fragment"),
    [
        ('{"text": "a", "label": 1}\n{"text": "b"\n', 2, "not a JSON object"),
        ('{"text": "a", "label": 1}\n["b", 0]\n', 2, 'with "text" and "label"'),
        ('{"text": ["a", "b", "c"], "label": 1}\n', 1, "a string or a pair of strings"),
        ('{"text": "a", "label": true}\n', 1, '"label" must be'),
        ('{"text": "a", "label": ""}\n', 1, "empty label field"),
        ('{"text": "a", "label": 1}\n{"text": ["b", "c"], "label": 0}\n', 2, "not both"),
        ("\n", 1, "empty file"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path: Path, content: str, line: int, fragment: str) -> None:
    assert_data_error(write(tmp_path / "mine.jsonl", content), line, fragment)


def test_unsupported_extension(tmp_path: Path) -> None:
    assert_data_error(write(tmp_path / "train.txt", "1 text\n"), 1, "unsupported")


def test_find_split_prefers_tsv_then_falls_back_to_csv(tmp_path: Path) -> None:
    write(tmp_path / "train.csv", "1,a\n")
    assert find_split(tmp_path, "train") == tmp_path / "train.csv"
    write(tmp_path / "train.tsv", "sentence\tlabel\na\t1\n")
    assert find_split(tmp_path, "train") == tmp_path / "train.tsv"


def test_find_split_missing_lists_candidates(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as raised:
        find_split(tmp_path, "dev")
    message = str(raised.value)
    assert str(tmp_path / "dev.tsv") in message
    assert str(tmp_path / "dev.csv") in message


def make_layout(root: Path, task: str, seeds: list[int], shots: int = 16) -> None:
    for seed in seeds:
        write(root / task / f"{shots}-{seed}" / "train.csv", f"0,train a {seed}\n1,train b {seed}\n")
        write(root / task / f"{shots}-{seed}" / "dev.csv", f"1,dev {seed}\n")
    write(root / task / "test.csv", "0,test a\n1,test b\n1,test c\n")


def test_list_seeds_sorted_numerically_and_ignores_other_entries(tmp_path: Path) -> None:
    make_layout(tmp_path, "trec", [100, 13, 21])
    make_layout(tmp_path, "trec", [5], shots=4)
    (tmp_path / "trec" / "16-notes").mkdir()
    write(tmp_path / "trec" / "16-99", "a file, not a seed directory")
    assert list_seeds(tmp_path, "trec") == [13, 21, 100]
    assert list_seeds(tmp_path, "trec", shots=4) == [5]


def test_list_seeds_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nosuchtask"):
        list_seeds(tmp_path, "nosuchtask")
    (tmp_path / "emptytask").mkdir()
    with pytest.raises(FileNotFoundError, match="16-<seed>"):
        list_seeds(tmp_path, "emptytask")


def test_load_kshot_reads_seed_splits_and_shared_test(tmp_path: Path) -> None:
    make_layout(tmp_path, "mpqa", [13, 42])
    splits = load_kshot(tmp_path, "mpqa", 42)
    assert isinstance(splits, KShotSplits)
    assert [example.text for example in splits.train] == ["train a 42", "train b 42"]
    assert [example.text for example in splits.dev] == ["dev 42"]
    assert len(splits.test) == 3
    assert splits.test[0].source == f"{tmp_path / 'mpqa' / 'test.csv'}:1"


def test_without_test_the_test_file_is_never_opened(tmp_path: Path) -> None:
    make_layout(tmp_path, "mpqa", [13])
    (tmp_path / "mpqa" / "test.csv").write_text("not,a,valid\nfile\n")  # reading it would fail
    splits = load_kshot(tmp_path, "mpqa", 13, test=False)
    assert splits.test is None and [e.text for e in splits.dev] == ["dev 13"]
    (tmp_path / "mpqa" / "test.csv").unlink()
    assert load_kshot(tmp_path, "mpqa", 13, test=False).train == splits.train

    full = _write_full(tmp_path / "full", {"stsa.binary.train": ["1 a", "0 b"], "stsa.binary.test": ["1 c"]})
    assert load_full(full, "SST-2", seed=13, test=False).test is None  # stsa.binary.dev is absent


def test_load_kshot_missing_task_or_seed_names_the_path(tmp_path: Path) -> None:
    make_layout(tmp_path, "mpqa", [13])
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "nope"))):
        load_kshot(tmp_path, "nope", 13)
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "mpqa" / "16-21"))):
        load_kshot(tmp_path, "mpqa", 21)


def test_load_kshot_rejects_pair_train_with_single_text_test(tmp_path: Path) -> None:
    make_layout(tmp_path, "mixed", [13])
    write(tmp_path / "mixed" / "16-13" / "train.csv", "0,premise,hypothesis\n")
    write(tmp_path / "mixed" / "16-13" / "dev.csv", "1,premise,hypothesis\n")
    with pytest.raises(DataError, match=r"test\.csv:1"):
        load_kshot(tmp_path, "mixed", 13)


def test_load_train_dev_never_reads_the_test_split(tmp_path: Path) -> None:
    make_layout(tmp_path, "mpqa", [13])
    (tmp_path / "mpqa" / "test.csv").unlink()
    train, dev = load_train_dev(tmp_path, "mpqa", 13)
    assert [e.text for e in train] == ["train a 13", "train b 13"] and [e.text for e in dev] == ["dev 13"]
    with pytest.raises(FileNotFoundError, match="'test' split"):
        load_kshot(tmp_path, "mpqa", 13)
    write(tmp_path / "mpqa" / "16-13" / "dev.csv", "1,premise,hypothesis\n")
    with pytest.raises(DataError, match=r"dev\.csv:1"):
        load_train_dev(tmp_path, "mpqa", 13)


def examples_with_labels(*labels: str) -> list[Example]:
    return [Example(text="t", label=label, source=f"f:{i}") for i, label in enumerate(labels, 1)]


def test_label_set_orders_integers_numerically() -> None:
    assert label_set(examples_with_labels("10", "2", "0", "2", "1")) == ["0", "1", "2", "10"]


def test_label_set_orders_strings_lexicographically() -> None:
    labels = examples_with_labels("not_entailment", "entailment", "10", "not_entailment")
    assert label_set(labels) == ["10", "entailment", "not_entailment"]
    assert label_set([]) == []


def test_real_kshot_row_counts_match_files(datasets_root: Path) -> None:
    kshot = datasets_root / "k-shot"
    expected_test_rows = {"SST-2": 872, "RTE": 277, "QNLI": 5463, "sst-5": 2210, "trec": 500, "mpqa": 2000}
    for task, test_rows in expected_test_rows.items():
        splits = load_kshot(kshot, task, 13)
        test_path = find_split(kshot / task, "test")
        physical_lines = test_path.read_bytes().count(b"\n")  # what `wc -l` reports
        header_lines = 1 if test_path.suffix == ".tsv" else 0
        assert len(splits.test) == test_rows == physical_lines - header_lines, task
        classes = label_set(splits.test)
        assert label_set(splits.train) == classes, task
        assert len(splits.train) == 16 * len(classes), task
        assert isinstance(splits.test[0].text, tuple) == (task in {"RTE", "QNLI"}), task


def _write_full(directory: Path, files: dict[str, list[str]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, lines in files.items():
        (directory / name).write_bytes("\n".join(lines).encode("latin-1") + b"\n")
    return directory


def test_full_layout_reads_label_space_text_and_samples_a_fixed_dev(tmp_path: Path) -> None:
    full = _write_full(
        tmp_path / "full",
        {
            "stsa.binary.train": ["1 a fine , warm film", "0 a dull mess", "", "1 caf\xe9 charm"],
            "stsa.binary.test": [f"{i % 2} dev sentence {i}" for i in range(10)],
            "stsa.binary.dev": ["1 the test one", "0 the test two"],
        },
    )
    splits = load_full(full, "SST-2", seed=13, dev_size=4)
    first_two = [(e.text, e.label) for e in splits.train[:2]]
    assert first_two == [("a fine , warm film", "1"), ("a dull mess", "0")]
    assert splits.train[2].text.startswith("caf") and splits.train[2].source.endswith("stsa.binary.train:4")
    assert [e.text for e in splits.test] == ["the test one", "the test two"]  # SST-2 tests on stsa.binary.dev
    assert len(splits.dev) == 4 and all(e.text.startswith("dev sentence") for e in splits.dev)
    assert splits.dev == load_full(full, "SST-2", seed=13, dev_size=4).dev  # fixed by the seed
    assert splits.dev != load_full(full, "SST-2", seed=21, dev_size=4).dev
    assert len(load_full(full, "SST-2", seed=13, dev_size=100).dev) == 10  # at most the whole file


def test_full_layout_errors_name_the_problem(tmp_path: Path) -> None:
    full = _write_full(
        tmp_path / "full",
        {"stsa.binary.train": ["1 fine", "nolabel"], "stsa.binary.test": ["1 x"], "stsa.binary.dev": ["0 y"]},
    )
    with pytest.raises(DataError, match="no full-data layout for task 'trec'"):
        load_full(full, "trec", seed=13)
    with pytest.raises(DataError, match=r"stsa.binary.train:2: expected 'label text'"):
        load_full(full, "SST-2", seed=13)
    with pytest.raises(FileNotFoundError, match=r"stsa\.fine\.train"):
        load_full(full, "sst-5", seed=13)


def test_fixed_sample_is_the_same_subset_in_file_order_whatever_else_changes(tmp_path: Path) -> None:
    from openbook.data import Example, fixed_sample

    examples = [Example(f"text {i}", str(i % 2), f"test.tsv:{i + 2}") for i in range(50)]
    sample = fixed_sample(examples, 10)
    assert len(sample) == 10 and sample == fixed_sample(list(examples), 10)
    positions = [examples.index(e) for e in sample]
    assert positions == sorted(positions) and positions != list(range(10))  # a sample, not a prefix
    assert fixed_sample(examples, None) == examples and fixed_sample(examples, 99) == examples
    with pytest.raises(DataError, match="at least 1"):
        fixed_sample(examples, 0)


def test_data_root_is_the_argument_else_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "from-env"))
    assert data_root() == tmp_path / "from-env"
    assert data_root(tmp_path / "given") == tmp_path / "given"  # --data wins over the environment
    assert data_root(str(tmp_path / "given")) == tmp_path / "given"


@pytest.mark.parametrize("unset", ["missing", "empty"])
def test_data_root_without_either_says_how_to_give_one(monkeypatch: pytest.MonkeyPatch, unset: str) -> None:
    if unset == "missing":
        monkeypatch.delenv(DATA_ENV, raising=False)
    else:
        monkeypatch.setenv(DATA_ENV, "")
    with pytest.raises(DataError, match=r"give --data, or set OPENBOOK_DATA .*k-shot/ and full/"):
        data_root()
