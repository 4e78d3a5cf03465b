#!/usr/bin/env bash
# Build stand-ins for the public base images Harbor tasks use (images.txt) and tag each public name that
# is not already present. A real image is never overwritten: a name is (re)tagged only when it is missing
# or carries our label `harbor-rl.stand-in`. Idempotent: each stand-in is keyed by a hash of its recipe,
# and the uv wheel is cached in $HARBOR_SANDBOX_BASE_CACHE. Prints what it tagged. See README.md.
set -euo pipefail
cd "$(dirname "$0")"

UV_VERSION="${HARBOR_STAND_IN_UV_VERSION:-0.9.7}"  # the version Harbor's template test.sh installs
CACHE_DIR="${HARBOR_SANDBOX_BASE_CACHE:-/var/cache/harbor-rl}"
HOST_CA="${HARBOR_STAND_IN_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
LABEL="harbor-rl.stand-in"
IMAGES="${HARBOR_STAND_IN_IMAGES:-images.txt}"  # the list of names (tests use their own)

case "$(uname -m)" in
  x86_64) platform=manylinux_2_17_x86_64 ;;
  aarch64) platform=manylinux_2_17_aarch64 ;;
  *) echo "stand-ins: no uv wheel for $(uname -m); skipping the stand-in images" >&2; exit 0 ;;
esac

work="$(mktemp -d "${TMPDIR:-/tmp}/harbor-rl-stand-ins.XXXXXX")"
trap 'rm -rf "$work"' EXIT

uv_binaries() {  # uv and uvx from the PyPI wheel, once (astral.sh, where Harbor's test.sh gets them, may be unreachable)
  [ -x "$work/bin/uvx" ] && return
  mkdir -p "$CACHE_DIR/uv-$UV_VERSION" "$work/bin"
  if ! ls "$CACHE_DIR/uv-$UV_VERSION"/uv-"$UV_VERSION"-*"$platform"*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps --only-binary=:all: --platform "$platform" --python-version 3.11 \
      -d "$CACHE_DIR/uv-$UV_VERSION" "uv==$UV_VERSION" 2>&1 | grep -v -e "is ignored: it is neither" >&2 || true
  fi
  python3 - "$(ls "$CACHE_DIR/uv-$UV_VERSION"/uv-"$UV_VERSION"-*"$platform"*.whl | head -1)" "$work/bin" <<'PY'
import sys, zipfile, pathlib
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in z.namelist():
        if name.endswith(("/scripts/uv", "/scripts/uvx")):
            target = pathlib.Path(sys.argv[2]) / name.rsplit("/", 1)[1]
            target.write_bytes(z.read(name))
            target.chmod(0o755)
PY
}

# The base images the stand-ins start from (debootstrapped, cached; see docker/sandbox-base).
variants="$(awk '!/^#/ && NF {print $2}' "$IMAGES" | sort -u)"
for suite in $variants; do
  [ "$suite" = uv ] && continue
  docker image inspect "harbor-rl/sandbox-base:$suite" >/dev/null 2>&1 || \
    HARBOR_SANDBOX_BASE_IMAGE="harbor-rl/sandbox-base:$suite" HARBOR_SANDBOX_BASE_SUITE="$suite" \
      bash ../sandbox-base/build.sh >/dev/null
done

# One stand-in image per variant, tagged by a hash of what goes into it; built only when missing.
build_variant() {  # $1 variant; prints the image reference
  local variant="$1" context="$work/$1" dockerfile=Dockerfile base hash ref
  [ "$variant" = uv ] && dockerfile=Dockerfile.uv
  base="harbor-rl/sandbox-base:$variant"
  [ "$variant" = uv ] && base=scratch
  hash="$( (cat "$dockerfile"; echo "$UV_VERSION $platform"; docker image inspect -f '{{.Id}}' "$base" 2>/dev/null || true; \
            cat "$HOST_CA" 2>/dev/null || true) | sha256sum | cut -c1-12)"
  ref="harbor-rl/stand-in:$variant-$hash"
  if ! docker image inspect "$ref" >/dev/null 2>&1; then
    uv_binaries
    mkdir -p "$context/ca"
    cp "$work/bin/uv" "$work/bin/uvx" "$dockerfile" "$context/"
    [ "$dockerfile" = Dockerfile ] || mv "$context/$dockerfile" "$context/Dockerfile"
    if [ "$variant" != uv ]; then
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
    docker build -q --build-arg "BASE=$base" --label "$LABEL=$variant" -t "$ref" "$context" \
      >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
  fi
  echo "$ref"
}

declare -A built=()
while read -r name variant _; do
  case "$name" in ''|'#'*) continue ;; esac
  if docker image inspect "$name" >/dev/null 2>&1; then
    mine="$(docker image inspect -f "{{index .Config.Labels \"$LABEL\"}}" "$name" 2>/dev/null || true)"
    if [ -z "$mine" ]; then
      echo "stand-ins: $name is a real image here; kept"
      continue
    fi
  fi
  [ -n "${built[$variant]:-}" ] || built[$variant]="$(build_variant "$variant")"
  ref="${built[$variant]}"
  if [ "$(docker image inspect -f '{{.Id}}' "$name" 2>/dev/null || true)" != \
       "$(docker image inspect -f '{{.Id}}' "$ref")" ]; then
    docker tag "$ref" "$name"
    echo "stand-ins: tagged $name -> $ref"
  fi
done <"$IMAGES"
