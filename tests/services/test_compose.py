"""docker-compose.yml and the Dockerfiles, checked as files; building the images needs a Docker engine."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from services.api.settings import Settings
from services.cli import SERVICE_COMMANDS

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_volumes_and_ports_fit_together() -> None:
    spec = compose()
    services = spec["services"]
    assert set(services) == {"redis", "api", "trainer"}
    redis_command = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_command and "--appendfsync always" in redis_command
    declared = set(spec["volumes"])
    for name, service in services.items():
        assert service.get("restart") == "unless-stopped", f"{name} is not restarted when it dies"
        for mount in service.get("volumes", []):
            assert mount.split(":")[0] in declared, f"{name} mounts an undeclared volume {mount}"
    api_env = services["api"]["environment"]
    assert services["api"]["ports"] == [f"{api_env['OPENBOOK_PORT']}:{api_env['OPENBOOK_PORT']}"]
    assert f":{api_env['OPENBOOK_PORT']}/readyz" in " ".join(services["api"]["healthcheck"]["test"])
    for role in ("api", "trainer"):
        environment = services[role]["environment"]
        assert environment["OPENBOOK_REDIS_URL"].startswith("redis://redis:6379")
        assert services[role]["depends_on"]["redis"]["condition"] == "service_healthy"
        artifacts = environment["OPENBOOK_ARTIFACTS_DIR"]
        assert f"artifacts:{artifacts}" in services[role]["volumes"]  # both see the same checkpoints
        for key in environment:
            field = key.removeprefix("OPENBOOK_").lower()
            assert field in Settings.model_fields or key == "OPENBOOK_MODEL_CACHE", f"{key} is not a setting"


def test_commands_and_dockerfiles_exist() -> None:
    for role, command in (("api", "serve"), ("trainer", "worker")):
        service = compose()["services"][role]
        assert service["command"] == ["openbook", command] and command in SERVICE_COMMANDS
        dockerfile = ROOT / service["build"]["dockerfile"]
        text = dockerfile.read_text()
        for source in re.findall(r"^COPY (.+) \S+$", text, flags=re.MULTILINE):
            for path in source.split():
                assert (ROOT / path).exists(), f"{dockerfile.name} copies {path}, which does not exist"
        assert "--no-deps -r requirements-backbones.txt" in text and "-r requirements.txt" in text
        assert f'CMD ["openbook", "{command}"]' in text
