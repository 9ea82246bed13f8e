#!/usr/bin/env bash
# The NVML check on a lent GPU machine (prepare.sh says how); its output is the note's evidence.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/g
nvidia-smi > $OUT/nvidia-smi-idle.txt 2>&1; cat $OUT/nvidia-smi-idle.txt | head -20
python3 -c "import tuner.cli, pynvml; print('tuner imports; nvidia-ml-py', pynvml.__file__)" || exit 1
echo "== idle reading"; python3 - <<'P'
import time
from tuner.collect.gpu import read_nvml
print(read_nvml(time.time()))
P
chmod +x .gpu/llama-server
.gpu/llama-server -m .gpu/tiny.gguf --host 127.0.0.1 --port 8080 --metrics -c 512 > /tmp/g/llama.log 2>&1 &
cat > /tmp/g/tuner.yaml <<Y
store: {url: sqlite:////tmp/g/tuner.db}
listen: 127.0.0.1:9464
defaults: {scrape_interval: 2s}
gpu: {source: nvml, interval: 2s}
targets:
  - {name: tiny-llama, backend: llamacpp, url: "http://127.0.0.1:8080", labels: {model_name: tiny}}
Y
python3 -m tuner.cli --config /tmp/g/tuner.yaml db upgrade || exit 1
python3 -m tuner.cli --config /tmp/g/tuner.yaml run > /tmp/g/daemon.log 2>&1 &
python3 scripts/gpu-check/load.py 90 > /tmp/g/load.log 2>&1 &
for i in $(seq 120); do [ -f /tmp/g/load-ready ] && break; sleep 1; done
echo "== load ready after $(( $(date +%s) - T0 )) s"
for i in $(seq 30); do curl -s 127.0.0.1:9464/metrics | grep -q "^tuner_gpu_memory_used_bytes" && break; sleep 1; done; sleep 4
echo "== compare"; python3 scripts/gpu-check/compare.py 2>&1 | tee $OUT/compare.txt
echo "== tuner status"; python3 -m tuner.cli --config /tmp/g/tuner.yaml status 2>&1 | tee $OUT/status.txt
nvidia-smi --query-gpu=utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw --format=csv | tee -a $OUT/status.txt
echo "== tuner /metrics gpu"; curl -s 127.0.0.1:9464/metrics | grep -E "^tuner_gpu_" | tee $OUT/metrics-gpu.txt
echo "== pytest on the GPU"; python3 -m pytest -q -p no:cacheprovider tests/collect/test_gpu.py 2>&1 | tail -5
wait %3 2>/dev/null; cat /tmp/g/load.log
echo "== after load"; sleep 4; python3 -m tuner.cli --config /tmp/g/tuner.yaml status 2>&1 | tail -8; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
cp /tmp/g/daemon.log $OUT/ 2>/dev/null; tail -5 /tmp/g/daemon.log
echo "total $(( $(date +%s) - T0 )) s"
