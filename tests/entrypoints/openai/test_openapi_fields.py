"""/openapi.json describes every request field (a description, and an example where one helps)
and lists each route's extension fields; openapi_fields.py names no field the models lack."""

from __future__ import annotations

import pytest

from omnistage.entrypoints.openai.api_server import create_app
from omnistage.entrypoints.openai.openapi_fields import EXTENSIONS, FIELDS, REQUEST_SCHEMAS, short_name
from omnistage.entrypoints.openai.settings import ServerSettings


@pytest.fixture(scope="module")
def document():
    return create_app(ServerSettings(served_model_name="m", model_path="m")).openapi()


def request_schemas(document) -> set[str]:
    """The schemas reachable from a request body."""
    schemas = document["components"]["schemas"]
    todo = [ref for ops in document["paths"].values() for op in ops.values()
            for media in op.get("requestBody", {}).get("content", {}).values()
            for ref in [media.get("schema", {}).get("$ref", "")] if ref]
    seen: set[str] = set()
    while todo:
        name = todo.pop().rsplit("/", 1)[-1]
        if name in seen:
            continue
        seen.add(name)
        text = repr(schemas[name])
        todo += [part.split("'")[0] for part in text.split("#/components/schemas/")[1:]]
    return seen


def test_every_request_field_has_a_description(document):
    schemas = document["components"]["schemas"]
    reachable = request_schemas(document)
    assert "ChatMessage" in reachable and "LoraRequest" in reachable
    unlisted = {name for name in reachable if short_name(name) not in REQUEST_SCHEMAS}
    assert not unlisted, f"add to REQUEST_SCHEMAS: {unlisted}"
    missing = [f"{name}.{field}" for name in sorted(reachable)
               for field, prop in schemas[name].get("properties", {}).items() if not prop.get("description")]
    assert not missing, f"request fields without a description (openapi_fields.py): {missing}"


def test_main_fields_have_examples(document):
    schemas = document["components"]["schemas"]
    for name, field in [("ImageGenerationRequest", "prompt"), ("ChatCompletionRequest", "messages"),
                        ("CompletionRequest", "prompt"), ("SpeechRequest", "input"), ("AudioGenerateRequest", "prompt")]:
        assert schemas[name]["properties"][field]["examples"], (name, field)


def test_no_entry_names_a_missing_field(document):
    schemas = document["components"]["schemas"]
    properties: dict[str, set[str]] = {}
    for name, schema in schemas.items():  # two models of one name: their fields together
        properties.setdefault(short_name(name), set()).update(schema.get("properties", {}))
    for name, fields in FIELDS.items():
        assert name in properties, name
        unknown = set(fields) - properties[name]
        assert not unknown, f"{name}: {unknown}"


def test_routes_list_their_extension_fields(document):
    for (method, path), extras in EXTENSIONS.items():
        listed = document["paths"][path][method]["x-extra-body"]
        assert set(listed) == set(extras)
    chat = document["paths"]["/v1/chat/completions"]["post"]["x-extra-body"]
    assert {"top_k", "structured_outputs", "guided_json"} <= set(chat)
