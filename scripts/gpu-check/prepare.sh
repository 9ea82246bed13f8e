#!/usr/bin/env bash
# Prepares the NVML check for a lent GPU machine (no network there): wheels tuner needs that its image lacks
# into .whl/, a CPU llama-server and the tiny GGUF into .gpu/ (both git-ignored through .git/info/exclude).
# Then, with the device tool: run `bash scripts/gpu-check/check.sh` carrying [".whl", ".gpu"].
# check.sh loads the GPU with torch (30 GiB held, bf16 products), runs `tuner run` with gpu.source nvml beside
# a real llama-server, and prints tuner's NVML reading beside nvidia-smi's, `tuner status`, tuner's /metrics
# and tests/collect/test_gpu.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
for p in /.whl/ /.gpu/; do grep -qxF "$p" .git/info/exclude 2>/dev/null || echo "$p" >> .git/info/exclude; done
mkdir -p .whl .gpu
cp "${TUNER_LLAMA_SERVER:?run scripts/setup-real-servers.sh first}" "${TUNER_TINY_GGUF:?}" .gpu/
mv .gpu/"$(basename "$TUNER_TINY_GGUF")" .gpu/tiny.gguf 2>/dev/null || true
# the image's Python is 3.12; these are tuner's imports it does not hold (see the device's KINDS.md)
for p in SQLAlchemy==2.1.9 greenlet alembic==1.20.1 Mako==1.4.3 pydantic==2.14.4 pydantic_core==2.50.5 \
    annotated-types==0.8.0 typing-inspection==0.4.5 "grafana_foundation_sdk==1769699379!11.6.0" plotly==7.1.0 \
    APScheduler==3.11.3 tzlocal==5.4.5 typing-extensions prometheus-api-client==0.7.2 dateparser==1.5.0 pytz; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$p"
done
du -sh .whl .gpu
