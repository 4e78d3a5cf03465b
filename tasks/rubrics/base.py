"""`Rubric`: a reward component written like a `torch.nn.Module`.

    class CodeRubric(Rubric):
        def __init__(self):
            super().__init__()
            self.syntax = SyntaxRubric()        # assigning a Rubric registers it as a child
            self.tests = TestPassRubric()

        def forward(self, action, observation) -> float:
            return 0.3 * self.syntax(action, observation) + 0.7 * self.tests(action, observation)

    rubric = CodeRubric()
    reward = rubric(action, observation)
    for name, child in rubric.named_rubrics():
        print(name, child.last_score)            # every part's contribution stays visible

`forward` may be sync or `async def`; calling an async rubric returns a coroutine to await. A rubric
that cannot compute a score returns None (unscoreable), never a made-up 0.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

from tasks.rubrics.errors import RubricCallError, RubricConfigError

Score = float | None
PreHook = Callable[["Rubric", Any, Any], Any]
Hook = Callable[["Rubric", Any, Any, Score], Any]

_hook_ids = itertools.count()


class RemovableHandle:
    """Returned by `register_forward_hook`; `remove()` unregisters the hook (as in torch)."""

    def __init__(self, hooks: dict[int, Any], key: int) -> None:
        self._hooks = hooks
        self.key = key

    def remove(self) -> None:
        self._hooks.pop(self.key, None)


def check_score(value: Any, rubric: Rubric) -> Score:
    """A rubric's result as a float (or None); anything else is the rubric author's bug."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RubricCallError(f"{type(rubric).__name__}.forward returned {value!r}; expected a float or None")
    if not math.isfinite(value):
        raise RubricCallError(f"{type(rubric).__name__}.forward returned {value!r}; scores must be finite")
    return float(value)


class Rubric:
    """Base class of every reward component. Subclasses implement `forward(action, observation)`."""

    _state_keys: tuple[str, ...] = ()
    """Plain attributes (configuration or state) that `state_dict()` saves besides `last_score`."""

    def __init__(self) -> None:
        # object.__setattr__: our own __setattr__ needs these to exist already.
        object.__setattr__(self, "_rubric_children", {})
        object.__setattr__(self, "_forward_hooks", {})
        object.__setattr__(self, "_forward_pre_hooks", {})
        object.__setattr__(self, "last_score", None)

    # -- child registration --------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        children = self.__dict__.get("_rubric_children")
        if children is None:
            raise RubricConfigError(
                f"{type(self).__name__}.__init__ must call super().__init__() before setting {name!r}"
            )
        if isinstance(value, Rubric):
            children[name] = value
        else:
            children.pop(name, None)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self._rubric_children.pop(name, None)
        object.__delattr__(self, name)

    def named_children(self) -> Iterator[tuple[str, Rubric]]:
        yield from self._rubric_children.items()

    def children(self) -> Iterator[Rubric]:
        yield from self._rubric_children.values()

    def named_rubrics(self, prefix: str = "") -> Iterator[tuple[str, Rubric]]:
        """Every descendant (not self), depth first, with its dotted path (`tests.unit`)."""
        for name, child in self._rubric_children.items():
            path = f"{prefix}.{name}" if prefix else name
            yield path, child
            yield from child.named_rubrics(path)

    def rubrics(self) -> Iterator[Rubric]:
        for _, rubric in self.named_rubrics():
            yield rubric

    def get_rubric(self, path: str) -> Rubric:
        """The descendant at dotted `path`; KeyError names the missing part."""
        node: Rubric = self
        for part in path.split("."):
            try:
                node = node._rubric_children[part]
            except KeyError:
                known = ", ".join(node._rubric_children) or "none"
                raise KeyError(f"no child rubric {part!r} in {path!r} (children: {known})") from None
        return node

    # -- hooks ---------------------------------------------------------------------------------

    def register_forward_hook(self, hook: Hook) -> RemovableHandle:
        """`hook(rubric, action, observation, score)` runs after every forward (async hooks are awaited
        on the async path)."""
        key = next(_hook_ids)
        self._forward_hooks[key] = hook
        return RemovableHandle(self._forward_hooks, key)

    def register_forward_pre_hook(self, hook: PreHook) -> RemovableHandle:
        """`hook(rubric, action, observation)` runs before every forward."""
        key = next(_hook_ids)
        self._forward_pre_hooks[key] = hook
        return RemovableHandle(self._forward_pre_hooks, key)

    # -- calling -------------------------------------------------------------------------------

    def forward(self, action: Any, observation: Any) -> Score:
        raise NotImplementedError(f"{type(self).__name__} must implement forward(action, observation)")

    @property
    def is_async(self) -> bool:
        """Whether calling this rubric returns a coroutine (its forward, or a child's, is async)."""
        return inspect.iscoroutinefunction(self.forward)

    def __call__(self, action: Any, observation: Any) -> Any:
        if self.is_async:
            return self._call_async(action, observation)
        for hook in list(self._forward_pre_hooks.values()):
            _refuse_awaitable(hook(self, action, observation), self, "forward pre-hook")
        score = self.forward(action, observation)
        _refuse_awaitable(score, self, "forward")
        return self._finish(action, observation, score)

    async def _call_async(self, action: Any, observation: Any) -> Score:
        for hook in list(self._forward_pre_hooks.values()):
            await _maybe_await(hook(self, action, observation))
        score = await self._forward_async(action, observation)
        score = check_score(score, self)
        self.last_score = score
        for hook in list(self._forward_hooks.values()):
            await _maybe_await(hook(self, action, observation, score))
        return score

    async def _forward_async(self, action: Any, observation: Any) -> Score:
        """The async path's forward; containers override it to await their children."""
        return await _maybe_await(self.forward(action, observation))

    def _finish(self, action: Any, observation: Any, score: Any) -> Score:
        score = check_score(score, self)
        self.last_score = score
        for hook in list(self._forward_hooks.values()):
            _refuse_awaitable(hook(self, action, observation, score), self, "forward hook")
        return score

    # -- state ---------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget per-episode state (here: last scores), in this rubric and every descendant."""
        self.last_score = None
        for child in self.children():
            child.reset()

    def state_dict(self) -> dict[str, Any]:
        """Flat `{dotted.key: value}` of `last_score` and each rubric's `_state_keys`, descendants included."""
        state: dict[str, Any] = {}
        for prefix, rubric in [("", self), *self.named_rubrics()]:
            for key in ("last_score", *rubric._state_keys):
                state[f"{prefix}.{key}" if prefix else key] = _copy(getattr(rubric, key))
        return state

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Restore what `state_dict()` saved; with `strict`, unknown or missing keys are an error."""
        own = self.state_dict()
        unknown = sorted(set(state) - set(own))
        missing = sorted(set(own) - set(state))
        if strict and (unknown or missing):
            raise RubricConfigError(f"state_dict mismatch: unknown keys {unknown}, missing keys {missing}")
        for key, value in state.items():
            if key not in own:
                continue
            path, _, attr = key.rpartition(".")
            target = self.get_rubric(path) if path else self
            object.__setattr__(target, attr, _copy(value))

    def __repr__(self) -> str:
        children = ", ".join(f"{name}={type(child).__name__}" for name, child in self.named_children())
        return f"{type(self).__name__}({children})"


def _copy(value: Any) -> Any:
    return (
        list(value) if isinstance(value, list | tuple) else dict(value) if isinstance(value, dict) else value
    )


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _refuse_awaitable(value: Any, rubric: Rubric, what: str) -> None:
    """A coroutine reached the sync path: never let it be silently dropped (its work would not run)."""
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()
        raise RubricCallError(
            f"{type(rubric).__name__}: the {what} returned an awaitable on the sync path; declare it "
            "`async def` (forward) so the rubric is called with `await`"
        )
