#!/usr/bin/env bash
# One-time (idempotent) set-up of everything Harbor-RL's tests and embedded default need on a Debian
# machine, as root: system packages, a Docker engine, PostgreSQL, the Python package, and the offline
# sandbox base image. Safe to re-run; each step skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\033[1;34m[setup]\033[0m %s\n' "$*"; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
as_postgres() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi; }

# 1. System packages.
need=()
for pkg in docker.io bubblewrap socat postgresql debootstrap iptables procps chromium chromium-driver; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
# npm fetches opencode on the host; machines here ship Node.js with npm (which conflicts with Debian's npm).
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# 2. Docker engine (overlay2; vfs only if overlay2 cannot start).
if ! docker info >/dev/null 2>&1; then
  log "starting dockerd"
  for driver in overlay2 vfs; do
    $SUDO sh -c "nohup dockerd --storage-driver=$driver >/var/log/harbor-dockerd.log 2>&1 &"
    for _ in $(seq 1 30); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 && break
    log "dockerd with $driver did not come up; trying the next driver"
    $SUDO pkill dockerd || true; sleep 2
  done
  docker info >/dev/null 2>&1 || { echo "dockerd failed to start; see /var/log/harbor-dockerd.log" >&2; exit 1; }
fi

# 3. PostgreSQL with a test role and database.
if ! pg_lsclusters -h 2>/dev/null | grep -q online; then
  log "starting PostgreSQL"
  $SUDO service postgresql start >/dev/null
fi
as_postgres psql -tAc "SELECT 1 FROM pg_roles WHERE rolname='harbor'" | grep -q 1 \
  || as_postgres psql -qc "CREATE ROLE harbor LOGIN PASSWORD 'harbor' CREATEDB;"
as_postgres psql -tAc "SELECT 1 FROM pg_database WHERE datname='harbor_test'" | grep -q 1 \
  || as_postgres createdb -O harbor harbor_test

# 4. Python: the CPU build of torch first (an unpinned torch would pull a multi-GB CUDA build).
if ! python3 -c "import torch" >/dev/null 2>&1; then
  log "installing torch 2.13.0 (CPU)"
  python3 -m pip install -q torch==2.13.0
fi
log "installing harbor-rl[dev]"
python3 -m pip install -q -e ".[dev]" 2>&1 | grep -v -e "^WARNING: Running pip as" -e "is ignored: it is neither" || true

# 5. The offline sandbox base image (debootstrap; cached as a tarball between runs).
if [ -x docker/sandbox-base/build.sh ]; then
  bash docker/sandbox-base/build.sh
fi
# 6. vLLM's own weight-transfer code for the CPU tests (tests/vllm/wheels.py): the two pinned releases'
#    wheels, downloaded once into ~/.cache/harbor-rl/vllm-wheels (HARBOR_VLLM_WHEELS), a few files unzipped.
log "fetching the pinned vLLM releases' source for the weight-sync tests (cached)"
python3 -c "from tests.vllm.wheels import RELEASES, release_source; [release_source(v) for v in RELEASES]"
log "ready"
