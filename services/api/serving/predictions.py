"""A prediction as the api answers it: abstention, neighbours' texts, demonstrations per label."""

from __future__ import annotations

from openbook.demonstrations import Demonstrations
from openbook.predictions import Prediction
from openbook.quality import abstains

from services.api import schemas
from services.engine.runtime import TaskRuntime


def prediction_out(
    prediction: Prediction, runtime: TaskRuntime, with_neighbours: bool, min_confidence: float | None
) -> schemas.PredictionOut:
    refused = prediction.out_of_scope and runtime.task.refuse_out_of_scope
    abstained = refused or abstains(prediction.probabilities[prediction.label], min_confidence)
    neighbours = None
    if with_neighbours:
        neighbours = [
            schemas.NeighbourOut.model_construct(
                id=n.id, text=runtime.texts.get(n.id), label=n.label, similarity=n.similarity
            )
            for n in prediction.neighbours
        ]
    # the classifier's own values, not validated again (routes/classify.py)
    return schemas.PredictionOut.model_construct(
        label=None if abstained else prediction.label,
        abstained=abstained,
        out_of_scope=prediction.out_of_scope,
        probabilities=prediction.probabilities,
        p_lm=prediction.p_lm,
        p_knn=prediction.p_knn,
        neighbours=neighbours,
        truncated=prediction.truncated,
    )


def demonstration_classes(demos: Demonstrations, runtime: TaskRuntime) -> list[schemas.ClassDemonstration]:
    """Per label, the neighbours its demonstration vector mixes, with their weights."""
    classes = []
    for c, label in enumerate(runtime.classifier.labels):
        present = demos.ids[0, c] >= 0
        classes.append(
            schemas.ClassDemonstration(
                label=label,
                neighbours=[
                    schemas.DemoNeighbour(
                        id=int(i), text=runtime.texts.get(int(i)), similarity=float(s), weight=float(w)
                    )
                    for i, s, w in zip(
                        demos.ids[0, c][present],
                        demos.similarities[0, c][present],
                        demos.weights[0, c][present],
                        strict=True,
                    )
                ],
            )
        )
    return classes
