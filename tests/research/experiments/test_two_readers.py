"""The two readers' probe records, read: probe 2's head mixed with the prompt at w = n / (n + 1), and
probes 3 to 7's rules; and a probe run on a tiny encoder."""

from pathlib import Path

import numpy as np
import pytest

from research.experiments.reader_rules import (
    judge_table,
    probe3_choice,
    probe4_reading,
    probe5_reading,
    probe6_choice,
    probe7_choice,
    probe8_reading,
)
from research.experiments.two_readers import Variant, head_readings, probe_run


def _book(per_class: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit rows near two directions, one per label."""
    rng = np.random.default_rng(0)
    centres = np.eye(4)[:2]
    labels = np.repeat([0, 1], per_class)
    rows = centres[labels] + 0.05 * rng.standard_normal((len(labels), 4))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True), labels


def test_the_head_reads_the_book_and_the_prompt_weighs_less_as_examples_come():
    queries = np.eye(4)[:2]  # one query at each label's direction
    gold = np.array([0, 1])
    wrong_prompt = np.array([[0.0, 1.0], [1.0, 0.0]])  # the prompt sure of the other label
    for per_class, mix_right in ((1, 0.0), (8, 1.0)):  # w = 1/2, then 8/9
        book, labels = _book(per_class)
        read = head_readings(
            book, labels, {"dev": queries, "test": None}, {"dev": wrong_prompt, "test": None},
            {"dev": gold, "test": None}, 2,
        )  # fmt: skip
        assert read["head"]["dev_accuracy"] == 1.0 and read["head"]["accuracy"] is None
        assert read["head-mix"]["dev_accuracy"] == mix_right


def _record(task: str, slot: float, two: float, head: float) -> dict:
    reading = lambda accuracy: {"accuracy": accuracy, "dev_accuracy": accuracy}  # noqa: E731
    readings = {"knn-interp": reading(two), "head-mix": reading(head), "zero-shot": reading(0.5)}
    return {
        "task": task,
        "params": {
            "readings": readings | {"knn": reading(0.6)},
            "slot_readings": {"knn-interp": reading(slot)},
        },
    }


def test_the_default_rule_asks_two_points_on_the_mean_and_no_task_a_point_below():
    records = [
        _record("a", 0.80, 0.86, 0.83),
        _record("a", 0.80, 0.86, 0.83),
        _record("b", 0.90, 0.895, 0.85),
    ]
    read = judge_table(records)
    assert read["table"]["two readers"]["a"] == pytest.approx(86.0)
    assert read["table"]["slot store (incumbent)"]["mean"] == pytest.approx(500 / 6)
    two, head = read["verdicts"]["two readers"], read["verdicts"]["head-mix"]
    assert two["gain"] == pytest.approx((86 * 2 + 89.5) / 3 - 500 / 6) and two["criteria_1_and_2"]
    assert head["worst_task"] == pytest.approx(-5.0) and not head["criteria_1_and_2"]  # b: 85 against 90


def test_probe_8_reads_two_grids_on_the_runs_both_hold_half_a_point_asked_no_task_a_point_below():
    def run(task: str, seed: int, two: float) -> dict:
        return {"seed": seed, **_record(task, 0.5, two, 0.5)}

    kept = [run("a", 1, 0.80), run("a", 2, 0.82), run("b", 1, 0.60), run("b", 2, 0.60)]
    candidate = [run("a", 1, 0.82), run("a", 2, 0.82), run("b", 1, 0.605), run("b", 9, 0.99)]  # b 9: unpaired
    read = probe8_reading(candidate, kept)
    assert read["runs"] == 3 and read["tasks"] == ["a", "b"]
    assert read["table"]["candidate"]["a"] == pytest.approx(82.0) and read["table"]["incumbent"]["a"] == 81.0
    assert read["gain"] == pytest.approx((82 + 82 + 60.5 - 80 - 82 - 60) / 3) and read["better_option"]
    worse = [run("a", 1, 0.86), run("a", 2, 0.86), run("b", 1, 0.585), run("b", 2, 0.59)]  # b -1.25
    read = probe8_reading(worse, kept)
    assert read["gain"] >= 0.5 and read["worst_task"] == pytest.approx(-1.25) and not read["better_option"]
    assert not probe8_reading(kept, kept)["better_option"]  # no gain


def _probe(variant: str, task: str, knn: float, tune_s: float) -> dict:
    return {"variant": variant, "task": task, "knn": knn, "tune_s": tune_s}


def test_probe_3_takes_a_variant_a_point_better_no_task_worse_and_within_three_times_the_time():
    records = [
        _probe("t4", "a", 80, 100), _probe("t4", "b", 60, 100),
        _probe("t6", "a", 83, 150), _probe("t6", "b", 59.5, 150),  # +1.25, b -0.5: qualifies
        _probe("t6s", "a", 84, 301), _probe("t6s", "b", 60, 301),  # +2.0 but 3.01x the time
    ]  # fmt: skip
    read = probe3_choice(records)
    assert read["chosen"] == "t6"
    assert read["variants"]["t6"]["gain"] == pytest.approx(1.25) and read["variants"]["t6"]["qualifies"]
    assert (
        read["variants"]["t6s"]["cost_ratio"] == pytest.approx(3.01)
        and not read["variants"]["t6s"]["qualifies"]
    )
    records[-1] = _probe("t6s", "b", 60, 299)  # within 3x now, and 0.75 above t6: the better mean taken
    assert probe3_choice(records)["chosen"] == "t6s"
    records[-2] = _probe("t6s", "a", 83.5, 299)  # within 0.5 of t6's mean, which is cheaper: t6
    assert probe3_choice(records)["chosen"] == "t6"
    worse = [*records[:2], _probe("t6", "a", 86, 100), _probe("t6", "b", 58.9, 100)]  # b -1.1
    assert probe3_choice(worse, candidates=("t6",))["chosen"] == "t4"


def test_probe_4_builds_adapters_only_a_point_and_a_half_above_the_kept_reader():
    records = [_probe("t12", "a", 76, 500), _probe("t12", "b", 77, 500), _probe("t4", "a", 99, 1)]
    assert probe4_reading(records, 75.0)["build"]  # 76.5: +1.5
    assert not probe4_reading(records, 75.1)["build"]


def test_probe_5_adopts_bfloat16_at_half_a_point_lost_and_one_and_a_half_times_the_speed():
    records = [
        _probe("t4", "a", 80, 90), _probe("t4", "b", 60, 110),
        _probe("t4b", "a", 79.5, 40), _probe("t4b", "b", 59.6, 60),  # -0.45 on the mean, 2x as fast
    ]  # fmt: skip
    read = probe5_reading(records, "t4")
    assert (
        read["change"] == pytest.approx(-0.45) and read["speed_up"] == pytest.approx(2.0) and read["adopted"]
    )
    records[2] = _probe("t4b", "a", 78.9, 40)  # a: -1.1
    assert not probe5_reading(records, "t4")["adopted"]
    records[2], records[3] = _probe("t4b", "a", 80, 67), _probe("t4b", "b", 60, 67)  # 100/67: 1.49x
    assert not probe5_reading(records, "t4")["adopted"]


def test_a_variant_names_its_layers_steps_lr_precision_and_adapters():
    assert Variant.parse("t4:4") == Variant("t4", 4, 60, 1e-4, "float32", 0)
    assert Variant.parse("t4b:4:60:1e-4:bfloat16") == Variant("t4b", 4, 60, 1e-4, "bfloat16", 0)
    assert Variant.parse("a12:12:60:5e-4:bfloat16:8") == Variant("a12", 12, 60, 5e-4, "bfloat16", 8)
    assert Variant.parse("a12:12:60:5e-4:bfloat16:8").also_ranks() == ()
    svd = Variant.parse("s12:12:60:2e-5:bfloat16:32:svd")
    assert svd == Variant("s12", 12, 60, 2e-5, "bfloat16", 32, "svd") and svd.also_ranks() == (8,)


def test_probe_6_takes_adapters_a_point_better_with_no_bound_on_the_tuning_time():
    records = [
        _probe("t4b", "a", 70, 50), _probe("t4b", "b", 60, 50),
        _probe("a12", "a", 72, 500), _probe("a12", "b", 59.5, 500),  # +0.75: short of +1
        _probe("a12h", "a", 73, 500), _probe("a12h", "b", 60, 500),  # +1.5, 10x the time: taken
    ]  # fmt: skip
    read = probe6_choice(records)
    assert read["chosen"] == "a12h" and not read["variants"]["a12"]["qualifies"]
    records[4] = _probe("a12h", "a", 74, 500)
    records[5] = _probe("a12h", "b", 58.5, 500)  # +1.25 on the mean, b -1.5
    assert probe6_choice(records)["chosen"] == "t4b"


def test_probe_7_takes_rank_8_unless_rank_32_is_half_a_point_better():
    records = [
        _probe("t4b", "a", 70, 50), _probe("t4b", "b", 60, 50),
        _probe("s12", "a", 73.5, 150), _probe("s12", "b", 60, 150),  # +1.75
        _probe("s12r8", "a", 72, 150), _probe("s12r8", "b", 60, 150),  # +1.0
    ]  # fmt: skip
    assert probe7_choice(records)["chosen"] == "s12"
    records[4] = _probe("s12r8", "a", 73.2, 150)  # rank 32 now 0.15 better only
    assert probe7_choice(records)["chosen"] == "s12r8"
    records[5] = _probe("s12r8", "b", 58.9, 150)  # b -1.1: rank 8 out
    assert probe7_choice(records)["chosen"] == "s12"
    records[3] = _probe("s12", "b", 58, 150)  # both out
    assert probe7_choice(records)["chosen"] == "t4b"


def test_an_svd_run_records_its_rank_and_the_lower_one_cut_from_the_same_tuning(sentence_mpnet_dir: Path):
    from openbook.sentence_reader import ReaderConfig, SentenceReader
    from openbook.split_encoder import SharedEncoder

    config = ReaderConfig(encoder=str(sentence_mpnet_dir), max_length=64, top_layers=3)
    base = SharedEncoder.load(config, "cpu")
    words = {"up": "great fun good", "down": "awful bad boring"}
    train_texts = [f"{w} {i}" for label, w in words.items() for i in range(4)]
    train_labels = [label for label in words for _ in range(4)]
    dev = (["great good", "bad awful"], ["up", "down"])
    records = probe_run(
        task="toy", seed=13, shots=3, variant=Variant("s", 3, 4, 1e-3, "float32", 12, "svd"),
        labels=["down", "up"], train=(train_texts, train_labels), dev=dev,
        p_lm_dev=np.full((2, 2), 0.5), frozen=SentenceReader(base), base=base,
    )  # fmt: skip
    assert [r["variant"] for r in records] == ["s", "sr8"]
    assert records[0]["tune_s"] == records[1]["tune_s"] and records[0]["gold"] == [1, 0]
    assert all(len(r["p"]["knn"]) == 2 for r in records)
