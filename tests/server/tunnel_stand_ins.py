"""Stand-ins of the programs `--expose cloudflare|gradio` runs, logging what the real ones log.

`cloudflared tunnel --url ...` logs to stderr, its quick tunnel's URL in a banner; offline it names
Cloudflare's API host in its error and exits 1. Gradio's frpc logs to stdout, `start proxy success: URL`
once its share server has accepted it.
"""

from __future__ import annotations

import shlex
from pathlib import Path

QUICK_URL = "https://seasonal-deck-organisms-sf.trycloudflare.com"
CLOUDFLARED_BANNER = f"""\
2025-05-01T10:00:00Z INF Thank you for trying Cloudflare Tunnel. Doing so, without a Cloudflare account, is a quick way to experiment and try it out.
2025-05-01T10:00:00Z INF Requesting new quick Tunnel on trycloudflare.com...
2025-05-01T10:00:01Z INF +--------------------------------------------------------------------------------------------+
2025-05-01T10:00:01Z INF |  Your quick Tunnel has been created! Visit it at (it may take some time to be reachable):  |
2025-05-01T10:00:01Z INF |  {QUICK_URL}                                      |
2025-05-01T10:00:01Z INF +--------------------------------------------------------------------------------------------+
2025-05-01T10:00:01Z INF Version 2025.4.2
"""
CLOUDFLARED_OFFLINE = """\
2025-05-01T10:00:00Z INF Requesting new quick Tunnel on trycloudflare.com...
2025-05-01T10:00:00Z ERR Error requesting new quick Tunnel error="Post \\"https://api.trycloudflare.com/tunnel\\": dial tcp: lookup api.trycloudflare.com: no such host"
failed to request quick Tunnel: Post "https://api.trycloudflare.com/tunnel": dial tcp: lookup api.trycloudflare.com: no such host
"""
SHARE_URL = "https://0a1b2c3d4e5f6a7b8c.gradio.live"
FRPC_LOG = (
    "2025/05/01 10:00:00 [I] [root.go:220] start frpc service for config file []\n"
    "2025/05/01 10:00:00 [I] [service.go:301] [8c1e] login to server success, get run id [8c1e]\n"
    f"2025/05/01 10:00:00 [I] [control.go:172] [8c1e] [share] start proxy success: {SHARE_URL}\n"
)
"""What gradio's frpc logs on stdout once the share server has accepted it."""


def stand_in_binary(path: Path, record: Path, output: str, *, to: str, then: str) -> Path:
    """A stand-in binary: records its pid and argv, writes `output` to `to` (stdout or stderr), `then`."""
    redirect = ">&2" if to == "stderr" else ""
    path.write_text(
        "#!/bin/sh\n"
        f"echo $$ > {shlex.quote(str(record))}.pid\n"
        f'printf "%s\\n" "$@" > {shlex.quote(str(record))}.argv\n'
        f"cat <<'EOF' {redirect}\n{output}EOF\n"
        f"{then}\n"
    )
    path.chmod(0o755)
    return path
