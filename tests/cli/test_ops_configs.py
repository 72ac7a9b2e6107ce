"""test_ops_configs.py - the Grafana dashboard and the Prometheus alerts in configs/ against what
`bulkshim metrics` really exports, with promtool checking and unit-testing the rules."""

import json
import os
import re
import subprocess

from harness import ROOT, Agent, Server, Shim, tmpdir
from harness_cli import cli_ok, need_tool

DASHBOARD = os.path.join(ROOT, "configs", "grafana", "bulkshim.json")
RULES = os.path.join(ROOT, "configs", "prometheus", "bulkshim-rules.yml")
RULES_TEST = os.path.join(ROOT, "tests", "ops", "bulkshim-rules.test.yml")
METRIC = re.compile(r"\bbulkshim_[a-z0-9_]+\b")


def _exported():
    """The sample names `bulkshim metrics` prints for a live segment with
    each kind of compartment: plain, in a pool, adaptive, in a fleet."""
    srv = Server()
    shim = Shim([{"name": "x", "destinations": ["127.0.0.1:%d" % srv.port],
                  "max_connections": 2}])
    with open(shim.config, "w") as f:
        f.write('segment = "%s";\n'
                'pools = ( { name = "db"; size = 4; reserved = 0; } );\n'
                'fleet = { redis = "127.0.0.1:9"; name = "dash"; };\n'
                'compartments = (\n'
                '  { name = "x"; destinations = [ "127.0.0.1:%d" ]; max_connections = 2; },\n'
                '  { name = "p"; destinations = [ "127.0.0.2:%d" ]; pool = "db";\n'
                '    guaranteed = 1; max_connections = 4; },\n'
                '  { name = "ad"; destinations = [ "127.0.0.3:%d" ]; max_inflight = 8;\n'
                '    adaptive = { min = 1; max = 8; }; },\n'
                '  { name = "fl"; destinations = [ "127.0.0.4:%d" ]; max_connections = 4;\n'
                '    fleet_limit = 8; fleet_floor = 1; }\n'
                ');\n' % ((shim.segment,) + (srv.port,) * 4))
    a = Agent(shim.env(log="off"))
    a("tcp(%d)" % srv.port)
    text = cli_ok("metrics", "-s", shim.segment)
    assert a.finish() == 0
    names = {re.split(r"[{ ]", l, 1)[0] for l in text.splitlines() if l and not l.startswith("#")}
    for want in ("bulkshim_compartment_in_use", "bulkshim_pool_free", "bulkshim_adaptive_limit",
                 "bulkshim_fleet_share"):
        assert want in names, (want, sorted(names))
    return names


def _targets(dash):
    for p in dash["panels"]:
        for sub in [p] + p.get("panels", []):
            for t in sub.get("targets", []):
                yield sub, t


def _promql_ok(exprs):
    """Has promtool parse every expression (Grafana's variables replaced) as a recording rule."""
    promtool = need_tool("promtool", "prometheus")
    if promtool is None:
        return
    path = os.path.join(tmpdir(), "dashboard-queries.yml")
    with open(path, "w") as f:
        f.write("groups:\n  - name: dashboard\n    rules:\n")
        for i, e in enumerate(exprs):
            e = e.replace("$__rate_interval", "5m").replace("$segment", ".*").replace(
                "$compartment", ".*")
            f.write("      - record: dashboard:q%d\n        expr: %s\n" % (i, json.dumps(e)))
    r = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, "a dashboard query does not parse: %s%s" % (r.stdout, r.stderr)


def test_grafana_dashboard_queries_only_name_metrics_bulkshim_exports():
    dash = json.load(open(DASHBOARD))
    exported = _exported()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables.get("datasource", {}).get("type") == "datasource" and \
        variables["datasource"]["query"] == "prometheus", "no Prometheus datasource variable"
    exprs, used = [], set()
    for panel, t in _targets(dash):
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert t["datasource"]["uid"] == "${datasource}", panel["title"]
        names = set(METRIC.findall(t["expr"]))
        assert names, "panel %r queries no bulkshim metric: %s" % (panel["title"], t["expr"])
        missing = names - exported
        assert not missing, "panel %r names %s, which bulkshim metrics does not export" % (
            panel["title"], sorted(missing))
        used |= names
        exprs.append(t["expr"])
    for v in ("segment", "compartment"):
        names = set(METRIC.findall(variables[v]["definition"]))
        assert names and names <= exported, (v, names)
    # The dashboard shows what is in use, the refusals, the waits and the replies.
    for want in ("bulkshim_compartment_in_use", "bulkshim_rejections_total",
                 "bulkshim_wait_seconds_bucket", "bulkshim_reply_seconds_bucket",
                 "bulkshim_compartment_live_limit", "bulkshim_compartment_inflight_live_limit",
                 "bulkshim_pool_free", "bulkshim_pool_borrowed", "bulkshim_pool_rejections_total",
                 "bulkshim_adaptive_limit", "bulkshim_adaptive_baseline_seconds",
                 "bulkshim_adaptive_edge", "bulkshim_adaptive_knee",
                 "bulkshim_fleet_share", "bulkshim_fleet_lease_age_seconds",
                 "bulkshim_fleet_redis_up", "bulkshim_kernel_attached",
                 "bulkshim_compartment_kernel"):
        assert want in used, "the dashboard does not show %s" % want
    kinds = {p["type"] for p, _ in _targets(dash)}
    assert "heatmap" in kinds, kinds
    _promql_ok(exprs)
    print("%d queries over %d metrics, all exported" % (len(exprs), len(used)))


def test_prometheus_rules_pass_promtool_and_each_alert_fires_and_clears():
    promtool = need_tool("promtool", "prometheus")
    assert promtool, "promtool is needed (package prometheus)"
    r = subprocess.run([promtool, "check", "rules", RULES], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, "promtool check rules: %s%s" % (r.stdout, r.stderr)
    r = subprocess.run([promtool, "test", "rules", os.path.basename(RULES_TEST)],
                       cwd=os.path.dirname(RULES_TEST), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, "promtool test rules: %s%s" % (r.stdout, r.stderr)
    text = open(RULES).read()
    alerts = re.findall(r"^\s*- alert: (\w+)", text, re.M)
    tests = open(RULES_TEST).read()
    for a in alerts:
        # Each alert is expected firing (exp_alerts with labels) and cleared (exp_alerts: []).
        blocks = [c for c in tests.split("- eval_time:")[1:]
                  if re.search(r"alertname: %s\n" % a, c)]
        assert any("exp_alerts: []" in b for b in blocks), "%s is never tested clearing" % a
        assert any("exp_labels" in b for b in blocks), "%s is never tested firing" % a
    missing = set(METRIC.findall(text)) - _exported()
    assert not missing, "the rules name metrics bulkshim does not export: %s" % sorted(missing)
    print("alerts %s: promtool check and test rules pass" % ", ".join(alerts))
