"""Class-incremental continual learning over a sequence of k-shot tasks.

Tasks arrive one after another (e.g. SST-2, then TREC, then MPQA). Stage t
trains on its own 16-shot train split only (no replay of earlier stages' data;
its dev split picks the kept step) and leaves a classifier that predicts over
every label seen so far, with no task id at test time. After each stage the
classifier is tested on the (sub-sampled) test sets of all stages so far,
which fills the lower triangle of an accuracy matrix `a[t][j]`. Reported:

- average accuracy: the mean of the last row, `mean_j a[T-1][j]`;
- forgetting (Chaudhry et al., ECCV 2018): for each earlier stage j < T-1,
  its best accuracy before the last stage minus its final accuracy,
  `max_{j <= t < T-1} a[t][j] - a[T-1][j]`, averaged over j.

Label spaces. Stage labels are namespaced by the task (`sst2:0`, `trec:3`,
`mpqa:1`), since several tasks use the same raw labels, and each label has its
own label word: the verbalizer of stage t is the union of the words of
stages 1..t, so it grows, and a fresh `Classifier` is built over it at each
stage, carrying the method's trained tensors (the backbone weights, or the
prompt pool) forward. One template serves every stage (`DEFAULT_TEMPLATE`).

Method-specific memory. `training.train` rebuilds the store from the current
stage's training examples (RetroPrompt's kNN-guided loss and training
demonstrations read that). A method that reads the store at inference then
gets the earlier stages' training examples added back, re-embedded with the
new weights: its open book at stage t holds every training example of stages
1..t, which is the point of keeping a non-parametric memory. kNN settings
(k, T, lambda) are chosen on the current stage's dev split.

Calibration defaults to none here: a label prior measured on stage t's texts
would also be subtracted from the earlier stages' labels, penalising them for
how often they fire on unrelated text.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from openbook.atomic import write_text
from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.data import Example, example_labels, fixed_sample, load_kshot
from openbook.methods import Method, build_method
from openbook.prompting import PromptError, Template, Verbalizer
from openbook.selection import accuracy
from openbook.train_config import TrainConfig
from openbook.training import train
from tqdm.auto import tqdm

from research.experiments.evaluation import INFERENCE_METHODS, method_inputs

# One cloze question for sentiment and question-type labels alike. Chosen on dev: untrained smollm2-135m,
# no calibration, seed-13 dev of SST-2, trec and mpqa, each scored over all 10 labels (words below); mean
# accuracy 29.9% against 25.3% for "Text: {text}\nLabel: {mask}" and 22.2% for "{text} Topic or sentiment:
# {mask}" (10% is chance); with SST-2 negative/positive and MPQA bad/good instead, 28.1 / 20.1 / 19.1%.
DEFAULT_TEMPLATE = "{text}\nThis text is about {mask}"
# Label words per task; the tasks of one sequence must not share a word (SST-2 and MPQA differ here).
STAGE_WORDS = {
    "sst-2": "0=terrible,1=great",
    "trec": "0=Description,1=Entity,2=Expression,3=Human,4=Location,5=Number",
    "mpqa": "0=negative,1=positive",
}
TEST_SIZE = 300  # test examples per stage: a fixed seed-0 sample, the same for every method and seed


@dataclass(frozen=True)
class Stage:
    task: str  # directory under the k-shot root
    prefix: str  # namespace of its labels: `sst2:0`
    words: Verbalizer  # raw labels of the task -> label words

    def label(self, raw: str) -> str:
        return f"{self.prefix}:{raw}"


@dataclass(frozen=True)
class StageData:
    train: list[Example]  # labels namespaced
    dev: list[Example]
    test: list[Example]  # the fixed sub-sample


@dataclass(frozen=True)
class ContinualRecord:
    method: str
    seed: int
    stages: list[str]
    test_size: int
    accuracy: list[list[float]]  # accuracy[t][j]: on stage j's test after training stage t (j <= t)
    average_accuracy: float
    forgetting: float | None  # None for a single stage
    params: list[dict] = field(default_factory=list)  # per stage: best step, dev accuracy, kNN settings
    seconds: float = 0.0


def build_stages(tasks: Sequence[str], words: dict[str, str] | None = None) -> list[Stage]:
    """Stages for task names; `words` maps a task (case-insensitive) to `label=word,...`, over STAGE_WORDS."""
    table = {k.lower(): v for k, v in (STAGE_WORDS | (words or {})).items()}
    stages = []
    for task in tasks:
        if task.lower() not in table:
            raise PromptError(
                f"no label words for continual stage {task!r}: give them as {task}:label=word,..."
            )
        prefix = re.sub(r"[^a-z0-9]", "", task.lower()) or "task"
        stages.append(Stage(task, prefix, Verbalizer.parse(table[task.lower()])))
    prefixes = [s.prefix for s in stages]
    if len(set(prefixes)) != len(prefixes):
        raise ValueError(f"continual stages must be distinct tasks, got {list(tasks)}")
    union_verbalizer(stages)  # two stages with one label word fail here, before any data is read
    return stages


def parse_stage_words(spec: str | None) -> dict[str, str]:
    """`SST-2:0=bad,SST-2:1=good,mpqa:0=no,...` -> {task: "0=bad,1=good", ...}."""
    if not spec:
        return {}
    grouped: dict[str, list[str]] = {}
    for item in spec.split(","):
        task, sep, pair = item.rpartition(":")
        if not sep or "=" not in pair:
            raise PromptError(f"label words {item!r} must look like task:label=word (e.g. SST-2:0=bad)")
        grouped.setdefault(task.strip(), []).append(pair.strip())
    return {task: ",".join(pairs) for task, pairs in grouped.items()}


def union_verbalizer(stages: Sequence[Stage]) -> Verbalizer:
    """Every label of `stages`, namespaced, with its word: the classifier's label space after them."""
    labels = tuple(s.label(raw) for s in stages for raw in s.words.labels)
    return Verbalizer(labels, tuple(word for s in stages for word in s.words.words))


def load_stage_data(
    data_dir: str | Path, stages: Sequence[Stage], seed: int, shots: int = 16, test_size: int = TEST_SIZE
) -> list[StageData]:
    """Every stage's splits with namespaced labels; an unknown raw label is an error naming its line."""
    known = union_verbalizer(stages)
    loaded = []
    for stage in stages:
        splits = load_kshot(data_dir, stage.task, seed, shots)
        assert splits.test is not None  # load_kshot reads the test split unless told not to
        renamed = [
            [dataclasses.replace(e, label=stage.label(e.label)) for e in split]
            for split in (splits.train, splits.dev, fixed_sample(splits.test, test_size))
        ]
        for split in renamed:
            for example in split:
                if example.label not in known.labels:
                    raise PromptError(
                        f"{example.source}: label {example.label.split(':', 1)[1]!r} has no word in "
                        f"stage {stage.task} (words: {stage.words})"
                    )
        loaded.append(StageData(*renamed))
    return loaded


def average_accuracy(matrix: Sequence[Sequence[float]]) -> float:
    """Mean accuracy over all stages after the last one."""
    return float(np.mean(matrix[-1]))


def forgetting(matrix: Sequence[Sequence[float]]) -> float | None:
    """Mean over stages j < T-1 of max_{j <= t < T-1} a[t][j] - a[T-1][j]; None with one stage."""
    last = len(matrix) - 1
    if last == 0:
        return None
    drops = [max(matrix[t][j] for t in range(j, last)) - matrix[last][j] for j in range(last)]
    return float(np.mean(drops))


def run_continual(
    backbone: Backbone,
    data_dir: str | Path,
    stages: Sequence[Stage],
    specs: Sequence[str],
    seeds: Sequence[int],
    config: TrainConfig,
    *,
    template: Template | None = None,
    shots: int = 16,
    test_size: int = TEST_SIZE,
    batch_size: int = 32,
    done: frozenset[tuple[str, int]] | set[tuple[str, int]] = frozenset(),  # (method, seed) to skip
    on_record: Callable[[ContinualRecord], None] = lambda record: None,
    progress: bool = True,
) -> list[ContinualRecord]:
    """Each method x seed learns the stages in order from the backbone's initial weights."""
    template = template or Template(DEFAULT_TEMPLATE)
    if backbone.kind == "causal":
        template.require_slot_at_end()
    methods = {spec: build_method(spec) for spec in specs}
    for method in methods.values():
        method.check_backbone(backbone)
    data = {seed: load_stage_data(data_dir, stages, seed, shots, test_size) for seed in seeds}
    initial = {name: t.detach().clone() for name, t in backbone.model.state_dict().items()}
    records = []
    try:
        for seed in seeds:
            for spec in specs:
                if (spec, seed) in done:
                    continue
                backbone.model.load_state_dict(initial)
                classifier = Classifier(
                    backbone, template, union_verbalizer(stages[:1]), batch_size=batch_size
                )
                started = time.perf_counter()
                matrix, params = _run_sequence(
                    classifier, stages, data[seed], methods[spec], spec, seed, config, progress
                )
                record = ContinualRecord(
                    method=spec,
                    seed=seed,
                    stages=[s.task for s in stages],
                    test_size=test_size,
                    accuracy=matrix,
                    average_accuracy=average_accuracy(matrix),
                    forgetting=forgetting(matrix),
                    params=params,
                    seconds=round(time.perf_counter() - started, 1),
                )
                records.append(record)
                on_record(record)
    finally:
        backbone.model.load_state_dict(initial)
    return records


def _run_sequence(
    base: Classifier,  # backbone, template and batch size; its labels are replaced stage by stage
    stages: Sequence[Stage],
    data: list[StageData],
    method: Method,
    spec: str,
    seed: int,
    config: TrainConfig,
    progress: bool,
) -> tuple[list[list[float]], list[dict]]:
    """The accuracy matrix (stage trained x stage tested) and per-stage details of one method x seed."""
    matrix: list[list[float]] = []
    params: list[dict] = []
    tensors = None
    for t, stage in enumerate(stages):
        verbalizer = union_verbalizer(stages[: t + 1])
        classifier = method.prepare(
            dataclasses.replace(base, verbalizer=verbalizer, store=base.empty_store(), prompt=None)
        )
        if tensors is not None:
            method.load_trained(classifier, tensors)  # what earlier stages trained, now over more labels
        current = data[t]
        train_labels = example_labels(classifier, current.train)
        dev_labels = example_labels(classifier, current.dev)
        result = train(
            classifier,
            method,
            [e.text for e in current.train],
            train_labels,
            [e.text for e in current.dev],
            dev_labels,
            dataclasses.replace(config, seed=seed),
            progress=progress,
        )
        tensors = method.trained_tensors(classifier)
        if method.inference == "knn-interp" or classifier.demos is not None:
            earlier = [e for stage_data in data[:t] for e in stage_data.train]
            if earlier:  # the open book keeps every earlier stage's examples, keyed by the new weights
                vectors = classifier.embed_vectors([e.text for e in earlier])
                classifier.add_embeddings(
                    vectors, [e.label for e in earlier], texts=[e.text for e in earlier]
                )
        seen = data[: t + 1]
        tests = [e for stage_data in seen for e in stage_data.test]
        test_labels = example_labels(classifier, tests)
        dev = classifier.embed([e.text for e in current.dev])
        test = classifier.embed(
            [e.text for e in tests], progress=f"{stage.task} tests" if progress else False
        )
        inputs = method_inputs(classifier.store, classifier.label_bias, dev, dev_labels, test, test_labels)
        p_test, chosen, _ = INFERENCE_METHODS[method.inference](inputs)
        assert p_test is not None  # the tests were embedded above
        predicted = p_test.argmax(-1)
        bounds = np.cumsum([0, *(len(s.test) for s in seen)])
        matrix.append([accuracy(predicted[a:b], test_labels[a:b]) for a, b in itertools.pairwise(bounds)])
        params.append(
            {
                **chosen,
                "stage": stage.task,
                "best_step": result.best.step,
                "steps_run": result.steps_run,
                "train_seconds": round(result.seconds, 1),
                "store_size": len(classifier.store),
            }
        )
        if progress:
            row = ", ".join(f"{s.task} {100 * a:.1f}" for s, a in zip(stages, matrix[-1], strict=False))
            tqdm.write(f"{spec} seed {seed} after {stage.task}: {row}")
    return matrix, params


def continual_table(records: Sequence[ContinualRecord]) -> str:
    """Markdown: per method, mean (std) over seeds of average accuracy and forgetting, and final rows."""
    if not records:
        return "(no runs yet)\n"
    stages = records[0].stages
    lines = [
        "| method | average accuracy | forgetting | " + " | ".join(f"final {s}" for s in stages) + " | seeds "
        "| seconds / run |",
        "|---" * (len(stages) + 5) + "|",
    ]
    groups: dict[str, list[ContinualRecord]] = {}
    for record in records:
        groups.setdefault(record.method, []).append(record)
    for method, group in groups.items():
        average = 100 * np.array([r.average_accuracy for r in group])
        drops = [r.forgetting for r in group if r.forgetting is not None]
        forgot = f"{100 * np.mean(drops):.1f} ({100 * np.std(drops):.1f})" if drops else "–"
        finals = 100 * np.array([r.accuracy[-1] for r in group])  # (seeds, stages)
        cells = " | ".join(f"{m:.1f}" for m in finals.mean(0))
        seconds = np.mean([r.seconds for r in group])
        lines.append(
            f"| {method} | {average.mean():.1f} ({average.std():.1f}) | {forgot} | {cells} | {len(group)} "
            f"| {seconds:.0f} |"
        )
    return "\n".join(lines) + "\n"


def write_continual_results(
    records: Sequence[ContinualRecord], out_dir: str | Path, header: str = ""
) -> None:
    """continual.json (one record per method x seed, with the accuracy matrix) and continual.md."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "continual.json", json.dumps([dataclasses.asdict(r) for r in records], indent=2) + "\n")
    write_text(out / "continual.md", header + continual_table(records))


def add_continual_record(record: ContinualRecord, out_dir: str | Path, header: str = "") -> None:
    """Append `record` to what is on disk now and rewrite; call it holding `reports.locked(out_dir)`.

    Processes running other methods or seeds into the same directory may have written since this
    one started, so the file is read again here; a method x seed already there is kept.
    """
    records = read_continual_results(out_dir)
    if all((r.method, r.seed) != (record.method, record.seed) for r in records):
        records.append(record)
    write_continual_results(records, out_dir, header)


def read_continual_results(out_dir: str | Path) -> list[ContinualRecord]:
    """The records of an earlier run in `out_dir` (none if it has no continual.json)."""
    path = Path(out_dir) / "continual.json"
    if not path.exists():
        return []
    try:
        return [ContinualRecord(**row) for row in json.loads(path.read_text())]
    except (json.JSONDecodeError, TypeError) as error:
        raise ValueError(f"{path} is not a file written by python -m research continual: {error}") from None
