"""Prometheus counters of the proxy, kept in plain dicts: O(1) per turn, rendered only when scraped."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class ProxyMetrics:
    """Counts requests, captured turns and failures; one histogram of upstream latency per endpoint."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.turns: Counter[tuple[str, str]] = Counter()
        self.errors: Counter[str] = Counter()
        self.completion_tokens = 0
        self.prompt_tokens = 0
        self._hist: dict[str, list[int]] = {}
        self._hist_sum: Counter[str] = Counter()
        self.sessions_created = 0

    def request(self, endpoint: str, status: int) -> None:
        self.requests[(endpoint, status)] += 1

    def error(self, kind: str) -> None:
        self.errors[kind] += 1

    def turn(
        self, endpoint: str, capture: str, prompt_tokens: int, completion_tokens: int, latency_s: float
    ) -> None:
        self.turns[(endpoint, capture)] += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        counts = self._hist.get(endpoint)
        if counts is None:
            counts = self._hist[endpoint] = [0] * (len(LATENCY_BUCKETS) + 1)
        counts[bisect_left(LATENCY_BUCKETS, latency_s)] += 1
        self._hist_sum[endpoint] += latency_s

    def render(self, live_sessions: int) -> str:
        out = [
            "# HELP harbor_proxy_requests_total Agent requests answered, by endpoint and HTTP status.",
            "# TYPE harbor_proxy_requests_total counter",
        ]
        out += [
            f'harbor_proxy_requests_total{{endpoint="{e}",status="{s}"}} {n}'
            for (e, s), n in sorted(self.requests.items())
        ]
        out += [
            "# HELP harbor_proxy_turns_total Turns recorded in the store, by endpoint and capture status.",
            "# TYPE harbor_proxy_turns_total counter",
        ]
        out += [
            f'harbor_proxy_turns_total{{endpoint="{e}",capture="{c}"}} {n}'
            for (e, c), n in sorted(self.turns.items())
        ]
        out += [
            "# HELP harbor_proxy_errors_total Requests refused or failed, by kind.",
            "# TYPE harbor_proxy_errors_total counter",
        ]
        out += [f'harbor_proxy_errors_total{{kind="{k}"}} {n}' for k, n in sorted(self.errors.items())]
        out += [
            "# TYPE harbor_proxy_prompt_tokens_total counter",
            f"harbor_proxy_prompt_tokens_total {self.prompt_tokens}",
            "# TYPE harbor_proxy_completion_tokens_total counter",
            f"harbor_proxy_completion_tokens_total {self.completion_tokens}",
            "# TYPE harbor_proxy_sessions_created_total counter",
            f"harbor_proxy_sessions_created_total {self.sessions_created}",
            "# HELP harbor_proxy_live_sessions Sessions with a cached key in this process.",
            "# TYPE harbor_proxy_live_sessions gauge",
            f"harbor_proxy_live_sessions {live_sessions}",
            "# HELP harbor_proxy_call_latency_seconds Seconds from accepting a call to the engine's complete reply.",
            "# TYPE harbor_proxy_call_latency_seconds histogram",
        ]
        for endpoint, counts in sorted(self._hist.items()):
            cumulative = 0
            for bound, n in zip((*LATENCY_BUCKETS, "+Inf"), counts, strict=True):
                cumulative += n
                out.append(
                    f'harbor_proxy_call_latency_seconds_bucket{{endpoint="{endpoint}",le="{bound}"}} {cumulative}'
                )
            out.append(
                f'harbor_proxy_call_latency_seconds_sum{{endpoint="{endpoint}"}} {self._hist_sum[endpoint]:.6f}'
            )
            out.append(f'harbor_proxy_call_latency_seconds_count{{endpoint="{endpoint}"}} {cumulative}')
        return "\n".join(out) + "\n"
