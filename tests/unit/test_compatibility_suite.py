"""The compatibility suite: the cases of Confluent's compatibility test resources, re-written
as lakelog's own case files (``tests/unit/compatibility/*.yaml``), run against the registry's
rules. Each case file says how its cases read; a case where lakelog answers otherwise than
Confluent carries ``differs`` with the reason, and its expectation is lakelog's answer.

``test_every_difference_is_recorded`` prints the recorded differences (``pytest -s``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.registry.jsonschema_diff import COMPATIBLE, Loader, compare
from service.registry.schemas import check_compatibility, parse_schema

CASES = Path(__file__).parent / "compatibility"
DRAFT_2020 = "https://json-schema.org/draft/2020-12/schema"


def _load(name: str) -> list[dict[str, Any]]:
    cases = yaml.safe_load((CASES / name).read_text())
    assert isinstance(cases, list) and cases
    return cases


def _respell_2020(node: Any) -> Any:
    """A draft-07 schema in draft 2020-12's spelling (same meaning)."""
    if isinstance(node, list):
        return [_respell_2020(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "definitions":
            out["$defs"] = _respell_2020(value)
        elif key == "$ref" and isinstance(value, str):
            out[key] = value.replace("#/definitions/", "#/$defs/")
        elif key == "items" and isinstance(value, list):
            out["prefixItems"] = _respell_2020(value)
            if "additionalItems" in node:
                out["items"] = _respell_2020(node["additionalItems"])
        elif key == "additionalItems":
            continue
        elif key == "dependencies":
            required = {k: v for k, v in value.items() if isinstance(v, list)}
            schemas = {k: _respell_2020(v) for k, v in value.items() if not isinstance(v, list)}
            if required or not schemas:
                out["dependentRequired"] = required
            if schemas or not required:
                out["dependentSchemas"] = schemas
        else:
            out[key] = _respell_2020(value)
    return out


def _json_params() -> list[Any]:
    params = []
    for case in _load("json_schema.yaml"):
        for dialect in case.get("dialects", ["draft7", "draft2020"]):
            old, new = case["old"], case["new"]
            if dialect == "draft2020":
                old = {"$schema": DRAFT_2020, **_respell_2020(old)}
                new = {"$schema": DRAFT_2020, **_respell_2020(new)}
            params.append(pytest.param(case, old, new, id=f"{dialect}: {case['name']}"))
    return params


def _changes(expected: list[str]) -> Counter[tuple[str, str]]:
    out: Counter[tuple[str, str]] = Counter()
    for change in expected:
        kind, _, path = change.partition("@")
        out[(kind, path or "#/")] += 1
    return out


@pytest.mark.parametrize(("case", "old", "new"), _json_params())
def test_json_schema_case(case: dict[str, Any], old: Any, new: Any) -> None:
    changes = compare(Loader([]).load_root(old), Loader([]).load_root(new))
    assert Counter(changes) == _changes(case["changes"])
    assert all(kind in COMPATIBLE for kind, _ in changes) is case["compatible"]
    # The same verdict through the registry's own door (parse, then the BACKWARD level).
    problems = check_compatibility(
        "BACKWARD",
        parse_schema("JSON", json.dumps(new)),
        [(1, parse_schema("JSON", json.dumps(old)))],
    )
    assert (not problems) is case["compatible"], problems


def test_every_difference_is_recorded() -> None:
    """Each case file's differences from Confluent, with their reasons (none hidden)."""
    recorded = []
    for path in sorted(CASES.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        for case in doc["cases"] if isinstance(doc, dict) else doc:
            if "differs" in case:
                assert isinstance(case["differs"], str) and len(case["differs"]) > 20
                recorded.append(f"{path.stem}: {case['name']}: {case['differs']}")
    print("\n".join(["differences from Confluent:", *recorded]))
    assert recorded  # the JSON Schema file records its 2020-12 translation differences


def _proto(text: str, imports: dict[str, list[str]] | None = None) -> Any:
    deps = [
        (name, parse_schema("PROTOBUF", _proto3(dep_text)))
        for name, (dep_text, _label) in (imports or {}).items()
    ]
    return parse_schema("PROTOBUF", _proto3(text), deps)


def _proto3(text: str) -> str:
    return text if text.lstrip().startswith("syntax") else f'syntax = "proto3";\n{text}'


@pytest.mark.parametrize("case", [pytest.param(c, id=c["name"]) for c in _load("protobuf.yaml")])
def test_protobuf_case(case: dict[str, Any]) -> None:
    from service.registry.protobuf_diff import COMPATIBLE as PB_COMPATIBLE
    from service.registry.protobuf_diff import compare as pb_compare

    old = _proto(case["old"], case.get("old_imports"))
    new = _proto(case["new"], case.get("new_imports"))
    changes = pb_compare(old.file, old.imports, new.file, new.imports)
    assert Counter(changes) == _changes(case["changes"])
    assert all(kind in PB_COMPATIBLE for kind, _ in changes) is case["compatible"]
    problems = check_compatibility("BACKWARD", new, [(1, old)])
    assert (not problems) is case["compatible"], problems


def _avro_params() -> list[Any]:
    doc = yaml.safe_load((CASES / "avro.yaml").read_text())
    schemas = {
        name: parse_schema("AVRO", json.dumps({"type": "record", "name": "rec", "fields": fields}))
        for name, fields in doc["schemas"].items()
    }
    return [pytest.param(c, schemas, id=f"{c['level']}: {c['name']}") for c in doc["cases"]]


@pytest.mark.parametrize(("case", "schemas"), _avro_params())
def test_avro_case(case: dict[str, Any], schemas: dict[str, Any]) -> None:
    from service.registry.schemas import versions_to_check

    history = [schemas[name] for name in case["history"]]
    versions = versions_to_check(case["level"], list(range(1, len(history) + 1)))
    olds = [(v, history[v - 1]) for v in versions]
    problems = check_compatibility(case["level"], schemas[case["new"]], olds)
    assert (not problems) is case["compatible"], problems
