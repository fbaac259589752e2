"""Guards on content: checks an agent runs on a message's input before its handler, on
the handler's output before the reply, on each streamed chunk before it is sent, and on
the capabilities a handler calls onward (docs/security.md, *Guards*).

Declared per handler or per agent (the agent's run first, then the handler's)::

    app = reach.Agent("summarizer-1", capabilities=["text.summarize"],
                      guards=[Size(max_input_bytes=64_000), OnwardCalls([])])

    @app.handler("text.summarize", guards=[Deny({"ignore_instructions": r"ignore (all )?previous instructions"})])
    async def summarize(payload: dict, ctx: reach.Context) -> dict: ...

A refusal dead-letters the message at once (reason ``refused_by_guard``, never retried)
and its caller gets :class:`reach.GuardRefused` naming the ``rule``. A guard that fails
(raises anything but :class:`Refuse`) fails the attempt as a handler's error would: the
content does not pass, and the message is retried (then dead-lettered ``max_attempts``).

The built-ins: :class:`Size`, :class:`Schema`, :class:`Deny`, :class:`OnwardCalls`; any
callable ``fn(value, ctx)`` (sync or async) is a guard too (:class:`Check`). Write your
own by subclassing :class:`Guard`. This module holds what a guard is; the worker runs
them (reach._worker.guarding).
"""

from __future__ import annotations

import inspect
import re
import unicodedata
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import msgspec

from .envelope import decode_payload, encode_payload
from .errors import ConfigError, GuardRefused
from .registry import normalize_capability

if TYPE_CHECKING:
    from .context import Context

__all__ = [
    "CHUNK",
    "INPUT",
    "OUTPUT",
    "Check",
    "Content",
    "Deny",
    "Guard",
    "OnwardCalls",
    "Refuse",
    "Schema",
    "Size",
    "as_guard",
    "rule_of",
]

INPUT: Final = "input"
"""The payload, checked after it is decoded and before the handler runs."""
OUTPUT: Final = "output"
"""The handler's result (``ctx.result`` for a streaming handler), checked before the reply."""
CHUNK: Final = "chunk"
"""Each streamed chunk (``ctx.emit``, a ``yield``), checked before it is written."""
STAGES: Final = (INPUT, OUTPUT, CHUNK)

_RULE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_RULE_IN_ERROR = re.compile(r"guard rule '([A-Za-z0-9_.:-]{1,64})'")

Verdict = None | bool | str | BaseException
"""What a check returns: None or True pass; False, a reason (str) or a :class:`Refuse`
refuse."""


def check_rule(rule: str) -> str:
    """``rule`` if it is a usable rule name (1-64 letters, digits, ``_.:-``)."""
    if not isinstance(rule, str) or not _RULE.fullmatch(rule):
        raise ConfigError(
            f"Guard rule name {rule!r}: use 1-64 letters, digits or _ . : - (it is named in "
            "dead letters and the caller's error), e.g. rule='no_card_numbers'."
        )
    return rule


def refusal_text(rule: str, stage: str, capability: str, why: str) -> str:
    """The error a refusal carries (dead letter, reply): :func:`rule_of` reads it back."""
    return f"guard rule {rule!r} refused the {stage} of {capability!r}: {why}"


def rule_of(error: str) -> str:
    """The rule a refusal's error text names (``''`` when it names none)."""
    m = _RULE_IN_ERROR.search(error)
    return m.group(1) if m else ""


class Refuse(Exception):
    """Raise (or return) from a guard to refuse the content::

        raise reach.Refuse("the input holds a card number", rule="no_card_numbers")

    ``rule`` defaults to the guard's own rule name."""

    def __init__(self, message: str = "", *, rule: str | None = None) -> None:
        super().__init__(message or "refused")
        self.rule = check_rule(rule) if rule is not None else None


def _check_stages(on: Iterable[str] | str, who: str) -> frozenset[str]:
    stages = frozenset([on] if isinstance(on, str) else on)
    bad = stages - set(STAGES)
    if bad or not stages:
        raise ConfigError(
            f"{who}: on={sorted(stages)!r}: give one or more of 'input', 'output', 'chunk'."
        )
    return stages


class Content:
    """What a guard checks: ``value`` (the payload as the handler gets it, the result it
    returned, or a chunk), at ``stage`` (:data:`INPUT`, :data:`OUTPUT`, :data:`CHUNK`) of a
    message of ``capability``; ``data`` is its msgpack encoding as it travels, ``plain``
    that decoded without a type (dicts, lists, strings...: a Struct as a dict), ``texts``
    every string in it (keys included)."""

    __slots__ = ("_data", "_plain", "capability", "stage", "value")

    def __init__(self, stage: str, value: Any, capability: str, data: bytes | None = None):
        self.stage = stage
        self.value = value
        self.capability = capability
        self._data = data
        self._plain: Any = _UNSET

    @property
    def data(self) -> bytes:
        if self._data is None:
            self._data = bytes(encode_payload(self.value))
        return self._data

    @property
    def plain(self) -> Any:
        if self._plain is _UNSET:
            self._plain = decode_payload(self.data)
        return self._plain

    def texts(self) -> Iterator[str]:
        """Every string of :attr:`plain` (dict keys included; bytes read as UTF-8)."""
        todo = [self.plain]
        while todo:
            v = todo.pop()
            if isinstance(v, str):
                yield v
            elif isinstance(v, bytes | bytearray | memoryview):
                yield bytes(v).decode("utf-8", "replace")
            elif isinstance(v, dict):
                todo.extend(v.keys())
                todo.extend(v.values())
            elif isinstance(v, list | tuple):
                todo.extend(v)


_UNSET: Any = object()


class Guard:
    """A check of content. Subclass it and override :meth:`check` (a plain method runs
    inline, where the handler runs: keep it quick; an ``async def`` is awaited)::

        class NoUrls(reach.Guard):
            rule = "no_urls"
            stages = frozenset({"output"})

            def check(self, content, ctx):
                if any("http" in t for t in content.texts()):
                    return "the output holds a URL"
                return None

    ``stages`` says what it checks (``input``, ``output``, ``chunk``); ``rule`` names its
    refusals. :meth:`bind` makes the guard of one handler (a schema derived from its
    annotations)."""

    rule: str = "guard"
    stages: frozenset[str] = frozenset({INPUT})
    threaded: bool = False
    """A plain :meth:`check` that may block: run in a worker thread for an async handler."""

    def bind(self, capability: str, handler: Callable[..., Any], payload_type: Any) -> Guard:
        """This guard as it applies to ``handler`` of ``capability`` (whose payload is
        validated into ``payload_type``). By default: itself."""
        return self

    def check(self, content: Content, ctx: Context) -> Verdict | Awaitable[Verdict]:
        """None (or True) to pass; False, a reason, or a :class:`Refuse` (returned or
        raised) to refuse. Anything else raised fails the attempt (retried)."""
        raise NotImplementedError

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.check)


class Check(Guard):
    """A callable as a guard: ``fn(value, ctx)``, sync (run in a worker thread for an async
    handler, in the handler's own thread for a plain one) or async, returns None to pass,
    or a reason (str), False or a :class:`Refuse` to refuse (or raises ``Refuse``).
    ``rule`` defaults to the function's name; ``on`` to the input. A bare callable in
    ``guards=[...]`` is ``Check(fn)``."""

    def __init__(
        self,
        fn: Callable[[Any, Context], Any],
        *,
        rule: str | None = None,
        on: Iterable[str] | str = (INPUT,),
    ) -> None:
        if not callable(fn) or inspect.isclass(fn):
            raise ConfigError(f"A guard check must be a function fn(value, ctx), got {fn!r}.")
        self.fn = fn
        self.rule = check_rule(rule if rule is not None else getattr(fn, "__name__", "check"))
        self.stages = _check_stages(on, f"Check({self.rule})")
        self._async = inspect.iscoroutinefunction(fn)
        self.threaded = not self._async

    @property
    def is_async(self) -> bool:
        return self._async

    def check(self, content: Content, ctx: Context) -> Any:
        return self.fn(content.value, ctx)

    def __repr__(self) -> str:
        return f"Check({self.rule}, on={sorted(self.stages)})"


class Size(Guard):
    """Bounds on the encoded size of content: ``max_input_bytes`` (the payload, rule
    ``max_input_bytes``), ``max_output_bytes`` (the result, and each streamed chunk on its
    own; rule ``max_output_bytes``). Sizes are of the msgpack bytes as they travel."""

    def __init__(
        self, *, max_input_bytes: int | None = None, max_output_bytes: int | None = None
    ) -> None:
        for name, v in (
            ("max_input_bytes", max_input_bytes),
            ("max_output_bytes", max_output_bytes),
        ):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"Size({name}={v!r}): give a number of bytes >= 1, or None.")
        if max_input_bytes is None and max_output_bytes is None:
            raise ConfigError("Size() needs max_input_bytes=, max_output_bytes= or both.")
        self.max_input_bytes = max_input_bytes
        self.max_output_bytes = max_output_bytes
        stages = set()
        if max_input_bytes is not None:
            stages.add(INPUT)
        if max_output_bytes is not None:
            stages |= {OUTPUT, CHUNK}
        self.stages = frozenset(stages)
        self.rule = "size"  # each refusal names its bound: max_input_bytes, max_output_bytes

    def check(self, content: Content, ctx: Context) -> Verdict:
        rule, bound = (
            ("max_input_bytes", self.max_input_bytes)
            if content.stage == INPUT
            else ("max_output_bytes", self.max_output_bytes)
        )
        if bound is None:
            return None
        n = len(content.data)
        if n > bound:
            return Refuse(f"{n} bytes encoded, over {rule}={bound}", rule=rule)
        return None

    def __repr__(self) -> str:
        return f"Size(max_input_bytes={self.max_input_bytes}, max_output_bytes={self.max_output_bytes})"


DERIVED: Any = type("Derived", (), {"__repr__": lambda self: "DERIVED"})()
"""``Schema()``'s default: the schema comes from the handler's annotations."""


class Schema(Guard):
    """Content must fit a schema. ``input`` and ``output`` each take a type (a msgspec
    Struct, a TypedDict, ``list[int]``...: checked with msgspec), a JSON Schema (a dict:
    checked with the ``jsonschema`` package, ``pip install 'reach-fabric[guards]'``), or
    None (not checked). Left out (:data:`DERIVED`), each comes from the handler's
    annotations where it has one: the output from its return annotation (its published
    output schema). A typed payload is validated already before any guard (a misfit is
    dead-lettered ``invalid_payload``), so a derived input is not checked again: ``Schema()``
    on a typed handler checks its output; give ``input=`` for an untyped one. Chunks are not
    checked."""

    def __init__(self, input: Any = DERIVED, output: Any = DERIVED, *, rule: str = "schema"):
        self.rule = check_rule(rule)
        self.input, self.output = input, output
        self._validators: dict[str, Callable[[Content], str | None]] = {}
        for stage, spec in ((INPUT, input), (OUTPUT, output)):
            if spec is not DERIVED and spec is not None:
                self._validators[stage] = _validator(spec, f"Schema({stage}=...)")
        self.stages = frozenset(self._validators)

    def bind(self, capability: str, handler: Callable[..., Any], payload_type: Any) -> Guard:
        if self.input is not DERIVED and self.output is not DERIVED:
            return self
        import typing

        out = self.output
        if out is DERIVED:
            out = None
            if not inspect.isasyncgenfunction(handler):
                try:
                    ret = typing.get_type_hints(handler).get("return", Any)
                except Exception:  # noqa: BLE001 - unresolvable hints: nothing derived
                    ret = Any
                if ret not in (Any, object, None, type(None)):
                    out = ret
        inp = None if self.input is DERIVED else self.input  # typed: validated already
        if inp is None and out is None:
            name = getattr(handler, "__qualname__", repr(handler))
            raise ConfigError(
                f"Schema() on {capability!r} ({name}) would check nothing: the handler's "
                "result has no annotation to derive a schema from (a typed payload is "
                "validated already). Give one: Schema(input={...JSON Schema...}) or "
                "Schema(input=MyStruct), or annotate the handler's result."
            )
        return Schema(inp, out, rule=self.rule)

    def check(self, content: Content, ctx: Context) -> Verdict:
        why = self._validators[content.stage](content)
        return None if why is None else f"does not fit its schema: {why}"

    def __repr__(self) -> str:
        return f"Schema(input={self.input!r}, output={self.output!r})"


def _validator(spec: Any, who: str) -> Callable[[Content], str | None]:
    if isinstance(spec, Mapping):
        return _json_schema_validator(dict(spec), who)
    try:
        dec = msgspec.msgpack.Decoder(spec)
    except TypeError as e:
        raise ConfigError(
            f"{who}: {spec!r} is neither a type msgspec can validate ({e}) nor a JSON Schema "
            "(a dict)."
        ) from None

    def fits_type(content: Content) -> str | None:
        try:
            dec.decode(content.data)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            return str(e)
        return None

    return fits_type


def _json_schema_validator(schema: dict[str, Any], who: str) -> Callable[[Content], str | None]:
    try:
        import jsonschema
        import jsonschema.exceptions
        import jsonschema.validators
    except ImportError:
        raise ConfigError(
            f"{who}: checking a JSON Schema needs the jsonschema package: pip install "
            "'reach-fabric[guards]' (or give a type, checked with msgspec)."
        ) from None
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as e:
        raise ConfigError(f"{who}: not a valid JSON Schema: {e.message}") from None
    validator = cls(schema)

    def fits_schema(content: Content) -> str | None:
        err = jsonschema.exceptions.best_match(validator.iter_errors(content.plain))
        if err is None:
            return None
        where = "$" + "".join(f"[{p!r}]" for p in err.absolute_path)
        return f"{err.message} (at {where})"

    return fits_schema


_INVISIBLE = re.compile("[\u00ad\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]")


def normalized(text: str) -> str:
    """``text`` as deny patterns see it: NFKC (full-width and other look-alike forms
    folded) without zero-width and direction-control characters."""
    if text.isascii():  # NFKC leaves ASCII as it is, and it holds none of those
        return text
    return _INVISIBLE.sub("", unicodedata.normalize("NFKC", text))


class Deny(Guard):
    """Refuse content whose text matches a pattern: ``patterns`` is a list of regular
    expressions (rule ``rule``, "deny" by default) or a mapping of rule name to pattern
    (each match names its own rule). Each string of the content (dict keys included) is
    matched on its own, case-insensitively by default (``flags``), after
    :func:`normalized`. ``on``: the input by default; add ``"output"`` and ``"chunk"`` to
    screen what the handler returns (a chunk is matched alone: a phrase split across two
    chunks is not seen). The refusal says which rule matched, never the pattern or the text.

    A list of phrases stops the copy-pasted attack, not a determined one (docs/security.md,
    *Guards*)."""

    def __init__(
        self,
        patterns: Iterable[str] | Mapping[str, str],
        *,
        rule: str = "deny",
        on: Iterable[str] | str = (INPUT,),
        flags: int = re.IGNORECASE,
    ) -> None:
        self.rule = check_rule(rule)
        named = (
            list(patterns.items())
            if isinstance(patterns, Mapping)
            else [(self.rule, p) for p in patterns]
        )
        if not named:
            raise ConfigError("Deny() needs at least one pattern.")
        self.patterns: list[tuple[str, re.Pattern[str]]] = []
        for name, p in named:
            try:
                self.patterns.append((check_rule(name), re.compile(p, flags)))
            except (re.error, TypeError) as e:
                raise ConfigError(f"Deny: pattern {p!r} ({name}) is not a regex: {e}") from None
        self.stages = _check_stages(on, "Deny")

    def check(self, content: Content, ctx: Context) -> Verdict:
        for text in content.texts():
            text = normalized(text)
            for name, pattern in self.patterns:
                if pattern.search(text):
                    return Refuse("its text matches a denied pattern", rule=name)
        return None

    def __repr__(self) -> str:
        return f"Deny({[n for n, _ in self.patterns]}, on={sorted(self.stages)})"


class OnwardCalls(Guard):
    """The capabilities a handler may call through ``ctx.client`` (``request``, ``send``,
    ``stream``): a call to any other is refused before it is sent, with
    :class:`reach.GuardRefused` raised in the handler, and the message is refused whatever
    the handler does next (caught or not: dead-lettered ``refused_by_guard``, its result
    never sent). ``OnwardCalls([])``: no onward call at all. Several (the agent's and the
    handler's) all apply: a call must be in each.

    It bounds what ``ctx.client`` reaches, not what the handler's code can do: a client of
    its own, or ``ctx.redis``, are not bounded (docs/security.md, *Guards*)."""

    stages = frozenset()

    def __init__(self, capabilities: Iterable[str], *, rule: str = "onward_calls") -> None:
        if isinstance(capabilities, str):
            raise ConfigError(
                f"OnwardCalls({capabilities!r}): give a list of capabilities, e.g. "
                f"OnwardCalls([{capabilities!r}])."
            )
        self.rule = check_rule(rule)
        self.allowed = frozenset(normalize_capability(c) for c in capabilities)

    def refuse(self, capability: str, from_capability: str) -> GuardRefused | None:
        """The refusal of a call to ``capability`` by a handler of ``from_capability``."""
        if capability in self.allowed:
            return None
        listed = ", ".join(sorted(self.allowed)) or "none"
        return GuardRefused(
            refusal_text(
                self.rule,
                "onward call",
                from_capability,
                f"its handler may not call {capability!r} (allowed: {listed})",
            ),
            rule=self.rule,
        )

    def check(self, content: Content, ctx: Context) -> Verdict:
        return None

    def __repr__(self) -> str:
        return f"OnwardCalls({sorted(self.allowed)})"


def as_guard(g: Any) -> Guard:
    """``g`` as a :class:`Guard` (a callable becomes :class:`Check`), or ConfigError."""
    if isinstance(g, Guard):
        return g
    if callable(g) and not inspect.isclass(g):
        return Check(g)
    raise ConfigError(
        f"guards=[...] takes reach.Guard instances (reach.guards.Size, Schema, Deny, "
        f"OnwardCalls, Check) or functions fn(value, ctx), got {g!r}."
    )
