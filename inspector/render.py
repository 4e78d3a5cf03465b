"""HTML for one rollout: summary, findings, verifier output, each turn's messages and tool calls, and a
token view that shows exactly which tokens are trained on.

Pure functions from stored data to HTML strings (no Gradio here), so they are tested and benchmarked
on their own. Every piece of stored text is escaped. Token view conventions, relied on by the tests and
documented in the legend:

- each token is `<span class="tok m1|m0 [gen]" data-token-id data-mask data-pos title="...">`;
- class `m1` (trained, loss mask 1): green, the background stronger the less likely the sampled token
  was (alpha grows with -logprob), so surprising tokens stand out;
- class `m0` (context, mask 0): grey; `gen` marks completion tokens that are context anyway
  (discarded or auxiliary turns), which keep their logprob in the title;
- class `anchor` marks the token a view opens at: its first trained token (or, with none, its first
  sampled one). A turn's context comes first and fills the box, so the app scrolls each box there.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson

from capture_proxy.errors import InvalidTraceError
from capture_proxy.graph import RolloutGraph, build_rollout_graph, finalize_trace
from capture_proxy.models import TrainingTurn
from capture_proxy.store.records import ROLLOUT_KEY, SessionRecord
from capture_proxy.validation import Finding, Severity, validate_trace
from inspector.graph_view import render_graph
from inspector.queries import StoredRollout

TokenDecoder = Callable[[int], str]
"""Token id -> its text; without one the token view shows ids."""

MAX_CONTEXT_TOKENS_PER_TURN = 2_000
"""New context tokens shown per turn (the rest are counted, not drawn): keeps a page fast."""
MAX_COMPLETION_TOKENS_PER_TURN = 8_000
MAX_TOKENS_PER_PAGE = 40_000
"""Token spans drawn on one rollout page; later turns' token views are drawn one at a time on request
(a span costs ~150 bytes of HTML: a long rollout drawn whole would be tens of MB in the browser)."""

STYLE = """
<style>
.hri { font-family: ui-sans-serif, system-ui, sans-serif; font-size: 14px; color: #111827; }
.hri h2 { font-size: 18px; margin: 12px 0 6px; } .hri h3 { font-size: 15px; margin: 10px 0 4px; }
.hri table.kv { border-collapse: collapse; margin: 4px 0; }
.hri table.kv td, .hri table.kv th { border: 1px solid #e5e7eb; padding: 2px 8px; text-align: left; }
.hri .badge { display: inline-block; padding: 0 6px; border-radius: 8px; font-size: 12px; }
.hri .st-completed { background: #dcfce7; } .hri .st-failed, .hri .st-timed_out { background: #fee2e2; }
.hri .st-running { background: #dbeafe; } .hri .st-cancelled { background: #f3f4f6; }
.hri .sev-FATAL { background: #fecaca; } .hri .sev-WARN { background: #fef3c7; } .hri .sev-INFO { background: #e0f2fe; }
.hri .role-agent { background: #dbeafe; } .hri .role-discarded { background: #e5e7eb; text-decoration: line-through; }
.hri .role-auxiliary { background: #ffedd5; }
.hri pre { background: #f9fafb; border: 1px solid #e5e7eb; padding: 6px; white-space: pre-wrap;
  max-height: 320px; overflow: auto; font-size: 12px; }
.hri .msg { border-left: 3px solid #d1d5db; padding: 2px 8px; margin: 4px 0; }
.hri .msg-assistant { border-color: #16a34a; } .hri .msg-tool { border-color: #f59e0b; }
.hri .msg-user { border-color: #2563eb; } .hri .msg-system { border-color: #6b7280; }
.hri .msg .who { font-weight: 600; font-size: 12px; color: #374151; }
.hri .toolcall { background: #fffbeb; border: 1px dashed #f59e0b; padding: 2px 6px; margin: 2px 0; }
.hri .tokens { font-family: ui-monospace, monospace; font-size: 12px; line-height: 1.9; white-space: pre-wrap;
  word-break: break-all; border: 1px solid #e5e7eb; padding: 6px; max-height: 480px; overflow: auto;
  position: relative; }
.hri .tok { border-radius: 2px; }
.hri .tok.m1 { background-color: rgba(22, 163, 74, var(--a, 0.5)); box-shadow: inset 0 -2px 0 #15803d; }
.hri .tok.m0 { background-color: rgb(229, 231, 235); color: #4b5563; }
.hri .tok.m0.gen { background-color: rgb(209, 213, 219); box-shadow: inset 0 -2px 0 #9ca3af; }
.hri .elided { color: #6b7280; font-style: italic; }
.hri .token-text { color: #374151; font-size: 12px; }
.hri details.turn { border: 1px solid #e5e7eb; border-radius: 6px; margin: 6px 0; padding: 4px 8px; }
.hri details.turn > summary { cursor: pointer; }
</style>
"""


@dataclass(frozen=True)
class RolloutView:
    """What the rollout page shows, computed once from the stored rollout."""

    record: SessionRecord
    turns: list[TrainingTurn]
    """Turns with masks as training sees them (non-agent turns zeroed), or as stored when the graph
    cannot be built."""
    graph: RolloutGraph | None
    graph_error: str | None
    findings: list[Finding]


def build_view(rollout: StoredRollout) -> RolloutView:
    """Validate the rollout and lay out its graph; a broken trace still renders, with its findings."""
    trace = rollout.record.trace(rollout.turns)
    findings = validate_trace(trace)
    try:
        final = finalize_trace(trace)
        graph = build_rollout_graph(final.turns)
    except InvalidTraceError as exc:
        return RolloutView(rollout.record, rollout.turns, None, str(exc), findings)
    return RolloutView(rollout.record, final.turns, graph, None, findings)


# -- small helpers ------------------------------------------------------------------------------------


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def fmt_number(value: float) -> str:
    """At most 4 decimals, trailing zeros dropped (1.0 -> `1`, 0.0008229959 -> `0.0008`); a non-zero
    value that would round to 0 keeps its size in scientific notation (`3.1e-06`), never `0`."""
    if value != 0 and abs(value) < 5e-5:
        return f"{value:.1e}"
    return f"{round(value, 4):.10g}"


def fmt_reward(value: float | None) -> str:
    """None is unscoreable, and says so: it is never shown as 0."""
    return "unscoreable" if value is None else fmt_number(value)


def fmt_time(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _kv_table(rows: Sequence[tuple[str, Any]], *, cls: str = "kv") -> str:
    body = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="{cls}">{body}</table>'


def _facts(record: SessionRecord) -> dict[str, Any]:
    facts = record.metadata.get(ROLLOUT_KEY)
    return dict(facts) if isinstance(facts, Mapping) else {}


# -- summary -------------------------------------------------------------------------------------------


def tool_calls_by_name(turns: Sequence[TrainingTurn]) -> Counter[str]:
    """Tool calls the model asked for, counted from the responses it sent."""
    counts: Counter[str] = Counter()
    for turn in turns:
        for choice in turn.response.get("choices") or ():
            message = choice.get("message") if isinstance(choice, Mapping) else None
            for call in (message or {}).get("tool_calls") or ():
                name = ((call or {}).get("function") or {}).get("name") or "?"
                counts[name] += 1
    return counts


def render_summary(view: RolloutView) -> str:
    record = view.record
    facts = _facts(record)
    versions = sorted(
        {t.metadata.policy_version for t in view.turns if t.metadata.policy_version is not None}
    )
    trained = sum(sum(t.loss_mask) for t in view.turns)
    total = sum(len(t.loss_mask) for t in view.turns)
    duration = None if record.finished_at is None else record.finished_at - record.created_at
    rows = [
        ("rollout", f"<code>{esc(record.session_id)}</code>"),
        ("task", f'<span class="task-id">{esc(record.task_id or "-")}</span>'),
        ("dataset", esc(facts.get("split") or record.metadata.get("dataset") or "-")),
        ("harness / sandbox", f"{esc(record.harness or '-')} / {esc(record.sandbox or '-')}"),
        ("model", esc(record.model)),
        ("status", f'<span class="badge st-{esc(record.status)}">{esc(record.status)}</span>'),
        ("purpose", esc(record.purpose)),
        ("reward", f'<b class="reward">{esc(fmt_reward(record.reward))}</b>'),
        ("policy versions", esc(", ".join(map(str, versions)) or "-")),
        ("turns", f"{len(view.turns)} ({trained} of {total} tokens trained)"),
        ("created", esc(fmt_time(record.created_at))),
        ("finished", esc(fmt_time(record.finished_at))),
        ("duration", "-" if duration is None else f"{duration:.2f} s"),
    ]
    if record.error:
        rows.append(("error", f"<pre>{esc(record.error)}</pre>"))
    parts = [f"<h2>Rollout</h2>{_kv_table(rows, cls='kv summary')}"]
    parts.append(_render_rewards(record))
    parts.append(_render_timings(view, facts))
    parts.append(_render_tool_counts(view, facts))
    return "".join(parts)


def _render_rewards(record: SessionRecord) -> str:
    rows = [("reward (verifier)", esc(fmt_reward(record.reward)))]
    rows += [(f"rewards/{name}", esc(fmt_reward(value))) for name, value in sorted(record.rewards.items())]
    return f"<h3>Rewards</h3>{_kv_table(rows, cls='kv rewards')}"


def _render_timings(view: RolloutView, facts: Mapping[str, Any]) -> str:
    timings = _mapping(facts.get("timings"))
    rows = [(phase, f"{float(s):.3f} s") for phase, s in timings.items() if isinstance(s, int | float)]
    latencies = [t.metadata.latency_s for t in view.turns if t.metadata.latency_s is not None]
    if latencies:
        rows.append(
            ("model calls (sum of latencies)", f"{sum(latencies):.3f} s over {len(latencies)} call(s)")
        )
    return f"<h3>Timings</h3>{_kv_table(rows, cls='kv timings')}" if rows else ""


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _render_tool_counts(view: RolloutView, facts: Mapping[str, Any]) -> str:
    asked = tool_calls_by_name(view.turns)
    reported = _mapping(facts.get("tool_calls_by_name"))
    failed = _mapping(facts.get("tool_failures_by_name"))
    names = sorted(set(asked) | set(reported) | set(failed))
    if not names and "tool_failures" not in facts:
        return "<h3>Tool calls</h3><p>none</p>"
    head = "<tr><th>tool</th><th>asked by the model</th><th>run by the harness</th><th>failed</th></tr>"
    body = "".join(
        f"<tr><td>{esc(n)}</td><td>{asked.get(n, 0)}</td><td>{esc(reported.get(n, '-'))}</td>"
        f"<td>{esc(failed.get(n, 0) if failed else '-')}</td></tr>"
        for n in names
    )
    failures = f"<p>tool failures: {esc(facts['tool_failures'])}</p>" if "tool_failures" in facts else ""
    return f'<h3>Tool calls</h3><table class="kv tools">{head}{body}</table>{failures}'


def render_findings(findings: Sequence[Finding]) -> str:
    if not findings:
        return '<h3>Findings</h3><p class="findings-none">none: the trace is valid</p>'
    order = [Severity.FATAL, Severity.WARN, Severity.INFO]
    counts = Counter(f.severity for f in findings)
    head = " ".join(f'<span class="badge sev-{s}">{s}: {counts.get(s, 0)}</span>' for s in order)
    rows = "".join(
        f'<tr class="finding sev-{f.severity}"><td>{esc(f.severity)}</td><td><code>{esc(f.code)}</code></td>'
        f"<td>{esc(f.location)}</td><td>{esc(f.message)}</td></tr>"
        for s in order
        for f in findings
        if f.severity == s
    )
    return f'<h3>Findings</h3><p>{head}</p><table class="kv findings">{rows}</table>'


def render_outputs(record: SessionRecord) -> str:
    facts = _facts(record)
    parts = ["<h3>Verifier output</h3>"]
    verifier = facts.get("verifier_output")
    parts.append(f'<pre class="verifier">{esc(verifier)}</pre>' if verifier else "<p>none recorded</p>")
    if facts.get("agent_log_tail"):
        parts.append(f"<h3>Agent log (tail)</h3><pre>{esc(facts['agent_log_tail'])}</pre>")
    return "".join(parts)


# -- messages and tool calls ---------------------------------------------------------------------------


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "") if isinstance(p, Mapping) else str(p) for p in content
        )  # text parts; images are not shown
    return orjson.dumps(content).decode()


def _pretty_arguments(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return orjson.dumps(orjson.loads(arguments), option=orjson.OPT_INDENT_2).decode()
        except orjson.JSONDecodeError:
            return arguments  # the model wrote invalid JSON: show exactly what it wrote
    return orjson.dumps(arguments, option=orjson.OPT_INDENT_2).decode()


def render_tool_call(call: Mapping[str, Any]) -> str:
    fn = call.get("function") or {}
    return (
        f'<div class="toolcall">tool call <b>{esc(fn.get("name"))}</b> '
        f'<span class="elided">{esc(call.get("id") or "")}</span>'
        f"<pre>{esc(_pretty_arguments(fn.get('arguments')))}</pre></div>"
    )


def render_message(message: Mapping[str, Any]) -> str:
    role = str(message.get("role") or "?")
    who = esc(role + (f" ({message['name']})" if message.get("name") else ""))
    if message.get("tool_call_id"):
        who += f" &larr; {esc(message['tool_call_id'])}"
    text = _content_text(message.get("content"))
    body = f"<pre>{esc(text)}</pre>" if text else ""
    calls = "".join(render_tool_call(c) for c in message.get("tool_calls") or () if isinstance(c, Mapping))
    return f'<div class="msg msg-{esc(role)}"><div class="who">{who}</div>{body}{calls}</div>'


def _messages(turn: TrainingTurn) -> list[Mapping[str, Any]]:
    messages = turn.request.get("messages")
    return [m for m in messages if isinstance(m, Mapping)] if isinstance(messages, list) else []


def _response_messages(turn: TrainingTurn) -> list[Mapping[str, Any]]:
    out = []
    for choice in turn.response.get("choices") or ():
        if isinstance(choice, Mapping):
            if isinstance(choice.get("message"), Mapping):
                out.append(choice["message"])
            elif "text" in choice:  # the completions endpoint
                out.append({"role": "assistant", "content": choice["text"]})
    return out


def new_messages(turn: TrainingTurn, parent: TrainingTurn | None) -> tuple[int, list[Mapping[str, Any]]]:
    """The request messages this turn adds to its parent's conversation (skipped count, messages).

    A child's request repeats the parent's messages and its reply; showing only what is new keeps a
    long rollout's page linear in its length.
    """
    messages = _messages(turn)
    if parent is None:
        return 0, messages
    skip = len(_messages(parent)) + len(_response_messages(parent))
    if skip > len(messages):
        return 0, messages
    return skip, messages[skip:]


def _render_request_extras(turn: TrainingTurn) -> str:
    if "prompt" in turn.request and "messages" not in turn.request:  # completions endpoint
        return f"<div class='msg msg-user'><div class='who'>prompt</div><pre>{esc(turn.request['prompt'])}</pre></div>"
    tools = turn.request.get("tools")
    if not tools:
        return ""
    names = [((t or {}).get("function") or {}).get("name", "?") for t in tools if isinstance(t, Mapping)]
    return f"<p>tools offered: {esc(', '.join(names))}</p>"


# -- token view ----------------------------------------------------------------------------------------


def _alpha(logprob: float) -> float:
    """Background strength for a trained token: 0.2 for a certain token up to 0.8 at logprob <= -4
    (capped so the text stays readable)."""
    if not math.isfinite(logprob):
        return 0.8
    return round(0.2 + 0.6 * min(1.0, max(0.0, -logprob) / 4.0), 3)


def _token_text(tid: int, decode: TokenDecoder | None) -> str:
    if decode is None:
        return f"{tid} "
    try:
        text = decode(tid)
    except Exception:  # an id outside the tokenizer's vocabulary: show the id
        return f"<{tid}>"
    return text.replace("\n", "\u21b5\n") if text else f"<{tid}>"


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x, y = np.asarray(a[:n], dtype=np.int64), np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


def render_tokens(turn: TrainingTurn, parent: TrainingTurn | None, decode: TokenDecoder | None) -> str:
    """The turn's tokens after what its parent already showed, coloured by loss mask."""
    prompt, completion = turn.prompt_token_ids, turn.completion_token_ids
    shown_from = 0
    if parent is not None:
        shown_from = shared_prefix(prompt, parent.prompt_token_ids + parent.completion_token_ids)
    start = max(shown_from, len(prompt) - MAX_CONTEXT_TOKENS_PER_TURN)
    notes = []
    if shown_from:
        notes.append(f"{shown_from} context token(s) shared with the parent turn, not repeated")
    if start > shown_from:
        notes.append(f"{start - shown_from} older context token(s) not drawn")
    out = [f'<div class="elided">{esc("; ".join(notes))}</div>' if notes else ""]
    out.append('<div class="tokens">')
    mask = turn.loss_mask
    mask_ok = len(mask) == len(prompt) + len(completion)
    drawn = range(start, len(prompt) + min(len(completion), MAX_COMPLETION_TOKENS_PER_TURN))
    anchor = next((p for p in drawn if mask_ok and mask[p]), len(prompt))
    for pos in range(start, len(prompt)):
        m = mask[pos] if mask_ok else 0
        tid = prompt[pos]
        cls = f"tok m{m}" + (" anchor" if pos == anchor else "")
        out.append(
            f'<span class="{cls}" data-token-id="{tid}" data-mask="{m}" data-pos="{pos}" '
            f'title="id {tid} &#183; prompt[{pos}] &#183; mask {m}">{esc(_token_text(tid, decode))}</span>'
        )
    logps = turn.per_token_logps
    for i, tid in enumerate(completion[:MAX_COMPLETION_TOKENS_PER_TURN]):
        pos = len(prompt) + i
        m = mask[pos] if mask_ok else 0
        lp = logps[i] if i < len(logps) else None
        lp_text = "missing" if lp is None else f"{lp:.4f}"
        style = f' style="--a:{_alpha(lp)}"' if m and lp is not None else ""
        cls = f"tok m{m}" + ("" if m else " gen") + (" anchor" if pos == anchor else "")
        out.append(
            f'<span class="{cls}" data-token-id="{tid}" data-mask="{m}" data-pos="{pos}"{style} '
            f'title="id {tid} &#183; completion[{i}] &#183; mask {m} &#183; logprob {lp_text}">'
            f"{esc(_token_text(tid, decode))}</span>"
        )
    if len(completion) > MAX_COMPLETION_TOKENS_PER_TURN:
        out.append(
            f'<span class="elided"> ... {len(completion) - MAX_COMPLETION_TOKENS_PER_TURN} more</span>'
        )
    out.append("</div>")
    return "".join(out)


TOKEN_LEGEND = (
    '<p class="legend">Tokens: <span class="tok m1" style="--a:0.3">trained (mask 1)</span> '
    '<span class="tok m1" style="--a:0.8">trained, unlikely sample</span> '
    '<span class="tok m0">context (mask 0)</span> '
    '<span class="tok m0 gen">sampled but not trained</span> '
    "&middot; green strength grows as the sampled token's logprob falls; hover a token for its id, mask "
    "and logprob. Masks are shown as training sees them (discarded and auxiliary turns zeroed).</p>"
)


def _parent(view: RolloutView, turn: TrainingTurn) -> TrainingTurn | None:
    node = view.graph.nodes.get(turn.node_id) if view.graph else None
    if node is None or node.parent is None or view.graph is None:
        return None
    return view.turns[view.graph.nodes[node.parent].index]


def drawn_tokens(view: RolloutView, index: int) -> int:
    """How many token spans the token view of turn `index` draws."""
    turn = view.turns[index]
    parent = _parent(view, turn)
    shown_from = (
        0
        if parent is None
        else shared_prefix(turn.prompt_token_ids, parent.prompt_token_ids + parent.completion_token_ids)
    )
    context = min(len(turn.prompt_token_ids) - shown_from, MAX_CONTEXT_TOKENS_PER_TURN)
    return context + min(len(turn.completion_token_ids), MAX_COMPLETION_TOKENS_PER_TURN)


def _token_text_note(note: str | None) -> str:
    return f'<p class="token-text">{esc(note)}</p>' if note else ""


def render_turn_tokens(
    view: RolloutView, index: int, decode: TokenDecoder | None = None, token_note: str | None = None
) -> str:
    """One turn's token view on its own (for turns past the page's token budget)."""
    if not 0 <= index < len(view.turns):
        raise IndexError(f"turn {index} does not exist: this rollout has turns 0..{len(view.turns) - 1}")
    turn = view.turns[index]
    return (
        f'{STYLE}<div class="hri turn-tokens" id="turn-tokens-{index}"><h3>Tokens of turn {index}</h3>'
        f"{TOKEN_LEGEND}{_token_text_note(token_note)}{render_tokens(turn, _parent(view, turn), decode)}</div>"
    )


def render_turn(
    view: RolloutView, index: int, decode: TokenDecoder | None, *, draw_tokens: bool = True
) -> str:
    turn = view.turns[index]
    node = view.graph.nodes.get(turn.node_id) if view.graph else None
    parent = _parent(view, turn)
    role = node.role if node else turn.metadata.role
    md = turn.metadata
    trained = sum(turn.loss_mask)
    head = (
        f"<b>turn {index}</b> <code>{esc(turn.node_id)}</code> "
        f'<span class="badge role-{esc(role)}">{esc(role)}</span> '
        f"parent {esc(node.parent if node and node.parent else 'none (root)')} &middot; "
        f"policy v{esc(md.policy_version if md.policy_version is not None else '?')} &middot; "
        f"{len(turn.prompt_token_ids)}+{len(turn.completion_token_ids)} tokens, {trained} trained &middot; "
        f"finish {esc(md.finish_reason or '-')} &middot; capture {esc(md.capture)}"
        + (f" &middot; {md.latency_s:.3f} s" if md.latency_s is not None else "")
    )
    skipped, messages = new_messages(turn, parent)
    skipped_note = (
        f'<p class="elided">{skipped} earlier message(s) as in the parent turn</p>' if skipped else ""
    )
    body = [
        skipped_note,
        _render_request_extras(turn),
        "".join(render_message(m) for m in messages),
        "<h3>Response</h3>",
        "".join(render_message(m) for m in _response_messages(turn)) or "<p>none</p>",
    ]
    if md.error:
        body.append(f"<p>capture error:</p><pre>{esc(md.error)}</pre>")
    body.append("<h3>Tokens</h3>")
    if draw_tokens:
        body.append(render_tokens(turn, parent, decode))
    else:
        body.append(
            f'<p class="elided tokens-omitted">not drawn here: this page already shows {MAX_TOKENS_PER_PAGE} '
            f"tokens; show them with &ldquo;Tokens of turn&rdquo; {index} above</p>"
        )
    return (
        f'<details class="turn" id="turn-{index}" data-node-id="{esc(turn.node_id)}" data-role="{esc(role)}" open>'
        f"<summary>{head}</summary>{''.join(body)}</details>"
    )


def render_rollout(
    view: RolloutView, decode: TokenDecoder | None = None, token_note: str | None = None
) -> str:
    """The whole rollout page as one HTML fragment (with its own <style>); `token_note` says above the
    token views where their text comes from, or why they show ids."""
    graph_html = (
        render_graph(view.graph, view.turns)
        if view.graph is not None
        else f"<p>the rollout graph cannot be built: {esc(view.graph_error)}</p>"
    )
    parts, budget = [], MAX_TOKENS_PER_PAGE
    for i in range(len(view.turns)):
        cost = drawn_tokens(view, i)
        draw = cost <= budget
        budget = budget - cost if draw else 0  # once one turn is skipped, later ones are too
        parts.append(render_turn(view, i, decode, draw_tokens=draw))
    turns = "".join(parts)
    return (
        f'{STYLE}<div class="hri rollout" data-session-id="{esc(view.record.session_id)}">'
        f"{render_summary(view)}{render_findings(view.findings)}"
        f"<h3>Rollout graph</h3>{graph_html}{render_outputs(view.record)}"
        f"<h2>Turns</h2>{TOKEN_LEGEND}{_token_text_note(token_note)}{turns or '<p>no turns captured</p>'}</div>"
    )
