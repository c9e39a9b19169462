"""`python -m research served` on the tiny causal LM and the tiny MPNet: a seed's training split fitted as
a service job fits it (dev held out of the examples by hash, the reader tuned again on all of them), the
version read on test and on out-of-scope queries, one record per (task, seed), resumed."""

import json

from openbook.selection import LAMBDA_GRID

from research.cli import main


def test_served_fits_as_a_job_and_reads_test_and_refusals(
    tmp_path, causal_dir, reader_mpnet_dir, training_flags, toy_dataset
):
    data = toy_dataset(tmp_path / "data", seeds=(1,))
    rows = [("1", t) for t in toy_dataset.positive] + [("0", t) for t in toy_dataset.negative]
    more = [(label, f"{text} , really") for label, text in rows]  # 16 examples: dev holds several
    toy_dataset.write_csv(data / "toy" / "16-1" / "train.csv", rows + more)
    toy_dataset.write_csv(
        data / "toy" / "oos_test.csv", [("-1", "who wrote the book"), ("-1", "where is it")]
    )
    out = tmp_path / "out"
    args = [
        "served", "--data", str(data), "--task", "toy", "--seeds", "1", "--shots", "16", "--out", str(out),
        "--template", "{text} It was {mask}", "--labels", "0=bad,1=good", "--backbone", str(causal_dir),
        "--reader", str(reader_mpnet_dir), *training_flags, "--at-lam", ",".join(map(str, LAMBDA_GRID)),
    ]  # fmt: skip
    assert main(args) == 0
    (record,) = json.loads((out / "served.json").read_text())
    assert (record["task"], record["seed"], record["examples"], record["test_examples"]) == ("toy", 1, 16, 10)
    # the service's split: some examples held out as dev, and the served reader tuned again on all
    assert record["dev"] >= 2 and record["train"] + record["dev"] == 16
    assert record["reader_tuned_on"] == 16
    assert record["min_similarity"] is not None  # chosen on dev, before the reader was tuned again
    assert record["command"].startswith("python -m research served --data")
    # test read again at every λ of the grid, on the same fit: at the λ the job chose, the served accuracy
    assert list(record["at_lam"]) == [str(lam) for lam in LAMBDA_GRID] and record["labels"] == 2
    assert record["at_lam"][str(record["lam"])] == record["accuracy"]
    refusals = record["out_of_scope"]
    assert refusals["examples"] == 2
    assert refusals["in_scope_accuracy"] <= refusals["in_scope_accuracy_answering_all"] == record["accuracy"]
    assert 0 <= refusals["recall"] <= 1 and 0 <= refusals["in_scope_refused"] <= 1
    # resumed: the (task, seed) recorded is not run again
    (out / "served.json").write_text(json.dumps([record | {"accuracy": -1.0}]))
    assert main(args) == 0
    (kept,) = json.loads((out / "served.json").read_text())
    assert kept["accuracy"] == -1.0
