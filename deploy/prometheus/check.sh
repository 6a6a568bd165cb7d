#!/usr/bin/env bash
# Checks the fleet's monitoring assets:
#   deploy/prometheus/alerts.yml        promtool check rules
#   deploy/prometheus/alerts_test.yml   promtool test rules (unit tests of every alert)
#   deploy/grafana/fleet-dashboard.json structure, metric names, and that every
#                                       panel query parses as PromQL (via promtool)
# Every fleet_* metric named in the dashboard, the rules or the rule tests must
# be one the processes export (KNOWN_METRICS below).
#
# Usage (from anywhere; paths are resolved from the repository root):
#   bash deploy/prometheus/check.sh
# Installs promtool from the Debian `prometheus` package when it is not on PATH.
# Last line: "monitoring: N passed, M failed"; exits non-zero when M > 0.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

RULES=deploy/prometheus/alerts.yml
TESTS=deploy/prometheus/alerts_test.yml
DASHBOARD=deploy/grafana/fleet-dashboard.json

# Metrics the dispatcher and workers export (histograms by base name; their
# _bucket/_sum/_count series are accepted too).
KNOWN_METRICS="
fleet_build_info
fleet_broker_connected
fleet_jobs_published_total
fleet_jobs_started_total
fleet_jobs_finished_total
fleet_attempt_duration_seconds
fleet_job_latency_seconds
fleet_callback_responses_total
fleet_jobs_in_flight
fleet_queue_messages
fleet_queue_consumers
fleet_oldest_job_age_seconds
fleet_idempotency_hits_total
fleet_retries_scheduled_total
fleet_dead_letters_total
fleet_dead_letters_stored
fleet_amqp_reconnects_total
fleet_amqp_errors_total
fleet_redis_errors_total
fleet_http_requests_total
fleet_http_request_duration_seconds
fleet_llm_request_duration_seconds
fleet_llm_tokens_total
fleet_llm_tenant_tokens_total
fleet_tool_circuit_open
fleet_tool_circuit_events_total
fleet_llm_budget_used_total
fleet_llm_budget_limit
fleet_llm_budget_parked_total
fleet_llm_budget_wait_seconds
fleet_llm_rate_limited_total
"
HISTOGRAMS="
fleet_llm_budget_wait_seconds
fleet_attempt_duration_seconds
fleet_job_latency_seconds
fleet_http_request_duration_seconds
fleet_llm_request_duration_seconds
"
# Alerts that must exist in the rules and be unit-tested.
REQUIRED_ALERTS="
FleetDeadLetterQueueGrowing
FleetNoConsumersWithBacklog
FleetErrorRatioHigh
FleetOldestJobAgeHigh
FleetWorkerDown
FleetBrokerDisconnected
FleetRedisErrors
FleetToolCircuitOpen
FleetLlmBudgetWaitHigh
"

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok   - $*"; }
fail() { failed=$((failed + 1)); echo "FAIL - $*"; }

TMP="$(mktemp -d)"
CREATED_POLICY_RC=""
cleanup() {
  rm -rf "$TMP"
  if [ -n "$CREATED_POLICY_RC" ]; then rm -f /usr/sbin/policy-rc.d; fi
}
trap cleanup EXIT

# ---------------------------------------------------------------- promtool
install_promtool() {
  if command -v promtool >/dev/null 2>&1; then
    return 0
  fi
  echo "promtool not on PATH: installing the Debian 'prometheus' package (once)"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      echo "not root and no sudo: install promtool (Debian package 'prometheus') by hand" >&2
      return 1
    fi
  fi
  # Only promtool is wanted: keep the package's Prometheus server from being
  # started by its postinst (it would listen on :9090, the worker's default
  # port). policy-rc.d is Debian's standard switch for that; it is removed again
  # on exit if this script created it.
  if [ -z "$sudo" ] && [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    CREATED_POLICY_RC=1
  fi
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  command -v promtool >/dev/null 2>&1
}

have_promtool=0
if install_promtool; then
  have_promtool=1
  pass "promtool available ($(promtool --version 2>&1 | head -n1))"
else
  fail "promtool could not be installed"
fi

run_promtool() { # description, args...
  local what="$1"; shift
  local out
  if [ "$have_promtool" -ne 1 ]; then
    fail "$what (no promtool)"
    return
  fi
  if out="$(promtool "$@" 2>&1)"; then
    printf '%s\n' "$out" | sed 's/^/    /'
    pass "$what"
  else
    printf '%s\n' "$out" | sed 's/^/    /'
    fail "$what"
  fi
}

run_promtool "promtool check rules $RULES" check rules "$RULES"
run_promtool "promtool test rules $TESTS" test rules "$TESTS"

# ---------------------------------------------------------------- python checks
# Prints "ok   - ..." / "FAIL - ..." lines; writes the dashboard's queries as
# recording rules to $TMP/dashboard_queries.yml so promtool can parse them.
set +e
py_out="$(
  KNOWN_METRICS="$KNOWN_METRICS" HISTOGRAMS="$HISTOGRAMS" REQUIRED_ALERTS="$REQUIRED_ALERTS" \
  python3 - "$DASHBOARD" "$RULES" "$TESTS" "$TMP/dashboard_queries.yml" <<'PY' 2>&1
import json, os, re, sys

dash_path, rules_path, tests_path, queries_out = sys.argv[1:5]
base = set(os.environ["KNOWN_METRICS"].split())
hist = set(os.environ["HISTOGRAMS"].split())
assert hist <= base
known = set(base)
for h in hist:
    known |= {h + "_bucket", h + "_sum", h + "_count"}
required_alerts = os.environ["REQUIRED_ALERTS"].split()

def report(ok, what, detail=""):
    print(("ok   - " if ok else "FAIL - ") + what + (f": {detail}" if detail and not ok else ""))

METRIC_RE = re.compile(r"(?<![A-Za-z0-9_:])fleet_[A-Za-z0-9_]+")

def unknown_metrics(text):
    return sorted({m for m in METRIC_RE.findall(text) if m not in known})

# --- dashboard -------------------------------------------------------------
try:
    with open(dash_path) as f:
        dash = json.load(f)
    report(True, f"{dash_path} parses as JSON")
except Exception as e:  # noqa: BLE001
    report(False, f"{dash_path} parses as JSON", str(e))
    dash = None

if dash is not None:
    problems = []
    if dash.get("uid") != "agent-fleet":
        problems.append(f"uid is {dash.get('uid')!r}")
    if dash.get("schemaVersion") != 39:
        problems.append(f"schemaVersion is {dash.get('schemaVersion')!r}")
    if not dash.get("title"):
        problems.append("no title")
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append("no `datasource` variable of type datasource/prometheus")
    kind = variables.get("kind")
    if not kind or kind.get("datasource", {}).get("uid") != "${datasource}":
        problems.append("no `kind` variable querying ${datasource}")
    report(not problems, "dashboard uid, schemaVersion and template variables", "; ".join(problems))

    def all_panels(panels):
        for p in panels:
            yield p
            yield from all_panels(p.get("panels", []))

    panels = list(all_panels(dash.get("panels", [])))
    problems = []
    queries = []
    for p in panels:
        pid = p.get("id")
        if not str(p.get("title", "")).strip():
            problems.append(f"panel {pid} has no title")
        if p.get("type") == "row":
            continue  # rows only group panels
        targets = p.get("targets") or []
        if not targets:
            problems.append(f"panel {pid} {p.get('title')!r} has no targets")
        for t in targets:
            expr = str(t.get("expr", "")).strip()
            if not expr:
                problems.append(f"panel {pid} target {t.get('refId')} has no expr")
            else:
                queries.append((pid, t.get("refId", "X"), expr))
    report(bool(panels) and not problems, f"every panel has a title and targets ({len(panels)} panels, {len(queries)} queries)",
           "; ".join(problems))

    problems = []
    ids = [p.get("id") for p in panels]
    if len(ids) != len(set(ids)) or None in ids:
        problems.append(f"panel ids not unique: {ids}")
    cells = {}
    for p in panels:
        g = p.get("gridPos") or {}
        if not all(isinstance(g.get(k), int) for k in "hwxy"):
            problems.append(f"panel {p.get('id')} has no gridPos")
            continue
        if g["x"] < 0 or g["x"] + g["w"] > 24:
            problems.append(f"panel {p.get('id')} is wider than the grid")
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells:
                    problems.append(f"panels {cells[(x, y)]} and {p.get('id')} overlap")
                    break
                cells[(x, y)] = p.get("id")
            else:
                continue
            break
    report(not problems, "panel ids unique and panels laid out without overlap", "; ".join(problems))

    problems = []
    for p in panels:
        if p.get("type") == "row":
            continue
        for obj in [p] + list(p.get("targets") or []):
            d = obj.get("datasource")
            if not isinstance(d, dict) or d.get("uid") != "${datasource}":
                problems.append(f"panel {p.get('id')} uses datasource {d!r}")
    report(not problems, "every panel and query uses the ${datasource} variable", "; ".join(sorted(set(problems))))

    bad = unknown_metrics(json.dumps(dash))
    report(not bad, "every fleet_ metric in the dashboard is exported", ", ".join(bad))
    used = set(METRIC_RE.findall(json.dumps(dash)))
    used_base = {re.sub(r"_(bucket|sum|count)$", "", m) if re.sub(r"_(bucket|sum|count)$", "", m) in hist else m for m in used}
    missing = sorted(base - used_base)
    report(not missing, "the dashboard shows every exported fleet_ metric", ", ".join(missing))

    # Dashboard queries -> recording rules (JSON is valid YAML) for promtool.
    subst = [("$__rate_interval", "5m"), ("$__interval", "1m"), ("$__range", "1h"),
             ("${kind}", ".*"), ("$kind", ".*")]
    # Hidden constants the Helm chart sets to its release (job labels, namespace, queue prefix).
    constants = {v["name"]: v.get("query", "") for v in dash.get("templating", {}).get("list", [])
                 if v.get("type") == "constant"}
    for name, value in sorted(constants.items(), key=lambda kv: -len(kv[0])):
        subst += [("${" + name + "}", value), ("$" + name, value)]
    problems = []
    for name in ("dispatcher_job", "worker_job", "namespace", "queue_prefix"):
        if name not in constants:
            problems.append(f"no constant variable {name}")
    # Every series selector is scoped to the release: a job matcher on the two job variables
    # and the namespace variable (so two fleets in one Prometheus do not mix).
    selector = re.compile(r'(?<![A-Za-z0-9_:])(fleet_[A-Za-z0-9_]+|up)(\{[^}]*\})?(?![A-Za-z0-9_(])')
    for pid, ref, expr in queries:
        for m in selector.finditer(expr):
            sel = m.group(2) or ""
            if not re.search(r'job=~?"[^"]*\$(dispatcher_job|worker_job)', sel) or 'namespace=~"$namespace"' not in sel:
                problems.append(f"panel {pid}/{ref}: {m.group(0)} is not scoped by $dispatcher_job/$worker_job and $namespace")
            if "queue=~" in sel and "${queue_prefix}" not in sel:
                problems.append(f"panel {pid}/{ref}: {m.group(0)} names queues without ${{queue_prefix}}")
    report(not problems, "every dashboard selector is scoped to the release (job, namespace, queue prefix)",
           "; ".join(problems))
    rules, problems = [], []
    for pid, ref, expr in queries:
        e = expr
        for a, b in subst:
            e = e.replace(a, b)
        if "$" in e:
            problems.append(f"panel {pid}/{ref} uses an unknown variable: {expr}")
        rules.append({"record": f"dashboard:panel_{pid}:{ref}", "expr": e})
    with open(queries_out, "w") as f:
        json.dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}, f, indent=1)
    report(not problems, "dashboard queries use only known template variables", "; ".join(problems))

# --- rules -----------------------------------------------------------------
with open(rules_path) as f:
    rules_text = f.read()
bad = unknown_metrics(rules_text)
report(not bad, f"every fleet_ metric in {rules_path} is exported", ", ".join(bad))

# Line-based view of the rules (no YAML library needed): one block per alert.
blocks, cur = [], None
for line in rules_text.splitlines():
    m = re.match(r"^\s*- alert:\s*(\S+)\s*$", line)
    if m:
        cur = [m.group(1), []]
        blocks.append(cur)
    elif re.match(r"^\s*- (name|record):", line):
        cur = None
    elif cur is not None:
        cur[1].append(line)
problems = []
for name, lines in blocks:
    body = "\n".join(lines)
    if not re.search(r"^\s+severity:\s*[\"']?(critical|warning|info)[\"']?\s*$", body, re.M):
        problems.append(f"{name}: no severity label (critical|warning|info)")
    for ann in ("summary", "description", "runbook"):
        if not re.search(rf"^\s+{ann}:\s*\S", body, re.M):
            problems.append(f"{name}: no {ann} annotation")
names = {n for n, _ in blocks}
for a in required_alerts:
    if a not in names:
        problems.append(f"{a}: missing")
report(bool(blocks) and not problems,
       f"{len(blocks)} alert rules carry severity, summary, description and runbook; all required alerts present",
       "; ".join(problems))

# --- rule tests --------------------------------------------------------------
with open(tests_path) as f:
    tests_text = f.read()
bad = unknown_metrics(tests_text)
report(not bad, f"every fleet_ metric in {tests_path} is exported", ", ".join(bad))

firing, quiet = set(), set()
for chunk in re.split(r"^\s*- eval_time:", tests_text, flags=re.M)[1:]:
    m = re.search(r"^\s*alertname:\s*(\S+)", chunk, re.M)
    if not m:
        continue
    if re.search(r"^\s*(- )?exp_labels:", chunk, re.M):
        firing.add(m.group(1))
    elif re.search(r"^\s*exp_alerts:\s*\[\]", chunk, re.M) or not re.search(r"exp_alerts:", chunk):
        quiet.add(m.group(1))
problems = [f"{n}: no firing case" for n in sorted(names) if n not in firing]
report(not problems, f"every alert has a firing unit test ({len(quiet & names)} also have a not-firing case)",
       "; ".join(problems))
PY
)"
py_rc=$?
set -e
printf '%s\n' "$py_out"
py_pass=$(printf '%s\n' "$py_out" | grep -c '^ok   - ' || true)
py_fail=$(printf '%s\n' "$py_out" | grep -c '^FAIL - ' || true)
passed=$((passed + py_pass))
failed=$((failed + py_fail))
if [ "$py_rc" -ne 0 ]; then
  fail "python checks exited with status $py_rc"
fi

if [ -f "$TMP/dashboard_queries.yml" ]; then
  run_promtool "every dashboard query parses as PromQL" check rules "$TMP/dashboard_queries.yml"
else
  fail "every dashboard query parses as PromQL (queries not extracted)"
fi

echo "monitoring: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
