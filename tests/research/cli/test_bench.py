"""`python -m research bench store | train | tasks | mixed` on a tiny backbone: they run and print their
figures."""

from research.cli import main


def test_bench_store_prints_the_ratios(causal_dir, capsys):
    assert (
        main(["bench", "store", "--backbone", str(causal_dir), "--sizes", "200,1000", "--batch-size", "4"])
        == 0
    )
    out = capsys.readouterr().out
    assert "store of   1,000: kNN search + interpolation" in out and "% of the forward" in out
    assert "add one example to a store of 1,000" in out
    assert out.count("-> ratio") == 2


def test_bench_train_prints_throughput_ratios(causal_dir, capsys):
    args = ["bench", "train", "--backbone", str(causal_dir), "--train-batch-size", "2", "--repeats", "1"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "raw forward+backward" in out
    for method in ("prompt-ft", "retroprompt"):  # the default, and with the embedding table trained too
        for spec in (method, f"{method}/no-freeze-embeddings"):
            assert f"{spec:<29} training step" in out
    assert out.count("x raw forward+backward") == 4
    assert "a dev check or store re-embedding of 32 prompts" in out
    assert "bfloat16 autocast: training step" in out and "largest change of a label log-probability" in out


def test_bench_tasks_prints_the_cost_of_each_task_on_a_shared_backbone(causal_dir, capsys):
    args = ["bench", "tasks", "--backbone", str(causal_dir), "--tasks", "1,3", "--max-length", "48"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "lora trained 2 steps" in out
    for count in (1, 3):
        assert f"{count:>4} tasks: resident +" in out and "first request" in out
    assert main([*args[:-4], "--method", "prompt-ft"]) != 0  # it would load a backbone per task


def test_bench_mixed_prints_mixed_and_separate_throughput_beside_one_task(causal_dir, capsys):
    args = ["bench", "mixed", "--backbone", str(causal_dir), "--tasks", "1,4", "--batch-size", "8"]
    assert main([*args, "--repeats", "1", "--max-length", "48"]) == 0
    out = capsys.readouterr().out
    assert "   1 task: " in out and "texts/s" in out
    assert "   4 tasks: separate" in out and "x one task" in out and "x separate" in out
    assert main([*args, "--method", "dart"]) != 0  # a prompt, not adapters: nothing to mix


def test_bench_labels_prints_many_labels_beside_two(causal_dir, tmp_path, capsys):
    """On a clinc150-shaped folder: intent names with underscores, test queries and seed-13 train texts."""
    clinc = tmp_path / "k-shot" / "clinc150"
    (clinc / "10-13").mkdir(parents=True)
    intents = ["book_flight", "book_hotel", "what_is_the_answer", "who", "cast"]
    (clinc / "labels.txt").write_text("".join(f"{i}={name}\n" for i, name in enumerate(intents)))
    rows = "".join(f'{i % 5},"{text}"\n' for i, text in enumerate(["a good film", "who wrote it", "fun"] * 4))
    (clinc / "test.csv").write_text(rows)
    (clinc / "10-13" / "train.csv").write_text(rows)
    args = ["bench", "labels", "--backbone", str(causal_dir), "--data", str(tmp_path), "--repeats", "1"]
    assert main([*args, "--texts", "4", "--examples", "6", "--batch-size", "4", "--max-length", "48"]) == 0
    out = capsys.readouterr().out
    assert f"data: clinc150 ({clinc})" in out and "thread(s)" in out and "(float32)" in out
    assert "label scoring auto (many: exact, two: exact)" in out  # auto: exact up to 16 labels
    assert "2 labels: " in out and "(book flight, book hotel)" in out  # underscores read as spaces
    assert "classify 4 texts" in out and "add 6 examples to the store" in out
    assert out.count("5 labels") == 3 and out.count("x\n") == 2  # the label line, then two ratio rows


def test_bench_compile_prints_the_compile_time_and_compiled_beside_eager(causal_dir, capsys):
    args = ["bench", "compile", "--backbone", str(causal_dir), "--rows", "1,2", "--max-rows", "2"]
    assert main([*args, "--repeats", "1", "--max-length", "32", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "eager        1 rows of" in out and "eager        2 rows of" in out
    assert "compiled and recorded 2 buckets up to 2 rows in" in out
    assert "compiled     2 rows:" in out and "x eager" in out
    assert main([*args[:-2], "--max-rows", "1"]) != 0  # 2 rows fit no bucket
