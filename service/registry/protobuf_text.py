"""``.proto`` text printed from a compiled ``FileDescriptorProto``: Protobuf's canonical form.

A schema arrives as ``.proto`` text (Java clients, people) or as a base64
``FileDescriptorProto`` (confluent-kafka's ``ProtobufSerializer``); both compile to a file
descriptor, and printing that descriptor gives one text for both, whatever the spacing,
comments or name qualification of the original. The printer writes every type name fully
qualified (``.pkg.Msg``), keeps declaration order (message indexes on the wire depend on
it) and places nested messages among the fields so that map entries come out where they
were. :func:`normalized` strips what does not change the schema (source locations, the file
name, ``json_name`` where it is the default, ``syntax = "proto2"`` spelled out).

What the printer does not cover (editions, proto2 groups, options it cannot name, such as
custom options of files not given) raises :class:`Unprintable`; the caller then keeps the
descriptor itself (base64) as the canonical form.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from google.protobuf import descriptor_pb2, text_encoding, unknown_fields
from google.protobuf.descriptor_pb2 import FieldDescriptorProto as _F
from google.protobuf.descriptor_pb2 import FileDescriptorProto as FDP

_SCALARS = {
    _F.TYPE_DOUBLE: "double",
    _F.TYPE_FLOAT: "float",
    _F.TYPE_INT64: "int64",
    _F.TYPE_UINT64: "uint64",
    _F.TYPE_INT32: "int32",
    _F.TYPE_FIXED64: "fixed64",
    _F.TYPE_FIXED32: "fixed32",
    _F.TYPE_BOOL: "bool",
    _F.TYPE_STRING: "string",
    _F.TYPE_BYTES: "bytes",
    _F.TYPE_UINT32: "uint32",
    _F.TYPE_SFIXED32: "sfixed32",
    _F.TYPE_SFIXED64: "sfixed64",
    _F.TYPE_SINT32: "sint32",
    _F.TYPE_SINT64: "sint64",
}
_LABELS = {_F.LABEL_OPTIONAL: "optional", _F.LABEL_REQUIRED: "required"}


class Unprintable(ValueError):
    """A descriptor feature the printer does not write."""


def json_name(name: str) -> str:
    """protoc's default JSON name of a field: underscores dropped, the next letter upper."""
    out, upper = [], False
    for ch in name:
        if ch == "_":
            upper = True
        elif upper:
            out.append(ch.upper())
            upper = False
        else:
            out.append(ch)
    return "".join(out)


def _fields(fd: FDP) -> Iterator[descriptor_pb2.FieldDescriptorProto]:
    def walk(msgs: Any) -> Iterator[descriptor_pb2.FieldDescriptorProto]:
        for m in msgs:
            yield from m.field
            yield from m.extension
            yield from walk(m.nested_type)

    yield from fd.extension
    yield from walk(fd.message_type)


def normalized(fd: FDP) -> FDP:
    """A copy of ``fd`` without what does not change the schema (see the module docstring)."""
    out = FDP()
    out.CopyFrom(fd)
    out.ClearField("source_code_info")
    out.ClearField("name")
    if out.syntax == "proto2":
        out.ClearField("syntax")
    for field in _fields(out):
        if field.HasField("json_name") and field.json_name == json_name(field.name):
            field.ClearField("json_name")
    return out


def _quote(text: str) -> str:
    return '"' + str(text_encoding.CEscape(text, as_utf8=True)) + '"'


def _value(field: Any, value: Any) -> str:
    if field.type == field.TYPE_ENUM:
        return str(field.enum_type.values_by_number[value].name)
    if field.type == field.TYPE_BOOL:
        return "true" if value else "false"
    if field.type == field.TYPE_STRING:
        return _quote(value)
    if field.type == field.TYPE_BYTES:
        return '"' + str(text_encoding.CEscape(value, as_utf8=False)) + '"'
    if field.type in (field.TYPE_MESSAGE, field.TYPE_GROUP):
        raise Unprintable("an option of message type")
    return repr(value) if not isinstance(value, float) else _float(value)


def _float(value: float) -> str:
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def _options(options: Any, skip: tuple[str, ...] = ()) -> list[str]:
    """``name = value`` of each set option; Unprintable for one the printer cannot name."""
    if len(unknown_fields.UnknownFieldSet(options)):
        raise Unprintable("options the printer cannot name (custom options?)")
    out = []
    for field, value in options.ListFields():
        if field.name in skip:
            continue
        name = f"({field.full_name})" if field.is_extension else field.name
        if field.label == field.LABEL_REPEATED:
            raise Unprintable("a repeated option")
        out.append(f"{name} = {_value(field, value)}")
    return out


class _Printer:
    def __init__(self, fd: FDP) -> None:
        self.fd = fd
        self.proto3 = fd.syntax == "proto3"
        self.lines: list[str] = []

    def line(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def print(self) -> str:
        fd = self.fd
        if fd.syntax not in ("", "proto2", "proto3"):
            raise Unprintable(f"syntax {fd.syntax!r}")
        self.line(0, f'syntax = "{fd.syntax or "proto2"}";')
        if fd.package:
            self.line(0, f"package {fd.package};")
        if fd.dependency:
            self.lines.append("")
        for i, dep in enumerate(fd.dependency):
            kind = (
                "public "
                if i in fd.public_dependency
                else "weak "
                if i in fd.weak_dependency
                else ""
            )
            self.line(0, f"import {kind}{_quote(dep)};")
        if fd.HasField("options"):
            opts = _options(fd.options)
            if opts:
                self.lines.append("")
            for opt in opts:
                self.line(0, f"option {opt};")
        for msg in fd.message_type:
            self.lines.append("")
            self.message(msg, 0)
        for enum in fd.enum_type:
            self.lines.append("")
            self.enum(enum, 0)
        self.extensions(fd.extension, 0)
        for service in fd.service:
            self.lines.append("")
            self.service(service)
        return "\n".join(self.lines) + "\n"

    def field_type(self, field: descriptor_pb2.FieldDescriptorProto) -> str:
        if field.type == _F.TYPE_GROUP:
            raise Unprintable("a proto2 group")
        if field.type in (_F.TYPE_MESSAGE, _F.TYPE_ENUM):
            return str(field.type_name)
        return str(_SCALARS[field.type])

    def field_options(self, field: descriptor_pb2.FieldDescriptorProto, scalar_type: str) -> str:
        opts = []
        if field.HasField("default_value"):
            value = field.default_value
            if field.type == _F.TYPE_STRING:
                value = _quote(value)
            elif field.type == _F.TYPE_BYTES:
                value = f'"{value}"'
            opts.append(f"default = {value}")
        if field.HasField("json_name"):
            opts.append(f"json_name = {_quote(field.json_name)}")
        if field.HasField("options"):
            opts += _options(field.options)
        return f" [{', '.join(opts)}]" if opts else ""

    def field(
        self,
        field: descriptor_pb2.FieldDescriptorProto,
        depth: int,
        entries: dict[str, descriptor_pb2.DescriptorProto],
        in_oneof: bool = False,
    ) -> None:
        entry = entries.get(field.type_name) if field.type == _F.TYPE_MESSAGE else None
        if entry is not None:
            key, value = entry.field[0], entry.field[1]
            kind = f"map<{self.field_type(key)}, {self.field_type(value)}>"
            label = ""
        else:
            kind = self.field_type(field)
            if in_oneof:
                label = ""
            elif field.label == _F.LABEL_REPEATED:
                label = "repeated "
            elif self.proto3:
                label = "optional " if field.proto3_optional else ""
            else:
                label = _LABELS[field.label] + " "
        options = self.field_options(field, kind)
        self.line(depth, f"{label}{kind} {field.name} = {field.number}{options};")

    def message(self, msg: descriptor_pb2.DescriptorProto, depth: int) -> None:
        self.line(depth, f"message {msg.name} {{")
        inner = depth + 1
        if msg.HasField("options"):
            for opt in _options(msg.options, skip=("map_entry",)):
                self.line(inner, f"option {opt};")
        prefix = f"{self._scope(msg)}."
        entries = {f"{prefix}{n.name}": n for n in msg.nested_type if n.options.map_entry}
        fields = list(msg.field)
        done: set[int] = set()
        printed_oneofs: set[int] = set()

        def emit(upto: int) -> None:
            for i in range(upto):
                if i in done:
                    continue
                done.add(i)
                f = fields[i]
                synthetic = f.proto3_optional
                if f.HasField("oneof_index") and not synthetic:
                    k = f.oneof_index
                    if k in printed_oneofs:
                        continue
                    printed_oneofs.add(k)
                    self.oneof(msg, k, inner, entries)
                    done.update(
                        j
                        for j, g in enumerate(fields)
                        if g.HasField("oneof_index") and g.oneof_index == k
                    )
                else:
                    self.field(f, inner, entries)

        self._scopes.append(msg.name)
        for nested in msg.nested_type:
            if nested.options.map_entry:
                owner = next(
                    (i for i, f in enumerate(fields) if f.type_name == f"{prefix}{nested.name}"),
                    None,
                )
                if owner is None:
                    raise Unprintable("a map entry without its field")
                emit(owner + 1)
            else:
                self.message(nested, inner)
        emit(len(fields))
        for enum in msg.enum_type:
            self.enum(enum, inner)
        self.extensions(msg.extension, inner)
        for r in msg.extension_range:
            if r.HasField("options"):
                raise Unprintable("extension range options")
            self.line(inner, f"extensions {r.start} to {r.end - 1};")
        self.reserved(msg.reserved_range, msg.reserved_name, inner, exclusive_end=True)
        self._scopes.pop()
        self.line(depth, "}")

    _scopes: list[str]

    def _scope(self, msg: descriptor_pb2.DescriptorProto) -> str:
        parts = [self.fd.package] if self.fd.package else []
        return "." + ".".join([*parts, *self._scopes, msg.name])

    def oneof(
        self,
        msg: descriptor_pb2.DescriptorProto,
        index: int,
        depth: int,
        entries: dict[str, descriptor_pb2.DescriptorProto],
    ) -> None:
        decl = msg.oneof_decl[index]
        self.line(depth, f"oneof {decl.name} {{")
        if decl.HasField("options"):
            for opt in _options(decl.options):
                self.line(depth + 1, f"option {opt};")
        for f in msg.field:
            if f.HasField("oneof_index") and f.oneof_index == index:
                self.field(f, depth + 1, entries, in_oneof=True)
        self.line(depth, "}")

    def reserved(self, ranges: Any, names: Any, depth: int, *, exclusive_end: bool) -> None:
        if ranges:
            parts = []
            for r in ranges:
                end = r.end - 1 if exclusive_end else r.end
                parts.append(str(r.start) if end == r.start else f"{r.start} to {end}")
            self.line(depth, f"reserved {', '.join(parts)};")
        if names:
            self.line(depth, f"reserved {', '.join(_quote(n) for n in names)};")

    def enum(self, enum: descriptor_pb2.EnumDescriptorProto, depth: int) -> None:
        self.line(depth, f"enum {enum.name} {{")
        if enum.HasField("options"):
            for opt in _options(enum.options):
                self.line(depth + 1, f"option {opt};")
        for value in enum.value:
            opts = _options(value.options) if value.HasField("options") else []
            suffix = f" [{', '.join(opts)}]" if opts else ""
            self.line(depth + 1, f"{value.name} = {value.number}{suffix};")
        self.reserved(enum.reserved_range, enum.reserved_name, depth + 1, exclusive_end=False)
        self.line(depth, "}")

    def extensions(self, fields: Any, depth: int) -> None:
        by_extendee: dict[str, list[descriptor_pb2.FieldDescriptorProto]] = {}
        for f in fields:
            by_extendee.setdefault(f.extendee, []).append(f)
        for extendee, group in by_extendee.items():
            self.line(depth, f"extend {extendee} {{")
            for f in group:
                self.field(f, depth + 1, {})
            self.line(depth, "}")

    def service(self, service: descriptor_pb2.ServiceDescriptorProto) -> None:
        self.line(0, f"service {service.name} {{")
        if service.HasField("options"):
            for opt in _options(service.options):
                self.line(1, f"option {opt};")
        for m in service.method:
            ins = "stream " if m.client_streaming else ""
            outs = "stream " if m.server_streaming else ""
            head = f"rpc {m.name} ({ins}{m.input_type}) returns ({outs}{m.output_type})"
            opts = _options(m.options) if m.HasField("options") else []
            if opts:
                self.line(1, head + " {")
                for opt in opts:
                    self.line(2, f"option {opt};")
                self.line(1, "}")
            else:
                self.line(1, head + ";")
        self.line(0, "}")


def to_text(fd: FDP) -> str:
    """``.proto`` text of a normalized file descriptor. Raises Unprintable."""
    printer = _Printer(fd)
    printer._scopes = []
    return printer.print()
