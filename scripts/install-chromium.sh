#!/usr/bin/env bash
# Install headless Chromium (Debian package) for the report tests: they open `tuner report`'s HTML in it,
# take a screenshot and dump the DOM. Idempotent: does nothing when `chromium` is on PATH. Non-interactive.
set -euo pipefail
log() { echo "[install-chromium] $*" >&2; }
SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo -n"

if command -v chromium >/dev/null 2>&1; then
    log "already installed"
else
    export DEBIAN_FRONTEND=noninteractive
    log "apt-get update"
    $SUDO apt-get update -qq
    log "apt-get install chromium"
    start=$SECONDS
    $SUDO apt-get install -y -qq --no-install-recommends chromium >&2
    log "installed in $((SECONDS - start)) s"
fi
command -v chromium >/dev/null 2>&1 || { log "missing after install: chromium"; exit 1; }
chromium --version 2>/dev/null | sed -n 1p >&2 || true
