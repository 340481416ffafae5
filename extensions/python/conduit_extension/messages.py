"""The params and results of docs/protocol.md §6-§8, for type checkers: at run time they are
plain dicts, and nothing here checks one (the session checks what the protocol requires of a
request's params; a handler reads the rest).
"""

from typing import Any, Dict, List, Optional

from typing import TypedDict

__all__ = [
    "Event", "TriggerParams", "TriggerResult", "RecurrenceParams", "RecurrenceResult",
    "FilterParams", "FilterResult", "CommitParams", "CommitResult", "IngressPollParams",
    "IngressPollResult",
]

class Event(TypedDict):
    id: int
    source: str
    delivery_id: str
    kind: str
    payload: Any
    accepted_at_ms: int


class TriggerParams(TypedDict):
    kind: str
    inputs: List[Event]


class TriggerResult(TypedDict):
    groups: List[Dict[str, Any]]  # {key: str, event_ids: [int], start?: bool}


class RecurrenceParams(TypedDict):
    recurrence: str
    timer_id: int
    spec: str
    fired_at_ms: int


class RecurrenceResult(TypedDict):
    next_at_ms: Optional[int]


class FilterParams(TypedDict):
    filter: str
    wait_id: int
    subject: str
    event: Event


class FilterResult(TypedDict):
    satisfied: bool


class CommitParams(TypedDict, total=False):
    emission: str
    commit_id: str
    work_id: int
    payload: Any


class CommitResult(TypedDict):
    records: List[Dict[str, Any]]  # {kind: str, body: any}


class IngressPollParams(TypedDict, total=False):
    source: str
    cursor: str
    limit: int


class IngressPollResult(TypedDict, total=False):
    events: List[Dict[str, Any]]  # {delivery_id, kind, payload}
    cursor: str
