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
