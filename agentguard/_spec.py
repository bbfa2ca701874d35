"""The ``once`` decorator: everything it decides once, at decoration time, and the wrapper it returns.

A ``Spec`` reads the tool's signature and type hints, checks the options against them, hides the injected
parameters (the downstream key, the ``Operation``), and builds each call: bind the arguments, leave out the
ignored ones, derive the identity (the flat shortcut of ``agentguard._keys_flat`` when every argument is flat),
then hand the call to a driver of the state machine (``_drive``) with a body that invokes the tool.
"""

from __future__ import annotations

import functools
import inspect
import json
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._binder import Binder
from ._calls import Call, check_operation, flat_call, make_call
from ._codec import Codec
from ._drive import active_claim, drive, drive_sync
from ._errors import MissingTaskError
from ._frameworks import made_by
from ._keys_flat import FlatSignature
from ._machine import Machine
from ._names import check_arguments
from ._operation import Operation, Reconcile
from ._shapes import KeyShape
from ._steps import ClaimSteps
from .stores import RUNNING

KeyOption = Sequence[str] | str | Callable[[Mapping[str, Any]], str] | None


def reject_framework_tool(fn: Any) -> None:
    """A framework's tool object (the decorators the wrong way round) or a non-callable: a TypeError that
    says which way round."""
    if inspect.isfunction(fn) or inspect.ismethod(fn) or isinstance(fn, functools.partial):
        return
    tool = made_by(fn)
    if tool is not None:
        made, framework = tool
        top = made if made.startswith("@") else "@agent.tool"
        raise TypeError(
            f"@guard.once was placed on top of a {type(fn).__name__} made by {framework}'s {made}; put it "
            "underneath instead, directly on the function:\n"
            f"    {top:<20}# the framework's decorator on top\n"
            f"    {'@guard.once(...)':<20}# agentguard right above the function\n"
            "    def charge(...): ..."
        )
    if not callable(fn):
        raise TypeError(f"@guard.once needs a function, got {type(fn).__name__}")


class Spec:
    """Everything the decorator decides once, at decoration time."""

    def __init__(
        self,
        machine: Machine,
        codec_for: Callable[[Any], Codec],
        fn: Callable[..., Any],
        *,
        operation: str | None,
        key: KeyOption,
        ignore: Sequence[str],
        cache_errors: tuple[type[BaseException], ...],
        inject: str | None,
        on_conflict: str,
        wait_timeout: float | None,
        on_unknown: str = "hold",
        reconcile: Reconcile | None = None,
        resumable: bool = False,
        key_shape: KeyShape | None = None,
    ) -> None:
        reject_framework_tool(fn)
        self.machine, self.codec_for, self.fn = machine, codec_for, fn
        self.on_conflict, self.wait_timeout = on_conflict, wait_timeout
        self.tool = check_operation(operation or getattr(fn, "__name__", None) or type(fn).__name__)
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - async callable objects
        )
        self.on_unknown, self.reconcile = on_unknown, reconcile
        self.full_sig = sig = inspect.signature(fn)
        params = sig.parameters
        if inject is not None and inject != "idempotency_key":  # the default: injected only if it is there
            check_arguments(self.tool, params, {"inject": [inject]})
        self.inject = inject if inject in params else None
        self.resumable = resumable
        if key_shape is not None and self.inject is None:
            raise TypeError(f"{self.tool}: key_shape shapes the injected key, but the function takes no parameter "
                            f"{inject!r}; shape the key you forward with current_key(shape=...)")
        self.key_shape = None if key_shape is None or key_shape.keeps_the_key else key_shape
        try:
            hints = typing.get_type_hints(fn)
        except NameError:
            hints = {}  # a forward reference not resolvable yet: replay untyped (tagged JSON)
        except Exception as exc:
            raise TypeError(f"{self.tool}: cannot read the type hints: {exc}") from None
        ops = [n for n in params if hints.get(n) is Operation]
        self.op_param = ops[0] if ops else None
        if len(ops) > 1:
            raise TypeError(f"{self.tool}: only one parameter may be annotated Operation")
        if self.op_param and not self.is_async:
            raise TypeError(f"{self.tool}: a multi-step tool (with an Operation parameter) must be async")
        # What a caller does when the worker before it went away inside the body (``Call.on_unknown``): run it
        # again only where the key reaches the provider — the tool takes the injected key, or is a multi-step
        # tool (its steps carry the key, and hold what they must), or resumable, or says so (on_unknown="retry").
        reaches = self.inject is not None or self.op_param is not None or resumable
        self.body_on_unknown = "retry" if reaches else on_unknown
        hidden = {self.inject, self.op_param}
        self.public_sig = sig.replace(parameters=[p for n, p in params.items() if n not in hidden])
        # The guard fills these in: a value a caller (a model) sends for one through **kwargs is dropped, never
        # handed to the body in their place nor fingerprinted. (Without **kwargs, the signature refuses it.)
        takes_any = any(p.kind is p.VAR_KEYWORD for p in self.public_sig.parameters.values())
        self.dropped = tuple(n for n in (self.inject, self.op_param) if n is not None) if takes_any else ()
        self.binder = Binder(self.public_sig)
        names = set(self.public_sig.parameters)
        self.excluded = self._excluded(ignore, names, params, resumable)
        self.key_fn: Callable[[Mapping[str, Any]], str] | None = None
        self.key_fields: tuple[str, ...] = ()
        if callable(key):
            self.key_fn = key
        elif key is not None:
            self.key_fields = (key,) if isinstance(key, str) else tuple(key)
            check_arguments(self.tool, names, {"key": self.key_fields})
        # The one-pass identity of the common call (every argument str/int/bool/None); not for key callables
        # or key fields left out of the fingerprint, which take the general path.
        fp_names = [n for n in self.binder.all_names if n not in self.excluded]
        self.flat: FlatSignature | None = None
        if self.binder.simple and self.key_fn is None and set(self.key_fields) <= set(fp_names):
            self.flat = FlatSignature(self.tool, fp_names, self.key_fields)
        self.codec = codec_for(hints.get("return", Any))
        self.cache_errors = cache_errors
        # Codecs of the arguments, to store and rebuild them for complete_stalled().
        self.arg_codecs: dict[str, Codec] | None = None
        if resumable:
            self.arg_codecs = {n: codec_for(hints.get(n, Any)) for n in names}
        # The downstream key can be passed by keyword iff no positional argument can reach its slot.
        inj = params.get(self.inject) if self.inject else None
        after = list(params)[list(params).index(self.inject) + 1:] if self.inject else []
        self.fast_inject = self.op_param is None and inj is not None and inj.kind != inj.POSITIONAL_ONLY and all(
            params[n].kind in (inj.KEYWORD_ONLY, inj.VAR_KEYWORD) for n in after
        )

    def _excluded(
        self, ignore: Sequence[str], names: set[str], params: Mapping[str, inspect.Parameter], resumable: bool
    ) -> set[str]:
        if isinstance(ignore, str):
            ignore = (ignore,)
        check_arguments(self.tool, names, {"ignore": ignore})
        excluded = set(ignore)
        first = next(iter(params), None)
        if first in ("self", "cls"):
            excluded.add(first)  # the bound instance is not an argument of the operation
            if resumable:
                raise TypeError(f"{self.tool}: a method cannot be resumable (its instance is not stored)")
        return excluded

    def encode_arguments(self, arguments: Mapping[str, Any]) -> str | None:
        if self.arg_codecs is None:
            return None
        try:
            return json.dumps({n: self.arg_codecs[n].encode(v) for n, v in arguments.items()})
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{self.tool} is resumable but its arguments cannot be stored: {exc}") from None

    def decode_arguments(self, text: str) -> dict[str, Any]:
        assert self.arg_codecs is not None
        return {n: self.arg_codecs[n].decode(v) for n, v in json.loads(text).items()}

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Call, Mapping[str, Any]]:
        if self.dropped and kwargs:
            for n in self.dropped:
                kwargs.pop(n, None)  # (the wrapper's own dict, which invoke() gets too)
        arguments = self.binder.bind(args, kwargs)
        excluded = self.excluded
        fp_args = {k: v for k, v in arguments.items() if k not in excluded} if excluded else arguments
        flat = self.flat
        values = None if flat is None else flat.values(fp_args)
        if values is not None:
            assert flat is not None
            call = flat_call(flat, values, fp_args, self.codec, self.cache_errors, self.on_conflict,
                             self.wait_timeout)
        else:
            if self.key_fn is not None:
                key_values: Mapping[str, Any] | str | None = self.key_fn(dict(arguments))
                if not isinstance(key_values, str):
                    raise TypeError(
                        f"{self.tool}: the key callable must return a str, got {type(key_values).__name__}"
                    )
            else:
                key_values = {n: arguments[n] for n in self.key_fields} if self.key_fields else None
            call = make_call(self.tool, fp_args, key_values, None, None, self.codec, self.cache_errors,
                             self.on_conflict, self.wait_timeout)
        if self.arg_codecs is not None:
            call.arguments = self.encode_arguments(arguments)
        call.on_unknown = self.body_on_unknown
        return call, arguments

    def reconciled(self, key: str) -> Any:
        """On a takeover of a call whose worker went away inside the body, with ``on_unknown="reconcile"``: the
        tool's ``reconcile(op, tool, key)`` asked first — an awaitable of what the provider says happened (the
        result, stored as the body's), or None ("did not happen": the body runs). None when it does not apply."""
        claim = active_claim.get()
        if self.body_on_unknown != "reconcile" or claim is None or claim.took != RUNNING:
            return None
        assert self.reconcile is not None
        op = Operation(ClaimSteps(self.machine, claim, self.codec_for), self.on_unknown, self.reconcile)
        return self.reconcile(op, self.tool, key)

    def invoke(self, args: tuple[Any, ...], kwargs: dict[str, Any], arguments: Mapping[str, Any], key: str) -> Any:
        asking = self.reconciled(key) if self.body_on_unknown == "reconcile" else None
        if asking is not None:
            if self.is_async:
                return self._after_reconcile(asking, args, kwargs, arguments, key)
            found = self.machine.portal.run(asking)
            return self._invoke(args, kwargs, arguments, key) if found is None else found
        return self._invoke(args, kwargs, arguments, key)

    async def _after_reconcile(self, asking: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                               arguments: Mapping[str, Any], key: str) -> Any:
        found = await asking
        return await self._invoke(args, kwargs, arguments, key) if found is None else found

    def _invoke(self, args: tuple[Any, ...], kwargs: dict[str, Any], arguments: Mapping[str, Any], key: str) -> Any:
        inject, op_param = self.inject, self.op_param
        if inject is None and op_param is None:
            return self.fn(*args, **kwargs)
        if self.key_shape is not None:
            key = self.key_shape(key)
        if self.fast_inject:
            assert inject is not None
            return self.fn(*args, **kwargs, **{inject: key})
        full = dict(arguments)
        if inject is not None:
            full[inject] = key
        if op_param is not None:
            claim = active_claim.get()
            assert claim is not None
            full[op_param] = Operation(ClaimSteps(self.machine, claim, self.codec_for), self.on_unknown,
                                       self.reconcile)
        ordered = {n: full[n] for n in self.full_sig.parameters}
        ba = inspect.BoundArguments(self.full_sig, ordered)  # type: ignore[arg-type,unused-ignore]
        return self.fn(*ba.args, **ba.kwargs)

    async def run_async(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], audit: str | None = None
    ) -> tuple[Any, Call | None]:
        """One call of an async tool: its value, and the call when it was a replay (None when it ran). The
        framework adapters tell the model of a replay from it (``integrations._common.adapt``) and pass the
        ``audit`` of the call (its framework's tool call id, as ``Guard.run``'s ``audit``)."""
        call, arguments = self._adapted_call(args, kwargs, audit)
        value, replayed = await drive(self.machine, call, lambda key: self.invoke(args, kwargs, arguments, key))
        return value, call if replayed else None

    def run_sync(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], audit: str | None = None
    ) -> tuple[Any, Call | None]:
        """:meth:`run_async` for a sync tool, in the caller's thread."""
        call, arguments = self._adapted_call(args, kwargs, audit)
        value, replayed = drive_sync(self.machine, call, lambda key: self.invoke(args, kwargs, arguments, key))
        return value, call if replayed else None

    def _adapted_call(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                      audit: str | None) -> tuple[Call, Mapping[str, Any]]:
        """The call an adapter makes, with its framework's tool call id; a refusal for want of a task id is
        told to the ledger and the traces first."""
        try:
            call, arguments = self.call(args, kwargs)
        except MissingTaskError:
            self.machine.observer.missing_task(self.tool, audit)
            raise
        call.audit = audit
        return call, arguments

    def wrapper(self) -> Any:
        fn, run_async, run_sync = self.fn, self.run_async, self.run_sync

        if self.is_async:

            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                return (await run_async(args, kwargs))[0]

            wrapper: Any = async_wrapper
        else:

            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                return run_sync(args, kwargs)[0]

            wrapper = sync_wrapper
        functools.update_wrapper(wrapper, fn)
        wrapper.__signature__ = self.public_sig
        # functools.wraps shares fn's annotations dict: copy it, never mutate it.
        annotations = dict(getattr(fn, "__annotations__", {}))
        for hidden in (self.inject, self.op_param):
            annotations.pop(hidden or "", None)
        wrapper.__annotations__ = annotations
        wrapper.__agentguard__ = self
        return wrapper
