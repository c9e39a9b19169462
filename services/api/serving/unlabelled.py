"""Active learning: a task's pool of unlabelled texts, and the ones the served model is least sure of.

Suggestions are ranked by uncertainty sampling on the final distribution: the smallest margin between
the two most probable labels first; on a tie, the larger disagreement between the prompt (P_LM) and the
store (P_kNN) first. Recording an example under a pool id takes that text out of the pool (examples.py).
The HTTP resource is `/v1/tasks/{task}/pool` (routes/pool.py); the pool itself is in Redis
(services/bus/pool.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from openbook.predictions import Prediction
from openbook.prompting import TextInput

from services.api import schemas
from services.api.serving.predictions import prediction_out
from services.bus.pool import TextPool
from services.engine.runtime import TaskRuntime
from services.engine.threads import ReadWriteThreads

# The pool texts scored per suggestions request: the first ones by id. Scoring is a forward per text, so
# the cap bounds the request's time (about a classify of this many texts); a larger pool is served in
# id order as its first texts are labelled and leave it.
SCORED_POOL_MAX = 2000


def unlabelled_pool(runtime: TaskRuntime) -> TextPool:
    """The task's pool of unlabelled texts, in the Redis its example log is in."""
    return TextPool(runtime.log.client, runtime.task.name)


async def suggest(
    runtime: TaskRuntime, threads: ReadWriteThreads, batch: int, n: int
) -> schemas.SuggestionsOut:
    """The `n` pool texts the served version is least sure of, least sure first; the first
    SCORED_POOL_MAX by id are scored, `batch` texts per forward."""
    pool = await threads.read(unlabelled_pool(runtime).first, SCORED_POOL_MAX)
    predictions, model_version, store_version = await threads.read(
        score, runtime, [t.text for t in pool], batch
    )
    ranked = rank_by_uncertainty(predictions)[:n]
    return schemas.SuggestionsOut(
        suggestions=[
            schemas.Suggestion(
                id=pool[i].id,
                text=pool[i].text,
                margin=margin(predictions[i].probabilities),
                disagreement=disagreement(predictions[i]),
                prediction=prediction_out(predictions[i], runtime, False, runtime.task.min_confidence),
            )
            for i in ranked
        ],
        scored=len(pool),
        model_version=model_version,
        store_version=store_version,
    )


def margin(probabilities: dict[str, float]) -> float:
    """The top label's probability less the runner-up's."""
    first, second = sorted(probabilities.values(), reverse=True)[:2]
    return first - second


def disagreement(prediction: Prediction) -> float:
    """Total variation distance between P_LM and P_kNN; 0 when the store offered nothing."""
    if prediction.p_knn is None:
        return 0.0
    p_knn = prediction.p_knn
    return 0.5 * sum(abs(p - p_knn.get(label, 0.0)) for label, p in prediction.p_lm.items())


def rank_by_uncertainty(predictions: Sequence[Prediction]) -> list[int]:
    """Indices of `predictions`, least sure first: smallest margin, then largest disagreement."""
    keys = [(margin(p.probabilities), -disagreement(p)) for p in predictions]
    return sorted(range(len(predictions)), key=keys.__getitem__)


def score(runtime: TaskRuntime, texts: Sequence[TextInput], batch: int) -> tuple[list[Prediction], str, str]:
    """Predict for every text, `batch` at a time (blocking: call from a worker thread).

    Each batch takes the runtime's lock on its own, so classify requests are served between them; the
    versions returned are those of the last batch.
    """
    if not texts:
        runtime.catch_up()
        return [], runtime.model_version, runtime.offset
    predictions: list[Prediction] = []
    for start in range(0, len(texts), batch):
        scored, model_version, store_version = runtime.predict(texts[start : start + batch])
        predictions += scored
    return predictions, model_version, store_version
