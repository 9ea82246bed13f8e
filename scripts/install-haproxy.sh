#!/usr/bin/env bash
# Install HAProxy (Debian's package) for replica groups and their tests. tuner's tests start it by hand on
# loopback ports with their own config (tuner haproxy-config GROUP prints one), never as a service, so a service
# the package install started is stopped again. Idempotent: does nothing when haproxy is on PATH. ~10 s.
set -euo pipefail
log() { echo "[install-haproxy] $*" >&2; }
SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo -n"
export PATH="$PATH:/usr/sbin:/sbin"

if ! command -v haproxy >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    policy=/usr/sbin/policy-rc.d
    added_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod +x "$policy" && added_policy=1
    fi
    start=$SECONDS
    if ! $SUDO apt-get install -y -qq --no-install-recommends haproxy >&2; then
        log "apt-get update"
        $SUDO apt-get update -qq
        $SUDO apt-get install -y -qq --no-install-recommends haproxy >&2
    fi
    log "installed in $((SECONDS - start)) s"
    ((added_policy)) && $SUDO rm -f "$policy"
else
    log "already installed"
fi
if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    $SUDO systemctl disable --now haproxy >/dev/null 2>&1 || true
elif [[ -x /etc/init.d/haproxy ]]; then
    $SUDO /etc/init.d/haproxy stop >/dev/null 2>&1 || true
fi
haproxy -v | sed -n 1p >&2  # sed reads it all: head could close the pipe early (SIGPIPE, exit 141 under pipefail)
