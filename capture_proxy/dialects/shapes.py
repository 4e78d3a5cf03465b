"""Typed request shapes of the agent dialects: the pydantic base both request models share, their unions
told apart by a tag, and the 400 a body that does not fit gets, naming the field as the agent wrote it
(`input[0].role`), not as pydantic's location reads (`('input', 'list[...]', 0, 'message', 'role')`).

A model names every field the translation reads, with its type, so nothing an agent sends is used before
it is checked: a value of the wrong type is the agent's 400, never a crash (a list where a string was
expected, used as a dict key) nor a request the engine fails on. Models are strict (no coercion: `"5"`
is no number, `1` no boolean) and ignore the fields they do not name; those are never read, and never
reach the engine either, since the chat request is built from the model alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError

from capture_proxy.dialects.base import invalid
from capture_proxy.errors import ProxyRequestError

INT64_MAX = 2**63 - 1

Int64 = Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)]
"""An integer the engine can hold: vLLM's sampling parameters are 64-bit."""
PositiveInt = Annotated[int, Field(ge=1, le=INT64_MAX)]
NonEmptyStr = Annotated[str, Field(min_length=1)]


class Shape(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class ToolSchema(Shape):
    """A tool's JSON schema, kept whole for the engine; the two keys its chat template and tool parser
    read are typed (a property's schema may be an object or, as JSON Schema allows, a boolean)."""

    model_config = ConfigDict(extra="allow")

    properties: dict[str, dict[str, Any] | bool] | None = None
    required: list[str] | None = None

    def whole(self) -> dict[str, Any]:
        """The schema as the agent sent it."""
        return self.model_dump(exclude_unset=True)


M = TypeVar("M", bound=Shape)

_KINDS: dict[str, tuple[str, str | None, str]] = {}
"""The tagged unions' own error types -> (tag key, what an unsupported kind is, the tags expected). Kept
here, not in the error's context, so that the union's annotation stays hashable (`| None` needs that)."""


def tagged(
    *models: type[Shape],
    unsupported: str | None = None,
    key: str = "type",
    default: Callable[[dict], str | None] | None = None,
) -> Any:
    """A union of `models` told apart by their `key` field (each model's Literal values are its tags).

    A tag none of them has is refused as a kind the proxy does not support (`unsupported` describes it,
    e.g. "the tool type"), or, without `unsupported`, as a value outside the closed set of tags.
    `default(item)` gives the tag of an item that has none."""
    tags = {tag: model for model in models for tag in _literals(model.model_fields[key].annotation)}
    members = tuple(Annotated[model, Tag(tag)] for tag, model in tags.items())
    own_tag = {model: tag for tag, model in reversed(tags.items())}

    def tag_of(item: Any) -> str | None:
        if isinstance(item, Shape):  # a parsed request written back (a Responses reply echoes it)
            return own_tag.get(type(item))
        if not isinstance(item, dict):
            return None
        tag = item.get(key)
        if tag is None and default is not None:
            tag = default(item)
        return tag if isinstance(tag, str) else None

    error_type = f"kind_{len(_KINDS)}"
    _KINDS[error_type] = (key, unsupported, _listed(list(tags)))
    return Annotated[
        Union[members],  # noqa: UP007 - a union built from a tuple
        Discriminator(tag_of, custom_error_type=error_type, custom_error_message=f"'{key}' is not known"),
    ]


def _literals(annotation: Any) -> list[str]:
    """The string values of a `Literal[...]` annotation, or of the Literals in a union (`| None`)."""
    if get_origin(annotation) is Literal:
        return [a for a in get_args(annotation) if isinstance(a, str)]
    return [value for arg in get_args(annotation) for value in _literals(arg)]


def parse_request(model: type[M], body: Any) -> M:
    """`body` as `model`; a ProxyRequestError (400) naming the fields that do not fit otherwise."""
    if not isinstance(body, dict):
        raise invalid(f"request body must be a JSON object, got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _refusal(exc.errors(include_url=False), body) from None


# -- the refusal ---------------------------------------------------------------------------------------

_MOST_NAMED = 3
"""Problems named in one refusal: enough to fix a body in one go, short enough to read."""
_TYPE_WORDS = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}
"""Type errors in JSON's words, as the agent wrote its body (pydantic says `dictionary`, `list`)."""
_REWORDED = (
    ("Input should be ", "must be "),
    ("String should have ", "must have "),
    ("List should have ", "must have "),
    ("Dictionary should have ", "must have "),
    ("Value error, ", ""),
)


def _refusal(errors: Sequence[dict], body: dict) -> ProxyRequestError:
    """The 400 for pydantic's `errors` on `body`: the most specific problems first, each naming its
    field; `param` is the first one's, `code` says whether it is a kind the proxy does not support."""
    problems: dict[tuple, list[dict]] = {}
    for error in errors:
        problems.setdefault(_located(error, body), []).append(error)
    # A union's other branches fail at the union itself; the deepest failure is the one that explains.
    paths = [p for p in problems if not any(q[: len(p)] == p and q != p for q in problems)]
    paths.sort(key=len, reverse=True)
    phrases = [_phrase(path, problems[path]) for path in paths]
    first_path, first_code = phrases[0][1], phrases[0][2]
    message = "; ".join(p[0] for p in phrases[:_MOST_NAMED])
    if len(phrases) > _MOST_NAMED:
        message += f" (and {len(phrases) - _MOST_NAMED} more)"
    return ProxyRequestError(400, message, param=first_path or None, code=first_code)


def _located(error: dict, body: dict) -> tuple:
    """The path of `error` in the body itself: pydantic's location also holds the union branches
    it tried (`str`, `list[...]`, a tag), which are not in the body, so they are walked past."""
    loc = error["loc"]
    path: list[Any] = []
    value: Any = body
    for i, part in enumerate(loc):
        if _holds(value, part):
            value = value[part]
        elif not (i == len(loc) - 1 and error["type"] == "missing"):
            continue
        path.append(part)
    return tuple(path)


def _holds(value: Any, part: Any) -> bool:
    """Whether `part` is a key of the JSON object or an index of the JSON array `value`."""
    if isinstance(value, dict):
        return isinstance(part, str) and part in value
    return isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value)


def _dotted(path: Sequence[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _phrase(path: tuple, errors: list[dict]) -> tuple[str, str, str]:
    """(what is wrong at `path`, the field it names, the error code)."""
    where = _dotted(path)
    error = errors[0]
    # An object where a union also takes a string (a `tool_choice`): its tagged branch explains.
    kinds = [e for e in errors if e["type"] in _KINDS and (e is error or isinstance(e["input"], dict))]
    if kinds:
        return _kind_phrase(where, kinds[0])
    if error["type"] == "missing":
        return f"'{where}' is required", where, "invalid_request"
    if error["type"] in ("too_short", "string_too_short") and error["ctx"].get("min_length") == 1:
        return f"'{where}' must not be empty", where, "invalid_request"
    words = [_TYPE_WORDS[e["type"]] for e in errors if e["type"] in _TYPE_WORDS]
    if len(words) == len(errors):
        # A union: the value is none of its branches' types.
        return f"'{where}' must be {_listed(list(dict.fromkeys(words)))}", where, "invalid_request"
    message = next(e["msg"] for e in errors if e["type"] not in _TYPE_WORDS)
    for theirs, ours in _REWORDED:
        if message.startswith(theirs):
            message = ours + message[len(theirs) :]
    return f"'{where}' {message}" if where else message, where, "invalid_request"


def _kind_phrase(where: str, error: dict) -> tuple[str, str, str]:
    """A tagged union's refusal: not an object, a tag missing or not a string, or an unknown tag."""
    item = error["input"]
    key, what, expected = _KINDS[error["type"]]
    if not isinstance(item, dict):
        return f"'{where}' must be an object", where, "invalid_request"
    at = f"{where}.{key}" if where else key
    tag = item.get(key)
    if what is None:
        return f"'{at}' must be {expected}", at, "invalid_request"
    if tag is None:
        return f"'{at}' is required", at, "invalid_request"
    if not isinstance(tag, str):
        return f"'{at}' must be a string", at, "invalid_request"
    shown = repr(tag) if len(tag) <= 40 else repr(tag[:40]) + "..."
    return f"{where}: {what} {shown} is not supported by the capture proxy", where, "unsupported"


def _listed(options: list[str]) -> str:
    """`'a', 'b' or 'c'` for tags; `a string or an array` for type words."""
    shown = [o if o.startswith(("a ", "an ")) else repr(o) for o in options]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


__all__ = ["Int64", "NonEmptyStr", "PositiveInt", "Shape", "ToolSchema", "parse_request", "tagged"]
