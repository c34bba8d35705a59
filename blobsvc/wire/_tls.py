"""TLS for every connection blobsvc makes or accepts: contexts built from settings, and
:class:`TlsStream`, a :class:`~blobsvc.wire._netio.SocketStream` that encrypts.

``TlsStream`` runs :class:`ssl.SSLObject` over two memory BIOs and moves the ciphertext
with the same non-blocking socket calls as a plain stream, so server and client code do not
change and uvloop still works (its loop cannot wrap a raw socket it does not own).

**GET bodies under TLS.** ``os.sendfile`` would put plaintext on the wire and kernel TLS is
not used, so :meth:`TlsStream.sendfile` reads the file in ``FILE_CHUNK`` pieces in a worker
thread (the next read overlapping the encryption and sending of the current piece) and
encrypts in user space. ``benchmarks/bench_tls.py`` measures what that costs.

**Meeting a peer without TLS** ends at once, not in a timeout: a server that reads a plain
preamble (``B`` where a TLS record starts with 0x16) answers it with a plain BAD_REQUEST
naming the problem; a client whose handshake gets plain bytes back raises :class:`TLSError`
saying the server does not use TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from .._exceptions import ConnectionClosed, InvalidArgument, RemoteProtocolError, TLSError
from ..config import Settings
from ._netio import SocketStream

__all__ = [
    "TLS_VERSIONS",
    "TlsStream",
    "client_tls_context",
    "client_context_for",
    "server_tls_context",
    "server_context_for",
]

TLS_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
# A TLS record carries at most 16 KiB; reading a few at once saves loop round trips.
RECORD_READ = 1 << 20
# Plaintext handed to the TLS layer at once: large enough to amortise the send, small
# enough that the ciphertext buffer stays bounded.
WRITE_CHUNK = 256 << 10
FILE_CHUNK = 1 << 20
_HANDSHAKE_RECORD = 0x16
_ALERT_RECORD = 0x15

_T = TypeVar("_T")


def server_tls_context(
    cert: Path | str, key: Path | str | None = None, *, client_ca: Path | str | None = None, min_version: str = "1.3"
) -> ssl.SSLContext:
    """A server context: ``cert`` (a PEM chain, with the key unless ``key`` names it),
    client certificates required and checked against ``client_ca`` when it is given."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.minimum_version = TLS_VERSIONS[min_version]
    except KeyError:
        raise InvalidArgument(f"TLS version must be one of {', '.join(TLS_VERSIONS)}, not {min_version!r}") from None
    _load(context.load_cert_chain, "TLS certificate", cert, key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        _load(context.load_verify_locations, "client CA bundle", client_ca)
    # No session tickets: nothing resumes sessions, and a ticket the client has not read yet
    # would make its idle pooled connection look unusable.
    context.num_tickets = 0
    return context


def client_tls_context(
    ca: Path | str | None = None, *, cert: Path | str | None = None, key: Path | str | None = None
) -> ssl.SSLContext:
    """A client context that checks the server's certificate and host name against ``ca``
    (the system's CAs when None); ``cert`` (and ``key``) is presented for mutual TLS."""
    if ca is None:
        context = ssl.create_default_context()
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # checks certificates and host names
        _load(context.load_verify_locations, "CA bundle", ca)
    context.minimum_version = max(context.minimum_version, ssl.TLSVersion.TLSv1_2)
    if cert is not None:
        _load(context.load_cert_chain, "client certificate", cert, key)
    return context


def _load(load: Callable[..., None], what: str, path: Path | str, *more: Path | str | None) -> None:
    try:
        load(str(path), *(str(m) if m is not None else None for m in more))
    except ssl.SSLError as exc:
        raise InvalidArgument(f"cannot load {what} {path}: not a usable PEM file ({_reason(exc)})") from None
    except OSError as exc:
        raise InvalidArgument(f"cannot load {what} {path}: {exc.strerror or exc}") from None


def _reason(exc: ssl.SSLError) -> str:
    """An OpenSSL error without the ``[SSL: …]`` prefix and ``(_ssl.c:…)`` suffix."""
    text = re.sub(r"\s*\(_ssl\.c:\d+\)$", "", str(exc.reason or exc)).replace("_", " ").lower()
    detail = getattr(exc, "verify_message", None)
    return f"{text}: {detail}" if detail else text


class TlsStream(SocketStream):
    """A socket stream that speaks TLS; the handshake runs before the first byte moves
    (inside the caller's timeout) or explicitly through :meth:`handshake`."""

    def __init__(
        self, sock: socket.socket, context: ssl.SSLContext, *, server_side: bool, server_hostname: str | None = None
    ) -> None:
        super().__init__(sock)
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(
            self._incoming, self._outgoing, server_side=server_side, server_hostname=server_hostname
        )
        self._server_side = server_side
        self._established = False
        # Set when the peer turned out to speak the plain protocol: the server answers it in
        # plain text, so that it learns why it is refused.
        self._plain = False
        self._first_byte: int | None = None  # of the peer's first answer, to tell plain text
        # A reader and a writer may share the stream (a client listens for an early answer
        # while it sends a PUT body): ciphertext must leave in the order it was made.
        self._sending = asyncio.Lock()

    async def handshake(self, timeout: float | None) -> None:
        if self._established or self._plain:
            return
        first = await SocketStream.recv(self, RECORD_READ, timeout) if self._server_side else b""
        if first and first[0] != _HANDSHAKE_RECORD:
            self._plain = True
            raise RemoteProtocolError("this server requires TLS; connect with TLS (a client CA bundle: --tls-ca)")
        if first:
            self._incoming.write(first)
        elif self._server_side:
            raise ConnectionClosed("the client closed the connection before the TLS handshake")
        try:
            await self._drive(self._tls.do_handshake, timeout)
        except (TLSError, _Closed) as exc:
            if not self._server_side and self._answered_plain:
                raise TLSError("the server does not use TLS (it answered in plain text): drop --tls-ca") from None
            raise TLSError(f"TLS handshake failed: {exc or 'the peer closed the connection'}") from None
        self._established = True

    @property
    def _answered_plain(self) -> bool:
        return self._first_byte not in (None, _HANDSHAKE_RECORD, _ALERT_RECORD)

    async def recv(self, max_bytes: int, timeout: float | None) -> bytes:
        if self._plain:
            return await SocketStream.recv(self, max_bytes, timeout)
        await self.handshake(timeout)
        try:
            first = await self._drive(lambda: self._tls.read(max_bytes), timeout)
        except _Closed:
            return b""  # lengths and digests catch a truncation; no need to tell the two EOFs apart
        except TLSError as exc:
            # In TLS 1.3 a server refuses a client certificate after the client's handshake
            # is done: the alert arrives here.
            raise TLSError(f"the TLS connection failed: {exc}") from None
        # One read gives one record (16 KiB at most): take every record already here too, so
        # that callers see large chunks as they do from a plain socket.
        pieces = [first]
        size = len(first)
        while size < max_bytes and self._incoming.pending:
            try:
                piece = self._tls.read(max_bytes - size)
            except ssl.SSLError:
                break  # an incomplete record, or the end: the next call deals with it
            if not piece:
                break
            pieces.append(piece)
            size += len(piece)
        return first if len(pieces) == 1 else b"".join(pieces)

    async def recv_into(self, view: memoryview, timeout: float | None) -> int:
        """Decrypted bytes into ``view`` (a copy: the TLS object hands out new bytes)."""
        data = await self.recv(len(view), timeout)
        view[: len(data)] = data
        return len(data)

    async def send_all(self, data: bytes | bytearray | memoryview, timeout: float | None) -> None:
        if self._plain:
            return await SocketStream.send_all(self, data, timeout)
        await self.handshake(timeout)
        view = memoryview(data).cast("B")
        for start in range(0, len(view), WRITE_CHUNK):
            piece = view[start : start + WRITE_CHUNK]
            # A memory BIO takes everything written: SSLObject.write never writes part.
            await self._drive(functools.partial(self._tls.write, piece), timeout)

    async def sendfile(self, fd: int, offset: int, count: int, timeout: float) -> None:
        """Send ``count`` bytes of file ``fd`` from ``offset``, encrypted; each read runs in a
        worker thread while the previous piece is encrypted and sent."""
        loop = asyncio.get_running_loop()

        def read_next() -> asyncio.Future[bytes]:
            return loop.run_in_executor(None, os.pread, fd, min(count, FILE_CHUNK), offset)

        reading: asyncio.Future[bytes] | None = read_next()
        try:
            while reading is not None:
                data = await reading
                reading = None
                if not data:
                    raise ConnectionClosed("the file ended before the announced size")
                offset += len(data)
                count -= len(data)
                if count > 0:
                    reading = read_next()
                await self.send_all(data, timeout)
        finally:
            if reading is not None:
                # The caller closes ``fd`` next: no thread may still read it then.
                await asyncio.wait([reading])

    async def linger_close(self) -> None:
        if self._established:
            with contextlib.suppress(ssl.SSLError, OSError, ValueError):
                self._tls.unwrap()  # queues our close_notify; the peer's is not awaited
            with contextlib.suppress(Exception):
                await self._flush(1.0)
        await super().linger_close()

    # --- machinery --------------------------------------------------------------------------

    async def _drive(self, operation: Callable[[], _T], timeout: float | None) -> _T:
        """Run ``operation`` on the TLS object, feeding it ciphertext from the socket as it
        asks and sending what it produces."""
        while True:
            try:
                result = operation()
            except ssl.SSLWantReadError:
                await self._flush(timeout)
                data = await SocketStream.recv(self, RECORD_READ, timeout)
                if data:
                    if self._first_byte is None:
                        self._first_byte = data[0]
                    self._incoming.write(data)
                else:
                    self._incoming.write_eof()
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                raise _Closed from None
            except ssl.SSLError as exc:
                # Tell the peer why (the alert OpenSSL queued) before giving up.
                with contextlib.suppress(Exception):
                    await self._flush(timeout)
                raise TLSError(_reason(exc)) from None
            await self._flush(timeout)
            return result

    async def _flush(self, timeout: float | None) -> None:
        if self._outgoing.pending:
            async with self._sending:
                data = self._outgoing.read()  # everything made so far, also by others waiting here
                if data:
                    await SocketStream.send_all(self, data, timeout)


class _Closed(Exception):
    """The TLS stream ended (close_notify or a bare EOF)."""


def server_context_for(settings: Settings) -> ssl.SSLContext | None:
    """The server's TLS context, or None when ``tls_cert`` is not set."""
    if settings.tls_cert is None:
        if settings.tls_key is not None or settings.tls_client_ca is not None:
            raise InvalidArgument("tls_key and tls_client_ca need tls_cert")
        return None
    return server_tls_context(
        settings.tls_cert, settings.tls_key, client_ca=settings.tls_client_ca, min_version=settings.tls_min_version
    )


def client_context_for(settings: Settings) -> ssl.SSLContext | None:
    """The client commands' TLS context, or None when ``tls_ca`` is not set."""
    if settings.tls_ca is None:
        if settings.tls_client_cert is not None or settings.tls_client_key is not None:
            raise InvalidArgument("tls_client_cert and tls_client_key need tls_ca")
        return None
    return client_tls_context(settings.tls_ca, cert=settings.tls_client_cert, key=settings.tls_client_key)
