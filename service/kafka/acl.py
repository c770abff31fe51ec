"""Authorization of the Kafka listener's APIs by Kafka ACLs (``authorization = acl``).

One table, :data:`RULES`, says for every API key the listener serves which operation
its handler checks on each resource type the request names: topics, groups,
transactional ids, the cluster. The dispatcher (``service.kafka.server``) hands every
handler an :class:`Access`: the connection's principal (SASL or mTLS) and address, the
agent's ACL snapshot (``service.security.acl.AclCache``: the same bounded staleness and super
users as the REST door) and the API's rule. A handler asks it about each resource its
request names and answers Kafka's code for those denied, serving the others, as
Kafka's broker does (``KafkaApis``):

- TOPIC_AUTHORIZATION_FAILED (29) per topic or partition, also for topics that do not
  exist: a principal that may not DESCRIBE a topic does not learn whether it exists;
- GROUP_AUTHORIZATION_FAILED (30) for a group, CLUSTER_AUTHORIZATION_FAILED (31) for the
  cluster, TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53) for a transactional id;
- listings (Metadata of all topics, OffsetFetch of all topics, ListGroups without
  DESCRIBE on the cluster) leave out what the principal may not DESCRIBE.

Some rules name two types where Kafka accepts either: CreateTopics and auto-creation in
Metadata need CREATE on the cluster or on the topic (:meth:`Access.may_create`);
InitProducerId needs IDEMPOTENT_WRITE on the cluster or, since KIP-679, WRITE on any
topic; ListGroups lists every group with DESCRIBE on the cluster, else those it may
DESCRIBE. DescribeCluster checks nothing (Kafka answers any authenticated client).
Produce checks no IDEMPOTENT_WRITE for idempotent batches (KIP-679 dropped it).

With authorization off every question is answered yes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from coordinator.security.model import ANONYMOUS, Authorizer, Operation, ResourceType
from service.security.acl import CLUSTER_NAME

Op = Operation
TOPIC_DENIED = ErrorCode.topic_authorization_failed
GROUP_DENIED = ErrorCode.group_authorization_failed
CLUSTER_DENIED = ErrorCode.cluster_authorization_failed
TRANSACTIONAL_ID_DENIED = ErrorCode.transactional_id_authorization_failed


@dataclass(frozen=True, slots=True)
class Rule:
    """The operation an API's handler checks on each resource type (None: not checked)."""

    topic: Operation | None = None
    group: Operation | None = None
    cluster: Operation | None = None
    transactional_id: Operation | None = None


#: Nothing beyond an authenticated connection.
AUTHENTICATED = Rule()

#: api key -> what its handler checks. A served API without a rule is a bug: a unit test
#: builds the list of served keys from the dispatcher's tables.
RULES: dict[int, Rule] = {
    0: Rule(topic=Op.WRITE, transactional_id=Op.WRITE),  # Produce (+ its transactional id)
    1: Rule(topic=Op.READ),  # Fetch
    2: Rule(topic=Op.DESCRIBE),  # ListOffsets
    3: Rule(topic=Op.DESCRIBE),  # Metadata (+ CREATE to auto-create: may_create)
    8: Rule(group=Op.READ, topic=Op.READ),  # OffsetCommit
    9: Rule(group=Op.DESCRIBE, topic=Op.DESCRIBE),  # OffsetFetch
    10: Rule(group=Op.DESCRIBE, transactional_id=Op.DESCRIBE),  # FindCoordinator
    11: Rule(group=Op.READ),  # JoinGroup
    12: Rule(group=Op.READ),  # Heartbeat
    13: Rule(group=Op.READ),  # LeaveGroup
    14: Rule(group=Op.READ),  # SyncGroup
    15: Rule(group=Op.DESCRIBE),  # DescribeGroups
    16: Rule(cluster=Op.DESCRIBE, group=Op.DESCRIBE),  # ListGroups: all, or those described
    17: AUTHENTICATED,  # SaslHandshake (before authentication)
    18: AUTHENTICATED,  # ApiVersions (before authentication too)
    19: Rule(cluster=Op.CREATE, topic=Op.CREATE),  # CreateTopics: either
    20: Rule(topic=Op.DELETE),  # DeleteTopics
    21: Rule(topic=Op.DELETE),  # DeleteRecords
    # InitProducerId: IDEMPOTENT_WRITE on the cluster or WRITE on any topic (KIP-679);
    # a transactional id needs WRITE on it.
    22: Rule(cluster=Op.IDEMPOTENT_WRITE, topic=Op.WRITE, transactional_id=Op.WRITE),
    23: Rule(topic=Op.DESCRIBE),  # OffsetForLeaderEpoch
    # AddPartitionsToTxn: WRITE on the transactional id and the topics; v4+ (brokers):
    # CLUSTER_ACTION on the cluster instead.
    24: Rule(transactional_id=Op.WRITE, topic=Op.WRITE, cluster=Op.CLUSTER_ACTION),
    25: Rule(transactional_id=Op.WRITE, group=Op.READ),  # AddOffsetsToTxn
    26: Rule(transactional_id=Op.WRITE),  # EndTxn
    28: Rule(transactional_id=Op.WRITE, group=Op.READ, topic=Op.READ),  # TxnOffsetCommit
    29: Rule(cluster=Op.DESCRIBE),  # DescribeAcls
    30: Rule(cluster=Op.ALTER),  # CreateAcls
    31: Rule(cluster=Op.ALTER),  # DeleteAcls
    32: Rule(topic=Op.DESCRIBE_CONFIGS, cluster=Op.DESCRIBE_CONFIGS),  # DescribeConfigs
    33: Rule(topic=Op.ALTER_CONFIGS, cluster=Op.ALTER_CONFIGS),  # AlterConfigs
    36: AUTHENTICATED,  # SaslAuthenticate
    37: Rule(topic=Op.ALTER),  # CreatePartitions
    42: Rule(group=Op.DELETE),  # DeleteGroups
    44: Rule(topic=Op.ALTER_CONFIGS, cluster=Op.ALTER_CONFIGS),  # IncrementalAlterConfigs
    60: AUTHENTICATED,  # DescribeCluster
    65: Rule(transactional_id=Op.DESCRIBE, topic=Op.DESCRIBE),  # DescribeTransactions
    66: Rule(transactional_id=Op.DESCRIBE),  # ListTransactions: those it may DESCRIBE
    # ConsumerGroupHeartbeat (KIP-848): READ on the group, DESCRIBE on each subscribed topic.
    68: Rule(group=Op.READ, topic=Op.DESCRIBE),
    # ConsumerGroupDescribe: DESCRIBE on the group.
    69: Rule(group=Op.DESCRIBE),
    75: Rule(topic=Op.DESCRIBE),  # DescribeTopicPartitions (KIP-966)
}


#: What a handler does with its rule beyond "each resource named" (README's table).
NOTES: dict[int, str] = {
    0: "transactional batches: WRITE on the request's transactional id",
    1: "per topic, at every Fetch",
    3: "all topics: lists those it may DESCRIBE; auto-creation: CREATE on the cluster or the topic",
    9: "all of a group's topics: lists those it may DESCRIBE",
    10: "GROUP or TRANSACTIONAL_ID, by the key type",
    16: "DESCRIBE on the cluster lists every group; else those it may DESCRIBE",
    19: "CREATE on the cluster or on the topic",
    22: "IDEMPOTENT_WRITE on the cluster or WRITE on any topic (KIP-679); a transactional id: "
    "WRITE on it",
    24: "v4+ (broker to broker): CLUSTER_ACTION on the cluster instead",
    28: "a topic it may not READ is not committed, the others are",
    32: "on the topic, or the cluster for a broker",
    33: "on the topic, or the cluster for a broker",
    44: "on the topic, or the cluster for a broker",
    60: "any authenticated client, as Kafka",
    65: "lists the partitions of topics it may DESCRIBE",
    66: "lists the transactional ids it may DESCRIBE",
}


def rules_table() -> str:
    """Every Kafka API the listener serves and what it checks (Markdown, README's)."""
    from kio.schema.index import api_key_map

    lines = [
        "| API | key | topic | group | cluster | transactional id | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in sorted(RULES):
        rule = RULES[key]
        name = "".join(w.title() for w in api_key_map[key].split("_"))
        ops = (rule.topic, rule.group, rule.cluster, rule.transactional_id)
        cells = " | ".join(op.value if op is not None else "" for op in ops)
        lines.append(f"| {name} | {key} | {cells} | {NOTES.get(key, '')} |")
    return "\n".join(lines) + "\n"


@dataclass(eq=False, slots=True)
class Access:
    """What one request's principal may do, by its API's rule (see the module doc).

    Args:
        rule: the API's entry in :data:`RULES`.
        authorizer: the agent's ACL snapshot; None when authorization is off.
        principal: ``User:<name>`` of the connection (ANONYMOUS without authentication).
        host: the client's address.
    """

    rule: Rule
    authorizer: Authorizer | None = None
    principal: str = ANONYMOUS
    host: str = ""
    #: The connection's own credential (``service.kafka.sasl``), which ACL changes
    #: forward to a coordinator process; None for a certificate or OAuth principal.
    credential: str | None = field(default=None, init=False)

    def _allowed(self, op: Operation | None, rtype: ResourceType, name: str) -> bool:
        if op is None:  # a handler asking what its rule does not say: a bug, so no
            raise LookupError(f"the API's rule checks no {rtype.value}")
        if self.authorizer is None:
            return True
        return self.authorizer.authorize(self.principal, self.host, op, rtype, name)

    def topic(self, name: str) -> bool:
        return self._allowed(self.rule.topic, ResourceType.TOPIC, name)

    def group(self, name: str) -> bool:
        return self._allowed(self.rule.group, ResourceType.GROUP, name)

    def cluster(self) -> bool:
        return self._allowed(self.rule.cluster, ResourceType.CLUSTER, CLUSTER_NAME)

    def transactional_id(self, name: str) -> bool:
        return self._allowed(self.rule.transactional_id, ResourceType.TRANSACTIONAL_ID, name)

    def any_topic(self) -> bool:
        """The rule's topic operation on at least one topic (KIP-679's InitProducerId)."""
        op = self.rule.topic
        if op is None:
            raise LookupError("the API's rule checks no TOPIC")
        if self.authorizer is None:
            return True
        return self.authorizer.authorize_any(self.principal, self.host, op, ResourceType.TOPIC)

    def may_create(self, name: str) -> bool:
        """CREATE on the cluster or on the topic ``name`` (CreateTopics, auto-creation)."""
        if self.authorizer is None:
            return True
        return any(
            self.authorizer.authorize(self.principal, self.host, Op.CREATE, rtype, n)
            for rtype, n in ((ResourceType.CLUSTER, CLUSTER_NAME), (ResourceType.TOPIC, name))
        )
