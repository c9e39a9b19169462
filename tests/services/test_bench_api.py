"""`openbook bench api` end to end on a tiny backbone: its correctness lines are asserted, not its times."""

from services.cli import main


def test_bench_api_reports_every_measurement(causal_dir, capsys):
    args = [
        "bench",
        "api",
        "--backbone",
        str(causal_dir),
        "--max-length",
        "48",
        "--requests",
        "3",
        "--clients",
        "4",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    for prefix in (
        "latency: one classify",
        "throughput: 4 clients",
        "freshness:",
        "hot swap under load:",
        "replicas:",
    ):
        assert prefix in out
    assert "hot swap under load: 0 failed" in out
    assert "same ids, versions, labels and neighbours: True" in out


def test_a_stand_in_has_the_backbones_tokenizer_and_layer_types_at_width_64(causal_dir, tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    from services.bench import make_stand_in

    path = make_stand_in(str(causal_dir), tmp_path / "stand-in")
    source, small = AutoConfig.from_pretrained(causal_dir), AutoConfig.from_pretrained(path)
    assert small.model_type == source.model_type
    assert (small.num_hidden_layers, small.hidden_size, small.vocab_size) == (2, 64, source.vocab_size)
    text = "a quietly moving film"
    ids = [AutoTokenizer.from_pretrained(where)(text).input_ids for where in (path, causal_dir)]
    assert ids[0] == ids[1]
