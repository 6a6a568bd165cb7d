// An MCP test server on the official TypeScript SDK (npm `@modelcontextprotocol/sdk`), over
// Streamable HTTP on loopback, one session per client. Started by tests/tests/fleet/mcp_client.rs
// (`fleet_tests::mcp::McpTestServer::typescript`) with NODE_PATH at the packages that
// scripts/ensure-mcp.sh installed. It listens on 127.0.0.1 on a free port and prints one line,
// `listening <url>`. `GET /stats` answers how many `initialize`, `tools/list` and `tools/call`
// requests came. Tools: `multiply` (an outputSchema and structured content), `fail` (an
// isError answer with the fleet's safe error in its structured content), `explode` (throws).
const http = require('node:http');
const { randomUUID } = require('node:crypto');
const { McpServer } = require('@modelcontextprotocol/sdk/server/mcp.js');
const { StreamableHTTPServerTransport } = require('@modelcontextprotocol/sdk/server/streamableHttp.js');
const { isInitializeRequest } = require('@modelcontextprotocol/sdk/types.js');
const { z } = require('zod');

const counts = { initialize: 0, 'tools/list': 0, 'tools/call': 0 };

function newServer() {
  const server = new McpServer({ name: 'fleet-test-ts', version: '1.0.0' });
  server.registerTool(
    'multiply',
    {
      description: 'Multiplies two numbers',
      inputSchema: { a: z.number(), b: z.number() },
      outputSchema: { product: z.number() },
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    async ({ a, b }) => ({
      content: [{ type: 'text', text: String(a * b) }],
      structuredContent: { product: a * b },
    }),
  );
  server.registerTool(
    'fail',
    { description: 'Answers isError with a safe error', inputSchema: { id: z.string() } },
    async ({ id }) => ({
      isError: true,
      content: [{ type: 'text', text: `no order ${id}` }],
      structuredContent: { error: { code: 'NOT_FOUND', message: `No such order` } },
    }),
  );
  server.registerTool('explode', { description: 'Throws' }, async () => {
    throw new Error('it exploded');
  });
  return server;
}

const transports = {};

function count(body) {
  for (const message of Array.isArray(body) ? body : [body]) {
    if (message && counts[message.method] !== undefined) counts[message.method] += 1;
  }
}

async function handle(req, res) {
  if (req.url === '/stats') {
    res.writeHead(200, { 'content-type': 'application/json' });
    return res.end(JSON.stringify(counts));
  }
  let body;
  if (req.method === 'POST') {
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    body = JSON.parse(Buffer.concat(chunks).toString() || 'null');
    count(body);
  }
  const sessionId = req.headers['mcp-session-id'];
  let transport = sessionId ? transports[sessionId] : undefined;
  if (!transport && req.method === 'POST' && isInitializeRequest(body)) {
    transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => {
        transports[id] = transport;
      },
    });
    transport.onclose = () => delete transports[transport.sessionId];
    await newServer().connect(transport);
  }
  if (!transport) {
    res.writeHead(sessionId ? 404 : 400, { 'content-type': 'application/json' });
    return res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32000, message: 'No session' }, id: null }));
  }
  await transport.handleRequest(req, res, body);
}

const httpServer = http.createServer((req, res) => {
  handle(req, res).catch((e) => {
    if (!res.headersSent) res.writeHead(500);
    res.end(String(e));
  });
});
httpServer.listen(0, '127.0.0.1', () => {
  console.log(`listening http://127.0.0.1:${httpServer.address().port}/mcp`);
});
