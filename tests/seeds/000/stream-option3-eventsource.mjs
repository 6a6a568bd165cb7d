// Seed 000's "Streaming Contract / Authentication for Streaming / Option 3: Node.js with
// `eventsource` Package", as the seed writes it but for the base URL. Run by
// tests/tests/seed_streaming.rs with BASE, TOKEN and ROOM_ID in the environment; the lines marked
// "harness" are the test's, not the seed's.
import EventSource from 'eventsource';

const { BASE, TOKEN: accessToken, ROOM_ID: roomId } = process.env; // harness

const eventSource = new EventSource(
  `${BASE}/agents/rooms/${roomId}/stream`,
  { headers: { 'Authorization': `Bearer ${accessToken}` } }
);

eventSource.addEventListener('token', (e) => {
  const data = JSON.parse(e.data);
  process.stdout.write(data.token);
});

eventSource.addEventListener('error', (e) => {
  console.error('Stream error:', e);
  eventSource.close();
});

eventSource.onopen = () => console.log('[harness] open'); // harness
eventSource.addEventListener('done', () => { console.log('\n[harness] done'); eventSource.close(); }); // harness
