"""`openbook bench job`: what an automatic training job costs, through the service end to end.

The stack runs in this process (`bench_stack.service_stack`, as the lab's learning curve runs it): the
embedded Redis, the api on a local port (real HTTP) and the trainer worker in a thread. A task gets the
preset prompt of `--task` and automatic training every N examples, N being the size of one seed's k-shot
training split (`--shots` per class: 10 for clinc150's 1,500 examples); the split is POSTed in requests
of `--per-request`, so the job queues itself on the last. Reported: the seconds from the first POST to
the job's end and to the first classify answered by the version it published, what it trained on, and the
gate's dev scores (the service's own held-out examples, shown to say the job trained). A job still
running at `--timeout` is reported, and recorded with `--out`, as not done, with its state, stage and
progress then.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path


def add_parser(benches: argparse._SubParsersAction) -> None:
    from openbook.backbone import BackboneConfig
    from openbook.cli.common import add_device_argument, add_label_scoring_argument
    from openbook.config_fields import add_field_arguments
    from openbook.encoders import default_reader
    from openbook.methods import DEFAULT_METHOD
    from openbook.models import DEFAULT_BACKBONE

    parser = benches.add_parser(
        "job", help="what an automatic training job costs, end to end", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--task", default="trec", help="a preset task of the k-shot data (default: trec)")
    parser.add_argument("--seed", type=int, default=13, help="whose k-shot training split is labelled")
    parser.add_argument("--shots", type=int, default=16, help="examples per class of that split")
    parser.add_argument("--data", help="the k-shot/ directory (default: $OPENBOOK_DATA/k-shot)")
    parser.add_argument("--backbone", default=DEFAULT_BACKBONE)
    parser.add_argument("--method", default=DEFAULT_METHOD, help="the task's method (default: %(default)s)")
    add_label_scoring_argument(parser)  # the task's, as POST /v1/tasks takes it
    parser.add_argument(
        "--reader",
        default=default_reader(),
        help="the task's sentence reader (default: $OPENBOOK_DEFAULT_READER, else mpnet, as a task that"
        " names none gets; none: no reader)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=600.0,
        help="the seconds a job may take, which the job's time is read against (default: 600, a 16-shot job)",
    )
    parser.add_argument("--per-request", type=int, default=32, help="examples per POST")
    parser.add_argument(
        "--training",
        type=json.loads,
        default={},
        help='more training settings for the task, as JSON, e.g. \'{"epochs": 8, "min_steps": 32}\'',
    )
    add_field_arguments(parser, BackboneConfig, ("max_length",))
    add_device_argument(parser)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds the job may take")
    parser.add_argument("--out", help="a directory to add this run's record to (job.json: one per run)")


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from openbook.data import DataError, data_root, load_kshot
    from openbook.prompting import get_preset

    from services.bench_client import TERMINAL, job_summary
    from services.bench_stack import service_stack

    try:
        data = Path(args.data) if args.data else data_root() / "k-shot"
        train = load_kshot(data, args.task, args.seed, args.shots, test=False).train
    except (DataError, FileNotFoundError) as error:
        print(f"openbook bench job: {error}", file=sys.stderr)
        return 2
    with (
        tempfile.TemporaryDirectory(prefix="openbook-job-") as tmp,
        service_stack(
            Path(tmp), backbone=args.backbone, max_length=args.max_length, device=args.device
        ) as client,
    ):
        client.max_batch = args.per_request
        template, verbalizer = get_preset(args.task).prompt(_kind(args.backbone), data / args.task)
        name = "job-cost"
        client.create_task(
            {
                "name": name,
                "template": template.source,
                "labels": dict(zip(verbalizer.labels, verbalizer.words, strict=True)),
                "method": args.method,
                "label_scoring": args.label_scoring,
                "reader": args.reader,
                "training": {**args.training, "auto": True, "every": len(train)},
            }
        )
        first_post = time.perf_counter()
        client.add_examples(name, [(i, example.text, example.label) for i, example in enumerate(train)])
        size = {"examples": len(train), "labels": len(verbalizer.labels)}
        job, done, served = None, None, None
        while served is None:
            jobs = client.jobs(name)
            waited = time.perf_counter() - first_post
            if waited > args.timeout:  # checked once the POSTs are answered: they may take longer
                then = (
                    {key: jobs[0].get(key) for key in ("state", "stage", "progress")}
                    if jobs
                    else {"state": "not queued"}
                )
                print(
                    f"openbook bench job: no job ended within {args.timeout:.0f} s; then: {then}",
                    file=sys.stderr,
                )
                _record(args, argv, size | {"not_done_at_s": round(waited, 1), "then": then})
                return 1
            if done is None and jobs and jobs[0]["state"] in TERMINAL:
                job, done = jobs[0], time.perf_counter() - first_post
                if job["state"] != "succeeded":
                    print(
                        f"openbook bench job: the job ended {job['state']}: {job.get('error')}",
                        file=sys.stderr,
                    )
                    return 1
            if done is not None and client.classify(name, [train[0].text]).model_versions[0] != "base":
                served = time.perf_counter() - first_post
            time.sleep(0.5)
        assert job is not None and done is not None
        summary = job_summary(job)
        version = next(v for v in client.versions(name) if v["version"] == summary["version"])
    print(
        f"{args.task} seed {args.seed}: {len(train)} examples, {len(verbalizer.labels)} labels, "
        f"method {args.method}, label scoring {args.label_scoring}, reader {args.reader}, backbone "
        f"{args.backbone}, device {args.device}, training {args.training}"
    )
    print(f"job done {done:.0f} s after the first POST; its version served after {served:.0f} s")
    print(f"budget: the job took {done / args.budget:.2f}x the {args.budget:.0f} s a job may take")
    examples, dev = version["examples"], version["dev_metrics"]
    print(
        f"trained on {examples['train']} examples, {examples['dev']} held out as dev: {dev['steps_run']} of "
        f"{dev['step_budget']} steps run, the best dev score at step {dev['best_step']}"
    )
    if "reader_tuned_on" in dev:
        print(f"the served reader tuned again on all {dev['reader_tuned_on']} stored examples")
    print(f"gate: {summary['verdict']}, dev scores {summary['gate']}")
    _record(
        args,
        argv,
        size
        | {
            "job_done_s": round(done, 1),
            "served_s": round(served, 1),
            "trained_on": examples,
            "dev_metrics": {key: dev[key] for key in RECORDED_DEV_METRICS if key in dev},
            "gate": summary["verdict"],
        },
    )
    return 0


# What a run's record keeps of its version's dev metrics (reader_tuned_on: only where a reader is)
RECORDED_DEV_METRICS = ("steps_run", "step_budget", "best_step", "reader_tuned_on")


def _record(args: argparse.Namespace, argv: Sequence[str], outcome: dict) -> None:
    """This run's record, added to OUT/job.json (one per run), where `--out` is given. The method is kept
    with every option it ran with (`method_config`), so the record still says what ran once a default
    changes."""
    if args.out is None:
        return
    from openbook.atomic import add_json_record
    from openbook.methods import method_config

    options = ("task", "seed", "shots", "backbone", "method", "label_scoring", "reader", "device", "training")
    record = {
        "command": shlex.join(["openbook", *argv]),  # as a shell takes it back
        **{key: getattr(args, key) for key in options},
        "method_config": method_config(args.method),
    }
    add_json_record(Path(args.out) / "job.json", record | outcome)


def _kind(backbone: str) -> str:
    """masked or causal, from the model's config and tokenizer alone (the service loads the weights)."""
    from openbook.backbone import detect_kind
    from openbook.models import resolve_backbone
    from transformers import AutoConfig, AutoTokenizer

    path = resolve_backbone(backbone)
    return detect_kind(AutoConfig.from_pretrained(path), AutoTokenizer.from_pretrained(path))
