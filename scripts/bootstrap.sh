#!/usr/bin/env bash
# Makes a fresh Debian 12 machine ready: Python dependencies, docker.io (+ debootstrap,
# bubblewrap), a Docker engine started when none answers, and the sandbox images.
# Idempotent: does only what is missing. Used by the README and by .ci/run.
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
if ((${#need[@]})); then
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
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
