"""`python -m research methods`: the inference-time and trainable methods it lists."""

from research.cli import main


def test_methods_lists_inference_and_trainable_methods(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in ("zero-shot", "knn-interp", "prompt-ft", "retroprompt"):
        assert name in out
