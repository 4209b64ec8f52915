"""The GPU tooling on a CPU: benchmarks/bench_gpu.py (the no-GPU exit, its plumbing through --dry-run: tiny model,
2 steps) and benchmarks/gpu/wheels.py (splitting, the manifest, transfer batches, reassembly; small dummy files)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_gpu.py"


def load_bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_gpu", module)  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_says_so_and_exits_2(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = tmp_path / "gpu.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(out)], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "needs a CUDA GPU" in result.stderr and "--dry-run" in result.stderr
    assert not out.exists()


def test_dry_run_trains_both_backends_and_saves_ratios(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU plumbing even on a GPU machine
    bench = load_bench(monkeypatch)
    out = tmp_path / "results" / "gpu.json"
    assert bench.main(["--dry-run", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["mode"] == "dry" and result["baseline"] == "trl" and result["device"].startswith("cpu")
    assert set(result["versions"]) >= {"torch", "vllm", "trl", "transformers"}
    assert result["versions"]["trl"] == "1.16.0"
    runs = result["results"]
    assert list(runs) == ["trl", "hf"]
    assert result["memory_estimate_gib"]["fits"] and result["memory_estimate_gib"]["total"] > 3
    for run in runs.values():
        # 4 rollouts a step in micro-batches of 2: two accumulated forward/backward passes.
        assert (run["micro_batch"], run["gradient_accumulation_steps"]) == (2, 2)
        assert run["weight_sync_seconds"] == [0.0, 0.0]  # no vLLM on the CPU: nothing to sync
        assert len(run["step_seconds"]) == result["settings"]["steps"] == 2
        assert run["steps_timed"] == 1 and run["step_median_s"] > 0
        assert 0 < run["generate_median_s"] < run["step_median_s"]
        assert run["generation_tokens_per_s"] > 0
        assert all(0 < tokens <= 2 * 2 * 8 for tokens in run["completion_tokens"])  # rollouts x max length
    assert runs["trl"]["step_ratio_to_baseline"] == 1.0
    assert runs["hf"]["step_ratio_to_baseline"] == pytest.approx(
        runs["hf"]["step_median_s"] / runs["trl"]["step_median_s"]
    )
    assert runs["hf"]["generation_ratio_to_baseline"] > 0


@pytest.mark.parametrize("kind", ["hf", "trl"])
def test_generation_seconds_hold_every_generate_call_and_fit_in_the_step(
    kind, monkeypatch, tiny_model_dir, generate_seconds
):
    # Ours generates in the rollout, before TRL's _generate, which then only hands back the rows collected: timing
    # _generate gave ~0 s of generation for ours (tokens/s ~100x too high). The step's generation time must hold
    # every model.generate call the step made, and fit within the step.
    bench = load_bench(monkeypatch)
    clock = generate_seconds(lambda: kind)
    run = bench.measure(kind, str(tiny_model_dir), bench.DRY_SETTINGS)
    assert clock.get(kind, 0) > 0, "no generate call was seen"
    generation, steps = sum(run["generate_seconds"]), sum(run["step_seconds"])
    assert clock[kind] <= generation <= steps
    summary = bench.summarize(run, warmup=0)
    tokens = sum(run["completion_tokens"])
    assert summary["generation_tokens_per_s"] == pytest.approx(tokens / generation)
    assert summary["generation_tokens_per_s"] <= tokens / clock[kind]


def test_the_default_settings_fit_an_80_gb_gpu_for_qwen_0_5b_and_1_5b(monkeypatch):
    from rllm_gym.qwen_random import qwen_config

    bench = load_bench(monkeypatch)
    settings = bench.Settings()
    assert settings.activation_checkpointing and (settings.prompts_per_step * settings.num_generations) % 16 == 0
    for arch, parameters in (("Qwen2.5-0.5B", 494_032_768), ("Qwen2.5-1.5B", 1_543_714_304)):
        estimate = bench.memory_estimate_gib(qwen_config(arch), settings)
        assert estimate["parameters"] == parameters
        assert estimate["fits"] and estimate["total"] < 0.95 * 80e9 / 2**30, estimate
        # The earlier settings (all 128 rollouts in one micro-batch, no checkpointing) do not fit.
        whole = bench.dataclasses.replace(settings, micro_batch=128, activation_checkpointing=False)
        assert not bench.memory_estimate_gib(qwen_config(arch), whole)["fits"]


# benchmarks/gpu/wheels.py

_spec = importlib.util.spec_from_file_location("gpu_wheels", ROOT / "benchmarks" / "gpu" / "wheels.py")
wheels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wheels)


@pytest.fixture
def folder(tmp_path):
    """A big 'wheel' (split into 4 parts of 1000 bytes), a small one, and a source archive."""
    src = tmp_path / "wheels"
    src.mkdir()
    (src / "big-1.0-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(bytes(range(256)) * 14 + b"tail")  # 3588
    (src / "small-1.0-py3-none-any.whl").write_bytes(b"small wheel")
    (src / "deep-0.1.tar.gz").write_bytes(b"x" * 1000)  # exactly the part size: not split
    return src


def test_manifest_splits_only_files_over_the_part_size(folder):
    original = (folder / "big-1.0-cp312-cp312-manylinux_2_28_x86_64.whl").read_bytes()
    manifest = wheels.write_manifest(folder, part_bytes=1000)
    big = manifest["files"]["big-1.0-cp312-cp312-manylinux_2_28_x86_64.whl"]
    assert [part["name"][-8:] for part in big["parts"]] == [".part000", ".part001", ".part002", ".part003"]
    assert big["size"] == len(original) and big["sha256"] == wheels.hashlib.sha256(original).hexdigest()
    assert not (folder / "big-1.0-cp312-cp312-manylinux_2_28_x86_64.whl").exists()  # only its parts travel
    assert manifest["files"]["deep-0.1.tar.gz"]["parts"] == [] and manifest["files"]["small-1.0-py3-none-any.whl"]
    assert json.loads((folder / "manifest.json").read_text()) == manifest
    # The parts are split -b's: cat joins them into the original bytes.
    joined = subprocess.run(
        f"cat {folder}/big-*.part*", shell=True, capture_output=True, check=True
    ).stdout  # fmt: skip
    assert joined == original


def test_batches_move_and_reassemble_to_the_original_files(folder, tmp_path):
    originals = {path.name: path.read_bytes() for path in folder.iterdir()}
    wheels.write_manifest(folder, part_bytes=1000)
    batches = wheels.stage_batches(folder, max_bytes=2100)
    sizes = [sum(p.stat().st_size for p in batch.iterdir() if p.name != "manifest.json") for batch in batches]
    assert len(batches) == 3 and max(sizes) <= 2100
    # On the GPU machine: each batch arrives in its own folder under one destination.
    remote = tmp_path / "remote"
    remote.mkdir()
    for batch in batches:
        batch.rename(remote / batch.name)
    wheels.collect(remote)
    files = wheels.reassemble(remote)
    assert {path.name: path.read_bytes() for path in files} == originals
    assert sorted(p.name for p in remote.iterdir()) == sorted([*originals, "manifest.json"])  # parts removed
    command = wheels.install_command(files, tmp_path / "site")
    assert command[1:4] == ["-m", "pip", "install"] and "--no-index" in command and "--no-deps" in command
    assert command[command.index("--target") + 1] == str(tmp_path / "site")


def test_a_damaged_or_missing_part_is_named(folder):
    wheels.write_manifest(folder, part_bytes=1000)
    part = folder / "big-1.0-cp312-cp312-manylinux_2_28_x86_64.whl.part002"
    part.write_bytes(part.read_bytes()[:-1])
    with pytest.raises(wheels.ChecksumError, match=re.escape(f"{part.name}: sha256 differs")):
        wheels.reassemble(folder)
    part.unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(f"parts ['{part.name}'] are not in")):
        wheels.reassemble(folder)


def test_a_part_larger_than_a_batch_is_refused(folder):
    manifest = wheels.write_manifest(folder, part_bytes=1000)
    with pytest.raises(ValueError, match="more than a batch's 500"):
        wheels.plan_batches(manifest, max_bytes=500)


def test_dry_run_lists_the_downloads_for_the_gpu_machine(capsys):
    assert wheels.main(["prepare", "--dry-run", "--dest", "somewhere"]) == 0
    lines = capsys.readouterr().out.splitlines()
    binary, source = lines  # no project wheel: run_suite.sh installs the checkout itself
    for flag in ("download --no-deps --only-binary=:all: --python-version 3.12", "--platform manylinux_2_28_x86_64"):
        assert flag in binary
    for name in (
        "trl==1.16.0",
        "vllm==0.26.0",
        "datasets==",
        "gymnasium==",
        "pettingzoo==",
        "pydantic==",
        "math-verify",
        "model-hosting-container-standards==",  # what `vllm serve`'s api_server imports first
        "jmespath==",
        "supervisor==",
    ):
        assert f" {name}" in binary, name
    assert source.endswith("download --no-deps --no-binary=:all: -d somewhere deepspeed==0.19.8")
    # Every package appears once: two versions of one stop the whole install.
    names = [re.split("[=<>]", arg)[0].lower().replace("_", "-") for arg in binary.split() if "==" in arg]
    assert len(names) == len(set(names))


def test_every_requirement_of_vllm_is_carried_on_the_image_or_left_out_with_a_reason():
    carried = {re.split("[=<>]", name)[0].lower() for name in wheels.VLLM + wheels.PROJECT}
    places = [carried, set(wheels.ON_IMAGE), set(wheels.LEFT_OUT)]
    for name in wheels.VLLM_REQUIRES:
        assert sum(name in place for place in places) == 1, name  # in exactly one place
    assert all(reason for reason in wheels.LEFT_OUT.values())
    assert set(wheels.LEFT_OUT) | set(wheels.ON_IMAGE) <= set(wheels.VLLM_REQUIRES)


def run_suite(tmp_path, **env):
    """benchmarks/gpu/run_suite.sh with the suite and the benchmark skipped: the set-up and the same-code check."""
    venv = Path(sys.executable).parent  # its python3 runs the script's Python
    full = {**os.environ, "PATH": f"{venv}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"), **env}
    full.update(SKIP_SUITE="1", SKIP_BENCH="1", NO_INSTALL="1")
    script = ROOT / "benchmarks" / "gpu" / "run_suite.sh"
    return subprocess.run(["bash", str(script)], env=full, capture_output=True, text=True, timeout=300)


def test_run_suite_runs_this_checkouts_code_and_stops_on_another_copy(tmp_path):
    # The training processes import rllm_gym as installed; the suite imports the checkout: they must be one code.
    result = run_suite(tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "suite exit status 0, benchmark exit status 0" in result.stdout
    stale = tmp_path / "stale" / "rllm_gym"  # e.g. a project wheel installed by an earlier run, first on the path
    stale.mkdir(parents=True)
    (stale / "__init__.py").write_text("")
    result = run_suite(tmp_path, PYTHONPATH=str(stale.parent))
    assert result.returncode == 1
    assert f"rllm_gym is imported from {stale / '__init__.py'}, not from this checkout {ROOT}" in result.stderr


def test_unknown_group_is_refused():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu" / "wheels.py"), "prepare", "--dry-run", "--groups", "cuda"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2 and "--groups ['cuda'] unknown; choose from ['project', 'vllm']" in result.stderr


def make_wheel(folder: Path) -> Path:
    """A minimal real wheel (a module of about 5 kB, stored uncompressed), installable by pip offline."""
    import base64
    import hashlib
    import zipfile

    files = {
        "gpu_dummy.py": "VALUE = 42\n# " + "".join(f"{i:x}" for i in range(1500)) + "\n",
        "gpu_dummy-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: gpu-dummy\nVersion: 1.0\n",
        "gpu_dummy-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files["gpu_dummy-1.0.dist-info/RECORD"] = "\n".join([*record, "gpu_dummy-1.0.dist-info/RECORD,,"]) + "\n"
    path = folder / "gpu_dummy-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def test_install_joins_checks_and_pip_installs_a_split_wheel(tmp_path):
    src = tmp_path / "wheels"
    src.mkdir()
    wheel = make_wheel(src)
    original = wheel.read_bytes()
    manifest = wheels.write_manifest(src, part_bytes=2000)
    assert len(manifest["files"][wheel.name]["parts"]) == -(-len(original) // 2000) > 1
    wheels.stage_batches(src, max_bytes=4000)
    assert wheels.main(["install", "--src", str(src), "--target", str(tmp_path / "site")]) == 0
    assert wheel.read_bytes() == original
    assert "VALUE = 42" in (tmp_path / "site" / "gpu_dummy.py").read_text()
