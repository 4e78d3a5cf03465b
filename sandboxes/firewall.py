"""The iptables rules that confine Docker sandboxes (bridges named `hrl+`); every change is idempotent.

Chains (filter table), hooked for interfaces `hrl+` from INPUT (traffic to the host itself) and
DOCKER-USER (traffic the host forwards):

    HRL-IN    [proxy ACCEPTs: -i <bridge> -d <gateway> --dport <proxy port>]
              [per sandbox: ACCEPT/REJECT to allow-listed addresses that are the host's own]
              ESTABLISHED,RELATED ACCEPT · REJECT
    HRL-FWD   [per sandbox, newest first, each keyed by the container's IP (`-s IP`) or, for a
               compose project, by its bridges (`-i hrl-c<hex>+`), with a comment naming it:
               intra-project RETURN, allow-listed RETURNs, phase REJECTs]
              -g HRL-BASE
    HRL-BASE  (rewritten whole, atomically, by `install`)
              -i hrl-nonet0 REJECT · -i hrl-allow0 REJECT      no-network, allowlist: nothing more
              DNS (53/udp, 53/tcp) to the host's resolvers RETURN
              -d <private, link-local, loopback, multicast, reserved ranges, the host's LANs> REJECT
              -i hrl-public0 RETURN · -i hrl-c+ -g HRL-PROJ · REJECT
    HRL-PROJ  [per public compose project: -i hrl-c<hex>+ RETURN] · REJECT

RETURN out of these chains means "allowed" (Docker's own FORWARD rules then apply); the gotos make a
RETURN in HRL-BASE or HRL-PROJ leave HRL-FWD too. So everything fails closed: an interface with no
rules, a compose bridge whose project rules are gone, falls on a REJECT. REJECT rather than DROP, so
agents fail fast instead of hanging on a timeout.

A policy change (a phase narrowing the sandbox's network) inserts the new rules above the old ones
before deleting those: at no moment is the sandbox allowed more than either policy.
"""

from __future__ import annotations

import ipaddress
import shlex
import subprocess
from collections.abc import Iterable
from pathlib import Path

from sandboxes.errors import SandboxUnavailable

CHAIN_IN, CHAIN_FWD, CHAIN_BASE, CHAIN_PROJ = "HRL-IN", "HRL-FWD", "HRL-BASE", "HRL-PROJ"
IFACE_MATCH = "hrl+"
COMPOSE_IFACE_PREFIX = "hrl-c"
PUBLIC_BRIDGE, NONET_BRIDGE, ALLOW_BRIDGE = "hrl-public0", "hrl-nonet0", "hrl-allow0"
COMMENT_PREFIX = "harbor-rl:"
_REJECT = ["-j", "REJECT", "--reject-with", "icmp-port-unreachable"]

BLOCKED_RANGES = (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # private (RFC 1918)
    "100.64.0.0/10",  # carrier-grade NAT
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link-local, including the cloud metadata address 169.254.169.254
    "172.16.0.0/12",  # private: Docker's own bridges live here
    "192.168.0.0/16",  # private
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and the broadcast address
)
"""Where a public sandbox may never go: the host's neighbours, never the internet."""


def install() -> None:
    """Create the chains and hooks, and bring HRL-BASE to the current layout (cheap when it is)."""
    for chain in (CHAIN_IN, CHAIN_FWD, CHAIN_BASE, CHAIN_PROJ):
        iptables("-N", chain, check=False)
    if not iptables("-L", "DOCKER-USER", "-n", check=False):
        iptables("-N", "DOCKER-USER", check=False)
        ensure_rule("FORWARD", "-j", "DOCKER-USER")
    ensure_rule("INPUT", "-i", IFACE_MATCH, "-j", CHAIN_IN)
    ensure_rule("DOCKER-USER", "-i", IFACE_MATCH, "-j", CHAIN_FWD)
    ensure_rule(CHAIN_IN, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT", append=True)
    _converge_tail(CHAIN_IN)
    ensure_rule(CHAIN_IN, *_REJECT, append=True)
    _converge_tail(CHAIN_FWD)
    ensure_rule(CHAIN_FWD, "-g", CHAIN_BASE, append=True)
    ensure_rule(CHAIN_PROJ, *_REJECT, append=True)
    wanted = base_rules(host_dns_servers(), host_lan_subnets())
    current = [
        line for line in (iptables("-S", CHAIN_BASE, check=False) or "").splitlines() if line[:2] == "-A"
    ]
    if current != [f"-A {CHAIN_BASE} {shlex.join(rule)}" for rule in wanted]:
        lines = ["*filter", f":{CHAIN_BASE} - [0:0]"]  # with --noflush, only this chain is emptied
        lines += [f"-A {CHAIN_BASE} {shlex.join(rule)}" for rule in wanted] + ["COMMIT", ""]
        restore("\n".join(lines))


def _converge_tail(chain: str) -> None:
    """Drop the terminal rules earlier layouts appended (DROP; REJECT and the public RETURN in
    HRL-FWD, which now live in HRL-BASE): left above the new tail they would shadow it."""
    stale = [["-j", "DROP"]]
    if chain == CHAIN_FWD:
        stale += [_REJECT, ["-i", PUBLIC_BRIDGE, "-j", "RETURN"]]
    for rule in stale:
        while iptables("-D", chain, *rule, check=False) is not None:
            pass


def base_rules(dns: Iterable[str], lans: Iterable[str]) -> list[list[str]]:
    """HRL-BASE, in the exact form `iptables -S` prints it (so a listing compares equal)."""
    rules = [["-i", NONET_BRIDGE, *_REJECT], ["-i", ALLOW_BRIDGE, *_REJECT]]
    for server in dns:
        for proto in ("udp", "tcp"):
            rules.append(["-d", f"{server}/32", "-p", proto, "-m", proto, "--dport", "53", "-j", "RETURN"])
    for cidr in (*BLOCKED_RANGES, *lans):
        rules.append(["-d", cidr, *_REJECT])
    rules += [
        ["-i", PUBLIC_BRIDGE, "-j", "RETURN"],
        ["-i", f"{COMPOSE_IFACE_PREFIX}+", "-g", CHAIN_PROJ],
        _REJECT,
    ]
    return rules


def host_dns_servers(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[str]:
    """The host's IPv4 resolvers, which Docker's embedded DNS asks from inside each container."""
    servers: list[str] = []
    try:
        text = resolv_conf.read_text()
    except OSError:
        return servers
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            try:
                address = ipaddress.ip_address(words[1])
            except ValueError:
                continue
            # Docker replaces a loopback resolver (systemd-resolved's 127.0.0.53) with public ones.
            if address.version == 4 and not address.is_loopback and words[1] not in servers:
                servers.append(words[1])
    return servers


def host_lan_subnets() -> list[str]:
    """The host's directly attached IPv4 networks that the fixed ranges do not cover (a LAN on public
    addresses), the sandboxes' own bridges excepted."""
    done = subprocess.run(
        ["ip", "-4", "-o", "route", "show", "scope", "link"], capture_output=True, text=True
    )
    blocked = [ipaddress.ip_network(cidr) for cidr in BLOCKED_RANGES]
    found: list[str] = []
    for line in done.stdout.splitlines():
        words = line.split()
        if not words or "dev" not in words or words[words.index("dev") + 1].startswith("hrl"):
            continue
        try:
            network = ipaddress.ip_network(words[0], strict=False)
        except ValueError:
            continue
        if not any(network.subnet_of(b) for b in blocked) and str(network) not in found:
            found.append(str(network))
    return found


def allow_proxy(bridge: str, gateway: str, port: int, *, comment: str | None = None) -> None:
    """The capture proxy at the bridge's gateway, the one host port every sandbox reaches."""
    tag = ["-m", "comment", "--comment", comment] if comment else []
    ensure_rule(
        CHAIN_IN, "-i", bridge, "-d", gateway, "-p", "tcp", "--dport", str(port), *tag, "-j", "ACCEPT"
    )


def forget_other_gateways(bridge: str, gateway: str) -> None:
    """Remove proxy rules of `bridge` whose gateway is not `gateway` (a re-created network)."""
    for line in _rules(CHAIN_IN):
        words = shlex.split(line)
        stale = (
            f"-i {bridge} " in f"{line} "
            and "--dport" in words
            and "-d" in words
            and words[words.index("-d") + 1].split("/")[0] != gateway
        )
        if stale:
            iptables("-D", *words[1:], check=False)


def allow_addresses(key: str, match: list[str], addresses: Iterable[str], *, outward: list[str] = ()) -> None:
    """Let the traffic `match` selects reach `addresses`, and nothing else leave (`outward` limits the
    final REJECT, e.g. to traffic leaving a compose project's own bridges)."""
    comment = ["-m", "comment", "--comment", f"{COMMENT_PREFIX}{key}"]
    insert(CHAIN_FWD, *match, *outward, *comment, *_REJECT)
    for address in addresses:
        insert(CHAIN_IN, *match, "-d", address, *comment, "-j", "ACCEPT")
        insert(CHAIN_FWD, *match, "-d", address, *comment, "-j", "RETURN")


def set_phase(
    key: str,
    match: list[str],
    generation: int,
    *,
    allowed: list[str] | None,
    start_allowed: Iterable[str] = (),
    outward: list[str] = (),
) -> None:
    """Replace the phase rules of the sandbox `key`: `allowed` None means no phase rules at all (back to
    what it started with); otherwise only `allowed` (plus the proxy) is reachable."""
    current = f"{COMMENT_PREFIX}{key} phase {generation}"
    if allowed is not None:
        comment = ["-m", "comment", "--comment", current]
        # Inserted at the top, deny first, so that the allows end up above it.
        insert(CHAIN_FWD, *match, *outward, *comment, *_REJECT)
        for address in sorted(set(start_allowed) - set(allowed)):  # the host's own addresses, in INPUT
            insert(CHAIN_IN, *match, "-d", address, *comment, *_REJECT)
        for address in allowed:
            insert(CHAIN_IN, *match, "-d", address, *comment, "-j", "ACCEPT")
            insert(CHAIN_FWD, *match, "-d", address, *comment, "-j", "RETURN")
    prefix = f"{COMMENT_PREFIX}{key} phase "
    remove_where(lambda c: c.startswith(prefix) and c != current)


def allow_project(key: str, bridges: str, *, public: bool) -> None:
    """A compose project: its containers reach each other; a public one reaches what public allows."""
    comment = ["-m", "comment", "--comment", f"{COMMENT_PREFIX}{key}"]
    insert(CHAIN_FWD, "-i", bridges, "-o", bridges, *comment, "-j", "RETURN")
    if public:
        insert(CHAIN_PROJ, "-i", bridges, *comment, "-j", "RETURN")


def remove(key: str) -> None:
    """Remove every rule of the sandbox or project `key` (its start and phase rules)."""
    exact = f"{COMMENT_PREFIX}{key}"
    remove_where(lambda c: c == exact or c.startswith(exact + " "))


def remove_where(predicate) -> int:
    removed = 0
    for chain in (CHAIN_IN, CHAIN_FWD, CHAIN_PROJ):
        for line in _rules(chain):
            comment = _comment_of(line)
            if comment is None or not predicate(comment):
                continue
            if iptables("-D", *shlex.split(line)[1:], check=False) is not None:
                removed += 1
    return removed


def key_of(comment: str) -> str | None:
    """The sandbox or project a rule's comment names (`harbor-rl:<key>[ phase <n>]`)."""
    return comment[len(COMMENT_PREFIX) :].split(" ")[0] if comment.startswith(COMMENT_PREFIX) else None


def keys_in_rules() -> set[str]:
    """The sandbox and project names that rules are kept for."""
    keys = set()
    for chain in (CHAIN_IN, CHAIN_FWD, CHAIN_PROJ):
        for line in _rules(chain):
            key = key_of(_comment_of(line) or "")
            if key:
                keys.add(key)
    return keys


def forget_source(ip: str, keep: str) -> None:
    """Remove rules keyed by `ip` that belong to another sandbox: one gone without clean-up whose IP the
    engine has given to `keep`, which must not inherit its policy."""
    for chain in (CHAIN_IN, CHAIN_FWD):
        for line in _rules(chain):
            words = shlex.split(line)
            if (
                "-s" in words
                and words[words.index("-s") + 1] == f"{ip}/32"
                and key_of(_comment_of(line) or "") != keep
            ):
                iptables("-D", *words[1:], check=False)


def uninstall() -> None:
    for chain, hook in ((CHAIN_IN, "INPUT"), (CHAIN_FWD, "DOCKER-USER")):
        while iptables("-C", hook, "-i", IFACE_MATCH, "-j", chain, check=False) is not None:
            iptables("-D", hook, "-i", IFACE_MATCH, "-j", chain, check=False)
    for chain in (CHAIN_IN, CHAIN_FWD, CHAIN_BASE, CHAIN_PROJ):  # HRL-FWD refers to the others: first
        iptables("-F", chain, check=False)
    for chain in (CHAIN_IN, CHAIN_FWD, CHAIN_BASE, CHAIN_PROJ):
        iptables("-X", chain, check=False)


def _rules(chain: str) -> list[str]:
    return [
        line for line in (iptables("-S", chain, check=False) or "").splitlines() if line.startswith("-A ")
    ]


def _comment_of(line: str) -> str | None:
    words = shlex.split(line)
    return words[words.index("--comment") + 1] if "--comment" in words else None


def insert(chain: str, *rule: str) -> None:
    iptables("-I", chain, "1", *rule)


def ensure_rule(chain: str, *rule: str, append: bool = False) -> None:
    if iptables("-C", chain, *rule, check=False) is None:
        iptables("-A" if append else "-I", chain, *([] if append else ["1"]), *rule)


def iptables(*args: str, check: bool = True) -> str | None:
    """Run iptables; returns stdout, or None on failure when `check` is False."""
    return _run(["iptables", "-w", "10", *args], " ".join(args), check=check)


def restore(text: str) -> None:
    """Apply `text` (iptables-restore format) in one transaction, leaving undeclared chains alone."""
    _run(["iptables-restore", "--noflush", "-w", "10"], "iptables-restore", check=True, stdin=text)


def _run(argv: list[str], what: str, *, check: bool, stdin: str | None = None) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, input=stdin)
    except FileNotFoundError as exc:
        raise SandboxUnavailable(
            f"{argv[0]} is not installed; the docker backend needs it to confine sandboxes "
            "(or pass firewall=False to trust the host's own network setup)"
        ) from exc
    if done.returncode != 0:
        if check:
            raise SandboxUnavailable(
                f"{what} failed: {done.stderr.strip()} (the docker backend needs root to confine "
                "sandboxes; pass firewall=False to trust the host's own network setup)"
            )
        return None
    return done.stdout
