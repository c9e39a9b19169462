"""`openbook bench api` and `bench job` end to end on a tiny backbone: their correctness lines are asserted,
not their times. `bench api` runs the api in-process and as two workers behind one port (`--workers 1,2`)."""

import json
import re

import pytest
from openbook.methods import method_config

from services.cli import main
from tests.conftest import _save_gemma


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
        "--workers",
        "1,2",
    ]
    assert main(args) == 0
    one, two = capsys.readouterr().out.split("api workers: 2 (openbook serve)\n")
    assert one.startswith("api workers: 1 (in-process)\n")
    for prefix in ("latency: one classify", "throughput: 4 clients", "freshness:"):
        assert prefix in one and prefix in two
    assert "by the rule" in two or "the rule keeps 1" in two  # the worker count it picks
    # then, on the in-process replicas
    assert "hot swap under load: 0 failed" in two
    assert "same ids, versions, labels and neighbours: True" in two


def test_bench_api_measures_again_through_fronts(causal_dir, capsys):
    """`--fronts 1`: the same lines through `openbook serve` with a front before the replica; with
    `--no-hot-swap`, nothing after them."""
    args = ["bench", "api", "--backbone", str(causal_dir), "--max-length", "48", "--requests", "3"]
    assert main([*args, "--clients", "4", "--workers", "1", "--fronts", "0,1", "--no-hot-swap"]) == 0
    alone, fronted = capsys.readouterr().out.split("api workers: 1, fronts: 1 (openbook serve)\n")
    assert "hot swap" not in fronted and "replicas:" not in fronted
    assert alone.startswith("api workers: 1 (in-process)\n")
    for prefix in ("latency: one classify", "throughput: 4 clients", "freshness:"):
        assert prefix in alone and prefix in fronted
    forwarded = re.search(r"\((\d+) forwards of ([\d.]+) texts each\)", fronted)
    assert forwarded and int(forwarded.group(1)) > 0  # the replica's /metrics, read through the front


def test_a_stand_in_has_the_backbones_tokenizer_and_layer_types_at_width_64(causal_dir, tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    from services.bench_stack import make_stand_in

    path = make_stand_in(str(causal_dir), tmp_path / "stand-in")
    source, small = AutoConfig.from_pretrained(causal_dir), AutoConfig.from_pretrained(path)
    assert small.model_type == source.model_type
    assert (small.num_hidden_layers, small.hidden_size, small.vocab_size) == (2, 64, source.vocab_size)
    text = "a quietly moving film"
    ids = [AutoTokenizer.from_pretrained(where)(text).input_ids for where in (path, causal_dir)]
    assert ids[0] == ids[1]
    # a model of several kinds of layer (Gemma 3: sliding windows, then full attention) keeps each kind
    gemma = _save_gemma(tmp_path / "gemma", causal_dir, num_hidden_layers=3,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"])  # fmt: skip
    small = AutoConfig.from_pretrained(make_stand_in(str(gemma), tmp_path / "gemma-stand-in"))
    assert (small.num_hidden_layers, small.layer_types) == (2, ["sliding_attention", "full_attention"])


def test_the_worker_rule_takes_the_most_throughput_within_the_latency_target():
    from services.bench import choose_workers

    assert choose_workers({1: (1.05, 400.0), 2: (1.10, 900.0), 4: (1.30, 1500.0)}, 256).startswith(
        "workers: 2 by the rule"
    )  # 4 is fastest but misses the latency target
    assert choose_workers({1: (1.05, 400.0), 2: (1.10, 400.0)}, 256).startswith(
        "workers: 1 by the rule"
    )  # a tie: fewer
    assert choose_workers({1: (1.2, 400.0), 2: (1.3, 900.0)}, 256).endswith("the rule keeps 1")


def test_bench_job_times_an_automatic_job_through_the_service(causal_dir, tmp_path, toy_dataset, capsys):
    data = toy_dataset(tmp_path / "k-shot", seeds=(1,), task="SST-2")
    args = ["bench", "job", "--task", "SST-2", "--seed", "1"]
    args += ["--data", str(data), "--backbone", str(causal_dir)]
    records = tmp_path / "records"
    assert main([*args, "--per-request", "3", "--max-length", "48", "--out", str(records)]) == 0
    out = capsys.readouterr().out
    assert "SST-2 seed 1: 8 examples, 2 labels, method retroprompt" in out
    done, served = (float(s) for s in re.search(r"job done (\d+) s .* served after (\d+) s", out).groups())
    assert 0 <= done <= served
    assert "gate: first" in out  # the first version a task has is served without a comparison
    # the default budget: 8 epochs of one step, floored at 32 steps
    trained = re.search(r"trained on (\d+) examples, (\d+) held out as dev: (\d+) of (\d+) steps run", out)
    assert trained is not None, out
    train, dev, run, budget = (int(n) for n in trained.groups())
    assert (train + dev, budget) == (8, 32) and 1 <= run <= budget
    (record,) = json.loads((records / "job.json").read_text())  # what it printed, kept
    assert (record["job_done_s"], record["served_s"]) == pytest.approx((done, served), abs=0.5)
    assert record["trained_on"] == {"train": train, "dev": dev} and record["gate"] == "first"
    assert record["command"].startswith("openbook bench job --task SST-2") and record["shots"] == 16
    assert record["label_scoring"] == "auto"  # the service's default (exact at 2 labels), unless asked
    assert record["method_config"] == method_config("retroprompt")  # every option the job's method ran with
    # a job that has not ended by --timeout is reported and recorded as not done, with where it was
    late = tmp_path / "late"
    options = ["--max-length", "48", "--timeout", "0", "--label-scoring", "vectors", "--out", str(late)]
    assert main([*args, *options]) == 1
    assert "no job ended within 0 s" in capsys.readouterr().err
    (record,) = json.loads((late / "job.json").read_text())
    assert record["label_scoring"] == "vectors"
    assert record["not_done_at_s"] >= 0 and "job_done_s" not in record
    assert record["then"]["state"] in {"not queued", "queued", "running"}
    assert main([*args[:-4], "--data", str(tmp_path / "nowhere")]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_bench_api_measures_what_a_reader_costs_a_classify(causal_dir, reader_mpnet_dir, capsys, monkeypatch):
    monkeypatch.setenv("OPENBOOK_MODEL_DIRS", json.dumps([str(reader_mpnet_dir.parent)]))
    args = ["bench", "api", "--backbone", str(causal_dir), "--max-length", "48", "--requests", "3"]
    assert main([*args, "--clients", "4", "--reader", str(reader_mpnet_dir)]) == 0
    out = capsys.readouterr().out
    one = re.search(r"reader .*: one classify ([\d.]+) ms vs ([\d.]+) ms without -> ([\d.]+)x", out)
    many = re.search(r"reader .*: 4 clients ([\d.]+) texts/s vs ([\d.]+) without -> ([\d.]+)x", out)
    assert one and many, out
    assert _ratio_of_printed(float(one[1]), float(one[2]), float(one[3]))
    assert _ratio_of_printed(float(many[2]), float(many[1]), float(many[3]))


def _ratio_of_printed(top: float, bottom: float, ratio: float) -> bool:
    """Whether `ratio`, printed to 0.01, is top / bottom of figures printed to 0.1 (milliseconds of a
    tiny model's request can be a few, so their rounding moves the quotient by more than 0.01)."""
    slack = top / bottom * (0.05 / top + 0.05 / bottom) + 0.005
    return abs(ratio - top / bottom) <= slack


def test_bench_job_with_a_reader_reads_its_time_against_the_budget(
    causal_dir, reader_mpnet_dir, tmp_path, toy_dataset, capsys, monkeypatch
):
    monkeypatch.setenv("OPENBOOK_MODEL_DIRS", json.dumps([str(reader_mpnet_dir.parent)]))
    data = toy_dataset(tmp_path / "k-shot", seeds=(1,), task="SST-2")
    args = [
        "bench",
        "job",
        "--task",
        "SST-2",
        "--seed",
        "1",
        "--data",
        str(data),
        "--backbone",
        str(causal_dir),
    ]
    records = tmp_path / "records"
    options = [
        "--max-length",
        "48",
        "--reader",
        str(reader_mpnet_dir),
        "--budget",
        "300",
        "--out",
        str(records),
    ]
    assert main([*args, *options]) == 0
    out = capsys.readouterr().out
    done = float(re.search(r"job done (\d+) s", out).group(1))
    share = float(re.search(r"budget: the job took ([\d.]+)x the 300 s a job may take", out).group(1))
    assert share == pytest.approx(done / 300, abs=0.01)
    (record,) = json.loads((records / "job.json").read_text())
    assert record["reader"] == str(reader_mpnet_dir)
    # the served reader learned every stored example, dev's too, and the record says so
    tuned_on = record["dev_metrics"]["reader_tuned_on"]
    assert tuned_on == sum(record["trained_on"].values())
    assert f"tuned again on all {tuned_on} stored examples" in out
