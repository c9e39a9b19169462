"""Request and response bodies: the HTTP edge, converted to and from domain objects in the routes."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, Literal

from openbook.label_names import readable_word
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    field_validator,
    model_validator,
)

from services.engine.task_spec import (
    SERVING,
    KnnSettings,
    MinConfidence,
    NewLabels,
    NonBlank,
    Task,
    TaskCreate,
    TrainingSettings,
    TrainOptions,
)

__all__ = ["KnnSettings", "Task", "TaskCreate", "TrainingSettings"]

# A text sent in (anything but whitespace alone, which leaves the prompt nothing to read); how long it
# may be and how many go in one request are the app's settings, written into the OpenAPI it serves.
Text = NonBlank
TextOrPair = Text | tuple[Text, Text]
_Stored = Annotated[str, StringConstraints(min_length=1)]
StoredText = _Stored | tuple[_Stored, _Stored]  # as the log holds it (texts stored before the rule above)


def _each_id_once(items: list[Any], kind: str) -> list[Any]:
    """`items` unchanged, or a ValueError naming the first client id given twice in the batch."""
    counts = Counter(item.id for item in items if item.id is not None)
    repeated = [item_id for item_id, count in counts.items() if count > 1]
    if repeated:
        raise ValueError(f"{kind} id {repeated[0]} appears twice in the batch")
    return items


class LabelIn(BaseModel):
    """One label to add (`label`, with or without its `word`), or several (`labels`), all or none."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [{"required": ["label"]}, {"required": ["labels"]}],
            "dependentRequired": {"word": ["label"]},
        }
    )
    label: NonBlank | None = None
    word: NonBlank | None = Field(
        None,
        description="the word the LM scores `label` by until the next training; left out: the label's "
        "name made readable (book_flight -> book flight)",
    )
    labels: NewLabels | None = None

    @model_validator(mode="after")
    def _one_form(self) -> LabelIn:
        if (self.label is None) == (self.labels is None):
            raise ValueError("give `label` (and optionally its `word`) or `labels`, not both")
        if self.word is not None and self.label is None:
            raise ValueError("`word` goes with `label`; in `labels`, give label -> word")
        return self

    def added(self) -> dict[str, str]:
        """The labels to add, label -> word; LabelNameError when `label`'s name has no word to make."""
        if self.label is not None:
            return {self.label: self.word if self.word is not None else readable_word(self.label)}
        assert self.labels is not None
        return self.labels


class ExampleIn(BaseModel):
    text: TextOrPair
    label: str
    # At most 2**53-1, the integers JSON carries exactly everywhere (RFC 8259, section 6): a JavaScript
    # client, or a tool that reads numbers as doubles, would turn a larger id into another one.
    id: int | None = Field(
        None, ge=0, le=2**53 - 1, description="client-chosen (0 to 2^53-1); makes a retry idempotent"
    )


class ExamplesIn(BaseModel):
    examples: list[ExampleIn] = Field(min_length=1, description="the ids given, if any, differ")
    create_labels: StrictBool = Field(
        False,
        description="add the labels the examples name that the task lacks, each scored by its name made "
        "readable (book_flight -> book flight), stored with the examples or not at all; false: an unknown "
        "label is a 422",
    )

    @field_validator("examples")
    @classmethod
    def _ids_once(cls, examples: list[ExampleIn]) -> list[ExampleIn]:
        # the log would refuse the batch; say so before anything is sent to it
        return _each_id_once(examples, "example")


class ExampleAck(BaseModel):
    id: int
    created: bool  # False: the log already held this example (a retry)


class ExamplesAck(BaseModel):
    examples: list[ExampleAck]
    store_version: str


class Example(BaseModel):
    id: int
    text: StoredText
    label: str


class RelabelIn(BaseModel):
    label: str


class Relabelled(BaseModel):
    example: Example  # as it is now
    store_version: str  # the store holds it under its new label from this log offset on


class ExamplePage(BaseModel):
    examples: list[Example]
    next_after: int | None  # pass as `after` for the next page; None at the end


class ClassifyIn(BaseModel):
    texts: list[TextOrPair] = Field(min_length=1)
    neighbours: bool = Field(False, description="include the neighbours used, with their texts")
    min_confidence: MinConfidence = Field(
        None,
        description="abstain (label null) below this probability of the best label; left out: the task's "
        "min_confidence; null: never",
    )


class NeighbourOut(BaseModel):
    id: int
    text: StoredText | None
    label: str
    similarity: float


class PredictionOut(BaseModel):
    label: str | None  # None when the prediction abstained
    abstained: bool = False  # below min_confidence, or out of scope where the task refuses it
    out_of_scope: bool = Field(
        False,
        description="its nearest stored example is less similar than the version's threshold, chosen on"
        " dev by its job (a task with a reader); the label is null where the task refuses out of scope",
    )
    probabilities: dict[str, float]
    p_lm: dict[str, float] = Field(description="the first reader: the cloze prompt's distribution")
    p_knn: dict[str, float] | None = Field(
        description="the second reader: the stored examples' neighbours, in the task's sentence encoder's"
        " space where it names a reader (ClassifyOut.reader), else in the prompt's slot vectors';"
        " null: none found"
    )
    neighbours: list[NeighbourOut] | None = None
    truncated: bool


class ClassifyOut(BaseModel):
    predictions: list[PredictionOut]
    min_confidence: float | None = None  # the threshold applied: the request's, else the task's
    reader: str | None = None  # the sentence encoder whose neighbours p_knn reads; None: the prompt's slots
    model_version: str
    store_version: str


class TrainIn(TrainOptions):
    """A manual job: the method and knobs (bounds and defaults shared with a task's `training`)."""

    force: StrictBool = Field(False, description="publish without the promotion gate")


class TrainingPatch(TrainingSettings):
    """The training settings to change; keys left out keep their stored values."""

    model_config = ConfigDict(extra="forbid")


class TaskPatch(BaseModel):
    """`PATCH /v1/tasks/{task}`: a task's training settings and how it serves (`SERVING`) can change."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})
    training: TrainingPatch | None = None
    min_confidence: MinConfidence = Field(None, description="null: never abstain; left out: unchanged")
    refuse_out_of_scope: StrictBool = Field(False, description="left out: unchanged")

    @model_validator(mode="after")
    def _something(self) -> TaskPatch:
        if not self.model_fields_set & {"training", *SERVING}:
            raise ValueError("nothing to change: give training, min_confidence or refuse_out_of_scope")
        return self


class JobOut(BaseModel):
    id: str
    task: str
    method: str
    state: str  # queued, running, succeeded, failed, cancelled (its task was deleted)
    progress: float  # of the training steps
    # what a running job is doing: preparing (the backbone, the store, calibration, the untrained dev
    # score), reader (a task's sentence reader tuned: its steps), training (its steps: progress),
    # finishing (the store under the kept weights), judging (the
    # promotion gate, publishing); once it has ended, the last stage it reached
    stage: str | None = None
    stage_since: float | None = None  # when `stage` began, in seconds since the epoch
    loss: float | None = None  # the training loss at the last step reported
    train_config: dict
    metrics: dict | None = None
    published: dict | None = None  # the checkpoint: version, path, manifest sha256, log offset
    force: bool = False  # the job skips the promotion gate
    # the promotion gate: metric, candidate, serving (dev accuracies), candidate_log_likelihood,
    # serving_log_likelihood (the tie-break), serving_version, dev, verdict (promoted, rejected, forced,
    # first); a rejected candidate is kept as a version and not published. A first candidate's serving
    # side is the untrained task (serving_version null)
    gate: dict | None = None
    error: str | None = None
    trigger: Literal["manual", "auto"] = "manual"  # auto: queued by the task's training settings
    created: float  # when it was queued, in seconds since the epoch


class VersionOut(BaseModel):
    version: str
    method: str
    state: str  # serving, rejected (by the promotion gate; never served), retired (served before)
    gate: dict | None  # the promotion gate's record, as in JobOut
    dev_metrics: dict  # what training measured on dev (accuracy, best_step, step_budget, steps_run, ...)
    examples: dict[str, int]  # train, dev
    size_bytes: int  # its checkpoint directory on disk
    created: float  # unix time
    pinned: bool  # kept by retention whatever its age
    job: str  # the job that trained it


class VersionsOut(BaseModel):
    serving: str | None  # the version the task's replicas serve; None: the untrained base model
    versions: list[VersionOut]  # newest first


class PinIn(BaseModel):
    pinned: StrictBool  # true or false: no 0, 1 or "yes" standing in


class DemonstrationsIn(BaseModel):
    text: TextOrPair


class DemoNeighbour(BaseModel):
    id: int
    text: StoredText | None
    similarity: float  # the plain cosine of the slot vectors, which the weights are a softmax of
    weight: float  # its share of the class's demonstration vector


class ClassDemonstration(BaseModel):
    label: str
    neighbours: list[DemoNeighbour]  # empty when the store has no example of the class


class DemonstrationsOut(BaseModel):
    demonstrations: list[ClassDemonstration]
    # whether the served model reads demonstrations in its prompt (its method shows them); false: these
    # are only what the store holds nearest the text per class
    read_by_model: bool
    model_version: str
    store_version: str


class ApiWorker(BaseModel):
    pid: int
    ready: bool


class Readiness(BaseModel):
    status: str  # ready, not ready
    reason: str | None = None  # why not ready
    tasks: int | None = None  # tasks loaded
    broken: dict[str, str] | None = None  # tasks stored but not served, with why
    workers: list[str] | None = None  # trainer workers with a live heartbeat
    warning: str | None = None  # e.g. no worker alive: jobs wait (the api still serves)
    api_workers: list[ApiWorker]  # the api's processes behind this port (OPENBOOK_API_WORKERS), by pid


class PoolTextIn(BaseModel):
    id: int = Field(ge=0, le=2**53 - 1, description="client-chosen; label the text later under the same id")
    text: TextOrPair


class PoolIn(BaseModel):
    texts: list[PoolTextIn] = Field(min_length=1, description="unlabelled texts; the ids differ")

    @field_validator("texts")
    @classmethod
    def _ids_once(cls, texts: list[PoolTextIn]) -> list[PoolTextIn]:
        return _each_id_once(texts, "pool")


class PoolTextAck(BaseModel):
    id: int
    created: bool  # False: the pool already held this text (a retry)


class PoolAck(BaseModel):
    texts: list[PoolTextAck]


class PoolTextOut(BaseModel):
    id: int
    text: StoredText


class PoolPage(BaseModel):
    texts: list[PoolTextOut]
    next_after: int | None  # pass as `after` for the next page; None at the end


class Suggestion(BaseModel):
    id: int  # the pool id: post the example under it, and the text leaves the pool
    text: StoredText
    margin: float  # between the two most probable labels of `prediction.probabilities`: small is unsure
    disagreement: float  # total variation between p_lm and p_knn (0 without p_knn): breaks ties
    prediction: PredictionOut


class SuggestionsOut(BaseModel):
    suggestions: list[Suggestion]  # least sure first
    scored: int  # pool texts scored (the first ones by id, up to the cap)
    model_version: str
    store_version: str


class LabelQuality(BaseModel):
    precision: float
    recall: float
    f1: float
    support: int  # gold examples of the label among those scored


class Confusion(BaseModel):
    labels: list[str]
    matrix: list[list[int]]  # rows: gold labels, columns: predicted, both in `labels` order


class ReliabilityBinOut(BaseModel):
    lower: float
    upper: float
    count: int
    confidence: float | None  # mean confidence of the predictions in the bin; None when it is empty
    accuracy: float | None


class CalibrationOut(BaseModel):
    temperature: float  # what the scored version serves with: P = softmax(log P / T)
    fitted_temperature: float  # what temperature scaling finds on these examples
    ece_before: float  # of the scores before any temperature
    ece_after: float  # with temperatures fitted on other folds of these examples (cross-validated)
    adopted: bool  # ece_after < ece_before, with at least 20 examples scored
    folds: int


class CoverageOut(BaseModel):
    threshold: float
    coverage: float  # share of the scored examples whose confidence is at least the threshold
    accuracy: float | None  # accuracy on those; None when none is kept


class SuspectOut(BaseModel):
    id: int
    text: StoredText | None  # None when the example has been deleted since it was scored
    label: str
    predicted: str
    confidence: float  # the probability of `predicted`


class ConfusedPairOut(BaseModel):
    label: str  # as labelled
    predicted: str
    count: int


class ReportPending(BaseModel):
    """`GET .../report?wait=false` while the report is computed: ask again (after Retry-After) for it."""

    task: str
    # starting (reading the task's log, or a version's checkpoint), leave-one-out (scoring the examples)
    stage: Literal["starting", "leave-one-out"]
    scored: int  # examples scored so far
    examples: int  # to score in all (0 while starting)
    progress: float  # scored / examples (0 while starting)
    elapsed_s: float  # since the computation began (a request that joins it sees its whole age)


class ReadersOut(BaseModel):
    """Each reader alone on the report's examples; the served prediction, both read, is the report's
    `accuracy`. `book_keyed_by`: the task's sentence reader, or "slot vectors" (the prompt's own)."""

    prompt: float | None  # accuracy of P_LM alone (None: not recorded)
    book: float | None  # accuracy of P_kNN alone (None: an empty store, or not recorded)
    lam: float | None  # the weight the served prediction gives the book
    book_keyed_by: str


class ReportOut(BaseModel):
    task: str
    model_version: str
    store_version: str  # the log offset the scored examples go up to
    # leave-one-out (an untrained task: each example scored with itself out of the store), dev (a
    # version's held-out dev split, scored when it was made), train (a version made before it had dev
    # examples: scored on what it was trained on, so optimistic)
    scored_by: Literal["leave-one-out", "dev", "train"]
    examples: int
    accuracy: float
    macro_f1: float  # over the labels with gold examples among those scored
    per_label: dict[str, LabelQuality]
    confusion: Confusion
    ece: float  # expected calibration error of the confidence as served, 10 equal-width bins
    reliability: list[ReliabilityBinOut]
    calibration: CalibrationOut | None  # None with fewer than 2 examples scored
    coverage: list[CoverageOut]  # thresholds 0, 0.05, ..., 1
    suspect_examples: list[SuspectOut]  # predicted as another label with confidence >= 0.5, most sure first
    confused_pairs: list[ConfusedPairOut]  # the confusion's 10 largest off-diagonal cells, largest first
    readers: ReadersOut | None  # None: a version that recorded no reader alone (trained without dev)
    min_confidence: float | None  # the task's
