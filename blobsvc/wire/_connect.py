"""Connecting to a server: a TCP connection to the first address that answers, then the TLS
handshake when asked; above both :mod:`._netio` (the socket) and :mod:`._tls` (TLS over it)."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import ssl

from .._exceptions import ConnectError, ConnectTimeout
from ._netio import SocketStream
from ._tls import TlsStream

__all__ = ["connect"]


async def connect(host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None) -> SocketStream:
    """Connect to ``host:port``, trying each address it resolves to; with ``tls``, the
    handshake (checking the certificate against ``host``) is part of connecting."""
    loop = asyncio.get_running_loop()
    errors: list[str] = []
    refused = 0
    try:
        async with asyncio.timeout(timeout):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            for family, type_, proto, _, address in infos:
                sock = socket.socket(family, type_, proto)
                sock.setblocking(False)
                try:
                    await loop.sock_connect(sock, address)
                except OSError as exc:
                    sock.close()
                    # uvloop's strerror repeats the address; the errno says it plainly.
                    errors.append(f"{address[0]}: {os.strerror(exc.errno) if exc.errno else exc}")
                    refused += exc.errno == errno.ECONNREFUSED
                    continue
                except BaseException:
                    sock.close()
                    raise
                if tls is None:
                    return SocketStream(sock)
                stream = TlsStream(sock, tls, server_side=False, server_hostname=host)
                try:
                    await stream.handshake(None)
                except BaseException:
                    stream.close()
                    raise
                return stream
    except TimeoutError:
        raise ConnectTimeout(f"connecting to {host}:{port} timed out after {timeout:g}s") from None
    except OSError as exc:
        error = ConnectError(f"cannot resolve {host}: {exc.strerror or exc}")
        # A name that does not exist; a resolver that cannot be asked now (EAI_AGAIN) may answer later.
        error.nobody_there = isinstance(exc, socket.gaierror) and exc.errno != socket.EAI_AGAIN
        raise error from None
    nobody_there = bool(errors) and refused == len(errors)
    if len(errors) == 1:  # the address is in the message already
        errors = [errors[0].partition(": ")[2]]
    error = ConnectError(f"cannot connect to {host}:{port}: {'; '.join(errors) or 'no address'}")
    error.nobody_there = nobody_there
    raise error
