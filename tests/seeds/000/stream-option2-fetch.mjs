// Seed 000's "Streaming Contract / Authentication for Streaming / Option 2: Fetch API with
// ReadableStream", ported from TypeScript to JavaScript (the type annotations dropped) and run
// with Node.js's own `fetch`, but for the base URL. The stream does not end by itself: the test
// stops the script once it printed `[Stream ended]`. Run by tests/tests/seed_streaming.rs with
// BASE, TOKEN and ROOM_ID in the environment; the lines marked "harness" are the test's.
const { BASE, TOKEN, ROOM_ID } = process.env; // harness
const realFetch = globalThis.fetch; // harness: say when the stream's answer arrived
globalThis.fetch = async (...args) => { const r = await realFetch(...args); console.log('[harness] open'); return r; }; // harness

async function streamWithAuth(roomId, accessToken) {
  const response = await fetch(
    `${BASE}/agents/rooms/${roomId}/stream`,
    {
      headers: { 'Authorization': `Bearer ${accessToken}` }
    }
  );

  const reader = response.body?.getReader();
  const decoder = new TextDecoder();
  let buffer = '';

  while (reader) {
    const { done, value } = await reader.read();
    if (done) break;

    buffer += decoder.decode(value, { stream: true });

    // Parse complete events from buffer
    const events = buffer.split('\n\n');
    buffer = events.pop() || ''; // Keep incomplete event in buffer

    for (const eventBlock of events) {
      if (!eventBlock.trim()) continue;

      const lines = eventBlock.split('\n');
      let eventType = 'message';
      let data = '';

      for (const line of lines) {
        if (line.startsWith('event: ')) {
          eventType = line.slice(7);
        } else if (line.startsWith('data: ')) {
          data = line.slice(6);
        }
      }

      if (data) {
        const parsed = JSON.parse(data);
        handleStreamEvent(eventType, parsed);
      }
    }
  }
}

function handleStreamEvent(eventType, data) {
  switch (data.type) {
    case 'token':
      process.stdout.write(data.token);
      break;
    case 'message_complete':
      console.log('\n[Complete]', data.message.content);
      break;
    case 'tool_call':
      console.log('[Tool]', data.tool_call.tool_name);
      break;
    case 'error':
      console.error('[Error]', data.error.message);
      break;
    case 'done':
      console.log('[Stream ended]');
      break;
  }
}

await streamWithAuth(ROOM_ID, TOKEN); // harness
