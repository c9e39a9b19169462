"""`openbook bench store` and `openbook bench train` on a tiny backbone: they run and print their ratios."""

from openbook.cli import main


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
    for spec in ("prompt-ft", "retroprompt"):
        assert f"{spec:<12} training step" in out
    assert out.count("x raw forward+backward") == 2
