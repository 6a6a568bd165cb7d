#!/usr/bin/env bash
# Seed 000's "Data Sources" as the seed shows them: register, list, get (its schema), update,
# refresh the schema, run the seed's query, add its semantic mappings, delete. Each request as the
# seed writes it but for the base URL (`$BASE`), `<token>` (`$TOKEN`), the example id `ds_abc` (the
# id the fleet gave) and the database's address: `db.yourcompany.com:5432` is `$DB_HOST:$DB_PORT`
# (and `"type"` is `$DB_TYPE`: `postgresql`, or `mysql` for MariaDB). The database, user and
# password are the seed's (`sales`, `readonly_user`, `secure_password`). Delete runs last, not
# between update and refresh as in the seed, so the calls after it have a source to act on. Each
# answer is printed after a `## step` line, followed by `=> STATUS`, for
# tests/tests/fleet/data_sources.rs to check.
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The seed's curl, printing the answer's body and then its status.
curl() { command curl -sS -o "$tmp/body" -w '%{http_code}' "$@" >"$tmp/status"; cat "$tmp/body"; printf '\n=> %s\n' "$(cat "$tmp/status")"; }
step() { echo "## $1"; }
last() { jq -r "$1" "$tmp/body"; }

step "register a data source"
curl -X POST $BASE/data-sources \
  -H "Authorization: Bearer $TOKEN" \
  -H "Content-Type: application/json" \
  -d '{
    "name": "sales_database",
    "type": "'"$DB_TYPE"'",
    "connection": {
      "host": "'"$DB_HOST"'",
      "port": '"$DB_PORT"',
      "database": "sales",
      "username": "readonly_user",
      "password": "secure_password"
    },
    "description": "Sales and customer data including orders, products, and customer information"
  }'
DS_ID=$(last .data.id)

step "list data sources"
curl $BASE/data-sources \
  -H "Authorization: Bearer $TOKEN"

# The seed's get, repeated (quietly) until the schema it shows is extracted.
for _ in $(seq 1 300); do
  curl $BASE/data-sources/$DS_ID \
    -H "Authorization: Bearer $TOKEN" >/dev/null
  [ "$(last .data.schema_status)" = extracting ] || break
  sleep 0.1
done
step "get data source"
curl $BASE/data-sources/$DS_ID \
  -H "Authorization: Bearer $TOKEN"

step "update data source"
curl -X PUT $BASE/data-sources/$DS_ID \
  -H "Authorization: Bearer $TOKEN" \
  -H "Content-Type: application/json" \
  -d '{
    "description": "Updated description with more context"
  }'

step "refresh schema"
curl -X POST $BASE/data-sources/$DS_ID/refresh-schema \
  -H "Authorization: Bearer $TOKEN"

step "execute query"
curl -X POST $BASE/data-sources/$DS_ID/query \
  -H "Authorization: Bearer $TOKEN" \
  -H "Content-Type: application/json" \
  -d '{
    "query": "SELECT * FROM customers WHERE created_at > $1 LIMIT 10",
    "parameters": ["2026-01-01"]
  }'

step "semantic mappings"
curl -X PATCH $BASE/data-sources/$DS_ID/semantic-mappings \
  -H "Authorization: Bearer $TOKEN" \
  -H "Content-Type: application/json" \
  -d '{
    "mappings": {
      "customers": {
        "description": "Customer accounts and profiles",
        "synonyms": ["users", "clients", "accounts", "members"]
      },
      "customers.created_at": {
        "description": "When the customer signed up",
        "synonyms": ["signup date", "registration date", "joined date"]
      },
      "orders": {
        "description": "Customer purchase orders",
        "synonyms": ["purchases", "transactions", "sales"]
      },
      "orders.total_amount": {
        "description": "Total order value in USD",
        "synonyms": ["order total", "purchase amount", "sale value"]
      }
    }
  }'

# A tool description read by the test between the mappings and the delete.
step "waiting for the test"
read -r _

step "delete data source"
curl -X DELETE $BASE/data-sources/$DS_ID \
  -H "Authorization: Bearer $TOKEN"

step "get it after the delete"
curl $BASE/data-sources/$DS_ID \
  -H "Authorization: Bearer $TOKEN"
