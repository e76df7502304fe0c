"""``~/ask`` goals and results from a bag: rosbag2's action recording (``ros2 bag record --all-actions``, ROS 2 Kilted
and newer, with the action server's introspection on) writes every call of the action's services as service events
on ``<action>/_action/send_goal/_service_event`` (the goal: the question) and
``<action>/_action/get_result/_service_event`` (the result: the answer, its observation stamp and request id).
:func:`ask_records` pairs them by goal id. The types are the bag's own definitions when it stores them, else
:data:`ASK_ACTION` (``action/Ask.action``) registered by :func:`register_ask_types`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rosbags.typesys import get_types_from_msg

__all__ = ["ASK_ACTION", "GET_RESULT", "SEND_GOAL", "AskRecord", "ask_definitions", "ask_records", "ask_topics",
           "event_msgdef", "register_ask_types"]

SEND_GOAL = "/_action/send_goal/_service_event"
GET_RESULT = "/_action/get_result/_service_event"
STATUS_SUCCEEDED = 4  # action_msgs/GoalStatus
# action/Ask.action without comments (test_export_lerobot checks it against the file)
ASK_ACTION = """\
string question
string task
string prompt
uint32 max_new_tokens
---
string text
builtin_interfaces/Time observation_stamp
uint32 latency_frames
float64 latency_s
bool eos
string stream
uint64 request_id
string error
---
string text
uint32 tokens
uint32 frames
"""


def _strip(text: str) -> str:
    lines = [ln.split("#", 1)[0].rstrip() for ln in text.splitlines()]
    return "\n".join(ln for ln in lines if ln) + "\n"


def ask_action_text() -> str:
    """The Ask action's definition: the source tree's ``action/Ask.action``, else :data:`ASK_ACTION`."""
    path = Path(__file__).resolve().parents[2] / "action" / "Ask.action"
    return _strip(path.read_text()) if path.is_file() else ASK_ACTION


def ask_definitions() -> dict[str, str]:
    """``oxygen_ros/action/Ask_<name>`` -> its message text, for the goal, result and the two service events."""
    goal, result, _ = (part.strip() + "\n" for part in ask_action_text().split("---"))
    p = "oxygen_ros/action/Ask_"
    defs = {
        "Goal": goal, "Result": result,
        "SendGoal_Request": f"unique_identifier_msgs/UUID goal_id\n{p}Goal goal\n",
        "SendGoal_Response": "bool accepted\nbuiltin_interfaces/Time stamp\n",
        "GetResult_Request": "unique_identifier_msgs/UUID goal_id\n",
        "GetResult_Response": f"int8 status\n{p}Result result\n",
    }
    for call in ("SendGoal", "GetResult"):
        defs[f"{call}_Event"] = (f"service_msgs/ServiceEventInfo info\n{p}{call}_Request[<=1] request\n"
                                 f"{p}{call}_Response[<=1] response\n")
    return {f"{p}{name}": text for name, text in defs.items()}


def register_ask_types(ts: Any) -> None:
    """Register ``oxygen_ros/action/Ask_{Goal,Result,SendGoal_*,GetResult_*}`` in a rosbags typestore."""
    types: dict = {}
    for name, text in ask_definitions().items():
        if name not in ts.types:
            types.update(get_types_from_msg(text, name))
    ts.register(types)


def event_msgdef(event: str) -> str:
    """A service event type's rosbag2 message definition (its text, then each nested type after a MSG: line), for
    writers that cannot generate one for an ``action/`` type name (rosbags)."""
    defs = ask_definitions()
    call = event.removesuffix("_Event")
    sep = "=" * 80 + "\n"
    nested = [f"{call}_Request", f"{call}_Response", "oxygen_ros/action/Ask_Goal", "oxygen_ros/action/Ask_Result"]
    parts = [defs[event]] + [f"{sep}MSG: {n}\n{defs[n]}" for n in nested if n in defs and
                              (n.split("_", 2)[-1] in ("Goal", "Result") or n.startswith(call))]
    for dep, text in (("unique_identifier_msgs/msg/UUID", "uint8[16] uuid\n"),
                      ("service_msgs/msg/ServiceEventInfo", "uint8 REQUEST_SENT = 0\nuint8 REQUEST_RECEIVED = 1\n"
                       "uint8 RESPONSE_SENT = 2\nuint8 RESPONSE_RECEIVED = 3\nuint8 event_type\n"
                       "builtin_interfaces/Time stamp\nchar[16] client_gid\nint64 sequence_number\n"),
                      ("builtin_interfaces/msg/Time", "int32 sec\nuint32 nanosec\n")):
        parts.append(f"{sep}MSG: {dep}\n{text}")
    return "".join(parts)


def ask_topics(action: str) -> tuple[str, str]:
    """The send_goal and get_result service-event topics of the action ``action`` (e.g. ``/oxygen/ask``)."""
    return action.rstrip("/") + SEND_GOAL, action.rstrip("/") + GET_RESULT


@dataclass(frozen=True)
class AskRecord:
    """One answered question."""

    question: str
    text: str
    observation_stamp_ns: int
    request_id: int


def _uuid(goal_id: Any) -> bytes:
    return bytes(bytearray(goal_id.uuid))


def ask_records(goal_events: Iterable[Any], result_events: Iterable[Any]) -> list[AskRecord]:
    """Succeeded goals with their questions, paired by goal id (each call is recorded up to four times: request
    and response, client and server side; the first of each counts)."""
    questions: dict[bytes, str] = {}
    for ev in goal_events:
        for req in ev.request:
            questions.setdefault(_uuid(req.goal_id), str(req.goal.question or req.goal.prompt or req.goal.task))
    def call(ev: Any) -> tuple[bytes, int]:  # a service call: its client and sequence number
        return bytes(bytearray(ev.info.client_gid)), int(ev.info.sequence_number)

    result_events = list(result_events)
    ids: dict[tuple[bytes, int], bytes] = {}
    out: dict[bytes, AskRecord] = {}
    for ev in result_events:
        for req in ev.request:
            ids[call(ev)] = _uuid(req.goal_id)
    for ev in result_events:
        gid = ids.get(call(ev))
        for resp in ev.response:
            if gid is None or gid in out or int(resp.status) != STATUS_SUCCEEDED or gid not in questions:
                continue
            r = resp.result
            stamp = int(r.observation_stamp.sec) * 1_000_000_000 + int(r.observation_stamp.nanosec)
            out[gid] = AskRecord(questions[gid], str(r.text), stamp, int(r.request_id))
    return sorted(out.values(), key=lambda a: (a.observation_stamp_ns, a.request_id))
