#!/usr/bin/env bash
# The GPU suite and the GPU benchmark in one command, on a GPU machine (from the repository root):
#   benchmarks/gpu/run_suite.sh [WHEEL_DIR]
# WHEEL_DIR: the folder where the batches of `python benchmarks/gpu/wheels.py prepare` + `batches` arrived (an
# offline machine); its wheels are joined, checked and installed into /tmp/site, which then goes on PYTHONPATH.
# Without it the current environment must already have the project's dependencies and extras. Either way this
# checkout is installed in editable mode (pip install -e . --no-deps, unless it already is): the suite (pytest
# imports this checkout's files) and the training processes it starts (train/grpo.py imports rllm_gym) then run the
# same code, not a wheel built earlier; it stops if rllm_gym would be imported from anywhere else (NO_INSTALL=1: only
# that check).
# Logs and results go to ${OUT:-runs/gpu_suite}: pytest.log, junit.xml, bench.log, gpu.json.
# SKIP_BENCH=1 runs the suite only, SKIP_SUITE=1 the benchmark only (each fits a 10-minute command on its own); the
# wheels are installed once per machine (/tmp/site/.installed marks it). PYTEST_ARGS adds pytest options, e.g.
# PYTEST_ARGS="-k vllm" or "-k 'not vllm'" to split the suite over two commands; BENCH_ARGS adds bench_gpu.py's.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-runs/gpu_suite}"
mkdir -p "$out"
if [ "$#" -ge 1 ]; then
    if [ ! -e /tmp/site/.installed ]; then
        python3 benchmarks/gpu/wheels.py install --src "$1" --target /tmp/site && touch /tmp/site/.installed || exit 1
    fi
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/site/bin:$PATH"
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
rm -rf /tmp/site/rllm_gym /tmp/site/rllm_gym-*.dist-info  # a project wheel an earlier version of this script carried
# rllm_gym as the training processes import it: from another folder (their first path entry is train/).
same_code() {
    local root="$PWD"
    (cd / && python3 -c "
import pathlib, sys, rllm_gym, rllm_gym.train.trl_rollout as rollout
root = pathlib.Path(sys.argv[1]).resolve()
for module in (rllm_gym, rollout):
    if root not in pathlib.Path(module.__file__).resolve().parents:
        sys.exit(f'run_suite.sh: {module.__name__} is imported from {module.__file__}, not from this checkout {root}')
" "$root")
}
if [ -n "${NO_INSTALL:-}" ]; then
    same_code || exit 1
elif ! same_code 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . ||
        { echo "run_suite.sh: could not install this checkout in editable mode (pip install -e .)" >&2; exit 1; }
    same_code || exit 1
fi
nvidia-smi -L || true
python3 -c "import torch, trl, transformers; print('torch', torch.__version__, 'trl', trl.__version__, \
'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
suite=0 bench=0
if [ -z "${SKIP_SUITE:-}" ]; then
    eval "python3 -m pytest tests/gpu -m gpu -rs -p no:cacheprovider --junitxml $out/junit.xml ${PYTEST_ARGS:-}" 2>&1 | tee "$out/pytest.log"
    suite=${PIPESTATUS[0]}
fi
if [ -z "${SKIP_BENCH:-}" ]; then
    eval "python3 benchmarks/bench_gpu.py --json $out/gpu.json ${BENCH_ARGS:-}" 2>&1 | tee "$out/bench.log"
    bench=${PIPESTATUS[0]}
fi
echo "suite exit status $suite, benchmark exit status $bench; results in $out"
exit $(( suite != 0 ? suite : bench ))
