#!/usr/bin/env bash
# tuner vs Prometheus 2.42 on the same endpoints; writes bench/results/YYYY-MM-DD-HHMM-whole-run.md and refreshes
# the summary in bench/README.md (see there).
#   bash bench/run.sh [--targets 100,500,1000] [--interval 5s] [--duration 60s] [--storage-days 30]
#                     [--skip parser,storage,scale,alerts,fleet] [--alert-trials 10] [--fleet 1000] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
command -v "${PROMETHEUS:-prometheus}" >/dev/null || { echo "prometheus not found: apt-get install prometheus (2.42)" >&2; exit 2; }
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true   # 1,000 endpoints need a few thousand sockets
PIDFILE=$(mktemp /tmp/tuner-bench-pids.XXXXXX)
cleanup() {
    trap - INT TERM EXIT
    [[ -n "${BENCH_PID:-}" ]] && kill -TERM "$BENCH_PID" 2>/dev/null && wait "$BENCH_PID" 2>/dev/null || true
    # Whatever the driver could not stop (it was killed): the pids it started, one by one.
    while read -r pid; do [[ -n "$pid" ]] && kill -TERM "$pid" 2>/dev/null || true; done < "$PIDFILE"
    rm -f "$PIDFILE"
}
trap cleanup INT TERM EXIT
export BENCH_COMMAND="bash bench/run.sh $*"
"$PY" bench/run.py --pidfile "$PIDFILE" "$@" &
BENCH_PID=$!
wait "$BENCH_PID"
