"""The MCP server `tests/tests/fleet/mcp_tools.rs` registers: a few tools over streamable HTTP,
with what a test needs to see from outside (`GET /state`: calls per tool and the Authorization
headers seen) and to change (`POST /add_tool`: one more tool, for a refresh to discover).

Usage: server.py [TOKEN]  -- prints its URL on stdout once it listens; with TOKEN, every MCP
request must carry `Authorization: Bearer TOKEN` (401 otherwise).
"""

import json
import socket
import sys

import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse

try:  # the SDK's 2.x name, else 1.x's
    from mcp.server.mcpserver import MCPServer as Server
except ImportError:
    from mcp.server.fastmcp import FastMCP as Server
from mcp.types import ToolAnnotations

TOKEN = sys.argv[1] if len(sys.argv) > 1 else None
calls = {}
authorizations = []

mcp = Server("fleet-tools")


def count(name):
    calls[name] = calls.get(name, 0) + 1


@mcp.tool(description="Echoes its text back.")
def echo(text: str) -> str:
    count("echo")
    return f"echo: {text}"


@mcp.tool(description="Always fails.")
def explode(reason: str) -> str:
    count("explode")
    raise ValueError(f"exploded: {reason}")


@mcp.tool(description="Writes once; not idempotent.")
def write_once(key: str) -> str:
    count("write_once")
    return f"wrote {key}"


@mcp.tool(description="Sets a value; idempotent.", annotations=ToolAnnotations(idempotentHint=True))
def set_value(key: str) -> str:
    count("set_value")
    return f"set {key}"


@mcp.custom_route("/state", methods=["GET"])
async def state(request: Request):
    return JSONResponse({"calls": calls, "authorizations": authorizations})


@mcp.custom_route("/add_tool", methods=["POST"])
async def add_tool(request: Request):
    def added(text: str) -> str:
        count("added")
        return f"added: {text}"

    mcp.add_tool(added, name="added", description="Added after registration.")
    return JSONResponse({"ok": True})


def guarded(app):
    """Records each MCP request's Authorization header and refuses a wrong one."""

    async def asgi(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/mcp"):
            headers = dict(scope["headers"])
            seen = headers.get(b"authorization", b"").decode()
            authorizations.append(seen)
            if TOKEN and seen != f"Bearer {TOKEN}":
                await JSONResponse({"error": "unauthorized"}, status_code=401)(scope, receive, send)
                return
        await app(scope, receive, send)

    return asgi


def main():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    print(json.dumps({"url": f"http://127.0.0.1:{port}/mcp"}), flush=True)
    config = uvicorn.Config(guarded(mcp.streamable_http_app()), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
