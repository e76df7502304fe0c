"""The API key every call must carry when the server is given one (a gRPC server interceptor)."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Sequence
from typing import Any

import grpc

__all__ = ["ApiKey"]


class ApiKey(grpc.ServerInterceptor):
    """Refuses calls without the API key in their metadata (``UNAUTHENTICATED``)."""

    def __init__(self, key: str) -> None:
        self.key = key.encode()
        self.refused = 0

    def authorised(self, metadata: Sequence[tuple[str, Any]]) -> bool:
        md = {k.lower(): v for k, v in metadata}
        auth = md.get("authorization", "")
        given = auth[len("Api-Key "):] if isinstance(auth, str) and auth.startswith("Api-Key ") \
            else md.get("x-api-key", "")
        return isinstance(given, str) and hmac.compare_digest(given.encode(), self.key)

    def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None or self.authorised(details.invocation_metadata or ()):
            return handler
        self.refused += 1

        def deny(_request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid API key is required "
                                                           "(metadata 'authorization: Api-Key <key>')")

        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(deny)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(deny)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(deny)
        return grpc.unary_unary_rpc_method_handler(deny)
