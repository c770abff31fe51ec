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

The canonical form is ``.proto`` text printed from the compiled file
(``service.registry.protobuf_text``), so text, reformatted text and the base64 descriptor of
one schema are one schema. Compatibility is Confluent's diff (``protobuf_diff``).
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc_tools
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor_pb2 import FileDescriptorProto as FDP
from google.protobuf.message import DecodeError

from segments.errors import InvalidSchemaError, RecordSchemaError
from service.registry.protobuf_diff import incompatibilities
from service.registry.protobuf_text import Unprintable, normalized, to_text
from service.registry.schemas import ParsedSchema
from service.registry.wire import SchemaFramingError, decode_message_indexes, encode_message_indexes

_WKT_INCLUDE = str(Path(grpc_tools.__file__).parent / "_proto")
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]+")
_PROTOC_TIMEOUT_S = 30.0


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


def _canonical(file: FDP, given: str, imports: Sequence[FDP]) -> str:
    """The canonical text of a normalized file: its printed ``.proto`` text when that text
    compiles back to the same file, else the file as base64 (see ``protobuf_text``)."""
    as_base64 = base64.b64encode(file.SerializeToString(deterministic=True)).decode("ascii")
    try:
        text = to_text(file)
    except Unprintable:
        return as_base64
    if text == given:
        return text  # already canonical (a stored schema read again)
    try:
        again = _compile(text, "canonical.proto", imports)
    except InvalidSchemaError:
        return as_base64
    main = next(fd for fd in again if fd.name == "canonical.proto")
    return text if normalized(main) == file else as_base64


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
            main = serialized
        else:
            name = f"schema_{hashlib.sha256(text.encode()).hexdigest()[:12]}.proto"
            files = _compile(text, name, list(imports.values()))
            main = next(fd for fd in files if fd.name == name)
            for fd in files:
                if fd.name != name:
                    imports.setdefault(fd.name, fd)
        file = normalized(main)
        canonical = _canonical(file, text, list(imports.values()))
        file.name = f"schema_{hashlib.sha256(canonical.encode()).hexdigest()[:12]}.proto"
        return cls(canonical, file, _ordered(imports, file))

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
        return incompatibilities(writer.file, writer.imports, self.file, self.imports)


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
