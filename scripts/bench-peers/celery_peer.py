"""The Celery peer of `make bench-peers`: the fleet's signed-callback job done the Celery way.

Each task claims `idempotency:{execution_id}` with `SET NX EX` in Redis, signs the seed's body
with HMAC-SHA256 (`X-Interactor-Signature`, `X-Interactor-Timestamp`, `X-Interactor-Request-Id`),
POSTs it to the receiver, and stores the result under the claim. The broker is the fleet's own
RabbitMQ, on a quorum queue, with `acks_late` (acked after the work) and publisher confirms.

  python celery_peer.py publish N    publishes N tasks (each confirmed) and exits
  celery -A celery_peer worker ...   runs them (fleet-bench starts it: prefork, 4 processes)

Settings (environment): PEER_QUEUE, PEER_KEY_PREFIX, PEER_RECEIVER_URL, PEER_SECRET,
PEER_AMQP_URL (amqp://guest:guest@127.0.0.1:5672//), PEER_REDIS_URL (redis://127.0.0.1:6379).
"""

import datetime
import hashlib
import hmac
import json
import os
import sys

import redis
import requests
from celery import Celery

QUEUE = os.environ.get("PEER_QUEUE", "bench-celery")
KEY_PREFIX = os.environ.get("PEER_KEY_PREFIX", "bench-celery:")
RECEIVER_URL = os.environ.get("PEER_RECEIVER_URL", "http://127.0.0.1:9/bench")
SECRET = os.environ.get("PEER_SECRET", "bench_secret_0123456789").encode()
CLAIM_TTL_SECONDS = 7 * 24 * 3600

app = Celery("celery_peer", broker=os.environ.get("PEER_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_ignore_result=True,
    task_default_queue=QUEUE,
    task_default_queue_type="quorum",
    task_serializer="json",
    accept_content=["json"],
    broker_transport_options={"confirm_publish": True},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

# One Redis client and one HTTP session per worker process (created after the prefork fork).
_redis = None
_http = None


def clients():
    global _redis, _http
    if _redis is None:
        _redis = redis.Redis.from_url(os.environ.get("PEER_REDIS_URL", "redis://127.0.0.1:6379"))
        _http = requests.Session()
    return _redis, _http


@app.task(name="call_tool", bind=True, max_retries=5)
def call_tool(self, execution_id, tool_name, parameters, room_id, assistant_id):
    store, http = clients()
    key = f"{KEY_PREFIX}idempotency:{execution_id}"
    if not store.set(key, "running", nx=True, ex=CLAIM_TTL_SECONDS):
        return
    timestamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    body = json.dumps(
        {
            "tool_name": tool_name,
            "parameters": parameters,
            "execution_id": execution_id,
            "room_id": room_id,
            "assistant_id": assistant_id,
            "timestamp": timestamp,
        },
        separators=(",", ":"),
    ).encode()
    signature = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "X-Interactor-Signature": signature,
        "X-Interactor-Timestamp": timestamp,
        "X-Interactor-Request-Id": execution_id,
    }
    try:
        response = http.post(RECEIVER_URL, data=body, headers=headers, timeout=30)
        response.raise_for_status()
    except requests.RequestException as e:
        store.delete(key)
        raise self.retry(exc=e, countdown=2**self.request.retries)
    store.set(key, json.dumps({"status": "done", "result": response.json()}), ex=CLAIM_TTL_SECONDS)


def publish(count, run):
    with app.producer_or_acquire() as producer:
        for n in range(count):
            call_tool.apply_async(
                args=[f"celery_{run}_{n}", "bench", {"query": "benchmark payload", "n": n}, "room_1", "asst_1"],
                producer=producer,
            )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "publish":
        publish(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit("usage: celery_peer.py publish COUNT RUN_ID")
