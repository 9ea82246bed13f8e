#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine, then run the whole suite: the fast unit tier
# (recorded real expositions, real local HTTP servers, real SQLite, real promtool) and the integration
# tier against real servers (vLLM CPU build, llama-server, Prometheus) that it installs and starts.
# Idempotent: installs are cached under ${TUNER_CACHE:-~/.cache/tuner}. Extra args go to pytest (one run of what they
# select, instead of the two tiers).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "[test] $*" >&2; }

log "tuner venv (.venv)"
[[ -x .venv/bin/python ]] || python3 -m venv .venv
# tuner's one compiled part (tuner/collect/_numbers.c) is optional for users, but the tests check it: a C compiler
# and Python's headers, so that pip builds it.
headers='import os, sys, sysconfig; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))'
if ! command -v cc >/dev/null 2>&1 || ! .venv/bin/python -c "$headers"; then
    log "a C compiler or Python's headers are missing; installing with apt-get"
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo -n"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends build-essential python3-dev >&2
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]' >&2

# The checks that need nothing but tuner's venv, first: a lint or layering error fails in the first minute,
# before the real-server installs.
log "ruff: pyflakes, import order, bugbear, pyupgrade ([tool.ruff] in pyproject.toml)"
.venv/bin/python -m ruff check --output-format concise tuner tests scripts bench
log "ruff format: the layout ([tool.ruff.format]; run \`ruff format tuner tests scripts bench\` to fix)"
.venv/bin/python -m ruff format --check tuner tests scripts bench
log "mypy: types of tuner/ ([tool.mypy] in pyproject.toml)"
.venv/bin/python -m mypy --no-error-summary
log "import-linter: the layering ([tool.importlinter] in pyproject.toml; function-level imports count)"
layering="$(.venv/bin/lint-imports --no-cache 2>&1)" || { echo "$layering"; exit 1; }
echo "$layering" | tail -n 1


bash scripts/install-prometheus.sh >&2
bash scripts/install-haproxy.sh >&2  # replica groups: a real balancer in front of real replicas
bash scripts/install-chromium.sh >&2  # the report tests render HTML in headless Chromium
log "real servers (vLLM CPU build, llama-server, tiny models); first run takes ~12 min"
exports="$(bash scripts/setup-real-servers.sh | grep '^export ')"
eval "$exports"
export TUNER_REQUIRE_REAL_SERVERS=1  # a missing real part fails the run instead of skipping

# No arguments: the fast tier on both cores (pytest-xdist's two workers), then the integration tier one test at a
# time: its real servers, and the capacities and latencies its decisions are judged by, get the host to themselves.
# With arguments: one pytest run of what they select, one test at a time.
run_pytest() {  # a tier's name, then pytest's arguments; a tier that collects no tests is a failure
    local name="$1" rc
    shift
    set +e
    .venv/bin/python -m pytest -q --durations=25 "$@"  # the 25 slowest, so a slow test shows in every run
    rc=$?
    set -e
    if [[ $rc -eq 5 ]]; then
        echo "[test] pytest collected no tests ($name): that is a failure here" >&2
        rc=1
    fi
    return $rc
}
if [[ $# -gt 0 ]]; then
    run_pytest "the tests selected" "$@" && exit 0 || exit $?
fi
log "fast tier (-m 'not integration'), two workers"
fast=0
run_pytest "fast tier" -n 2 -m "not integration" || fast=$?
log "integration tier (-m integration), one test at a time"
real=0
run_pytest "integration tier" -m integration || real=$?
if [[ $fast -ne 0 ]]; then
    echo "[test] the fast tier failed (exit $fast): see its report above the integration tier's" >&2
    exit $fast
fi
exit $real
