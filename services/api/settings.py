"""Service settings from the environment (prefix `OPENBOOK_`), built in `create_app`, never at import.

Who may do what. Writes (create or delete a task, add or delete examples, start training) need the
write key `OPENBOOK_API_KEY` when it is set; reads (list tasks and examples, classify, demonstrations,
jobs) need the read key `OPENBOOK_READ_KEY` or the write key as soon as either is set, because a read
returns the stored texts. A key travels as `X-API-Key: <key>` or `Authorization: Bearer <key>`.
`/livez` and `/readyz` are always open: orchestrators probe them without credentials, and they tell
nothing about the data. `/metrics` is open too unless `OPENBOOK_METRICS_NEED_KEY` is set: scrapers seldom
carry keys, and it holds task names, counts and versions, not texts.

With no key set everything is open, which is safe only where nobody else can connect: hence the default
host 127.0.0.1, and a warning in the log when the api listens on any other address without a write key.
"""

from __future__ import annotations

from pathlib import Path

from openbook.backbone import BackboneConfig
from openbook.devices import resolve_device
from openbook.encoders import DEFAULT_READER
from openbook.models import DEFAULT_BACKBONE
from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.engine.config_models import mirrored


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OPENBOOK_", populate_by_name=True)

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("OPENBOOK_REDIS_URL", "REDIS_URL", "redis_url"),
        description="the bus",
    )
    data_dir: Path = Path("openbook-data")  # the embedded Redis and the artifacts live under it
    artifacts_dir: Path | None = None  # default: data_dir/artifacts (shared by api and trainer)
    host: str = "127.0.0.1"  # loopback: with no keys set, nobody else can reach the api
    port: int = 8000
    # api processes behind the port, each a full replica (its own model copy, batchers and log follower;
    # services/api/api_workers.py). 1 is one process, as `create_app` alone serves. On the CPU 1 is
    # right: one process's forwards already use every core. On CUDA (`tools/gpu_bench.sh api`,
    # docs/benchmarks.md) the bench's rule picked 1 on an H100 and 4 on an H200, on one worker's latency
    # within the bare forward's own spread; 4 workers served 813 texts/s at 256 clients against 551 for
    # one on the H200, but half of one's at 32 clients (processes time-slice the device), and each holds
    # a copy of every model. 1 there too, until the rule gives one answer over repeated runs.
    api_workers: int = Field(1, ge=1)
    # front processes on the port before the replica (services/api/front.py): each gathers single-text
    # classify requests into requests of up to max_batch texts, a wave of clients' requests into one;
    # the replica moves to a loopback port of its own. 0: none, the replica answers the port itself.
    front_workers: int = Field(0, ge=0)
    # the longest a front's gathered requests wait for the rest of their wave with nothing of their kind
    # on its way (a lone client never waits): meant to outlast the spread of a wave's resends and to stay
    # below a GPU forward (about 30 ms on the H200), as batch_max_delay_ms bounds the micro-batcher's wait
    front_max_wait_ms: float = Field(20.0, ge=0)
    default_backbone: str = DEFAULT_BACKBONE
    # The reader of a task created without one (`TaskCreate.reader`): a registered encoder or a folder the
    # operator names (it may lie outside model_dirs, as the default backbone may); "none": no reader.
    default_reader: str = DEFAULT_READER
    # Where a task may name its backbone by path: model directories (each with a config.json) under
    # these, besides the model cache. Other names must be registered backbones (openbook.models).
    model_dirs: list[Path] = []
    # The library's defaults (BackboneConfig), which the worker reads too: longer inputs are cut and flagged.
    max_length: int = mirrored(BackboneConfig, "max_length")
    max_batch: int = 64  # texts per classify request, examples per POST
    # A backbone forward serving concurrent requests (services/api/batching.py) takes at most
    # batch_max_texts texts and batch_max_tokens padded tokens (texts x its longest prompt); a request
    # over either on its own runs alone. Unset, both follow the device. CPU: 64 texts and no token
    # count, as before (the CPU figures in docs/ were measured so): a CPU forward's time grows with its
    # tokens whatever their shape, so a token bound would buy nothing and counting would cost. CUDA:
    # the forward is launch-bound below a few hundred prompts (H100 fp32, bare forward of 1 / 32 /
    # 256 / 1024 of the bench's 12-28-word prompts: 31 / 45 / 42 / 62 ms), so a count of texts is the
    # wrong bound and memory (tokens) the right one. 16384 tokens is some 256-512 such prompts, or 128
    # at max_length 128: inside the measured range, so a forward, and the wait behind it, stays near
    # batch_max_delay_ms. 1024 texts, the largest size measured, binds only below 16 tokens a prompt.
    batch_max_texts: int = Field(64, ge=1)
    batch_max_tokens: int | None = Field(None, ge=1)  # None: not counted
    batch_max_wait_ms: float = 2.0  # under load, a forward waits this long for one more request to join
    batch_max_delay_ms: float = 50.0  # ... and at most this long after its first request arrived
    # Requests for LoRA tasks on one backbone share a forward, each row through its task's adapters
    # (openbook/mixed.py); false: every task's requests run as forwards of their own.
    mixed_batches: bool = True
    # Compile each backbone's forward over padded shape buckets when it is loaded (openbook/compiled.py):
    # CUDA graphs on a GPU. Off: on one H100 the default backbone's buckets were not all compiled 170 s
    # after loading began, nor its 12 buckets up to 16 rows in 190 s (`bench compile`, docs/benchmarks.md),
    # so a replica would start and swap minutes late; what they buy is not measured yet.
    compile: bool = False
    max_text_chars: int = 5000  # characters per text (each text of a pair)
    max_body_bytes: int = 1_000_000  # larger bodies get a 413, chunked ones as soon as they pass it
    api_key: str | None = None  # the write key: writes need it; it grants reads too
    read_key: str | None = None  # reads need it (or the write key); see the module docstring
    metrics_need_key: bool = False  # True: /metrics needs the read key (or the write key) too
    # Worker threads for blocking calls, in two pools so that writes waiting on Redis's fsync or on a
    # store being replayed never hold the threads reads need.
    read_threads: int = Field(16, ge=1)
    write_threads: int = Field(8, ge=1)
    device: str = mirrored(BackboneConfig, "device")  # unset: auto, cuda when a GPU is visible
    threads: int | None = None  # torch and FAISS threads; default: the machine's cores
    # Model versions kept per task besides the serving and the pinned ones; older ones are deleted, their
    # checkpoint directories too (services/bus/versions.py), by the worker after each job and the api
    # after a promote.
    keep_versions: int = Field(3, ge=1)
    worker_name: str = "worker-1"  # the trainer's consumer name on the jobs stream: one per live worker
    # A task's first candidate must score at least as well as the untrained task it would replace
    # (services.trainer.worker), so that a task that trains by itself never serves worse than it began.
    untrained_gate: bool = True
    heartbeat_ttl_s: float = Field(10.0, gt=0)  # a worker counts as alive this long after its last beat
    # `openbook up` restarts a dead child after restart_backoff_s, doubled for each further death within
    # restart_window_s (at most 30 s), and gives up once one child died restart_limit times in that window.
    restart_limit: int = Field(5, ge=1)
    restart_window_s: float = Field(60.0, gt=0)
    restart_backoff_s: float = Field(0.5, ge=0)

    @field_validator("default_reader")
    @classmethod
    def _empty_reader_is_the_default(cls, value: str) -> str:
        return value or DEFAULT_READER  # compose passes an unset name as ""

    @field_validator("api_key", "read_key")
    @classmethod
    def _empty_key_is_none(cls, value: str | None) -> str | None:
        return value or None  # compose passes an unset key as ""

    @field_validator("device")
    @classmethod
    def _a_device_torch_names(cls, value: str) -> str:
        # ValueError for a name torch does not know; whether the device is here is checked at start
        resolve_device(value)
        return value

    @model_validator(mode="after")
    def _batch_bounds_for_the_device(self) -> Settings:
        if resolve_device(self.device).startswith("cuda"):
            for name, on_cuda in (("batch_max_texts", 1024), ("batch_max_tokens", 16384)):
                if name not in self.model_fields_set:
                    setattr(self, name, on_cuda)
        return self

    @property
    def artifacts(self) -> Path:
        return self.artifacts_dir or self.data_dir / "artifacts"
