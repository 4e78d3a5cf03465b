"""A shared harbor-rl Docker network is removed only when no live process on this machine uses it:
a server that stops (or failed to start) must not pull `harbor-rl-nonet` from under another live one
between its rollouts, and a SIGKILLed one must not keep it forever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest

from sandboxes.network_users import NetworkUsers

from .conftest import REPO
from .test_docker import spec

HOLDER = """
import sys, time
from sandboxes.network_users import NetworkUsers
users = NetworkUsers()
users.hold(sys.argv[1])
print("holding", flush=True)
time.sleep(600)
"""


def test_a_network_another_live_process_uses_is_not_idle_until_that_process_dies():
    name = f"test-{uuid.uuid4().hex[:8]}"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, name], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        mine = NetworkUsers()
        mine.hold(name)  # ours too: giving it up must not count as "nobody uses it"
        with mine.idle_only(name) as idle:
            assert idle is False
        os.kill(holder.pid, signal.SIGKILL)  # the kernel drops a dead process's locks
        holder.wait(timeout=30)
        with mine.idle_only(name) as idle:
            assert idle is True
            # While the remover holds it, the network is being removed: another process's check says no.
            with NetworkUsers().idle_only(name) as meanwhile:
                assert meanwhile is False
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)


@pytest.mark.docker
async def test_closing_one_backend_leaves_the_network_another_live_backend_uses(
    docker_client, base_image, no_leftover_containers
):
    """Two servers' docker backends on one engine: B closes while A, between rollouts, has no container
    on harbor-rl-nonet. The network stays (A's next sandbox starts on the same one); once A closes too
    it goes, unless another run on this engine still uses it."""
    from sandboxes.docker import DockerBackend

    a, b = DockerBackend(), DockerBackend()
    try:
        first = await a.start(spec())
        network_id = first.network.id
        await first.stop()
        other = await b.start(spec())
        await other.stop()
        await b.aclose()
        assert [n.id for n in docker_client.networks.list(names=["harbor-rl-nonet"])] == [network_id]
        second = await a.start(spec())
        try:
            assert second.network.id == network_id
            assert (await second.exec("echo same-network")).stdout == "same-network\n"
        finally:
            await second.stop()
    finally:
        await b.aclose()
        await a.aclose()
    with NetworkUsers().idle_only("harbor-rl-nonet") as idle:
        if idle:  # no other process on this machine uses it: A's close removed it
            assert not docker_client.networks.list(names=["harbor-rl-nonet"])
