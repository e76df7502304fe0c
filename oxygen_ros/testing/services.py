"""Service calls from a helper node that another thread spins, robust to a lost response.

``wait_for_service`` only says that the server's request reader has been discovered. On a loaded host the server may
not yet have discovered the client's response reader, and then it answers the first request into the void (DDS
discovery is asymmetric). A client that waits for that one answer hangs for its whole timeout though the server is
fine. So a query is sent again every ``resend_s`` until one answer arrives; a lifecycle transition, which is not
idempotent, is sent again only after ``GetState`` shows it has not happened.
"""

from __future__ import annotations

import time
from typing import Any

from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState, GetState

from .probe import wait_for

__all__ = ["TRANSITION_GOALS", "TRANSITION_STATES", "call", "change_state"]

# the primary state each transition of the ROS 2 lifecycle ends in when it succeeds
TRANSITION_GOALS = {Transition.TRANSITION_CONFIGURE: "inactive", Transition.TRANSITION_CLEANUP: "unconfigured",
                    Transition.TRANSITION_ACTIVATE: "active", Transition.TRANSITION_DEACTIVATE: "inactive",
                    Transition.TRANSITION_UNCONFIGURED_SHUTDOWN: "finalized",
                    Transition.TRANSITION_INACTIVE_SHUTDOWN: "finalized",
                    Transition.TRANSITION_ACTIVE_SHUTDOWN: "finalized"}
# the intermediate states a node is in while a transition's callback runs (a slow ``on_configure`` on a loaded host)
TRANSITION_STATES = frozenset({"configuring", "cleaningup", "activating", "deactivating", "shuttingdown",
                               "errorprocessing"})


def _answer(client: Any, request: Any, seconds: float) -> Any | None:
    """One request; its response, or None if none came within ``seconds``."""
    future = client.call_async(request)
    if wait_for(future.done, seconds, 0.01):
        return future.result()
    client.remove_pending_request(future)
    return None


def call(client: Any, request: Any, timeout: float = 30.0, resend_s: float = 5.0) -> Any:
    """Call an idempotent service (a query, a setter of absolute values) and return its response; the request is
    sent again every ``resend_s`` seconds until one answer comes. Raises ``TimeoutError`` after ``timeout``."""
    end = time.monotonic() + timeout
    if not client.wait_for_service(timeout_sec=timeout):
        raise TimeoutError(f"{client.srv_name} is not offered")
    while (left := end - time.monotonic()) > 0:
        response = _answer(client, request, min(resend_s, left))
        if response is not None:
            return response
    raise TimeoutError(f"no answer from {client.srv_name} in {timeout:.0f} s")


def change_state(change: Any, get: Any, transition_id: int, timeout: float = 60.0, resend_s: float = 5.0) -> bool:
    """Ask a lifecycle node (its ``change_state`` and ``get_state`` clients) for a transition: True if it succeeded.

    Without an answer in ``resend_s`` the node's state decides: the transition's goal means it happened (only its
    response was lost); an intermediate state (the callback still runs) means wait and ask again; otherwise the
    request is sent again. Raises ``TimeoutError`` after ``timeout``."""
    end = time.monotonic() + timeout
    if not change.wait_for_service(timeout_sec=timeout):
        raise TimeoutError(f"{change.srv_name} is not offered")
    request = ChangeState.Request(transition=Transition(id=transition_id))
    future = None
    while (left := end - time.monotonic()) > 0:
        if future is None:  # (re)send; while the node is in the middle of the transition, keep the pending request
            future = change.call_async(request)
        if wait_for(future.done, min(resend_s, left), 0.01):
            return bool(future.result().success)
        state = call(get, GetState.Request(), max(end - time.monotonic(), 0.1), resend_s).current_state.label
        if state == TRANSITION_GOALS.get(transition_id):
            change.remove_pending_request(future)
            return True
        if state not in TRANSITION_STATES:
            change.remove_pending_request(future)
            future = None
    if future is not None:
        change.remove_pending_request(future)
    raise TimeoutError(f"no answer from {change.srv_name} in {timeout:.0f} s")
