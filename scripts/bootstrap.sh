#!/usr/bin/env bash
# Makes a fresh Debian 12 machine ready: Python dependencies, docker.io (+ debootstrap,
# bubblewrap), gVisor (runsc) and the sandgym runtimes, squid (egress), docker-registry and
# htpasswd (registry tests), chromium and its driver (viewer tests), a Docker engine started
# when none answers, and the core images
# (sandgym/base, sandgym/python; an environment's own image is built when first used, or by
# `sandgym images build`). Idempotent: does only what is missing. Never restarts a running
# dockerd (the runtimes are merged into /etc/docker/daemon.json and loaded with SIGHUP).
# The Python dependencies install in the background while the Debian packages, the engine and
# the core images (which need none of them) are made ready. Each step prints its wall time;
# a table of them comes last. Used by the README and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
STARTED=$(now)
TIMES=()
group() { GROUP=$1; GROUP_T0=$(now); echo "::group::$1"; }
endgroup() { local s; s=$(since "$GROUP_T0"); echo "::endgroup::"; echo "[bootstrap] $GROUP: ${s} s"; TIMES+=("$GROUP|$s"); }

# Background: the Python dependencies, timed on their own (they overlap the steps below).
pip_log=$(mktemp /tmp/sandgym-bootstrap-pip.XXXXXX)
(
  t0=$(now)
  # torch pinned in the same resolve: the CPU build file on this machine; a bare requirement
  # would pull CUDA (GBs). --no-compile: byte-compiling all 20k files of the set is minutes
  # of CPU on 2 cores; Python compiles what it imports, when it first imports it.
  python3 -m pip install -q --no-compile torch==2.13.0 -e '.[all]'
  # BFCL's data, checkers and backends for the bfcl_v4_* environments: --no-deps, its own pins
  # would downgrade numpy, pandas and more (the sandgym/bfcl image has the full set). Same pin
  # as images/bfcl/Dockerfile and sandgym/bfcl/data.py.
  python3 -m pip install -q --no-compile --no-deps bfcl-eval==2026.3.23
  since "$t0" >"$pip_log.time"
) >"$pip_log" 2>&1 &
pip_pid=$!
# A failing step below still waits for pip: nothing of bootstrap is left running.
trap 'rc=$?; wait "$pip_pid" 2>/dev/null; exit $rc' EXIT

group "debian packages"
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
command -v systemd-socket-activate >/dev/null || need+=(systemd)  # deploy/systemd unit tests (no init is started)
command -v chromium >/dev/null || need+=(chromium)         # `sandgym view` tests: a real browser
command -v chromedriver >/dev/null || need+=(chromium-driver)
if ((${#need[@]})); then
  apt-get update -qq
  # No service is started for them: squid and the registry run as children of sandgym/tests.
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
endgroup

group "docker engine"
if ! docker info >/dev/null 2>&1; then
  # Network rule: no default bridge, no iptables; containers run with network none.
  nohup dockerd --bridge=none --iptables=false --ip6tables=false >/var/log/sandgym-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -50 /var/log/sandgym-dockerd.log; echo "dockerd did not start" >&2; exit 1; }
fi
docker version --format 'engine {{.Server.Version}}'
endgroup

group "core images (sandgym/base, sandgym/python)"
# They need only debootstrap and the engine, so they build while pip runs: the same script
# and Dockerfile `sandgym images build --core` uses (checked by it below).
docker image inspect sandgym/base:latest >/dev/null 2>&1 || bash images/build-base.sh
docker image inspect sandgym/python:latest >/dev/null 2>&1 \
  || docker build -q --network host -t sandgym/python:latest images/python
endgroup

group "python dependencies (wait)"
pip_ok=0
wait "$pip_pid" || pip_ok=$?
grep -v "^WARNING: Location '.*' is ignored" "$pip_log" || true  # this machine's stale find-links
if [ "$pip_ok" -ne 0 ]; then echo "pip failed (exit $pip_ok)" >&2; exit 1; fi
TIMES+=("python dependencies (background)|$(cat "$pip_log.time")")
rm -f "$pip_log" "$pip_log.time"
endgroup

group "sandgym runtimes (gVisor, per-sandbox disks)"
# The wrapper, the statx shim, /var/lib/sandgym/sandboxes, and the "runtimes" key in
# /etc/docker/daemon.json (other keys kept); a dockerd without them gets SIGHUP (a reload,
# never a restart), also the one just started above.
python3 -m sandgym.sandboxes.providers.docker.runtime install
endgroup

group "core images (check)"
sandgym images build --core
endgroup

group "doctor"
sandgym doctor >&2
endgroup

echo "[bootstrap] step times (s; the python dependencies ran beside the steps before their wait):"
for t in "${TIMES[@]}"; do printf '  %-48s %8s\n' "${t%%|*}" "${t##*|}"; done
printf '  %-48s %8s\n' "total" "$(since "$STARTED")"
