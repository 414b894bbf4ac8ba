"""An OpenAI-compatible upstream that answers at once, for measuring what a gateway adds.

A raw asyncio HTTP/1.1 server (keep-alive, no framework) so that it costs far less than the proxies it
serves: a fixed chat completion, or a stream of `--chunks` content chunks, a usage chunk and `[DONE]`.
Run: `python -m benchmarks.gateway.instant_upstream --port 9100 [--chunks 20]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json

COMPLETION = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "smollm2",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello there"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10},
}).encode()


def stream_body(chunks: int) -> bytes:
    def event(obj: dict[str, object]) -> bytes:
        data = b"data: " + json.dumps(obj).encode() + b"\n\n"
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"

    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "smollm2"}
    parts = [event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "finish_reason": None}]})]
    for i in range(chunks):
        finish = "length" if i == chunks - 1 else None
        parts.append(event({**base, "choices": [{"index": 0, "delta": {"content": f"t{i} "},
                                                 "finish_reason": finish}]}))
    parts.append(event({**base, "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": chunks,
                                                         "total_tokens": 8 + chunks}}))
    done = b"data: [DONE]\n\n"
    parts.append(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
    return b"".join(parts)


def responses(chunks: int) -> tuple[bytes, bytes, bytes]:
    whole = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
             + str(len(COMPLETION)).encode() + b"\r\n\r\n" + COMPLETION)
    streamed = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                + stream_body(chunks))
    health = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\n\r\n{"status":"ok"}'
    return whole, streamed, health


async def serve(port: int, chunks: int) -> None:
    whole, streamed, health = responses(chunks)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                body = await reader.readexactly(length) if length else b""
                if head.startswith(b"GET"):
                    writer.write(health)
                elif b'"stream":true' in body.replace(b" ", b""):
                    writer.write(streamed)
                else:
                    writer.write(whole)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.chunks))


if __name__ == "__main__":
    main()
