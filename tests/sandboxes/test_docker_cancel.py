"""A start cancelled while its container is being created (a Ctrl-C on `harbor eval`, a cancelled
rollout) leaves no container: the Docker calls run on a thread that the cancel does not stop, so the
backend stops what that thread goes on to start. Before, about one Ctrl-C in three on an eval with live
Docker trials left a container running with no sandbox object to stop it."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from sandboxes import SandboxSpec
from sandboxes.docker_sandbox import NAME_LABEL

from .conftest import BASE_IMAGE

pytestmark = pytest.mark.docker


async def _cancel_once_created(backend, client) -> tuple[str, bool]:
    """Start a sandbox and cancel it the moment its container exists (the thread that made it still at
    work); (its name, whether the cancel came in time: on a fast machine the start may win the race)."""
    name = f"dk-cancel-{uuid.uuid4().hex[:8]}"
    mine = {"label": f"{NAME_LABEL}={name}"}
    start = asyncio.create_task(backend.start(SandboxSpec(name=name, docker_image=BASE_IMAGE)))
    # The low-level list: the SDK's `containers.list` inspects each one, and a container removed
    # between its list and its inspect is a 404 (a failed first create is removed so).
    while not await asyncio.to_thread(client.api.containers, all=True, filters=mine):
        if start.done():
            break
        await asyncio.sleep(0.005)
    if start.done():
        await start.result().stop()
        return name, False
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    return name, True


async def test_a_start_cancelled_while_its_container_is_created_leaves_none(docker_backend, docker_client):
    for _ in range(5):
        name, in_time = await _cancel_once_created(docker_backend, docker_client)
        if in_time:
            break
    else:
        pytest.skip("every start finished before its container could be seen: nothing to cancel")
    left = await asyncio.to_thread(
        docker_client.api.containers, all=True, filters={"label": f"{NAME_LABEL}={name}"}
    )
    assert left == []
