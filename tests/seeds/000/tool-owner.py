# Seed 000's "Verify Tool Callback Signature" in Python: its `verify_tool_callback` and Flask
# handler exactly as the seed writes them, with the helpers the seed leaves to the reader
# (`search_products` and the idempotency store) filled in. Run by tests/tests/fleet/seed_agents.rs as
# the tool owner of `search_products`, with TOOL_CALLBACK_SECRET and PORT in the environment; it
# prints one line per callback it handled.
import os
import hmac
import hashlib
import time
from datetime import datetime
from flask import Flask, request, jsonify

app = Flask(__name__)

def verify_tool_callback(
    payload: bytes,
    signature: str,
    timestamp: str,
    secret: str,
    max_age_seconds: int = 300
) -> tuple[bool, str | None]:
    """
    Verify callback with replay protection.
    Returns (is_valid, error_message).
    """
    # 1. Check timestamp is not too old
    try:
        request_time = datetime.fromisoformat(timestamp.replace('Z', '+00:00'))
        age_seconds = abs((datetime.now(request_time.tzinfo) - request_time).total_seconds())

        if age_seconds > max_age_seconds:
            return False, f'Request too old: {age_seconds}s > {max_age_seconds}s'
    except ValueError as e:
        return False, f'Invalid timestamp: {e}'

    # 2. Verify HMAC signature
    expected = hmac.new(
        secret.encode(),
        payload,
        hashlib.sha256
    ).hexdigest()

    signature_value = signature.replace('sha256=', '')
    if not hmac.compare_digest(signature_value, expected):
        return False, 'Invalid signature'

    return True, None

@app.route('/api/tools/search_products', methods=['POST'])
def handle_tool_callback():
    signature = request.headers.get('X-Interactor-Signature', '')
    timestamp = request.headers.get('X-Interactor-Timestamp', '')
    request_id = request.headers.get('X-Interactor-Request-Id', '')
    payload = request.get_data()

    # Verify signature and timestamp
    is_valid, error = verify_tool_callback(
        payload,
        signature,
        timestamp,
        os.environ['TOOL_CALLBACK_SECRET']
    )

    if not is_valid:
        app.logger.error(f'Callback verification failed: {error}', extra={'request_id': request_id})
        print(f'rejected {request_id}: {error}', flush=True)
        return jsonify({'error': error}), 401

    data = request.get_json()

    # Idempotency check
    if is_duplicate_execution(data['execution_id']):
        return jsonify({'result': get_cached_result(data['execution_id'])}), 200

    # Execute your tool logic
    result = search_products(data['parameters'])

    # Store for idempotency
    store_execution_result(data['execution_id'], result)

    print(f"verified {request_id} room={data['room_id']} assistant={data['assistant_id']} "
          f"parameters={data['parameters']}", flush=True)
    return jsonify({'result': result})

# ---- what the seed leaves to the reader ----

_results = {}

def is_duplicate_execution(execution_id):
    return execution_id in _results

def get_cached_result(execution_id):
    return _results[execution_id]

def store_execution_result(execution_id, result):
    _results[execution_id] = result

def search_products(parameters):
    # The seed's example answer.
    return {
        "products": [
            {"id": "prod_1", "name": "MacBook Pro 14\"", "price": 1999, "in_stock": True},
            {"id": "prod_2", "name": "Dell XPS 15", "price": 1499, "in_stock": True},
        ],
        "total_count": 2,
    }

if __name__ == '__main__':
    app.run(host='127.0.0.1', port=int(os.environ['PORT']))
