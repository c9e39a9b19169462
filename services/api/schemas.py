"""Request and response bodies: the HTTP edge, converted to and from domain objects in the routes."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StringConstraints

TaskName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]
Text = Annotated[str, StringConstraints(min_length=1)]
TextOrPair = Text | tuple[Text, Text]


class KnnSettings(BaseModel):
    k: int = Field(16, ge=1, le=1024)
    temperature: float = Field(0.1, gt=0)
    lam: float = Field(0.5, ge=0, le=1)


class TaskCreate(BaseModel):
    name: TaskName
    template: str = Field(examples=["Review: {text}\nSentiment: {mask}"])
    labels: dict[str, str] = Field(
        description="label -> label word, in label order", examples=[{"0": "negative", "1": "positive"}]
    )
    backbone: str | None = Field(None, description="default: the service's backbone")
    method: str = "retroprompt"
    knn: KnnSettings = KnnSettings()


class Task(TaskCreate):
    backbone: str


class ExampleIn(BaseModel):
    text: TextOrPair
    label: str
    id: int | None = Field(None, ge=0, le=2**63 - 1, description="client-chosen; makes a retry idempotent")


class ExamplesIn(BaseModel):
    examples: list[ExampleIn] = Field(min_length=1)


class ExampleAck(BaseModel):
    id: int
    created: bool  # False: the log already held this example (a retry)


class ExamplesAck(BaseModel):
    examples: list[ExampleAck]
    store_version: str


class Example(BaseModel):
    id: int
    text: TextOrPair
    label: str


class ExamplePage(BaseModel):
    examples: list[Example]
    next_after: int | None  # pass as `after` for the next page; None at the end


class ClassifyIn(BaseModel):
    texts: list[TextOrPair] = Field(min_length=1)
    neighbours: bool = Field(False, description="include the neighbours used, with their texts")


class NeighbourOut(BaseModel):
    id: int
    text: TextOrPair | None
    label: str
    similarity: float


class PredictionOut(BaseModel):
    label: str
    probabilities: dict[str, float]
    p_lm: dict[str, float]
    p_knn: dict[str, float] | None
    neighbours: list[NeighbourOut] | None = None
    truncated: bool


class ClassifyOut(BaseModel):
    predictions: list[PredictionOut]
    model_version: str
    store_version: str
