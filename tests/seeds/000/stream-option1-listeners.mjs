// Seed 000's "Real-Time Responses / Option 1: Server-Sent Events", the Node.js `eventsource`
// snippet, with the one line added that makes it print the reply (marked "the one line"): its
// `onmessage` handler, unchanged, listens to the events by their names, since every event the
// fleet streams is named (`event: token`, … as the seed's own Streaming Contract says) and
// `onmessage` receives only unnamed ones. Run by tests/tests/seed_streaming.rs with BASE, TOKEN
// and ROOM_ID in the environment; the lines marked "harness" are the test's, not the seed's.
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

for (const type of ['token', 'message_complete', 'tool_call']) eventSource.addEventListener(type, eventSource.onmessage); // the one line

eventSource.onerror = (error) => {
  console.error('Stream error:', error);
  eventSource.close();
};

eventSource.onopen = () => console.log('[harness] open'); // harness
eventSource.addEventListener('done', () => { console.log('\n[harness] done'); eventSource.close(); }); // harness
