"""The wheels that travel to the GPU machine: shrink bitsandbytes, check the size, pick what to install.

    python bench/gpu/wheels.py shrink-bnb .wheels        # keep only the cpu and cuda130 libraries of bitsandbytes
    python bench/gpu/wheels.py check .wheels --limit-mib 60
    python bench/gpu/wheels.py pick .wheels              # on the GPU machine: the wheels it needs, one per line

`pick` installs the project's pinned packages (PINNED) where the machine has another version, and any carried
wheel that a chosen package needs and the machine lacks or has in a version the requirement refuses. Nothing else:
a carried wheel never shadows a package the machine already has in a working version.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata as md
import re
import shutil
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

# The versions this project is tested with (requirements.txt; liger-kernel: requirements-gpu.txt).
PINNED = ("transformers", "peft", "bitsandbytes", "deepspeed", "datasets", "trl", "liger-kernel")
KEEP_BNB = ("cpu", "cuda130")  # torch 2.11+cu130 on the GPU machine loads libbitsandbytes_cuda130; cpu for tests
LIMIT_MIB = 60  # 64 MiB travel with the working tree: leave room for the repository itself


def canonical(name: str) -> str:
    """PEP 503 name: lower case, runs of -_. as one dash."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name_version(path: Path) -> tuple[str, str]:
    """(canonical distribution name, version) from a wheel's file name."""
    parts = path.name.split("-")
    return canonical(parts[0]), parts[1]


def shrink_bnb(folder: Path) -> Path | None:
    """Rewrite the bitsandbytes wheel without the CUDA libraries the machine does not load (and their RECORD lines)."""
    wheels = sorted(folder.glob("bitsandbytes-*.whl"))
    if not wheels:
        return None
    path = wheels[-1]
    keep = {f"libbitsandbytes_{k}.so" for k in KEEP_BNB}

    def dropped(name: str) -> bool:
        leaf = name.rsplit("/", 1)[-1]
        return leaf.startswith("libbitsandbytes_") and leaf.endswith(".so") and leaf not in keep

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / path.name
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
            names = [n for n in src.namelist() if not dropped(n)]
            if len(names) == len(src.namelist()):
                return path  # already shrunk
            for name in names:
                data = src.read(name)
                if name.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines()
                    data = ("\n".join(line for line in lines if not dropped(line.split(",", 1)[0])) + "\n").encode()
                dst.writestr(src.getinfo(name), data)
        shutil.move(str(out), path)
    return path


def _record_ok(path: Path) -> bool:
    """Every file listed in the wheel's RECORD is in the wheel with its hash (pip checks this when installing)."""
    with zipfile.ZipFile(path) as z:
        record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        for line in z.read(record).decode().splitlines():
            name, digest, _ = (line.split(",") + ["", ""])[:3]
            if not digest:
                continue
            algo, _, want = digest.partition("=")
            got = base64.urlsafe_b64encode(hashlib.new(algo, z.read(name)).digest()).rstrip(b"=").decode()
            if got != want:
                return False
    return True


def check(folder: Path, limit_mib: float = LIMIT_MIB) -> tuple[float, list[str]]:
    """(total MiB, problems): over the limit, a bitsandbytes wheel with other CUDA libraries, a broken RECORD."""
    wheels = sorted(folder.glob("*.whl"))
    total = sum(p.stat().st_size for p in wheels) / 2**20
    problems = []
    if total > limit_mib:
        problems.append(f"{total:.1f} MiB of wheels is over {limit_mib} MiB")
    for p in wheels:
        if p.name.startswith("bitsandbytes-"):
            with zipfile.ZipFile(p) as z:
                libs = sorted(n.rsplit("/", 1)[-1] for n in z.namelist() if "libbitsandbytes_" in n)
            extra = [n for n in libs if n not in {f"libbitsandbytes_{k}.so" for k in KEEP_BNB}]
            if extra:
                problems.append(f"{p.name} still has {', '.join(extra)}")
        if not _record_ok(p):
            problems.append(f"{p.name}: RECORD does not match its files")
    return total, problems


def _requires(path: Path) -> list[str]:
    """Requires-Dist lines of a wheel (without extras)."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(z.read(meta).decode())
    return [r for r in message.get_all("Requires-Dist") or [] if "extra ==" not in r]


def installed_version(name: str) -> str | None:
    """The version this Python would import, or None."""
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def pick(folder: Path, out=sys.stderr) -> list[Path]:
    """The carried wheels this machine needs (see the module docstring); unmet requirements are printed to `out`."""
    from packaging.requirements import Requirement

    wheels = {wheel_name_version(p)[0]: p for p in sorted(folder.glob("*.whl"))}
    chosen: dict[str, Path] = {}
    for name in PINNED:
        if name in wheels and installed_version(name) != wheel_name_version(wheels[name])[1]:
            chosen[name] = wheels[name]
    todo = list(chosen)
    while todo:
        for line in _requires(chosen[todo.pop()]):
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate():
                continue
            dep = canonical(req.name)
            have = wheel_name_version(chosen[dep])[1] if dep in chosen else installed_version(req.name)
            if have is not None and req.specifier.contains(have, prereleases=True):
                continue
            carried = wheels.get(dep)
            if carried is not None and req.specifier.contains(wheel_name_version(carried)[1], prereleases=True):
                chosen[dep] = carried
                todo.append(dep)
            else:
                print(f"wheels: unmet on this machine: {line} (have {have or 'none'})", file=out)
    return sorted(chosen.values())


def main(argv: list[str] | None = None) -> int:
    """shrink-bnb | check | pick."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("shrink-bnb", "check", "pick"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    args = parser.parse_args(argv)
    if args.command == "shrink-bnb":
        path = shrink_bnb(args.folder)
        print(f"{path.name}: {path.stat().st_size / 2**20:.1f} MiB" if path else "no bitsandbytes wheel")
        return 0
    if args.command == "check":
        total, problems = check(args.folder, args.limit_mib)
        for p in problems:
            print(f"problem: {p}")
        print(f"wheels: {total:.1f} MiB in {args.folder} (limit {args.limit_mib:g} MiB)")
        return 1 if problems else 0
    for path in pick(args.folder):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
