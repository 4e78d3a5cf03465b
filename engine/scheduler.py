"""The batching generation loop: every active sequence advances one token per model forward.

A background thread owns the model. New requests are prefilled one by one (exact, no padding), then
join the running batch, whose KV cache is kept as one left-padded tensor per layer with an attention
mask. Each decode step feeds the last token of every running sequence in a single forward pass, so 16
agents cost one batched step, not 16. Results go back to each request's asyncio queue through
`call_soon_threadsafe`; the HTTP side never touches torch.

Pausing follows vLLM's modes: `abort` ends every in-flight request (finish_reason "abort"), `wait`
stops admitting and waits for running requests to finish, `keep` freezes them until resume. Weights
are swapped only between steps (under the step lock), so a step never mixes two weight versions.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from engine.errors import BadRequest, EngineStopped
from engine.kv_cache import KV, Room, cache_tensors, growing_cache, make_cache
from engine.prefix_cache import PrefixCache
from engine.sampling import SamplingSettings, processed_logprobs, sample, top_alternatives

log = logging.getLogger(__name__)

INITIAL_WEIGHT_VERSION = "default"
"""vLLM's tag for the weights it started with (`EngineCore._weight_version`, vllm/v1/engine/core.py)."""

PauseMode = Literal["abort", "wait", "keep"]


@dataclass
class TokenEvent:
    """One step of one sequence, as the HTTP side sees it."""

    token_id: int | None
    """None only on an abort event."""
    logprob: float | None
    top: list[tuple[int, float]]
    text: str
    """The whole completion text so far (stop strings already cut)."""
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass(eq=False)
class Sequence:
    """One request in flight: its prompt, settings, what it produced, and its delivery queue."""

    prompt_ids: list[int]
    settings: SamplingSettings
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    generated: list[int] = field(default_factory=list)
    text: str = ""
    version: str | None = None
    """Weight version tag when the sequence was admitted (its first token was sampled)."""
    cancelled: bool = False
    finished: bool = False
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.settings.seed is not None:
            self.generator = torch.Generator().manual_seed(self.settings.seed)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.generated)

    def emit(self, event: TokenEvent) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers 5 names the cache argument `cache`; 4.x called it `past_key_values`."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _by_prompt(seqs: list[Sequence]) -> list[list[Sequence]]:
    """`seqs` grouped by identical prompt ids, in order of first appearance."""
    groups: dict[tuple[int, ...], list[Sequence]] = {}
    for seq in seqs:
        groups.setdefault(tuple(seq.prompt_ids), []).append(seq)
    return list(groups.values())


class BatchScheduler:
    """Owns the model and runs the generation loop in one background thread."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        max_model_len: int,
        eos_token_ids: list[int],
        max_batch_size: int = 64,
        max_prefill_tokens: int = 4096,
        prefix_cache_bytes: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        self.model = model
        self.device = torch.device(device)
        """Where the model and the batch's tensors live; sampling runs on the CPU either way, so the
        seeded draws are the same on every device."""
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.eos_token_ids = set(eos_token_ids)
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.weight_version = INITIAL_WEIGHT_VERSION
        """The served weights' tag, as vLLM keeps it (`vllm/v1/engine/core.py`): "default" until a trainer
        names one at /finish_weight_update or /update_weight_version."""
        self.stats = {"steps": 0, "max_batch": 0, "tokens": 0}
        self.prefix_cache = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        """Earlier prompts' key/value tensors (None: prefix caching off)."""
        self._cache_kw = _cache_kwarg(model)
        self._cond = threading.Condition()
        self._step_lock = threading.Lock()
        self._pending: collections.deque[Sequence] = collections.deque()
        self._paused = False
        self._draining = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        # The running batch: one row per sequence, KV tensors [B, heads, L, dim] per layer.
        self._rows: list[Sequence] = []
        self._kv: KV = []
        self._room: Room | None = None
        """The buffers `_kv` views into, with space for the next tokens (None after the batch changed)."""
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="harbor-engine-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._step_lock:
            self._abort_all()

    # ---- requests (called from the event loop) ----------------------------------------------------

    def submit(self, seq: Sequence) -> None:
        if self._stopping:
            raise EngineStopped("the engine is shutting down")
        if len(seq.prompt_ids) >= self.max_model_len:
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your request "
                f"has {len(seq.prompt_ids)} input tokens. Please reduce the length of the input messages.",
                param="messages",
            )
        with self._cond:
            self._pending.append(seq)
            self._cond.notify_all()

    def cancel(self, seq: Sequence) -> None:
        """The client went away: drop the sequence at the next step, emitting nothing more."""
        seq.cancelled = True

    # ---- pause / resume / weights (blocking; call through asyncio.to_thread) -----------------------

    @property
    def is_paused(self) -> bool:
        return self._paused

    @property
    def num_running(self) -> int:
        """Sequences in the running batch (admitted and not finished)."""
        return len(self._rows)

    def pause(self, mode: PauseMode) -> None:
        if mode == "wait":
            with self._cond:
                self._draining = True
            while self._rows:
                time.sleep(0.005)
        with self._cond:
            self._paused = True
            self._draining = False
        with self._step_lock:  # returns only once no step is running
            if mode == "abort":
                self._abort_all()

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._draining = False
            self._cond.notify_all()

    def apply_weights(
        self, apply: Callable[[torch.nn.Module], None], weight_version: str | None = None
    ) -> None:
        """Run `apply(model)` between steps; a given `weight_version` becomes the served tag (vLLM's
        `finish_weight_update(weight_version)`: without one the tag stays)."""
        with self._step_lock, torch.no_grad():
            apply(self.model)
            if self.prefix_cache is not None:  # their keys and values came from the old weights
                self.prefix_cache.clear()
            if weight_version is not None:
                self.weight_version = weight_version

    def reset_prefix_cache(self) -> None:
        """Forget every cached prompt (vLLM's `reset_prefix_cache`), between steps."""
        with self._step_lock:
            if self.prefix_cache is not None:
                self.prefix_cache.clear()

    def set_weight_version(self, weight_version: str) -> None:
        """vLLM's /update_weight_version: a new tag for the weights already served."""
        with self._step_lock:
            self.weight_version = weight_version

    # ---- the loop ----------------------------------------------------------------------------------

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cond:
                while not self._stopping and (
                    self._paused or (not self._rows and (self._draining or not self._pending))
                ):
                    self._cond.wait(timeout=0.5)
                if self._stopping:
                    return
                admit = self._take_admissions()
            with self._step_lock:
                if self._paused:  # paused between the check above and here: admit later
                    with self._cond:
                        self._pending.extendleft(reversed(admit))
                    continue
                try:
                    self._step(admit)
                except Exception as exc:  # a failed step must not kill the server: fail its requests
                    log.exception("generation step failed")
                    self._fail_all(admit, exc)

    def _take_admissions(self) -> list[Sequence]:
        """Pending sequences to prefill this step (call with `_cond` held): room in the batch, and at
        most `max_prefill_tokens` prompt tokens (always at least one sequence), so a burst of long
        prompts delays the running sequences by a bounded amount per step, as vLLM's token budget does."""
        admit: list[Sequence] = []
        budget = self.max_prefill_tokens
        while self._pending and not self._draining and len(self._rows) + len(admit) < self.max_batch_size:
            size = len(self._pending[0].prompt_ids)
            if admit and size > budget:
                break
            admit.append(self._pending.popleft())
            budget -= size
        return admit

    def _step(self, admit: list[Sequence]) -> None:
        with torch.inference_mode():
            joining: list[tuple[Sequence, KV]] = []
            # The rollouts of a group send the same prompt at the same moment: one prefill serves them
            # all, each drawing its own first token from the shared logits.
            for same in _by_prompt([seq for seq in admit if not seq.cancelled]):
                logits, kv = self._prefill(same[0].prompt_ids)
                for seq in same:
                    seq.version = self.weight_version
                    if not self._advance(seq, logits):
                        joining.append((seq, kv))
            self._add_rows(joining)
            self._drop_rows([i for i, s in enumerate(self._rows) if s.cancelled])
            if self._rows:
                self._decode()

    def _forward(self, input_ids, cache, **kwargs):
        out = self.model(
            input_ids=input_ids, use_cache=True, logits_to_keep=1, **{self._cache_kw: cache}, **kwargs
        )
        return out.logits[:, -1, :], cache_tensors(cache)

    def _prefill(self, prompt_ids: list[int]) -> tuple[torch.Tensor, KV]:
        """The logits after `prompt_ids` and its keys and values (earlier prompts' cached ones reused)."""
        cache = self.prefix_cache
        cached, past = cache.lookup(prompt_ids) if cache is not None else (0, None)
        ids = torch.tensor([prompt_ids[cached:]], device=self.device)
        logits, (kv, _) = self._forward(ids, make_cache(past))
        if cache is not None:
            cache.store(prompt_ids, kv, cached)
        return logits[0], kv

    def _decode(self) -> None:
        batch = len(self._rows)
        input_ids = torch.tensor([[s.generated[-1]] for s in self._rows], device=self.device)
        positions = torch.tensor([[s.num_tokens - 1] for s in self._rows], device=self.device)
        mask = torch.cat([self._mask, torch.ones(batch, 1, dtype=torch.long, device=self.device)], dim=1)
        cache = growing_cache(self._kv, self._room)
        logits, (self._kv, self._room) = self._forward(
            input_ids, cache, attention_mask=mask, position_ids=positions
        )
        self._mask = mask
        self.stats["steps"] += 1
        self.stats["max_batch"] = max(self.stats["max_batch"], batch)
        done = [i for i, seq in enumerate(self._rows) if self._advance(seq, logits[i])]
        self._drop_rows(done)

    def _advance(self, seq: Sequence, logits: torch.Tensor) -> bool:
        """Sample the next token of `seq`, emit it, and say whether the sequence finished."""
        s = seq.settings
        logprobs = processed_logprobs(logits.float().cpu(), s)
        token = sample(logprobs, s, seq.generator)
        seq.generated.append(token)
        self.stats["tokens"] += 1
        top = top_alternatives(logprobs, s.logprobs) if s.logprobs else []
        finish, stop_reason = self._finish_reason(seq, token)
        seq.finished = finish is not None
        seq.emit(TokenEvent(token, float(logprobs[token]), top, seq.text, finish, stop_reason))
        return seq.finished

    def _finish_reason(self, seq: Sequence, token: int) -> tuple[str | None, str | int | None]:
        s = seq.settings
        previous = len(seq.text)
        seq.text = self.tokenizer.decode(seq.generated, skip_special_tokens=True)
        if token in s.stop_token_ids:
            return "stop", token
        if token in self.eos_token_ids and not s.ignore_eos:
            return "stop", None
        for stop in s.stop:
            at = seq.text.find(stop, max(0, previous - len(stop)))
            if at >= 0:
                seq.text = seq.text[: at + len(stop)] if s.include_stop_str_in_output else seq.text[:at]
                return "stop", stop
        if len(seq.generated) >= s.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length", None
        return None, None

    # ---- batch bookkeeping -------------------------------------------------------------------------

    def _add_rows(self, joining: list[tuple[Sequence, KV]]) -> None:
        """Put the prefilled sequences into the running batch: every row left-padded to the longest, in
        one concatenation per layer (one per sequence copied the whole batch once per arrival)."""
        if not joining:
            return
        self._room = None  # the batch's tensors are new ones: their room is made at the next step
        parts = ([(self._kv, self._mask)] if self._rows else []) + [
            (kv, torch.ones(1, kv[0][0].shape[2], dtype=torch.long, device=self.device)) for _, kv in joining
        ]
        total = max(mask.shape[1] for _, mask in parts)

        def left_pad(t: torch.Tensor, dim: int) -> torch.Tensor:
            missing = total - t.shape[dim]
            if missing == 0:
                return t
            shape = list(t.shape)
            shape[dim] = missing
            return torch.cat([t.new_zeros(shape), t], dim=dim)

        self._kv = [
            (torch.cat([left_pad(kv[layer][0], 2) for kv, _ in parts]),
             torch.cat([left_pad(kv[layer][1], 2) for kv, _ in parts]))
            for layer in range(len(parts[0][0]))
        ]  # fmt: skip
        self._mask = torch.cat([left_pad(mask, 1) for _, mask in parts])
        self._rows += [seq for seq, _ in joining]
        self.stats["max_batch"] = max(self.stats["max_batch"], len(self._rows))

    def _drop_rows(self, drop: list[int]) -> None:
        if not drop:
            return
        keep = [i for i in range(len(self._rows)) if i not in set(drop)]
        self._rows = [self._rows[i] for i in keep]
        self._room = None
        if not keep:
            self._kv, self._mask = [], torch.zeros(0, 0, dtype=torch.long, device=self.device)
            return
        index = torch.tensor(keep, device=self.device)
        mask = self._mask.index_select(0, index)
        # Columns that are padding in every remaining row are dead weight: cut them.
        start = int((mask.sum(0) > 0).nonzero()[0])
        self._mask = mask[:, start:]
        self._kv = [
            (k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:])
            for k, v in self._kv
        ]

    def _abort_all(self) -> None:
        with self._cond:
            pending, self._pending = list(self._pending), collections.deque()
        for seq in itertools.chain(self._rows, pending):
            if not seq.finished:
                seq.finished = True
                seq.emit(TokenEvent(None, None, [], seq.text, "abort", None))
        self._rows, self._kv, self._room = [], [], None
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)

    def _fail_all(self, admitted: list[Sequence], exc: Exception) -> None:
        message = f"generation failed: {type(exc).__name__}: {exc}"
        for seq in itertools.chain(self._rows, admitted):
            if not seq.finished:
                seq.finished = True
                seq.emit(TokenEvent(None, None, [], message, "error", None))
        self._rows, self._kv, self._room = [], [], None
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
