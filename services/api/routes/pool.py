"""Active learning: a pool of unlabelled texts, and the ones the served model is least sure of.

Suggestions are ranked by uncertainty sampling on the final distribution: the smallest margin between
the two most probable labels first; on a tie, the larger disagreement between the prompt (P_LM) and the
store (P_kNN) first. Posting an example under a pool id takes that text out of the pool (examples.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from openbook.classifier import Prediction
from openbook.prompting import TextInput

from services.api import schemas
from services.api.checks import check_batch, check_text
from services.api.deps import Reader, Runtime, SettingsDep, Threads, Writer
from services.api.errors import declare
from services.api.routes.classify import _prediction
from services.api.runtime import TaskRuntime
from services.bus.pool import PoolConflict, PoolText, TextPool

router = APIRouter(prefix="/v1/tasks/{task}")

# The pool texts scored per suggestions request: the first ones by id. Scoring is a forward per text, so
# the cap bounds the request's time (about a classify of this many texts); a larger pool is served in
# id order as its first texts are labelled and leave it.
SCORED_POOL_MAX = 2000


def pool_of(runtime: TaskRuntime) -> TextPool:
    return TextPool(runtime.log.client, runtime.task.name)


@router.post(
    "/pool", status_code=201, dependencies=[Writer], responses=declare(400, 401, 403, 404, 409, 413, 503)
)
async def add_to_pool(
    body: schemas.PoolIn, runtime: Runtime, settings: SettingsDep, threads: Threads
) -> schemas.PoolAck:
    check_batch(len(body.texts), ("body", "texts"), settings)
    for i, text in enumerate(body.texts):
        check_text(text.text, ("body", "texts", i, "text"), runtime, settings)
    try:
        created = await threads.write(pool_of(runtime).add, [PoolText(t.id, t.text) for t in body.texts])
    except PoolConflict as error:
        raise HTTPException(409, str(error)) from None
    return schemas.PoolAck(
        texts=[schemas.PoolTextAck(id=t.id, created=c) for t, c in zip(body.texts, created, strict=True)]
    )


@router.get("/pool", dependencies=[Reader], responses=declare(401, 403, 404, 409, 503))
async def list_pool(
    runtime: Runtime,
    threads: Threads,
    after: Annotated[int, Query(ge=-1)] = -1,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> schemas.PoolPage:
    texts, next_after = await threads.read(pool_of(runtime).page, after, limit)
    return schemas.PoolPage(
        texts=[schemas.PoolTextOut(id=t.id, text=t.text) for t in texts], next_after=next_after
    )


@router.get("/suggestions", dependencies=[Reader], responses=declare(401, 403, 404, 409, 503))
async def suggestions(
    runtime: Runtime,
    settings: SettingsDep,
    threads: Threads,
    n: Annotated[int, Query(ge=1, le=100, description="how many suggestions")] = 10,
) -> schemas.SuggestionsOut:
    """The `n` pool texts the served version is least sure of, least sure first.

    Only the first SCORED_POOL_MAX (2000) pool texts by id are scored, in batches of the app's
    `batch_max_texts` through the task runtime; `scored` says how many were.
    """
    pool = await threads.read(pool_of(runtime).first, SCORED_POOL_MAX)
    predictions, model_version, store_version = await threads.read(
        _score, runtime, [t.text for t in pool], settings.batch_max_texts
    )
    ranked = rank_by_uncertainty(predictions)[:n]
    return schemas.SuggestionsOut(
        suggestions=[
            schemas.Suggestion(
                id=pool[i].id,
                text=pool[i].text,
                margin=margin(predictions[i].probabilities),
                disagreement=disagreement(predictions[i]),
                prediction=_prediction(predictions[i], runtime, False, runtime.task.min_confidence),
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


def _score(runtime: TaskRuntime, texts: Sequence[TextInput], batch: int) -> tuple[list[Prediction], str, str]:
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
