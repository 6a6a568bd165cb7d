"""MCP test servers on the official Python SDK (PyPI `mcp` 2.x), over Streamable HTTP on loopback.

Started by tests/tests/fleet/mcp_client.rs (`fleet_tests::mcp::PythonMcp`). It binds 127.0.0.1 on a
free port and prints one line, `listening <url>`, then serves until killed. `GET /stats` answers
how many `initialize`, `tools/list` and `tools/call` requests the server was sent, so a test can
count handshakes from the server's side.

Kinds (`--kind`):
  tools          MCPServer (the SDK's FastMCP) with echo, add (an outputSchema), fail (raises),
                 slow (sleeps), drop (the process exits mid-call) and lookup (annotations)
  paged          the low-level Server listing `--tools` tools, `--page-size` a page, by cursor
  repeat-cursor  a listing whose every page gives the same nextCursor
  bad-schema     a listing with a tool whose inputSchema is no JSON Schema
`--token T` makes every MCP request need `Authorization: Bearer T` (401 otherwise).
"""

import argparse
import asyncio
import json
import os
import socket
import sys

import uvicorn
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

COUNTS = {"initialize": 0, "tools/list": 0, "tools/call": 0}


def tools_server() -> MCPServer:
    mcp = MCPServer("fleet-test-tools")

    class Echoed(BaseModel):
        text: str
        length: int

    @mcp.tool(description="Echoes its text, also as structured content")
    def echo(text: str) -> Echoed:
        return Echoed(text=text, length=len(text))

    @mcp.tool(description="Adds two integers")
    def add(a: int, b: int) -> int:
        return a + b

    @mcp.tool(description="Always fails")
    def fail(reason: str = "boom") -> str:
        raise ValueError(reason)

    @mcp.tool(description="Sleeps, then answers")
    async def slow(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @mcp.tool(description="Ends the server's process in the middle of the call")
    def drop() -> str:
        os._exit(3)

    @mcp.tool(
        description="Looks a key up",
        annotations=types.ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True),
    )
    def lookup(key: str) -> str:
        return f"value of {key}"

    return mcp


def listing_server(kind: str, total: int, page_size: int) -> Server:
    def tool(i: int, schema: dict | None = None) -> types.Tool:
        return types.Tool(name=f"tool_{i:04}", description=f"tool {i}", input_schema=schema or {"type": "object"})

    async def on_list_tools(ctx, params):
        cursor = params.cursor if params is not None else None
        if kind == "repeat-cursor":
            return types.ListToolsResult(tools=[tool(0 if cursor is None else 1)], next_cursor="again")
        if kind == "bad-schema":
            return types.ListToolsResult(tools=[tool(0), tool(1, {"type": "object", "properties": {"x": {"type": "nonsense"}}})])
        start = int(cursor or 0)
        end = min(start + page_size, total)
        next_cursor = str(end) if end < total else None
        return types.ListToolsResult(tools=[tool(i) for i in range(start, end)], next_cursor=next_cursor)

    async def on_call_tool(ctx, params):
        return types.CallToolResult(content=[types.TextContent(type="text", text=params.name)])

    return Server("fleet-test-listing", on_list_tools=on_list_tools, on_call_tool=on_call_tool)


def counted(app, token: str | None):
    """Wraps the app: counts JSON-RPC methods, serves /stats, and checks the bearer token."""

    async def wrapper(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        if scope["path"] == "/stats":
            return await respond(send, 200, json.dumps(COUNTS).encode(), b"application/json")
        headers = dict(scope["headers"])
        if token is not None and headers.get(b"authorization") != f"Bearer {token}".encode():
            return await respond(send, 401, b'{"error": "unauthorized"}', b"application/json", [(b"www-authenticate", b"Bearer")])
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        count(body)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await app(scope, replay, send)

    return wrapper


def count(body: bytes):
    try:
        messages = json.loads(body) if body else []
    except ValueError:
        return
    for message in messages if isinstance(messages, list) else [messages]:
        method = message.get("method") if isinstance(message, dict) else None
        if method in COUNTS:
            COUNTS[method] += 1


async def respond(send, status, body, content_type, extra=()):
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", default="tools", choices=["tools", "paged", "repeat-cursor", "bad-schema"])
    parser.add_argument("--tools", type=int, default=25)
    parser.add_argument("--page-size", type=int, default=10)
    parser.add_argument("--token")
    args = parser.parse_args()
    server = tools_server() if args.kind == "tools" else listing_server(args.kind, args.tools, args.page_size)
    app = counted(server.streamable_http_app(), args.token)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    print(f"listening http://127.0.0.1:{port}/mcp", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
