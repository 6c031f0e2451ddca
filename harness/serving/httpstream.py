"""A minimal HTTP/1.1 streaming client for the load generator: one POST per connection, its response read straight
off a non-blocking socket, each read stamped with the time the kernel received its bytes.

Why not a general client: under load a server sends many streams' tokens at once (every sequence of a batch in one
step), and a client that timestamps an event when its own code gets to it stamps the last of a burst late by the
time it spent on the others. Here every ``recvmsg`` carries the kernel's receive time (``SO_TIMESTAMPNS``, Linux),
converted to ``time.perf_counter()``'s clock, so an event's time is when its bytes arrived, however busy the event
loop was. Where the kernel gives no time (another OS), the read's own ``perf_counter()`` stands in.

The response may be chunked (``Transfer-Encoding: chunked``), sized (``Content-Length``) or end with the connection;
:func:`post_stream` returns the status, the headers and the body as ``(arrival, bytes)`` pieces, and
:func:`sse_lines` splits such pieces into lines, each with the arrival of the piece that completed it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's value; the control message type is the same
_TIMESPEC = struct.Struct("@qq")  # struct timespec on 64-bit Linux: tv_sec, tv_nsec
_READ = 1 << 16


class HTTPStreamError(ConnectionError):
    """The server's answer was not HTTP, or ended inside a chunk."""


def _arrival(ancdata: list[tuple[int, int, bytes]]) -> float:
    """The perf_counter() time of a read: the kernel's receive time from its control message, else now."""
    now_ns = time.perf_counter_ns()
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(data)
            received_ns = seconds * 1_000_000_000 + nanoseconds  # CLOCK_REALTIME
            age_ns = time.time_ns() - received_ns
            if 0 <= age_ns < 60_000_000_000:  # a sane stamp: not in the future, not a minute old
                return (now_ns - age_ns) / 1e9
    return now_ns / 1e9


class _Reader:
    """Reads a connected non-blocking socket from the event loop, keeping ``(arrival, bytes)`` per read."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self.loop, self.sock = loop, sock
        self.pieces: list[tuple[float, bytes]] = []
        self.eof = False
        self.error: OSError | None = None
        self.ready = asyncio.Event()
        loop.add_reader(sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        while True:
            try:
                data, ancdata, _flags, _addr = self.sock.recvmsg(_READ, socket.CMSG_SPACE(_TIMESPEC.size))
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self.error, self.eof = exc, True
                break
            if not data:
                self.eof = True
                break
            self.pieces.append((_arrival(ancdata), data))
        if self.eof:
            self.loop.remove_reader(self.sock.fileno())
        self.ready.set()

    async def take(self) -> list[tuple[float, bytes]]:
        """The pieces read since the last call; waits for one. Empty at the end of the stream."""
        while not self.pieces and not self.eof:
            self.ready.clear()
            await self.ready.wait()
        if self.error is not None and not self.pieces:
            raise self.error
        out, self.pieces = self.pieces, []
        return out

    def close(self) -> None:
        if not self.eof:
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()


class _Chunked:
    """Incremental ``Transfer-Encoding: chunked`` decoder over timed pieces."""

    def __init__(self) -> None:
        self.buffer, self.left, self.done = b"", None, False

    def feed(self, arrival: float, data: bytes) -> list[tuple[float, bytes]]:
        self.buffer += data
        out = []
        while not self.done:
            if self.left is None:  # a size line
                end = self.buffer.find(b"\r\n")
                if end < 0:
                    break
                try:
                    self.left = int(self.buffer[:end].split(b";")[0].strip() or b"0", 16)
                except ValueError as exc:
                    raise HTTPStreamError(f"bad chunk size {self.buffer[:end][:40]!r}") from exc
                self.buffer = self.buffer[end + 2:]
                if self.left == 0:
                    self.done = True
                    break
            take = self.buffer[:self.left]
            if take:
                out.append((arrival, take))
                self.buffer, self.left = self.buffer[len(take):], self.left - len(take)
            if self.left:
                break
            if len(self.buffer) < 2:  # the CRLF after the chunk
                break
            self.buffer, self.left = self.buffer[2:], None
        return out


def _head(raw: bytes) -> tuple[int, dict[str, str]]:
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise HTTPStreamError(f"not an HTTP response: {lines[0][:60]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


class _TlsReader:
    """Reads a TLS stream (asyncio's): the same ``take()`` as :class:`_Reader`, each read stamped with the time the
    event loop got its decrypted bytes (TLS records are decrypted in user space: no kernel time to use)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.eof = False

    async def take(self) -> list[tuple[float, bytes]]:
        data = await self.reader.read(_READ)
        if not data:
            self.eof = True
            return []
        return [(time.perf_counter(), data)]

    def close(self) -> None:
        self.writer.close()


async def _connect_plain(host: str, port: int, request: bytes) -> _Reader:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setblocking(False)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        pass  # no kernel receive times here: each read's own time stands in
    try:
        await loop.sock_connect(sock, address)
        await loop.sock_sendall(sock, request)
    except BaseException:
        sock.close()
        raise
    return _Reader(loop, sock)


async def _connect_tls(host: str, port: int, request: bytes) -> _TlsReader:
    import ssl

    reader, writer = await asyncio.open_connection(host, port, ssl=ssl.create_default_context(),
                                                   server_hostname=host)
    try:
        writer.write(request)
        await writer.drain()
    except BaseException:
        writer.close()
        raise
    return _TlsReader(reader, writer)


async def post_stream(url: str, payload: Mapping[str, Any], extra_headers: Mapping[str, str] | None = None,
                      ) -> tuple[int, dict[str, str], list[tuple[float, bytes]]]:
    """POST ``payload`` as JSON to ``url`` (``http://host:port/path``, or ``https://``: certificates verified
    against the system's authorities, ``SSL_CERT_FILE`` where set) with ``extra_headers`` (an API key's
    ``Authorization``), and read the whole response: its status, its headers (lower-case names) and its body as
    ``(arrival, bytes)`` pieces in order. Raises OSError (refused, reset, a certificate refused) and
    HTTPStreamError; the caller bounds the time."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HTTPStreamError(f"only http(s)://host:port/path URLs are supported, got {parts.scheme}://...")
    secure = parts.scheme == "https"
    host, port = parts.hostname, parts.port or (443 if secure else 80)
    body = json.dumps(dict(payload)).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in (extra_headers or {}).items())
    request = (f"POST {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1\r\n"
               f"Host: {host}:{port}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n{extra}"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    reader: _Reader | _TlsReader | None = None
    try:
        reader = await (_connect_tls if secure else _connect_plain)(host, port, request)
        head, status, headers = b"", None, {}
        body_pieces: list[tuple[float, bytes]] = []
        chunked, length, received = None, None, 0
        while True:
            pieces = await reader.take()
            if not pieces:
                break
            for arrival, data in pieces:
                if status is None:
                    head += data
                    end = head.find(b"\r\n\r\n")
                    if end < 0:
                        continue
                    status, headers = _head(head[:end])
                    data, head = head[end + 4:], b""
                    if "chunked" in headers.get("transfer-encoding", "").lower():
                        chunked = _Chunked()
                    elif headers.get("content-length", "").isdigit():
                        length = int(headers["content-length"])
                if chunked is not None:
                    body_pieces += chunked.feed(arrival, data)
                elif data:
                    body_pieces.append((arrival, data))
                    received += len(data)
            if (chunked is not None and chunked.done) or (length is not None and received >= length):
                break
        if status is None:
            raise HTTPStreamError("the server closed the connection before answering")
        if chunked is not None and not chunked.done and not reader.eof:
            raise HTTPStreamError("the stream ended inside a chunk")
        return status, headers, body_pieces
    finally:
        if reader is not None:
            reader.close()


def sse_lines(pieces: Iterable[tuple[float, bytes]]) -> Iterator[tuple[float, bytes]]:
    """The body's lines (without the line end), each with the arrival of the piece that completed it."""
    pending = b""
    for arrival, data in pieces:
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            yield arrival, line.rstrip(b"\r")
    if pending:
        yield arrival, pending.rstrip(b"\r")
