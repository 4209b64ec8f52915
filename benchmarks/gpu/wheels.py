"""Carry what the GPU suite needs to an offline GPU machine: wheels fetched here, split, checked and installed there.

The GPU machine (Python 3.12, torch 2.11.0+cu130, transformers, accelerate, peft; no network; see
/work/shared/gpu/README.md) lacks TRL, vLLM, DeepSpeed, datasets, gymnasium, pettingzoo, pydantic and math-verify.
``prepare`` runs where the package registry is reachable: it downloads wheels for cp312 / manylinux x86_64 with
``pip download --no-deps`` (every dependency named, pinned where the image's torch requires it: vLLM 0.26.0 is the
newest that pins torch==2.11.0; each of vLLM's own requirements is carried, on the image, or in ``LEFT_OUT`` with the
reason) and the DeepSpeed source archive (it builds there); splits every file larger than ``--part-mb`` into parts
(as ``split -b``); and writes ``manifest.json`` with the sha256 of every whole file and part. ``batches`` stages the
files into transfer-sized folders, ``install`` (on the GPU machine) joins the parts back (as ``cat parts > wheel``),
checks every sum and installs with ``pip install --no-index --no-deps``. This project itself is not carried as a
wheel: run_suite.sh installs the checkout it runs from in editable mode, so that the suite and the training
processes it starts import the same code. Only the standard library is used, so ``install`` runs on a bare Python.

    python benchmarks/gpu/wheels.py prepare --dest .gpu-wheels --dry-run      # list what it would fetch
    python benchmarks/gpu/wheels.py prepare --dest .gpu-wheels                 # about 700 MB with vLLM
    python benchmarks/gpu/wheels.py batches --src .gpu-wheels --max-mb 60      # .gpu-wheels/batch-00, -01, ...
    # on the GPU machine, once every batch's files are in one folder:
    python3 benchmarks/gpu/wheels.py install --src /tmp/wheels --target /tmp/site
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

MANIFEST = "manifest.json"
PART = ".part"
PYTHON_VERSION = "3.12"
# pip matches manylinux_2_N exactly, so every N that packages use is named (llguidance needs 2_31: glibc >= 2.31).
PLATFORMS = (*(f"manylinux_2_{n}_x86_64" for n in (35, 34, 31, 28, 27, 24, 17)), "manylinux2014_x86_64")

# What the project needs beyond the image: its own dependencies (and theirs) that the image lacks.
PROJECT = [
    "trl==1.16.0",
    "datasets==5.2.0",
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "gymnasium==1.4.0",
    "farama-notifications==0.0.6",
    "pettingzoo==1.27.0",
    "pydantic==2.14.3",
    "pydantic-core==2.50.4",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "math-verify",
    "latex2sympy2_extended",
    "antlr4-python3-runtime==4.13.2",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "rank-bm25",
    "docstring-parser==0.18.0",
    "pytest-asyncio",
    "hjson==3.1.0",  # DeepSpeed's
]
# DeepSpeed ships a source archive: it builds at install and compiles its ops just in time with the machine's nvcc.
SOURCES = ["deepspeed==0.19.8"]
# vLLM 0.26.0 (torch==2.11.0, the image's) and the part of its closure that generation, `trl vllm-serve` and TRL's
# client import; kernels' and telemetry's extras are left out (add one if an import asks for it).
VLLM = [
    "vllm==0.26.0",
    "msgspec==0.22.0",
    "pyzmq==27.3.0",
    "cbor2==6.3.0",
    "blake3==1.0.11",
    "pybase64==1.5.1",
    "openai==3.54.0",
    # openai 3.x moved to httpx2 (seen on an H200 image, 2026-11-28: `import openai` failed without it, and with it
    # TRL's GRPOTrainer and vLLM's entry points); httpcore2 and truststore are httpx2's, and h11 >= 0.16, idna >= 3.18
    # and anyio >= 4.10 what they ask for (the image's versions were not read).
    "httpx2==2.16.2",
    "httpcore2==2.16.2",
    "truststore==0.10.5",
    "h11==0.16.0",
    "idna==3.20",
    "anyio==4.16.0",
    "jiter==0.19.0",
    "sniffio==1.3.1",
    "distro",
    "lark==1.2.2",
    "partial-json-parser==0.2.1.1.post7",
    "compressed-tensors==0.17.0",
    "mistral-common==1.13.1",
    "pycountry==26.2.16",
    "pydantic-extra-types==2.11.1",
    "depyf==0.20.0",
    "astor==0.8.1",
    "xgrammar==0.2.7",
    "llguidance==1.7.6",
    "outlines-core==0.2.14",
    "interegular==0.3.3",
    "lm-format-enforcer==0.11.3",
    "openai-harmony==0.0.8",
    "setproctitle==1.3.8",
    "cachetools==8.0.1",
    "ijson==3.6.0",
    "loguru==0.7.3",
    "fastapi==0.136.3",
    "starlette==1.10.0",
    "uvicorn==0.54.0",
    "sse-starlette==3.7.0",
    "python-multipart==0.0.34",
    "prometheus-fastapi-instrumentator==8.1.0",
    "httptools==0.9.0",
    "websockets==17.4",
    "watchfiles==1.3.0",
    "python-dotenv==1.2.4",
    "flashinfer-python==0.6.14",
    "apache-tvm-ffi==0.1.10",
    "torch-c-dlpack-ext==0.1.5",
    "nvidia-cudnn-frontend==1.28.0",
    "nvtx==0.2.15",
    "tzdata==2026.6",
    # `vllm serve` builds its app with SageMaker's routes: vllm/entrypoints/openai/api_server.py imports
    # model_hosting_container_standards at the top (which needs jmespath and supervisor); the Anthropic-style
    # /v1/messages route and the logging config name the next two.
    "model-hosting-container-standards==0.1.16",
    "jmespath==1.1.0",
    "supervisor==4.3.0",
    "anthropic==2.12.0",
    "python-json-logger==4.2.0",
]
GROUPS = {"project": PROJECT, "vllm": VLLM}

# vLLM 0.26.0's own requirements (its wheel's Requires-Dist, extras left out), each accounted for: carried above,
# already on the image (/work/shared/gpu/README.md), or left out for the reason given.
VLLM_REQUIRES = [
    "regex",
    "cachetools",
    "psutil",
    "sentencepiece",
    "numpy",
    "requests",
    "tqdm",
    "blake3",
    "py-cpuinfo",
    "transformers",
    "tokenizers",
    "safetensors",
    "protobuf",
    "fastapi",
    "starlette",
    "aiohttp",
    "openai",
    "pydantic",
    "prometheus-client",
    "pillow",
    "prometheus-fastapi-instrumentator",
    "tiktoken",
    "lm-format-enforcer",
    "llguidance",
    "outlines-core",
    "lark",
    "xgrammar",
    "typing-extensions",
    "filelock",
    "partial-json-parser",
    "jsonschema",
    "pyzmq",
    "msgspec",
    "mistral-common",
    "opencv-python-headless",
    "pyyaml",
    "six",
    "setuptools",
    "einops",
    "compressed-tensors",
    "depyf",
    "cloudpickle",
    "watchfiles",
    "python-json-logger",
    "ninja",
    "pybase64",
    "cbor2",
    "ijson",
    "setproctitle",
    "openai-harmony",
    "anthropic",
    "model-hosting-container-standards",
    "mcp",
    "opentelemetry-sdk",
    "opentelemetry-api",
    "opentelemetry-exporter-otlp",
    "opentelemetry-semantic-conventions-ai",
    "numba",
    "torch",
    "torchaudio",
    "torchvision",
    "torchcodec",
    "pynvvideocodec",
    "flashinfer-python",
    "apache-tvm-ffi",
    "tilelang",
    "nvidia-cudnn-frontend",
    "nvtx",
    "fastsafetensors",
    "nvidia-cutlass-dsl",
    "quack-kernels",
    "tokenspeed-mla",
    "humming-kernels",
]
ON_IMAGE = [
    "regex",
    "psutil",
    "sentencepiece",
    "numpy",
    "requests",
    "tqdm",
    "py-cpuinfo",
    "transformers",
    "tokenizers",
    "safetensors",
    "protobuf",
    "aiohttp",
    "prometheus-client",
    "pillow",
    "tiktoken",
    "typing-extensions",
    "filelock",
    "opencv-python-headless",
    "pyyaml",
    "six",
    "setuptools",
    "einops",
    "cloudpickle",
    "ninja",
    "numba",
    "torch",
    "torchaudio",
    "torchvision",
]
LEFT_OUT = {
    "mcp": "imported only when a tool server is given (--tool-server), inside MCPToolServer's methods",
    "opentelemetry-sdk": "tracing (--otlp-traces-endpoint); vllm/tracing.py imports it inside a try",
    "opentelemetry-api": "tracing, as opentelemetry-sdk",
    "opentelemetry-exporter-otlp": "tracing, as opentelemetry-sdk",
    "opentelemetry-semantic-conventions-ai": "tracing, as opentelemetry-sdk",
    "torchcodec": "audio and video inputs (multimodal models)",
    "pynvvideocodec": "video decoding on the GPU (multimodal models)",
    "tilelang": "kernels of specific model families, imported where they run",
    "fastsafetensors": "--load-format fastsafetensors only",
    "nvidia-cutlass-dsl": "CuTe DSL kernels (MoE, FP8/FP4 quantization), imported where they run",
    "quack-kernels": "CuTe DSL kernels, as nvidia-cutlass-dsl",
    "tokenspeed-mla": "MLA attention (DeepSeek-style models)",
    "humming-kernels": "quantized-GEMM kernels, imported where they run",
}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# Fetching (on a machine with the registry)


def download_commands(dest: Path, groups: list[str], pip: list[str]) -> list[list[str]]:
    """The ``pip download`` commands of ``groups``: wheels for the GPU machine, then the source archives."""
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    wheel_flags = ["--no-deps", "--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp"]
    names = [name for group in groups for name in GROUPS[group]]
    commands = [[*pip, "download", *wheel_flags, *platforms, "-d", str(dest), *names]]
    commands.append([*pip, "download", "--no-deps", "--no-binary=:all:", "-d", str(dest), *SOURCES])
    return commands


# Splitting and the manifest


def split_file(path: Path, part_bytes: int) -> list[Path]:
    """Cut ``path`` into ``path.part000``, ``.part001``, ... of ``part_bytes`` each (the last shorter); remove it.

    The same bytes as ``split -b part_bytes -d -a 3 path path.part``; ``cat path.part* > path`` joins them.
    """
    if part_bytes < 1:
        raise ValueError(f"part_bytes must be >= 1, got {part_bytes}")
    parts = []
    with path.open("rb") as source:
        for index in range(1000):
            block = source.read(part_bytes)
            if not block:
                break
            part = path.with_name(f"{path.name}{PART}{index:03d}")
            part.write_bytes(block)
            parts.append(part)
        else:
            raise ValueError(f"{path.name} needs more than 1000 parts of {part_bytes} bytes: choose larger parts")
    path.unlink()
    return parts


def write_manifest(folder: Path, part_bytes: int) -> dict:
    """Split every file in ``folder`` larger than ``part_bytes`` and write ``manifest.json``: per file its size,
    sha256 and parts (each with its own sha256), so a broken transfer is caught per part."""
    files = {}
    for path in sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST and PART not in p.name):
        entry = {"size": path.stat().st_size, "sha256": sha256(path), "parts": []}
        if entry["size"] > part_bytes:
            entry["parts"] = [{"name": p.name, "sha256": sha256(p)} for p in split_file(path, part_bytes)]
        files[path.name] = entry
    manifest = {"python_version": PYTHON_VERSION, "part_bytes": part_bytes, "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def plan_batches(manifest: dict, max_bytes: int) -> list[list[str]]:
    """Group the files to move (whole files and parts) into batches of at most ``max_bytes``, in manifest order;
    the manifest travels in the first batch."""
    sizes = []
    for name, entry in manifest["files"].items():
        if entry["parts"]:
            part_bytes = manifest["part_bytes"]
            for index, part in enumerate(entry["parts"]):
                sizes.append((part["name"], min(part_bytes, entry["size"] - index * part_bytes)))
        else:
            sizes.append((name, entry["size"]))
    batches: list[list[str]] = [[MANIFEST]]
    used = 0
    for name, size in sizes:
        if size > max_bytes:
            raise ValueError(f"{name} is {size} bytes, more than a batch's {max_bytes}: prepare with smaller parts")
        if used + size > max_bytes:
            batches.append([])
            used = 0
        batches[-1].append(name)
        used += size
    return batches


def stage_batches(src: Path, max_bytes: int) -> list[Path]:
    """Move ``src``'s files into ``src/batch-NN`` folders of at most ``max_bytes`` each (one transfer each)."""
    manifest = json.loads((src / MANIFEST).read_text())
    folders = []
    for index, names in enumerate(plan_batches(manifest, max_bytes)):
        folder = src / f"batch-{index:02d}"
        folder.mkdir(exist_ok=True)
        for name in names:
            if name == MANIFEST:
                shutil.copy2(src / name, folder / name)
            else:
                shutil.move(src / name, folder / name)
        folders.append(folder)
    return folders


# Installing (on the GPU machine)


class ChecksumError(RuntimeError):
    """A file or part whose sha256 differs from the manifest's: it was cut short or changed in transfer."""


def reassemble(folder: Path) -> list[Path]:
    """Join every split file of ``folder``'s manifest from its parts, checking each part's and the whole's sha256;
    also check the unsplit files. Return the files, ready to install. Parts are removed once joined."""
    manifest = json.loads((folder / MANIFEST).read_text())
    files = []
    for name, entry in manifest["files"].items():
        path = folder / name
        if entry["parts"] and not path.is_file():
            missing = [part["name"] for part in entry["parts"] if not (folder / part["name"]).is_file()]
            if missing:
                raise FileNotFoundError(f"{name}: parts {missing} are not in {folder}; move every batch there first")
            for part in entry["parts"]:
                if sha256(folder / part["name"]) != part["sha256"]:
                    raise ChecksumError(f"{part['name']}: sha256 differs from the manifest's; transfer it again")
            with path.open("wb") as whole:
                for part in entry["parts"]:
                    with (folder / part["name"]).open("rb") as source:
                        shutil.copyfileobj(source, whole)
        if not path.is_file():
            raise FileNotFoundError(f"{name} is not in {folder}; move every batch there first")
        if sha256(path) != entry["sha256"]:
            raise ChecksumError(f"{name}: sha256 differs from the manifest's; transfer it (or its parts) again")
        for part in entry["parts"]:
            (folder / part["name"]).unlink(missing_ok=True)
        files.append(path)
    return files


def install_command(files: list[Path], target: Path | None) -> list[str]:
    # No build isolation: DeepSpeed's source archive builds offline with the image's setuptools and torch.
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation"]
    command += ["--no-cache-dir"]
    command += ["--find-links", str(files[0].parent)] if files else []
    command += ["--target", str(target), "--upgrade"] if target else []
    return [*command, *(str(path) for path in files)]


def collect(src: Path) -> None:
    """Move the files of ``src/batch-*`` folders (as they arrive on the GPU machine) up into ``src``."""
    for folder in sorted(src.glob("batch-*")):
        for path in folder.iterdir():
            if (src / path.name).exists():  # the manifest, already moved up
                path.unlink()
            else:
                shutil.move(path, src / path.name)
        folder.rmdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="download, split and write the manifest (needs the registry)")
    prepare.add_argument("--dest", type=Path, default=Path(".gpu-wheels"))
    prepare.add_argument("--groups", default="project,vllm", help=f"comma-separated, of {sorted(GROUPS)}")
    prepare.add_argument("--part-mb", type=int, default=60, help="split files larger than this (MiB)")
    prepare.add_argument("--dry-run", action="store_true", help="print the commands, fetch nothing")
    batches = commands.add_parser("batches", help="stage the files into transfer-sized batch-NN folders")
    batches.add_argument("--src", type=Path, default=Path(".gpu-wheels"))
    batches.add_argument("--max-mb", type=int, default=60)
    install = commands.add_parser("install", help="on the GPU machine: join parts, check sums, pip install")
    install.add_argument("--src", type=Path, required=True)
    install.add_argument("--target", type=Path, default=None, help="pip --target folder (then set PYTHONPATH)")
    args = parser.parse_args(argv)
    pip = [sys.executable, "-m", "pip"]
    if args.command == "prepare":
        groups = args.groups.split(",")
        unknown = sorted(set(groups) - set(GROUPS))
        if unknown:
            parser.error(f"--groups {unknown} unknown; choose from {sorted(GROUPS)}")
        steps = download_commands(args.dest, groups, pip)
        for step in steps:
            print(" ".join(step))
            if not args.dry_run:
                args.dest.mkdir(parents=True, exist_ok=True)
                subprocess.run(step, check=True)
        if not args.dry_run:
            manifest = write_manifest(args.dest, args.part_mb << 20)
            total = sum(entry["size"] for entry in manifest["files"].values())
            print(f"{len(manifest['files'])} files, {total / 2**20:.0f} MiB, manifest in {args.dest / MANIFEST}")
    elif args.command == "batches":
        for folder in stage_batches(args.src, args.max_mb << 20):
            print(folder)
    else:
        collect(args.src)
        files = reassemble(args.src)
        print(f"{len(files)} files checked against {args.src / MANIFEST}")
        subprocess.run(install_command(files, args.target), check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
