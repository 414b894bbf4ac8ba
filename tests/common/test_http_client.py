"""The upstream HTTP client against a scripted HTTP/1.1 server on loopback: framing, decoding, reuse and faults."""

from __future__ import annotations

import asyncio
import gzip
import socket
import ssl
import subprocess
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import uvloop

from common.http_client import AnswerBroken, ConnectFailed, ConnectTimeout, HttpClient

# what the server answers to each request: raw bytes, then whether it closes the connection after them
Script = Callable[[bytes], tuple[bytes, bool]]


@dataclass(slots=True)
class ScriptedServer:
    """Answers each request with what `script` says; counts connections and keeps the requests' raw bytes."""

    script: Script
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                answer, close = self.script(request)
                writer.write(answer)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions?api-version=1"


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], asyncio.Future[ScriptedServer]]]:
    servers: list[asyncio.Server] = []

    async def start(script: Script) -> ScriptedServer:
        scripted = ScriptedServer(script)
        server = await asyncio.start_server(scripted.handle, "127.0.0.1", 0)
        scripted.port = server.sockets[0].getsockname()[1]
        servers.append(server)
        return scripted

    yield start  # type: ignore[misc]
    for server in servers:
        server.close()


@pytest.fixture
async def client() -> AsyncIterator[HttpClient]:
    http = HttpClient()
    yield http
    await http.close()


def whole(body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n{head}\r\n".encode() + body


def chunked(*parts: bytes) -> bytes:
    framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + framed + b"0\r\n\r\n"


async def test_a_post_carries_its_target_host_headers_and_body_and_reads_a_sized_answer(serve, client) -> None:
    server = await serve(lambda _: (whole(b'{"ok":true}', "Content-Type: application/json; charset=utf-8",
                                          "Retry-After: 3"), False))
    answer = await client.post(server.url, b'{"a":1}', {"authorization": "Bearer k"}, connect=1)
    assert (answer.status, answer.content_type, answer.headers["retry-after"]) == (200, "application/json", "3")
    assert await answer.read() == b'{"ok":true}'
    answer.release()
    request = server.requests[0]
    assert request.startswith(b"POST /v1/chat/completions?api-version=1 HTTP/1.1\r\n")
    assert f"host: 127.0.0.1:{server.port}\r\n".encode() in request
    assert b"authorization: Bearer k\r\n" in request and request.endswith(b"\r\n\r\n{\"a\":1}")


async def test_a_connection_whose_answer_arrived_whole_is_reused_and_one_cut_short_is_not(serve, client) -> None:
    server = await serve(lambda _: (chunked(b"data: 1\n\n", b"data: 2\n\n"), False))
    for _ in range(3):
        answer = await client.post(server.url, b"{}", {}, connect=1)
        assert [c async for c in answer.chunks()] in ([b"data: 1\n\ndata: 2\n\n"], [b"data: 1\n\n", b"data: 2\n\n"])
        answer.release()
    assert server.connections == 1
    answer = await client.post(server.url, b"{}", {}, connect=1)
    answer.close()  # a caller that gives up: the connection may hold the rest of the answer
    answer = await client.post(server.url, b"{}", {}, connect=1)
    answer.release()  # released unread: the whole answer may not have arrived yet, so only a complete one is kept
    assert server.connections == 2


async def test_a_body_without_length_or_chunks_ends_with_the_connection(serve, client) -> None:
    server = await serve(lambda _: (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"end\":1}", True))
    answer = await client.post(server.url, b"{}", {}, connect=1)
    assert await answer.read() == b'{"end":1}'
    answer.release()
    answer = await client.post(server.url, b"{}", {}, connect=1)  # a fresh connection: that one is gone
    assert await answer.read() == b'{"end":1}'
    assert server.connections == 2


async def test_a_gzipped_or_deflated_answer_is_decoded(serve, client) -> None:
    gzipped = gzip.compress(b"data: zipped\n\n")
    server = await serve(lambda request: (
        whole(gzipped, "content-encoding: gzip") if b"gzip" in request
        else chunked(zlib.compress(b"data: deflated\n\n")).replace(b"\r\n\r\n", b"\r\ncontent-encoding: deflate\r\n\r\n", 1),
        False))
    answer = await client.post(server.url, b"gzip", {}, connect=1)
    assert await answer.read() == b"data: zipped\n\n"
    answer.release()
    answer = await client.post(server.url, b"deflate", {}, connect=1)
    assert await answer.read() == b"data: deflated\n\n"


async def test_a_connection_cut_mid_answer_raises_answer_broken(serve, client) -> None:
    server = await serve(lambda _: (chunked(b"data: 1\n\n")[:-12], True))
    answer = await client.post(server.url, b"{}", {}, connect=1)
    with pytest.raises(AnswerBroken):
        await answer.read()
    answer.close()
    cut_in_head = await serve(lambda _: (b"HTTP/1.1 200 OK\r\ncontent-le", True))
    with pytest.raises(AnswerBroken):
        await client.post(cut_in_head.url, b"{}", {}, connect=1)


async def test_an_answer_that_is_not_http_raises_answer_broken(serve, client) -> None:
    server = await serve(lambda _: (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", False))
    with pytest.raises(AnswerBroken):
        await client.post(server.url, b"{}", {}, connect=1)


async def test_a_closed_port_is_connect_failed_and_no_time_to_connect_is_connect_timeout(client) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(ConnectFailed):
            await client.post(f"http://127.0.0.1:{port}/v1", b"{}", {}, connect=1)
        with pytest.raises(ConnectTimeout):
            await client.post(f"http://127.0.0.1:{port}/v1", b"{}", {}, connect=0)


async def test_an_idle_connection_the_server_closed_is_not_reused(serve, client) -> None:
    server = await serve(lambda _: (whole(b"{}"), False))
    answer = await client.post(server.url, b"{}", {}, connect=1)
    await answer.read()
    answer.release()
    server.writers[0].close()
    await server.writers[0].wait_closed()
    idle = next(iter(client._idle.values()))
    for _ in range(1000):  # loop turns, not time: the client's protocol sees the close within a few
        if idle[0].lost:
            break
        await asyncio.sleep(0)
    answer = await client.post(server.url, b"{}", {}, connect=1)
    assert await answer.read() == b"{}"
    assert server.connections == 2


async def test_a_connection_idle_past_the_keepalive_is_not_reused(serve) -> None:
    server = await serve(lambda _: (whole(b"{}"), False))
    client = HttpClient(keepalive=0)
    for _ in range(2):
        answer = await client.post(server.url, b"{}", {}, connect=1)
        await answer.read()
        answer.release()
    await client.close()
    assert server.connections == 2


async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(serve, client) -> None:
    server = await serve(lambda _: (whole(b"{}"), False))
    with pytest.raises(ValueError):
        await client.post(server.url, b"{}", {"x-extra": "a\r\nx-injected: 1"}, connect=1)
    assert server.requests == []


def test_uvloop_transports_serve_the_client_as_asyncio_ones_do() -> None:
    async def main() -> list[int]:
        server = await asyncio.start_server(ScriptedServer(lambda _: (chunked(b"data: 1\n\n"), False)).handle,
                                            "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        http = HttpClient()
        statuses = []
        for _ in range(2):
            answer = await http.post(url, b"{}", {}, connect=1)
            assert await answer.read() == b"data: 1\n\n"
            answer.release()
            statuses.append(answer.status)
        await http.close()
        server.close()
        return statuses

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) == [200, 200]


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for `localhost` and its key, as `openssl` makes them."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost"], check=True, capture_output=True)
    return cert, key


async def test_an_https_origin_is_reached_over_verified_tls_and_an_untrusted_one_is_connect_failed(
        certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    scripted = ScriptedServer(lambda _: (whole(b'{"tls":1}'), False))
    server = await asyncio.start_server(scripted.handle, "localhost", 0, ssl=tls)
    url = f"https://localhost:{server.sockets[0].getsockname()[1]}/v1"
    trusting = HttpClient(ssl_context=ssl.create_default_context(cafile=str(cert)))
    for _ in range(2):
        answer = await trusting.post(url, b"{}", {}, connect=5)
        assert await answer.read() == b'{"tls":1}'
        answer.release()
    assert scripted.connections == 1
    assert b"host: localhost:" in scripted.requests[0]
    with pytest.raises(ConnectFailed):
        await HttpClient().post(url, b"{}", {}, connect=5)  # the system's roots do not vouch for it
    await trusting.close()
    server.close()


async def test_a_target_is_percent_encoded_once(serve, client) -> None:
    server = await serve(lambda _: (whole(b"{}"), False))
    url = f"http://127.0.0.1:{server.port}/openai/deployments/my%20dep/é x/chat?api-version=1 2"
    answer = await client.post(url, b"{}", {}, connect=1)
    answer.release()
    assert server.requests[0].startswith(b"POST /openai/deployments/my%20dep/%C3%A9%20x/chat?api-version=1%202 HTTP/1.1")


async def test_an_answer_whose_headers_never_end_is_broken_off(serve, client) -> None:
    endless = b"HTTP/1.1 200 OK\r\n" + b"x-filler: " + b"a" * 1_000_000  # past any one read: some read starts with 64 KiB held + b"\r\n"
    server = await serve(lambda _: (endless, False))
    with pytest.raises(AnswerBroken):
        await client.post(server.url, b"{}", {}, connect=1)
