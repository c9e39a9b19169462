"""Recording labelled examples, and what follows from it: created labels, the pool, the automatic job.

An example recorded under a pool id labels that pool text: once the example is on disk, the text leaves
the pool (unlabelled.py). A task that trains by itself may queue its next job then
(services.engine.autotrain).
"""

from __future__ import annotations

from services.api.serving.unlabelled import unlabelled_pool
from services.bus.examples_log import Appended, NewExample
from services.engine.autotrain import queue_if_due
from services.engine.labels import append_creating_labels
from services.engine.runtime import TaskRuntime
from services.engine.runtimes import Runtimes


def record_examples(
    runtime: TaskRuntime,
    runtimes: Runtimes,
    new: list[NewExample],
    pool_ids: list[int],
    create_labels: bool,
) -> tuple[list[Appended], str | None]:
    """Append (durably), then what follows from it, in one worker thread: the acknowledgement waits for
    each step, and one hop off the event loop costs less than four.

    Returns the log's answer per example and the automatic job queued, if one is due. Raises what the
    log and `append_creating_labels` raise (routes/examples.py answers each).
    """
    if create_labels:
        appended = append_creating_labels(runtimes, runtime.task.name, new)
        runtime = runtimes.runtime(runtime.task.name) or runtime  # grown to the labels created
    else:
        appended = runtime.log.append(new)
    # Only the ids the client chose: an id the log assigned says nothing about the pool. A retry removes
    # what a failed removal left behind.
    unlabelled_pool(runtime).remove(pool_ids)
    runtime.catch_up()  # the next classify here already sees them
    return appended, queue_if_due(runtime.log.client, runtime.task.name)  # a retry finds it done
