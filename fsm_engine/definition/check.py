"""Check a machine definition and resolve its references, reporting every problem at once.

``check(machine)`` returns a :class:`Checked` (the machine plus resolved
callables) or raises one :class:`~fsm_engine.errors.DefinitionError` whose
``problems`` name each offending state and transition.  Checks, after
python-statemachine's and Step Functions' validators: initial state exists;
at least one final state; names unique and non-empty; transition ends exist;
no transition leaves a final state; every state reachable from the initial
one; every non-final state has a path to a final state; actions and guards
resolve to callables taking 1 or 2 positional arguments; guards are not
``async`` (a coroutine is always truthy); fallbacks and
policies valid; ``max_transitions`` ≥ 1, ``token_budget`` ≥ 0; the context is
a pydantic model; ``version`` ≥ 1 with ``migrations`` covering 2..version
(functions of one argument, or None) and ``renamed_states`` naming declared
states; timer edges (``after=``) only out of states that wait, with positive delays
(``definition.timers``); each kind of step a state declares (wait, review, fan-out,
agent, a plug-in's) by its own ``problems`` (``definition.kind``), listed with the
state's other problems.
"""

from __future__ import annotations

import inspect
import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ..errors import DefinitionError
from .kind import Site, kinds_of
from .refs import Ref, as_refs, ref_name
from .spec import Machine, Transition
from .timers import problems as timer_problems


@dataclass(frozen=True)
class Checked:
    """A machine that passed every check, with references resolved to callables."""

    machine: Machine
    actions: Mapping[str, Callable[..., Any]]
    guards: Mapping[Ref, Callable[..., Any]]   # the declared reference -> callable


def _resolve(ref: Ref, ns: Mapping[str, Any]) -> Callable[..., Any] | None:
    if callable(ref):
        return ref
    obj: Any = ns
    for i, part in enumerate(ref.split(".")):
        obj = obj.get(part) if i == 0 else getattr(obj, part, None)
        if obj is None:
            return None
    return obj if callable(obj) else None


def _accepts(fn: Callable[..., Any], counts: tuple[int, ...]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    params = list(sig.parameters.values())
    if any(p.kind is p.KEYWORD_ONLY and p.default is p.empty for p in params):
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    return any(len(required) <= n <= len(positional) for n in counts)


def _is_async(fn: Callable[..., Any]) -> bool:
    """True for ``async def`` functions and async generators (also as callable objects or
    ``functools.partial``): calling one returns an awaitable, always truthy."""
    target = getattr(fn, "func", fn)  # functools.partial
    # the callable object's own __call__, to ask whether that is async
    call = getattr(type(target), "__call__", None) if not inspect.isroutine(target) else None  # noqa: B004
    return any(inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f)
               for f in (target, call) if f is not None)


def _graph(machine: Machine, names: list[str]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {n: set() for n in names}
    for t in machine.all_transitions():
        for src in t.sources(names, machine.finals):
            if src in edges and t.dest in edges:
                edges[src].add(t.dest)
    return edges


def _reach(start: set[str], edges: dict[str, set[str]]) -> set[str]:
    seen, todo = set(start), deque(start)
    while todo:
        for nxt in edges.get(todo.popleft(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _structure(m: Machine, names: list[str], problems: list[str]) -> None:
    known = set(names)
    _names(m, names, problems)
    finals = {s.name for s in m.states if s.final}
    if not finals:
        problems.append("no final state")
    for t in m.all_transitions():
        _transition_ends(t, names, m.finals, known, finals, problems)


def _names(m: Machine, names: list[str], problems: list[str]) -> None:
    """The machine's and states' names and the initial state."""
    if not m.name:
        problems.append("the machine has no name")
    for n in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"state {n!r} is declared more than once")
    if any(not n for n in names):
        problems.append("a state has an empty name")
    if not m.initial:
        problems.append("no initial state")
    elif m.initial not in names:
        problems.append(f"initial state {m.initial!r} is not a declared state")


def _transition_ends(t: Transition, names: list[str], machine_finals: frozenset[str], known: set[str],
                     finals: set[str], problems: list[str]) -> None:
    """One transition's sources, destination and trigger."""
    label = _label(t)
    for src in t.sources(names, machine_finals):
        if src not in known:
            problems.append(f"transition {label}: unknown source state {src!r}")
        elif src in finals:
            problems.append(f"transition {label}: leaves final state {src!r}")
    if t.dest not in known:
        problems.append(f"transition {label}: unknown dest state {t.dest!r}")
    if not t.trigger:
        problems.append(f"transition {label}: empty trigger")


def _paths(m: Machine, names: list[str], problems: list[str]) -> None:
    if m.initial not in names:
        return
    edges = _graph(m, names)
    # the runtime moves unhandled failures (and routed loop caps / open breakers) there
    implicit = {n for n in (m.failure_state, m.on_loop_limit, m.on_circuit_open) if n is not None}
    reachable = _reach({m.initial} | (implicit & set(names)), edges)
    for n in names:
        if n not in reachable and n not in implicit:
            problems.append(f"state {n!r} is unreachable from initial state {m.initial!r}")
    reverse: dict[str, set[str]] = {n: set() for n in names}
    for src, dests in edges.items():
        for d in dests:
            reverse[d].add(src)
    finals = {s.name for s in m.states if s.final}
    can_finish = _reach(finals, reverse)
    for s in m.states:
        if not s.final and s.name not in can_finish:
            problems.append(f"state {s.name!r} has no path to a final state")


def _label(t: Transition) -> str:
    src = t.source if isinstance(t.source, str) else ",".join(t.source)
    return f"{t.trigger!r} ({src} -> {t.dest})"


def _states(m: Machine, names: list[str], problems: list[str],
            actions: dict[str, Callable[..., Any]]) -> None:
    ns = m.namespace or {}
    for s in m.states:
        where = f"state {s.name!r}"
        _action(s, ns, where, problems, actions)
        problems.extend(f"{where}: {p}" for p in _kind_problems(s, names))
        problems.extend(f"{where}: {p}" for p in _policy_problems(s))
        site = Site(m, s, problems_of=_problems_of)
        for kind in kinds_of(s):  # wait, review, fan_out, agent, a plug-in's (``kind``)
            problems.extend(kind.problems(site))
        problems.extend(f"{where}: {p}" for p in _name_problems(s))


def _action(s: Any, ns: Mapping[str, Any], where: str, problems: list[str],
            actions: dict[str, Callable[..., Any]]) -> None:
    """Resolve the state's action into ``actions`` or say why it cannot be."""
    if s.action is None:
        return
    fn = _resolve(s.action, ns)
    if fn is None:
        problems.append(f"{where}: action {ref_name(s.action)!r} does not resolve to a callable")
    elif not _accepts(fn, (1, 2)):
        problems.append(f"{where}: action {ref_name(s.action)!r} must take (ctx) or (ctx, step)")
    else:
        actions[s.name] = fn


def _kind_problems(s: Any, names: list[str]) -> list[str]:
    """What a final, failure, fallback or inline state may not combine (a kind's own
    combinations are its ``problems``, ``definition.kind``)."""
    out: list[str] = []
    if s.final and (s.action or s.wait):
        out.append("a final state cannot have an action or wait")
    if s.failure and not s.final:
        out.append("failure=True needs final=True")
    if s.fallback is not None and s.fallback not in names:
        out.append(f"fallback {s.fallback!r} is not a declared state")
    if s.timeout is not None and s.timeout <= 0:
        out.append("timeout must be > 0 seconds")
    if s.inline and s.timeout is not None:
        out.append("an inline action cannot be cut short: drop timeout or inline")
    return out


def _policy_problems(s: Any) -> list[str]:
    """The state's retry policy, token budget and skip default."""
    out: list[str] = []
    if s.retry is not None:
        out.extend(f"retry policy: {p}" for p in s.retry.problems())
    if s.token_budget is not None and (not isinstance(s.token_budget, int) or s.token_budget < 0):
        out.append("token_budget must be an int >= 0 tokens")
    if s.skippable and s.default_output is None:
        out.append("skippable needs a default_output")
    return out


def _name_problems(s: Any) -> list[str]:
    """The state's reply cache, model names (``llm``, ``repair_llm``) and queue name."""
    out: list[str] = []
    if s.cache is not None:
        out.extend(f"cache: {p}" for p in s.cache.problems())
        if s.side_effect:
            out.append("a side-effect state cannot use a reply cache")
    for key in ("llm", "repair_llm"):
        value = getattr(s, key)
        if value is not None and not (isinstance(value, str) and _MODEL_NAME.fullmatch(value)):
            out.append(f"{key} must be a model name (letters, digits, '_' or '-'), not {value!r}")
    if not (isinstance(s.queue, str) and _MODEL_NAME.fullmatch(s.queue)):
        out.append(f"queue must be a name (a letter, then letters, digits, '_' or '-'), "
                   f"not {s.queue!r}")
    return out


def _versions(m: Machine, names: list[str], problems: list[str]) -> None:
    """``version``, ``migrations`` and ``renamed_states`` fit together (see ``Machine``)."""
    v = m.version
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        problems.append(f"version must be an int >= 1, not {v!r}")
        return
    problems.extend(_migration_problems(m, v))
    for old, new in m.renamed_states.items():
        if new not in names:
            problems.append(f"renamed_states[{old!r}]: target {new!r} is not a declared state")
        if old in names:
            problems.append(f"renamed_states[{old!r}]: {old!r} is still a declared state")
    if (m.migrations or m.renamed_states) and v == 1:
        problems.append("migrations and renamed_states need version >= 2")


def _migration_problems(m: Machine, v: int) -> list[str]:
    """``migrations`` covers 2..``v`` with pure functions of one argument (or None)."""
    keys = set(m.migrations)
    wanted = set(range(2, v + 1))
    out = [f"migrations[{k!r}]: not a version in 2..{v} (version={v})"
           for k in sorted(keys - wanted, key=repr)]
    if keys & wanted and wanted - keys:
        out.append("migrations must cover every version 2.." f"{v}: missing "
                   + ", ".join(map(str, sorted(wanted - keys)))
                   + " (None for a version whose context did not change)")
    for k in sorted(keys & wanted):
        fn = m.migrations[k]
        if fn is not None and not (callable(fn) and _accepts(fn, (1,))):
            out.append(f"migrations[{k}]: must be a function of one argument "
                       "(the context dict), or None")
        elif fn is not None and _is_async(fn):
            out.append(f"migrations[{k}]: is async; an upcaster is a pure function")
    return out


def _routes(m: Machine, problems: list[str]) -> None:
    """``on_loop_limit`` / ``on_circuit_open`` must name review states; ``on_exhausted``
    / ``on_retries_exhausted`` are ``"pause"``, ``"fail"`` or ``None``."""
    if m.on_retries_exhausted not in (None, "pause", "fail"):
        problems.append(f"on_retries_exhausted must be 'pause', 'fail' or None, not "
                        f"{m.on_retries_exhausted!r}")
    for s in m.states:
        if s.on_exhausted not in (None, "pause", "fail"):
            problems.append(f"state {s.name!r}: on_exhausted must be 'pause', 'fail' or None, "
                            f"not {s.on_exhausted!r}")
    for key in ("on_loop_limit", "on_circuit_open"):
        name = getattr(m, key)
        if name is None:
            continue
        state = next((s for s in m.states if s.name == name), None)
        if state is None or state.review is None:
            problems.append(f"{key} {name!r} is not a review state of the machine")


def _outcome(m: Machine, problems: list[str]) -> None:
    """``outcome`` names context fields (a dotted path starts at one)."""
    fields = getattr(m.context, "model_fields", {})
    for path in m.outcome:
        if not isinstance(path, str) or path.partition(".")[0] not in fields:
            problems.append(f"outcome {path!r} is not a field of the context")


_MODEL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


def _guards(m: Machine, problems: list[str], guards: dict[Ref, Callable[..., Any]]) -> None:
    ns = m.namespace or {}
    for t in m.all_transitions():
        for g in as_refs(t.conditions) + as_refs(t.unless):
            fn = _resolve(g, ns)
            name = ref_name(g) or "?"
            if fn is None:
                problems.append(f"transition {_label(t)}: guard {name!r} does not resolve to a callable")
            elif not _accepts(fn, (1, 2)):
                problems.append(f"transition {_label(t)}: guard {name!r} must take (ctx) or (ctx, run)")
            elif _is_async(fn):
                problems.append(f"transition {_label(t)}: guard {name!r} is async; guards are "
                                "plain functions (pure and cheap: do the I/O in an action)")
            else:
                guards[g] = fn


def check(machine: Machine) -> Checked:
    """Validate ``machine``; raise ``DefinitionError`` listing every problem found."""
    problems: list[str] = []
    if not (isinstance(machine.context, type) and issubclass(machine.context, BaseModel)):
        problems.append("context must be a pydantic BaseModel subclass")
    if machine.max_transitions < 1:
        problems.append("max_transitions must be >= 1")
    if machine.token_budget is not None and machine.token_budget < 0:
        problems.append("token_budget must be >= 0 tokens")
    names = [s.name for s in machine.states]
    _structure(machine, names, problems)
    _paths(machine, names, problems)
    actions: dict[str, Callable[..., Any]] = {}
    guards: dict[Ref, Callable[..., Any]] = {}
    _states(machine, names, problems, actions)
    _guards(machine, problems, guards)
    _routes(machine, problems)
    problems.extend(timer_problems(machine, machine.all_transitions(), _label))
    _outcome(machine, problems)
    _versions(machine, names, problems)
    if problems:
        raise DefinitionError(machine.name or "?", problems)
    return Checked(machine, actions, guards)


def _problems_of(machine: Machine) -> list[str]:
    """Every problem of ``machine`` (``[]`` when it passes): a fan-out's branch machines."""
    try:
        check(machine)
    except DefinitionError as exc:
        return list(exc.problems)
    return []
