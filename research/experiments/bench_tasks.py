"""`python -m research bench tasks`: what one more task costs on a backbone that tasks share.

An api replica loads every task whose method keeps the backbone frozen onto
one copy of it (`load_classifier(path, backbone=shared)`, as the hot swap
does). This bench trains one task's adapters (or prompt) for `--steps` steps
on 8 synthetic sentences, saves the checkpoint, then loads it again and again
onto the one backbone, up to the largest `--tasks` count. Each load reads its
own tensors from disk and builds its own modules: the tasks share nothing but
the backbone, as distinct tasks would. At each count it prints

- the process's resident memory over what it held with the backbone alone,
  per task, and the tensors a task holds itself (adapters or prompt + store);
- the time to load a task (verify every file's sha256, hash the base weights,
  build the modules, fill them);
- the time to serve a task's first request after loading, and a later one,

beside the backbone's own size (the bytes of its weights).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from openbook.timing import synthetic_sentences


def resident_bytes() -> int:
    """The process's resident set size now (Linux: /proc/self/statm)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def release_freed_memory() -> None:
    """Collect garbage and give freed heap pages back to the OS (glibc): resident memory counts what is live.

    Without it the first tasks would fill memory that training freed but the allocator kept.
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the figures include freed memory
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def tensor_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of distinct storages (a tied weight counts once)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return sum(seen.values())


def run_tasks_bench(args: argparse.Namespace) -> None:
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.checkpoints import load_classifier, save_classifier
    from openbook.classifier import Classifier
    from openbook.methods import build_method, weights_sha256
    from openbook.prompting import get_preset
    from openbook.train_config import TrainConfig
    from openbook.training import train

    counts = sorted({int(n) for n in args.tasks.split(",")})
    method = build_method(args.method)
    if method.updates_backbone:
        raise ValueError(
            f"{method.spec} fine-tunes the backbone: each task loads its own copy, none is shared"
        )
    torch.manual_seed(0)
    backbone = load_backbone(
        BackboneConfig(name=args.backbone, max_length=args.max_length, device=args.device)
    )
    backbone_bytes = tensor_bytes(list(backbone.model.state_dict().values()))
    base_sha = weights_sha256(backbone.model)
    prompt = get_preset("SST-2").prompt(backbone.kind)
    texts = synthetic_sentences(8)
    labels = np.arange(8) % 2
    config = TrainConfig(steps=args.steps, batch_size=4, eval_every=args.steps, calibration="none")
    classifier = method.prepare(Classifier(backbone, *prompt))
    started = time.perf_counter()
    result = train(classifier, method, texts, labels, texts, labels, config, progress=False)
    train_s = time.perf_counter() - started
    classifier.add_examples(texts, [classifier.labels[i] for i in labels], ids=np.arange(8))
    with tempfile.TemporaryDirectory() as scratch:
        path = save_classifier(
            Path(scratch) / "task",
            classifier,
            method,
            base_weights_sha256=base_sha,
            train_config=config,
            training_data_sha256="0" * 64,
            dev_metrics={"accuracy": result.best.accuracy},
        )
        own_bytes = sum(t.numel() * t.element_size() for t in method.trained_tensors(classifier).values())
        del classifier, result
        print(
            f"backbone {args.backbone} on {backbone.device}: weights {backbone_bytes / 2**20:.1f} MiB; "
            f"{method.spec} trained {args.steps} steps in {train_s:.1f} s, checkpoint "
            f"{sum(f.stat().st_size for f in path.iterdir()) / 2**10:.0f} KiB"
        )
        release_freed_memory()
        before = resident_bytes()
        tasks: list[Classifier] = []
        load_s: list[float] = []
        first_s: list[float] = []
        later_s: list[float] = []
        request = ["a warm and funny film"]
        for count in counts:
            while len(tasks) < count:
                started = time.perf_counter()
                task, _ = load_classifier(path, backbone=backbone)
                load_s.append(time.perf_counter() - started)
                tasks.append(task)
            for task in tasks[len(first_s) :]:
                started = time.perf_counter()
                task.predict(request)
                first_s.append(time.perf_counter() - started)
                started = time.perf_counter()
                task.predict(request)
                later_s.append(time.perf_counter() - started)
            release_freed_memory()
            per_task = (resident_bytes() - before) / count
            store_bytes = tasks[0].store.vectors_of(tasks[0].store.ids()).nbytes
            print(
                f"{count:>4} tasks: resident +{per_task / 2**20:.2f} MiB per task "
                f"(+{per_task * count / 2**20:.0f} MiB in all = {per_task * count / backbone_bytes:.2f}x "
                f"the backbone); own tensors {(own_bytes + store_bytes) / 2**10:.0f} KiB "
                f"(method {own_bytes / 2**10:.0f} + store {store_bytes / 2**10:.0f}); "
                f"load {statistics.median(load_s) * 1e3:.0f} ms, first request "
                f"{statistics.median(first_s) * 1e3:.0f} ms (max {max(first_s) * 1e3:.0f}), "
                f"later {statistics.median(later_s) * 1e3:.0f} ms (medians)"
            )
