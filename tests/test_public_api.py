"""The curated public API: ``__all__`` is exactly what we promise, errors share one root,
and nothing in the package touches pickle."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import fsm_engine
from fsm_engine import errors

PACKAGE = Path(fsm_engine.__file__).resolve().parent

EXPECTED = {
    # definition
    "Machine", "State", "Transition", "fire", "Fire", "RunInfo", "FALLBACK", "BUDGET_EXHAUSTED",
    "RetryPolicy", "BreakerPolicy", "load_machine",
    # fan-out and DAGs
    "Parallel", "Map", "Branch", "Completion", "merge_outputs", "Node", "dag",
    # runtime
    "Engine", "Step",
    # store
    "Store", "SqliteStore", "open_store", "InstanceRecord", "HistoryRow",
    # errors
    "FsmError", "DefinitionError", "MachineLoadError", "StoreError", "NotAnFsmDatabase",
    "InstanceNotFound", "StaleWrite", "StepRejected", "FingerprintMismatch", "InvalidInput", "InstanceFinished",
    "ActionError", "StepTimeout", "BudgetExhausted", "CircuitOpen", "StructuredOutputError",
    "ProviderError", "ProviderUnavailable", "ProviderTimeout", "RateLimited", "ServerError",
    "ClientError", "Review", "ReviewRefused", "CachePolicy", "VersionTooNew", "NeedsMigration",
    "StartConflict",
    "Agent", "Tool", "ToolCall", "tool",
}


def test_all_matches_the_promised_set() -> None:
    assert set(fsm_engine.__all__) == EXPECTED
    assert len(fsm_engine.__all__) == len(EXPECTED), "duplicates in __all__"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_public_name_is_importable(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from fsm_engine import {name}", namespace)  # noqa: S102 - the import statement itself
    assert namespace[name] is getattr(fsm_engine, name)


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from fsm_engine import *", namespace)  # noqa: S102
    assert set(namespace) - {"__builtins__"} == EXPECTED


def test_version_is_a_string() -> None:
    assert isinstance(fsm_engine.__version__, str) and fsm_engine.__version__.count(".") == 2


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_imports_pickle() -> None:
    assert len(_modules()) > 10
    banned = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal"}
    offenders = []
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id == "__import__" and node.args
                  and isinstance(node.args[0], ast.Constant)):
                names = [str(node.args[0].value)]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "import_module" and node.args
                  and isinstance(node.args[0], ast.Constant)):
                names = [str(node.args[0].value)]
            offenders += [f"{path.relative_to(PACKAGE)}:{node.lineno} {n}"  # type: ignore[attr-defined]
                          for n in names if n.split(".")[0] in banned]
    assert offenders == []


def test_no_pickle_identifier_in_code() -> None:
    """Also catches ``getattr(x, "loads")`` style tricks on a pickle alias."""
    hits = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name) and "pickle" in node.id.lower():
                hits.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert hits == []


def _public_error_classes() -> list[type]:
    names = set(errors.__all__) | {n for n in fsm_engine.__all__
                                   if isinstance(getattr(fsm_engine, n), type)
                                   and issubclass(getattr(fsm_engine, n), BaseException)}
    return [getattr(errors, n, None) or getattr(fsm_engine, n) for n in sorted(names)]


def test_every_public_error_derives_from_fsm_error() -> None:
    classes = _public_error_classes()
    assert len(classes) >= 21
    assert [c.__name__ for c in classes if not issubclass(c, fsm_engine.FsmError)] == []


def test_errors_in_subpackages_derive_from_fsm_error() -> None:
    found = []
    for path in _modules():
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = importlib.import_module(".".join(rel.parts).removesuffix(".__init__"))
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__.startswith("fsm_engine"):
                found.append(obj)
    assert found
    assert sorted({c.__qualname__ for c in found if not issubclass(c, fsm_engine.FsmError)}) == []


def test_error_tree_matches_the_documented_shape() -> None:
    e = fsm_engine
    assert issubclass(e.MachineLoadError, e.DefinitionError)
    for cls in (e.NotAnFsmDatabase, e.InstanceNotFound, e.StaleWrite, e.FingerprintMismatch):
        assert issubclass(cls, e.StoreError)
    for cls in (e.ProviderUnavailable, e.ProviderTimeout, e.RateLimited, e.ServerError,
                e.ClientError):
        assert issubclass(cls, e.ProviderError)
    assert [c.retryable for c in (e.ProviderUnavailable, e.ProviderTimeout, e.RateLimited,
                                  e.ServerError, e.ClientError)] == [True, True, True, True, False]


def test_error_messages_are_one_line_and_carry_fields() -> None:
    err = fsm_engine.FsmError("first\nsecond\r\nthird", instance_id="i1", state="s")
    assert str(err) == "first second third"
    assert (err.instance_id, err.state) == ("i1", "s")
    nf = fsm_engine.InstanceNotFound("abc")
    assert nf.instance_id == "abc" and "abc" in str(nf)
    de = fsm_engine.DefinitionError("m", ["p1", "p2"])
    assert de.problems == ["p1", "p2"] and str(de) == "machine 'm' is invalid: p1; p2"
