"""The k-shot protocol for trainable methods: train on `train`, select on `dev`, report `test`.

Per seed, each method is trained from the same initial weights with the seed
as its training seed; the kept weights, the inference hyper-parameters (k, T,
lambda for kNN interpolation) and the checkpoint step are all chosen on dev.
Variants of a method that differ only in inference options (e.g.
`retroprompt` and `retroprompt/no-knn-infer`) share one training run; each
record's `seconds` counts that training in full.

Records are handed to `on_record` as soon as they exist, so a caller can save
them and a long table can be filled over several sittings. Each says what the
run was given and did (`step_budget`, `epochs`, `check_every`: the steps between
its dev checks, `steps_run`) and what dev made
of it: `dev_accuracy` (the final classifier, its kNN interpolation included)
and the kept step's dev score (`best_step`, `best_step_dev_accuracy` and
`best_step_dev_log_likelihood`, of the prompt alone). Each record also reads its trained classifier
in all three ways (`readings`: the prompt alone, the store of trained keys alone and both interpolated,
each chosen on dev as the inference methods are), so a table shows whether the store speaks after
training. With splits whose `test` is None (a dev-only run) no test text is read and the record has no
test figures.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from openbook.classifier import Classifier
from openbook.data import KShotSplits, example_labels, load_kshot
from openbook.fitting import LabelledTexts, job_reader_tuning, tune_reader
from openbook.methods import Method, build_method, method_config
from openbook.reader_book import as_string
from openbook.train_config import TrainConfig
from openbook.training import train
from tqdm.auto import tqdm

from research.experiments.distributions import write_distributions
from research.experiments.embedding_cache import in_book_space
from research.experiments.evaluation import (
    INFERENCE_METHODS,
    EvalRecord,
    MethodResult,
    book_at_knn,
    method_inputs,
    out_of_scope_on_test,
    params_on_test,
    ran_on,
    refusals_on_test,
    scored_queries,
    scores_on_test,
)
from research.experiments.two_readers import head_readings

# The three ways every trained classifier is read, its own inference among them (`readings` in each
# record): the prompt alone, the store of trained keys alone, both interpolated (INFERENCE_METHODS). With a
# sentence reader (`--reader`), the store is read in its space: the second reader alone, and both; and
# `slot_readings` read the same training as it would be read without one (the slot vectors' store).
READINGS = ("zero-shot", "knn", "knn-interp")


def _reading(
    result: MethodResult, test_labels: np.ndarray | None, num_labels: int
) -> dict[str, float | None]:
    return {
        "dev_accuracy": result.params["dev_accuracy"],
        "accuracy": scores_on_test(result.p_test, test_labels, num_labels)[0],
    }


def evaluate_trained(
    classifier: Classifier,
    data_dir: str | Path,
    task: str,
    specs: Sequence[str],
    seeds: Sequence[int],
    config: TrainConfig,
    *,
    done: set[tuple[str, str, int]] = frozenset(),  # type: ignore[assignment]  # (task, method, seed) to skip
    on_record: Callable[[EvalRecord], None] = lambda record: None,
    shots: int = 16,
    progress: bool = True,
    load: Callable[[int], KShotSplits] | None = None,  # seed -> splits; default: the k-shot layout
    out: Path | None = None,  # the grid's directory: with a reader, each run's distributions kept in it
) -> list[EvalRecord]:
    methods = {spec: build_method(spec) for spec in specs}  # unknown methods and options fail first
    for method in methods.values():
        method.check_backbone(classifier.backbone)
    load = load or (lambda seed: load_kshot(data_dir, task, seed, shots))
    splits = {seed: load(seed) for seed in seeds}
    test_part = scored_queries(classifier, splits[seeds[0]])  # None: a dev-only run
    test_texts = None if test_part is None else [e.text for e in test_part[0]]
    test_labels = None if test_part is None else test_part[1]
    initial = {name: t.detach().clone() for name, t in classifier.backbone.model.state_dict().items()}

    records = []
    for seed in seeds:
        train_split, dev_split = splits[seed].train, splits[seed].dev
        train_labels, dev_labels = (
            example_labels(classifier, train_split),
            example_labels(classifier, dev_split),
        )
        for group in _training_groups([s for s in specs if (task, s, seed) not in done], methods):
            started = time.perf_counter()
            classifier.backbone.model.load_state_dict(initial)
            method = methods[group[0]]
            trained = method.prepare(
                dataclasses.replace(classifier, store=classifier.empty_store(), label_bias=None, prompt=None)
            )
            reader_started = time.perf_counter()
            if trained.reader is not None:  # tuned on the training examples first, as a service job does,
                # as a job holding the split's train and dev examples would tune it
                tuning = job_reader_tuning(trained.reader, len(train_split) + len(dev_split))
                tune_reader(trained, LabelledTexts([e.text for e in train_split], train_labels), seed, tuning)
            reader_seconds = time.perf_counter() - reader_started
            result = train(
                trained,
                method,
                [e.text for e in train_split],
                train_labels,
                [e.text for e in dev_split],
                dev_labels,
                dataclasses.replace(config, seed=seed),
                progress=progress,
            )
            dev = result.dev_embeddings  # the last dev check's, where the trained classifier serves them so
            if dev is None:
                dev = trained.embed([e.text for e in dev_split])
            elif trained.reader is not None:  # the dev checks read P_LM alone
                dev = dataclasses.replace(
                    dev, reader_vectors=trained.reader.embed([as_string(e.text) for e in dev_split])
                )
            test = None
            if test_texts is not None:
                test = trained.embed(test_texts, progress=f"{task} test" if progress else False)
            inputs = method_inputs(
                trained.knn_book(),
                trained.label_bias,
                in_book_space(trained, dev),
                dev_labels,
                None if test is None else in_book_space(trained, test),
                test_labels,
                knn=classifier.knn,
            )
            shared_seconds = time.perf_counter() - started
            read = {reading: INFERENCE_METHODS[reading](inputs) for reading in READINGS}
            readings = {
                reading: _reading(outcome_of, test_labels, len(classifier.labels))
                for reading, outcome_of in read.items()
            }
            slot_readings = {}
            if trained.reader is not None:  # probe 2's head on the tuned reader, alone and mixed
                readings |= head_readings(
                    trained.knn_book().vectors_of(np.arange(len(train_labels))),
                    train_labels,
                    {
                        "dev": trained.knn_queries(dev),
                        "test": None if test is None else trained.knn_queries(test),
                    },
                    {"dev": inputs.p_lm_dev, "test": inputs.p_lm_test},
                    {"dev": dev_labels, "test": test_labels},
                    len(classifier.labels),
                )
            if trained.reader is not None:  # the same training read with the slot store, as without a reader
                slot_inputs = method_inputs(
                    trained.store, trained.label_bias, dev, dev_labels, test, test_labels, knn=classifier.knn
                )
                slot_read = {reading: INFERENCE_METHODS[reading](slot_inputs) for reading in READINGS}
                slot_readings = {
                    "slot_readings": {
                        reading: _reading(outcome_of, test_labels, len(classifier.labels))
                        for reading, outcome_of in slot_read.items()
                    }
                }
                if out is not None:
                    write_distributions(
                        out,
                        task,
                        seed,
                        list(classifier.labels),
                        read
                        | {"book": book_at_knn(inputs)}
                        | {f"slot:{r}": slot_read[r] for r in ("knn", "knn-interp")},
                        {"dev": dev_labels, "test": test_labels},
                    )
            for spec in group:
                inference_started = time.perf_counter()
                inference = methods[spec].inference
                outcome = read[inference] if inference in read else INFERENCE_METHODS[inference](inputs)
                test_accuracy, test_macro_f1 = scores_on_test(
                    outcome.p_test, test_labels, len(classifier.labels)
                )
                record = EvalRecord(
                    task=task,
                    method=spec,
                    seed=seed,
                    accuracy=test_accuracy,
                    macro_f1=test_macro_f1,
                    params={
                        **outcome.params,
                        "inference": methods[spec].inference,
                        "method_config": method_config(spec),  # what the spec meant when this ran
                        "best_step": result.best.step,
                        "best_step_dev_accuracy": result.best.accuracy,
                        "best_step_dev_log_likelihood": result.best.log_likelihood,
                        "step_budget": result.step_budget,
                        "epochs": config.budget().get("epochs"),  # the default budget's too
                        "check_every": result.check_every,
                        "steps_run": result.steps_run,
                        "train_seconds": round(result.seconds, 1),
                        **({} if trained.reader is None else {"reader_seconds": round(reader_seconds, 1)}),
                        "shared_training": [s for s in group if s != spec],
                        "readings": readings,
                        **slot_readings,
                        **ran_on(classifier.backbone),
                        **params_on_test(test, test_labels),
                        **out_of_scope_on_test(outcome, dev_labels, test_labels),
                        **(
                            {}
                            if trained.reader is None
                            else refusals_on_test(outcome, inputs, dev_labels, test_labels)
                        ),
                    },
                    seconds=round(shared_seconds + time.perf_counter() - inference_started, 3),
                )
                records.append(record)
                on_record(record)
            if progress:
                scores = ", ".join(
                    f"{r.method} {100 * r.params['dev_accuracy']:.1f}"
                    + ("" if r.accuracy is None else f" (test {100 * r.accuracy:.1f})")
                    for r in records[-len(group) :]
                )
                tqdm.write(f"{task} seed {seed}, dev: {scores}")
    classifier.backbone.model.load_state_dict(initial)
    return records


def _training_groups(specs: Sequence[str], methods: dict[str, Method]) -> list[list[str]]:
    """Specs grouped by what their training depends on, in first-appearance order."""
    groups: dict[tuple, list[str]] = {}
    for spec in specs:
        method = methods[spec]
        groups.setdefault((method.name, method.config.training_key()), []).append(spec)
    return list(groups.values())
