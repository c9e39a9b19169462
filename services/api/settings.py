"""Service settings from the environment (prefix `OPENBOOK_`), built in `create_app`, never at import."""

from __future__ import annotations

from pathlib import Path

from openbook.models import DEFAULT_BACKBONE
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OPENBOOK_")

    redis_url: str = Field("redis://127.0.0.1:6379/0", description="the bus (REDIS_URL is read too)")
    data_dir: Path = Path("openbook-data")
    default_backbone: str = DEFAULT_BACKBONE
    max_length: int = 128  # tokens per prompt; longer inputs are cut and flagged
    max_batch: int = 64  # texts per classify request, examples per POST
    max_text_chars: int = 5000
    max_body_bytes: int = 1_000_000
    api_key: str | None = None  # when set, write endpoints require it
    device: str = "cpu"
