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


def probe(tmp_path, name: str, env: dict[str, str]) -> tuple[dict, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = PROBE.format(tests=os.path.dirname(__file__),
                         helpers=os.path.join(os.path.dirname(__file__), "helpers"),
                         db=str(tmp_path / f"{name}.db"))
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
                                             "OTEL_TRACES_EXPORTER": "console"})
    assert result["tracer"] is False and result["otel"] == []


def test_otel_traces_exporter_console_turns_spans_on(tmp_path) -> None:
    result, stdout = probe(tmp_path, "console", {"OTEL_TRACES_EXPORTER": "console",
                                                 "OTEL_SERVICE_NAME": "fsm-test"})
    assert result["tracer"] is True and result["status"] == "completed"
    assert stdout.count('"name": "fsm.step"') == 7 and stdout.count('"name": "fsm.run"') == 1
    assert "fsm-test" in stdout
