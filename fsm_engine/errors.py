"""The fsm_engine error tree.

Every exception the package raises on purpose derives from :class:`FsmError`,
so a caller (and the CLI) can catch one root and print ``str(err)``: a single
line that names the thing at fault.  Errors carry structured fields
(``instance_id``, ``state``, ``attempt`` ...) so callers need not parse text.

::

    FsmError
    ├── DefinitionError          a machine definition is broken (lists every problem)
    │   └── MachineLoadError     a machine module cannot be found or imported
    │       └── MachineRefused   a stored row names a module this process may not import
    ├── StoreError               the database cannot be used
    │   ├── NotAnFsmDatabase     the file is not SQLite, or not an fsm_engine database
    │   ├── InstanceNotFound     no instance with that id
    │   ├── StaleWrite           another writer moved the instance first (lease lost, cancelled)
    │   ├── StepRejected         the store refused one step's values (nothing of its batch written)
    │   ├── StartKeyTaken        a new instance's start key is held by another of its machine
    │   └── FingerprintMismatch  the instance was started from a different definition
    │       ├── VersionTooNew    it was stored by a newer machine version than the code's
    │       └── NeedsMigration   it cannot be upcast to the code's version (``cause``)
    ├── InvalidInput             input or a context update fails the machine's context model
    │   ├── ReviewRefused        a review answer is stale, second, someone else's, not
    │   │                        offered, or its edit fails the ``editable`` model
    │   ├── StartConflict        a start repeats a key with a different input
    │   └── DebounceKeyTaken     an unpause/restart would make a second burst of a debounce key
    ├── InstanceFinished         a step was asked of an instance in a final status
    ├── ActionError              an action raised (wraps the original as ``__cause__``)
    ├── StepTimeout              an action ran past its state's timeout
    ├── BudgetExhausted          an LLM call would exceed the instance's token budget
    ├── CircuitOpen              the provider's circuit breaker is open
    ├── RateLimitWait            a shared rate limit has no room now: the instance waits
    ├── StructuredOutputError    model text could not be turned into the declared object
    └── ProviderError            an LLM provider call failed (see ``fsm_engine.llm.errors``)
        ├── ProviderUnavailable  connection refused/reset, DNS  (retryable)
        ├── ProviderTimeout      the call took too long          (retryable)
        │   └── DeadlineExceeded the whole exchange passed its deadline (retryable)
        ├── ResponseTooLarge     the response passed FSM_HTTP_MAX_BYTES (not retryable)
        ├── CertificateError     TLS certificate verification failed (not retryable)
        ├── RateLimited          HTTP 429, carries ``retry_after`` seconds (retryable)
        ├── ServerError          HTTP 5xx                        (retryable)
        └── ClientError          HTTP 4xx other than 429         (not retryable)

Control flow that is not a failure (an instance waiting for an external
event, a cancelled instance) is expressed as an instance *status*, never as an
exception.
"""

from __future__ import annotations

from typing import Any


class FsmError(Exception):
    """Root of every error fsm_engine raises on purpose.

    ``str(err)`` is always one line suitable for a terminal.
    """

    def __init__(self, message: str, *, instance_id: str | None = None,
                 state: str | None = None) -> None:
        message = " ".join(message.splitlines())
        super().__init__(message)
        self.message = message
        self.instance_id = instance_id
        self.state = state


class DefinitionError(FsmError):
    """A machine definition is invalid.

    ``problems`` lists every problem found (each names the state or
    transition at fault); the message joins them on one line.
    """

    def __init__(self, machine: str, problems: list[str]) -> None:
        self.machine = machine
        self.problems = list(problems)
        super().__init__(f"machine {machine!r} is invalid: " + "; ".join(self.problems))


class MachineLoadError(DefinitionError):
    """A machine module cannot be found or imported, or defines no machine."""

    def __init__(self, ref: str, why: str) -> None:
        self.ref = ref
        FsmError.__init__(self, f"cannot load machine {ref!r}: {why}")
        self.machine = ref
        self.problems = [why]


class MachineRefused(MachineLoadError):
    """A stored instance names a module (``ref``) that is neither named on the command line
    (or loaded by the program) nor under the machines root: it is never imported."""

    def __init__(self, ref: str, instance_id: str, why: str) -> None:
        FsmError.__init__(self, f"instance {instance_id}: machine module {ref!r} not "
                                f"imported: it {why}", instance_id=instance_id)
        self.ref, self.machine, self.problems = ref, ref, [why]


class StoreError(FsmError):
    """The database cannot be opened, read or written."""


class NotAnFsmDatabase(StoreError):
    """The file exists but is not an fsm_engine database (or not SQLite at all)."""


class InstanceNotFound(StoreError):
    """No instance with the given id exists in the store."""

    def __init__(self, instance_id: str) -> None:
        super().__init__(f"no instance with id {instance_id!r}", instance_id=instance_id)


class StaleWrite(StoreError):
    """A commit lost a race: the instance changed under us (lease lost or cancelled)."""


class StepRejected(StoreError):
    """The store refused one step of a batch (a value it cannot encode, a constraint).

    ``index`` is the step's position in the batch passed to ``Store.commit``;
    nothing of that batch was written, so the caller may commit the others
    again without it.  The runtime fails that step's instance with reason
    ``store_rejected``; the rest of the batch commits.
    """

    def __init__(self, message: str, *, index: int, instance_id: str | None = None) -> None:
        super().__init__(message, instance_id=instance_id)
        self.index = index


class StartKeyTaken(StoreError):
    """``Store.create`` refused an instance (nothing of its batch written): another instance
    of its machine holds its ``start_key`` (``machine``, ``key``: which)."""

    def __init__(self, machine: str, key: str) -> None:
        super().__init__(f"machine {machine!r} has an instance with start key {key!r} already")
        self.machine, self.key = machine, key


class FingerprintMismatch(StoreError):
    """An instance was started from a definition whose structure has since changed.

    Raised as such when the machine's ``version`` is the one stored but its
    fingerprint is not (bump ``version`` to migrate the instance).
    """


class VersionTooNew(FingerprintMismatch):
    """The instance was written under machine version ``stored``, newer than the code's
    ``code``: it is left as it is (a worker running the newer code takes it)."""

    def __init__(self, message: str, *, stored: int, code: int,
                 instance_id: str | None = None) -> None:
        super().__init__(message, instance_id=instance_id)
        self.stored = stored
        self.code = code


class NeedsMigration(FingerprintMismatch):
    """The instance cannot be upcast to the code's machine version: its state is gone and
    not mapped, an upcaster raised, or the result fails the context model (``cause``).
    Its row is left as it is, with reason ``needs_migration``."""

    def __init__(self, message: str, *, cause: str, instance_id: str | None = None,
                 state: str | None = None) -> None:
        super().__init__(message, instance_id=instance_id, state=state)
        self.cause = cause


class InvalidInput(FsmError):
    """Input or an action's update does not validate against the context model.

    ``index``: the position of the input at fault in a batch start
    (``Engine.start_many``), ``None`` otherwise.
    """

    index: int | None

    def __init__(self, message: str, *, index: int | None = None,
                 instance_id: str | None = None, state: str | None = None) -> None:
        super().__init__(message, instance_id=instance_id, state=state)
        self.index = index


class ReviewRefused(InvalidInput):
    """A review decision or claim was refused; nothing was written (``item_id`` names it)."""

    def __init__(self, message: str, *, item_id: str | None = None,
                 instance_id: str | None = None) -> None:
        super().__init__(message, instance_id=instance_id)
        self.item_id = item_id


class StartConflict(InvalidInput):
    """A start gave the key of an existing instance of its machine (``instance_id``) with
    another input: nothing was started (the same input returns that instance's id)."""

    def __init__(self, machine: str, key: str, instance_id: str) -> None:
        super().__init__(f"start key {key!r} of machine {machine!r} is instance "
                         f"{instance_id}, started with another input", instance_id=instance_id)
        self.machine, self.key = machine, key


class DebounceKeyTaken(InvalidInput):
    """Unpausing or restarting a debounced start (``instance_id``) would schedule it again
    while another instance of its machine (``holder``) is the scheduled one of its
    ``debounce_key`` (a newer burst began while it was paused or cancelled; at most one
    scheduled instance per machine and key): nothing was written."""

    def __init__(self, instance_id: str, machine: str, key: str, holder: str) -> None:
        super().__init__(f"instance {instance_id} cannot be scheduled again: debounce key "
                         f"{key!r} of machine {machine!r} has a newer burst, instance {holder} "
                         "(cancel one of them first)", instance_id=instance_id)
        self.machine, self.key, self.holder = machine, key, holder


class InstanceFinished(FsmError):
    """The instance is already in a final status; nothing to step."""


class ActionError(FsmError):
    """A state's action (or a guard) raised; the original exception is ``__cause__``.

    ``guards``: the guards evaluated before a guard raised, ``[name, result]`` each
    (recorded in the failed step's history row); empty for an action.
    """

    def __init__(self, message: str, *, instance_id: str | None = None,
                 state: str | None = None, attempt: int | None = None,
                 guards: list[list[Any]] | None = None) -> None:
        super().__init__(message, instance_id=instance_id, state=state)
        self.attempt = attempt
        self.guards: list[list[Any]] = list(guards or [])


class StepTimeout(FsmError):
    """An action ran longer than its state's ``timeout`` (seconds)."""

    def __init__(self, seconds: float, *, instance_id: str | None = None,
                 state: str | None = None) -> None:
        super().__init__(f"action timed out after {seconds:g}s",
                         instance_id=instance_id, state=state)
        self.seconds = seconds


class BudgetExhausted(FsmError):
    """An LLM call would exceed, or has exceeded, a token budget.

    ``scope`` is ``"instance"`` (the instance's budget) or ``"state"`` (the
    state's per-visit ``State.token_budget``); ``needed`` is the prompt's
    counted tokens when the call was refused because the prompt alone does not
    fit what is left (0: the budget was already spent).  No tokens were spent on
    a refused call.
    """

    def __init__(self, used: int, budget: int, *, scope: str = "instance", needed: int = 0,
                 instance_id: str | None = None, state: str | None = None) -> None:
        which = "token budget" if scope == "instance" else "state token budget"
        why = (f"the prompt needs ~{needed} tokens, {max(0, budget - used)} of {budget} left"
               if needed else f"{used} of {budget} tokens used")
        super().__init__(f"{which} exhausted: {why}", instance_id=instance_id, state=state)
        self.used = used
        self.budget = budget
        self.scope = scope
        self.needed = needed


class CircuitOpen(FsmError):
    """The circuit breaker for a provider + model is open; no call was made."""

    def __init__(self, name: str, retry_in: float) -> None:
        super().__init__(f"circuit {name!r} is open (next probe in {retry_in:.1f}s)")
        self.name = name
        self.retry_in = retry_in


class RateLimitWait(FsmError):
    """A provider + model's shared rate limit (``fsm_engine.policies.RateLimit``) has no
    room for a call now; no call was made.  Not a failure: the step ends and the
    instance waits (status ``waiting``, reason ``rate_limited``) ``retry_in`` seconds,
    spending no retry attempt.  ``what`` says which limit (``"tokens"``/``"requests"``)."""

    def __init__(self, name: str, retry_in: float, what: str) -> None:
        super().__init__(f"rate limit of {name!r} reached ({what} per window); "
                         f"room again in {retry_in:.2f}s")
        self.name, self.retry_in, self.what = name, retry_in, what


class StructuredOutputError(FsmError):
    """Model output could not be parsed, repaired and validated.

    ``raw`` is the model text, ``errors`` the parse/validation messages,
    ``truncated`` is True when the output was cut at ``max_tokens``.
    """

    def __init__(self, message: str, *, raw: str = "", errors: list[str] | None = None,
                 truncated: bool = False, repairs: list[str] | None = None) -> None:
        super().__init__(message)
        self.raw = raw
        self.errors = list(errors or [])
        self.truncated = truncated
        self.repairs = list(repairs or [])


class ProviderError(FsmError):
    """An LLM provider call failed.

    ``retryable`` tells the retry policy whether another attempt may help;
    ``prompt_tokens``/``completion_tokens`` hold usage the provider billed
    before failing (0 when unknown).
    """

    retryable: bool = False

    def __init__(self, message: str, *, status: int | None = None,
                 retry_after: float | None = None, prompt_tokens: int = 0,
                 completion_tokens: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens


class ProviderUnavailable(ProviderError):
    """Connection refused or reset, name resolution failed: retryable."""

    retryable = True


class ProviderTimeout(ProviderError):
    """The provider did not answer in time: retryable."""

    retryable = True


class DeadlineExceeded(ProviderTimeout):
    """An HTTP exchange (connect + head + body) passed its overall deadline: retryable."""


class ResponseTooLarge(ProviderError):
    """A response's body passed the byte cap (``FSM_HTTP_MAX_BYTES``): not retryable."""

    retryable = False


class CertificateError(ProviderError):
    """The peer's TLS certificate failed verification: not retryable."""

    retryable = False


class RateLimited(ProviderError):
    """HTTP 429; ``retry_after`` (seconds) comes from the ``Retry-After`` header."""

    retryable = True


class ServerError(ProviderError):
    """HTTP 5xx from the provider: retryable."""

    retryable = True


class ClientError(ProviderError):
    """HTTP 4xx other than 429 (bad request, auth): not retryable."""

    retryable = False


__all__ = [
    "FsmError", "DefinitionError", "MachineLoadError", "MachineRefused", "StoreError",
    "NotAnFsmDatabase",
    "InstanceNotFound", "StaleWrite", "StepRejected", "FingerprintMismatch", "VersionTooNew",
    "NeedsMigration", "InvalidInput",
    "InstanceFinished", "ActionError", "StepTimeout", "BudgetExhausted", "CircuitOpen",
    "StructuredOutputError", "ProviderError", "ProviderUnavailable", "ProviderTimeout",
    "RateLimited", "ServerError", "ClientError", "DeadlineExceeded", "ResponseTooLarge",
    "CertificateError",
]
