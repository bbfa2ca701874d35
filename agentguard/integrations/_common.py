"""What every adapter shares: the task-id rule, context-parameter detection, how a replay is told to the model,
and the decorator shell that puts them around :meth:`Guard.once`; refusal texts and the replay note come from
``agentguard._refusals``. Nothing here imports a framework."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, ParamSpec, Protocol, TypedDict, TypeVar, Unpack

from .. import _codec
from .._calls import Call
from .._context import DEFAULT_SCOPE, MAX_SCOPE, TaskInfo, check_id, check_task_id, current_task, task
from .._errors import GuardError, MissingTaskError
from .._frameworks import made_by
from .._guard import Guard
from .._names import check_arguments, check_tools
from .._operation import Reconcile
from .._refusals import refusal, replay_note
from .._shapes import Shape

_P = ParamSpec("_P")
_R = TypeVar("_R")

refusal_message = refusal
"""The text a model sees when the guard did not run a tool: the one table of ``agentguard._refusals``."""

KeyArg = Sequence[str] | str | Callable[[Mapping[str, Any]], str] | None
TaskIdFrom = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """How a framework-level adapter (capability, tool wrapper, middleware) guards one tool.

    ``key``: argument names whose values tell operations apart within a task (``"order_id"``); none means
    one operation per tool per task. ``returns``: the result type, so a pydantic model or a dataclass
    replays as itself (results are otherwise stored as tagged JSON). ``cache_errors``: exception classes
    stored and replayed like results. ``ignore``: arguments left out of the fingerprint. ``on_unknown``: when
    the worker of an earlier call died inside the tool, ``"hold"`` (the default) leaves the operation for a
    person (``OutcomeUnknownError`` until ``agentguard resolve``); ``"retry"`` runs it again with the same key —
    say so only where the tool forwards that key to the provider (``current_key()``, ``downstream``).
    """

    key: Sequence[str] | str | None = None
    returns: Any = Any
    cache_errors: tuple[type[BaseException], ...] = ()
    ignore: Sequence[str] = ()
    on_unknown: Literal["retry", "hold"] = "hold"

    def __post_init__(self) -> None:
        if self.on_unknown not in ("retry", "hold"):
            raise ValueError(f"ToolSpec(on_unknown=...) must be 'retry' or 'hold', got {self.on_unknown!r}")

    def key_fields(self) -> tuple[str, ...]:
        if self.key is None:
            return ()
        return (self.key,) if isinstance(self.key, str) else tuple(self.key)

    def names(self) -> dict[str, tuple[str, ...]]:
        """The argument names this spec was given, by option, for the one check of names."""
        ignore = (self.ignore,) if isinstance(self.ignore, str) else tuple(self.ignore)
        return {"key": self.key_fields(), "ignore": ignore}

    def key_values(self, arguments: Mapping[str, Any]) -> dict[str, Any] | None:
        fields = self.key_fields()
        return {n: arguments.get(n) for n in fields} if fields else None

    def fingerprinted(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        ignored = self.names()["ignore"]  # (a str is one name, never a set of its substrings)
        return {k: v for k, v in arguments.items() if k not in ignored}


ToolsArg = Mapping[str, "ToolSpec | Sequence[str] | str | None"] | Iterable[str]


def tool_specs(tools: ToolsArg) -> dict[str, ToolSpec]:
    """Normalise ``["charge"]`` / ``{"charge": "order_id"}`` / ``{"charge": ToolSpec(...)}``."""
    if isinstance(tools, str):
        raise TypeError(f"tools must be a collection of tool names, not the string {tools!r}")
    out: dict[str, ToolSpec] = {}
    if isinstance(tools, Mapping):
        for name, spec in tools.items():
            if spec is None:
                spec = ToolSpec()
            elif isinstance(spec, str | list | tuple):
                spec = ToolSpec(key=spec)
            elif not isinstance(spec, ToolSpec):
                raise TypeError(f"tool {name!r}: expected a ToolSpec, key field names or None, got {spec!r}")
            out[str(name)] = spec
    else:
        out = {str(name): ToolSpec() for name in tools}
    if not out:
        raise ValueError("no tools to guard: name at least one")
    return out


def check_specs(
    specs: Mapping[str, ToolSpec], offered: Mapping[str, Iterable[str]], *, where: str, offered_by: str
) -> None:
    """Refuse (``ValueError``) a guarded tool that ``offered`` (tool name -> its arguments) lacks, or a key or
    ignored field its tool does not take: agentguard's one check of names, ``agentguard._names``."""
    check_tools({name: spec.names() for name, spec in specs.items()}, offered, where=where, offered_by=offered_by)


def check_spec(
    spec: ToolSpec, tool: str, arguments: Iterable[str], *, where: str | None = None,
    error: type[Exception] = TypeError,
) -> None:
    """Refuse a key or ignored field that is not one of ``tool``'s ``arguments`` (a ``TypeError``: the names
    were given to a function, unless ``error`` says otherwise)."""
    check_arguments(tool, arguments, spec.names(), where=where, error=error)


# -- task id: one rule, everywhere ------------------------------------------------------------------------


def resolve_task(
    tool: str,
    *,
    explicit: TaskIdFrom | None,
    context: Any,
    fallback: Callable[[Any], Any] | None,
    scope: str | None,
    hint: str,
    on_missing: Callable[[], object] | None = None,
) -> TaskInfo:
    """explicit ``task_id=`` callable → ``with task(...)`` → the framework's stable id → refuse.

    ``fallback`` returns None when the framework has no stable id here. Never pass it a tool call id, a
    trace id or a per-run random id: those change on re-invocation. ``on_missing``: called before the refusal
    (:func:`missing_task`: the ledger and the span see it, as they see the decorator's).
    """
    info = current_task()
    if explicit is not None:
        tid = check_task_id(explicit(context), source="the task_id callable", tool=tool)
        return TaskInfo(tid, scope or (info.scope if info else DEFAULT_SCOPE))
    if info is not None:
        return info if scope is None else TaskInfo(info.task_id, scope)
    found = fallback(context) if fallback is not None else None
    if found is None:
        if on_missing is not None:
            on_missing()
        raise MissingTaskError(
            f"no task id for {tool!r}: not inside `with agentguard.task(<task id>):`, no task_id= given to the "
            f"adapter, and {hint}; the tool was not run",
            operation=tool,
        )
    return TaskInfo(check_task_id(found, source="the framework", tool=tool), scope or DEFAULT_SCOPE)


def call_ids(tool_call_id: object) -> dict[str, str] | None:
    """The audit of a call from a framework's tool call: its id, kept beside the record and in the ledger, and
    the span's ``gen_ai.tool.call.id`` (it changes on every re-invocation, so it is never part of the key)."""
    return {"tool_call_id": tool_call_id} if isinstance(tool_call_id, str) and tool_call_id else None


CallIdOf = Callable[[Any, str], object]
"""Where a framework's context of a call (what ``Framework.get_context`` found) holds the framework's id of that
tool call, given the tool's name; None (or anything not a non-empty string) when it holds none for this tool."""


def missing_task(guard: Guard, tool: str, audit: Mapping[str, Any] | None) -> None:
    """A call of ``tool`` an adapter refused for want of a task id, told to the guard's ledger and telemetry
    (a ``refused`` attempt, a span with ``error.type`` ``MissingTaskError``), as ``Guard.run`` tells its own."""
    guard._machine.observer.missing_task(tool, None if audit is None else _codec.dumps(dict(audit)))


def attribute_task_id(obj: Any, name: str = "task_id") -> Any:
    """``obj.task_id`` or ``obj["task_id"]`` (deps / context objects), else None."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


# -- context parameters ------------------------------------------------------------------------------------


def hint_types(annotation: Any) -> list[Any]:
    """The classes an annotation may stand for, with ``Annotated`` metadata: ``Annotated[X | None, m]`` gives
    ``[X, NoneType, m]``; ``RunContext[Deps]`` gives ``[RunContext[Deps], RunContext]``."""
    out: list[Any] = [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *meta = typing.get_args(annotation)
        return [*hint_types(base), *meta]
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in hint_types(arg)]
    if origin is not None:
        out.append(origin)
    return out


def context_params(
    fn: Callable[..., Any], is_context: Callable[[Any], bool], class_names: Sequence[str] = ()
) -> list[str]:
    """Parameters whose annotation names a framework-injected object: never part of the fingerprint.

    ``class_names`` catch annotations left as strings (a name imported only under TYPE_CHECKING).
    """
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolvable forward reference: fall back to the raw annotations
        hints = {}
    names = []
    for name, param in inspect.signature(fn).parameters.items():
        annotation = hints.get(name, param.annotation)
        if annotation is inspect.Parameter.empty:
            continue
        if isinstance(annotation, str):
            if _string_names(annotation) & set(class_names):
                names.append(name)
        elif any(_safe(is_context, t) for t in hint_types(annotation)):
            names.append(name)
    return names


def _string_names(annotation: str) -> set[str]:
    # "RunContext[Deps]", "agents.RunContextWrapper[Ctx] | None", "Annotated[str, InjectedToolCallId]"
    words = annotation.replace("[", " ").replace("]", " ").replace(",", " ").replace("|", " ").split()
    return {w.rsplit(".", 1)[-1] for w in words}


def _safe(pred: Callable[[Any], bool], value: Any) -> bool:
    try:
        return bool(pred(value))
    except TypeError:  # issubclass on a non-class
        return False


def subclass_of(value: Any, classes: tuple[type, ...]) -> bool:
    return (isinstance(value, type) and issubclass(value, classes)) or isinstance(value, classes)


# -- telling the model of a replay ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Replay:
    """A replayed call, for its framework's model: the note to tell it (``agentguard._refusals.replay_note``),
    the tool's name and the framework's context of the call (what ``Framework.get_context`` found; None if
    none)."""

    note: str
    tool: str
    context: Any = None


Told = Callable[[Any, Replay], Any]
"""How an adapter tells its framework's model that a result is a replay: given the replayed value, what it
hands the framework as the tool's result. The note is added beside the value in the framework's convention,
never in place of it, and never by changing the type of what the tool returns: where the framework leaves no
room, the value is handed on as it is."""


def noted_text(value: Any, replay: Replay) -> Any:
    """A string result after the note, as its first paragraph; any other result as it is (only a string has
    room for a line of text without becoming something else)."""
    return f"{replay.note}\n\n{value}" if isinstance(value, str) else value


def noted_blocks(value: Any, replay: Replay, block: Callable[[str], Any]) -> Any:
    """A list of content blocks after one more, ``block(note)``; a string as :func:`noted_text`; else as it is."""
    if isinstance(value, list):
        return [block(replay.note), *value]
    return noted_text(value, replay)


# Inside a framework hook around one tool call that writes the note into the message it builds (LangChain's
# ToolGuard, AG2's middleware): a replay of a ``once``-guarded tool is reported to the hook, and its value left
# alone, so the note is told once, where the message has room for it whatever the value's type.
_hearing: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("agentguard_hearing", default=None)


@contextlib.contextmanager
def hearing_replays() -> Iterator[list[str]]:
    """Around one tool call: the yielded list receives the note of a replay of a ``once``-guarded tool."""
    notes: list[str] = []
    token = _hearing.set(notes)
    try:
        yield notes
    finally:
        _hearing.reset(token)


# -- decorator order ---------------------------------------------------------------------------------------

def order_error(adapter: str, decorator: str, what: str) -> TypeError:
    """The one text for a guard placed on top of the framework's decorator instead of underneath it."""
    return TypeError(
        f"{adapter}.once(...) was placed on top of {what}; put it underneath instead, directly on the "
        "function:\n"
        f"    {decorator:<28}# the framework's decorator on top\n"
        f"    {'@once(guard, ...)':<28}# agentguard right above the function\n"
        "    def charge(...): ..."
    )


def check_function(
    fn: Any, *, adapter: str, decorator: str, registered: Callable[[Any], str | None] | None = None
) -> None:
    """Refuse, before anything inspects it, what an adapter's ``once`` must not wrap: a framework's tool
    object (the decorators turned round) or, through ``registered``, a function the adapter's framework has
    already registered as it is (its decorator ran first and keeps the unguarded function).

    ``adapter``: the adapter's module, for the message; ``decorator``: its framework's decorator, shown on top.
    """
    tool = made_by(fn)
    if tool is not None:
        made, framework = tool
        top = made if made.startswith("@") else decorator  # pydantic-ai's Tool(...) is not a decorator
        raise order_error(adapter, top, f"a {type(fn).__name__} made by {framework}'s {made}")
    if not callable(fn):
        raise TypeError(f"{adapter}.once(...) needs a function, got {type(fn).__name__}")
    if registered is not None and (what := registered(fn)) is not None:
        raise order_error(adapter, decorator, what)


# -- the decorator shell -----------------------------------------------------------------------------------


class AdapterOptions(TypedDict, total=False):
    """The options every adapter's ``once`` takes besides ``task_id`` (as :meth:`Guard.once`'s, plus
    ``scope``, the tenant the framework's task ids belong to)."""

    key: KeyArg
    operation: str | None
    ignore: Sequence[str]
    cache_errors: tuple[type[BaseException], ...]
    inject: str | None
    key_shape: Shape
    scope: str | None
    on_unknown: Literal["retry", "reconcile", "hold"]
    reconcile: Reconcile | None
    replay_note: bool


@dataclass(frozen=True, slots=True)
class Framework:
    """How one framework's adapter guards a tool function: its module and decorator (for the decorator-order
    check), the parameters its framework injects (left out of the fingerprint), where its context and its
    stable task id are found, how a refusal reaches its model, how a replay is told to it (``told``; None:
    there is no model), and where the context holds the id of the tool call (``call_id``; None: it holds none)."""

    adapter: str
    decorator: str
    context_names: Callable[[Callable[..., Any]], Sequence[str]]
    get_context: Callable[[Mapping[str, Any], Sequence[str]], Any]
    fallback: Callable[[Any], Any] | None
    hint: str
    refuse: Callable[[GuardError], Any]
    registered: Callable[[Any], str | None] | None = None
    told: Told | None = None
    call_id: CallIdOf | None = None

    def once(
        self, guard: Guard, task_id: TaskIdFrom | None, options: AdapterOptions
    ) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
        unknown = options.keys() - AdapterOptions.__annotations__.keys()
        if unknown:
            raise TypeError(f"{self.adapter}.once() got unexpected keyword argument(s): {', '.join(sorted(unknown))}")

        def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
            check_function(fn, adapter=self.adapter, decorator=self.decorator, registered=self.registered)
            names = self.context_names(fn)
            wrapped: Callable[_P, _R] = adapt(
                guard, fn, task_id=task_id, context_names=names,
                get_context=lambda arguments: self.get_context(arguments, names), fallback=self.fallback,
                hint=self.hint, refuse=self.refuse, told=self.told, call_id=self.call_id, **options,
            )
            return wrapped

        return decorate


def adapt(
    guard: Guard,
    fn: Callable[..., Any],
    *,
    task_id: TaskIdFrom | None,
    context_names: Sequence[str],
    get_context: Callable[[Mapping[str, Any]], Any],
    fallback: Callable[[Any], Any] | None,
    hint: str,
    refuse: Callable[[GuardError], Any],
    told: Told | None = None,
    call_id: CallIdOf | None = None,
    **options: Unpack[AdapterOptions],
) -> Any:
    """``guard.once`` with the framework's context left out of the fingerprint, the task id resolved by the
    one rule, refusals turned into the framework's tool-error convention, a replay told to the model by
    ``told`` (unless ``replay_note=False``), and the framework's id of the call (``call_id``) kept as its
    audit: in the ledger and on the span."""
    ignore = options.get("ignore", ())
    if isinstance(ignore, str):
        ignore = (ignore,)
    scope = options.get("scope")
    if scope is not None:
        check_id(scope, "scope", MAX_SCOPE)  # at decoration, not on the first call
    core: Any = guard.once(
        operation=options.get("operation"), key=options.get("key"), ignore=[*ignore, *context_names],
        cache_errors=options.get("cache_errors", ()), inject=options.get("inject", "idempotency_key"),
        on_unknown=options.get("on_unknown", "hold"), reconcile=options.get("reconcile"),
        key_shape=options.get("key_shape"),
    )(fn)
    sig = inspect.signature(core)
    spec = core.__agentguard__
    tool: str = spec.tool
    if not options.get("replay_note", True):
        told = None

    def scoped(
        args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[contextlib.AbstractContextManager[Any], Any, str | None]:
        """The task of this call, as a context to run it in, the framework's context of the call, and the
        call's audit (its id)."""
        arguments: Mapping[str, Any] = {}
        if context_names:
            try:
                arguments = sig.bind_partial(*args, **kwargs).arguments
            except TypeError:
                arguments = {}  # the core wrapper reports the bad call itself
        context = get_context(arguments)
        ids = None if call_id is None or context is None else call_ids(call_id(context, tool))
        audit = None if ids is None else _codec.dumps(ids)
        info = resolve_task(tool, explicit=task_id, context=context, fallback=fallback, scope=scope, hint=hint,
                            on_missing=lambda: spec.machine.observer.missing_task(tool, audit))
        if info == current_task():
            return contextlib.nullcontext(), context, audit
        return task(info.task_id, scope=info.scope), context, audit

    def tell(value: Any, replayed: Call | None, hearing: list[str] | None, context: Any) -> Any:
        if replayed is None or told is None:
            return value
        note = replay_note(replayed.operation, replayed.task_id)
        if hearing is not None:  # a hook around this tool call writes it into the message
            hearing.append(note)
            return value
        return told(value, Replay(note, tool, context))

    if inspect.iscoroutinefunction(core):

        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            hearing = _hearing.get()
            # (a guarded tool that this one's body calls is not this call: the hook does not hear it)
            token = None if hearing is None else _hearing.set(None)
            try:
                within, context, audit = scoped(args, kwargs)
                with within:
                    value, replayed = await spec.run_async(args, kwargs, audit)
            except GuardError as exc:
                return refuse(exc)
            finally:
                if token is not None:
                    _hearing.reset(token)
            return tell(value, replayed, hearing, context)

        wrapper: Any = async_wrapper
    else:

        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            hearing = _hearing.get()
            token = None if hearing is None else _hearing.set(None)
            try:
                within, context, audit = scoped(args, kwargs)
                with within:
                    value, replayed = spec.run_sync(args, kwargs, audit)
            except GuardError as exc:
                return refuse(exc)
            finally:
                if token is not None:
                    _hearing.reset(token)
            return tell(value, replayed, hearing, context)

        wrapper = sync_wrapper
    functools.update_wrapper(wrapper, core)
    wrapper.__signature__ = sig
    wrapper.__annotations__ = dict(core.__annotations__)
    return wrapper


def raise_refusal(exc: GuardError) -> NoReturn:
    """Workflow engines have no model to talk to: a refusal is raised as the GuardError it is."""
    raise exc


class EngineOnce(Protocol):
    def __call__(
        self, guard: Guard, *, task_id: TaskIdFrom | None = None, **options: Unpack[AdapterOptions]
    ) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]: ...


def engine_once(
    *,
    get_context: Callable[[], Any],
    fallback: Callable[[Any], Any],
    hint: str,
    doc: str,
    adapter: str,
    decorator: str,
    registered: Callable[[Any], str | None] | None = None,
) -> EngineOnce:
    """The ``once`` of a workflow engine (DBOS, Temporal): ``guard.once`` whose task id falls back to the
    engine's stable workflow id, with refusals raised. ``adapter``, ``decorator``, ``registered``: see
    :func:`check_function`."""
    framework = Framework(
        adapter, decorator, context_names=lambda _fn: (), get_context=lambda _arguments, _names: get_context(),
        fallback=fallback, hint=hint, refuse=raise_refusal, registered=registered,
    )

    def once(
        guard: Guard, *, task_id: TaskIdFrom | None = None, **options: Unpack[AdapterOptions]
    ) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
        if "replay_note" in options:  # no model reads a step's or an activity's result: nothing to tell
            raise TypeError(f"{adapter}.once() got an unexpected keyword argument: replay_note (no model to tell)")
        return framework.once(guard, task_id, options)

    once.__doc__ = doc
    return once
