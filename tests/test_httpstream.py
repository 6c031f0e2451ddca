"""The load generator's HTTP client: chunked, sized and closed bodies read off the socket, split into lines, each
timed by the arrival of the bytes that completed it (the kernel's receive time where Linux gives it)."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import time

import pytest

from harness.serving.httpstream import (
    SO_TIMESTAMPNS,
    HTTPStreamError,
    _arrival,
    _Chunked,
    post_stream,
    sse_lines,
)


def _chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def test_a_chunked_body_split_anywhere_decodes_to_its_bytes_with_each_piece_s_arrival():
    body = [b"data: one\n\n", b"data: two\n\n", b"x" * 300, b"data: [DONE]\n\n"]
    wire = _chunked(body)
    rng = random.Random(3)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(wire)), 12))
        pieces = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)])]
        decoder, out = _Chunked(), []
        for t, piece in enumerate(pieces):
            out += decoder.feed(float(t), piece)
        assert decoder.done and b"".join(data for _, data in out) == b"".join(body)
        assert all(isinstance(t, float) for t, _ in out) and [t for t, _ in out] == sorted(t for t, _ in out)


def test_a_bad_chunk_size_is_an_error():
    with pytest.raises(HTTPStreamError):
        _Chunked().feed(0.0, b"zz\r\nabc\r\n")


def test_a_line_takes_the_arrival_of_the_piece_that_completed_it():
    lines = list(sse_lines([(1.0, b"data: a"), (2.0, b"bc\n\nda"), (3.0, b"ta: d\n")]))
    assert lines == [(2.0, b"data: abc"), (2.0, b""), (3.0, b"data: d")]


def test_a_read_is_timed_by_the_kernel_s_receive_time_else_by_now():
    before = time.perf_counter()
    assert before <= _arrival([]) <= time.perf_counter()
    received = time.time_ns() - 5_000_000  # bytes that arrived 5 ms ago
    stamp = struct.pack("@qq", received // 1_000_000_000, received % 1_000_000_000)
    t = _arrival([(socket.SOL_SOCKET, SO_TIMESTAMPNS, stamp)])
    assert time.perf_counter() - t == pytest.approx(0.005, abs=0.002)


def _serve_once(response: bytes):
    """A one-shot raw server that answers any request with ``response`` and closes."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(response)
        await writer.drain()
        writer.close()

    async def run() -> tuple[int, dict, list]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await post_stream(f"http://127.0.0.1:{port}/v1/completions", {"max_tokens": 1})

    return asyncio.run(run())


def test_sized_and_closed_bodies_and_error_statuses_are_read_whole():
    status, headers, pieces = _serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\ndata: ok\n")
    assert status == 200 and headers["content-length"] == "9" and b"".join(d for _, d in pieces) == b"data: ok\n"
    status, _, pieces = _serve_once(b"HTTP/1.0 503 Service Unavailable\r\n\r\nbusy")
    assert status == 503 and b"".join(d for _, d in pieces) == b"busy"
    status, _, pieces = _serve_once(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked([b"data: x\n"]))
    assert status == 200 and b"".join(d for _, d in pieces) == b"data: x\n"


def test_an_answer_that_is_not_http_is_an_error():
    with pytest.raises(HTTPStreamError):
        _serve_once(b"SSH-2.0-OpenSSH\r\n\r\n")
    with pytest.raises(HTTPStreamError):
        _serve_once(b"")


def test_only_http_and_https_urls_are_taken():
    with pytest.raises(HTTPStreamError):
        asyncio.run(post_stream("ftp://127.0.0.1:1/v1/completions", {}))
    with pytest.raises(OSError):  # https is taken (tests/test_serving_external.py reads a stream over TLS)
        asyncio.run(post_stream("https://127.0.0.1:1/v1/completions", {}))
