"""`python -m research eval` on tiny backbones: inference methods, trainable methods, --full, resuming,
user errors."""

import json

import pytest

from research.cli import main


def _eval_args(data, out, causal_dir, labels="0=bad,1=good", methods="zero-shot,knn,knn-interp"):
    return [
        "eval", "--data", str(data), "--task", "toy",
        "--template", "{text} It was {mask}", "--labels", labels,
        "--methods", methods, "--seeds", "1,2", "--out", str(out), "--backbone", str(causal_dir),
        "--max-length", "48",
    ]  # fmt: skip


def test_eval_cli_on_a_dataset_it_has_never_seen(tmp_path, causal_dir, capsys, toy_dataset):
    data = toy_dataset(tmp_path / "data")
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
    assert {r["params"]["selected_on"] for r in interp} == {"train (leave-one-out) + dev"}  # frozen prompt
    table = (out / "results.md").read_text()
    assert "| toy | knn-interp |" in table and "Command: `python -m research eval" in table
    assert "| toy | zero-shot |" in capsys.readouterr().out


def test_eval_test_size_scores_every_run_on_one_fixed_sample(tmp_path, causal_dir, capsys, toy_dataset):
    data = toy_dataset(tmp_path / "data")  # 10 test sentences
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


def test_unknown_label_in_data_fails_naming_the_line_and_writes_nothing(
    tmp_path, causal_dir, capsys, toy_dataset
):
    data = toy_dataset(tmp_path / "data")
    with open(data / "toy" / "16-2" / "dev.csv", "a") as handle:
        handle.write('7,"a stray label"\n')
    out = tmp_path / "out"
    assert main(_eval_args(data, out, causal_dir)) == 2
    error = capsys.readouterr().err
    assert "dev.csv:9" in error and "unknown label '7'" in error
    assert not out.exists()


def test_malformed_row_fails_naming_file_and_line(tmp_path, causal_dir, capsys, toy_dataset):
    data = toy_dataset(tmp_path / "data")
    (data / "toy" / "test.csv").write_text('1,"fine"\n0,"fine too"\n1\n')
    assert main(_eval_args(data, tmp_path / "out", causal_dir)) == 2
    assert "test.csv:3" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_unknown_method_and_bad_template_are_user_errors(tmp_path, causal_dir, capsys, toy_dataset):
    data = toy_dataset(tmp_path / "data")
    assert main(_eval_args(data, tmp_path / "o", causal_dir, methods="zero-shot,telepathy")) == 2
    assert "telepathy" in capsys.readouterr().err
    args = _eval_args(data, tmp_path / "o", causal_dir)
    args[args.index("--template") + 1] = "{text} It was {mask} ."
    assert main(args) == 2
    assert "must be the last thing" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_eval_trains_methods_and_resumes(tmp_path, causal_dir, capsys, training_flags, toy_dataset):
    data = toy_dataset(tmp_path / "data")
    out = tmp_path / "out"
    args = [
        "eval", "--data", str(data), "--task", "toy", "--seeds", "1,2", "--out", str(out),
        "--template", "{text} It was {mask}", "--labels", "0=bad,1=good", "--backbone", str(causal_dir),
        "--methods", "zero-shot,prompt-ft,retroprompt,retroprompt/no-knn-infer", *training_flags,
    ]  # fmt: skip
    args[args.index("--seeds") + 1] = "1"
    assert main(args) == 0
    first = json.loads((out / "results.json").read_text())
    assert {r["method"] for r in first} == {
        "zero-shot",
        "prompt-ft",
        "retroprompt",
        "retroprompt/no-knn-infer",
    }
    shared = {r["method"]: r["params"] for r in first if r["method"].startswith("retroprompt")}
    assert shared["retroprompt"]["shared_training"] == ["retroprompt/no-knn-infer"]
    assert shared["retroprompt"]["inference"] == "knn-interp"
    assert shared["retroprompt"]["selected_on"] == "dev"  # its prompt was trained on the training examples
    assert shared["retroprompt/no-knn-infer"]["inference"] == "zero-shot"
    # every trained classifier is read three ways; its own inference is one of them, and a training run's
    # variants share one set of readings
    for record in (r for r in first if r["method"] != "zero-shot"):
        readings = record["params"]["readings"]
        assert set(readings) == {"zero-shot", "knn", "knn-interp"}, record["method"]
        own = readings[record["params"]["inference"]]
        assert (own["accuracy"], own["dev_accuracy"]) == (
            record["accuracy"],
            record["params"]["dev_accuracy"],
        )
    assert shared["retroprompt"]["readings"] == shared["retroprompt/no-knn-infer"]["readings"]
    # where each ran, so a grid resumed on another machine stays legible
    assert all((r["params"]["device"], r["params"]["dtype"]) == ("cpu", "float32") for r in first)
    assert "read three ways" in (out / "results.md").read_text()
    assert (out / "results.png").read_bytes()[:4] == b"\x89PNG"

    args[args.index("--seeds") + 1] = "1,2"  # resume: only seed 2 runs
    assert main(args) == 0
    second = json.loads((out / "results.json").read_text())
    assert second[: len(first)] == first
    assert sorted((r["method"], r["seed"]) for r in second[len(first) :]) == sorted(
        (r["method"], 2) for r in first
    )
    assert all(
        r["params"]["method_config"]["demos"] == "none" for r in second if r["method"] == "retroprompt"
    )
    capsys.readouterr()
    # another spelling of the same method is the same method: nothing to run
    methods = args.index("--methods") + 1
    spelled = [*args[:methods], "zero-shot,prompt-ft,retroprompt/demos=none,retroprompt/no-knn-infer"]
    assert main(spelled + args[methods + 1 :]) == 0
    assert "already in" in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text()) == second
    # runs recorded when a spec meant other options (a default changed since) are not resumed under it
    changed = [
        {**r, "params": {**r["params"], "method_config": {**r["params"]["method_config"], "demos": "neural"}}}
        if r["method"] == "retroprompt"
        else r
        for r in second
    ]
    (out / "results.json").write_text(json.dumps(changed))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "retroprompt runs trained with other options (demos: 'neural' -> 'none')" in err
    assert f"`python -m research relabel {out}`" in err

    (out / "results.json").write_text(json.dumps(second))
    args[args.index("--lr") + 1] = "1e-2"
    assert main(args) == 2
    assert "other settings (lr" in capsys.readouterr().err


def test_eval_full_trains_on_the_whole_training_set(
    tmp_path, causal_dir, capsys, training_flags, toy_dataset
):
    full = tmp_path / "full"
    full.mkdir()
    lines = [f"1 {t}" for t in toy_dataset.positive] + [f"0 {t}" for t in toy_dataset.negative]
    (full / "stsa.binary.train").write_text("\n".join(lines * 2) + "\n")
    (full / "stsa.binary.test").write_text("\n".join(lines) + "\n")  # dev, by FULL_LAYOUT
    (full / "stsa.binary.dev").write_text("1 fun and good\n0 awful and boring\n")  # test
    out = tmp_path / "out"
    args = [
        "eval", "--full", "--full-dev-size", "4", "--data", str(full), "--task", "SST-2", "--seeds", "13",
        "--out", str(out), "--template", "{text} It was {mask}", "--labels", "0=bad,1=good",
        "--backbone", str(causal_dir), "--methods", "prompt-ft", *training_flags,
    ]  # fmt: skip
    assert main(args) == 0
    records = json.loads((out / "results.json").read_text())
    assert [(r["task"], r["method"], r["seed"]) for r in records] == [("SST-2", "prompt-ft", 13)]
    assert records[0]["accuracy"] in (0.0, 0.5, 1.0)  # scored on the two test sentences
    assert json.loads((out / "settings.json").read_text())["full"] is True
    assert (out / "results.md").read_text().startswith("# Full-data evaluation")

    capsys.readouterr()
    args[args.index("--methods") + 1] = "zero-shot,prompt-ft"
    assert main(args) == 2
    assert "--full evaluates trainable methods only; drop zero-shot" in capsys.readouterr().err


def test_eval_no_test_selects_on_dev_and_never_reads_test(
    tmp_path, causal_dir, capsys, training_flags, toy_dataset
):
    data = toy_dataset(tmp_path / "data")
    (data / "toy" / "test.csv").write_text("this is no test split\n")  # reading it would fail
    out = tmp_path / "out"
    at = training_flags.index("--steps")
    flags = training_flags[:at] + training_flags[at + 2 :]  # the budget is given in epochs instead
    args = [
        *_eval_args(data, out, causal_dir, methods="zero-shot,knn-interp,retroprompt"),
        *flags, "--epochs", "1.5", "--no-test",
    ]  # fmt: skip
    assert main(args) == 0
    records = json.loads((out / "results.json").read_text())
    assert {(r["method"], r["seed"]) for r in records} == {
        (m, s) for m in ("zero-shot", "knn-interp", "retroprompt") for s in (1, 2)
    }
    for record in records:
        assert record["accuracy"] is None and record["macro_f1"] is None  # no test figure
        assert 0.0 <= record["params"]["dev_accuracy"] <= 1.0
        assert not {"test_examples", "truncated_test"} & set(record["params"])
    trained = [r["params"] for r in records if r["method"] == "retroprompt"]
    assert all(
        {"lam", "best_step", "best_step_dev_accuracy", "best_step_dev_log_likelihood"} <= set(p)
        for p in trained
    )
    assert {(p["epochs"], p["step_budget"]) for p in trained} == {(1.5, 3)}  # ceil(1.5 * 8 / 4)
    assert {p["check_every"] for p in trained} == {2}  # --eval-every, given
    assert all(p["steps_run"] <= p["step_budget"] for p in trained)
    assert json.loads((out / "settings.json").read_text())["epochs"] == 1.5
    table = (out / "results.md").read_text()
    assert ", dev only" in table.splitlines()[0] and "Dev accuracy in % (--no-test" in table
    assert "| task | method | dev accuracy | seeds |" in table and "macro-F1" not in table

    capsys.readouterr()
    assert main(args) == 0  # resumed: every run is there
    assert "nothing to do" in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text()) == records

    toy_dataset(data)  # a readable test split again
    with_test = [a for a in args if a != "--no-test"]
    assert main(with_test) == 2  # test-scored records would mix with dev-only ones
    assert "holds dev-only records (made with --no-test)" in capsys.readouterr().err
    assert main([*args, "--test-size", "4"]) == 2
    assert "--no-test never reads" in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text()) == records


def test_eval_no_test_refuses_an_out_scored_on_test(tmp_path, causal_dir, capsys, toy_dataset):
    data = toy_dataset(tmp_path / "data")
    out = tmp_path / "out"
    args = _eval_args(data, out, causal_dir, methods="zero-shot")
    assert main(args) == 0
    before = (out / "results.json").read_text()
    capsys.readouterr()
    assert main([*args, "--no-test"]) == 2
    assert "holds records scored on test, and --no-test records" in capsys.readouterr().err
    assert (out / "results.json").read_text() == before


def test_eval_keeps_blank_texts_of_a_published_split_and_counts_them(tmp_path, causal_dir, capsys):
    data = tmp_path / "data"
    rows = ["a good film\t1", "a bad film\t0", "   \t1", "great fun\t1", "boring\t0"]
    for path, lines in (
        (data / "cr" / "16-1" / "train.tsv", rows[:2] + rows[3:]),
        (data / "cr" / "16-1" / "dev.tsv", rows),
        (data / "cr" / "test.tsv", [*rows, "\t0"]),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("sentence\tlabel\n" + "\n".join(lines) + "\n")
    out = tmp_path / "out"
    args = _eval_args(data, out, causal_dir, methods="zero-shot,knn-interp")
    args[args.index("--task") + 1], args[args.index("--seeds") + 1] = "cr", "1"
    assert main(args) == 0
    assert "cr: blank texts, kept as they are" in (err := capsys.readouterr().err)
    assert "test 2, seed 1 dev 1" in err and "seed 1 train" not in err  # per split, those with any
    records = json.loads((out / "results.json").read_text())
    assert {r["params"]["test_examples"] for r in records} == {6}  # every row scored, blank ones too


def test_eval_scores_neighbours_as_asked_and_records_it(tmp_path, causal_dir, capsys, toy_dataset):
    data = toy_dataset(tmp_path / "data")
    out = tmp_path / "out"
    scoring = ["--knn-similarity", "centred", "--knn-standardise", "--knn-temperature", "1"]
    args = [*_eval_args(data, out, causal_dir, methods="knn,knn-interp"), *scoring]
    assert main(args) == 0
    settings = json.loads((out / "settings.json").read_text())
    assert settings["knn"] == {"similarity": "centred", "standardise": True, "temperature": 1.0}
    records = json.loads((out / "results.json").read_text())
    assert {r["params"]["temperature"] for r in records if r["method"] == "knn-interp"} == {1.0}

    assert main([*args[: -len(scoring)], "--knn-similarity", "centred"]) == 2  # other scoring, same --out
    assert "other settings (knn:" in capsys.readouterr().err


def test_eval_parallel_runs_each_task_and_seed_as_its_own_process(tmp_path, causal_dir, capsys, toy_dataset):
    data = toy_dataset(tmp_path / "data")
    one_by_one, in_parallel = tmp_path / "serial", tmp_path / "parallel"
    assert main(_eval_args(data, one_by_one, causal_dir, methods="zero-shot,knn")) == 0
    args = [*_eval_args(data, in_parallel, causal_dir, methods="zero-shot,knn"), "--parallel", "2"]
    assert main(args) == 0
    serial = {
        (r["method"], r["seed"]): r["accuracy"] for r in json.loads((one_by_one / "results.json").read_text())
    }
    merged = json.loads((in_parallel / "results.json").read_text())
    assert {(r["method"], r["seed"]): r["accuracy"] for r in merged} == serial  # the same runs, merged
    logs = sorted(p.name for p in (in_parallel / "logs").iterdir())
    assert logs == ["toy-1-zero-shot,knn.log", "toy-2-zero-shot,knn.log"]  # named by methods too
    assert "Command: `python -m research eval --data" in (in_parallel / "results.md").read_text()
    assert "--parallel 2" in (in_parallel / "results.md").read_text()  # the grid's command, not a unit's
    capsys.readouterr()
    assert main(args) == 0  # resumed: every unit finds its runs done
    assert len(json.loads((in_parallel / "results.json").read_text())) == len(merged)
    assert main([*args[:-1], "0"]) == 2
    assert "--parallel must be at least 1" in capsys.readouterr().err


def test_eval_parallel_runs_each_trained_method_as_its_own_unit(
    tmp_path, causal_dir, toy_dataset, training_flags
):
    data, out = toy_dataset(tmp_path / "data"), tmp_path / "out"
    args = _with_seeds(_eval_args(data, out, causal_dir, methods="zero-shot,knn,prompt-ft,retroprompt"), "1")
    assert main([*args, *training_flags, "--parallel", "2"]) == 0
    # the untrained methods share one embedding of the data: one unit; each trained method, its own
    logs = sorted(p.name for p in (out / "logs").iterdir())
    assert logs == ["toy-1-prompt-ft.log", "toy-1-retroprompt.log", "toy-1-zero-shot,knn.log"]
    records = json.loads((out / "results.json").read_text())
    assert sorted(r["method"] for r in records) == ["knn", "prompt-ft", "retroprompt", "zero-shot"]


def test_a_units_command_is_the_grids_with_its_own_task_and_seed():
    from research.parallel import unit_argv

    grid = ["eval", "--task", "a,b", "--seeds=1,2", "--parallel", "4", "--out", "o", "--epochs", "20"]
    assert unit_argv(grid, {"--task": "b", "--seeds": "2"}) == [
        *["eval", "--out", "o", "--epochs", "20", "--task", "b", "--seeds", "2"]
    ]


def test_eval_scores_a_tasks_out_of_scope_queries_for_refusal_only(tmp_path, causal_dir, capsys, toy_dataset):
    data = toy_dataset(tmp_path / "data")
    queries = [("-1", "who wrote the book"), ("-1", "where is it")]
    toy_dataset.write_csv(data / "toy" / "oos_test.csv", queries)
    out = tmp_path / "out"
    assert main(_eval_args(data, out, causal_dir, methods="zero-shot,knn-interp")) == 0
    records = json.loads((out / "results.json").read_text())
    for record in records:
        params = record["params"]
        assert params["test_examples"] == 10 and params["out_of_scope_examples"] == 2
        refusals = params["out_of_scope"]
        assert 0.0 <= refusals["threshold"] <= 1.0 and refusals["max_cost"] == 0.03
        assert refusals["in_scope_accuracy_answering_all"] == record["accuracy"]  # in-scope rows alone
        assert refusals["in_scope_accuracy"] <= record["accuracy"]
        assert refusals["recall"] in (0.0, 0.5, 1.0)
    table = (out / "results.md").read_text()
    assert "Out-of-scope queries, refused below" in table
    assert "| toy | knn-interp |" in table.split("Out-of-scope queries")[1]


def test_a_resumed_untrained_grid_reads_its_embeddings_back(tmp_path, causal_dir, toy_dataset, embed_sizes):
    data, out = toy_dataset(tmp_path / "data", seeds=(1, 2)), tmp_path / "out"
    args = _eval_args(data, out, causal_dir, methods="zero-shot,knn-interp")
    assert main(_with_seeds(args, "1")) == 0
    cached = {p: p.stat().st_mtime_ns for p in (out / "cache").glob("embeddings-*.npz")}
    assert len(cached) == 3  # the test queries, seed 1's train and its dev
    first = json.loads((out / "results.json").read_text())
    embedded = embed_sizes()
    assert main(_with_seeds(args, "1,2")) == 0
    assert 10 not in embedded and embedded == [8, 8]  # seed 2's train and dev only: test read back
    records = json.loads((out / "results.json").read_text())
    assert [r for r in records if r["seed"] == 1] == first
    assert {r["seed"] for r in records} == {1, 2}
    now = {p: p.stat().st_mtime_ns for p in (out / "cache").glob("embeddings-*.npz")}
    assert len(now) == 5 and all(now[p] == mtime for p, mtime in cached.items())  # none rewritten

    embedded.clear()  # seed 2 stopped before its records landed: its train and dev are read back
    kept = [r for r in records if r["seed"] == 1]
    (out / "results.json").write_text(json.dumps(kept))
    assert main(_with_seeds(args, "1,2")) == 0
    assert embedded == []


@pytest.fixture
def embed_sizes(monkeypatch):
    """Call it to count, from then on, how many texts each `Classifier.embed` call embeds (a list)."""
    from openbook.classifier import Classifier

    def start():
        sizes, real_embed = [], Classifier.embed

        def counted(self, texts, **options):
            sizes.append(len(texts))
            return real_embed(self, texts, **options)

        monkeypatch.setattr(Classifier, "embed", counted)
        return sizes

    return start


def _with_seeds(args, seeds):
    args = list(args)
    args[args.index("--seeds") + 1] = seeds
    return args


def test_a_grid_stopped_mid_way_keeps_the_chunks_it_embedded(
    tmp_path, causal_dir, toy_dataset, monkeypatch, embed_sizes
):
    from research.experiments import embedding_cache

    monkeypatch.setattr(embedding_cache, "CACHE_CHUNK", 4)  # the 10 test sentences: chunks of 4, 4 and 2
    data, out = toy_dataset(tmp_path / "data", seeds=(1,)), tmp_path / "out"
    args = _eval_args(data, out, causal_dir, methods="zero-shot")
    assert main(_with_seeds(args, "1")) == 0
    chunks = sorted((out / "cache").glob("embeddings-*.npz"), key=lambda p: p.stat().st_mtime)
    assert len(chunks) == 7  # test first (4, 4, 2), then seed 1's train (4, 4) and dev (4, 4)
    first = json.loads((out / "results.json").read_text())
    chunks[1].unlink()  # as if the run had stopped in its second chunk
    (out / "results.json").unlink()
    embedded = embed_sizes()
    assert main(_with_seeds(args, "1")) == 0
    assert embedded == [4]  # the missing chunk only: seed 1's train and dev are read back too
    again = json.loads((out / "results.json").read_text())
    assert [r["accuracy"] for r in again] == [r["accuracy"] for r in first]
