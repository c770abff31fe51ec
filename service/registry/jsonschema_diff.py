"""JSON Schema compatibility as Confluent's registry decides it: a diff of two schema trees.

Confluent loads a JSON Schema into typed nodes (the everit library's model) and walks the
original (older) and the update (newer) tree together, naming each change (``TYPE_CHANGED``,
``MAX_LENGTH_INCREASED``, ``OPTIONAL_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL``, ...). The update
is backward compatible when every change is in :data:`COMPATIBLE` (Confluent's STRICT
policy, its default). This module rebuilds both halves from the rules, not from the code:

Loading (:func:`load`): ``true``/``{}`` accept anything, ``false`` nothing; ``$ref`` is
followed (``#/definitions/..``, ``#/$defs/..`` -- either bucket finds a definition --,
another schema given as a reference, ``$id``-relative); otherwise each keyword group makes
one node -- ``enum``, ``allOf``/``anyOf``/``oneOf``, ``not``, ``const``, ``type`` (with that
type's keywords; a list of types is an ``anyOf``), then the keywords of types not named by
``type`` (an ``object`` node for ``properties`` alone, ...) -- and several nodes in one
object are an ``allOf``. ``title``, ``description``, ``$id`` and ``default`` ride on the
result. Draft 2020-12 spellings (``prefixItems``, ``items`` after them, ``$defs``,
``dependentRequired``/``dependentSchemas``, ``unevaluated*``) load into the same model.

Diffing (:func:`compare`): references are compared by what they point to (so a change inside
``$defs`` or inside another subject's schema is seen; recursive schemas stop at a pair
already being compared); a non-combined schema may become a one-of/any-of that contains a
compatible alternative (``SUM_TYPE_EXTENDED``), an all-of may become one of its parts
(``PRODUCT_TYPE_NARROWED``); otherwise nodes of another kind are ``TYPE_CHANGED``, and nodes
of one kind compare their keywords. Content models: a property added to an *open* object
(no ``additionalProperties``) is compatible only with the empty schema; to a closed or
partially open one (``additionalProperties`` or ``patternProperties`` schemas) it is
compatible when the old model covered it; a required property is compatible added only
with a ``default``. Arrays' tuple items follow the same rules.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT7, DRAFT202012

from service.registry.diffs import Change, PathDiffs

# -- the model ----------------------------------------------------------------------------

_ARRAY_KEYS = ("items", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains")
_MODERN_ARRAY_KEYS = ("prefixItems", "items", "minItems", "maxItems", "uniqueItems", "contains")
_OBJECT_KEYS = (
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "dependencies",
    "patternProperties",
    "additionalProperties",
    "propertyNames",
)
_MODERN_OBJECT_KEYS = (*_OBJECT_KEYS, "dependentRequired", "dependentSchemas")
_NUMBER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_STRING_KEYS = ("minLength", "maxLength", "pattern", "format")
_CONDITIONAL_KEYS = ("if", "then", "else")
_MODERN_DRAFTS = ("2019-09", "2020-12")


@dataclass(eq=False)
class Node:
    """One schema of the tree; ``kind`` names its class (``string``, ``object``, ...)."""

    kind: str
    raw: Any = None
    title: Any = None
    description: Any = None
    id: Any = None
    default: Any = None
    has_default: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # keywords no loader consumed
    # kind-specific
    attrs: dict[str, Any] = field(default_factory=dict)
    subschemas: list[Node] = field(default_factory=list)  # combined
    criterion: str = ""  # allOf / anyOf / oneOf
    target: Callable[[], Node] | None = None  # ref


def _key(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


class Loader:
    """Loads schema documents into :class:`Node` trees, following ``$ref``.

    Args:
        resources: (name, document) of every schema this one may reference.
    """

    def __init__(self, resources: list[tuple[str, Any]]) -> None:
        self._resources = resources
        self._nodes: dict[int, Node] = {}
        self._keep: list[Any] = []  # documents whose id() keys ``_nodes``

    def load_root(self, doc: Any) -> Node:
        modern = isinstance(doc, dict) and any(
            d in str(doc.get("$schema", "")) for d in _MODERN_DRAFTS
        )
        spec = DRAFT202012 if modern else DRAFT7
        base = (
            doc.get("$id", "") if isinstance(doc, dict) and isinstance(doc.get("$id"), str) else ""
        )
        registry: Registry[Any] = Registry()
        for name, dep in self._resources:
            resource = Resource.from_contents(dep, default_specification=spec)
            registry = registry.with_resource(name, resource)
            if base:
                from urllib.parse import urljoin

                registry = registry.with_resource(urljoin(base, name), resource)
        root = Resource.from_contents(doc, default_specification=spec)
        registry = registry.with_resource(base, root)
        resolver = registry.resolver(base_uri=base)
        return self._load(doc, resolver, modern)

    def _load(self, doc: Any, resolver: Any, modern: bool) -> Node:
        found = self._nodes.get(id(doc))
        if found is not None:
            return found
        node = self._build(doc, resolver, modern)
        self._nodes[id(doc)] = node
        self._keep.append(doc)
        return node

    def _build(self, doc: Any, resolver: Any, modern: bool) -> Node:
        if doc is True:
            return Node("true", raw=doc)
        if doc is False:
            return Node("false", raw=doc)
        if not isinstance(doc, dict):
            return Node("empty", raw=doc)
        if isinstance(doc.get("$id"), str):
            resolver = resolver.in_subresource(
                Resource.from_contents(doc, default_specification=DRAFT202012 if modern else DRAFT7)
            )
        if isinstance(doc.get("$ref"), str):
            ref = doc["$ref"]
            node = Node("ref", raw=doc, attrs={"ref": ref})
            node.target = self._deref(ref, resolver, modern)
            return node
        rest = dict(doc)
        parts: list[Node] = []

        def child(value: Any) -> Node:
            return self._load(value, resolver, modern)

        if "enum" in rest:
            values = rest.pop("enum")
            parts.append(Node("enum", raw=doc, attrs={"values": list(values)}))
        for criterion in ("allOf", "anyOf", "oneOf"):
            if criterion in rest:
                subs = [child(s) for s in rest.pop(criterion)]
                parts.append(Node("combined", raw=doc, criterion=criterion, subschemas=subs))
        if "not" in rest:
            parts.append(Node("not", raw=doc, attrs={"not": child(rest.pop("not"))}))
        if "const" in rest:
            parts.append(Node("const", raw=doc, attrs={"value": rest.pop("const")}))
        if "type" in rest:
            kinds = rest.pop("type")
            typed = [self._typed(k, rest, doc, child, modern) for k in _as_list(kinds)]
            for k in _as_list(kinds):
                for key in self._keywords(k, modern):
                    rest.pop(key, None)
            if isinstance(kinds, list):
                parts.append(Node("combined", raw=doc, criterion="anyOf", subschemas=typed))
            else:
                parts.append(typed[0])
        array_keys = _MODERN_ARRAY_KEYS if modern else _ARRAY_KEYS
        object_keys = _MODERN_OBJECT_KEYS if modern else _OBJECT_KEYS
        for kind, keys in (
            ("array", array_keys),
            ("object", object_keys),
            ("number", _NUMBER_KEYS),
            ("string", _STRING_KEYS),
        ):
            if any(k in rest for k in keys):
                parts.append(self._typed(kind, rest, doc, child, modern))
                for key in keys:
                    rest.pop(key, None)
        if any(k in rest for k in _CONDITIONAL_KEYS):
            parts.append(Node("conditional", raw=doc))
            for key in _CONDITIONAL_KEYS:
                rest.pop(key, None)
        if not parts:
            node = Node("empty", raw=doc)
        elif len(parts) == 1:
            node = parts[0]
        else:
            node = Node("combined", raw=doc, criterion="allOf", subschemas=parts)
        node.id = rest.pop("$id", rest.pop("id", None))
        node.title = rest.pop("title", None)
        node.description = rest.pop("description", None)
        if "default" in rest:
            node.has_default, node.default = True, rest.pop("default")
        for meta in ("$schema", "definitions", "$defs", "$comment", "examples"):
            rest.pop(meta, None)
        for name in ("unevaluatedProperties", "unevaluatedItems"):
            if name in rest and modern:
                rest[name] = child(rest[name])
        node.extra = rest
        return node

    def _keywords(self, kind: str, modern: bool) -> tuple[str, ...]:
        return {
            "string": _STRING_KEYS,
            "integer": _NUMBER_KEYS,
            "number": _NUMBER_KEYS,
            "array": _MODERN_ARRAY_KEYS if modern else _ARRAY_KEYS,
            "object": _MODERN_OBJECT_KEYS if modern else _OBJECT_KEYS,
        }.get(kind, ())

    def _typed(
        self, kind: str, src: dict[str, Any], raw: Any, child: Callable[[Any], Node], modern: bool
    ) -> Node:
        if kind in ("integer", "number"):
            attrs = {k: src.get(k) for k in _NUMBER_KEYS}
            for limit in ("exclusiveMinimum", "exclusiveMaximum"):
                if isinstance(attrs[limit], bool):  # draft 4's flag: no limit of its own
                    attrs[limit] = None
            attrs["integer"] = kind == "integer"
            return Node("number", raw=raw, attrs=attrs)
        if kind == "string":
            return Node("string", raw=raw, attrs={k: src.get(k) for k in _STRING_KEYS})
        if kind in ("boolean", "null"):
            return Node(kind, raw=raw)
        if kind == "object":
            return Node("object", raw=raw, attrs=self._object(src, child, modern))
        if kind == "array":
            return Node("array", raw=raw, attrs=self._array(src, child, modern))
        return Node("unknown", raw=raw, attrs={"type": kind})

    def _object(
        self, src: dict[str, Any], child: Callable[[Any], Node], modern: bool
    ) -> dict[str, Any]:
        props = {k: child(v) for k, v in (src.get("properties") or {}).items()}
        extra = src.get("additionalProperties", True)
        deps_props: dict[str, set[str]] = {}
        deps_schemas: dict[str, Node] = {}
        for name, dep in (src.get("dependencies") or {}).items():
            if isinstance(dep, list):
                deps_props[name] = set(dep)
            else:
                deps_schemas[name] = child(dep)
        if modern:
            for name, dep in (src.get("dependentRequired") or {}).items():
                deps_props[name] = set(dep)
            for name, dep in (src.get("dependentSchemas") or {}).items():
                deps_schemas[name] = child(dep)
        return {
            "properties": props,
            "required": list(src.get("required") or []),
            "permits_extra": extra is not False,
            "extra_schema": child(extra) if isinstance(extra, dict) else None,
            "patterns": [(p, child(s)) for p, s in (src.get("patternProperties") or {}).items()],
            "deps_props": deps_props,
            "deps_schemas": deps_schemas,
            "maxProperties": src.get("maxProperties"),
            "minProperties": src.get("minProperties"),
        }

    def _array(
        self, src: dict[str, Any], child: Callable[[Any], Node], modern: bool
    ) -> dict[str, Any]:
        all_items: Node | None = None
        tuple_items: list[Node] | None = None
        extra: Any = src.get("additionalItems", True)
        items = src.get("items")
        if modern:
            if "prefixItems" in src:
                tuple_items = [child(s) for s in src["prefixItems"]]
                extra = items if items is not None else True
            elif isinstance(items, bool):
                extra = items
            elif items is not None:
                all_items = child(items)
            extra_src = extra
        else:
            if isinstance(items, list):
                tuple_items = [child(s) for s in items]
            elif items is not None:
                all_items = child(items)
            extra_src = extra
        return {
            "all": all_items,
            "tuple": tuple_items,
            "permits_extra": extra_src is not False,
            "extra_schema": child(extra_src) if isinstance(extra_src, dict) else None,
            "maxItems": src.get("maxItems"),
            "minItems": src.get("minItems"),
            "unique": bool(src.get("uniqueItems", False)),
        }

    def _deref(self, ref: str, resolver: Any, modern: bool) -> Callable[[], Node]:
        """A thunk for the node ``ref`` names (loaded on first use: recursion is allowed)."""

        def target() -> Node:
            resolved = None
            for candidate in (ref, ref.replace("/$defs/", "/definitions/")):
                try:
                    resolved = resolver.lookup(candidate)
                    break
                except Unresolvable:
                    continue
            if resolved is None:
                return Node("unresolved", attrs={"ref": ref})
            return self._load(resolved.contents, resolved.resolver, modern)

        cache: list[Node] = []

        def once() -> Node:
            if not cache:
                cache.append(target())
            return cache[0]

        return once


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# -- the diff ------------------------------------------------------------------------------

#: Changes that keep the update backward compatible (Confluent's STRICT policy).
COMPATIBLE = frozenset(
    {
        "ID_CHANGED", "DESCRIPTION_CHANGED", "TITLE_CHANGED", "DEFAULT_CHANGED",
        "SCHEMA_REMOVED", "TYPE_EXTENDED",
        "MAX_LENGTH_INCREASED", "MAX_LENGTH_REMOVED", "MIN_LENGTH_DECREASED",
        "MIN_LENGTH_REMOVED", "PATTERN_REMOVED",
        "MAXIMUM_INCREASED", "MAXIMUM_REMOVED", "MINIMUM_DECREASED", "MINIMUM_REMOVED",
        "EXCLUSIVE_MAXIMUM_INCREASED", "EXCLUSIVE_MAXIMUM_REMOVED",
        "EXCLUSIVE_MINIMUM_DECREASED", "EXCLUSIVE_MINIMUM_REMOVED",
        "MULTIPLE_OF_REDUCED", "MULTIPLE_OF_REMOVED",
        "REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED", "REQUIRED_ATTRIBUTE_REMOVED",
        "DEPENDENCY_ARRAY_NARROWED", "DEPENDENCY_ARRAY_REMOVED", "DEPENDENCY_SCHEMA_REMOVED",
        "MAX_PROPERTIES_INCREASED", "MAX_PROPERTIES_REMOVED",
        "MIN_PROPERTIES_DECREASED", "MIN_PROPERTIES_REMOVED",
        "ADDITIONAL_PROPERTIES_ADDED", "ADDITIONAL_PROPERTIES_EXTENDED",
        "UNEVALUATED_PROPERTIES_ADDED", "UNEVALUATED_PROPERTIES_EXTENDED",
        "PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL",
        "REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_UNOPEN_CONTENT_MODEL",
        "OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL",
        "PROPERTY_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL",
        "PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL",
        "PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
        "PROPERTY_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
        "MAX_ITEMS_INCREASED", "MAX_ITEMS_REMOVED", "MIN_ITEMS_DECREASED", "MIN_ITEMS_REMOVED",
        "MAX_CONTAINS_INCREASED", "MAX_CONTAINS_REMOVED",
        "MIN_CONTAINS_DECREASED", "MIN_CONTAINS_REMOVED",
        "UNIQUE_ITEMS_REMOVED", "ADDITIONAL_ITEMS_ADDED", "ADDITIONAL_ITEMS_EXTENDED",
        "UNEVALUATED_ITEMS_ADDED", "UNEVALUATED_ITEMS_EXTENDED",
        "ITEM_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL", "ITEM_ADDED_TO_CLOSED_CONTENT_MODEL",
        "ITEM_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL", "ITEM_REMOVED_FROM_OPEN_CONTENT_MODEL",
        "ITEM_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
        "ITEM_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
        "ENUM_ARRAY_EXTENDED",
        "COMBINED_TYPE_EXTENDED", "PRODUCT_TYPE_NARROWED", "SUM_TYPE_EXTENDED",
        "NOT_TYPE_NARROWED",
    }
)  # fmt: skip


class _Ctx(PathDiffs):
    """Differences found under a path; memo and cycle state are shared by sub-contexts."""

    compatible_kinds = COMPATIBLE

    def __init__(self, shared: _Shared, path: tuple[str, ...] = ()) -> None:
        self.shared = shared
        self.path = list(path)
        self.diffs = []

    def sub(self) -> _Ctx:
        return _Ctx(self.shared, tuple(self.path))


@dataclass
class _Shared:
    memo: dict[tuple[int, int], list[Change]] = field(default_factory=dict)
    in_progress: set[tuple[int, int]] = field(default_factory=set)
    seed: dict[tuple[int, int], list[Change]] = field(default_factory=dict)
    optimistic: bool = False
    keep: list[Any] = field(default_factory=list)


def compare(original: Node, update: Node) -> list[Change]:
    """Every change from ``original`` to ``update``, as (type, JSON path) pairs.

    A pair of schemas already being compared (a recursive schema) is taken as compatible
    for that pass; passes repeat, feeding back the pairs found incompatible, until they
    agree (so the optimism cannot hide a real change).
    """
    seed: dict[tuple[int, int], list[Change]] = {}
    while True:
        shared = _Shared(seed=seed)
        ctx = _Ctx(shared)
        _compare(ctx, original, update)
        bad = {k: v for k, v in shared.memo.items() if any(t not in COMPATIBLE for t, _ in v)}
        if not shared.optimistic or bad.keys() == seed.keys():
            return ctx.diffs
        seed = bad


def _deref(node: Node) -> Node:
    seen = 0
    while node.kind == "ref" and node.target is not None and seen < 64:
        node = node.target()
        seen += 1
    return node


def _rebase(prefix: list[str], diffs: list[Change]) -> list[Change]:
    if not prefix:
        return list(diffs)
    head = "#/" + "/".join(prefix)
    return [(kind, head if len(path) <= 2 else f"{head}/{path[2:]}") for kind, path in diffs]


def _compare(ctx: _Ctx, original: Node | None, update: Node | None) -> None:
    if original is None and update is None:
        return
    if original is None:
        ctx.add("SCHEMA_ADDED")
        return
    if update is None:
        ctx.add("SCHEMA_REMOVED")
        return
    original, update = _deref(original), _deref(update)
    key = (id(original), id(update))
    shared = ctx.shared
    cached = shared.memo.get(key)
    if cached is None:
        if key in shared.in_progress:
            seeded = shared.seed.get(key)
            if seeded is None:
                shared.optimistic = True
            cached = seeded or []
        else:
            shared.in_progress.add(key)
            try:
                sub = _Ctx(shared)
                _compare_types(sub, original, update)
                cached = sub.diffs
                shared.memo[key] = cached
                shared.keep.append((original, update))
            finally:
                shared.in_progress.discard(key)
    ctx.diffs += _rebase(ctx.path, cached)


def _is_empty(node: Node) -> bool:
    return node.kind in ("empty", "true")


def _same_kind(a: Node, b: Node) -> bool:
    return a.kind == b.kind


def _absorbed(ctx: _Ctx, original: Node, update: Node) -> bool:
    """Whether ``update`` is a compatible change of ``original`` (then its changes are
    ``ctx``'s); an incompatible one leaves ``ctx`` as it was."""
    sub = ctx.sub()
    _compare(sub, original, update)
    if sub.compatible():
        ctx.diffs += sub.diffs
    return sub.compatible()


def _compare_types(ctx: _Ctx, original: Node, update: Node) -> None:
    if original.kind != "combined" and update.kind == "combined":
        if len(update.subschemas) == 1:
            if _absorbed(ctx, original, update.subschemas[0]):
                return
        elif update.criterion in ("anyOf", "oneOf") and any(
            _absorbed(ctx, original, alternative) for alternative in update.subschemas
        ):
            ctx.add("SUM_TYPE_EXTENDED")
            return
    elif original.kind == "combined" and update.kind != "combined":
        if len(original.subschemas) == 1:
            if _absorbed(ctx, original.subschemas[0], update):
                return
        elif original.criterion == "allOf" and any(
            _absorbed(ctx, part, update) for part in original.subschemas
        ):
            ctx.add("PRODUCT_TYPE_NARROWED")
            return

    if not _same_kind(original, update):
        if original.kind == "false" or _is_empty(update):
            return
        if original.extra.get("connect.type") == "bytes" == update.extra.get("connect.type"):
            return
        if original.kind == update.kind == "unresolved":
            if original.attrs["ref"] != update.attrs["ref"]:
                ctx.add("TYPE_CHANGED")
            return
        ctx.add("TYPE_CHANGED")
        return

    if original.id != update.id:
        ctx.add("ID_CHANGED")
    if original.title != update.title:
        ctx.add("TITLE_CHANGED")
    if original.description != update.description:
        ctx.add("DESCRIPTION_CHANGED")
    if original.default != update.default:
        ctx.add("DEFAULT_CHANGED")

    differ = _DIFFERS.get(original.kind)
    if differ is not None:
        differ(ctx, original, update)


def _bound(ctx: _Ctx, name: str, label: str, old: Any, new: Any) -> None:
    """ADDED / REMOVED / INCREASED / DECREASED of one numeric keyword."""
    if old == new:
        return
    if old is None:
        ctx.add(f"{label}_ADDED", name)
    elif new is None:
        ctx.add(f"{label}_REMOVED", name)
    elif old < new:
        ctx.add(f"{label}_INCREASED", name)
    elif old > new:
        ctx.add(f"{label}_DECREASED", name)


def _string(ctx: _Ctx, original: Node, update: Node) -> None:
    o, u = original.attrs, update.attrs
    _bound(ctx, "maxLength", "MAX_LENGTH", o["maxLength"], u["maxLength"])
    _bound(ctx, "minLength", "MIN_LENGTH", o["minLength"], u["minLength"])
    if o["pattern"] is None and u["pattern"] is not None:
        ctx.add("PATTERN_ADDED", "pattern")
    elif o["pattern"] is not None and u["pattern"] is None:
        ctx.add("PATTERN_REMOVED", "pattern")
    elif o["pattern"] != u["pattern"]:
        ctx.add("PATTERN_CHANGED", "pattern")


def _decimal(value: Any) -> Decimal | None:
    if value is None:
        return None
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return None


def _number(ctx: _Ctx, original: Node, update: Node) -> None:
    o, u = original.attrs, update.attrs
    _bound(ctx, "maximum", "MAXIMUM", o["maximum"], u["maximum"])
    _bound(ctx, "minimum", "MINIMUM", o["minimum"], u["minimum"])
    _bound(
        ctx, "exclusiveMaximum", "EXCLUSIVE_MAXIMUM", o["exclusiveMaximum"], u["exclusiveMaximum"]
    )
    _bound(
        ctx, "exclusiveMinimum", "EXCLUSIVE_MINIMUM", o["exclusiveMinimum"], u["exclusiveMinimum"]
    )
    om, um = _decimal(o["multipleOf"]), _decimal(u["multipleOf"])
    if om != um:
        if om is None:
            ctx.add("MULTIPLE_OF_ADDED", "multipleOf")
        elif um is None:
            ctx.add("MULTIPLE_OF_REMOVED", "multipleOf")
        elif om != 0 and um % om == 0:
            ctx.add("MULTIPLE_OF_EXPANDED", "multipleOf")
        elif um != 0 and om % um == 0:
            ctx.add("MULTIPLE_OF_REDUCED", "multipleOf")
        else:
            ctx.add("MULTIPLE_OF_CHANGED", "multipleOf")
    if o["integer"] != u["integer"]:
        ctx.add("TYPE_EXTENDED" if o["integer"] else "TYPE_NARROWED")


def _enum(ctx: _Ctx, original: Node, update: Node) -> None:
    old = {_key(v) for v in original.attrs["values"]}
    new = {_key(v) for v in update.attrs["values"]}
    if old != new:
        if new >= old:
            ctx.add("ENUM_ARRAY_EXTENDED", "enum")
        elif old >= new:
            ctx.add("ENUM_ARRAY_NARROWED", "enum")
        else:
            ctx.add("ENUM_ARRAY_CHANGED", "enum")


def _const(ctx: _Ctx, original: Node, update: Node) -> None:
    if _key(original.attrs["value"]) != _key(update.attrs["value"]):
        ctx.add("ENUM_ARRAY_CHANGED", "const")


def _not(ctx: _Ctx, original: Node, update: Node) -> None:
    with ctx.at("not"):
        sub = ctx.sub()
        _compare(sub, update.attrs["not"], original.attrs["not"])  # reversed
        ctx.add("NOT_TYPE_NARROWED" if sub.compatible() else "NOT_TYPE_EXTENDED")


def _singleton(node: Node) -> bool:
    return len(node.subschemas) == 1


def _combined(ctx: _Ctx, original: Node, update: Node) -> None:
    oc, uc = original.criterion, update.criterion
    if oc != uc:
        if (
            uc == "anyOf"
            or (_singleton(original) and _singleton(update))
            or (_singleton(original) and uc == "oneOf")
            or (_singleton(update) and oc == "allOf")
        ):
            ctx.add("COMBINED_TYPE_EXTENDED")
        else:
            ctx.add("COMBINED_TYPE_CHANGED")
            return
    # Equal alternatives count once; the parts one object makes share its document, so
    # their kind tells them apart.
    olds = list({(n.kind, _key(n.raw)): n for n in original.subschemas}.values())
    news = list({(n.kind, _key(n.raw)): n for n in update.subschemas}.values())
    if len(olds) < len(news):
        ctx.add("PRODUCT_TYPE_EXTENDED" if uc == "allOf" else "SUM_TYPE_EXTENDED")
    elif len(olds) > len(news):
        ctx.add("SUM_TYPE_NARROWED" if oc in ("anyOf", "oneOf") else "PRODUCT_TYPE_NARROWED")
    edges: dict[int, dict[int, list[Change]]] = {}
    for i, old in enumerate(olds):
        with ctx.at(f"{oc}/{i}"):
            for j, new in enumerate(news):
                sub = ctx.sub()
                _compare(sub, old, new)
                if sub.compatible():
                    edges.setdefault(i, {})[j] = sub.diffs
    matching = _max_matching(edges, len(olds))
    for i, j in sorted(matching.items()):
        ctx.diffs += edges[i][j]
    if len(matching) < min(len(olds), len(news)):
        ctx.add("COMBINED_TYPE_SUBSCHEMAS_CHANGED")


def _max_matching(edges: dict[int, dict[int, Any]], left: int) -> dict[int, int]:
    """A maximum matching of a bipartite graph (augmenting paths); left -> right."""
    right_of: dict[int, int] = {}  # right -> left

    def augment(i: int, seen: set[int]) -> bool:
        for j in edges.get(i, {}):
            if j in seen:
                continue
            seen.add(j)
            if j not in right_of or augment(right_of[j], seen):
                right_of[j] = i
                return True
        return False

    for i in range(left):
        augment(i, set())
    return {i: j for j, i in right_of.items()}


def _open(attrs: dict[str, Any], uneval: Node | None) -> bool:
    if not attrs["permits_extra"] or attrs["extra_schema"] is not None:
        return False
    if attrs.get("patterns"):
        return False
    return uneval is None or _is_empty(uneval)


def _partial(attrs: dict[str, Any], uneval: Node | None, name: str | None) -> Node | None:
    """The schema a partially open content model gives ``name`` (a property), if any."""
    if name is not None:
        for pattern, schema in attrs.get("patterns", []):
            try:
                if re.search(pattern, name):
                    return schema  # type: ignore[no-any-return]
            except re.error:
                continue
    if attrs["extra_schema"] is not None:
        return attrs["extra_schema"]  # type: ignore[no-any-return]
    if (
        attrs["permits_extra"]
        and uneval is not None
        and uneval.kind not in ("false", "empty", "true")
    ):
        return uneval
    return None


def _uneval(node: Node, name: str) -> Node | None:
    value = node.extra.get(name)
    return value if isinstance(value, Node) else None


def _object(ctx: _Ctx, original: Node, update: Node) -> None:
    o, u = original.attrs, update.attrs
    o_uneval = _uneval(original, "unevaluatedProperties")
    u_uneval = _uneval(update, "unevaluatedProperties")
    with ctx.at("required"):
        for name in o["properties"]:
            if name in u["properties"]:
                was, now = name in o["required"], name in u["required"]
                if was and not now:
                    ctx.add("REQUIRED_ATTRIBUTE_REMOVED", name)
                elif now and not was:
                    with_default = _deref(u["properties"][name]).has_default
                    ctx.add(
                        "REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED"
                        if with_default
                        else "REQUIRED_ATTRIBUTE_ADDED",
                        name,
                    )
    with ctx.at("properties"):
        for name in dict.fromkeys([*o["properties"], *u["properties"]]):
            with ctx.at(name):
                _property(ctx, name, original, update, o_uneval, u_uneval)
    with ctx.at("dependencies"):
        for name, was, now in ctx.matched(
            o["deps_props"], u["deps_props"], "DEPENDENCY_ARRAY_REMOVED", "DEPENDENCY_ARRAY_ADDED"
        ):
            if was != now:
                if now >= was:
                    ctx.add("DEPENDENCY_ARRAY_EXTENDED", name)
                elif was >= now:
                    ctx.add("DEPENDENCY_ARRAY_NARROWED", name)
                else:
                    ctx.add("DEPENDENCY_ARRAY_CHANGED", name)
        for name, was_s, now_s in ctx.matched(
            o["deps_schemas"],
            u["deps_schemas"],
            "DEPENDENCY_SCHEMA_REMOVED",
            "DEPENDENCY_SCHEMA_ADDED",
        ):
            with ctx.at(name):
                _compare(ctx, was_s, now_s)
    _additional(ctx, "additionalProperties", "ADDITIONAL_PROPERTIES", o, u)
    _unevaluated(ctx, "unevaluatedProperties", "UNEVALUATED_PROPERTIES", o_uneval, u_uneval)
    _bound(ctx, "maxProperties", "MAX_PROPERTIES", o["maxProperties"], u["maxProperties"])
    _bound(ctx, "minProperties", "MIN_PROPERTIES", o["minProperties"], u["minProperties"])


def _property(
    ctx: _Ctx, name: str, original: Node, update: Node, o_uneval: Node | None, u_uneval: Node | None
) -> None:
    o, u = original.attrs, update.attrs
    old, new = o["properties"].get(name), u["properties"].get(name)
    if new is None:
        _removed(ctx, "PROPERTY", old, u, u_uneval, name)
        return
    if old is None:
        required = name in u["required"]
        has_default = _deref(new).has_default
        if _open(o, o_uneval):
            if _is_empty(_deref(new)):
                ctx.add("PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL")
            elif required:
                ctx.add(
                    "REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_OPEN_CONTENT_MODEL"
                    if has_default
                    else "REQUIRED_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL"
                )
            else:
                ctx.add("OPTIONAL_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL")
            return
        covering = _partial(o, o_uneval, name)
        if covering is not None:
            _covered(ctx, "PROPERTY_ADDED", covering, new)
        if required:
            ctx.add(
                "REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_UNOPEN_CONTENT_MODEL"
                if has_default
                else "REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL"
            )
        else:
            ctx.add("OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL")
        return
    _compare(ctx, old, new)


def _additional(ctx: _Ctx, keyword: str, label: str, o: dict[str, Any], u: dict[str, Any]) -> None:
    """additionalProperties or additionalItems: allowed or not, then their schema."""
    with ctx.at(keyword):
        if o["permits_extra"] != u["permits_extra"]:
            ctx.add(f"{label}_ADDED" if u["permits_extra"] else f"{label}_REMOVED")
        elif o["extra_schema"] is None and u["extra_schema"] is not None:
            ctx.add(f"{label}_NARROWED")
        elif u["extra_schema"] is None and o["extra_schema"] is not None:
            ctx.add(f"{label}_EXTENDED")
        else:
            _compare(ctx, o["extra_schema"], u["extra_schema"])


def _covered(ctx: _Ctx, change: str, old: Node, new: Node) -> None:
    """A property or item added or removed (``change``) where a partially open content
    model's schema stands for it: the differences between the two, and whether it covers."""
    sub = ctx.sub()
    _compare(sub, old, new)
    ctx.diffs += sub.diffs
    covered = "IS_COVERED" if sub.compatible() else "NOT_COVERED"
    ctx.add(f"{change}_{covered}_BY_PARTIALLY_OPEN_CONTENT_MODEL")


def _unevaluated(ctx: _Ctx, name: str, label: str, old: Node | None, new: Node | None) -> None:
    if old is None and new is None:
        return
    with ctx.at(name):
        if old is None:
            assert new is not None
            ctx.add(f"{label}_REMOVED" if new.kind == "false" else f"{label}_NARROWED")
        elif new is None:
            ctx.add(f"{label}_ADDED" if old.kind == "false" else f"{label}_EXTENDED")
        elif old.kind == "false" and new.kind != "false":
            ctx.add(f"{label}_ADDED")
        elif old.kind != "false" and new.kind == "false":
            ctx.add(f"{label}_REMOVED")
        elif _is_empty(old) and not _is_empty(new):
            ctx.add(f"{label}_NARROWED")
        elif not _is_empty(old) and _is_empty(new):
            ctx.add(f"{label}_EXTENDED")
        else:
            _compare(ctx, old, new)


def _array(ctx: _Ctx, original: Node, update: Node) -> None:
    o, u = original.attrs, update.attrs
    o_uneval = _uneval(original, "unevaluatedItems")
    u_uneval = _uneval(update, "unevaluatedItems")
    with ctx.at("items"):
        _compare(ctx, o["all"], u["all"])
    olds, news = o["tuple"] or [], u["tuple"] or []
    for i in range(max(len(olds), len(news))):
        with ctx.at(f"items/{i}"):
            if i < len(olds) and i < len(news):
                _compare(ctx, olds[i], news[i])
            elif i < len(olds):
                _removed(ctx, "ITEM", olds[i], u, u_uneval, None)
            else:
                _item_added(ctx, news[i], o, o_uneval)
    _additional(ctx, "additionalItems", "ADDITIONAL_ITEMS", o, u)
    _unevaluated(ctx, "unevaluatedItems", "UNEVALUATED_ITEMS", o_uneval, u_uneval)
    _bound(ctx, "maxItems", "MAX_ITEMS", o["maxItems"], u["maxItems"])
    _bound(ctx, "minItems", "MIN_ITEMS", o["minItems"], u["minItems"])
    if o["unique"] != u["unique"]:
        ctx.add("UNIQUE_ITEMS_REMOVED" if o["unique"] else "UNIQUE_ITEMS_ADDED", "uniqueItems")
    for keyword, label in (("maxContains", "MAX_CONTAINS"), ("minContains", "MIN_CONTAINS")):
        was, now = original.extra.get(keyword), update.extra.get(keyword)
        _bound(
            ctx,
            keyword,
            label,
            was if isinstance(was, int) else None,
            now if isinstance(now, int) else None,
        )


def _removed(
    ctx: _Ctx, kind: str, old: Node, u: dict[str, Any], u_uneval: Node | None, name: str | None
) -> None:
    """A property (``kind`` PROPERTY, ``name`` its name) or a tuple item (ITEM, None) that
    the update no longer has, by what the update's content model lets in instead."""
    if _open(u, u_uneval):
        ctx.add(f"{kind}_REMOVED_FROM_OPEN_CONTENT_MODEL")
        return
    covering = _partial(u, u_uneval, name)
    if covering is not None:
        _covered(ctx, f"{kind}_REMOVED", old, covering)
    elif _deref(old).kind == "false":
        ctx.add(f"{kind}_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL")
    else:
        ctx.add(f"{kind}_REMOVED_FROM_CLOSED_CONTENT_MODEL")


def _item_added(ctx: _Ctx, new: Node, o: dict[str, Any], o_uneval: Node | None) -> None:
    if _open(o, o_uneval):
        ctx.add(
            "ITEM_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL"
            if _is_empty(_deref(new))
            else "ITEM_ADDED_TO_OPEN_CONTENT_MODEL"
        )
        return
    covering = _partial(o, o_uneval, None)
    if covering is None:
        ctx.add("ITEM_ADDED_TO_CLOSED_CONTENT_MODEL")
        return
    _covered(ctx, "ITEM_ADDED", covering, new)


_DIFFERS: dict[str, Callable[[_Ctx, Node, Node], None]] = {
    "string": _string,
    "number": _number,
    "const": _const,
    "enum": _enum,
    "combined": _combined,
    "not": _not,
    "object": _object,
    "array": _array,
}


def incompatibilities(original: Node, update: Node) -> list[str]:
    """Why ``update`` cannot read data written with ``original`` (empty: it can)."""
    return [
        f"{kind} at {path}" for kind, path in compare(original, update) if kind not in COMPATIBLE
    ]
