// Seed 000's "Real-Time Responses / Option 1: Server-Sent Events", the Node.js `eventsource`
// snippet, as the seed writes it but for the base URL. Its `onmessage` receives only events
// without an `event:` line, and every event the fleet streams is named (`event: token`, … as the
// seed's own Streaming Contract says), so it prints nothing: see stream-option1-listeners.mjs
// for the one line that makes it print the reply. Run by tests/tests/seed_streaming.rs with BASE,
// TOKEN and ROOM_ID in the environment; the lines marked "harness" are the test's, not the seed's.
import EventSource from 'eventsource';

const { BASE, TOKEN: token, ROOM_ID: roomId } = process.env; // harness

// Node.js: Use eventsource package which supports headers
const eventSource = new EventSource(
  `${BASE}/agents/rooms/${roomId}/stream`,
  { headers: { 'Authorization': `Bearer ${token}` } }
);

eventSource.onmessage = (event) => {
  const data = JSON.parse(event.data);

  if (data.type === 'token') {
    // Append token to response
    process.stdout.write(data.token);
  } else if (data.type === 'message_complete') {
    // Full message available
    console.log('\nComplete:', data.message);
  } else if (data.type === 'tool_call') {
    // Tool is being invoked
    console.log('Tool call:', data.tool_name);
  }
};

eventSource.onerror = (error) => {
  console.error('Stream error:', error);
  eventSource.close();
};

eventSource.onopen = () => console.log('[harness] open'); // harness
eventSource.addEventListener('done', () => { console.log('\n[harness] done'); eventSource.close(); }); // harness
