"""Self-tests of the FaultServer's seeded random faults (Fault(...,
probability=p, seed=S)), its `ranged` selector, its fault_stats() / --stats-file and its bounded
request log (log_limit / --log-limit), which the network fault soak
(tests/c/test_netsoak.c) relies on: the same seed gives the same faults to the
same requests whatever order they arrive in, another seed other faults, and a
retry of a request is a fresh draw."""

import http.client
import json
import os
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SERVERS = os.path.join(os.path.dirname(HERE), "servers")
sys.path.insert(0, SERVERS)

import stk_servers as S  # noqa: E402


@pytest.fixture(scope="module")
def www(tmp_path_factory):
    root = tmp_path_factory.mktemp("www")
    (root / "f.bin").write_bytes(bytes(range(256)) * 16)
    return root


def _statuses(port, order, attempts=1):
    """GETs /f.bin with the ranges `order` (each `attempts` times in a row) on
    one connection; returns {(range, attempt): status}."""
    c = http.client.HTTPConnection("127.0.0.1", port)
    out = {}
    for k in order:
        for a in range(1, attempts + 1):
            c.request("GET", "/f.bin", headers={"Range": f"bytes={k}-{k + 9}"})
            r = c.getresponse()
            r.read()
            out[(k, a)] = r.status
    c.close()
    return out


def test_probability_draws_are_seeded_and_order_free(www):
    plan = [S.Fault("status", status=503, probability=0.3, seed=7)]
    forward = list(range(0, 400, 2))
    with S.FaultServer(www, plan, nodelay=True) as f:
        a = _statuses(f.port, forward, attempts=2)
        stats = f.fault_stats()
    # the same requests in another order, on a fresh server: the same faults
    with S.FaultServer(www, [S.Fault("status", status=503, probability=0.3, seed=7)], nodelay=True) as f:
        b = _statuses(f.port, forward[::-1], attempts=2)
    assert a == b
    failed = [key for key, st in a.items() if st == 503]
    # about 30 % of 400 attempts (binomial: 3.9 standard deviations either way)
    assert 85 <= len(failed) <= 155
    assert set(a.values()) == {206, 503}
    # a retry is a fresh draw: some first attempts failed and their second passed
    assert any(a[(k, 1)] == 503 and a[(k, 2)] == 206 for k in forward)
    assert stats == {"requests": 400, "rules": [{**stats["rules"][0], "kind": "status", "status": 503,
                                                 "seen": 400, "fired": len(failed)}]}
    # another seed: other requests fail
    with S.FaultServer(www, [S.Fault("status", status=503, probability=0.3, seed=8)], nodelay=True) as f:
        c = _statuses(f.port, forward, attempts=2)
    assert c != a


def test_probability_rules_draw_apart_and_bounds(www):
    # two rules with one seed: the second's draws are not the first's
    plan = [S.Fault("status", status=503, probability=0.5, seed=1, path="/none"),
            S.Fault("status", status=500, probability=0.5, seed=1)]
    lone = [S.Fault("status", status=500, probability=0.5, seed=1)]
    order = list(range(0, 200, 2))
    with S.FaultServer(www, plan, nodelay=True) as f:
        two = _statuses(f.port, order)
    with S.FaultServer(www, lone, nodelay=True) as f:
        one = _statuses(f.port, order)
    assert two != one
    with S.FaultServer(www, [S.Fault("reset", probability=0, seed=3)], nodelay=True) as f:
        assert set(_statuses(f.port, order).values()) == {206}
    with S.FaultServer(www, [S.Fault("status", probability=1, times=5)], nodelay=True) as f:
        got = _statuses(f.port, order)
        assert list(got.values()).count(503) == 5
    with pytest.raises(ValueError):
        S.Fault("status", probability=1.5)
    with pytest.raises(ValueError):
        S.Fault("status", probability=0.5, every=2)


def test_log_limit_keeps_the_last_entries(www):
    with S.FaultServer(www, log_limit=3, nodelay=True) as f:
        _statuses(f.port, range(0, 20, 2))
        log = f.requests()
        assert [e["range"] for e in log] == [f"bytes={k}-{k + 9}" for k in (14, 16, 18)]
        assert f.fault_stats()["requests"] == 10
    with S.FaultServer(www, log_limit=0, nodelay=True) as f:
        _statuses(f.port, range(0, 20, 2))
        assert f.requests() == []


def test_nodelay_answers_without_waiting_for_delayed_acks(www):
    # 100 requests on one kept-alive connection: headers and body are written
    # apart, and without TCP_NODELAY each response waits ~40 ms for an ACK
    with S.FaultServer(www, nodelay=True) as f:
        t = time.monotonic()
        _statuses(f.port, range(0, 200, 2))
        assert time.monotonic() - t < 2.0


def test_ranged_selects_by_the_range_header(www):
    plan = [S.Fault("status", status=500, ranged=False), S.Fault("status", status=502, ranged=True, path="/f.bin")]
    with S.FaultServer(www, plan, nodelay=True) as f:
        c = http.client.HTTPConnection("127.0.0.1", f.port)
        for headers, want in (({}, 500), ({"Range": "bytes=0-9"}, 502), ({}, 500)):
            c.request("GET", "/f.bin", headers=headers)
            r = c.getresponse()
            r.read()
            assert r.status == want
        c.close()
        rules = f.fault_stats()["rules"]
        assert [(r["seen"], r["fired"]) for r in rules] == [(2, 2), (1, 1)]


def test_command_line_stats_file(www, tmp_path):
    plan = json.dumps([{"kind": "status", "status": 503, "probability": 1, "times": 2, "seed": 4}])
    stats = tmp_path / "stats.json"
    with S.ServerProcess("fault", www, "--plan", plan, "--log-limit", "0", "--stats-file", stats,
                         "--nodelay") as p:
        got = _statuses(p.port, range(0, 10, 2))
        assert list(got.values()) == [503, 503, 206, 206, 206]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # rewritten every second
            if stats.exists() and json.loads(stats.read_text())["requests"] == 5:
                break
            time.sleep(0.1)
        s = json.loads(stats.read_text())
        assert s["requests"] == 5 and s["rules"][0]["fired"] == 2 and s["rules"][0]["seen"] == 5
    # and once more at exit
    assert json.loads(stats.read_text())["requests"] == 5
    # a bad plan is refused by the command line with the reason
    r = subprocess.run([sys.executable, os.path.join(SERVERS, "stk_servers.py"), "fault", str(www),
                        "--plan", '[{"kind": "status", "probability": 2}]', "--ready-file",
                        str(tmp_path / "r")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "probability 2" in r.stderr
