"""A small bag of what a deployed node's run records, for the export's tests, fixture and docs
(``oxygen-export-lerobot --make-demo-bag DIR``): the synthetic demo scene's cameras, ``/joint_states`` and
``/instruction`` (:mod:`oxygen_ros.evaluation.demo_bag`'s scene and messages), plus the node's outputs as they are
recorded: ``/oxygen/action_chunk`` (one chunk per tick, stamped with its observation) and
``/oxygen/language_output`` (memory, subtask, narration and one ``~/ask`` answer, each stamped with the observation
it was decoded from, arriving a few ticks later as the node's decode does), and that ``~/ask`` call's goal and result
as rosbag2 records an action (``/oxygen/ask/_action/{send_goal,get_result}/_service_event``, the server's side).
Deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from rosbags.rosbag2 import Writer

from oxygen_ros.evaluation.demo_bag import DEFAULT_CAMERAS, DEFAULT_JOINT_NAMES, START_TIME_NS, _header, _image
from oxygen_ros.evaluation.typestore import ACTION_TYPE, LANGUAGE_TYPE, STORAGES, oxygen_typestore
from oxygen_ros.testing.synthetic_scene import joint_state, render_scene

from .ask import ask_topics, event_msgdef, register_ask_types

__all__ = ["ASK_ANSWER", "ASK_QUESTION", "INSTRUCTIONS", "make_export_demo_bag"]

INSTRUCTIONS = ("put the red block on the blue plate", "now stack the green block on the red block")
ASK_QUESTION = "where is the red block?"
ASK_ANSWER = "the red block is on the blue plate"
HORIZON, DT_NS = 8, 50_000_000


def make_export_demo_bag(out: Path | str, duration_s: float = 2.0, rate_hz: float = 10.0, size: int = 64,
                         cameras: Sequence[str] = DEFAULT_CAMERAS, *, change_instruction: bool = True,
                         storage: str = "sqlite3", seed: int = 0) -> Path:
    """Write the bag to ``out`` (must not exist); the instruction changes at half time when ``change_instruction``."""
    out = Path(out)
    ts, _ = oxygen_typestore()
    register_ask_types(ts)
    T = ts.types
    names = list(DEFAULT_JOINT_NAMES)
    n = max(2, round(duration_s * rate_hz))
    with Writer(out, version=9, storage_plugin=STORAGES[storage]) as w:
        c_instr = w.add_connection("/instruction", "std_msgs/msg/String", typestore=ts)
        c_joint = w.add_connection("/joint_states", "sensor_msgs/msg/JointState", typestore=ts)
        c_cams = {c: w.add_connection(f"/cameras/{c}/image_raw", "sensor_msgs/msg/Image", typestore=ts)
                  for c in cameras}
        c_chunk = w.add_connection("/oxygen/action_chunk", ACTION_TYPE, typestore=ts)
        c_lang = w.add_connection("/oxygen/language_output", LANGUAGE_TYPE, typestore=ts)
        goal_topic, result_topic = ask_topics("/oxygen/ask")
        c_goal, c_result = (w.add_connection(topic, f"oxygen_ros/action/Ask_{call}_Event",
                                             msgdef=event_msgdef(f"oxygen_ros/action/Ask_{call}_Event"),
                                             rihs01=ts.hash_rihs01(f"oxygen_ros/action/Ask_{call}_Event"))
                            for topic, call in ((goal_topic, "SendGoal"), (result_topic, "GetResult")))
        pending: list[tuple[int, object]] = []

        def write(conn, stamp: int, msg) -> None:
            w.write(conn, stamp, ts.serialize_cdr(msg, msg.__msgtype__))

        def dur(ns: int):
            return T["builtin_interfaces/msg/Duration"](sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)

        texts = {"memory": "I picked up the red block", "subtask": "move above the blue plate",
                 "narration": "the arm moves toward the plate"}
        for k in range(n):
            stamp = START_TIME_NS + round(k * 1e9 / rate_hz)
            t = k / rate_hz
            for s, msg in [p for p in pending if p[0] <= stamp]:
                conn, msg = msg if isinstance(msg, tuple) else (c_lang, msg)
                write(conn, s, msg)
            pending = [p for p in pending if p[0] > stamp]
            instr = INSTRUCTIONS[1] if change_instruction and k >= n // 2 else INSTRUCTIONS[0]
            if k == 0 or (change_instruction and k == n // 2):
                write(c_instr, stamp, T["std_msgs/msg/String"](data=instr))
            q = joint_state(t, names)
            write(c_joint, stamp, T["sensor_msgs/msg/JointState"](
                header=_header(T, stamp, ""), name=names, position=q, velocity=np.zeros(0), effort=np.zeros(0)))
            for cam, conn in c_cams.items():
                write(conn, stamp, _image(T, render_scene(t, cam, size, seed), _header(T, stamp, cam), False, 90))
            acts = np.stack([joint_state(t + (i + 1) * DT_NS / 1e9, names) for i in range(HORIZON)]).astype(np.float32)
            write(c_chunk, stamp + 20_000_000, T[ACTION_TYPE](
                header=_header(T, stamp, ""), frame_index=k, joint_names=names, horizon=HORIZON,
                action_dim=len(names), actions=acts.reshape(-1), dt=dur(DT_NS), inference_latency=dur(20_000_000),
                first_step=0, subtask=""))
            for task, every in (("memory", 5), ("subtask", 10), ("narration", 7)):
                if k % every == 0:
                    text = f"{texts[task]} ({k})"
                    pending.append((stamp + 150_000_000, T[LANGUAGE_TYPE](
                        header=_header(T, stamp, ""), request_id=1000 + k, frame_index=k, task=task, stream=task,
                        text=text, num_tokens=len(text.split()), eos=True, latency=dur(150_000_000))))
            if k == n // 3:
                answered = stamp + 250_000_000
                pending.append((answered, T[LANGUAGE_TYPE](
                    header=_header(T, stamp, ""), request_id=7, frame_index=k, task="answer", stream="ask",
                    text=ASK_ANSWER, num_tokens=8, eos=True, latency=dur(250_000_000))))
                for topic_conn, msg in _ask_events(T, stamp - 30_000_000, answered, stamp):
                    pending.append((msg.info.stamp.sec * 1_000_000_000 + msg.info.stamp.nanosec,
                                    (topic_conn == "goal" and c_goal or c_result, msg)))
        end = START_TIME_NS + round(n * 1e9 / rate_hz)
        for s, msg in pending:
            conn, msg = msg if isinstance(msg, tuple) else (c_lang, msg)
            write(conn, min(s, end), msg)
    return out


def _ask_events(T, asked_ns: int, answered_ns: int, observation_ns: int) -> list:
    """The server side of one ~/ask call as rosbag2 records it: send_goal request received and response sent at
    ``asked_ns``; get_result request received then, its response sent at ``answered_ns``."""
    p = "oxygen_ros/action/Ask_"
    gid = T["unique_identifier_msgs/msg/UUID"](uuid=np.arange(16, dtype=np.uint8))
    client = np.full(16, 7, dtype=np.uint8)

    def time(ns: int):
        return T["builtin_interfaces/msg/Time"](sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)

    def info(kind: int, ns: int, seq: int):
        return T["service_msgs/msg/ServiceEventInfo"](event_type=kind, stamp=time(ns), client_gid=client,
                                                      sequence_number=seq)

    goal = T[f"{p}Goal"](question=ASK_QUESTION, task="", prompt="", max_new_tokens=0)
    result = T[f"{p}Result"](text=ASK_ANSWER, observation_stamp=time(observation_ns), latency_frames=3,
                             latency_s=0.25, eos=True, stream="ask", request_id=7, error="")
    send_req, send_resp = T[f"{p}SendGoal_Request"](goal_id=gid, goal=goal), T[f"{p}SendGoal_Response"](
        accepted=True, stamp=time(asked_ns))
    get_req = T[f"{p}GetResult_Request"](goal_id=gid)
    get_resp = T[f"{p}GetResult_Response"](status=4, result=result)
    ev_send, ev_get = T[f"{p}SendGoal_Event"], T[f"{p}GetResult_Event"]
    return [("goal", ev_send(info=info(1, asked_ns, 1), request=[send_req], response=[])),
            ("goal", ev_send(info=info(2, asked_ns, 1), request=[], response=[send_resp])),
            ("result", ev_get(info=info(1, asked_ns, 1), request=[get_req], response=[])),
            ("result", ev_get(info=info(2, answered_ns, 1), request=[], response=[get_resp]))]
