// Seed 000's "Pagination Pattern" (`getAllMessages`), ported from TypeScript to JavaScript (the
// type annotations dropped) and run with Node.js's own `fetch`; the base URL is the fleet's.
// Prints what it fetched as one JSON line: {count, ids}. Run by tests/tests/seed_agents.rs with
// BASE, TOKEN and ROOM_ID in the environment.
const token = process.env.TOKEN;
const BASE = process.env.BASE;

// Fetch all messages in a room
async function getAllMessages(roomId) {
  const allMessages = [];
  let cursor;

  do {
    const params = new URLSearchParams({ limit: '100' });
    if (cursor) params.set('cursor', cursor);

    const response = await fetch(
      `${BASE}/agents/rooms/${roomId}/messages?${params}`,
      { headers: { 'Authorization': `Bearer ${token}` } }
    );

    const { data } = await response.json();
    allMessages.push(...data.messages);
    cursor = data.has_more ? data.next_cursor : undefined;

  } while (cursor);

  return allMessages;
}

const messages = await getAllMessages(process.env.ROOM_ID);
console.log(JSON.stringify({ count: messages.length, ids: messages.map((m) => m.id), roles: messages.map((m) => m.role) }));
