import json

import numpy as np
import pytest
from openbook.cli import main
from openbook.experiments.evaluation import EvalRecord, macro_f1
from openbook.experiments.reports import add_record, locked, read_results, results_table, task_means_table
from openbook.selection import accuracy

POSITIVE = ["the movie was great and fun", "a good film with a great cast", "great fun", "a good film"]
NEGATIVE = ["it was terrible and boring", "a bad film , it was awful", "boring and bad", "a terrible film"]


def _write_csv(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f'{label},"{text}"\n' for label, text in rows))


def make_toy_dataset(root, seeds=(1, 2), task="toy"):
    rows = [("1", t) for t in POSITIVE] + [("0", t) for t in NEGATIVE]
    for seed in seeds:
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(rows))
        _write_csv(root / task / f"16-{seed}" / "train.csv", [rows[i] for i in order])
        _write_csv(root / task / f"16-{seed}" / "dev.csv", [rows[i] for i in order[::-1]])
    _write_csv(root / task / "test.csv", [*rows, ("1", "fun and good"), ("0", "awful and boring")])
    return root


def _eval_args(data, out, causal_dir, labels="0=bad,1=good", methods="zero-shot,knn,knn-interp"):
    return [
        "eval", "--data", str(data), "--task", "toy",
        "--template", "{text} It was {mask}", "--labels", labels,
        "--methods", methods, "--seeds", "1,2", "--out", str(out), "--backbone", str(causal_dir),
        "--max-length", "48",
    ]  # fmt: skip


def test_eval_cli_on_a_dataset_it_has_never_seen(tmp_path, causal_dir, capsys):
    data = make_toy_dataset(tmp_path / "data")
    out = tmp_path / "out"
    assert main(_eval_args(data, out, causal_dir)) == 0
    records = json.loads((out / "results.json").read_text())
    assert {(r["method"], r["seed"]) for r in records} == {
        (m, s) for m in ("zero-shot", "knn", "knn-interp") for s in (1, 2)
    }
    for record in records:
        assert set(record) == {"task", "method", "seed", "accuracy", "macro_f1", "params", "seconds"}
        assert 0.0 <= record["accuracy"] <= 1.0 and record["seconds"] > 0
    interp = [r for r in records if r["method"] == "knn-interp"]
    assert all({"k", "temperature", "lam", "dev_accuracy"} <= set(r["params"]) for r in interp)
    table = (out / "results.md").read_text()
    assert "| toy | knn-interp |" in table and "Command: `openbook eval" in table
    assert "| toy | zero-shot |" in capsys.readouterr().out


def test_eval_test_size_scores_every_run_on_one_fixed_sample(tmp_path, causal_dir, capsys):
    data = make_toy_dataset(tmp_path / "data")  # 10 test sentences
    out = tmp_path / "out"
    args = [*_eval_args(data, out, causal_dir, methods="zero-shot,knn-interp"), "--test-size", "4"]
    assert main(args) == 0
    records = json.loads((out / "results.json").read_text())
    assert {r["params"]["test_examples"] for r in records} == {4}
    assert json.loads((out / "settings.json").read_text())["test_size"] == 4
    assert "test: a fixed sample of 4 examples (seed 0)" in (out / "results.md").read_text()

    args[args.index("--test-size") + 1] = "6"  # resuming with another sample would mix two test sets
    assert main(args) == 2
    assert "other settings (test_size: 4 -> 6)" in capsys.readouterr().err
    other = tmp_path / "other"
    assert main([*_eval_args(data, other, causal_dir, methods="zero-shot"), "--test-size", "0"]) == 2
    assert "at least 1 example" in capsys.readouterr().err
    assert not other.exists()


def test_unknown_label_in_data_fails_naming_the_line_and_writes_nothing(tmp_path, causal_dir, capsys):
    data = make_toy_dataset(tmp_path / "data")
    with open(data / "toy" / "16-2" / "dev.csv", "a") as handle:
        handle.write('7,"a stray label"\n')
    out = tmp_path / "out"
    assert main(_eval_args(data, out, causal_dir)) == 2
    error = capsys.readouterr().err
    assert "dev.csv:9" in error and "unknown label '7'" in error
    assert not out.exists()


def test_malformed_row_fails_naming_file_and_line(tmp_path, causal_dir, capsys):
    data = make_toy_dataset(tmp_path / "data")
    (data / "toy" / "test.csv").write_text('1,"fine"\n0,"fine too"\n1\n')
    assert main(_eval_args(data, tmp_path / "out", causal_dir)) == 2
    assert "test.csv:3" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_unknown_method_and_bad_template_are_user_errors(tmp_path, causal_dir, capsys):
    data = make_toy_dataset(tmp_path / "data")
    assert main(_eval_args(data, tmp_path / "o", causal_dir, methods="zero-shot,telepathy")) == 2
    assert "telepathy" in capsys.readouterr().err
    args = _eval_args(data, tmp_path / "o", causal_dir)
    args[args.index("--template") + 1] = "{text} It was {mask} ."
    assert main(args) == 2
    assert "must be the last thing" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_metrics_and_table():
    gold = np.array([0, 0, 1, 1, 2])
    predicted = np.array([0, 1, 1, 1, 0])
    assert accuracy(predicted, gold) == pytest.approx(0.6)
    # per class F1: 0 -> 2*1/(2+1+1)=0.5, 1 -> 2*2/(4+1+0)=0.8, 2 -> 0
    assert macro_f1(predicted, gold, 3) == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    records = [EvalRecord("t", "m", s, a, a, {}, 1.0) for s, a in ((1, 0.5), (2, 0.7))]
    assert "| t | m | 60.0 (10.0) | 60.0 (10.0) | 2 | 1.0 |" in results_table(records)

    # A resumed run appends records out of order; the table still lists the command's methods in order.
    mixed = [EvalRecord(t, m, 1, 0.5, 0.5, {}, 1.0) for t, m in (("a", "y"), ("b", "x"), ("a", "x"))]
    rows = [line.split(" | ")[:2] for line in results_table(mixed, ["x", "y"]).splitlines()[2:]]
    assert rows == [["| a", "x"], ["| a", "y"], ["| b", "x"]]


def test_task_means_table_averages_seeds_then_tasks():
    rows = [
        ("a", "x", 1, 0.5),
        ("a", "x", 2, 0.7),
        ("b", "x", 1, 0.9),
        ("b", "x", 2, 0.9),
        ("a", "y", 1, 0.4),
    ]
    records = [EvalRecord(t, m, s, acc, acc, {}, 1.0) for t, m, s, acc in rows]
    lines = task_means_table(records, ["y", "x"]).splitlines()
    assert lines[0] == "| method | a | b | mean over tasks |"
    # y lacks task b, so it has no mean over tasks; its single seed on a is marked
    assert lines[2:] == ["| y | 40.0 (1 of 2 seeds) |  |  |", "| x | 60.0 | 90.0 | 75.0 |"]


def _add_records(out, seeds):
    for seed in seeds:
        with locked(out):
            add_record(EvalRecord("t", "m", seed, 0.5, 0.5, {}, 1.0), out, method_order=["m"])


def test_processes_sharing_a_results_directory_keep_every_record(tmp_path):
    import multiprocessing

    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_add_records, args=(tmp_path, range(w, 40, 2))) for w in (0, 1)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert [w.exitcode for w in workers] == [0, 0]
    assert sorted(r.seed for r in read_results(tmp_path)) == list(range(40))

    # A cell already on disk keeps its first record.
    with locked(tmp_path):
        add_record(EvalRecord("t", "m", 3, 0.9, 0.9, {}, 1.0), tmp_path)
    (third,) = [r for r in read_results(tmp_path) if r.seed == 3]
    assert third.accuracy == 0.5 and len(read_results(tmp_path)) == 40


def test_knn_interp_chooses_lambda_alone_with_the_default_k_and_temperature():
    from openbook.experiments.evaluation import MethodInputs, knn_interp
    from openbook.knn import KnnConfig
    from openbook.selection import LAMBDA_GRID, Split, interpolation_grid
    from openbook.store import SearchResult

    default = KnnConfig()
    assert interpolation_grid(100) == [(default.k, default.temperature, lam) for lam in LAMBDA_GRID]
    assert {k for k, _, _ in interpolation_grid(5)} == {5}  # never more neighbours than the store holds

    # Dev: the prompt is right on every row and the neighbours always vote for the other label,
    # so the only lambda that keeps dev accuracy is 0.
    n, k = 8, 16
    gold = np.array([0, 1] * (n // 2))
    p_lm = np.where(gold[:, None] == np.arange(2), 0.7, 0.3).astype(np.float32)
    wrong = np.repeat((1 - gold)[:, None], k, 1).astype(np.int64)
    hits = SearchResult(np.arange(n * k).reshape(n, k), wrong, np.full((n, k), 0.5, np.float32))
    split = Split(gold, hits)
    inputs = MethodInputs(2, p_lm, p_lm, split, split, store_size=32)
    _, params = knn_interp(inputs)
    assert (params["k"], params["temperature"], params["lam"]) == (default.k, default.temperature, 0.0)
