"""LeRobot's ``transport.AsyncInference`` gRPC service on grpc's generic API: the server's handlers
(:func:`add_to_server`) and a client stub (:class:`AsyncInferenceStub`), over the message classes of the compiled
proto (:mod:`.proto.services_pb2`).

This stands in for grpcio-tools' generated ``services_pb2_grpc.py``: what that code held is the table below (each
method's wire name, whether its requests stream, its request and response classes). The wire names are LeRobot's
(``/transport.AsyncInference/<method>``), so LeRobot's own generated stub talks to this server unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from .proto import services_pb2 as pb

__all__ = ["METHODS", "SERVICE", "AsyncInferenceStub", "add_to_server"]

SERVICE = "transport.AsyncInference"
# method -> (its requests stream, request class, response class); LeRobot's order
METHODS: dict[str, tuple[bool, type, type]] = {
    "SendObservations": (True, pb.Observation, pb.Empty),
    "GetActions": (False, pb.Empty, pb.Actions),
    "SendPolicyInstructions": (False, pb.PolicySetup, pb.Empty),
    "Ready": (False, pb.Empty, pb.Empty),
}


def add_to_server(servicer: Any, server: grpc.Server) -> None:
    """Serve ``servicer``'s methods (named as in :data:`METHODS`) on ``server``."""
    handlers = {}
    for name, (streaming, request, response) in METHODS.items():
        handler = grpc.stream_unary_rpc_method_handler if streaming else grpc.unary_unary_rpc_method_handler
        handlers[name] = handler(getattr(servicer, name), request_deserializer=request.FromString,
                                 response_serializer=response.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


class AsyncInferenceStub:
    """A client of the service (as LeRobot's generated stub is): one callable per method."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.SendObservations = self._method(channel, "SendObservations")  # noqa: N815 (the wire names)
        self.GetActions = self._method(channel, "GetActions")  # noqa: N815
        self.SendPolicyInstructions = self._method(channel, "SendPolicyInstructions")  # noqa: N815
        self.Ready = self._method(channel, "Ready")  # noqa: N815

    @staticmethod
    def _method(channel: grpc.Channel, name: str) -> Callable[..., Any]:
        streaming, request, response = METHODS[name]
        call = channel.stream_unary if streaming else channel.unary_unary
        return call(f"/{SERVICE}/{name}", request_serializer=request.SerializeToString,
                    response_deserializer=response.FromString)
