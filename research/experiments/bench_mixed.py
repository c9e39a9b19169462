"""`python -m research bench mixed`: LoRA tasks on one backbone, one mixed forward against a forward per task.

N tasks, each with LoRA adapters of its own (random, so no two alike; a forward's cost does not depend
on the values) over one shared backbone, classify `--batch-size` synthetic sentences in all, batch/N each.
Side by side, in one run, on one device and dtype, the median of `--repeats` timings of

- **one task**: a single task classifies all `--batch-size` texts in one forward: the throughput to keep;
- **separate**: each of the N tasks classifies its own texts, one forward after another (a queue per
  task, as before mixed batches);
- **mixed**: one `MixedForward` runs every task's rows as one forward (`openbook/mixed.py`).

It prints texts/s of each and the ratios to one task; the service's target is mixed >= 0.7x one task
at 10 tasks. Each timing follows a warm-up call and waits for the device's queued kernels.
"""

from __future__ import annotations

import argparse

import torch
from openbook.timing import median_seconds, synthetic_sentences


def run_mixed_bench(args: argparse.Namespace) -> None:
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.classifier import Classifier
    from openbook.methods import build_method
    from openbook.methods.lora import adapter_parameters
    from openbook.mixed import MixedForward
    from openbook.prompting import get_preset

    counts = sorted({int(n) for n in args.tasks.split(",")} - {1})
    torch.manual_seed(0)
    backbone = load_backbone(
        BackboneConfig(name=args.backbone, max_length=args.max_length, device=args.device)
    )
    prompt = get_preset("SST-2").prompt(backbone.kind)
    method = build_method(args.method)
    generator = torch.Generator().manual_seed(0)

    def task() -> Classifier:
        classifier = method.prepare(Classifier(backbone, *prompt, batch_size=args.batch_size))
        with torch.no_grad():
            for parameter in adapter_parameters(classifier.backbone).values():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
        return classifier

    mixer = MixedForward(backbone)
    texts = synthetic_sentences(args.batch_size)
    tasks = [task()]
    if not mixer.mixes(tasks[0]):
        raise ValueError(
            f"{args.method} gives no LoRA adapters to mix: use lora or retroprompt/backbone=lora"
        )
    single = median_seconds(lambda: tasks[0].predict(texts), args.repeats)
    print(
        f"backbone {args.backbone} on {backbone.device} ({backbone.dtype}), {method.spec}, "
        f"{args.batch_size} texts per round, median of {args.repeats}"
    )
    print(f"   1 task:  {args.batch_size / single:8.1f} texts/s ({single * 1e3:.0f} ms a round)")
    for count in counts:
        while len(tasks) < count:
            tasks.append(task())
        share = [texts[i::count] for i in range(count)]  # batch/N texts each, every length mixed in
        parts = list(zip(tasks[:count], share, strict=True))
        separate = median_seconds(lambda: [c.predict(t) for c, t in parts], args.repeats)  # noqa: B023
        mixed = median_seconds(lambda: mixer.predict(parts), args.repeats)  # noqa: B023
        rate = args.batch_size
        print(
            f"{count:>4} tasks: separate {rate / separate:8.1f} texts/s ({single / separate:.2f}x one task), "
            f"mixed {rate / mixed:8.1f} texts/s ({single / mixed:.2f}x one task, "
            f"{separate / mixed:.2f}x separate)"
        )
