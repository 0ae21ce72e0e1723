#!/usr/bin/env bash
# Makes a fresh Debian 12 machine ready: Python dependencies, docker.io (+ debootstrap,
# bubblewrap), gVisor (runsc) and the sandgym runtimes, squid (egress), docker-registry and
# htpasswd (registry tests), chromium and its driver (viewer tests), a Docker engine started
# when none answers, and the images.
# Idempotent: does only what is missing. Never restarts a running dockerd (the runtimes are
# merged into /etc/docker/daemon.json and loaded with SIGHUP). Used by the README and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1

echo "::group::python dependencies"
# torch first: the CPU build file on this machine; a bare requirement would pull CUDA (GBs).
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e '.[all]'
# BFCL's data, checkers and backends for the bfcl_v4_* environments: --no-deps, its own pins
# would downgrade numpy, pandas and more (the sandgym/bfcl image has the full set). Same pin
# as images/bfcl/Dockerfile and sandgym/bfcl/data.py.
python3 -m pip install -q --no-deps bfcl-eval==2026.3.23
echo "::endgroup::"

echo "::group::debian packages"
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v runsc >/dev/null || need+=(runsc)               # gVisor: the vm profile
command -v squid >/dev/null || [ -x /usr/sbin/squid ] || need+=(squid)  # egress proxy
command -v docker-registry >/dev/null || need+=(docker-registry)  # registry tests
command -v htpasswd >/dev/null || need+=(apache2-utils)    # registry tests (auth)
command -v gcc >/dev/null || need+=(gcc)                   # the statx shim for gVisor
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)       # per-sandbox disks
command -v chromium >/dev/null || need+=(chromium)         # `sandgym view` tests: a real browser
command -v chromedriver >/dev/null || need+=(chromium-driver)
if ((${#need[@]})); then
  apt-get update -qq
  # No service is started for them: squid and the registry run as children of sandgym/tests.
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "::endgroup::"

echo "::group::sandgym runtimes (gVisor, per-sandbox disks)"
# The wrapper, the statx shim, /var/lib/sandgym/sandboxes, and the "runtimes" key in
# /etc/docker/daemon.json (other keys kept); a running dockerd gets SIGHUP, never a restart.
# Runs before dockerd is started below, so a dockerd started here reads them at once.
python3 -m sandgym.sandboxes.providers.docker.runtime install
echo "::endgroup::"

echo "::group::docker engine"
if ! docker info >/dev/null 2>&1; then
  # Network rule: no default bridge, no iptables; containers run with network none.
  nohup dockerd --bridge=none --iptables=false --ip6tables=false >/var/log/sandgym-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -50 /var/log/sandgym-dockerd.log; echo "dockerd did not start" >&2; exit 1; }
fi
docker version --format 'engine {{.Server.Version}}'
echo "::endgroup::"

echo "::group::images"
sandgym images build
echo "::endgroup::"

sandgym doctor >&2
