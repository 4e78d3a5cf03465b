"""The Gradio trace inspector: a filtered, sorted, paged rollout list; one rollout's page; per-run rewards.

`create_inspector(store_url)` builds the Blocks; `mount_inspector(app, store_url)` serves them inside a
FastAPI app (`harbor serve --inspector`); `harbor inspect` runs them on their own. The store is
opened read-only (db.py) and every list is one SQL query (queries.py), so the pages stay quick with
10,000 rollouts. A rollout opens from the list (click its row), by id, or by URL: `?rollout=<id>`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import gradio as gr
import pandas as pd
from sqlalchemy import Engine

from capture_proxy.store.engine import redact
from inspector.db import open_readonly
from inspector.errors import InspectorError, InvalidQuery
from inspector.queries import (
    NO_RUN,
    PURPOSES,
    RolloutPage,
    RolloutQuery,
    count_rollouts,
    distinct_values,
    list_rollouts,
    load_rollout,
    reward_by_policy_version,
)
from inspector.render import (
    STYLE,
    TokenDecoder,
    build_view,
    esc,
    fmt_reward,
    render_rollout,
    render_turn_tokens,
)
from inspector.tokens import TokenizerFinder, TokenText

ALL = "(all)"
STATUSES = ["running", "completed", "failed", "timed_out", "cancelled"]
SORTS = {
    "newest first": ("created_at", True),
    "oldest first": ("created_at", False),
    "reward, high to low": ("reward", True),
    "reward, low to high": ("reward", False),
    "most turns": ("num_turns", True),
    "longest": ("duration", True),
    "policy version, newest": ("policy_version", True),
    "policy version, oldest": ("policy_version", False),
    "task id": ("task_id", False),
    "status": ("status", False),
}
LIST_COLUMNS = [
    "rollout",
    "purpose",
    "task",
    "dataset",
    "harness",
    "status",
    "reward",
    "turns",
    "policy v",
    "run",
    "created (UTC)",
    "duration s",
]

LIST_WIDTHS = {
    "rollout": "125px", "purpose": "80px", "task": "145px", "dataset": "90px", "harness": "112px",
    "status": "98px", "reward": "75px", "turns": "60px", "policy v": "80px", "run": "110px",
    "created (UTC)": "165px", "duration s": "95px",
}  # fmt: skip

ANCHOR_TOKEN_VIEWS = """
// A turn's context comes first in its token box and fills it: open each box at its first trained
// token (render.py marks it `.anchor`), a few lines of context above it. Boxes are placed once they
// have a size (a box drawn in a tab not shown yet has none) and again whenever the HTML is replaced.
const place = (box) => {
  const first = box.querySelector('.tok.anchor');
  if (!first || box.dataset.anchored || !box.clientHeight) return;
  box.scrollTop = Math.max(0, first.offsetTop - 3 * first.offsetHeight);
  box.dataset.anchored = '1';
};
const sized = new ResizeObserver((entries) => entries.forEach((entry) => place(entry.target)));
const anchorAll = () => element.querySelectorAll('.tokens').forEach((box) => {
  sized.observe(box);
  place(box);
});
new MutationObserver(anchorAll).observe(element, { childList: true, subtree: true });
anchorAll();
"""


def parse_date(text: str | None, field: str, *, end: bool = False) -> float | None:
    """`YYYY-MM-DD` or an ISO date-time (UTC unless it says otherwise) -> Unix seconds.

    A plain date used as an end bound means the end of that day.
    """
    text = (text or "").strip()
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidQuery(f"{field}: {text!r} is not a date (use YYYY-MM-DD or YYYY-MM-DDTHH:MM)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    ts = parsed.timestamp()
    return ts + 86_400 if end and len(text) == 10 else ts


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _none_if_blank(value: Any) -> Any:
    return None if value in (None, "", ALL) else value


def parse_number(text: str | float | None, field: str, *, integer: bool = False) -> float | int | None:
    """A bound typed into the list's filters; blank means no bound."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    try:
        value = float(text)
    except ValueError:
        raise InvalidQuery(f"{field}: {text!r} is not a number") from None
    if integer:
        if not value.is_integer():
            raise InvalidQuery(f"{field}: a policy version is a whole number, got {text!r}")
        return int(value)
    return value


class Inspector:
    """The inspector's read-only view of one store; the Gradio callbacks are thin wrappers over these.

    `decode` (from `--tokenizer`) shows every rollout's token text; without it each rollout's tokenizer
    is found from its session's model (inspector.tokens), and a rollout whose tokenizer is not found
    shows token ids with a note that says so."""

    def __init__(self, store_url: str, *, decode: TokenDecoder | None = None):
        self.store_url = store_url
        self.engine: Engine = open_readonly(store_url)
        self.decode = decode
        self.tokenizers = TokenizerFinder()

    def close(self) -> None:
        self.engine.dispose()

    def token_text(self, model: str | None) -> TokenText:
        if self.decode is not None:
            return TokenText(self.decode, "token text from the tokenizer given (--tokenizer)")
        return self.tokenizers.for_model(model)

    def rollout_html(self, session_id: str) -> str:
        view = build_view(load_rollout(self.engine, session_id))
        text = self.token_text(view.record.model)
        return render_rollout(view, text.decode, text.note)

    def turn_tokens_html(self, session_id: str, index: int) -> str:
        view = build_view(load_rollout(self.engine, session_id))
        text = self.token_text(view.record.model)
        return render_turn_tokens(view, index, text.decode, text.note)

    def page(self, query: RolloutQuery) -> RolloutPage:
        return list_rollouts(self.engine, query)

    def page_frame(self, page: RolloutPage) -> pd.DataFrame:
        rows = [
            [
                r.session_id,
                r.purpose,
                r.task_id or "",
                r.dataset or "",
                r.harness or "",
                r.status,
                fmt_reward(r.reward),
                r.num_turns,
                "" if r.policy_version is None else r.policy_version,
                r.run or NO_RUN,
                datetime.fromtimestamp(r.created_at, UTC).strftime("%Y-%m-%d %H:%M:%S"),
                "" if r.duration_s is None else f"{r.duration_s:.2f}",
            ]
            for r in page.rows
        ]
        return pd.DataFrame(rows, columns=LIST_COLUMNS)

    def run_frame(self, run: str | None) -> pd.DataFrame:
        rows = reward_by_policy_version(self.engine, None if run in (None, "", ALL) else run)
        return pd.DataFrame(
            [
                {
                    "policy_version": r.policy_version,
                    # Rounded here: a mean over a few rollouts printed whole (0.0008229959187443814)
                    # says nothing more and is hard to read.
                    "mean_reward": _round(r.mean_reward),
                    "min_reward": _round(r.min_reward),
                    "max_reward": _round(r.max_reward),
                    "rollouts": r.rollouts,
                    "scored": r.scored,
                }
                for r in rows
            ],
            columns=["policy_version", "mean_reward", "min_reward", "max_reward", "rollouts", "scored"],
        )

    def filter_choices(self) -> dict[str, list[str]]:
        return {
            "dataset": [ALL, *distinct_values(self.engine, "dataset")],
            "harness": [ALL, *distinct_values(self.engine, "harness")],
            "run": [ALL, *distinct_values(self.engine, "run"), NO_RUN],
        }


def build_query(
    dataset: str | None,
    task: str | None,
    harness: str | None,
    statuses: list[str] | None,
    reward_min: str | None,
    reward_max: str | None,
    pv_min: str | None,
    pv_max: str | None,
    date_from: str | None,
    date_to: str | None,
    run: str | None,
    sort: str,
    page: float | None,
    page_size: float | None,
    purpose: str | None = ALL,
) -> RolloutQuery:
    """The list's widgets -> a validated RolloutQuery; InvalidQuery names the bad widget."""
    if sort not in SORTS:
        raise InvalidQuery(f"sort: unknown order {sort!r}; choose one of {', '.join(SORTS)}")
    key, descending = SORTS[sort]
    try:
        return RolloutQuery(
            dataset=_none_if_blank(dataset),
            task=_none_if_blank((task or "").strip()),
            harness=_none_if_blank(harness),
            statuses=list(statuses or []),
            reward_min=parse_number(reward_min, "reward from"),
            reward_max=parse_number(reward_max, "reward to"),
            policy_version_min=parse_number(pv_min, "policy version from", integer=True),
            policy_version_max=parse_number(pv_max, "policy version to", integer=True),
            created_from=parse_date(date_from, "created from"),
            created_to=parse_date(date_to, "created to", end=True),
            run=_none_if_blank(run),
            purpose=_none_if_blank(purpose),
            sort=key,
            descending=descending,
            page=int(page or 1),
            page_size=int(page_size or 50),
        )
    except ValueError as exc:
        if isinstance(exc, InvalidQuery):
            raise
        raise InvalidQuery(f"filters: {exc}") from None


def create_inspector(
    store_url: str, *, decode: TokenDecoder | None = None, inspector: Inspector | None = None
) -> gr.Blocks:
    """The inspector's Gradio Blocks on the store at `store_url` (opened read-only now)."""
    insp = inspector or Inspector(store_url, decode=decode)
    with gr.Blocks(title="Harbor-RL trace inspector", analytics_enabled=False) as demo:
        gr.HTML(
            f"{STYLE}{LIST_STYLE}<div class='hri hri-head'><h2>Harbor-RL trace inspector</h2>"
            f"<span>store <code>{esc(redact(store_url))}</code> &middot; read-only</span></div>"
        )
        with gr.Tabs(selected="list") as tabs:
            with gr.Tab("Rollouts", id="list"):
                list_widgets = _list_tab(insp, demo)
            with gr.Tab("Rollout", id="rollout"):
                with gr.Row(equal_height=True):
                    open_id = gr.Textbox(label="Rollout id", scale=4, elem_id="open-id")
                    open_btn = gr.Button("Open", scale=1, elem_id="open-btn")
                    turn_no = gr.Number(
                        value=0, precision=0, minimum=0, label="Tokens of turn", scale=1, elem_id="turn-no"
                    )
                    turn_btn = gr.Button("Show its tokens", scale=1, elem_id="turn-btn")
                turn_html = gr.HTML("", elem_id="turn-tokens", js_on_load=ANCHOR_TOKEN_VIEWS)
                rollout_html = gr.HTML(
                    "<p>Pick a rollout in the list.</p>",
                    elem_id="rollout-view",
                    js_on_load=ANCHOR_TOKEN_VIEWS,
                )
            with gr.Tab("Runs", id="runs"):
                _runs_tab(insp, demo)

        def open_rollout(session_id: str) -> tuple[str, Any, str, str]:
            session_id = (session_id or "").strip()
            if not session_id:
                return "<p>Pick a rollout in the list.</p>", gr.Tabs(selected="rollout"), "", ""
            try:
                body = insp.rollout_html(session_id)
            except InspectorError as exc:
                body = f"<div class='hri'><p class='error'>{esc(exc)}</p></div>"
            return body, gr.Tabs(selected="rollout"), session_id, ""

        def open_selected(ids: list[str], evt: gr.SelectData) -> tuple[str, Any, str, str]:
            row = evt.index[0] if isinstance(evt.index, list | tuple) else evt.index
            if not isinstance(row, int) or not 0 <= row < len(ids):
                return open_rollout("")
            return open_rollout(ids[row])

        def open_from_url(request: gr.Request) -> tuple[Any, ...]:
            session_id = request.query_params.get("rollout") if request else None
            if not session_id:
                return gr.skip(), gr.skip(), gr.skip(), gr.skip()
            return open_rollout(session_id)

        def show_turn(session_id: str, index: float | None) -> str:
            try:
                return insp.turn_tokens_html((session_id or "").strip(), int(index or 0))
            except (InspectorError, IndexError) as exc:
                return f"<div class='hri'><p class='error'>{esc(exc)}</p></div>"

        turn_btn.click(show_turn, inputs=[open_id, turn_no], outputs=turn_html)
        outputs = [rollout_html, tabs, open_id, turn_html]
        open_btn.click(open_rollout, inputs=open_id, outputs=outputs, api_name="open_rollout")
        open_id.submit(open_rollout, inputs=open_id, outputs=outputs)
        list_widgets["table"].select(open_selected, inputs=list_widgets["ids"], outputs=outputs)
        demo.load(open_from_url, inputs=None, outputs=outputs)
    demo.inspector = insp  # type: ignore[attr-defined]
    return demo


LIST_STYLE = """
<style>
/* The list page's first screen is the list: filters in one row, the rest folded away, compact rows. */
#list-filters, #list-pager { gap: 8px; align-items: end; }
#list-pager { align-items: center; }
#list-info p { margin: 0; }
#rollout-table .virtual-row, #rollout-table .body-cell .cell-wrap { min-height: 0; }
#rollout-table .body-cell .cell-wrap { padding-top: 2px; padding-bottom: 2px; }
#rollout-table .body-cell .cell-wrap > span { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
#rollout-table .header-cell .cell-wrap { min-height: 0; padding-top: 4px; padding-bottom: 4px; }
#rollout-table .body-cell, #rollout-table .header-cell { font-size: 13px; line-height: 18px; }
.hri-head { display: flex; gap: 12px; align-items: baseline; }
.hri-head h2 { margin: 0; }
</style>
"""


def _list_tab(insp: Inspector, demo: gr.Blocks) -> dict[str, Any]:
    choices = insp.filter_choices()
    # The filters a user reaches for first, in one row; the rest folded below it, so the list's first
    # screen (1400x900) shows 20 rows and more.
    with gr.Row(equal_height=True, elem_id="list-filters"):
        purpose = gr.Dropdown(
            [ALL, *PURPOSES], value=ALL, label="Purpose", elem_id="f-purpose", scale=1, min_width=110
        )
        run = gr.Dropdown(choices["run"], value=ALL, label="Run", elem_id="f-run", scale=2, min_width=140)
        dataset = gr.Dropdown(
            choices["dataset"], value=ALL, label="Dataset", elem_id="f-dataset", scale=2, min_width=120
        )
        harness = gr.Dropdown(
            choices["harness"], value=ALL, label="Harness", elem_id="f-harness", scale=2, min_width=120
        )
        task = gr.Textbox(label="Task id contains", elem_id="f-task", scale=2, min_width=120)
        sort = gr.Dropdown(list(SORTS), value="newest first", label="Sort", elem_id="f-sort", scale=2)
        search = gr.Button("Search", variant="primary", elem_id="search-btn", scale=1, min_width=80)
    more = gr.Accordion(
        "More filters: status, reward, policy version, dates", open=False, elem_id="more-filters"
    )
    with more, gr.Row():
        statuses = gr.CheckboxGroup(STATUSES, label="Status (none = all)", elem_id="f-status", scale=3)
        # Textboxes, not gr.Number: an empty bound must mean "no bound", and Number sends 0.
        reward_min = gr.Textbox(label="Reward from", elem_id="f-reward-min", min_width=90)
        reward_max = gr.Textbox(label="Reward to", elem_id="f-reward-max", min_width=90)
        pv_min = gr.Textbox(label="Policy version from", elem_id="f-pv-min", min_width=90)
        pv_max = gr.Textbox(label="Policy version to", elem_id="f-pv-max", min_width=90)
        date_from = gr.Textbox(label="Created from (YYYY-MM-DD, UTC)", elem_id="f-date-from", min_width=120)
        date_to = gr.Textbox(label="Created to (YYYY-MM-DD, inclusive)", elem_id="f-date-to", min_width=120)
    with gr.Row(equal_height=True, elem_id="list-pager"):
        with gr.Column(scale=6):
            info = gr.Markdown(elem_id="list-info")
        prev_btn = gr.Button("< Previous", elem_id="prev-btn", size="sm", scale=1, min_width=90)
        page = gr.Number(
            value=1, label="Page", precision=0, minimum=1, elem_id="f-page", scale=1, min_width=70,
            container=False,
        )  # fmt: skip
        next_btn = gr.Button("Next >", elem_id="next-btn", size="sm", scale=1, min_width=90)
        page_size = gr.Dropdown(
            [25, 50, 100, 200, 500], value=50, label="per page", elem_id="f-page-size", scale=1, min_width=80,
            container=False,
        )  # fmt: skip
    table = gr.Dataframe(
        headers=LIST_COLUMNS,
        interactive=False,
        wrap=False,
        elem_id="rollout-table",
        max_height=1200,
        buttons=[],
        # Every column in 1400 px: a rollout id (32 characters) is cut short with an ellipsis; the row
        # opens the rollout, whose page shows the whole id.
        column_widths=[LIST_WIDTHS[c] for c in LIST_COLUMNS],
    )
    ids = gr.State([])
    filters = [
        dataset,
        task,
        harness,
        statuses,
        reward_min,
        reward_max,
        pv_min,
        pv_max,
        date_from,
        date_to,
        run,
        sort,
        purpose,
    ]

    def refresh(*values: Any) -> tuple[Any, ...]:
        *filter_values, purpose_value, page_no, size = values
        started = time.perf_counter()
        try:
            query = build_query(*filter_values, page_no, size, purpose=purpose_value)
            result = insp.page(query)
        except InspectorError as exc:
            return gr.skip(), gr.skip(), f"**Cannot list rollouts:** {exc}", gr.skip()
        took = (time.perf_counter() - started) * 1000
        shown = (
            f"{result.total} rollout(s) match of {count_rollouts(insp.engine)} &middot; page {result.page} of "
            f"{result.pages} ({result.page_size} a page) &middot; {took:.0f} ms &middot; click a row to open it"
        )
        return insp.page_frame(result), [r.session_id for r in result.rows], shown, result.page

    def step(delta: int) -> Callable[..., tuple[Any, ...]]:
        def go(*values: Any) -> tuple[Any, ...]:
            *rest, page_no, size = values
            return refresh(*rest, max(1, int(page_no or 1) + delta), size)

        return go

    outputs = [table, ids, info, page]

    def first_page(*values: Any) -> tuple[Any, ...]:
        """A new filter, order or page size starts at page 1."""
        return refresh(*values[:-2], 1, values[-1])

    search.click(first_page, inputs=[*filters, page, page_size], outputs=outputs)
    prev_btn.click(step(-1), inputs=[*filters, page, page_size], outputs=outputs)
    next_btn.click(step(+1), inputs=[*filters, page, page_size], outputs=outputs)
    page.submit(refresh, inputs=[*filters, page, page_size], outputs=outputs)
    for picker in (sort, purpose, run, dataset, harness, page_size):
        picker.input(first_page, inputs=[*filters, page, page_size], outputs=outputs)
    demo.load(refresh, inputs=[*filters, page, page_size], outputs=outputs)
    return {"table": table, "ids": ids}


def _runs_tab(insp: Inspector, demo: gr.Blocks) -> None:
    runs = insp.filter_choices()["run"]
    with gr.Row():
        run = gr.Dropdown(runs, value=ALL, label="Run", elem_id="runs-run")
        show = gr.Button("Show", elem_id="runs-show")
    plot = gr.LinePlot(
        x="policy_version",
        y="mean_reward",
        title="Mean reward over policy version",
        x_title="policy version",
        y_title="mean reward (unscoreable rollouts left out)",
        elem_id="runs-plot",
    )
    table = gr.Dataframe(interactive=False, elem_id="runs-table")

    def update(name: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        frame = insp.run_frame(name)
        plotted = frame.dropna(subset=["policy_version", "mean_reward"])
        return plotted, frame

    show.click(update, inputs=run, outputs=[plot, table])
    run.change(update, inputs=run, outputs=[plot, table])
    demo.load(update, inputs=run, outputs=[plot, table])


def mount_inspector(
    app: Any, store_url: str, path: str = "/inspect", *, decode: TokenDecoder | None = None
) -> Any:
    """Serve the inspector under `path` of a FastAPI app (what `harbor serve --inspector` calls)."""
    demo = create_inspector(store_url, decode=decode)
    return gr.mount_gradio_app(app, demo, path=path)
