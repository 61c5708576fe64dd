"""The OpenAPI 3.1 document of ``fsm serve`` (``GET /api/openapi.json``, ``ui.api``).

Built from the machines served: one start path per machine (``/api/machines/NAME/instances``)
whose ``input`` is that machine's context model as JSON Schema (pydantic's, its ``$defs``
moved into ``components.schemas`` under ``NAME.``, so every ``$ref`` resolves in the
document); the other paths are the same for every machine.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from ..runtime.start_options import MAX_DELAY_S, MAX_KEY
from ..store.records import PRIORITY_MAX, PRIORITY_MIN

__all__ = ["document", "component_name"]

_ERROR = {"$ref": "#/components/schemas/Error"}
_BEARER: list[dict[str, list[str]]] = [{"bearer": []}]


def component_name(name: str) -> str:
    """A machine's name as a component name (``^[A-Za-z0-9._-]+$``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _errors(*statuses: int) -> dict[str, Any]:
    why = {400: "A malformed request (not JSON, not an object, a field of the wrong type)",
           401: "No token, or a wrong one", 404: "No such machine or instance here",
           408: "The body did not arrive in time", 409: "A conflict (see the code)",
           413: "The body is too large", 422: "The input or update does not fit the context",
           503: "The store is unavailable", 504: "The request took too long"}
    return {str(s): {"description": why[s], "content": {"application/json": {
        "schema": _ERROR}}} for s in (401, *statuses)}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _input_schema(name: str, cm: Any, components: dict[str, Any]) -> dict[str, Any]:
    """The machine's context model as a schema; its ``$defs`` go into ``components``."""
    prefix = component_name(name) + "."
    schema = dict(cm.spec.context.model_json_schema(
        ref_template="#/components/schemas/" + prefix + "{model}"))
    for def_name, sub in schema.pop("$defs", {}).items():
        components[prefix + def_name] = sub
    components[prefix + "input"] = schema
    return {"$ref": f"#/components/schemas/{prefix}input"}


def _start_path(name: str, cm: Any, components: dict[str, Any]) -> dict[str, Any]:
    body = {"type": "object", "additionalProperties": False, "properties": {
        "input": _input_schema(name, cm, components),
        "priority": {"type": "integer", "minimum": PRIORITY_MIN, "maximum": PRIORITY_MAX,
                     "description": "Claimed before lower priorities (default 0)."},
        "delay": {"type": "number", "minimum": 0, "maximum": MAX_DELAY_S,
                  "description": "Seconds before it runs (status scheduled until then)."}}}
    started = {"$ref": "#/components/schemas/Started"}
    return {"post": {
        "operationId": f"start_{component_name(name)}",
        "summary": f"Start an instance of {name} (enqueued for the workers)",
        "parameters": [{"name": "Idempotency-Key", "in": "header", "required": False,
                        "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY},
                        "description": "The start's key: a second start with it returns "
                                       "the first instance"}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {"201": _json(started, "Started"),
                      "200": _json(started, "Started before with this Idempotency-Key"),
                      **_errors(400, 404, 408, 409, 413, 422, 503, 504)}}}


def _id_param() -> dict[str, Any]:
    return {"name": "instance_id", "in": "path", "required": True, "schema": {"type": "string"}}


def _schemas() -> dict[str, Any]:
    nullable_num = {"type": ["number", "null"]}
    return {
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["code", "message"], "properties": {
                "code": {"type": "string"}, "message": {"type": "string"}}}}},
        "Started": {"type": "object", "required": ["id", "machine", "created"], "properties": {
            "id": {"type": "string"}, "machine": {"type": "string"},
            "created": {"type": "boolean"}}},
        "Send": {"type": "object", "required": ["trigger"], "additionalProperties": False,
                 "properties": {"trigger": {"type": "string", "minLength": 1},
                                "payload": {"type": "object"}}},
        "Sent": {"type": "object", "required": ["id", "status", "state"], "properties": {
            "id": {"type": "string"}, "status": {"type": "string"},
            "state": {"type": "string"}}},
        "Instance": {"type": "object", "required": ["id", "machine", "status", "state"],
                     "properties": {
                         "id": {"type": "string"}, "machine": {"type": "string"},
                         "status": {"type": "string"}, "state": {"type": "string"},
                         "reason": {"type": ["string", "null"]}, "context": {"type": "object"},
                         "created_at": {"type": "number"}, "updated_at": {"type": "number"},
                         "due_at": nullable_num, "deadline": nullable_num,
                         "priority": {"type": "integer"}, "key": {"type": ["string", "null"]},
                         "tokens_used": {"type": "integer"},
                         "token_budget": {"type": ["integer", "null"]},
                         "parent_id": {"type": ["string", "null"]}}},
    }


def _instance_paths() -> dict[str, Any]:
    sse = {"description": "Server-Sent Events: each data line one stream event as JSON, "
                          "its id the cursor; ends after the final event",
           "content": {"text/event-stream": {"schema": {"type": "string"}}}}
    return {
        "/api/instances/{instance_id}/send": {"post": {
            "operationId": "send", "summary": "Fire a trigger on a waiting instance",
            "parameters": [_id_param()],
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Send"}}}},
            "responses": {"200": _json({"$ref": "#/components/schemas/Sent"}, "Sent"),
                          **_errors(400, 404, 408, 409, 413, 422, 503, 504)}}},
        "/api/instances/{instance_id}": {"get": {
            "operationId": "get_instance", "summary": "An instance's status, state, context",
            "parameters": [_id_param()],
            "responses": {"200": _json({"$ref": "#/components/schemas/Instance"}, "The instance"),
                          **_errors(404, 503, 504)}}},
        "/api/instances/{instance_id}/stream": {"get": {
            "operationId": "stream", "summary": "The instance's stream (Server-Sent Events)",
            "parameters": [_id_param(), {
                "name": "from", "in": "query", "required": False, "schema": {"type": "string"},
                "description": "Resume after this cursor (or send Last-Event-ID)"}],
            "responses": {"200": sse, "204": {"description": "Resumed past the final event"},
                          **_errors(400, 404, 503)}}},
        "/api/openapi.json": {"get": {
            "operationId": "openapi", "summary": "This document",
            "responses": {"200": _json({"type": "object"}, "The OpenAPI document"),
                          **_errors()}}},
    }


def document(machines: Mapping[str, Any], limits: Any) -> dict[str, Any]:
    """The OpenAPI 3.1 document for ``machines`` (name → ``CompiledMachine``) under
    ``limits`` (``api.Limits``, described in ``info``)."""
    from .. import __version__
    components = _schemas()
    paths = {f"/api/machines/{urllib.parse.quote(name, safe='')}/instances":
             _start_path(name, cm, components) for name, cm in sorted(machines.items())}
    paths.update(_instance_paths())
    return {
        "openapi": "3.1.0",
        "info": {"title": "fsm_engine", "version": __version__,
                 "description": f"fsm serve: machines {', '.join(sorted(machines))}. A body "
                                f"is at most {limits.max_body} bytes, arriving within "
                                f"{limits.body_s:g} s; a request answers within "
                                f"{limits.request_s:g} s."},
        "paths": paths,
        "components": {"schemas": components, "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"}}},
        "security": _BEARER,
    }
