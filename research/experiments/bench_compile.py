"""`python -m research bench compile`: the compiled forward (openbook/compiled.py) against the eager one.

One backbone classifies synthetic sentences in batches of each `--rows` count: the eager forward first,
the median of `--repeats` timings each; then `Backbone.compile(max_rows=--max-rows)` compiles and records
every bucket (rows a power of 4 up to `--max-rows`, length a multiple of 32 up to `--max-length`), timed,
as a replica does when it loads a backbone with `OPENBOOK_COMPILE`; then the same batches again,
compiled. It prints texts/s of each and compiled over eager. The compile time is what a replica adds to
its start and to each hot swap that brings a backbone of its own; the speed-up is what it buys. The api's
bound on texts per forward, which it compiles up to, is `OPENBOOK_BATCH_MAX_TEXTS` (1024 on CUDA).
"""

from __future__ import annotations

import argparse
import time

import torch
from openbook.timing import median_seconds, synchronize, synthetic_sentences


def run_compile_bench(args: argparse.Namespace) -> None:
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.classifier import Classifier
    from openbook.prompting import get_preset

    rows = sorted({int(n) for n in args.rows.split(",")})
    if rows[-1] > args.max_rows:
        raise ValueError(f"--rows go up to {rows[-1]}, past --max-rows {args.max_rows}: no bucket holds them")
    backbone = load_backbone(
        BackboneConfig(name=args.backbone, max_length=args.max_length, device=args.device)
    )
    task = Classifier(backbone, *get_preset("SST-2").prompt(backbone.kind))
    texts = synthetic_sentences(rows[-1], seed=13)
    batches = {count: task.encoder.encode(texts[:count]) for count in rows}

    def forward(count: int) -> float:
        def run() -> None:
            with torch.inference_mode():
                backbone.forward(batches[count], task.encoder.label_token_ids)

        return median_seconds(run, args.repeats, device=backbone.device)

    print(f"backbone {args.backbone} on {backbone.device} ({backbone.dtype}), median of {args.repeats}")
    eager = {count: forward(count) for count in rows}
    for count in rows:
        width = batches[count].input_ids.shape[1]
        print(f"eager    {count:>5} rows of {width} tokens: {count / eager[count]:9.1f} texts/s")
    synchronize(backbone.device)
    started = time.perf_counter()
    compiled = backbone.compile(max_rows=args.max_rows)
    synchronize(backbone.device)
    print(
        f"compiled and recorded {len(compiled.row_sizes) * len(compiled.lengths)} buckets up to"
        f" {args.max_rows} rows in {time.perf_counter() - started:.1f} s"
    )
    for count in rows:
        seconds = forward(count)
        print(
            f"compiled {count:>5} rows: {count / seconds:9.1f} texts/s, {eager[count] / seconds:.2f}x eager"
        )
