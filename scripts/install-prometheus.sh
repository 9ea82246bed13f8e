#!/usr/bin/env bash
# Install Prometheus, Alertmanager, promtool and amtool from Debian packages. tuner starts these binaries by
# hand on loopback ports, never as services, so anything the package install started is stopped again.
# Idempotent: does nothing when all four commands are on PATH. Non-interactive. ~10 s.
set -euo pipefail
log() { echo "[install-prometheus] $*" >&2; }
SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo -n"

need=0
for cmd in prometheus promtool prometheus-alertmanager amtool; do
    command -v "$cmd" >/dev/null 2>&1 || need=1
done

if ((need)); then
    export DEBIAN_FRONTEND=noninteractive
    # policy-rc.d exit 101 tells invoke-rc.d not to start services during the install (no-op without sysvinit).
    policy=/usr/sbin/policy-rc.d
    added_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod +x "$policy" && added_policy=1
    fi
    log "apt-get update"
    $SUDO apt-get update -qq
    log "apt-get install prometheus prometheus-alertmanager"
    start=$SECONDS
    $SUDO apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >&2
    log "installed in $((SECONDS - start)) s"
    ((added_policy)) && $SUDO rm -f "$policy"
else
    log "already installed"
fi

# Stop services a package install may have started (systemd or sysvinit); our tests need 9090/9093 free-or-ours.
for svc in prometheus prometheus-alertmanager; do
    if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
        $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || true
    elif [[ -x /etc/init.d/$svc ]]; then
        $SUDO /etc/init.d/"$svc" stop >/dev/null 2>&1 || true
    fi
done
# Report (not kill) whatever still listens on the default ports: it is not ours to end.
if command -v ss >/dev/null 2>&1; then
    if ss -ltnH '( sport = :9090 or sport = :9093 )' | grep -q .; then
        log "warning: something listens on 9090/9093:"; ss -ltnp '( sport = :9090 or sport = :9093 )' >&2
    fi
fi

for cmd in prometheus promtool prometheus-alertmanager amtool; do
    command -v "$cmd" >/dev/null 2>&1 || { log "missing after install: $cmd"; exit 1; }
done
prometheus --version 2>&1 | sed -n 1p >&2  # not head: see install-haproxy.sh
command -v prometheus
