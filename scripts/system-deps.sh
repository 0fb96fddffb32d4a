#!/usr/bin/env bash
# Install the Debian packages the test suite drives for real (only those that are missing).
# ibsim + opensm + infiniband-diags: the simulated fabric; prometheus: promtool;
# prometheus-node-exporter: the sysfs oracle; graphviz: dot renders `ibmon topology --format dot`;
# gcc + libc6-dev: build mocks/ibsim_guard.c, which keeps ibsim up when a tool dies attaching.
# slurmctld + slurmd + slurm-client + munge: a real Slurm (tests/slurm_cluster.py) for job tests.
set -euo pipefail
PACKAGES=(
  prometheus
  prometheus-node-exporter
  ibsim-utils
  libumad2sim0
  infiniband-diags
  opensm
  libibmad5
  prometheus-alertmanager
  systemd
  mosquitto
  mosquitto-clients
  openssl
  graphviz
  gcc
  libc6-dev
  slurmctld
  slurmd
  slurm-client
  munge
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing system packages: ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "need root (or sudo) to apt-get install: ${missing[*]}" >&2; exit 1
  fi
fi
# policy-rc.d 101: do not start the packaged prometheus/node_exporter services; tests start their own.
restore_policy=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  restore_policy=1
fi
trap '[ -n "$restore_policy" ] && $SUDO rm -f /usr/sbin/policy-rc.d' EXIT
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
