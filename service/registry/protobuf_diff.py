"""Protobuf compatibility as Confluent's registry decides it: a diff of two compiled files.

Walking the original (older) and the update (newer) file together names each change; the
update is backward compatible when every change is in :data:`COMPATIBLE`. The rules
(Confluent's, rebuilt over ``FileDescriptorProto`` rather than its parser's model):

- the package must stay (``PACKAGE_CHANGED``); messages and enums are matched by their name
  within the file, level by level, so a message may move (``MESSAGE_MOVED``) or be added;
  removing one is incompatible, removing or adding an enum or an enum constant is not;
  map entries are no messages of their own (a ``map<K, V>`` field is compared by K and V);
- fields are matched by number: adding, removing and renaming an optional field are
  compatible, a ``required`` one is not; a field's kind (scalar -- enums are numbers --,
  message, map) must stay; scalars must stay in one wire-compatible group (int32, int64,
  uint32, uint64, bool and enums; sint32, sint64; string and bytes; fixed32, sfixed32;
  fixed64, sfixed64; float; double); a label change (singular <-> repeated) is compatible
  for string and bytes, not for numbers (message fields' labels are not compared);
- a message-typed field must keep its type's name within its package (the package may
  differ: an import may move to another package); when the two types come from different
  files (another version of a reference, a local message moved into an import), the types
  themselves are compared, and an incompatible change inside is this field's change too;
- oneofs: adding or removing a oneof, adding a field to one, moving one of its fields to the
  top level are compatible; a field removed from a oneof that stays, or fields that were
  independent becoming mutually exclusive (``FIELD_MOVED_TO_EXISTING_ONEOF``,
  ``MULTIPLE_FIELDS_MOVED_TO_ONEOF``) are not. proto3 ``optional`` is not a oneof here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from google.protobuf.descriptor_pb2 import DescriptorProto, EnumDescriptorProto
from google.protobuf.descriptor_pb2 import FieldDescriptorProto as _F
from google.protobuf.descriptor_pb2 import FileDescriptorProto as FDP

from service.registry.diffs import Change, PathDiffs

COMPATIBLE = frozenset(
    {
        "MESSAGE_ADDED",
        "MESSAGE_MOVED",
        "ENUM_ADDED",
        "ENUM_REMOVED",
        "ENUM_CONST_ADDED",
        "ENUM_CONST_CHANGED",
        "ENUM_CONST_REMOVED",
        "FIELD_ADDED",
        "FIELD_REMOVED",
        "FIELD_NAME_CHANGED",
        "FIELD_STRING_OR_BYTES_LABEL_CHANGED",
        "ONEOF_ADDED",
        "ONEOF_REMOVED",
        "ONEOF_FIELD_ADDED",
        "ONEOF_FIELD_MOVED_TO_TOP_LEVEL",
    }
)

_SCALAR_KIND = {
    _F.TYPE_INT32: "number", _F.TYPE_INT64: "number", _F.TYPE_UINT32: "number",
    _F.TYPE_UINT64: "number", _F.TYPE_BOOL: "number", _F.TYPE_ENUM: "number",
    _F.TYPE_SINT32: "signed", _F.TYPE_SINT64: "signed",
    _F.TYPE_STRING: "text", _F.TYPE_BYTES: "text",
    _F.TYPE_FIXED32: "fixed32", _F.TYPE_SFIXED32: "fixed32",
    _F.TYPE_FIXED64: "fixed64", _F.TYPE_SFIXED64: "fixed64",
    _F.TYPE_FLOAT: "float", _F.TYPE_DOUBLE: "double",
}  # fmt: skip


@dataclass
class _Type:
    package: str
    origin: str  # "" for the schema's own file, else a digest of the imported file
    message: DescriptorProto | None = None
    enum: EnumDescriptorProto | None = None

    @property
    def is_map(self) -> bool:
        return self.message is not None and self.message.options.map_entry


def _types(file: FDP, imports: Sequence[FDP]) -> dict[str, _Type]:
    """Every message and enum of the file and its imports, by full name (no leading dot)."""
    out: dict[str, _Type] = {}
    for fd, origin in [
        *(
            (d, hashlib.sha256(d.SerializeToString(deterministic=True)).hexdigest())
            for d in imports
        ),
        (file, ""),
    ]:
        prefix = f"{fd.package}." if fd.package else ""

        def walk(
            scope: str, msgs: Sequence[DescriptorProto], enums: Sequence[EnumDescriptorProto]
        ) -> None:
            for e in enums:
                out[f"{scope}{e.name}"] = _Type(fd.package, origin, enum=e)  # noqa: B023
            for m in msgs:
                out[f"{scope}{m.name}"] = _Type(fd.package, origin, message=m)  # noqa: B023
                walk(f"{scope}{m.name}.", m.nested_type, m.enum_type)

        walk(prefix, fd.message_type, fd.enum_type)
    return out


@dataclass
class _Ctx(PathDiffs):
    compatible_kinds = COMPATIBLE
    old_types: dict[str, _Type]
    new_types: dict[str, _Type]
    old_proto3: bool
    new_proto3: bool
    path: list[str] = field(default_factory=list)
    diffs: list[Change] = field(default_factory=list)
    visiting: set[int] = field(default_factory=set)

    def sub(self, path: list[str]) -> _Ctx:
        return _Ctx(
            self.old_types, self.new_types, self.old_proto3, self.new_proto3,
            list(path), [], self.visiting,
        )  # fmt: skip


def compare(
    old: FDP, old_imports: Sequence[FDP], new: FDP, new_imports: Sequence[FDP]
) -> list[Change]:
    """Every change from ``old`` to ``new``, as (type, path) pairs."""
    ctx = _Ctx(
        _types(old, old_imports),
        _types(new, new_imports),
        old.syntax == "proto3",
        new.syntax == "proto3",
    )
    if old.package != new.package:
        ctx.add("PACKAGE_CHANGED")
    _compare_types(
        ctx,
        list(old.message_type),
        list(old.enum_type),
        list(new.message_type),
        list(new.enum_type),
    )
    return ctx.diffs


def _compare_types(
    ctx: _Ctx,
    old_msgs: list[DescriptorProto],
    old_enums: list[EnumDescriptorProto],
    new_msgs: list[DescriptorProto],
    new_enums: list[EnumDescriptorProto],
) -> None:
    olds = [m for m in old_msgs if not m.options.map_entry]
    news = [m for m in new_msgs if not m.options.map_entry]
    old_index = {m.name: (i, m) for i, m in enumerate(olds)}
    new_index = {m.name: (i, m) for i, m in enumerate(news)}
    for name, (i, was), (j, now) in ctx.matched(
        old_index, new_index, "MESSAGE_REMOVED", "MESSAGE_ADDED"
    ):
        with ctx.at(name):
            _compare_message(ctx, was, now)
            if i != j:
                ctx.add("MESSAGE_MOVED")
    old_e = {e.name: e for e in old_enums}
    new_e = {e.name: e for e in new_enums}
    for name, was_e, now_e in ctx.matched(old_e, new_e, "ENUM_REMOVED", "ENUM_ADDED"):
        with ctx.at(name):
            _compare_enum(ctx, was_e, now_e)


def _compare_enum(ctx: _Ctx, old: EnumDescriptorProto, new: EnumDescriptorProto) -> None:
    olds = {v.number: v.name for v in old.value}
    news = {v.number: v.name for v in new.value}
    numbers = sorted({*olds, *news})
    for n, was, now in ctx.matched(olds, news, "ENUM_CONST_REMOVED", "ENUM_CONST_ADDED", numbers):
        if was != now:
            ctx.add("ENUM_CONST_CHANGED", str(n))


def _oneofs(msg: DescriptorProto) -> tuple[dict[int, _F], dict[int, str], dict[str, list[int]]]:
    """(fields by number, number -> real oneof name, real oneof name -> numbers)."""
    by_number = {f.number: f for f in msg.field}
    of: dict[int, str] = {}
    members: dict[str, list[int]] = {}
    for f in msg.field:
        if f.HasField("oneof_index") and not f.proto3_optional:
            name = msg.oneof_decl[f.oneof_index].name
            of[f.number] = name
            members.setdefault(name, []).append(f.number)
    return by_number, of, members


def _compare_message(ctx: _Ctx, old: DescriptorProto, new: DescriptorProto) -> None:
    if id(old) in ctx.visiting:
        return
    ctx.visiting.add(id(old))
    try:
        _compare_fields(ctx, old, new)
    finally:
        ctx.visiting.discard(id(old))
    _compare_types(
        ctx, list(old.nested_type), list(old.enum_type), list(new.nested_type), list(new.enum_type)
    )


def _compare_fields(ctx: _Ctx, old: DescriptorProto, new: DescriptorProto) -> None:
    old_fields, old_of, old_members = _oneofs(old)
    new_fields, new_of, new_members = _oneofs(new)
    deleted = {
        name for name, numbers in old_members.items()
        if name not in new_members and not any(n in new_fields for n in numbers)
    }  # fmt: skip
    for name, numbers in new_members.items():
        with ctx.at(name):
            groups: set[str] = set()
            moved_in = 0
            for n in numbers:
                if n in old_of:
                    groups.add("oneof:" + old_of[n])
                elif n in old_fields:
                    groups.add(f"field:{n}")
                    moved_in += 1
            if len(groups) > 1:
                ctx.add(
                    "MULTIPLE_FIELDS_MOVED_TO_ONEOF"
                    if moved_in > 1
                    else "FIELD_MOVED_TO_EXISTING_ONEOF"
                )
    for name in sorted({*old_members, *new_members}):
        with ctx.at(name):
            if name not in new_members:
                ctx.add("ONEOF_REMOVED")
            elif name not in old_members:
                ctx.add("ONEOF_ADDED")
    for number in sorted({*old_fields, *new_fields}):
        was, now = old_fields.get(number), new_fields.get(number)
        if now is None:
            assert was is not None
            if number in old_of:
                if old_of[number] not in deleted:
                    with ctx.at(old_of[number]), ctx.at(str(number)):
                        ctx.add("ONEOF_FIELD_REMOVED")
            else:
                with ctx.at(str(number)):
                    ctx.add(
                        "REQUIRED_FIELD_REMOVED"
                        if was.label == _F.LABEL_REQUIRED
                        else "FIELD_REMOVED"
                    )
        elif was is None:
            if number in new_of:
                with ctx.at(new_of[number]), ctx.at(str(number)):
                    ctx.add("ONEOF_FIELD_ADDED")
            else:
                with ctx.at(str(number)):
                    ctx.add(
                        "REQUIRED_FIELD_ADDED" if now.label == _F.LABEL_REQUIRED else "FIELD_ADDED"
                    )
        else:
            if number in old_of and number not in new_of:
                with ctx.at(str(number)):
                    ctx.add("ONEOF_FIELD_MOVED_TO_TOP_LEVEL")
            if number in new_of:
                with ctx.at(new_of[number]), ctx.at(str(number)):
                    _compare_field(ctx, was, now, number in old_of, True)
            else:
                with ctx.at(str(number)):
                    _compare_field(ctx, was, now, number in old_of, False)


def _label(f: _F, proto3: bool, in_oneof: bool) -> int | None:
    """The field's label as written (None: none written -- proto3 singular, oneof member)."""
    if in_oneof:
        return None
    if proto3 and f.label == _F.LABEL_OPTIONAL and not f.proto3_optional:
        return None
    return int(f.label)


def _kind(ctx: _Ctx, f: _F, old_side: bool) -> tuple[str, _Type | None]:
    """(scalar | message | map, the named type)."""
    types = ctx.old_types if old_side else ctx.new_types
    if f.type in (_F.TYPE_MESSAGE, _F.TYPE_GROUP):
        t = types.get(f.type_name.lstrip("."))
        if t is not None and t.is_map:
            return "map", t
        return "message", t
    if f.type == _F.TYPE_ENUM:
        return "scalar", types.get(f.type_name.lstrip("."))
    return "scalar", None


def _compare_field(ctx: _Ctx, old: _F, new: _F, old_in_oneof: bool, new_in_oneof: bool) -> None:
    if old.name != new.name:
        ctx.add("FIELD_NAME_CHANGED")
    _compare_value(
        ctx,
        old, _label(old, ctx.old_proto3, old_in_oneof),
        new, _label(new, ctx.new_proto3, new_in_oneof),
    )  # fmt: skip


def _compare_value(
    ctx: _Ctx, old: _F, old_label: int | None, new: _F, new_label: int | None
) -> None:
    old_kind, old_type = _kind(ctx, old, True)
    new_kind, new_type = _kind(ctx, new, False)
    if old_kind != new_kind:
        ctx.add("FIELD_KIND_CHANGED")
    elif old_kind == "scalar":
        a, b = _SCALAR_KIND[old.type], _SCALAR_KIND[new.type]
        if a != b:
            ctx.add("FIELD_SCALAR_KIND_CHANGED")
        elif old_label is not None and new_label is not None and old_label != new_label:
            ctx.add(
                "FIELD_STRING_OR_BYTES_LABEL_CHANGED"
                if a == "text"
                else "FIELD_NUMERIC_LABEL_CHANGED"
            )
    elif old_kind == "map":
        assert old_type is not None and new_type is not None
        assert old_type.message is not None and new_type.message is not None
        for i in (0, 1):  # key, value
            _compare_value(ctx, old_type.message.field[i], None, new_type.message.field[i], None)
    else:
        _compare_message_types(ctx, old, old_type, new, new_type)


def _compare_message_types(
    ctx: _Ctx, old: _F, old_type: _Type | None, new: _F, new_type: _Type | None
) -> None:
    if old_type is None or new_type is None or old_type.message is None or new_type.message is None:
        if old.type_name != new.type_name:
            ctx.add("FIELD_NAMED_TYPE_CHANGED")
        return
    old_name, new_name = old.type_name.lstrip("."), new.type_name.lstrip(".")
    old_local = old_name.removeprefix(f"{old_type.package}.") if old_type.package else old_name
    new_local = new_name.removeprefix(f"{new_type.package}.") if new_type.package else new_name
    if old_local != new_local:
        ctx.add("FIELD_NAMED_TYPE_CHANGED")
        return
    if old_type.origin == new_type.origin:
        return  # one file: compared where it is declared (or the same imported version)
    sub = ctx.sub(old_local.split("."))
    _compare_message(sub, old_type.message, new_type.message)
    ctx.diffs += sub.diffs
    if not sub.compatible():
        ctx.add("FIELD_NAMED_TYPE_CHANGED")


def incompatibilities(
    old: FDP, old_imports: Sequence[FDP], new: FDP, new_imports: Sequence[FDP]
) -> list[str]:
    """Why ``new`` cannot read data written with ``old`` (empty: it can)."""
    return [
        f"{kind} at {path}"
        for kind, path in compare(old, old_imports, new, new_imports)
        if kind not in COMPATIBLE
    ]
