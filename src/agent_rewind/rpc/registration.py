"""Puts the servicers on a grpc.aio server, from the services' descriptors.

The generated `add_*Servicer_to_server` functions decode requests with `FromString`: bytes that
do not decode (a malformed message, a string field that is not UTF-8) then fail inside gRPC as
UNKNOWN, naming a Python exception and carrying no ErrorInfo. Here the decoding is ours: such a
request reaches the handler as `Undecodable`, and the handlers (rpc/handlers.py) answer it with
INVALID_ARGUMENT like any other malformed request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message as protobuf_message
from google.protobuf import symbol_database
from google.protobuf.descriptor import ServiceDescriptor


@dataclass(frozen=True)
class Undecodable:
    """A request whose bytes are not a valid message of its type."""

    type_name: str
    error: str


def _decoder(cls: type[protobuf_message.Message]) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except (protobuf_message.DecodeError, UnicodeDecodeError, ValueError) as err:
            return Undecodable(cls.DESCRIPTOR.full_name, str(err)[:200])

    return decode


def _encode(message: Any) -> bytes:
    """A response, or its bytes already made: an event sent to a thousand watchers, or a page of
    points asked for again and again, is encoded once (rpc/rewind_service.py)."""
    if isinstance(message, bytes):
        return message
    encoded: bytes = message.SerializeToString()
    return encoded


def add(server: grpc.aio.Server, service: ServiceDescriptor, servicer: object) -> None:
    """Registers every method of `service` on `server`, served by `servicer`'s method of that name."""
    db = symbol_database.Default()
    handlers = {}
    for method in service.methods:
        request = db.GetSymbol(method.input_type.full_name)
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=_decoder(request),
            response_serializer=_encode,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
