"""The exception tree. User exceptions raised by a tool body always pass through unwrapped.

    GuardError                    root; also raised for misuse (e.g. current_key() outside a call)
    ├── MissingTaskError          400  no task id in context: the tool was not run
    ├── KeyReuseError             422  same task + operation, different arguments: not run
    ├── InProgressError           409  another caller holds the claim: not run
    ├── LeaseLostError            409  our lease expired and another worker took over: result refused
    ├── OutcomeUnknownError       409  held for a person: a step or a body whose worker died inside it, and
    │   │                              the tool's key cannot reach the provider (or its policy says hold)
    │   └── ResultNotStoredError  409  the body ran but its result could not be stored: recorded, never run again
    ├── RecordChangedError        409  a person's decision made on a revision the record no longer has: not made
    ├── StepOrderError            409  a retry called an operation's steps in another order: not run
    └── StoreError                503  the store could not be used; says whether the body ran
"""

from __future__ import annotations

from collections.abc import Sequence


class GuardError(Exception):
    """Root of every error agentguard raises itself."""

    status: int | None = None

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        task_id: str | None = None,
        operation: str | None = None,
        scope: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.key = key
        self.task_id = task_id
        self.operation = operation
        self.scope = scope

    def __str__(self) -> str:
        return self.message


class MissingTaskError(GuardError):
    """No task id was given: a key cannot be derived, so the tool was not run."""

    status = 400


class KeyReuseError(GuardError):
    """The operation was already claimed with different arguments; the tool was not run."""

    status = 422

    def __init__(self, message: str, *, differing: Sequence[str] = (), earlier: str = "", **kw: str | None) -> None:
        super().__init__(message, **kw)
        self.differing = tuple(differing)
        self.earlier = earlier  # what became of the earlier call: "the earlier call ran and succeeded, ..."


class InProgressError(GuardError):
    """Another caller is running this operation right now; this call did not run it."""

    status = 409


class LeaseLostError(GuardError):
    """This worker's claim was taken over after its lease expired; its result was not stored."""

    status = 409


class OutcomeUnknownError(GuardError):
    """The outcome of an operation (or of one of its steps) is unknown, and it is held for a person rather than
    run again: its worker died inside the body (or the step) and the tool's key cannot reach the provider, or
    its policy says hold. ``agentguard resolve`` settles it. ``step`` is None when the whole body is held."""

    status = 409

    def __init__(self, message: str, *, step: str | None = None, **kw: str | None) -> None:
        super().__init__(message, **kw)
        self.step = step


class ResultNotStoredError(OutcomeUnknownError):
    """The tool body ran, but its result could not be stored (the return annotation refused it, it has no
    stored form, or reading it raised). That outcome is recorded in its place, so the body is never run again
    for the operation: the first caller and every later one get this error until a person settles it
    (``agentguard resolve KEY --result JSON``, or ``--abandon``)."""

    body_ran = True


class RecordChangedError(GuardError):
    """A person's decision (``Guard.resolve(..., revision=...)``, ``agentguard resolve --revision``, the
    console's settle forms) was made on a revision of the record it no longer has: nothing was changed. The
    message says what changed; ``seen`` is the revision the decision was made on, ``revision`` the record's
    now (None: the record is gone)."""

    status = 409

    def __init__(self, message: str, *, seen: str, revision: str | None, **kw: str | None) -> None:
        super().__init__(message, **kw)
        self.seen = seen
        self.revision = revision


class StepOrderError(GuardError):
    """A retry called the operation's steps in another order (or one step twice); nothing was run."""

    status = 409


class StoreError(GuardError):
    """The store was unreachable, its schema is wrong, or a write failed.

    ``body_ran`` tells whether the tool body had already run when the store failed: if it had, the write was
    retried for the guard's ``outage_window`` first, then the claim is left held (fail closed) and a caller
    after the lease takes over with the same downstream key. ``transient`` tells whether the failure looked
    like an outage (connection refused or lost, a timeout, a locked database) rather than a store that
    cannot work as configured (a malformed URL, wrong credentials, a broken schema): retrying may help.
    """

    status = 503

    def __init__(self, message: str, *, body_ran: bool = False, transient: bool = False, **kw: str | None) -> None:
        super().__init__(message, **kw)
        self.body_ran = body_ran
        self.transient = transient


class NotStarted(Exception):
    """Raised inside a guarded call before anything took effect — the MCP proxy's confirmation declined, its
    upstream not reached, a tool no longer offered as configured. The claim is released without binding its
    arguments, so a corrected call runs with its own (a body that ran and raised keeps binding them). Internal:
    not a ``GuardError``, not exported; the caller of the guarded call handles it."""


class CommandError(Exception):
    """A problem an ``agentguard`` command reports on stderr with exit status 1 (no traceback); not a guard's
    error."""
