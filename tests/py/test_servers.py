"""Self-tests of the test servers in tests/servers/stk_servers.py (nginx, the S3
server, the fault-injecting server, the delaying proxy): each test fails when a
server misbehaves in a way the remote-dataset tests would trip over."""

import hashlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "servers"))

import stk_servers as S  # noqa: E402

BIG = 1 << 20


def blob(n, seed):
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}-{i}".encode()).digest()
        i += 1
    return bytes(out[:n])


@pytest.fixture(scope="module")
def www(tmp_path_factory):
    root = tmp_path_factory.mktemp("www")
    (root / "big.bin").write_bytes(blob(BIG, "big"))
    (root / "small.txt").write_bytes(b"0123456789abcdefghij")
    (root / "huge.bin").write_bytes(blob(16 << 20, "huge"))
    d = root / "sub dir"
    d.mkdir()
    (d / "f+g=h.bin").write_bytes(blob(1000, "fgh"))
    return root


def get(conn, path, headers=None, method="GET"):
    conn.request(method, urllib.parse.quote(path), headers=headers or {})
    r = conn.getresponse()
    return r, r.read()


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid, timeout=5.0):
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except ConnectionRefusedError:
        return True


def curl(*args):
    r = subprocess.run(["curl", "-sS", "--globoff", *args], capture_output=True, timeout=60)
    return r


# ---------------------------------------------------------------------------
# nginx


def test_nginx_ranges_keepalive_and_log(www):
    data = (www / "big.bin").read_bytes()
    with S.Nginx(www) as n:
        assert n.url == f"http://127.0.0.1:{n.port}"
        c = http.client.HTTPConnection("127.0.0.1", n.port)
        r, body = get(c, "/big.bin", {"Range": "bytes=10-19"})
        assert (r.status, body) == (206, data[10:20])
        assert r.getheader("Content-Range") == f"bytes 10-19/{BIG}"
        r, body = get(c, "/big.bin", {"Range": "bytes=-7"})
        assert (r.status, body) == (206, data[-7:])
        r, body = get(c, "/big.bin")
        assert (r.status, body) == (200, data)
        r, body = get(c, "/big.bin", {"Range": f"bytes={BIG}-"})
        assert r.status == 416
        r, body = get(c, "/sub dir/f+g=h.bin")
        assert (r.status, body) == (200, (www / "sub dir" / "f+g=h.bin").read_bytes())
        r, body = get(c, "/missing")
        assert r.status == 404
        c.close()
        log = n.requests(at_least=6)
        assert [e["status"] for e in log] == [206, 206, 200, 416, 200, 404]
        assert [e["range"] for e in log[:4]] == ["bytes=10-19", "bytes=-7", None, f"bytes={BIG}-"]
        assert [e["bytes"] for e in log[:3]] == [10, 7, BIG]
        assert log[4]["path"] == "/sub dir/f+g=h.bin"
        # one connection for all six (keep-alive)
        assert len({e["connection"] for e in log}) == 1
        assert [e["connection_requests"] for e in log] == [1, 2, 3, 4, 5, 6]
        assert all(e["method"] == "GET" and e["protocol"] == "HTTP/1.1" for e in log)
        n.clear_requests()
        assert n.requests(timeout=0) == []
        pid, port = n.proc.pid, n.port
    assert wait_gone(pid) and refused(port)


def test_nginx_http2_over_tls_multiplexes(www, tmp_path):
    with S.Nginx(www, http2=True, tls=True) as n:
        assert n.url.startswith("https://127.0.0.1:")
        outs = []
        args = ["--cacert", n.cafile, "--parallel", "-w", "%{http_version}\n"]
        for i in range(8):
            outs.append(tmp_path / f"o{i}")
            args += [f"{n.url}/big.bin", "-o", str(outs[-1])]
        r = curl(*args)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [b"2"] * 8
        for o in outs:
            assert o.read_bytes() == (www / "big.bin").read_bytes()
        log = n.requests(at_least=8)
        assert len(log) == 8
        assert {(e["protocol"], e["connection"]) for e in log} == {("HTTP/2.0", log[0]["connection"])}


def test_nginx_h2c_prior_knowledge(www):
    with S.Nginx(www, http2=True) as n:
        r = curl("--http2-prior-knowledge", "-o", "-", f"{n.url}/small.txt")
        assert (r.returncode, r.stdout) == (0, b"0123456789abcdefghij"), r.stderr
        assert n.requests(at_least=1)[0]["protocol"] == "HTTP/2.0"


def test_nginx_stops_when_the_test_fails(www):
    with pytest.raises(RuntimeError):
        with S.Nginx(www) as n:
            pid, port = n.proc.pid, n.port
            raise RuntimeError("test failed")
    assert wait_gone(pid) and refused(port)


def test_child_dies_with_the_parent(www, tmp_path):
    # kill -9 of the test process must not leave nginx running (its temporary
    # prefix stays: under tmp_path)
    code = (
        f"import sys; sys.path.insert(0, {os.path.dirname(S.__file__)!r}); import stk_servers as S, time\n"
        f"n = S.Nginx({str(www)!r}); n.start(); print(n.proc.pid, flush=True); time.sleep(60)\n"
    )
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
    pid = int(p.stdout.readline())
    assert pid_alive(pid)
    p.kill()
    p.wait()
    assert wait_gone(pid)


# ---------------------------------------------------------------------------
# S3 server

AK, SK = "AKIDSTOKERTEST", "s3cr/et+key=x"


@pytest.fixture(scope="module")
def s3():
    with S.S3Server(AK, SK, region="eu-west-3") as s:
        s.create_bucket("bkt")
        yield s


def curl_s3(s3, path, *extra, method="GET", secret=SK, sha_header=True, region=None):
    args = ["-o", "-", "-w", "\n%{http_code}", "--aws-sigv4", f"aws:amz:{region or s3.region}:s3",
            "--user", f"{AK}:{secret}", "-X", method]
    if sha_header:
        args += ["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]
    r = curl(*args, *extra, s3.endpoint + path)
    assert r.returncode == 0, r.stderr
    body, _, status = r.stdout.rpartition(b"\n")
    return int(status), body


def test_sigv4_matches_aws_example():
    # "GET Object" example of the AWS SigV4 documentation (Range bytes=0-9)
    import datetime

    h = S.sigv4_headers(
        "GET", "examplebucket.s3.amazonaws.com", "/test.txt", "", {"Range": "bytes=0-9"},
        hashlib.sha256(b"").hexdigest(), "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "us-east-1", now=datetime.datetime(2013, 5, 24, tzinfo=datetime.timezone.utc),
    )
    assert h["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )


def test_s3_put_with_python_get_with_curl_sigv4(s3, tmp_path):
    data = blob(300_000, "s3")
    etag = s3.put("bkt", "ds/shard-0.stk", data)
    assert etag.strip('"') == hashlib.md5(data).hexdigest()
    assert curl_s3(s3, "/bkt/ds/shard-0.stk") == (200, data)
    status, body = curl_s3(s3, "/bkt/ds/shard-0.stk", "-r", "100-199")
    assert (status, body) == (206, data[100:200])
    # and the other way round: PUT by curl, GET by the module
    f = tmp_path / "up.bin"
    f.write_bytes(data[:1000])
    assert curl_s3(s3, "/bkt/ds/from-curl", "--data-binary", f"@{f}", method="PUT")[0] == 200
    assert s3.get("bkt", "ds/from-curl") == data[:1000]


def test_s3_libcurl_rules(s3):
    """The three rules of FACTS.md, as curl 7.88's --aws-sigv4 shows them."""
    s3.put("bkt", "rules/plain", b"p")
    # 1. x-amz-content-sha256 must be added by the caller
    status, body = curl_s3(s3, "/bkt/rules/plain", sha_header=False)
    assert (status, S.s3_error_code(body)) == (400, "InvalidRequest")
    assert b"x-amz-content-sha256" in body
    assert curl_s3(s3, "/bkt/rules/plain") == (200, b"p")
    # 2. the query goes into the signature as it is: sorted, encoded
    status, body = curl_s3(s3, "/bkt?max-keys=1&list-type=2&prefix=rules%2F")
    assert (status, S.s3_error_code(body)) == (403, "SignatureDoesNotMatch")
    status, body = curl_s3(s3, "/bkt?list-type=2&max-keys=1&prefix=rules%2F")
    assert status == 200 and b"<Key>rules/plain</Key>" in body
    # 3. keys: RFC 3986 percent-encoding except unreserved and "/"
    for key in ("rules/a+b", "rules/a=b", "rules/caf\u00e9", "rules/x(1)!"):
        s3.put("bkt", key, key.encode())
        status, body = curl_s3(s3, "/bkt/" + key)
        assert (status, S.s3_error_code(body)) == (403, "SignatureDoesNotMatch"), key
        assert curl_s3(s3, S.s3_path("bkt", key)) == (200, key.encode()), key
    s3.put("bkt", "rules/a b~c", b"sp")
    assert curl_s3(s3, "/bkt/rules/a%20b~c") == (200, b"sp")
    # the region and service must be named: from "aws:amz" libcurl takes them
    # from the host name 127.0.0.1
    r = curl("-o", "-", "-w", "\n%{http_code}", "--aws-sigv4", "aws:amz", "--user", f"{AK}:{SK}",
             "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", s3.endpoint + "/bkt/rules/plain")
    body, _, status = r.stdout.rpartition(b"\n")
    assert (status, S.s3_error_code(body)) == (b"400", "AuthorizationHeaderMalformed")


def test_s3_wrong_secret_region_and_anonymous(s3):
    s3.put("bkt", "auth/x", b"x")
    s3.clear_requests()
    status, body = curl_s3(s3, "/bkt/auth/x", secret="wrong-secret")
    assert status == 403
    assert S.s3_error_code(body) == "SignatureDoesNotMatch"
    r = s3.request("GET", "bkt", "auth/x", secret_key="wrong")
    assert (r.status, S.s3_error_code(r.body)) == (403, "SignatureDoesNotMatch")
    r = s3.request("GET", "bkt", "auth/x", access_key="NOSUCHKEY")
    assert (r.status, S.s3_error_code(r.body)) == (403, "InvalidAccessKeyId")
    r = s3.request("GET", "bkt", "auth/x", region="us-east-1")
    assert (r.status, S.s3_error_code(r.body)) == (400, "AuthorizationHeaderMalformed")
    assert b"eu-west-3" in r.body
    r = s3.request("GET", "bkt", "auth/x", signed=False)
    assert (r.status, S.s3_error_code(r.body)) == (403, "AccessDenied")
    r = s3.request("GET", "nosuchbucket", "x")
    assert (r.status, S.s3_error_code(r.body)) == (404, "NoSuchBucket")
    r = s3.request("GET", "bkt", "auth/nope")
    assert (r.status, S.s3_error_code(r.body)) == (404, "NoSuchKey")
    log = s3.requests(at_least=7)
    assert [e["status"] for e in log] == [403, 403, 403, 400, 403, 404, 404]
    assert [e["signed"] for e in log] == [True] * 4 + [False] + [True] * 2


def test_s3_anonymous_read_option():
    with S.S3Server(AK, SK, anonymous_read=True) as s:
        s.create_bucket("pub")
        s.put("pub", "k", b"v")
        assert s.request("GET", "pub", "k", signed=False)[::2] == (200, b"v")
        assert s.request("PUT", "pub", "k2", body=b"v", signed=False).status == 403


def test_s3_listing_pages_with_continuation_tokens(s3):
    # keys whose S3 (UTF-8 byte) order differs from a directory walk's
    keys = [f"list/k{i:02d}" for i in range(17)] + [
        "list/a", "list/a b", "list/a-b", "list/a/c", "list/a0", "list/x+y=z", "list/caf\u00e9/\u65e5\u672c",
    ]
    for k in keys:
        s3.put("bkt", k, k.encode())
    want = sorted(keys, key=lambda k: k.encode())
    pages = list(s3.list_pages("bkt", prefix="list/", max_keys=5))
    assert [len(p[0]) for p in pages] == [5, 5, 5, 5, 4]
    assert all(tok for _, tok in pages[:-1]) and pages[-1][1] is None
    assert [k for p, _ in pages for k in p] == want
    assert s3.list("bkt", prefix="list/") == want
    # the same pages through curl's SigV4, tokens encoded per rule 2
    got, token = [], None
    for _ in range(10):
        q = {"list-type": "2", "max-keys": "5", "prefix": "list/"}
        if token:
            q["continuation-token"] = token
        status, body = curl_s3(s3, "/bkt?" + S.s3_query(q))
        assert status == 200, body
        got += [urllib.parse.unquote(k) for k in _xml_all(body, "Key")]
        tokens = _xml_all(body, "NextContinuationToken")
        if not tokens:
            break
        token = tokens[0]
    assert got == want


def _xml_all(body, tag):
    import xml.etree.ElementTree as ET

    return [el.text for el in ET.fromstring(body).iter() if el.tag.rsplit("}", 1)[-1] == tag]


def test_s3_special_keys_and_ranges(s3, tmp_path):
    data = blob(5000, "keys")
    for key in ("sp/a b.stk", "sp/a+b.stk", "sp/a=b.stk", "sp/\u00e9t\u00e9/\u65e5\u672c.stk", "sp/~x_-.stk"):
        s3.put("bkt", key, data)
        assert s3.get("bkt", key) == data
        assert curl_s3(s3, S.s3_path("bkt", key)) == (200, data)
    assert s3.get("bkt", "sp/a b.stk", range="bytes=-10") == data[-10:]
    assert s3.get("bkt", "sp/a b.stk", range="bytes=0-0") == data[:1]
    assert s3.get("bkt", "sp/a b.stk", range="bytes=4990-") == data[4990:]
    assert s3.get("bkt", "sp/a b.stk", range="bytes=4990-99999") == data[4990:]
    r = s3.request("GET", "bkt", "sp/a b.stk", headers={"Range": "bytes=5000-"})
    assert (r.status, S.s3_error_code(r.body)) == (416, "InvalidRange")
    r = s3.request("GET", "bkt", "sp/a b.stk", headers={"Range": "bytes=-10"})
    assert r.headers["content-range"] == "bytes 4990-4999/5000"
    r = s3.request("HEAD", "bkt", "sp/a b.stk")
    assert (r.status, r.headers["content-length"]) == (200, "5000")
    # a local tree
    src = tmp_path / "tree"
    (src / "x y").mkdir(parents=True)
    (src / "stoker.manifest").write_bytes(b"m")
    (src / "x y" / "s+1.stk").write_bytes(data)
    assert s3.put_dir("bkt", "tree", src) == ["tree/stoker.manifest", "tree/x y/s+1.stk"]
    assert s3.list("bkt", prefix="tree/") == ["tree/stoker.manifest", "tree/x y/s+1.stk"]
    assert s3.get("bkt", "tree/x y/s+1.stk") == data


def test_s3_stops(tmp_path):
    s = S.S3Server(AK, SK, directory=tmp_path / "data")
    with s:
        pid, port = s.proc.pid, s.port
        s.create_bucket("bk1")
        s.put("bk1", "k", b"v")
    assert wait_gone(pid) and refused(port)
    # data kept in an explicit directory: a new server sees it
    with S.S3Server(AK, SK, directory=tmp_path / "data") as s2:
        assert s2.get("bk1", "k") == b"v"


# ---------------------------------------------------------------------------
# FaultServer


def test_fault_server_serves_ranges_and_keeps_alive(www):
    data = (www / "big.bin").read_bytes()
    with S.FaultServer(www) as f:
        c = http.client.HTTPConnection("127.0.0.1", f.port)
        cases = [
            ({}, 200, data),
            ({"Range": "bytes=5-9"}, 206, data[5:10]),
            ({"Range": "bytes=-3"}, 206, data[-3:]),
            ({"Range": f"bytes={BIG - 2}-"}, 206, data[-2:]),
            ({"Range": f"bytes=0-{BIG + 50}"}, 206, data),
            ({"Range": "bytes=9-5"}, 200, data),  # invalid: ignored
            ({"Range": "bytes=0-1,4-5"}, 200, data),  # multi-range: ignored
        ]
        for headers, status, want in cases:
            r, body = get(c, "/big.bin", headers)
            assert (r.status, body) == (status, want), headers
        r, body = get(c, "/big.bin", {"Range": "bytes=5-9"})
        assert r.getheader("Content-Range") == f"bytes 5-9/{BIG}"
        r, body = get(c, "/big.bin", {"Range": f"bytes={BIG}-"})
        assert (r.status, r.getheader("Content-Range")) == (416, f"bytes */{BIG}")
        r, body = get(c, "/big.bin", method="HEAD")
        assert (r.status, r.getheader("Content-Length"), body) == (200, str(BIG), b"")
        r, body = get(c, "/sub dir/f+g=h.bin")
        assert (r.status, len(body)) == (200, 1000)
        r, body = get(c, "/nope.bin")
        assert r.status == 404 and S.s3_error_code(body) == "NoSuchKey"
        r, body = get(c, "/../../etc/passwd")
        assert r.status == 404
        log = f.requests()
        assert len(log) == len(cases) + 6
        assert len({e["connection"] for e in log}) == 1
        assert log[1] == {**log[1], "range": "bytes=5-9", "status": 206, "bytes": 5, "fault": None,
                          "completed": True}


def test_fault_first_attempt_503_retry_after(www):
    plan = [S.Fault("status", status=503, retry_after=1, first_attempts=1)]
    with S.FaultServer(www, plan) as f:
        c = http.client.HTTPConnection("127.0.0.1", f.port)
        for rng in ("bytes=0-9", "bytes=10-19"):
            r, body = get(c, "/big.bin", {"Range": rng})
            assert (r.status, r.getheader("Retry-After"), S.s3_error_code(body)) == (503, "1", "SlowDown")
            r, body = get(c, "/big.bin", {"Range": rng})
            assert r.status == 206 and len(body) == 10
        log = f.requests()
        assert [(e["status"], e["attempt"], e["fault"]) for e in log] == [
            (503, 1, "status"), (206, 2, None), (503, 1, "status"), (206, 2, None)
        ]
        assert len({e["connection"] for e in log}) == 1  # the error kept the connection


def test_fault_every_third_429(www):
    with S.FaultServer(www, [{"kind": "status", "status": 429, "every": 3}]) as f:
        c = http.client.HTTPConnection("127.0.0.1", f.port)
        statuses = []
        for i in range(9):
            r, body = get(c, "/small.txt")
            statuses.append(r.status)
            if r.status == 429:
                assert S.s3_error_code(body) == "SlowDown"
        assert statuses == [200, 200, 429] * 3


def test_fault_reset_after_half_the_body(www):
    with S.FaultServer(www, [S.Fault("reset", fraction=0.5, path="*.bin", times=1)]) as f:
        c = http.client.HTTPConnection("127.0.0.1", f.port)
        c.request("GET", "/big.bin")
        r = c.getresponse()
        assert r.status == 200 and r.getheader("Content-Length") == str(BIG)
        got = b""
        with pytest.raises((ConnectionResetError, http.client.IncompleteRead)):
            while True:
                chunk = r.read1(65536)
                if not chunk:
                    raise http.client.IncompleteRead(got)
                got += chunk
        assert len(got) <= BIG // 2
        c.close()
        c = http.client.HTTPConnection("127.0.0.1", f.port)
        assert get(c, "/big.bin")[1] == (www / "big.bin").read_bytes()  # times=1: once only
        log = f.requests()
        assert (log[0]["fault"], log[0]["bytes"], log[0]["completed"]) == ("reset", BIG // 2, False)
        assert (log[1]["fault"], log[1]["completed"]) == (None, True)


def test_fault_reset_before_the_headers(www):
    with S.FaultServer(www, [S.Fault("reset", fraction=None, first_attempts=1)]) as f:
        c = http.client.HTTPConnection("127.0.0.1", f.port)
        with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected)):
            get(c, "/small.txt")
        c.close()
        c = http.client.HTTPConnection("127.0.0.1", f.port)
        assert get(c, "/small.txt")[0].status == 200
        assert [e["status"] for e in f.requests()] == [None, 200]


def test_fault_truncated_body(www):
    with S.FaultServer(www, [S.Fault("truncate", fraction=0.25, first_attempts=1)]) as f:
        s = socket.create_connection(("127.0.0.1", f.port))
        s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=0-999\r\n\r\n")
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:  # FIN, not RST
                break
            got += chunk
        s.close()
        head, _, body = got.partition(b"\r\n\r\n")
        assert b"Content-Length: 1000" in head and b" 206 " in head
        assert body == (www / "big.bin").read_bytes()[:250]
        assert f.requests()[0]["bytes"] == 250


def test_fault_stall_before_and_during(www):
    plan = [S.Fault("stall", seconds=0.4, nth=[1]), S.Fault("stall", seconds=0.4, fraction=0.5, nth=[2])]
    with S.FaultServer(www, plan) as f:
        c = http.client.HTTPConnection("127.0.0.1", f.port)
        t = time.monotonic()
        assert get(c, "/small.txt")[0].status == 200
        assert time.monotonic() - t >= 0.4
        t = time.monotonic()
        c.request("GET", "/big.bin")
        r = c.getresponse()
        first = r.read(1000)
        t_first = time.monotonic() - t
        rest = r.read()
        assert time.monotonic() - t >= 0.4 and t_first < 0.35
        assert first + rest == (www / "big.bin").read_bytes()
        t = time.monotonic()
        assert get(c, "/small.txt")[0].status == 200
        assert time.monotonic() - t < 0.3
        assert [e["fault"] for e in f.requests()] == ["stall", "stall", None]


def test_fault_always_403_404_for_a_path(www):
    plan = [S.Fault("status", status=403, path="/sub dir/*"), S.Fault("status", status=404, path="/small.txt")]
    with S.FaultServer(www, plan) as f:
        c = http.client.HTTPConnection("127.0.0.1", f.port)
        for _ in range(3):
            r, body = get(c, "/sub dir/f+g=h.bin")
            assert (r.status, S.s3_error_code(body)) == (403, "AccessDenied")
            r, body = get(c, "/small.txt")
            assert (r.status, S.s3_error_code(body)) == (404, "NoSuchKey")
        assert get(c, "/big.bin")[0].status == 200
        f.set_plan([])
        assert get(c, "/small.txt")[0].status == 200


def test_fault_plan_validation():
    with pytest.raises(ValueError):
        S.Fault("explode")
    with pytest.raises(ValueError):
        S.Fault("status", every=2, first_attempts=1)
    with pytest.raises(ValueError):
        S.Fault("truncate", fraction=1.5)


def test_fault_server_64_concurrent_connections(www):
    data = (www / "big.bin").read_bytes()
    errors = []
    barrier = threading.Barrier(64)

    def client(i):
        try:
            c = http.client.HTTPConnection("127.0.0.1", f.port, timeout=30)
            barrier.wait()
            for k in range(4):
                lo = (i * 4 + k) * 1000
                r, body = get(c, "/big.bin", {"Range": f"bytes={lo}-{lo + 9999}"})
                assert (r.status, body) == (206, data[lo : lo + 10000])
            c.close()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    with S.FaultServer(www) as f:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
        t = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        elapsed = time.monotonic() - t
        assert not errors, errors[:3]
        log = f.requests()
        assert len(log) == 256 and len({e["connection"] for e in log}) == 64
        assert elapsed < 10


# ---------------------------------------------------------------------------
# DelayProxy


def test_proxy_adds_latency_and_passes_data(www):
    data = (www / "big.bin").read_bytes()
    with S.FaultServer(www) as f, S.DelayProxy("127.0.0.1", f.port, 30) as p:
        assert p.url == f"http://127.0.0.1:{p.port}"
        c = http.client.HTTPConnection("127.0.0.1", p.port)
        t = time.monotonic()
        r, body = get(c, "/small.txt")
        first = time.monotonic() - t
        t = time.monotonic()
        r, body = get(c, "/big.bin")
        second = time.monotonic() - t
        assert (r.status, body) == (200, data)
        # a new connection pays its handshake: 2 RTT; a reused one 1 RTT
        assert first >= 0.120
        assert 0.060 <= second < 0.5
        c.close()
        st = p.stats()
        assert st["connections"] == 1
        assert st["bytes_down"] >= BIG + 20 and 0 < st["bytes_up"] < 1000
    # without connect_rtt a new connection costs one RTT too (100 ms one way:
    # 200 ms, against 400 ms with it)
    with S.FaultServer(www) as f, S.DelayProxy("127.0.0.1", f.port, 100, connect_rtt=False) as p:
        c = http.client.HTTPConnection("127.0.0.1", p.port)
        t = time.monotonic()
        get(c, "/small.txt")
        assert 0.200 <= time.monotonic() - t < 0.390


def test_proxy_is_pipelined_not_stop_and_wait(www):
    # 16 MiB in one response at 50 ms one way: forwarding chunk by chunk with
    # a wait each would take seconds; pipelined it is one delay plus the copy
    data = (www / "huge.bin").read_bytes()
    with S.Nginx(www) as n, S.DelayProxy("127.0.0.1", n.port, 50, connect_rtt=False) as p:
        c = http.client.HTTPConnection("127.0.0.1", p.port)
        t = time.monotonic()
        r, body = get(c, "/huge.bin")
        elapsed = time.monotonic() - t
        assert body == data
        assert 0.1 <= elapsed < 1.5
        rate = len(data) / (elapsed - 0.1) / 1e6
        print(f"16 MiB through the proxy (RTT 100 ms): {elapsed:.3f} s, {rate:.0f} MB/s")


def test_proxy_throughput(www):
    with S.Nginx(www) as n, S.DelayProxy("127.0.0.1", n.port, 5) as p:
        r = curl("-o", "/dev/null", "-w", "%{speed_download}", f"{p.url}/huge.bin")
        assert r.returncode == 0, r.stderr
        speed = float(r.stdout)
        print(f"proxy throughput: {speed / 1e6:.0f} MB/s")
        assert speed > 50e6


def test_proxy_bandwidth_cap_per_connection(www):
    # 16 MiB at 64 Mbit/s (8 MB/s) a connection: about 2.1 s on one
    # connection, and two connections each get the cap (not half of it)
    data = (www / "huge.bin").read_bytes()
    assert S.parse_bandwidth("64Mbit") == 8e6 and S.parse_bandwidth("125MB/s") == 125e6
    with pytest.raises(ValueError):
        S.parse_bandwidth("fast")
    with S.Nginx(www) as n, S.DelayProxy("127.0.0.1", n.port, 1, connect_rtt=False,
                                         bandwidth="64Mbit") as p:
        def fetch(out):
            c = http.client.HTTPConnection("127.0.0.1", p.port, timeout=30)
            out.append(get(c, "/huge.bin")[1])
            c.close()

        got = []
        t = time.monotonic()
        fetch(got)
        one = time.monotonic() - t
        threads = [threading.Thread(target=fetch, args=(got,)) for _ in range(2)]
        t = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        two = time.monotonic() - t
        assert got == [data] * 3
        print(f"16 MiB at 64 Mbit/s: one connection {one:.2f} s, two at once {two:.2f} s")
        assert 2.0 <= one < 6.0
        assert 2.0 <= two < 1.6 * one


def test_proxy_64_concurrent_connections(www):
    data = (www / "small.txt").read_bytes()
    errors = []

    def client():
        try:
            c = http.client.HTTPConnection("127.0.0.1", p.port, timeout=30)
            for _ in range(3):
                r, body = get(c, "/small.txt")
                assert (r.status, body) == (200, data)
            c.close()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    with S.FaultServer(www) as f, S.DelayProxy("127.0.0.1", f.port, 20) as p:
        threads = [threading.Thread(target=client) for _ in range(64)]
        t = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        elapsed = time.monotonic() - t
        assert not errors, errors[:3]
        # concurrent, not queued: about 2 + 3 RTT, not 64 x that
        assert elapsed < 2.0
        deadline = time.monotonic() + 2
        while p.stats()["active"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.stats()["connections"] == 64 and p.stats()["active"] == 0


def test_proxy_passes_resets_and_short_bodies(www):
    plan = [S.Fault("reset", fraction=0.5, nth=[1]), S.Fault("truncate", fraction=0.5, nth=[2])]
    with S.FaultServer(www, plan) as f, S.DelayProxy("127.0.0.1", f.port, 10) as p:
        for _ in range(2):
            c = http.client.HTTPConnection("127.0.0.1", p.port, timeout=10)
            c.request("GET", "/big.bin")
            r = c.getresponse()
            with pytest.raises((ConnectionResetError, http.client.IncompleteRead)):
                r.read()
            c.close()
        c = http.client.HTTPConnection("127.0.0.1", p.port, timeout=10)
        assert get(c, "/big.bin")[1] == (www / "big.bin").read_bytes()


# ---------------------------------------------------------------------------
# the command line


def test_cli_servers_write_ready_files_and_stop_on_sigterm(www, tmp_path):
    plan = json.dumps([{"kind": "status", "status": 503, "first_attempts": 1}])
    flog = tmp_path / "fault.jsonl"
    stats = tmp_path / "proxy.json"
    with S.ServerProcess("fault", www, "--plan", plan, "--log", flog) as f:
        assert f.url == f"http://127.0.0.1:{f.port}"
        with S.ServerProcess("proxy", f.url, "--delay-ms", 5, "--stats-file", stats) as p:
            c = http.client.HTTPConnection("127.0.0.1", p.port)
            assert get(c, "/small.txt")[0].status == 503
            assert get(c, "/small.txt")[1] == (www / "small.txt").read_bytes()
            c.close()
            proxy_pid = p.pid
        assert wait_gone(proxy_pid)
        assert json.loads(stats.read_text())["connections"] == 1
    assert [json.loads(x)["status"] for x in flog.read_text().splitlines()] == [503, 200]

    with S.ServerProcess("nginx", www, "--tls", "--http2", "--cafile", tmp_path / "ca.pem") as n:
        r = curl("--cacert", str(tmp_path / "ca.pem"), "-o", "-", f"{n.url}/small.txt")
        assert n.url.startswith("https://") and r.stdout == b"0123456789abcdefghij"

    up = tmp_path / "up"
    (up / "d").mkdir(parents=True)
    (up / "d" / "a b.bin").write_bytes(b"ab")
    with S.ServerProcess("s3", "--access-key", AK, "--secret-key", SK, "--bucket", "empty",
                         "--upload", "data", "pre/fix", up) as s:
        client = S.S3Client(s.url, AK, SK)
        assert client.list("data") == ["pre/fix/d/a b.bin"]
        assert client.get("data", "pre/fix/d/a b.bin") == b"ab"
        assert client.list("empty") == []
        client.close()
        node = children(s.pid)
        assert len(node) == 1
    # the command's child (node) goes with it
    assert wait_gone(s.pid) and wait_gone(node[0])


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out
