"""LeRobot's chunked transfer (``lerobot.transport.utils``): a payload sent as a stream of messages, each with a
transfer state, reassembled here within :class:`Limits`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from .proto import services_pb2

__all__ = ["Limits", "ReceiveError", "receive_chunks"]

_BEGIN, _MIDDLE, _END = (services_pb2.TRANSFER_BEGIN, services_pb2.TRANSFER_MIDDLE, services_pb2.TRANSFER_END)


@dataclass(frozen=True)
class Limits:
    """Bounds on what a client may send.

    max_payload_bytes: one pickled payload after reassembly.
    max_chunks: messages of one ``SendObservations`` stream.
    max_message_bytes: one gRPC message (LeRobot's channels allow 4 MB; its chunks are 2 MB).
    """

    max_payload_bytes: int = 64 << 20
    max_chunks: int = 64
    max_message_bytes: int = 4 << 20


class ReceiveError(ValueError):
    """A chunked stream refused (the status code it maps to, and why)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def receive_chunks(messages: Iterable[Any], limits: Limits) -> bytes:
    """One payload from LeRobot's chunked stream (``lerobot.transport.utils.receive_bytes_in_chunks``): BEGIN
    starts it, MIDDLE continues it, END completes it (a one-chunk payload is a lone END), strictly in that order.

    Raises:
        ReceiveError: a wrong transfer state, a stream that ends before END, too many chunks or bytes.
    """
    parts: list[bytes] = []
    size, count, begun = 0, 0, False
    for m in messages:
        count += 1
        if count > limits.max_chunks:
            raise ReceiveError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"more than {limits.max_chunks} chunks")
        state = m.transfer_state
        if state == _BEGIN:
            if begun:
                raise ReceiveError(grpc.StatusCode.INVALID_ARGUMENT, "TRANSFER_BEGIN twice in one stream")
            begun = True
        elif state == _MIDDLE:
            if not begun:
                raise ReceiveError(grpc.StatusCode.INVALID_ARGUMENT, "TRANSFER_MIDDLE before TRANSFER_BEGIN")
        elif state != _END:
            raise ReceiveError(grpc.StatusCode.INVALID_ARGUMENT, f"unknown transfer state {int(state)}")
        size += len(m.data)
        if size > limits.max_payload_bytes:
            raise ReceiveError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"payload larger than {limits.max_payload_bytes} bytes")
        parts.append(m.data)
        if state == _END:
            return b"".join(parts)
    raise ReceiveError(grpc.StatusCode.INVALID_ARGUMENT,
                       "truncated: the stream ended before TRANSFER_END" if count else "empty stream")

