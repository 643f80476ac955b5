"""The election on Kafka: every candidate is a member of one consumer group that
subscribes to the one-partition topic ``<prefix>.lock``; the member assigned its
partition 0 is elected (docs/kafka.md, "Election").

The group's assignment is made by :func:`lock_assignor`'s class, so that the member
holding the lock keeps it across the rebalances other candidates cause by joining or
leaving (a range or round-robin assignor would hand it to whichever member sorts
first, a failover at every join): each member says in its metadata whether it holds
the lock, and the assignor leaves partition 0 with the one that does."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

__all__ = ["HELD", "LockListener", "lock_assignor"]

#: The user data of a member that holds the lock.
HELD = b"held"


def lock_assignor(topic: str, holds: Callable[[], bool]) -> type[AbstractPartitionAssignor]:
    """An assignor class of one candidate (aiokafka takes classes, and asks them for
    the member's metadata): ``holds()`` says whether this candidate holds the lock."""

    class LockAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
        name = "delayq-lock"
        version = 0

        @classmethod
        def assign(
            cls,
            cluster: ClusterMetadata,
            members: Mapping[str, ConsumerProtocolMemberMetadata],
        ) -> dict[str, ConsumerProtocolMemberAssignment]:
            holders = sorted(member for member, meta in members.items() if meta.user_data == HELD)
            chosen = (holders or sorted(members))[0]
            return {
                member: ConsumerProtocolMemberAssignment(
                    cls.version,
                    [ConsumerProtocolMemberAssignment.Assignment(topic, [0])]
                    if member == chosen
                    else [],
                    b"",
                )
                for member in members
            }

        @classmethod
        def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
            return ConsumerProtocolMemberMetadata(
                cls.version, list(topics), HELD if holds() else b""
            )

        @classmethod
        def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
            pass

    return LockAssignor


class LockListener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Calls ``on_token`` when this member is assigned the lock's partition, and
    ``on_deposed`` when a later assignment leaves it out (another member holds it now).
    A revocation alone says nothing: the group revokes every partition at each
    rebalance, and the assignor gives the lock back to its holder."""

    def __init__(
        self, topic: str, on_token: Callable[[], None], on_deposed: Callable[[], None]
    ) -> None:
        self._partition = TopicPartition(topic, 0)
        self._on_token = on_token
        self._on_deposed = on_deposed
        self.held = False

    async def on_partitions_revoked(self, revoked: object) -> None:
        pass

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        if self._partition in set(assigned):
            if not self.held:
                self.held = True
                self._on_token()
        elif self.held:
            self.held = False
            self._on_deposed()
