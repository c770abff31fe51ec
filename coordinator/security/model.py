"""Who may connect and what each may do: principals, ACLs and the rule that decides.

Pure values and functions (no I/O): the coordinator stores them
(``coordinator.security.store``), every door checks them (``service.security.auth``,
``service.security.acl``).

ACLs are Kafka's (``kafka.security.authorizer.AclAuthorizer`` semantics):

- a binding is (principal, host, resource type, resource name, pattern type,
  operation, permission); principals are ``User:<name>`` and ``User:*`` matches
  every one; host ``*`` matches every address;
- a LITERAL pattern matches its name, or every name when the name is ``*``; a
  PREFIXED pattern matches every name starting with it;
- DENY wins over ALLOW; with no matching ALLOW the answer is no (default deny);
- an ALLOW of READ, WRITE, DELETE or ALTER also allows DESCRIBE, of ALTER_CONFIGS
  also DESCRIBE_CONFIGS, of ALL everything; a DENY applies to its own operation and
  ALL to all;
- super users are allowed everything, whatever the ACLs say.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

from segments.errors import InvalidSecurityRequestError

#: The principal of a request nobody authenticated (authentication off).
ANONYMOUS = "User:ANONYMOUS"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"

_NAME = re.compile(r"^[A-Za-z0-9._@-]{1,128}$")
MIN_PASSWORD_CHARS = 8
MAX_SECRET_CHARS = 1024


#: Secrets shipped as examples (docker-compose.yml, .env.example, deploy/): never
#: accepted, whatever their length.
PLACEHOLDER_MARKERS = ("change-me", "changeme", "replace-me", "example-secret")


def placeholder(value: str) -> bool:
    """Whether ``value`` is one of the examples a deployment must replace."""
    lowered = value.lower()
    return any(marker in lowered for marker in PLACEHOLDER_MARKERS)


def plaintext_remote(url: str) -> bool:
    """Whether ``url`` is ``http://`` to a host that is not this machine (credentials sent
    there cross a network in clear)."""
    parts = urlsplit(url.strip())
    if parts.scheme != "http":
        return False
    host = parts.hostname or ""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


class ResourceType(StrEnum):
    TOPIC = "TOPIC"
    GROUP = "GROUP"
    CLUSTER = "CLUSTER"
    TRANSACTIONAL_ID = "TRANSACTIONAL_ID"


class PatternType(StrEnum):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


class Operation(StrEnum):
    ALL = "ALL"
    READ = "READ"
    WRITE = "WRITE"
    CREATE = "CREATE"
    DELETE = "DELETE"
    ALTER = "ALTER"
    DESCRIBE = "DESCRIBE"
    CLUSTER_ACTION = "CLUSTER_ACTION"
    DESCRIBE_CONFIGS = "DESCRIBE_CONFIGS"
    ALTER_CONFIGS = "ALTER_CONFIGS"
    IDEMPOTENT_WRITE = "IDEMPOTENT_WRITE"


class Permission(StrEnum):
    ALLOW = "ALLOW"
    DENY = "DENY"


#: What an ALLOW of the key also allows (Kafka's implied operations).
_IMPLIES: dict[Operation, frozenset[Operation]] = {
    Operation.READ: frozenset({Operation.DESCRIBE}),
    Operation.WRITE: frozenset({Operation.DESCRIBE}),
    Operation.DELETE: frozenset({Operation.DESCRIBE}),
    Operation.ALTER: frozenset({Operation.DESCRIBE}),
    Operation.ALTER_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS}),
}


def check_name(name: object, what: str = "user name") -> str:
    """``name`` when it is 1-128 letters, digits or ``._@-``; else InvalidSecurityRequestError."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidSecurityRequestError(
            f"invalid {what}: 1 to 128 characters among letters, digits and ._@-"
        )
    return name


def check_password(password: object) -> str:
    """The password when it is 8 to 1024 characters and not an example value of the
    deployment files; the message never repeats it."""
    if not isinstance(password, str) or not (
        MIN_PASSWORD_CHARS <= len(password) <= MAX_SECRET_CHARS
    ):
        raise InvalidSecurityRequestError(
            f"a password must be {MIN_PASSWORD_CHARS} to {MAX_SECRET_CHARS} characters"
        )
    if placeholder(password):
        raise InvalidSecurityRequestError(
            "this password is an example value of the documentation or deployment files: "
            "choose your own"
        )
    return password


def user_principal(name: str) -> str:
    return f"User:{name}"


def basic(name: str, secret: str) -> str:
    """An ``Authorization: Basic`` value."""
    return "Basic " + base64.b64encode(f"{name}:{secret}".encode()).decode("ascii")


def parse_basic(value: str) -> tuple[str, str] | None:
    """(name, secret) of an ``Authorization: Basic ...`` value; None if it is not one."""
    scheme, _, data = value.partition(" ")
    if scheme.lower() != "basic" or not data.strip():
        return None
    try:
        text = base64.b64decode(data.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    name, sep, secret = text.partition(":")
    return (name, secret) if sep and name else None


def parse_principal(text: object) -> str:
    """``User:<name>`` (or ``User:*``) checked; InvalidSecurityRequestError otherwise."""
    if isinstance(text, str) and text == WILDCARD_PRINCIPAL:
        return text
    if not isinstance(text, str) or not text.startswith("User:"):
        raise InvalidSecurityRequestError(f"a principal looks like User:NAME, not {text!r}")
    check_name(text.removeprefix("User:"), "principal name")
    return text


def parse_super_users(spec: str) -> frozenset[str]:
    """``User:admin;User:ops`` (Kafka's ``super.users``) as a set of principals."""
    return frozenset(parse_principal(p.strip()) for p in spec.split(";") if p.strip())


def _enum(cls: type[StrEnum], value: object, what: str) -> StrEnum:
    try:
        return cls(str(value).upper())
    except ValueError:
        choices = ", ".join(m.value for m in cls)
        raise InvalidSecurityRequestError(f"invalid {what} {value!r}: one of {choices}") from None


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    """One ACL, as Kafka's AclBinding."""

    principal: str
    host: str
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    operation: Operation
    permission: Permission

    @classmethod
    def of(
        cls,
        principal: object,
        host: object,
        resource_type: object,
        resource_name: object,
        pattern_type: object,
        operation: object,
        permission: object,
    ) -> AclBinding:
        """A binding from untrusted values; InvalidSecurityRequestError for a bad one."""
        rtype = ResourceType(_enum(ResourceType, resource_type, "resource type"))
        if not isinstance(resource_name, str) or not resource_name:
            raise InvalidSecurityRequestError("an ACL needs a resource name")
        if rtype is ResourceType.CLUSTER and resource_name != "kafka-cluster":
            raise InvalidSecurityRequestError("the cluster resource is named kafka-cluster")
        if not isinstance(host, str) or not host:
            raise InvalidSecurityRequestError("an ACL needs a host (* for any)")
        pattern = PatternType(_enum(PatternType, pattern_type, "pattern type"))
        if pattern is PatternType.PREFIXED and resource_name == WILDCARD:
            raise InvalidSecurityRequestError("a PREFIXED pattern cannot be *")
        return cls(
            parse_principal(principal),
            host,
            rtype,
            resource_name,
            pattern,
            Operation(_enum(Operation, operation, "operation")),
            Permission(_enum(Permission, permission, "permission")),
        )

    def row(self) -> tuple[str, str, str, str, str, str, str]:
        """The binding's values in ``AclBinding.of``'s order, as strings (a table row)."""
        return (
            self.principal,
            self.host,
            self.resource_type.value,
            self.resource_name,
            self.pattern_type.value,
            self.operation.value,
            self.permission.value,
        )

    def matches_resource(self, resource_type: ResourceType, name: str) -> bool:
        if self.resource_type is not resource_type:
            return False
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name in (WILDCARD, name)

    def grants(self, operation: Operation) -> bool:
        """Whether this binding's operation covers ``operation`` for its permission."""
        if self.operation in (operation, Operation.ALL):
            return True
        return self.permission is Permission.ALLOW and operation in _IMPLIES.get(
            self.operation, frozenset()
        )


@dataclass(frozen=True, slots=True)
class Check:
    """One permission a request needs: an operation on a named resource."""

    operation: Operation
    resource_type: ResourceType
    name: str

    @classmethod
    def of(cls, operation: object, resource_type: object, name: object) -> Check:
        """A check from untrusted values; InvalidSecurityRequestError for a bad one."""
        if not isinstance(name, str) or not name:
            raise InvalidSecurityRequestError("a check needs a resource name")
        return cls(
            Operation(_enum(Operation, operation, "operation")),
            ResourceType(_enum(ResourceType, resource_type, "resource type")),
            name,
        )


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Which bindings a describe or delete means; None (or ANY) matches every value.

    ``pattern_type`` may also be ``MATCH``: the bindings that apply to
    ``resource_name`` (literal equal, literal ``*``, or a prefix of it), as Kafka's.
    """

    principal: str | None = None
    host: str | None = None
    resource_type: ResourceType | None = None
    resource_name: str | None = None
    pattern_type: str | None = None  # LITERAL, PREFIXED, MATCH, or None for any
    operation: Operation | None = None
    permission: Permission | None = None

    @classmethod
    def of(
        cls,
        principal: object = None,
        host: object = None,
        resource_type: object = None,
        resource_name: object = None,
        pattern_type: object = None,
        operation: object = None,
        permission: object = None,
    ) -> AclFilter:
        """A filter from untrusted values; ``ANY`` (any case) and None mean any."""

        def given(v: object) -> bool:
            return v is not None and not (isinstance(v, str) and v.upper() == "ANY")

        pattern: str | None = None
        if given(pattern_type):
            pattern = str(pattern_type).upper()
            if pattern not in ("LITERAL", "PREFIXED", "MATCH"):
                raise InvalidSecurityRequestError(
                    f"invalid pattern type {pattern_type!r}: LITERAL, PREFIXED, MATCH or ANY"
                )
        return cls(
            principal=parse_principal(principal) if given(principal) else None,
            host=str(host) if given(host) else None,
            resource_type=(
                ResourceType(_enum(ResourceType, resource_type, "resource type"))
                if given(resource_type)
                else None
            ),
            resource_name=str(resource_name) if resource_name is not None else None,
            pattern_type=pattern,
            operation=Operation(_enum(Operation, operation, "operation"))
            if given(operation)
            else None,
            permission=Permission(_enum(Permission, permission, "permission"))
            if given(permission)
            else None,
        )

    def matches(self, b: AclBinding) -> bool:
        if self.principal is not None and b.principal != self.principal:
            return False
        if self.host is not None and b.host != self.host:
            return False
        if self.resource_type is not None and b.resource_type is not self.resource_type:
            return False
        if self.operation is not None and b.operation is not self.operation:
            return False
        if self.permission is not None and b.permission is not self.permission:
            return False
        if self.pattern_type == "MATCH":
            return self.resource_name is None or b.matches_resource(
                b.resource_type, self.resource_name
            )
        if self.pattern_type is not None and b.pattern_type.value != self.pattern_type:
            return False
        return self.resource_name is None or b.resource_name == self.resource_name


def select(bindings: Iterable[AclBinding], filters: Sequence[AclFilter]) -> list[AclBinding]:
    """The bindings any of ``filters`` matches, sorted, each once."""
    return sorted({b for b in bindings if any(f.matches(b) for f in filters)})


class Authorizer:
    """Decides with one snapshot of the ACLs (the agent refreshes the snapshot)."""

    def __init__(self, bindings: Iterable[AclBinding], super_users: frozenset[str]) -> None:
        self.super_users = super_users
        # By (resource type, principal): a decision reads only the bindings of its
        # principal and of User:*, however many ACLs other principals have.
        self._by_key: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        for b in bindings:
            self._by_key.setdefault((b.resource_type, b.principal), []).append(b)

    def is_super_user(self, principal: str) -> bool:
        return principal in self.super_users

    def authorize(
        self,
        principal: str,
        host: str,
        operation: Operation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        """Whether ``principal`` connecting from ``host`` may do ``operation`` on the
        resource: super user, else no matching DENY and at least one matching ALLOW."""
        if principal in self.super_users:
            return True
        allowed = False
        mine = self._by_key.get((resource_type, principal), [])
        anyone = self._by_key.get((resource_type, WILDCARD_PRINCIPAL), [])
        for b in (*mine, *anyone):
            if b.host not in (host, WILDCARD):
                continue
            if not b.matches_resource(resource_type, name) or not b.grants(operation):
                continue
            if b.permission is Permission.DENY:
                return False
            allowed = True
        return allowed

    def authorize_any(
        self, principal: str, host: str, operation: Operation, resource_type: ResourceType
    ) -> bool:
        """Whether ``principal`` may do ``operation`` on at least one resource of the type
        (Kafka's ``authorizeByResourceType``, KIP-679): an ALLOW that no DENY covers (a
        DENY of ``*``, of the same literal name, or of a prefix of the ALLOW's name)."""
        if principal in self.super_users:
            return True
        mine = self._by_key.get((resource_type, principal), [])
        anyone = self._by_key.get((resource_type, WILDCARD_PRINCIPAL), [])
        applying = [
            b for b in (*mine, *anyone) if b.host in (host, WILDCARD) and b.grants(operation)
        ]
        denies = [b for b in applying if b.permission is Permission.DENY]

        def covered(allow: AclBinding) -> bool:
            for d in denies:
                if d.pattern_type is PatternType.LITERAL and d.resource_name == WILDCARD:
                    return True
                if d.pattern_type is PatternType.PREFIXED:
                    if allow.resource_name.startswith(d.resource_name):
                        return True
                elif allow.pattern_type is PatternType.LITERAL and allow.resource_name == (
                    d.resource_name
                ):
                    return True
            return False

        return any(b.permission is Permission.ALLOW and not covered(b) for b in applying)


# -- certificate principals (mTLS) ---------------------------------------------------------

#: RFC 2253's short names of the attributes a subject's distinguished name shows.
_DN_KEYS = {
    "commonName": "CN",
    "organizationalUnitName": "OU",
    "organizationName": "O",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "countryName": "C",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
#: One rule of Kafka's ``ssl.principal.mapping.rules``: DEFAULT, or RULE:pattern/replacement/
#: with an optional L or U, slashes in the pattern or replacement escaped with a backslash.
_RULE = re.compile(r"\s*(DEFAULT|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?))\s*(?:,|$)")


def distinguished_name(subject: Sequence[Sequence[tuple[str, str]]]) -> str:
    """A certificate subject (Python's ``getpeercert()["subject"]``, in certificate order)
    as RFC 2253 shows it, most specific first: ``CN=alice,OU=eng,O=acme,C=FR`` (Java's
    ``X500Principal.getName()``, which Kafka's rules match)."""

    def escape(value: str) -> str:
        out = re.sub(r'([,+"\\<>;=])', r"\\\1", value)
        if out.startswith(("#", " ")):
            out = "\\" + out
        return out[:-1] + "\\ " if out.endswith(" ") else out

    rdns = ["+".join(f"{_DN_KEYS.get(k, k)}={escape(v)}" for k, v in rdn) for rdn in subject]
    return ",".join(reversed(rdns))


@dataclass(frozen=True, slots=True)
class _MappingRule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""


class PrincipalMapper:
    """Kafka's ``ssl.principal.mapping.rules`` over a client certificate's distinguished
    name: the first rule whose pattern matches the whole DN gives the name (its
    replacement, ``$1`` naming groups, lowered with ``/L`` or uppered with ``/U``);
    ``DEFAULT`` gives the DN itself; no rule matching, no principal. A name that is not a
    user name (letters, digits, ``._@-``) is no principal either.

    Raises:
        InvalidSecurityRequestError: rules that do not parse (at start).
    """

    def __init__(self, rules: str) -> None:
        self.rules: list[_MappingRule] = []
        text, pos = rules.strip(), 0
        while pos < len(text):
            m = _RULE.match(text, pos)
            if m is None or m.end() == pos:
                raise InvalidSecurityRequestError(
                    f"invalid principal mapping rules at {text[pos:]!r}: a comma-separated "
                    "list of DEFAULT and RULE:pattern/replacement/[L|U]"
                )
            if m.group(1) == "DEFAULT":
                self.rules.append(_MappingRule(None))
            else:
                pattern = m.group(2).replace("\\/", "/")
                try:
                    compiled = re.compile(pattern)
                except re.error as e:
                    raise InvalidSecurityRequestError(
                        f"invalid principal mapping rule pattern {pattern!r}: {e}"
                    ) from None
                replacement = re.sub(r"\$(\d+)", r"\\g<\1>", m.group(3).replace("\\/", "/"))
                self.rules.append(_MappingRule(compiled, replacement, m.group(4)))
            pos = m.end()
        if not self.rules:
            raise InvalidSecurityRequestError("principal mapping rules: none given")

    def name(self, dn: str) -> str | None:
        """The user name the rules give ``dn``, or None."""
        for rule in self.rules:
            if rule.pattern is None:
                return dn
            m = rule.pattern.fullmatch(dn)
            if m is None:
                continue
            out = m.expand(rule.replacement)
            return out.lower() if rule.case == "L" else out.upper() if rule.case == "U" else out
        return None
