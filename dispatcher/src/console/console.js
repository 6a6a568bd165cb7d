// The console's one script: follows a session's live stream (the page's #tail names the stream
// URL, with a short-lived stream token) and appends each event as text. Everything else works
// without script.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const tail = document.getElementById("tail");
  if (!tail || !tail.dataset.stream || !window.EventSource) return;
  const source = new EventSource(tail.dataset.stream);
  const names = ["message_start", "token", "tool_call", "tool_result", "message_complete", "done", "error",
    "client_tool_pending", "input_message", "tool_input", "tool_output", "agent_output", "compaction"];
  for (const name of names) {
    source.addEventListener(name, (event) => {
      const item = document.createElement("li");
      item.textContent = name + " " + event.data;
      tail.appendChild(item);
      while (tail.children.length > 500) tail.removeChild(tail.firstChild);
    });
  }
});
