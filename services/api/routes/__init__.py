"""One router per resource; `create_app` includes them all."""

from services.api.routes import classify, examples, jobs, labels, operations, pool, report, tasks, versions

ROUTERS = (
    operations.router,
    tasks.router,
    labels.router,
    examples.router,
    classify.router,
    jobs.router,
    pool.router,
    versions.router,
    report.router,
)
