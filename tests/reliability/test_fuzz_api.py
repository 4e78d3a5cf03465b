"""Fuzzing of every route of the capture proxy and of the Harbor server: no 5xx, no crash.

The admin API and the server are fuzzed from their own OpenAPI schemas (schemathesis: valid and
schema-violating cases). The sandbox-facing routes, the one door that model-written code can reach,
are plain Starlette routes outside the proxy's schema: each of them (OpenAI's chat and completions,
Anthropic's Messages, OpenAI's Responses, the model list) is fuzzed from a schema of its request
(`_agent_api`), and each sampling route also with valid bodies mutated one to three times (a value
dropped, or replaced by null, a list, 2**63 or a 5,000-character string), streamed and not. Every call
is checked as it is answered (no 5xx, no dropped connection, a stream that ends with its closing or
error event), and at the end every answered call is in the store and the proxy still answers.

All of it goes over real HTTP to live servers on 127.0.0.1. The engine is `engine.imitation`, a
faithful local imitation of vLLM's OpenAI server (vLLM needs a GPU).

Every run is bounded (`max_examples`) and derandomized; HARBOR_FUZZ_EXAMPLES=N runs a longer random hunt.
"""

from __future__ import annotations

import copy
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from capture_proxy.store import TraceStore
from engine.imitation import ImitationSettings, create_imitation_app
from engine.in_process import serve_in_thread
from tests.reliability._agent_api import ROUTES, SAMPLING_ROUTES, SEEDS, openapi
from tests.reliability._fixtures_input import ADMIN_KEY, MODEL, Proxy, imitation, live_proxy, serving_proxy
from tests.server.conftest import make_config, running_server

__all__ = ["imitation", "live_proxy"]  # fixtures used by name


HUNT = os.environ.get("HARBOR_FUZZ_EXAMPLES")
"""Set it (e.g. 2000) for a longer, random hunt: that many cases per test (and per route and kind of
case on the agent routes). Unset, CI runs a bounded, derandomized set."""

pytestmark = pytest.mark.timeout(240 if HUNT is None else 120 + int(HUNT))
FUZZ = settings(
    max_examples=int(HUNT or 120),
    deadline=None,
    derandomize=HUNT is None,
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
    # A hunt reports the failing case as it was found: shrinking one costs an HTTP call a step, and
    # gave up after five minutes on a chat body.
    phases=list(Phase) if HUNT is None else [p for p in Phase if p is not Phase.shrink],
)
SCHEMA_FUZZ = settings(FUZZ, max_examples=int(HUNT or 30))
"""Schema-generated cases per sandbox-facing route: 30 in CI (generating them costs more than sending)."""
MUTATION_FUZZ = settings(FUZZ, max_examples=int(HUNT or 100))
"""Mutated bodies per sandbox-facing sampling route: 100 in CI."""


def both_modes(schema) -> st.SearchStrategy:
    return st.one_of(
        schema.as_strategy(generation_mode=GenerationMode.POSITIVE),
        schema.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )


def assert_clean(response, case) -> None:
    """No 5xx, and every error is a JSON body that says something."""
    where = f"{case.method} {case.formatted_path} body={getattr(case, 'body', None)!r} query={case.query!r}"
    assert response.status_code < 500, f"{where} -> {response.status_code} {response.text[:500]}"
    if response.status_code >= 400 and response.content:
        body = response.json()
        assert body.get("error") or body.get("detail"), f"{where}: error without a message: {body}"


# -- the sandbox-facing routes: schema-generated and mutated calls ------------------------------------

_LAST_EVENTS = {
    "/v1/messages": {"message_stop", "error"},
    "/v1/responses": {"response.completed", "response.incomplete", "response.failed"},
}
"""The events a dialect's stream may end with: its closing event or its error event."""


@pytest.fixture(scope="module")
def agent_proxy(tmp_path_factory) -> Iterator[Proxy]:
    """One proxy and engine for all the agent-route tests (starting them costs more than a test's
    calls); each test has its own session, so its store counts are its own."""
    store = TraceStore(f"sqlite:///{tmp_path_factory.mktemp('agent-routes')}/traces.db")
    with (
        serve_in_thread(create_imitation_app(ImitationSettings(model=MODEL))) as engine,
        serving_proxy(engine, store) as proxy,
    ):
        yield proxy
    store.close()


class AgentCalls:
    """Calls one sandbox-facing route of a live proxy with a session key and checks every answer: no
    5xx, no dropped connection, an error in the route's own shape, a stream that ends with its closing
    or error event. It counts the answered calls, which must all be in the store at the end."""

    def __init__(self, proxy: Proxy, route: str):
        self.proxy = proxy
        self.route = route
        self.session = proxy.create()
        auth = {"Authorization": f"Bearer {self.session.api_key}"}
        self.client = httpx.Client(base_url=proxy.url, headers=auth, timeout=60)
        self.answered = 0
        """Sampling calls answered 200 (model lists are not recorded)."""
        self.listed = 0
        self.statuses: Counter[int] = Counter()

    def send(self, where: str, method: str = "POST", **request) -> int:
        """One call (`request`: httpx's json, content, headers, params); its status."""
        try:
            with self.client.stream(method, self.route, **request) as reply:
                reply.read()
        except httpx.HTTPError as exc:
            raise AssertionError(f"{where}: the connection dropped without a whole answer: {exc!r}") from exc
        status = reply.status_code
        self.statuses[status] += 1
        assert status < 500, f"{where} -> {status} {reply.text[:500]}"
        if status >= 400:
            self._assert_error(where, reply)
        elif self.route == "/v1/models":
            self.listed += 1
        else:
            self._assert_answer(where, reply)
            self.answered += 1
        return status

    def _assert_error(self, where: str, reply: httpx.Response) -> None:
        body = reply.json()
        if self.route == "/v1/messages":
            assert body["type"] == "error" and body["error"]["message"], f"{where}: {body}"
        else:
            assert (body.get("error") or {}).get("message") or body.get("detail"), f"{where}: {body}"

    def _assert_answer(self, where: str, reply: httpx.Response) -> None:
        if not reply.headers["content-type"].startswith("text/event-stream"):
            assert isinstance(reply.json(), dict), where
            return
        events = reply.text.strip().split("\n\n")
        if self.route in _LAST_EVENTS:
            name = events[-1].split("\n", 1)[0].removeprefix("event: ")
            assert name in _LAST_EVENTS[self.route], f"{where}: the stream ended with {events[-1][:300]}"
        else:
            last = events[-1]
            assert last == "data: [DONE]" or '"error"' in last, f"{where}: the stream ended with {last[:300]}"

    def check_the_store_and_that_it_still_serves(self) -> None:
        # One line per route and kind of case, shown with `pytest -s`: what a long hunt covered.
        print(f"{self.route}: {self.statuses.total()} calls, answers {dict(sorted(self.statuses.items()))}")
        assert self.answered or self.listed, f"{self.route}: nothing was answered; the test proves nothing"
        record = self.proxy.store.get_session(self.session.session_id)
        assert record.num_turns == self.answered, "every answered call is stored, and nothing else"
        assert httpx.get(f"{self.proxy.url}/health").status_code == 200
        valid = {"method": "GET"} if self.route == "/v1/models" else {"json": SEEDS[self.route][-1]}
        assert self.send("a valid call after the fuzzing", **valid) == 200
        self.client.close()


@pytest.mark.parametrize("route", ROUTES)
def test_agent_route_survives_schema_fuzzing_and_records_every_answered_call(agent_proxy, route):
    """Valid and schema-violating requests from the route's own request schema (`_agent_api`)."""
    calls = AgentCalls(agent_proxy, route)
    schema = schemathesis.openapi.from_dict(openapi(route))

    @SCHEMA_FUZZ
    @given(case=both_modes(schema))
    def run(case) -> None:
        request = case.as_transport_kwargs(base_url=agent_proxy.url)
        body = {"json": request["json"]} if "json" in request else {"content": request.get("data")}
        headers = {"Content-Type": request["headers"].get("Content-Type", "application/json")}
        where = f"{case.method} {route} body={getattr(case, 'body', None)!r}"[:2000]
        calls.send(where, case.method, headers=headers, params=request.get("params"), **body)

    run()
    calls.check_the_store_and_that_it_still_serves()


_HUGE = 2**63
"""One past the largest 64-bit integer: what no int64 column or sampling parameter holds."""
_MUTATIONS = ("drop", "null", "list", "huge", "long")


def _paths(value: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every place in a JSON value (keys of objects, indices of arrays), the value itself excepted."""
    children = (
        value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    )
    for key, child in children:
        yield (*path, key)
        yield from _paths(child, (*path, key))


def _mutate(body: dict, path: tuple, how: str) -> None:
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    if how == "drop":
        del parent[key]
    else:
        parent[key] = {"null": None, "list": [parent[key]], "huge": _HUGE, "long": "x" * 5000}[how]


@st.composite
def mutated(draw, seeds: list[dict]) -> dict:
    """A valid body, streamed or not, with one to three of its values dropped or replaced by null, a
    list, a huge integer or a 5,000-character string (each mutation may hit what a previous one made).

    The choices come from a Random that hypothesis seeds (derandomized in CI): picked uniformly, the
    places mutated reach deep into a body, where hypothesis's own choices favour its first keys."""
    rng = draw(st.randoms(use_true_random=False))
    body = copy.deepcopy(rng.choice(seeds))
    body["stream"] = rng.random() < 0.5
    for _ in range(rng.randint(1, 3)):
        paths = list(_paths(body))
        if not paths:
            break
        _mutate(body, rng.choice(paths), rng.choice(_MUTATIONS))
    return body


@pytest.mark.parametrize("route", SAMPLING_ROUTES)
def test_agent_route_survives_mutated_bodies_and_records_every_answered_call(agent_proxy, route):
    """Valid bodies that hold every feature the proxy translates (`_agent_api.SEEDS`), mutated."""
    calls = AgentCalls(agent_proxy, route)
    for seed in SEEDS[route]:
        for stream in (False, True):
            assert calls.send(f"the seed {seed}", json={**seed, "stream": stream}) == 200, "a seed is valid"

    @MUTATION_FUZZ
    @given(body=mutated(SEEDS[route]))
    def run(body: dict) -> None:
        calls.send(f"POST {route} body={body!r}"[:3000], json=body)

    run()
    calls.check_the_store_and_that_it_still_serves()


def test_the_unhashable_role_of_the_issue_is_a_400_naming_it(agent_proxy):
    """Found by mutating a Responses body: a list as an input item's role was looked up as a dict key,
    and the proxy answered 500."""
    session = agent_proxy.create()
    reply = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        reply.responses.create(model=MODEL, input=[{"role": [_HUGE], "content": "hi"}])  # type: ignore[list-item]
    assert refused.value.body["param"] == "input[0].role"
    assert "input[0].role" in refused.value.body["message"]
    raw = httpx.post(
        f"{agent_proxy.url}/v1/responses",
        content=b'{"input": [{"role": [9223372036854775808], "content": "hi"}]}',
        headers={"Authorization": f"Bearer {session.api_key}"},
    )
    assert raw.status_code == 400 and raw.json()["error"]["param"] == "input[0].role", raw.text
    assert agent_proxy.store.get_session(session.session_id).num_turns == 0


def test_admin_routes_survive_fuzzing(live_proxy):
    live_proxy.create()
    schema = schemathesis.openapi.from_url(f"{live_proxy.url}/openapi.json")
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}

    @FUZZ
    @given(case=both_modes(schema))
    def run(case) -> None:
        assert_clean(case.call(base_url=live_proxy.url, headers=admin, timeout=60), case)

    run()
    assert httpx.get(f"{live_proxy.url}/health").status_code == 200


def test_server_api_survives_fuzzing(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    with running_server(make_config(tmp_path)) as server:
        schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")

        @FUZZ
        @given(case=both_modes(schema))
        def run(case) -> None:
            assert_clean(case.call(base_url=server.url, timeout=60), case)

        run()
        assert httpx.get(f"{server.url}/health").status_code == 200
