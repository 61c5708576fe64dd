"""OpenTelemetry spans, checked with the SDK's in-memory exporter: one ``fsm.run`` span per
run, one ``fsm.step`` child per step, model calls as GenAI ``chat`` children of their step;
off (nothing created, nothing imported) without configuration."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("opentelemetry.sdk")
from conftest import scripted  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from seven_machine import SECRET, seven_steps  # noqa: E402

from fsm_engine import Engine  # noqa: E402

#: The model's reply: not hex, so it cannot appear inside an instance id by chance.
REPLY = "forty-two, said the model"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("test"), exporter
    provider.shutdown()


def run_one(db: str, tracer, *replies: dict):
    engine = Engine(db, llm=scripted(*replies), tracer=tracer, seed=1)
    iid = engine.start(seven_steps(), {})

    async def go():
        try:
            return await engine.run(iid)
        finally:
            await engine.aclose()
    return iid, asyncio.run(go())


def test_seven_steps_make_seven_step_spans_under_one_run_span(db_path, spans) -> None:
    tracer, exporter = spans
    iid, rec = run_one(db_path, tracer, {"text": REPLY, "prompt_tokens": 11, "completion_tokens": 3})
    assert rec.status == "completed"
    finished = exporter.get_finished_spans()
    [run] = [s for s in finished if s.name == "fsm.run"]
    steps = [s for s in finished if s.name == "fsm.step"]
    assert len(steps) == 7 and run.parent is None
    assert all(s.parent.span_id == run.context.span_id for s in steps)
    assert all(s.context.trace_id == run.context.trace_id for s in finished)
    assert dict(run.attributes) == {"fsm.instance_id": iid, "fsm.machine": "seven",
                                    "fsm.status": "completed", "fsm.state": "done",
                                    "fsm.tokens": 14}
    by_state = {s.attributes["fsm.state"]: dict(s.attributes) for s in steps}
    assert list(by_state) == [f"s{i}" for i in range(7)]
    assert by_state["s0"] == {"fsm.machine": "seven", "fsm.instance_id": iid, "fsm.state": "s0",
                              "fsm.attempt": 1, "fsm.tokens": 0, "fsm.trigger": "next",
                              "fsm.dest": "s1", "fsm.outcome": "transition"}
    assert by_state["s3"]["fsm.tokens"] == 14
    [chat] = [s for s in finished if s.name.startswith("chat ")]
    step3 = next(s for s in steps if s.attributes["fsm.state"] == "s3")
    assert chat.parent.span_id == step3.context.span_id
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.request.model"] == "scripted"
    assert chat.attributes["gen_ai.request.max_tokens"] == 32
    assert (chat.attributes["gen_ai.usage.input_tokens"],
            chat.attributes["gen_ai.usage.output_tokens"]) == (11, 3)
    assert tuple(chat.attributes["gen_ai.response.finish_reasons"]) == ("stop",)
    text = json.dumps([dict(s.attributes) for s in finished] +
                      [[e.attributes for e in s.events] for s in finished], default=str)
    assert SECRET not in text and REPLY not in text  # neither prompt nor reply


def test_a_retried_step_has_its_own_span_with_the_error_class(db_path, spans) -> None:
    tracer, exporter = spans
    _, rec = run_one(db_path, tracer, {"text": "", "error": "http500"},
                     {"text": "ok", "prompt_tokens": 2, "completion_tokens": 1})
    assert rec.status == "completed"
    steps = [s for s in exporter.get_finished_spans() if s.name == "fsm.step"]
    assert len(steps) == 8
    retry = next(s for s in steps if s.attributes.get("fsm.outcome") == "retry")
    assert retry.attributes["error.type"] == "ServerError" and retry.attributes["fsm.state"] == "s3"
    failed_call = [s for s in exporter.get_finished_spans()
                   if s.name.startswith("chat ") and s.attributes.get("error.type")]
    assert [s.attributes["error.type"] for s in failed_call] == ["ServerError"]
    after = next(s for s in steps if s.attributes["fsm.state"] == "s3"
                 and s.attributes["fsm.outcome"] == "transition")
    assert after.attributes["fsm.attempt"] == 2


PROBE = textwrap.dedent("""
    import asyncio, json, sys
    sys.path[:0] = [{tests!r}, {helpers!r}]
    from seven_machine import seven_steps
    from conftest import scripted
    from fsm_engine import Engine
    if {configure!r}:
        from fsm_engine import telemetry_sdk
        telemetry_sdk.configure()
    engine = Engine({db!r}, llm=scripted({{"text": "x", "prompt_tokens": 1}}))
    iid = engine.start(seven_steps(), {{}})
    async def go():
        try:
            return await engine.run(iid)
        finally:
            await engine.aclose()
    rec = asyncio.run(go())
    print(json.dumps({{"tracer": engine.tracer is not None, "status": rec.status,
                      "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry"))[:3]}}))
""")


def probe(tmp_path, name: str, env: dict[str, str], configure: bool = False) -> tuple[dict, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = PROBE.format(tests=os.path.dirname(__file__),
                         helpers=os.path.join(os.path.dirname(__file__), "helpers"),
                         db=str(tmp_path / f"{name}.db"), configure=configure)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=clean | env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1] if name == "off" else next(
        line for line in lines if line.startswith('{"tracer"'))), proc.stdout


def test_without_configuration_nothing_is_created_or_imported(tmp_path) -> None:
    result, _ = probe(tmp_path, "off", {})
    assert result == {"tracer": False, "status": "completed", "otel": []}
    result, _ = probe(tmp_path, "disabled", {"OTEL_SDK_DISABLED": "true",
                                             "OTEL_TRACES_EXPORTER": "console"}, configure=True)
    assert result["tracer"] is False and result["otel"] == []


def test_a_library_process_is_left_as_it_is_whatever_the_variables_say(tmp_path) -> None:
    """The engine uses the OpenTelemetry API alone: OTEL_* variables in an application's
    process set nothing up unless the application asks (telemetry_sdk.configure)."""
    result, stdout = probe(tmp_path, "lib", {"OTEL_TRACES_EXPORTER": "console"})
    assert result == {"tracer": False, "status": "completed", "otel": []}
    assert '"name": "fsm.step"' not in stdout


def test_configure_sets_up_the_sdk_from_otel_traces_exporter(tmp_path) -> None:
    result, stdout = probe(tmp_path, "console", {"OTEL_TRACES_EXPORTER": "console",
                                                 "OTEL_SERVICE_NAME": "fsm-test"}, configure=True)
    assert result["tracer"] is True and result["status"] == "completed"
    assert stdout.count('"name": "fsm.step"') == 7 and stdout.count('"name": "fsm.run"') == 1
    assert "fsm-test" in stdout


def test_an_installed_provider_is_kept_by_configure() -> None:
    from fsm_engine import telemetry_sdk
    code = textwrap.dedent("""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from fsm_engine import telemetry, telemetry_sdk
        mine = TracerProvider()
        trace.set_tracer_provider(mine)
        print(telemetry_sdk.configure(), trace.get_tracer_provider() is mine,
              telemetry.installed_tracer() is not None)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env | {"OTEL_TRACES_EXPORTER": "console"}, timeout=120)
    assert proc.stdout.split() == ["False", "True", "True"], proc.stderr
    assert telemetry_sdk.exporter_names({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}) == ["otlp"]
    assert telemetry_sdk.exporter_names({"OTEL_TRACES_EXPORTER": "none"}) == []


def test_an_fsm_command_sets_up_the_sdk_when_the_variables_ask(tmp_path) -> None:
    """``fsm run`` owns its process: OTEL_TRACES_EXPORTER=console prints its spans."""
    machine = tmp_path / "m.py"
    machine.write_text(textwrap.dedent("""
        from pydantic import BaseModel
        from fsm_engine import Machine, State, Transition

        class Ctx(BaseModel):
            n: int = 0

        def bump(ctx, step):
            return {"n": ctx.n + 1}

        machine = Machine(name="tiny", context=Ctx, initial="a",
                          states=[State("a", action=bump), State("done", final=True)],
                          transitions=[Transition("next", "a", "done")])
    """))
    (tmp_path / "in.json").write_text('{"n": 1}')
    (tmp_path / "replies.jsonl").write_text('{"text": "unused"}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run([sys.executable, "-m", "fsm_engine.cli", "run", str(machine), "-q",
                           "--input", str(tmp_path / "in.json"), "--db", str(tmp_path / "f.db"),
                           "--llm", f"scripted:{tmp_path / 'replies.jsonl'}"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=env | {"OTEL_TRACES_EXPORTER": "console"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count('"name": "fsm.step"') == 1 and '"name": "fsm.run"' in proc.stdout
