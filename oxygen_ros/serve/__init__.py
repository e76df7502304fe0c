"""``oxygen-serve``: the policy layer's frame runner behind openpi's websocket policy protocol, or LeRobot's
async-inference gRPC service (``--protocol lerobot``: :mod:`.lerobot_async`, payloads read by its allow-list
unpickler), both on one serving core (:class:`SessionPool`, :class:`~.batching.Batcher`).

Any ``openpi_client.WebsocketClientPolicy`` (openpi's LIBERO, DROID and ALOHA examples, evaluation harnesses) runs
against it unchanged; several clients are batched into one prefill and denoise, and a response may carry language
outputs and answers beside the actions. Imports only the policy layer and the engine (no ROS).
"""

from .keys import KEY_MAPS, KeyMap, ObservationError
from .protocol import ProtocolError, pack, unpack
from .server import PolicyServer, ServerThread
from .sessions import SessionPool

__all__ = ["KEY_MAPS", "KeyMap", "ObservationError", "PolicyServer", "ProtocolError", "ServerThread", "SessionPool",
           "pack", "unpack"]
