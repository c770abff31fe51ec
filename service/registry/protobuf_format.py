"""Protobuf schemas: ``protoc`` parses, the ``protobuf`` runtime encodes and decodes.

Parsing ``.proto`` text needs a compiler; we run the real one, ``protoc``, as
shipped in the ``grpcio-tools`` wheel (``python -m grpc_tools.protoc``, with
Google's well-known types on its include path), in a subprocess so its error
messages can be captured. References are handed to it as a
``--descriptor_set_in`` of their compiled files, each named by its reference
name, so ``import "other.proto";`` finds the schema referenced as
``other.proto``. A schema may also arrive as a base64 ``FileDescriptorProto``
(what confluent-kafka's ``ProtobufSerializer`` registers); it is checked by
building it into a ``DescriptorPool`` with its references.

Either way the result is a ``FileDescriptorProto``: served as base64 for
``?format=serialized`` (what confluent-kafka's ``ProtobufDeserializer``
fetches), turned into message classes by ``message_factory``, and converted
from and to the REST API's JSON by ``json_format``.

Compatibility (hand-written, no library has it; the rules Confluent documents
for Protobuf): a message of the writer that the reader lacks is incompatible;
a field (by number) whose type changes outside one wire-compatible group
(int32/uint32/int64/uint64/bool; sint32/sint64; fixed32/sfixed32;
fixed64/sfixed64; string/bytes), whose message or enum type changes, or that
becomes or stops being repeated is incompatible; a field moved into an
existing oneof, or several fields moved into a new one, is incompatible; a
``required`` field added or removed is incompatible. Adding and removing
optional fields, renaming fields and adding messages are compatible.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc_tools
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor_pb2 import FieldDescriptorProto as _T
from google.protobuf.descriptor_pb2 import FileDescriptorProto as FDP
from google.protobuf.message import DecodeError

from segments.errors import InvalidSchemaError, RecordSchemaError
from service.registry.schemas import ParsedSchema
from service.registry.wire import SchemaFramingError, decode_message_indexes, encode_message_indexes

_WKT_INCLUDE = str(Path(grpc_tools.__file__).parent / "_proto")
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]+")
_PROTOC_TIMEOUT_S = 30.0

#: Scalar types that read each other's wire data (Protobuf's language guide).
_WIRE_GROUPS = (
    {_T.TYPE_INT32, _T.TYPE_UINT32, _T.TYPE_INT64, _T.TYPE_UINT64, _T.TYPE_BOOL},
    {_T.TYPE_SINT32, _T.TYPE_SINT64},
    {_T.TYPE_FIXED32, _T.TYPE_SFIXED32},
    {_T.TYPE_FIXED64, _T.TYPE_SFIXED64},
    {_T.TYPE_STRING, _T.TYPE_BYTES},
)
_NAMED = {_T.TYPE_MESSAGE, _T.TYPE_ENUM, _T.TYPE_GROUP}


def _compile(text: str, name: str, deps: Sequence[FDP]) -> list[FDP]:
    """Compile ``text`` as file ``name`` with protoc; its FileDescriptorProtos, imports first.

    Raises:
        InvalidSchemaError: protoc's error messages.
    """
    with tempfile.TemporaryDirectory(prefix="lakelog-proto-") as tmp:
        root = Path(tmp)
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
        args = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I.",
            f"-I{_WKT_INCLUDE}",
            "--include_imports",
            "--descriptor_set_out=out.pb",
        ]
        own = [d for d in deps if not d.name.startswith("google/protobuf/")]
        if own:
            (root / "deps.pb").write_bytes(
                descriptor_pb2.FileDescriptorSet(file=own).SerializeToString()
            )
            args.append("--descriptor_set_in=deps.pb")
        try:
            done = subprocess.run(
                [*args, name],
                cwd=root,
                capture_output=True,
                timeout=_PROTOC_TIMEOUT_S,
                check=False,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
        except subprocess.TimeoutExpired:
            raise InvalidSchemaError("Invalid schema: protoc took too long") from None
        if done.returncode != 0:
            detail = done.stderr.decode("utf-8", "replace").strip() or "protoc failed"
            raise InvalidSchemaError(f"Invalid schema: {detail}")
        return list(
            descriptor_pb2.FileDescriptorSet.FromString((root / "out.pb").read_bytes()).file
        )


def _from_base64(text: str) -> FDP | None:
    """The FileDescriptorProto of a base64 text, or None when it is not one."""
    if not _BASE64.fullmatch(text):
        return None
    try:
        fd = FDP.FromString(base64.b64decode("".join(text.split()), validate=True))
    except (binascii.Error, DecodeError, ValueError):
        return None
    return fd if fd.name or fd.message_type else None


def _well_known(name: str) -> FDP | None:
    """One of Google's well-known types (``google/protobuf/timestamp.proto``, ...)."""
    if not name.startswith("google/protobuf/") or not name.endswith(".proto"):
        return None
    module = name.removesuffix(".proto").replace("/", ".") + "_pb2"
    try:
        importlib.import_module(module)  # registers the file in the default pool
        found = descriptor_pool.Default().FindFileByName(name)
    except (ImportError, KeyError):
        return None
    fd = FDP()
    found.CopyToProto(fd)
    return fd


class ProtobufSchema:
    """A compiled ``.proto`` file with its imports."""

    schema_type = "PROTOBUF"

    def __init__(self, canonical: str, file: FDP, imports: list[FDP]) -> None:
        self.canonical = canonical
        self.file = file
        self.imports = imports  # every file it imports, transitively, imports first
        pool = descriptor_pool.DescriptorPool()
        try:
            for fd in [*imports, file]:
                pool.Add(fd)
            self._file = pool.FindFileByName(file.name)
        except (TypeError, KeyError) as e:
            raise InvalidSchemaError(f"Invalid schema: {e}") from None
        if not self._file.message_types_by_name:
            raise InvalidSchemaError("Invalid schema: the file defines no message")
        self._classes: dict[tuple[int, ...], Any] = {}

    @classmethod
    def parse(cls, text: str, dependencies: Sequence[tuple[str, ParsedSchema]]) -> ProtobufSchema:
        imports: dict[str, FDP] = {}
        for ref_name, dep in dependencies:
            if not isinstance(dep, ProtobufSchema):
                raise InvalidSchemaError(
                    "Invalid schema: a Protobuf schema can reference Protobuf only"
                )
            for fd in dep.imports:
                imports.setdefault(fd.name, fd)
            own = FDP()
            own.CopyFrom(dep.file)
            own.name = ref_name  # imported under the reference's name
            imports[ref_name] = own
        serialized = _from_base64(text)
        if serialized is not None:
            for wanted in serialized.dependency:
                if wanted not in imports:
                    known = _well_known(wanted)
                    if known is None:
                        raise InvalidSchemaError(
                            f"Invalid schema: import {wanted!r} is not among the references"
                        )
                    imports[wanted] = known
            return cls(text, serialized, _ordered(imports, serialized))
        name = f"schema_{hashlib.sha256(text.encode()).hexdigest()[:12]}.proto"
        files = _compile(text, name, list(imports.values()))
        main = next(fd for fd in files if fd.name == name)
        for fd in files:
            if fd.name != name:
                imports.setdefault(fd.name, fd)
        return cls(text, main, _ordered(imports, main))

    def serialized(self) -> str:
        """The file as base64 of its FileDescriptorProto (``?format=serialized``)."""
        return base64.b64encode(self.file.SerializeToString()).decode("ascii")

    def record_name(self) -> str | None:
        first = self._file.message_types_by_name[self.file.message_type[0].name]
        return str(first.full_name)

    def _message_class(self, indexes: list[int]) -> Any:
        key = tuple(indexes)
        found = self._classes.get(key)
        if found is None:
            try:
                desc = self._file.message_types_by_name[self.file.message_type[indexes[0]].name]
                for i in indexes[1:]:
                    desc = desc.nested_types[i]
            except IndexError:
                raise RecordSchemaError(f"No message at index {indexes} in the schema") from None
            found = self._classes[key] = message_factory.GetMessageClass(desc)
        return found

    def encode(self, values: Sequence[object]) -> list[bytes]:
        cls = self._message_class([0])
        prefix = encode_message_indexes([0])
        out = []
        for i, value in enumerate(values):
            if not isinstance(value, dict):
                raise RecordSchemaError(f"Invalid Protobuf value: record {i} is not an object")
            try:
                out.append(prefix + json_format.ParseDict(value, cls()).SerializeToString())
            except (json_format.ParseError, TypeError, ValueError) as e:
                raise RecordSchemaError(f"Invalid Protobuf value: record {i}: {e}") from None
        return out

    def decode(self, body: bytes | memoryview) -> object:
        try:
            indexes, used = decode_message_indexes(body)
            msg = self._message_class(indexes).FromString(bytes(body[used:]))
        except (SchemaFramingError, DecodeError) as e:
            raise RecordSchemaError(f"Protobuf deserialization failed: {e}") from None
        return json_format.MessageToDict(
            msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )

    def incompatibilities(self, writer: ParsedSchema) -> list[str]:
        if not isinstance(writer, ProtobufSchema):
            return ["not a Protobuf schema"]
        return _compare(dict(_messages(self.file)), dict(_messages(writer.file)))


def _ordered(imports: dict[str, FDP], main: FDP) -> list[FDP]:
    """``imports`` reachable from ``main``, each after its own imports."""
    out: list[FDP] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen or name not in imports:
            return
        seen.add(name)
        for dep in imports[name].dependency:
            visit(dep)
        out.append(imports[name])

    for dep in main.dependency:
        visit(dep)
    return out


# -- compatibility ---------------------------------------------------------------------


def _messages(
    fd: FDP,
) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto]]:
    """(full name, message) of every message in the file, nested ones included."""

    def walk(prefix: str, msgs: Any) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto]]:
        for m in msgs:
            full = f"{prefix}.{m.name}" if prefix else m.name
            yield full, m
            yield from walk(full, m.nested_type)

    yield from walk(fd.package, fd.message_type)


def _same_wire(a: int, b: int) -> bool:
    return a == b or any(a in g and b in g for g in _WIRE_GROUPS)


def _compare(
    reader: dict[str, descriptor_pb2.DescriptorProto],
    writer: dict[str, descriptor_pb2.DescriptorProto],
) -> list[str]:
    problems: list[str] = []
    for name, w_msg in writer.items():
        r_msg = reader.get(name)
        if r_msg is None:
            problems.append(f"MESSAGE_REMOVED: {name}")
            continue
        r_fields = {f.number: f for f in r_msg.field}
        w_fields = {f.number: f for f in w_msg.field}
        w_oneof_size: dict[int, int] = {}
        for f in w_msg.field:
            if f.HasField("oneof_index"):
                w_oneof_size[f.oneof_index] = w_oneof_size.get(f.oneof_index, 0) + 1
        moved_into: dict[str, int] = {}
        for number, wf in w_fields.items():
            rf = r_fields.get(number)
            where = f"{name}.{wf.name} (field {number})"
            if rf is None:
                if wf.label == _T.LABEL_REQUIRED:
                    problems.append(f"REQUIRED_FIELD_REMOVED: {where}")
                continue
            if wf.type in _NAMED or rf.type in _NAMED:
                if wf.type != rf.type or wf.type_name.lstrip(".") != rf.type_name.lstrip("."):
                    problems.append(f"FIELD_NAMED_TYPE_CHANGED: {where}")
            elif not _same_wire(wf.type, rf.type):
                problems.append(f"FIELD_SCALAR_KIND_CHANGED: {where}")
            if (wf.label == _T.LABEL_REPEATED) != (rf.label == _T.LABEL_REPEATED):
                problems.append(f"FIELD_LABEL_CHANGED: {where}")
            w_oneof = wf.oneof_index if wf.HasField("oneof_index") else None
            r_oneof = rf.oneof_index if rf.HasField("oneof_index") else None
            if r_oneof is not None and w_oneof is None and not rf.proto3_optional:
                oneof = r_msg.oneof_decl[r_oneof].name
                moved_into[oneof] = moved_into.get(oneof, 0) + 1
                if any(w_msg.oneof_decl[i].name == oneof for i in w_oneof_size):
                    problems.append(f"FIELD_MOVED_TO_EXISTING_ONEOF: {where}")
            elif (
                w_oneof is not None
                and r_oneof is None
                and not wf.proto3_optional
                and w_oneof_size.get(w_oneof, 0) > 1
            ):
                problems.append(f"ONEOF_FIELD_REMOVED: {where}")
        problems += [
            f"MULTIPLE_FIELDS_MOVED_TO_ONEOF: {name}.{oneof}"
            for oneof, n in moved_into.items()
            if n > 1
        ]
        for number, rf in r_fields.items():
            if number not in w_fields and rf.label == _T.LABEL_REQUIRED:
                problems.append(f"REQUIRED_FIELD_ADDED: {name}.{rf.name} (field {number})")
    return problems
