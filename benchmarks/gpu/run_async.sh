#!/usr/bin/env bash
# Asynchronous GRPO on a GPU with vLLM (issue 46 point 5) and the gateway against VLLMPolicy called directly (issue 45
# point 5), one command on a GPU machine (from the repository root):
#   benchmarks/gpu/run_async.sh [WHEEL_DIR]
# WHEEL_DIR: where the batches of `python benchmarks/gpu/wheels.py prepare` + `batches` arrived (an offline machine),
# installed into /tmp/site as run_suite.sh does; this checkout is installed in editable mode. A random-weight
# Qwen2.5-0.5B is built offline (rllm_gym.qwen_random) unless MODEL names a folder. Results and logs go to
# ${OUT:-runs/gpu_async}: async_gpu.json, async_logs/k*.log, gateway.json, gateway.log. ASYNC_ARGS adds
# bench_async_gpu.py's options (e.g. "--steps 12"), GATEWAY_ARGS bench_gateway.py's (GATEWAY_TIMEOUT: its seconds).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-runs/gpu_async}"
mkdir -p "$out"
if [ "$#" -ge 1 ] && [ ! -e /tmp/site/.installed ]; then
    python3 benchmarks/gpu/wheels.py install --src "$1" --target /tmp/site > "$out/install.log" 2>&1 &&
        touch /tmp/site/.installed || { tail -30 "$out/install.log"; exit 1; }
fi
export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/site/bin:$PATH"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TRL_EXPERIMENTAL_SILENCE=1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . ||
    { echo "run_async.sh: could not install this checkout in editable mode (pip install -e .)" >&2; exit 1; }
nvidia-smi -L || true
python3 -c "import torch, vllm, trl, transformers; print('torch', torch.__version__, 'vllm', vllm.__version__, \
'trl', trl.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())" || exit 1
model="${MODEL:-/tmp/qwen2.5-0.5b-random}"
[ -n "${MODEL:-}" ] || [ -e "$model/config.json" ] || python3 -m rllm_gym.qwen_random "$model" || exit 1
eval "python3 benchmarks/bench_async_gpu.py --model $model --json $out/async_gpu.json --logs $out/async_logs \
    ${ASYNC_ARGS:-}"
bench=$?
eval "timeout ${GATEWAY_TIMEOUT:-900} python3 benchmarks/bench_gateway.py --policy vllm --model $model --json $out/gateway.json ${GATEWAY_ARGS:-}" \
    2>&1 | tee "$out/gateway.log"
gateway=${PIPESTATUS[0]}
echo "bench_async_gpu exit status $bench, bench_gateway exit status $gateway; results in $out"
exit $(( bench != 0 ? bench : gateway ))
