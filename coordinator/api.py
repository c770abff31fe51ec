"""The coordinator's operations, each defined once: by its method on a protocol.

Every public method of :data:`PROTOCOLS` is one operation. Its signature is its
request (the arguments, as a msgspec struct with the parameter names as fields), its
return annotation its answer, its docstring its errors (``segments.errors`` classes).
From that one definition come:

- the HTTP route ``POST /v2/<operation>`` (``coordinator.http.server``);
- the client method of the same name (``coordinator.http.client``);
- the wire encoding: MessagePack through msgspec, typed both ways (bytes stay bytes,
  dataclasses travel as maps of their fields, mappings keyed by ``TopicPartition``
  as maps with those keys);
- who may call it, by the route's name (``coordinator.security.access.RULES``).

Adding an operation is adding its method to a protocol and to the implementations
(``coordinator.local``, ``coordinator.shards``); :data:`RETRY_UNSAFE` says whether a
client may send it again after a failure that may have reached a coordinator.

An argument the operation does not have is refused (MalformedRequestError); fields
inside a value that its dataclass does not have are ignored (msgspec's rule for
dataclasses; a check of every nested map would cost the commit path a second walk over
its chunks).

A parameter named ``principal`` is not sent: the server fills it in from the caller's
credential (``coordinator.security.access.user_of``).

May import the protocols' rooms and ``segments``; imported by ``coordinator.http`` and
``coordinator.security.access``.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import msgspec

from coordinator.client import Coordinator, StoreLocation, TransactionCoordinator
from coordinator.groups.kafka import KafkaGroupCoordinator
from coordinator.groups.model import GroupCoordinator
from coordinator.schemas.model import SchemaStore
from segments.store import ObjectInfo

#: The path prefix of every operation's route.
PREFIX = "/v2/"
#: The media type of requests and answers.
MEDIA_TYPE = "application/vnd.msgpack"
#: The parameter the server fills in from the caller's credential.
PRINCIPAL = "principal"


class StoreView(Protocol):
    """What a coordinator tells readers about the object store its cluster writes to."""

    def store_location(self) -> StoreLocation | None:
        """URL, endpoint and region of the object store (None: the coordinator has none):
        what Spark jobs read and write the bucket with, never credentials (those come
        from the reader's own AWS chain)."""
        ...

    def find_orphans(self, grace_s: float, prefix: str = "segments/") -> list[ObjectInfo]:
        """Objects under ``prefix`` older than ``grace_s`` that neither the index nor a
        live write lease holds. Raises MalformedRequestError without a store."""
        ...


class ServedCoordinator(
    Coordinator,
    TransactionCoordinator,
    GroupCoordinator,
    KafkaGroupCoordinator,
    SchemaStore,
    Protocol,
):
    """What a coordinator's implementation serves (``coordinator.local``): the log, its
    transactions, both doors' consumer groups, the schema registry."""


class FullCoordinator(ServedCoordinator, StoreView, Protocol):
    """Every operation: those of the implementation, and the object store's view that the
    server adds."""


#: The protocols whose methods are the operations, in the order they are listed.
PROTOCOLS: tuple[type, ...] = (
    Coordinator,
    TransactionCoordinator,
    GroupCoordinator,
    KafkaGroupCoordinator,
    SchemaStore,
    StoreView,
)

#: Operations a client must not send again once the request may have reached a
#: coordinator (a read timeout, a reset): a repeat would act twice (a second producer
#: id, a consumer created or a topic deleted again answering "exists" or "not found").
#: Every other operation is safe to repeat: a read, or a write whose repeat finds the
#: state the first one left (commits by object key, heartbeats, joins, offsets).
RETRY_UNSAFE = frozenset(
    {
        "create_topic",
        "delete_topic",
        "add_partitions",
        "init_producer_id",
        "init_transaction",
        "create_consumer",
        "delete_consumer",
        "delete_group",
        "delete_subject",
        "delete_subject_version",
        "delete_compatibility",
    }
)


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation: its name, the method that defines it, and its wire codecs."""

    name: str
    method: Callable[..., Any]
    #: The request: one field per sent parameter (all but ``principal``).
    args: type[msgspec.Struct]
    #: The names of the sent parameters in signature order, and which are keyword-only.
    positional: tuple[str, ...]
    keywords: tuple[str, ...]
    takes_principal: bool
    result: Any
    retry_safe: bool

    @property
    def path(self) -> str:
        return PREFIX + self.name

    def request(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bytes:
        """The request body of a call with these arguments (as the method takes them)."""
        fields = dict(zip(self.positional + self.keywords, args, strict=False))
        fields.update(kwargs)
        fields.pop(PRINCIPAL, None)  # the server's to set
        return _ENCODER.encode(self.args(**fields))

    def call(self, target: Any, body: bytes, principal: str | None) -> Any:
        """Decode ``body`` and call the operation on ``target``. Raises
        msgspec.ValidationError / msgspec.DecodeError for a malformed body."""
        return self.invoke(target, self.decode(body), principal)

    def invoke(self, target: Any, args: Any, principal: str | None) -> Any:
        """Call the operation on ``target`` with decoded ``args`` (``decode``)."""
        positional = [getattr(args, n) for n in self.positional]
        keywords = {n: getattr(args, n) for n in self.keywords}
        if self.takes_principal:
            keywords[PRINCIPAL] = principal
        return getattr(target, self.name)(*positional, **keywords)

    def decode(self, body: bytes) -> Any:
        """The arguments of a request body, a struct with one field per parameter."""
        return _decoder(self.args).decode(body)

    def answer(self, result: Any) -> bytes:
        return _ENCODER.encode(result)

    def read_answer(self, body: bytes) -> Any:
        return _decoder(self.result).decode(body)


_ENCODER = msgspec.msgpack.Encoder()
_DECODERS: dict[Any, msgspec.msgpack.Decoder[Any]] = {}


def _decoder(kind: Any) -> msgspec.msgpack.Decoder[Any]:
    decoder = _DECODERS.get(kind)
    if decoder is None:
        decoder = _DECODERS[kind] = msgspec.msgpack.Decoder(kind)
    return decoder


def _operation(protocol: type, name: str) -> Operation:
    method = getattr(protocol, name)
    hints = typing.get_type_hints(method)
    fields: list[tuple[str, Any, Any] | tuple[str, Any]] = []
    positional: list[str] = []
    keywords: list[str] = []
    takes_principal = False
    for p in list(inspect.signature(method).parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"{protocol.__name__}.{name}: an operation names its parameters")
        if p.name == PRINCIPAL:
            takes_principal = True
            continue
        (keywords if p.kind is p.KEYWORD_ONLY else positional).append(p.name)
        if p.default is p.empty:
            fields.append((p.name, hints[p.name]))
        else:
            fields.append((p.name, hints[p.name], p.default))
    args = msgspec.defstruct(
        f"{name}_args", fields, kw_only=True, forbid_unknown_fields=True, frozen=True
    )
    return Operation(
        name=name,
        method=method,
        args=args,
        positional=tuple(positional),
        keywords=tuple(keywords),
        takes_principal=takes_principal,
        result=hints.get("return", Any),
        retry_safe=name not in RETRY_UNSAFE,
    )


def _operations() -> dict[str, Operation]:
    ops: dict[str, Operation] = {}
    for protocol in PROTOCOLS:
        for name, member in vars(protocol).items():
            if name.startswith("_") or not callable(member):
                continue
            if name in ops:
                raise TypeError(f"operation {name} is defined twice")
            ops[name] = _operation(protocol, name)
    unknown = RETRY_UNSAFE - ops.keys()
    if unknown:
        raise TypeError(f"RETRY_UNSAFE names no operation: {sorted(unknown)}")
    return ops


#: Every operation by name.
OPERATIONS: dict[str, Operation] = _operations()


_P = ParamSpec("_P")
_R = TypeVar("_R")
_S = TypeVar("_S")


def forward(
    attribute: str, method: Callable[Concatenate[_S, _P], _R]
) -> Callable[Concatenate[Any, _P], _R]:
    """A method that hands its call to the object in ``attribute`` of its instance, to
    that object's ``method`` (by name): an implementation's operation served by the store
    that owns it, typed as that store's method (``coordinator.local``)."""
    name = method.__name__

    def call(self: Any, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        result: _R = getattr(getattr(self, attribute), name)(*args, **kwargs)
        return result

    call.__name__ = call.__qualname__ = name
    call.__doc__ = method.__doc__
    return call
