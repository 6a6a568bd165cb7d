#!/usr/bin/env bash
# Seed 000's Steps as the seed shows them (Step 1 "Create an Assistant" and the assistant CRUD,
# Step 2 "Register a Tool" and the tool routes, Step 4 rooms, Step 5 messages), each request as the
# seed writes it but for the base URL (`$BASE`), `<token>` (`$TOKEN`) and the example ids (`asst_abc`,
# `tool_abc`, `room_xyz`: the ids the fleet gave). Each answer is printed after a `## step` line,
# followed by `=> STATUS`, for tests/tests/fleet/seed_agents.rs to check.
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The seed's curl, printing the answer's body and then its status.
curl() { command curl -sS -o "$tmp/body" -w '%{http_code}' "$@" >"$tmp/status"; cat "$tmp/body"; printf '\n=> %s\n' "$(cat "$tmp/status")"; }
step() { echo "## $1"; }
last() { jq -r "$1" "$tmp/body"; }

step "1 create assistant (its tools are not registered yet)"
curl -X POST $BASE/agents/assistants \
  -H "Authorization: Bearer $TOKEN" \
  -H "Content-Type: application/json" \
  -d '{
    "name": "support_assistant",
    "title": "Support Assistant",
    "description": "Helps users with support questions",
    "model_config": {
      "provider": "openai",
      "model": "gpt-4o",
      "temperature": 0.7
    },
    "instructions": "You are a helpful support assistant. Be concise and friendly. Always try to resolve issues on the first response.",
    "enabled_tools": ["search_knowledge_base", "create_ticket"]
  }'

step "2 register a tool"
curl -X POST $BASE/tools \
  -H "Authorization: Bearer $TOKEN" \
  -H "Content-Type: application/json" \
  -d '{
    "name": "search_products",
    "description": "Search the product catalog by query and optional category",
    "parameters": {
      "type": "object",
      "properties": {
        "query": {
          "type": "string",
          "description": "Search query for product names or descriptions"
        },
        "category": {
          "type": "string",
          "description": "Product category to filter by",
          "enum": ["electronics", "clothing", "home", "sports"]
        },
        "max_results": {
          "type": "integer",
          "description": "Maximum number of results to return",
          "default": 10
        }
      },
      "required": ["query"]
    },
    "callback_url": "https://yourapp.com/api/tools/search_products",
    "callback_secret": "your_webhook_secret_here"
  }'
TOOL_ID=$(last .data.id)

step "2 register it again"
curl -X POST $BASE/tools \
  -H "Authorization: Bearer $TOKEN" \
  -H "Content-Type: application/json" \
  -d '{"name": "search_products", "callback_url": "https://yourapp.com/api/tools/search_products", "callback_secret": "your_webhook_secret_here"}'

# The tools Step 1's assistant enables, registered the same way.
for tool in search_knowledge_base create_ticket; do
  step "2 register $tool"
  curl -X POST $BASE/tools \
    -H "Authorization: Bearer $TOKEN" \
    -H "Content-Type: application/json" \
    -d '{"name": "'$tool'", "description": "'$tool'", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}, "callback_url": "https://yourapp.com/api/tools/'$tool'", "callback_secret": "your_webhook_secret_here"}'
done

step "1 create assistant"
curl -X POST $BASE/agents/assistants \
  -H "Authorization: Bearer $TOKEN" \
  -H "Content-Type: application/json" \
  -d '{
    "name": "support_assistant",
    "title": "Support Assistant",
    "description": "Helps users with support questions",
    "model_config": {
      "provider": "openai",
      "model": "gpt-4o",
      "temperature": 0.7
    },
    "instructions": "You are a helpful support assistant. Be concise and friendly. Always try to resolve issues on the first response.",
    "enabled_tools": ["search_knowledge_base", "create_ticket"]
  }'
ASSISTANT_ID=$(last .data.id)

step "list assistants"
curl $BASE/agents/assistants \
  -H "Authorization: Bearer $TOKEN"

step "get assistant"
curl $BASE/agents/assistants/$ASSISTANT_ID \
  -H "Authorization: Bearer $TOKEN"

step "update assistant"
curl -X PUT $BASE/agents/assistants/$ASSISTANT_ID \
  -H "Authorization: Bearer $TOKEN" \
  -H "Content-Type: application/json" \
  -d '{
    "instructions": "Updated instructions with more detail...",
    "model_config": {
      "temperature": 0.5
    }
  }'

step "4 create a room"
curl -X POST $BASE/agents/$ASSISTANT_ID/rooms \
  -H "Authorization: Bearer $TOKEN" \
  -H "Content-Type: application/json" \
  -d '{
    "namespace": "user_123",
    "metadata": {
      "user_name": "John",
      "context": "billing_question",
      "plan": "premium"
    }
  }'
ROOM_ID=$(last .data.id)

step "list rooms"
curl $BASE/agents/rooms \
  -H "Authorization: Bearer $TOKEN"

step "list active rooms for a user"
curl "$BASE/agents/rooms?namespace=user_123&status=active" \
  -H "Authorization: Bearer $TOKEN"

step "5 send a message"
curl -X POST $BASE/agents/rooms/$ROOM_ID/messages \
  -H "Authorization: Bearer $TOKEN" \
  -H "Content-Type: application/json" \
  -d '{
    "content": "How do I update my billing information?",
    "role": "user"
  }'
EXECUTION_ID=$(last .data.execution_id)

# The assistant's answer comes asynchronously: the test waits for the turn here.
echo "## waiting for $EXECUTION_ID"
read -r _

step "list messages"
curl $BASE/agents/rooms/$ROOM_ID/messages \
  -H "Authorization: Bearer $TOKEN"

step "get room"
curl $BASE/agents/rooms/$ROOM_ID \
  -H "Authorization: Bearer $TOKEN"

step "close room"
curl -X POST $BASE/agents/rooms/$ROOM_ID/close \
  -H "Authorization: Bearer $TOKEN"

step "close room again"
curl -X POST $BASE/agents/rooms/$ROOM_ID/close \
  -H "Authorization: Bearer $TOKEN"

step "send a message to the closed room"
curl -X POST $BASE/agents/rooms/$ROOM_ID/messages \
  -H "Authorization: Bearer $TOKEN" \
  -H "Content-Type: application/json" \
  -d '{
    "content": "How do I update my billing information?",
    "role": "user"
  }'

step "list messages of the closed room"
curl "$BASE/agents/rooms/$ROOM_ID/messages?order=asc" \
  -H "Authorization: Bearer $TOKEN"

step "list closed rooms for a user"
curl "$BASE/agents/rooms?namespace=user_123&status=closed" \
  -H "Authorization: Bearer $TOKEN"

step "list tools"
curl $BASE/tools \
  -H "Authorization: Bearer $TOKEN"

step "get tool"
curl $BASE/tools/$TOOL_ID \
  -H "Authorization: Bearer $TOKEN"

step "update tool"
curl -X PUT $BASE/tools/$TOOL_ID \
  -H "Authorization: Bearer $TOKEN" \
  -H "Content-Type: application/json" \
  -d '{
    "description": "Updated description with more detail",
    "callback_url": "https://yourapp.com/api/v2/tools/search_products"
  }'

step "delete tool"
curl -X DELETE $BASE/tools/$TOOL_ID \
  -H "Authorization: Bearer $TOKEN"

step "delete assistant"
curl -X DELETE $BASE/agents/assistants/$ASSISTANT_ID \
  -H "Authorization: Bearer $TOKEN"

step "get deleted assistant"
curl $BASE/agents/assistants/$ASSISTANT_ID \
  -H "Authorization: Bearer $TOKEN"
