"""`python -m research bench store|train`: what the store, kNN and training add to the backbone's own cost.

Prints measured ratios; nothing here passes or fails. Reported:

1. kNN search + interpolation time per batch, as a share of the backbone's
   forward time for the same batch, at each store size (synthetic unit
   vectors of the backbone's width), for each search backend side by side:
   FAISS on the CPU and exact torch search on `--device` (on a GPU: fp16 keys);
2. the time to add one example to a store of the largest size, per backend;
3. store-building throughput (prompt encoding + forward + normalise + add)
   against a raw batched forward of the same prompted token ids at the same
   batch size, both with the full LM (logits at every position, the plain HF
   call) and with the transformer body alone (no LM head: the stricter
   reference).

`python -m research bench train` times one training step of each trainable method
(loss, backward, gradient clipping, AdamW step) against the backbone's raw
forward + backward on the same prompted token ids at the same batch size
(the plain HF call with logits at every position, cross-entropy at the slot),
with and without an AdamW step of its own.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
from openbook.knn import interpolate, knn_distribution
from openbook.store import Backend, KnowledgeStore
from openbook.timing import median_seconds, synthetic_sentences

if TYPE_CHECKING:
    from openbook.classifier import Classifier


def filled_store(
    dim: int, size: int, device: torch.device, backend: Backend, rng: np.random.Generator
) -> KnowledgeStore:
    """`size` random unit vectors with 2 labels, exact search (no IVF), added in slices of 2^18."""
    store = KnowledgeStore(dim, approx_threshold=2 * size + 1, device=device, backend=backend)
    for start in range(0, size, 1 << 18):
        count = min(1 << 18, size - start)
        vectors = rng.standard_normal((count, dim), dtype=np.float32)
        store.add(np.arange(start, start + count), vectors, rng.integers(0, 2, count))
    return store


def run_store_bench(args: argparse.Namespace) -> None:
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.classifier import Classifier
    from openbook.prompting import get_preset

    torch.manual_seed(0)
    backbone = load_backbone(
        BackboneConfig(name=args.backbone, max_length=args.max_length, device=args.device)
    )
    preset = get_preset("SST-2")
    classifier = Classifier(backbone, *preset.prompt(backbone.kind), batch_size=args.batch_size)
    batch_size = args.batch_size
    texts = synthetic_sentences(batch_size)
    encoder = classifier.encoder

    def forward() -> None:
        with torch.inference_mode():
            backbone.forward(encoder.encode(texts), encoder.label_token_ids)

    device = backbone.device
    forward_s = median_seconds(forward, repeats=5, device=device)
    dtype = str(backbone.dtype).removeprefix("torch.")
    print(
        f"backbone {args.backbone} on {device} ({dtype}): forward of one batch ({batch_size} texts)"
        f" {forward_s * 1e3:.1f} ms"
    )
    rng = np.random.default_rng(0)
    dim = backbone.hidden_size
    sizes = [int(s) for s in args.sizes.split(",")]
    p_lm = torch.full((batch_size, 2), 0.5)
    # FAISS runs on the host whatever --device is; the torch backend runs where the model does.
    backends: list[tuple[Backend, torch.device]] = [("faiss", torch.device("cpu")), ("torch", device)]
    queries = rng.standard_normal((batch_size, dim), dtype=np.float32)
    for size in sizes:
        for backend, store_device in backends:
            store = filled_store(dim, size, store_device, backend, rng)

            def knn_step(store: KnowledgeStore = store) -> None:
                hits = store.search(queries, 16)
                p_knn = knn_distribution(
                    torch.from_numpy(hits.similarities), torch.from_numpy(hits.labels), 2, 0.1
                )
                interpolate(p_knn, p_lm, 0.5)

            once = median_seconds(knn_step, repeats=1, device=store_device)
            knn_s = median_seconds(knn_step, repeats=20 if once < 0.1 else 5, warmup=0, device=store_device)
            print(
                f"store of {size:>7,}: kNN search + interpolation {knn_s * 1e3:.2f} ms per batch"
                f" = {100 * knn_s / forward_s:.2f}% of the forward [{_backend_name(store)}]"
            )
            if size == sizes[-1]:
                add_s = _add_one_seconds(store, rng)
                print(
                    f"add one example to a store of {size:,} [{_backend_name(store)}]: {add_s * 1e3:.3f} ms"
                    " (median of 200)"
                )
            del store, knn_step  # the next store may need the memory

    corpus = synthetic_sentences(batch_size * 4, seed=1)

    def build_store() -> None:
        built = KnowledgeStore(dim, device=device)
        embeddings = classifier.embed(corpus)
        built.add(np.arange(len(corpus)), embeddings.vectors, np.zeros(len(corpus), dtype=np.int64))

    # The raw reference runs the very same prompted token ids, so the ratio isolates our overhead.
    batches = [
        encoder.encode(corpus[i : i + batch_size]).to(backbone.device)
        for i in range(0, len(corpus), batch_size)
    ]

    def raw(model: torch.nn.Module) -> Callable[[], None]:
        def run() -> None:
            with torch.inference_mode():
                for batch in batches:
                    model(
                        input_ids=batch.input_ids,
                        attention_mask=batch.attention_mask,
                        position_ids=batch.position_ids,
                    )

        return run

    build_s = median_seconds(build_store, repeats=3, device=device)
    raw_lm_s = median_seconds(raw(backbone.model), repeats=3, device=device)
    raw_body_s = median_seconds(raw(backbone.model.base_model), repeats=3, device=device)
    print(f"store building: {len(corpus) / build_s:.1f} texts/s at batch {batch_size}")
    for name, seconds in (("full LM", raw_lm_s), ("body only", raw_body_s)):
        print(
            f"  vs raw forward, {name:<9}: {len(corpus) / seconds:.1f} texts/s"
            f" -> ratio {seconds / build_s:.2f}"
        )


def _backend_name(store: KnowledgeStore) -> str:
    return f"{store.backend} {store.device.type} {store.key_dtype}"


def _add_one_seconds(store: KnowledgeStore, rng: np.random.Generator) -> float:
    one = rng.standard_normal((1, store.dim), dtype=np.float32)
    new_ids = iter(range(10**9, 10**9 + 10_000))
    return median_seconds(
        lambda: store.add(np.array([next(new_ids)]), one, np.array([1])), repeats=200, device=store.device
    )


def run_train_bench(args: argparse.Namespace) -> None:
    import dataclasses

    import torch.nn.functional as F
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.classifier import Classifier
    from openbook.methods import TrainBatch, build_method
    from openbook.methods.base import only_these_train
    from openbook.prompting import get_preset
    from openbook.training import fused_adam_supported

    torch.manual_seed(0)
    backbone = load_backbone(
        BackboneConfig(name=args.backbone, max_length=args.max_length, device=args.device)
    )
    batch_size = args.train_batch_size
    texts = synthetic_sentences(batch_size)
    base = Classifier(backbone, *get_preset("SST-2").prompt(backbone.kind))
    gold = torch.arange(batch_size, device=backbone.device) % 2
    batch = base.encoder.encode(texts).to(backbone.device)
    label_ids = torch.tensor([ids[0] for ids in base.encoder.label_token_ids], device=backbone.device)
    model = backbone.model
    parameters = [p for p in model.parameters() if p.requires_grad]

    def raw_step(optimizer: torch.optim.Optimizer | None) -> Callable[[], None]:
        def run() -> None:
            logits = model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
            ).logits  # (B, T, V): every position, as a plain call computes it
            rows = torch.arange(batch_size, device=backbone.device)
            loss = F.cross_entropy(logits[rows, batch.slot_index][:, label_ids], gold)
            loss.backward()
            if optimizer is not None:
                optimizer.step()
            model.zero_grad(set_to_none=True)

        return run

    model.train()
    raw_s = median_seconds(raw_step(None), repeats=args.repeats)
    raw_adam_s = median_seconds(raw_step(torch.optim.AdamW(parameters, lr=1e-9)), repeats=args.repeats)
    print(f"backbone {args.backbone}, batch {batch_size}: raw forward+backward {raw_s * 1e3:.0f} ms")
    print(f"  raw forward+backward+AdamW step {raw_adam_s * 1e3:.0f} ms")
    corpus = synthetic_sentences(32, seed=1)
    # The methods' steps as `training.train` takes them: gradients for the trained weights alone, the
    # fused AdamW where it runs, clipping; the last one (retroprompt) is timed again below.
    for spec in (
        "prompt-ft/no-freeze-embeddings",
        "prompt-ft",
        "retroprompt/no-freeze-embeddings",
        "retroprompt",
    ):
        method = build_method(spec)
        classifier = method.prepare(dataclasses.replace(base, store=base.empty_store()))
        classifier.add_examples(corpus, [str(i % 2) for i in range(len(corpus))], ids=np.arange(len(corpus)))
        trained = method.trainable_parameters(classifier)
        optimizer = torch.optim.AdamW(trained, lr=1e-9, fused=fused_adam_supported(trained))

        def step(method=method, classifier=classifier, optimizer=optimizer, trained=trained) -> None:
            model.train()
            loss = method.loss(classifier, TrainBatch(texts, gold, np.arange(batch_size, dtype=np.int64)))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()

        with only_these_train(classifier, trained):
            step_s = median_seconds(step, repeats=args.repeats)
        print(
            f"{spec:<29} training step {step_s * 1e3:.0f} ms: throughput "
            f"{raw_s / step_s:.2f}x raw forward+backward, {raw_adam_s / step_s:.2f}x with its AdamW step"
        )
    _epoch_passes_and_autocast(base, method_step=step, corpus=corpus, repeats=args.repeats)


def _epoch_passes_and_autocast(
    base: Classifier, *, method_step: Callable[[], None], corpus: list[str], repeats: int
) -> None:
    """An epoch's other passes beside its steps, and what bfloat16 autocast does to both.

    Under an epoch budget every epoch ends with a dev check and (RetroPrompt) a store re-embedding:
    no-grad forwards of the dev and training texts, timed here on 32 prompts. Autocast runs the
    matmuls in bfloat16 over float32 weights (the master copy stays float32); on CPUs with AMX or
    AVX512-BF16 those matmuls run natively. Its cost in accuracy shows as the largest change of a
    label's log-probability over the 32 prompts.
    """
    from openbook.devices import Precision, precision_context

    device = base.backbone.device
    timings, scores = {}, {}
    runs: tuple[tuple[str, Precision], ...] = (("float32", "float32"), ("bfloat16 autocast", "bfloat16"))
    for name, precision in runs:  # as `training.train` runs them

        def step(precision: Precision = precision) -> None:
            with precision_context(precision, device):
                method_step()

        def forward(precision: Precision = precision, name: str = name) -> None:
            with precision_context(precision, device):
                scores[name] = base.embed(corpus).lm_log_probs

        base.backbone.model.eval()
        timings[name] = (median_seconds(step, repeats), median_seconds(forward, repeats))
    (step_32, forward_32), (step_16, forward_16) = timings.values()
    print(
        f"a dev check or store re-embedding of {len(corpus)} prompts {forward_32 * 1e3:.0f} ms "
        f"= {forward_32 / step_32:.2f} training steps"
    )
    drift = float(np.abs(scores["float32"] - scores["bfloat16 autocast"]).max())
    print(
        f"bfloat16 autocast: training step {step_16 * 1e3:.0f} ms ({step_32 / step_16:.2f}x float32's "
        "speed), "
        f"forward of {len(corpus)} {forward_16 * 1e3:.0f} ms ({forward_32 / forward_16:.2f}x); "
        f"largest change of a label log-probability {drift:.3f}"
    )
