"""Network policies shared by the backends: what may narrow what, and allow-lists turned into addresses.

A sandbox starts with the widest policy any phase of its run needs (`SandboxSpec.network_mode`); a
phase may narrow it (`Sandbox.apply_network`), never widen it: public > allowlist(hosts) >
no-network, and an allow-list only to a subset of its hosts.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field

from sandboxes.base import NetworkMode, SandboxSpec
from sandboxes.errors import SandboxError, UnsupportedEnvironment


def normalize_host(host: str) -> str:
    return host.strip().lower().rstrip(".")


def check_narrowing(spec: SandboxSpec, mode: NetworkMode, allowed_hosts: list[str]) -> None:
    """SandboxError when (`mode`, `allowed_hosts`) would let the sandbox reach more than it started with."""
    start = spec.network_mode
    if start == "public":
        return
    wider = mode == "public" or (start == "no-network" and mode != "no-network")
    if not wider and mode == "allowlist":
        started_with = {normalize_host(h) for h in spec.allowed_hosts}
        extra = sorted({normalize_host(h) for h in allowed_hosts} - started_with)
        wider = bool(extra)
    if wider:
        asked = mode + (f" ({', '.join(allowed_hosts)})" if mode == "allowlist" else "")
        began = start + (f" ({', '.join(spec.allowed_hosts)})" if start == "allowlist" else "")
        raise SandboxError(
            f"sandbox {spec.name}: network {asked} is wider than the {began} it started with; start it "
            "with the widest policy any phase needs"
        )


@dataclass
class Allowlist:
    """An allow-list made concrete: names pinned to one address each, and every address to allow."""

    pins: dict[str, str] = field(default_factory=dict)
    """host name -> the IPv4 address it resolved to on the host (written into /etc/hosts)."""
    addresses: list[str] = field(default_factory=list)
    """IPv4 addresses and CIDR ranges the firewall lets through."""


def resolve_allowlist(hosts: list[str], *, known: dict[str, str] | None = None) -> Allowlist:
    """Resolve `hosts` on the host: a sandbox on an allow-list has no DNS, so names are pinned.

    `known`: names already pinned (at start), kept so /etc/hosts and the rules stay consistent.
    Wildcards and IPv6 cannot be enforced by address on IPv4 bridges: UnsupportedEnvironment."""
    result = Allowlist()
    for raw in hosts:
        host = normalize_host(raw)
        if "*" in host:
            raise UnsupportedEnvironment(
                f"allowed host {raw!r}: a wildcard cannot be enforced by address (the docker sandbox "
                "pins each name to the address it resolves to); list the host names instead"
            )
        try:
            network = ipaddress.ip_network(host, strict=False)
        except ValueError:
            network = None
        if network is not None:
            if network.version != 4:
                raise UnsupportedEnvironment(
                    f"allowed host {raw!r}: sandboxes have IPv4 networks only; name an IPv4 address"
                )
            cidr = str(network) if "/" in host else str(network.network_address)
            if cidr not in result.addresses:
                result.addresses.append(cidr)
            continue
        address = (known or {}).get(host) or _resolve(raw)
        result.pins[host] = address
        if address not in result.addresses:
            result.addresses.append(address)
    return result


def _resolve(host: str) -> str:
    try:
        infos = socket.getaddrinfo(host, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise SandboxError(f"allowed host {host!r} does not resolve: {exc}") from exc
    return infos[0][4][0]
