"""Tests for fsm_engine.definition: checks (every problem named, all at once), export,
fingerprint, string references, and ``load_machine`` errors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from fsm_engine import DefinitionError, Machine, MachineLoadError, RetryPolicy, State, Transition
from fsm_engine.definition import check, fingerprint
from fsm_engine.runtime import load_machine


class Ctx(BaseModel):
    """Context of the test machines."""

    n: int = 0


# -- actions and guards referenced by name (resolved in this module's globals) ------
def work(ctx: Ctx) -> dict[str, Any]:
    """A one-argument action."""
    return {"n": ctx.n + 1}


def work_with_step(ctx: Ctx, step: Any) -> None:
    """A two-argument action."""


def is_ready(ctx: Ctx) -> bool:
    """A one-argument guard."""
    return ctx.n > 0


def is_cheap(ctx: Ctx, run: Any) -> bool:
    """A two-argument guard."""
    return True


def no_args() -> bool:
    """Wrong arity for a guard or an action: takes nothing."""
    return True


def three_args(ctx: Ctx, run: Any, extra: Any) -> bool:
    """Wrong arity for a guard or an action: needs three."""
    return True


class Helpers:
    """Holds a callable reached through a dotted reference."""

    @staticmethod
    def work(ctx: Ctx) -> None:
        """Action reached as ``"Helpers.work"``."""


NOT_CALLABLE = 42


def states(*extra: State, replace: dict[str, State] | None = None) -> list[State]:
    """The valid base states (start -> middle -> done, plus failure state), edited."""
    base = [State("start", action=work), State("middle", action="work_with_step"),
            State("done", final=True), State("failed", final=True, failure=True)]
    replace = replace or {}
    return [replace.get(s.name, s) for s in base] + list(extra)


def moves(*extra: Transition) -> list[Transition]:
    """The valid base transitions, plus ``extra``."""
    return [Transition("go", "start", "middle", conditions="is_ready"),
            Transition("finish", "middle", "done", unless=[is_cheap])] + list(extra)


def make(st: list[State] | None = None, tr: list[Transition] | None = None,
         initial: str = "start", **kw: Any) -> Machine:
    """A machine built in this module (so string references resolve here)."""
    return Machine(name="m", states=states() if st is None else st,
                   transitions=moves() if tr is None else tr, initial=initial, context=Ctx, **kw)


def rejected(machine: Machine) -> DefinitionError:
    """Check ``machine`` and return the DefinitionError it must raise."""
    with pytest.raises(DefinitionError) as info:
        check(machine)
    err = info.value
    assert "\n" not in str(err)
    for problem in err.problems:  # every problem is also in the one-line message
        assert problem in str(err)
    return err


def only(err: DefinitionError, *needles: str) -> str:
    """The single problem of ``err`` containing every needle (fails otherwise)."""
    hits = [p for p in err.problems if all(n in p for n in needles)]
    assert len(hits) == 1, (needles, err.problems)
    return hits[0]


# -- the base machine is valid ------------------------------------------------------
def test_base_machine_passes_and_resolves_references() -> None:
    checked = check(make())
    assert checked.actions == {"start": work, "middle": work_with_step}
    assert checked.guards == {"is_ready": is_ready, is_cheap: is_cheap}


def test_dotted_string_reference_resolves_in_defining_module() -> None:
    m = make(st=states(replace={"middle": State("middle", action="Helpers.work")}))
    assert check(m).actions["middle"] is Helpers.work


def test_namespace_defaults_to_globals_of_the_defining_module() -> None:
    assert make().namespace is globals()


def test_explicit_namespace_is_used_for_string_references() -> None:
    def elsewhere(ctx: Ctx) -> None:
        return None
    m = Machine(name="m", states=states(replace={"middle": State("middle", action="elsewhere")}),
                transitions=moves(), initial="start", context=Ctx,
                namespace={"elsewhere": elsewhere, "is_ready": is_ready})
    assert check(m).actions["middle"] is elsewhere


# -- each kind of problem is named ---------------------------------------------------
def test_no_initial_state() -> None:
    err = rejected(make(initial=""))
    assert err.problems == ["no initial state"]
    assert err.machine == "m"


def test_unknown_initial_state() -> None:
    err = rejected(make(initial="nowhere"))
    assert only(err, "initial", "'nowhere'", "not a declared state")


def test_unknown_source_state_names_transition() -> None:
    err = rejected(make(tr=moves(Transition("jump", "ghost", "done"))))
    assert err.problems == ["transition 'jump' (ghost -> done): unknown source state 'ghost'"]


def test_unknown_source_in_a_source_list() -> None:
    err = rejected(make(tr=moves(Transition("jump", ["middle", "ghost"], "done"))))
    assert only(err, "'jump'", "unknown source state 'ghost'")


def test_unknown_dest_state_names_transition() -> None:
    err = rejected(make(tr=moves(Transition("leap", "middle", "nowhere"))))
    assert err.problems == ["transition 'leap' (middle -> nowhere): unknown dest state 'nowhere'"]


def test_unreachable_state() -> None:
    err = rejected(make(st=states(State("island", action=work)),
                        tr=moves(Transition("swim", "island", "done"))))
    assert err.problems == ["state 'island' is unreachable from initial state 'start'"]


def test_unreachable_final_state_that_is_not_the_failure_state() -> None:
    err = rejected(make(st=states(State("orphan_end", final=True))))
    assert only(err, "'orphan_end'", "unreachable")


def test_only_the_failure_state_is_exempt_from_reachability() -> None:
    check(make())  # 'failed' has no incoming transition and that is fine
    err = rejected(make(st=states(State("failed_too", final=True, failure=True))))
    assert only(err, "'failed_too'", "unreachable")
    assert not [p for p in err.problems if "'failed'" in p]


def test_trap_state_without_path_to_final() -> None:
    err = rejected(make(st=states(State("loop", action=work)),
                        tr=moves(Transition("enter", "start", "loop"),
                                 Transition("again", "loop", "loop"))))
    assert err.problems == ["state 'loop' has no path to a final state"]


def test_no_final_state() -> None:
    st = [State("start", action=work), State("middle", action=work)]
    err = rejected(make(st=st, tr=[Transition("go", "start", "middle"),
                                   Transition("back", "middle", "start")]))
    assert "no final state" in err.problems
    assert only(err, "'start'", "no path to a final state")


def test_duplicate_state() -> None:
    err = rejected(make(st=states(State("middle", action=work))))
    assert err.problems == ["state 'middle' is declared more than once"]


def test_unresolved_action_string() -> None:
    err = rejected(make(st=states(replace={"middle": State("middle", action="no_such_action")})))
    assert err.problems == ["state 'middle': action 'no_such_action' does not resolve to a callable"]


@pytest.mark.parametrize("ref", ["NOT_CALLABLE", "Helpers.missing", "nope.work"])
def test_action_string_must_resolve_to_a_callable(ref: str) -> None:
    err = rejected(make(st=states(replace={"middle": State("middle", action=ref)})))
    assert only(err, "'middle'", repr(ref), "does not resolve")


@pytest.mark.parametrize("field", ["conditions", "unless"])
def test_unresolved_guard_string_names_transition(field: str) -> None:
    bad = Transition("skip", "start", "done", **{field: "no_such_guard"})
    err = rejected(make(tr=moves(bad)))
    assert err.problems == [
        "transition 'skip' (start -> done): guard 'no_such_guard' does not resolve to a callable"]


@pytest.mark.parametrize("guard", [no_args, three_args, "three_args"])
def test_guard_with_wrong_arity(guard: Any) -> None:
    err = rejected(make(tr=moves(Transition("skip", "start", "done", conditions=guard))))
    problem = only(err, "'skip'", "guard")
    assert "must take (ctx) or (ctx, run)" in problem


def test_guard_with_default_third_argument_is_accepted() -> None:
    def flexible(ctx: Ctx, run: Any = None, extra: Any = None) -> bool:
        return True
    check(make(tr=moves(Transition("skip", "start", "done", conditions=flexible))))


def needs_flag(ctx: Ctx, *, flag: bool) -> bool:
    """Cannot be called as ``fn(ctx)``: a required keyword-only argument."""
    return flag


def test_callable_with_required_keyword_only_argument_is_rejected() -> None:
    err = rejected(make(st=states(replace={"middle": State("middle", action=needs_flag)}),
                        tr=moves(Transition("skip", "start", "done", conditions=needs_flag))))
    assert only(err, "'middle'", "must take (ctx) or (ctx, step)")
    assert only(err, "'skip'", "must take (ctx) or (ctx, run)")


@pytest.mark.parametrize("action", [no_args, three_args])
def test_action_with_wrong_arity(action: Any) -> None:
    err = rejected(make(st=states(replace={"middle": State("middle", action=action)})))
    assert only(err, "'middle'", "must take (ctx) or (ctx, step)")


def test_transition_leaving_a_final_state() -> None:
    err = rejected(make(tr=moves(Transition("reopen", "done", "start"))))
    assert err.problems == ["transition 'reopen' (done -> start): leaves final state 'done'"]


def test_wildcard_source_transition_is_accepted() -> None:
    check(make(st=states(State("cancelled", final=True)),
               tr=moves(Transition("cancel", "*", "cancelled"))))


def test_bad_fallback() -> None:
    err = rejected(make(st=states(replace={"middle": State("middle", action=work,
                                                            fallback="nowhere")})))
    assert only(err, "state 'middle'", "fallback 'nowhere' is not a declared state")


@pytest.mark.parametrize("policy, why", [
    (RetryPolicy(max_attempts=0), "max_attempts must be >= 1"),
    (RetryPolicy(backoff_rate=0.5), "backoff_rate must be >= 1"),
    (RetryPolicy(jitter=2.0), "jitter must be within [0, 1]"),
    (RetryPolicy(initial_interval=-1.0), "intervals must be >= 0 seconds"),
])
def test_bad_retry_policy(policy: RetryPolicy, why: str) -> None:
    err = rejected(make(st=states(replace={"middle": State("middle", action=work,
                                                            retry=policy)})))
    assert err.problems == [f"state 'middle': retry policy: {why}"]


def test_skippable_without_default_output() -> None:
    err = rejected(make(st=states(replace={"middle": State("middle", action=work,
                                                            skippable=True)})))
    assert err.problems == ["state 'middle': skippable needs a default_output"]
    check(make(st=states(replace={"middle": State("middle", action=work, skippable=True,
                                                   default_output={"n": 0})})))


def test_several_problems_are_all_reported_in_one_error() -> None:
    st = states(State("island", action="no_such_action"),
                State("middle", action=work),  # duplicate
                replace={"start": State("start", action=work, fallback="nowhere",
                                        skippable=True, retry=RetryPolicy(max_attempts=0))})
    tr = moves(Transition("leap", "middle", "void"), Transition("reopen", "done", "middle"),
               Transition("skip", "start", "done", conditions=[no_args, "no_such_guard"]))
    err = rejected(make(st=st, tr=tr))
    expected = [
        ("'middle'", "declared more than once"),
        ("'leap'", "unknown dest state 'void'"),
        ("'reopen'", "leaves final state 'done'"),
        ("'island'", "unreachable"),
        ("'island'", "'no_such_action'", "does not resolve"),
        ("state 'start'", "fallback 'nowhere'"),
        ("state 'start'", "max_attempts must be >= 1"),
        ("state 'start'", "skippable needs a default_output"),
        ("'skip'", "'no_args'", "must take"),
        ("'skip'", "'no_such_guard'", "does not resolve"),
    ]
    for needles in expected:
        assert any(all(n in p for n in needles) for p in err.problems), (needles, err.problems)
    assert len(err.problems) >= len(expected)
    assert str(err).startswith("machine 'm' is invalid: ")


def test_machine_level_values_are_checked() -> None:
    err = rejected(Machine(name="m", states=states(), transitions=moves(), initial="start",
                           context=dict, max_transitions=0, token_budget=-1))  # type: ignore[arg-type]
    assert "context must be a pydantic BaseModel subclass" in err.problems
    assert "max_transitions must be >= 1" in err.problems
    assert "token_budget must be >= 0 tokens" in err.problems


# -- export and fingerprint ----------------------------------------------------------
def test_export_shape_is_plain_json() -> None:
    m = make(st=states(replace={"middle": State("middle", action="work_with_step",
                                                 retry=RetryPolicy(max_attempts=2),
                                                 fallback="failed")}), token_budget=500)
    doc = m.export()
    assert json.loads(json.dumps(doc)) == doc
    assert set(doc) == {"name", "initial", "max_transitions", "token_budget", "states",
                        "transitions"}
    assert (doc["name"], doc["initial"], doc["max_transitions"], doc["token_budget"]) == \
        ("m", "start", 100, 500)
    assert [s["name"] for s in doc["states"]] == ["start", "middle", "done", "failed"]
    start, middle = doc["states"][0], doc["states"][1]
    assert start["action"] == "work" and middle["action"] == "work_with_step"
    assert middle["retry"]["max_attempts"] == 2 and middle["fallback"] == "failed"
    assert doc["states"][3]["final"] is True and doc["states"][3]["failure"] is True
    assert doc["transitions"] == [
        {"trigger": "go", "source": "start", "dest": "middle", "conditions": ["is_ready"],
         "unless": []},
        {"trigger": "finish", "source": "middle", "dest": "done", "conditions": [],
         "unless": ["is_cheap"]},
        {"trigger": "fallback", "source": "middle", "dest": "failed", "conditions": [],
         "unless": []},
    ]


def test_export_expands_a_source_list_to_one_entry_per_source() -> None:
    m = make(tr=moves(Transition("bail", ["start", "middle"], "failed")))
    bails = [t for t in m.export()["transitions"] if t["trigger"] == "bail"]
    assert [t["source"] for t in bails] == ["start", "middle"]


def test_fingerprint_is_stable_hex() -> None:
    a, b = fingerprint(make()), fingerprint(make())
    assert a == b and len(a) == 16 and int(a, 16) >= 0


@pytest.mark.parametrize("changed", [
    lambda: make(tr=[Transition("go", "start", "middle", conditions="is_ready"),
                     Transition("finish", "middle", "failed", unless=[is_cheap])]),
    lambda: make(tr=[Transition("go!", "start", "middle", conditions="is_ready"),
                     Transition("finish", "middle", "done", unless=[is_cheap])]),
    lambda: make(tr=[Transition("go", "start", "middle", conditions="is_cheap"),
                     Transition("finish", "middle", "done", unless=[is_cheap])]),
    lambda: make(tr=[Transition("go", "start", "middle"),
                     Transition("finish", "middle", "done", unless=[is_cheap])]),
    lambda: make(st=states(replace={"middle": State("middle", action=work,
                                                     retry=RetryPolicy())})),
], ids=["dest", "trigger", "guard-swapped", "guard-removed", "policy"])
def test_fingerprint_changes_with_structure(changed: Any) -> None:
    assert fingerprint(changed()) != fingerprint(make())


def test_fingerprint_ignores_a_state_description() -> None:
    reworded = make(st=states(replace={"middle": State("middle", action="work_with_step",
                                                        description="now documented")}))
    assert fingerprint(reworded) == fingerprint(make())


MODULE = '''
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition

class C(BaseModel):
    n: int = 0

def act(ctx):
    return {BODY}

def ok(ctx):
    return True

machine = Machine(name="fp", context=C, initial="a",
                  states=[State("a", action=act), State("z", final=True)],
                  transitions=[Transition("t", "a", "z", conditions={GUARD})])
'''


def write_module(path: Path, body: str = '{"n": 1}', guard: str = "ok") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(MODULE.replace("{BODY}", body).replace("{GUARD}", guard))
    return str(path)


def test_fingerprint_ignores_an_edited_action_body_but_not_an_edited_guard(tmp_path: Path) -> None:
    original, _ = load_machine(write_module(tmp_path / "v1" / "m.py"))
    body_edit, _ = load_machine(write_module(tmp_path / "v2" / "m.py", body='{"n": ctx.n + 7}'))
    guard_edit, _ = load_machine(write_module(tmp_path / "v3" / "m.py", guard="[ok, ok]"))
    assert fingerprint(body_edit) == fingerprint(original)
    assert fingerprint(guard_edit) != fingerprint(original)


# -- load_machine ----------------------------------------------------------------------
def load_error(ref: str) -> MachineLoadError:
    with pytest.raises(MachineLoadError) as info:
        load_machine(ref)
    err = info.value
    assert isinstance(err, DefinitionError)
    assert "\n" not in str(err)
    assert str(err).startswith(f"cannot load machine {ref!r}: ")
    return err


def test_load_missing_file(tmp_path: Path) -> None:
    err = load_error(str(tmp_path / "missing.py"))
    assert "no such file" in str(err)


def test_load_missing_dotted_module() -> None:
    err = load_error("no_such_package_xyz.machine")
    assert "module not found" in str(err) and "no_such_package_xyz" in str(err)


def test_load_module_with_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("x = 1\ndef oops(:\n    pass\n")
    err = load_error(str(path))
    assert "syntax error at line 2" in str(err)


def test_load_module_with_no_machine(tmp_path: Path) -> None:
    path = tmp_path / "empty.py"
    path.write_text("VALUE = 1\n")
    assert "defines no fsm_engine.Machine" in str(load_error(str(path)))


def test_load_module_whose_import_raises(tmp_path: Path) -> None:
    path = tmp_path / "raises.py"
    path.write_text("raise RuntimeError('boom\\nsecond line')\n")
    err = load_error(str(path))
    assert "import failed: RuntimeError: boom second line" in str(err)
    assert err.__cause__ is None and err.__suppress_context__


def test_load_module_with_two_machines_needs_a_name(tmp_path: Path) -> None:
    path = Path(write_module(tmp_path / "two" / "m.py"))
    path.write_text(path.read_text().replace("machine = Machine", "first = Machine")
                    + "other = Machine(name='o', context=C, initial='a',"
                      " states=[State('a', final=True)], transitions=[])\n")
    assert "define exactly one" in str(load_error(str(path)))
    machine, canonical = load_machine(f"{path}:other")
    assert machine.name == "o" and canonical == f"{path}:other"


def test_load_attr_that_is_not_a_machine(tmp_path: Path) -> None:
    path = write_module(tmp_path / "attr" / "m.py")
    assert "'C' is not a fsm_engine.Machine" in str(load_error(f"{path}:C"))


def test_load_returns_machine_and_a_path_relative_to_the_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_module(tmp_path / "rel" / "m.py")
    monkeypatch.chdir(tmp_path)
    machine, canonical = load_machine("rel/m.py")
    assert machine.name == "fp"
    assert canonical == os.path.join("rel", "m.py")  # loads again on any host with the code
    check(machine)
    monkeypatch.chdir(tmp_path.parent)  # elsewhere, resolved under the declared root
    monkeypatch.setenv("FSM_MACHINES_ROOT", str(tmp_path))
    again, ref = load_machine(canonical)
    assert (again.name, ref) == ("fp", canonical)


def test_load_by_dotted_name_keeps_the_dotted_name() -> None:
    machine, canonical = load_machine("machines.moderation")
    assert canonical == "machines.moderation" and machine.name == "moderation"
