#!/usr/bin/python3
"""Test servers for stoker's remote datasets (HTTP, S3), on loopback only.

Python's standard library only (plus the nginx and node programs that
scripts/install-deps.sh installs). Each class is a context manager: it binds
127.0.0.1, starts in well under a second or two, and `__exit__` stops it, also
when the test fails. Child processes (nginx, node) are started through
`setpriv --pdeathsig KILL`, so they die with the thread that started them even
when this process is killed: start servers from a thread that outlives them
(normally the main thread).

Nginx(root, http2=False, port=None, access_log=None, tls=False, redirects=None, autoindex=None)
    redirects: {path: url}: each path (exact) answers 302 to url.
    autoindex: "html" or "json": directories answer nginx's index pages in that
    format (autoindex on); None: off.
    nginx in the foreground (one process, `daemon off; master_process off`) from a
    temporary prefix, serving the directory `root`: byte ranges, keep-alive
    (1,000,000 requests, 300 s), sendfile. tls=True serves HTTPS with a fresh
    self-signed certificate for 127.0.0.1 (.cafile: give it to CURLOPT_CAINFO);
    with http2=True as well, ALPN offers h2 and http/1.1: that is the way to
    test HTTP/2 multiplexing with libcurl 7.88. http2=True without tls: the port
    speaks h2c with prior knowledge only (HTTP/1.x clients are refused), and
    libcurl 7.88 fails every request after the first on such a connection
    ("Error in the HTTP2 framing layer", curl issue #10634, fixed in 8.0 by PR
    #10643; Debian 12's 7.88.1-10+deb12u14 has the bug).
    .url ("http://127.0.0.1:PORT" or "https://..."), .port, .root, .cafile
    (None without tls), .access_log (path)
    .requests(at_least=0, timeout=5.0) -> list of dicts, one per request since
        start or the last clear_requests(), oldest first: method, path (decoded),
        uri (as sent, with the query), status, range (the Range header or None),
        bytes (body bytes sent), bytes_total (with headers), connection (nginx's
        connection serial number: equal numbers = one reused connection),
        connection_requests, protocol ("HTTP/1.1", "HTTP/2.0"), completed (bool),
        time (epoch s), request_time (s). nginx writes an entry after the
        response, so `at_least` waits (up to `timeout`) for that many.
    .clear_requests()

S3Server(access_key="stoker-test-key", secret_key="stoker-test-secret",
         region="us-east-1", port=None, directory=None, anonymous_read=False)
    @20minutes/s3rver 4.0.4 under `node --openssl-legacy-provider`, launched by
    s3rver_launcher.js next to this file: SigV4 checked with the one key pair
    given; path-style URLs only (http://127.0.0.1:PORT/BUCKET/KEY). The launcher
    makes it stricter than stock s3rver, as S3 is: unsigned requests get 403
    AccessDenied (unless anonymous_read, then GET/HEAD pass), a credential scope
    with another region gets 400 AuthorizationHeaderMalformed; single ranges
    (suffix `bytes=-N`, `bytes=0-0`) are served right, 416 past the end; listings
    come in UTF-8 byte order and page without losing keys. Still unlike S3: it
    ignores If-Match, and the canonical query uses JavaScript's
    encodeURIComponent, which leaves !'()* unencoded (avoid them in query values).
    Data lives in a temporary directory unless `directory` is given.
    .endpoint ("http://127.0.0.1:PORT"), .port, .access_key, .secret_key, .region,
    .directory, .requests(at_least=0, timeout=5.0) and .clear_requests(): a
    request log as Nginx's (method, path, uri, status, range, bytes, completed,
    signed, time, request_time), read once no request is in progress (or after
    timeout); and the methods of S3Client:

S3Client(endpoint, access_key, secret_key, region="us-east-1")
    A small path-style S3 client with its own SigV4 (hashlib/hmac), for a server
    started elsewhere (e.g. ServerProcess("s3", ...)); one keep-alive connection,
    thread-safe. .close() closes it.
    .create_bucket(name)
    .put(bucket, key, data) -> ETag;  .put_file(bucket, key, path) -> ETag
    .put_dir(bucket, prefix, local_dir) -> sorted list of keys: every file under
        local_dir, key = prefix + "/" + its path relative to local_dir ("/" as
        separator; no "/" added when prefix is "" or ends with "/")
    .get(bucket, key, range=None) -> bytes (raises S3Error on a non-2xx answer)
    .list(bucket, prefix="", max_keys=None) -> all keys, following continuation
        tokens; .list_pages(...) yields (keys, next_token) per page
    .delete(bucket, key)
    .request(method, bucket="", key="", query=(), headers=None, body=b"",
             access_key=None, secret_key=None, region=None, signed=True)
        -> S3Response(status, headers (lower-case names), body): one SigV4-signed
        request, with other credentials or region when given.
    S3Error (raised by the helpers): .status, .code (the XML <Code>), .response.
    Module functions for other clients: sigv4_headers(...), s3_path(bucket, key),
    s3_query(pairs), s3_error_code(body).

FaultServer(root, plan=(), port=None)
    http.server.ThreadingHTTPServer (HTTP/1.1, keep-alive, a thread per
    connection, listen backlog 256) serving files under `root` for GET and HEAD:
    200, or 206 + Content-Range for one valid range (`a-b`, `a-`, `-n`), 416 +
    `Content-Range: bytes */SIZE` when unsatisfiable; a malformed or multi-range
    header is ignored (200). Missing files: 404 with an S3-style XML body.
    `plan` is a list of Fault(...) (or dicts of Fault's arguments): for each
    request the first rule that fires is applied. Fault(kind, ...):
      kind "status": answer `status` (default 503) with an S3-style XML error
          body (Code: `code`, by default SlowDown for 503 and 429, AccessDenied
          403, NoSuchKey 404, InternalError otherwise), `Retry-After:
          retry_after` when given; the connection stays open unless close=True.
      kind "reset": send the headers and `fraction` (default 0.5) of the body,
          then reset the connection (RST); fraction=None resets before any byte.
      kind "truncate": Content-Length says N, send `fraction` (default 0.5) of
          it, then close (FIN).
      kind "stall": wait `seconds` (default 1.0) before answering, or, with
          `fraction` given, after sending that part of the body; then answer in full.
      kind "trickle": answer in full, but send the body at `rate` bytes/s
          (default 1024) in pieces of at most 256 bytes: slow, never stalled.
      Which requests: `path` (an fnmatch pattern on the decoded path, e.g.
      "/ds/shard-0003.stk" or "*.stk"; None = all), `method` ("GET"/"HEAD")
      and `ranged` (True: only requests with a Range header, False: only
      those without, e.g. whole-object downloads; a string: only requests
      with that Range header, e.g. "bytes=0-999", a shard's download into
      the cache in one part; None = both) select; then
      at most one of
          first_attempts=N  the first N attempts of each distinct request
                            (method, path, Range header)
          every=N           every Nth request this rule selects (N, 2N, ...)
          nth=[i, ...]      the i-th requests this rule selects (1-based)
          probability=p     each attempt with chance p, decided by a hash of
                            (`seed`, the rule's place in the plan, method,
                            path, Range header, attempt number): the same
                            requests get the same faults whatever order they
                            arrive in, and a retry is a fresh draw
      (none of them: every selected request), and `times=N` caps how often the
      rule fires in all. Each rule counts the requests it selects whether or not
      an earlier rule fired. Examples:
          Fault("status", status=503, retry_after=1, first_attempts=1)
          Fault("status", status=429, every=3)
          Fault("reset", fraction=0.5, path="*.stk", times=4)
          Fault("truncate", first_attempts=1)
          Fault("stall", seconds=3, nth=[1])
          Fault("status", status=403, path="/secret/*")
          Fault("reset", probability=0.02, seed=7)
    To inject faults under an s3:// client, lay out root as BUCKET/KEY and point
    the endpoint at this server (it ignores signatures; it cannot list).
    FaultServer(root, plan, log_limit=N) keeps only the last N log entries
    (0: none), for soaks that send millions of requests; nodelay=True sets
    TCP_NODELAY on each connection, so that a response's headers and body,
    written apart, do not wait for the client's delayed ACK (about 40 ms per
    request on a kept-alive connection otherwise).
    .url, .port, .root, .set_plan(plan) (also resets the counters)
    .fault_stats() -> dict requests (answered or being answered since the
        plan was set) and rules: one dict per rule, in plan order, with kind,
        path, status, seconds, fraction, seen (requests it selected) and fired.
    .requests(at_least=0, timeout=5.0) (waits until no request is being
        answered), .clear_requests(): dicts with method, path, range, status (None
        when reset before the headers), bytes (body bytes actually sent), fault
        (kind or None), attempt (1-based, per distinct request), connection (an id
        per TCP connection), completed (bool), time.

DelayProxy(target_host, target_port, one_way_ms, port=None, connect_rtt=True,
           buffer_bytes=64 MiB, bandwidth=None)
    A TCP proxy (asyncio, in a thread) that delivers what it reads at time t at
    t + one_way_ms, in each direction, so RTT = 2 x one_way_ms; reading goes on
    while earlier data waits (pipelined, no stop-and-wait), up to buffer_bytes
    queued per direction and connection. connect_rtt: a new connection's first
    bytes reach the server no earlier than 3 one-way delays after accept, as a
    TCP handshake would cost. Half-close and resets are passed on (after the
    delay). Many connections (backlog 256).
    bandwidth (bytes a second, or a string for parse_bandwidth such as "1Gbit"):
    each direction of each connection is a link of that rate: a piece read at t
    leaves once the link has sent what came before it (at len / bandwidth a
    piece) and arrives one_way_ms after that, as object stores give one
    connection about 100 MB/s. None: no cap (the proxy's own ceiling, which
    bench/bench_remote.py measures).
    parse_bandwidth("1Gbit") -> 125e6: N[k|M|G](bit|B)[/s], decimal units; a
    plain number is bytes a second.
    .port, .url ("http://127.0.0.1:PORT"), .stats() -> dict connections, active,
    bytes_up (client to server), bytes_down (server to client).

ServerProcess(kind, *args)
    Runs this file's command line in a child process (so that a busy test
    process does not slow the server through the GIL), waits for its ready file.
    .url, .port, .ready (the ready file's text), .pid. Stopped by __exit__ (SIGTERM).

Command line (starts one server, writes its URL to F atomically once it serves,
runs until SIGTERM/SIGINT):
    /usr/bin/python3 tests/servers/stk_servers.py nginx ROOT [--http2] [--tls
        [--cafile FILE]] [--port P] [--access-log FILE] --ready-file F
        (--cafile: where to copy the self-signed certificate)
    ... s3 [--access-key K] [--secret-key S] [--region R] [--port P] [--dir D]
        [--anonymous-read] [--bucket B]... [--upload BUCKET PREFIX LOCAL_DIR]...
        --ready-file F           (keys default to $AWS_ACCESS_KEY_ID /
        $AWS_SECRET_ACCESS_KEY, then stoker-test-key / stoker-test-secret)
    ... fault ROOT [--plan JSON | --plan @FILE] [--port P] [--log FILE]
        [--log-limit N] [--stats-file FILE] [--nodelay] --ready-file F
        (JSON: a list of objects with Fault's arguments; --log: the request log
        as JSON lines, written at exit; --log-limit: keep only the last N
        entries; --stats-file: fault_stats() as JSON, rewritten atomically
        every second and at exit)
    ... proxy TARGET --delay-ms D [--port P] [--no-connect-rtt]
        [--bandwidth RATE] [--stats-file FILE] --ready-file F
        (TARGET: host:port or http://host:port; D: one way; RATE: per
        connection and direction, e.g. 1Gbit; --stats-file: the stats as
        JSON, written at exit)
    The URL written is http://127.0.0.1:PORT for all four (https:// for nginx --tls).

libcurl 7.88's CURLOPT_AWS_SIGV4 against this S3 server (checked with the curl
7.88.1 CLI, `--aws-sigv4 aws:amz:REGION:s3`, in tests/py/test_servers.py):
  1. libcurl sends no x-amz-content-sha256; the server then answers 400
     InvalidRequest ("Missing required header for this request:
     x-amz-content-sha256"). With `x-amz-content-sha256: UNSIGNED-PAYLOAD` added
     by the caller, libcurl signs that header and uses its value as the payload
     hash: GET and PUT pass.
  2. libcurl puts the URL's query into the canonical request as it is: it must
     already be sorted by name and RFC 3986 percent-encoded (`list-type=2&
     max-keys=2` passes, `max-keys=2&list-type=2` gets 403 SignatureDoesNotMatch;
     continuation tokens hold + / = and must go as %2B %2F %3D).
  3. The canonical URI is the URL path as sent, while the server encodes each
     decoded key segment with RFC 3986: keys must be percent-encoded except
     A-Z a-z 0-9 - . _ ~ and "/" (`+`, `=`, `!`, `(`, raw UTF-8 bytes unencoded
     get 403; a space must be %20 anyway).
  libcurl signs host, x-amz-date and each header set with CURLOPT_HTTPHEADER
  (x-amz-content-sha256, Content-Type, ...), not the Range of CURLOPT_RANGE; the
  server accepts all of these. The provider string needs the region and service
  ("aws:amz:us-east-1:s3"): from a bare "aws:amz" libcurl takes them from the
  host name, 127.0.0.1 giving the scope DATE/0/127/aws4_request, answered 400
  AuthorizationHeaderMalformed.
"""

import argparse
import asyncio
import collections
import datetime
import fnmatch
import hashlib
import hmac
import http.client
import http.server
import json
import os
import re
import shutil
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
NODE_MODULES = os.environ.get("STK_NODE_MODULES", os.path.join(REPO, "build", "node", "node_modules"))
LOCAL = "127.0.0.1"


def free_port():
    """A TCP port free on 127.0.0.1 right now (for servers that cannot bind port 0)."""
    with socket.socket() as s:
        s.bind((LOCAL, 0))
        return s.getsockname()[1]


def _popen(cmd, log):
    """Starts cmd, its output appended to the file `log`, so that it gets
    SIGKILL when the starting thread dies."""
    if shutil.which("setpriv"):
        cmd = ["setpriv", "--pdeathsig", "KILL", "--"] + list(cmd)
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)


def _stop(proc, timeout=3.0):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _read(path, limit=4000):
    try:
        with open(path, "rb") as f:
            return f.read()[-limit:].decode("utf-8", "replace")
    except OSError:
        return ""


class _JsonLines:
    """A log file of JSON lines, read from a mark (clear) on. Lines {"start": id}
    (S3Server's) say that request id is in progress until its entry, which has
    "id": id, comes."""

    def __init__(self, path, convert=None):
        self.path = path
        self.offset = 0
        self.convert = convert

    def _scan(self, offset):
        try:
            with open(self.path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        # only complete lines: the writer may be half way through one
        end = data.rfind(b"\n") + 1
        entries, busy = [], set()
        for line in data[:end].splitlines():
            if line.strip():
                e = json.loads(line)
                if "start" in e:
                    busy.add(e["start"])
                else:
                    busy.discard(e.pop("id", None))
                    entries.append(self.convert(e) if self.convert else e)
        return entries, busy, offset + end

    def clear(self, timeout=5.0):
        """Marks the end of the log, once no request is in progress."""
        deadline = time.monotonic() + timeout
        while True:
            _, busy, end = self._scan(self.offset)
            if not busy or time.monotonic() >= deadline:
                self.offset = end
                return
            time.sleep(0.005)

    def read(self, at_least=0, timeout=5.0):
        deadline = time.monotonic() + timeout
        while True:
            out, busy, _ = self._scan(self.offset)
            if (len(out) >= at_least and not busy) or time.monotonic() >= deadline:
                return out
            time.sleep(0.005)


class _Server:
    """Context-manager plumbing shared by the servers."""

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def __del__(self):
        try:
            self.stop()
        except Exception:
            pass


# ---------------------------------------------------------------------------
# nginx

_NGINX_LOG_FORMAT = (
    '{"method":"$request_method","path":"$uri","uri":"$request_uri","status":$status,'
    '"range":"$http_range","bytes":$body_bytes_sent,"bytes_total":$bytes_sent,'
    '"connection":$connection,"connection_requests":$connection_requests,'
    '"protocol":"$server_protocol","completed":"$request_completion",'
    '"time":$msec,"request_time":$request_time}'
)


def _nginx_entry(e):
    e["range"] = e["range"] or None
    e["completed"] = e["completed"] == "OK"
    return e


def _nginx_str(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def make_cert(directory):
    """A self-signed certificate for 127.0.0.1 and localhost (EC P-256), made
    with the openssl command: returns (cert.pem, key.pem) in `directory`; the
    certificate is its own CA (CURLOPT_CAINFO / curl --cacert)."""
    cert = os.path.join(directory, "cert.pem")
    key = os.path.join(directory, "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", key, "-out", cert, "-days", "30", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    return cert, key


class Nginx(_Server):
    def __init__(self, root, http2=False, port=None, access_log=None, tls=False, redirects=None,
                 autoindex=None):
        self.autoindex = autoindex  # None: off; "html" or "json": nginx's index pages
        self.root = os.path.abspath(root)
        self.redirects = dict(redirects or {})
        self.http2 = http2
        self.tls = tls
        self.cafile = None
        self._want_port = port
        self.port = None
        self.url = None
        self.proc = None
        self._dir = None
        self.access_log = os.path.abspath(access_log) if access_log else None
        self._log = None

    def _config(self, port):
        d = self._dir
        listen = f"{LOCAL}:{port}" + (" ssl" if self.tls else "") + (" http2" if self.http2 else "")
        tls = ""
        if self.tls:
            tls = (f"ssl_certificate {_nginx_str(self.cafile)};\n"
                   f"        ssl_certificate_key {_nginx_str(os.path.join(d, 'key.pem'))};")
        index = (f"autoindex on; autoindex_format {self.autoindex};" if self.autoindex else "")
        moved = "".join(f"        location = {_nginx_str(a)} {{ return 302 {_nginx_str(b)}; }}\n"
                        for a, b in self.redirects.items())
        return f"""
daemon off;
master_process off;
worker_processes 1;
pid {_nginx_str(os.path.join(d, "nginx.pid"))};
error_log {_nginx_str(os.path.join(d, "error.log"))} warn;
events {{ worker_connections 4096; }}
http {{
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    server_tokens off;
    keepalive_timeout 300s;
    keepalive_requests 1000000;
    reset_timedout_connection on;
    client_body_temp_path {_nginx_str(os.path.join(d, "tmp", "body"))};
    proxy_temp_path {_nginx_str(os.path.join(d, "tmp", "proxy"))};
    fastcgi_temp_path {_nginx_str(os.path.join(d, "tmp", "fastcgi"))};
    uwsgi_temp_path {_nginx_str(os.path.join(d, "tmp", "uwsgi"))};
    scgi_temp_path {_nginx_str(os.path.join(d, "tmp", "scgi"))};
    log_format stk escape=json '{_NGINX_LOG_FORMAT}';
    access_log off;
    server {{
        listen {listen};
        server_name localhost;
        {tls}
        root {_nginx_str(self.root)};
        {index}
        access_log {_nginx_str(self.access_log)} stk;
{moved}    }}
}}
"""

    def start(self):
        if self.proc is not None:
            return
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"Nginx: root {self.root} is not a directory")
        nginx = os.environ.get("STK_NGINX") or shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(nginx):
            raise FileNotFoundError("Nginx: no nginx binary (run scripts/install-deps.sh)")
        self._dir = tempfile.mkdtemp(prefix="stk-nginx-")
        os.makedirs(os.path.join(self._dir, "tmp"))
        os.makedirs(os.path.join(self._dir, "logs"))
        if self.access_log is None:
            self.access_log = os.path.join(self._dir, "access.log")
        self._log = _JsonLines(self.access_log, _nginx_entry)
        self._log.clear()
        if self.tls:
            self.cafile, _ = make_cert(self._dir)
        conf = os.path.join(self._dir, "nginx.conf")
        errlog = os.path.join(self._dir, "error.log")
        pidfile = os.path.join(self._dir, "nginx.pid")
        try:
            for _ in range(10):
                port = self._want_port or free_port()
                with open(conf, "w") as f:
                    f.write(self._config(port))
                self.proc = _popen([nginx, "-p", self._dir + "/", "-c", conf, "-e", errlog], errlog)
                # nginx writes its pid file once it listens
                deadline = time.monotonic() + 10.0
                while self.proc.poll() is None and not os.path.exists(pidfile):
                    if time.monotonic() > deadline:
                        raise TimeoutError("Nginx: not listening after 10 s: " + _read(errlog))
                    time.sleep(0.005)
                if self.proc.poll() is None:
                    break
                err = _read(errlog)
                self.proc = None
                if self._want_port or "Address already in use" not in err:
                    raise RuntimeError(f"Nginx: failed to start on port {port}: {err}")
            else:
                raise RuntimeError("Nginx: no free port after 10 tries")
            self.port = port
            self.url = f"{'https' if self.tls else 'http'}://{LOCAL}:{port}"
        except BaseException:
            self.stop()
            raise

    def stop(self):
        _stop(self.proc)
        self.proc = None
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def requests(self, at_least=0, timeout=5.0):
        return self._log.read(at_least, timeout)

    def clear_requests(self):
        # nginx writes an entry just after its response: one a client has just
        # read may be a moment late, and must not count after the mark
        time.sleep(0.02)
        self._log.clear()


# ---------------------------------------------------------------------------
# S3: SigV4 and the s3rver server

S3Response = collections.namedtuple("S3Response", "status headers body")


class S3Error(Exception):
    def __init__(self, what, resp):
        self.status = resp.status
        self.code = s3_error_code(resp.body)
        self.response = resp
        super().__init__(f"{what}: HTTP {resp.status} {self.code or ''}".rstrip())


def s3_error_code(body):
    """The <Code> of an S3 error body, or None."""
    m = re.search(rb"<Code>([^<]*)</Code>", body or b"")
    return m.group(1).decode() if m else None


def s3_path(bucket, key=""):
    """Path-style URI path of bucket/key, percent-encoded as SigV4 wants it:
    RFC 3986, every byte but A-Z a-z 0-9 - . _ ~ (and "/" in the key)."""
    path = "/" + urllib.parse.quote(bucket, safe="") if bucket else "/"
    if key:
        path += "/" + urllib.parse.quote(key, safe="/")
    return path


def s3_query(pairs):
    """Canonical query string: names and values RFC 3986 encoded, sorted."""
    if isinstance(pairs, dict):
        pairs = pairs.items()
    enc = sorted((urllib.parse.quote(str(k), safe=""), urllib.parse.quote(str(v), safe="")) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in enc)


def _hmac(key, msg):
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


def sigv4_headers(method, host, path, query, headers, payload_hash, access_key, secret_key, region,
                  service="s3", now=None, session_token=None):
    """The headers of a SigV4 (AWS4-HMAC-SHA256) signed request.

    path: the URI path exactly as sent (s3_path encodes it); query: the query
    string exactly as sent (s3_query builds a canonical one); headers: the other
    headers to sign (dict). Returns a new dict: `headers` plus Host, X-Amz-Date,
    X-Amz-Content-Sha256, [X-Amz-Security-Token] and Authorization."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    scope = f"{now.strftime('%Y%m%d')}/{region}/{service}/aws4_request"
    out = dict(headers or {})
    out["Host"] = host
    out["X-Amz-Date"] = amz_date
    out["X-Amz-Content-Sha256"] = payload_hash
    if session_token:
        out["X-Amz-Security-Token"] = session_token
    canon = {}
    for k, v in out.items():
        canon[k.lower()] = " ".join(str(v).split())
    signed = ";".join(sorted(canon))
    canonical_request = "\n".join(
        [method, path, query, "".join(f"{k}:{canon[k]}\n" for k in sorted(canon)), signed, payload_hash]
    )
    string_to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical_request.encode("utf-8")).hexdigest()]
    )
    key = ("AWS4" + secret_key).encode("utf-8")
    for part in (now.strftime("%Y%m%d"), region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, string_to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    out["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={signed}, Signature={signature}"
    )
    return out


class _S3Conn:
    """One keep-alive connection of an S3Client, reopened when the server closed it."""

    def __init__(self, client):
        self.client = client
        self.conn = None

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def request(self, method, bucket="", key="", query=(), headers=None, body=b"", access_key=None,
                secret_key=None, region=None, signed=True):
        cl = self.client
        path = s3_path(bucket, key)
        qs = s3_query(query)
        target = path + ("?" + qs if qs else "")
        if isinstance(body, (bytes, bytearray)):
            payload_hash = hashlib.sha256(body).hexdigest()
            length = len(body)
            start = None
        else:  # a file open for reading: streamed, not hashed
            payload_hash = "UNSIGNED-PAYLOAD"
            start = body.tell()
            length = os.fstat(body.fileno()).st_size - start
        hdrs = dict(headers or {})
        if method in ("PUT", "POST") or length:
            hdrs["Content-Length"] = str(length)
        host = f"{cl.host}:{cl.port}"
        if signed:
            hdrs = sigv4_headers(method, host, path, qs, hdrs, payload_hash, access_key or cl.access_key,
                                 secret_key or cl.secret_key, region or cl.region)
        else:
            hdrs["Host"] = host
        for attempt in (1, 2):
            fresh = self.conn is None
            if fresh:
                self.conn = http.client.HTTPConnection(cl.host, cl.port, timeout=60)
            try:
                self.conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
                for k, v in hdrs.items():
                    self.conn.putheader(k, v)
                self.conn.endheaders()
                if start is None:
                    if body:
                        self.conn.send(body)
                else:
                    body.seek(start)
                    while True:
                        chunk = body.read(1 << 20)
                        if not chunk:
                            break
                        self.conn.send(chunk)
                resp = self.conn.getresponse()
                data = resp.read()
                out = S3Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
                if resp.will_close:
                    self.close()
                return out
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # a kept-alive connection the server closed meanwhile: once more on a new one
                self.close()
                if fresh or attempt == 2:
                    raise
        raise AssertionError("unreachable")


class S3Client:
    def __init__(self, endpoint, access_key, secret_key, region="us-east-1"):
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = region
        self._set_endpoint(endpoint)
        self._conn = None
        self._lock = threading.Lock()

    def _set_endpoint(self, endpoint):
        self.endpoint = endpoint
        self.host = self.port = None
        if endpoint:
            u = urllib.parse.urlsplit(endpoint)
            if u.scheme != "http":
                raise ValueError(f"S3Client: endpoint {endpoint} is not http://")
            self.host, self.port = u.hostname, u.port or 80

    def close(self):
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def request(self, method, bucket="", key="", query=(), headers=None, body=b"", **kw):
        with self._lock:
            if self._conn is None:
                self._conn = _S3Conn(self)
            return self._conn.request(method, bucket, key, query, headers, body, **kw)

    @staticmethod
    def _check(what, resp):
        if not 200 <= resp.status < 300:
            raise S3Error(what, resp)
        return resp

    def create_bucket(self, name):
        self._check(f"create bucket {name}", self.request("PUT", name))

    def put(self, bucket, key, data):
        resp = self.request("PUT", bucket, key, body=bytes(data))
        return self._check(f"put {bucket}/{key}", resp).headers.get("etag")

    def put_file(self, bucket, key, path, _conn=None):
        with open(path, "rb") as f:
            if _conn is None:
                resp = self.request("PUT", bucket, key, body=f)
            else:
                resp = _conn.request("PUT", bucket, key, body=f)
        return self._check(f"put {bucket}/{key} from {path}", resp).headers.get("etag")

    def put_dir(self, bucket, prefix, local_dir, threads=4):
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        jobs = []
        for dirpath, dirnames, filenames in os.walk(local_dir):
            dirnames.sort()
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, local_dir).replace(os.sep, "/")
                jobs.append((prefix + rel, full))
        errors = []
        it = iter(jobs)
        it_lock = threading.Lock()

        def work():
            conn = _S3Conn(self)
            try:
                while not errors:
                    with it_lock:
                        job = next(it, None)
                    if job is None:
                        return
                    self.put_file(bucket, job[0], job[1], conn)
            except BaseException as e:
                errors.append(e)
            finally:
                conn.close()

        workers = [threading.Thread(target=work) for _ in range(max(1, min(threads, len(jobs))))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if errors:
            raise errors[0]
        return sorted(k for k, _ in jobs)

    def get(self, bucket, key, range=None):
        headers = {"Range": range} if range else None
        return self._check(f"get {bucket}/{key}", self.request("GET", bucket, key, headers=headers)).body

    def delete(self, bucket, key):
        self._check(f"delete {bucket}/{key}", self.request("DELETE", bucket, key))

    def list_pages(self, bucket, prefix="", max_keys=None):
        token = None
        while True:
            q = {"list-type": "2", "prefix": prefix}
            if max_keys is not None:
                q["max-keys"] = str(max_keys)
            if token:
                q["continuation-token"] = token
            resp = self._check(f"list {bucket}/{prefix}", self.request("GET", bucket, query=q))
            root = ET.fromstring(resp.body)
            keys, token = [], None
            for el in root.iter():
                tag = el.tag.rsplit("}", 1)[-1]
                if tag == "Contents":
                    keys.extend(c.text or "" for c in el if c.tag.rsplit("}", 1)[-1] == "Key")
                elif tag == "NextContinuationToken":
                    token = el.text
            yield keys, token
            if not token:
                return

    def list(self, bucket, prefix="", max_keys=None):
        return [k for keys, _ in self.list_pages(bucket, prefix, max_keys) for k in keys]


class S3Server(S3Client, _Server):
    def __init__(self, access_key="stoker-test-key", secret_key="stoker-test-secret", region="us-east-1",
                 port=None, directory=None, anonymous_read=False):
        S3Client.__init__(self, None, access_key, secret_key, region)
        self._want_port = port or 0
        self._want_dir = os.path.abspath(directory) if directory else None
        self.directory = None
        self.anonymous_read = anonymous_read
        self.proc = None
        self._dir = None
        self._log = None

    def start(self):
        if self.proc is not None:
            return
        node = os.environ.get("STK_NODE") or shutil.which("node")
        if not node:
            raise FileNotFoundError("S3Server: no node on PATH (run scripts/install-deps.sh)")
        if not os.path.isdir(os.path.join(NODE_MODULES, "@20minutes", "s3rver")):
            raise FileNotFoundError(
                f"S3Server: @20minutes/s3rver is not installed in {NODE_MODULES} (run scripts/install-deps.sh)"
            )
        self._dir = tempfile.mkdtemp(prefix="stk-s3-")
        try:
            self.directory = self._want_dir or os.path.join(self._dir, "data")
            os.makedirs(self.directory, exist_ok=True)
            ready = os.path.join(self._dir, "ready")
            cfg = {
                "modules": NODE_MODULES,
                "directory": self.directory,
                "address": LOCAL,
                "port": self._want_port,
                "accessKey": self.access_key,
                "secretKey": self.secret_key,
                "region": self.region,
                "anonymousRead": bool(self.anonymous_read),
                "requestLog": os.path.join(self._dir, "requests.log"),
                "readyFile": ready,
            }
            cfgpath = os.path.join(self._dir, "config.json")
            fd = os.open(cfgpath, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(cfg, f)
            self._log = _JsonLines(cfg["requestLog"])
            out = os.path.join(self._dir, "node.log")
            self.proc = _popen(
                [node, "--openssl-legacy-provider", os.path.join(HERE, "s3rver_launcher.js"), cfgpath], out
            )
            deadline = time.monotonic() + 20.0
            while not os.path.exists(ready):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"S3Server: node exited with {self.proc.returncode}: {_read(out)}")
                if time.monotonic() > deadline:
                    raise TimeoutError("S3Server: not listening after 20 s: " + _read(out))
                time.sleep(0.01)
            with open(ready) as f:
                self._set_endpoint(f"http://{LOCAL}:{int(f.read())}")
        except BaseException:
            self.stop()
            raise

    def stop(self):
        _stop(self.proc)
        self.proc = None
        self.close()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def requests(self, at_least=0, timeout=5.0):
        return self._log.read(at_least, timeout)

    def clear_requests(self):
        self._log.clear()


# ---------------------------------------------------------------------------
# FaultServer

_S3_CODES = {503: "SlowDown", 429: "SlowDown", 403: "AccessDenied", 404: "NoSuchKey", 416: "InvalidRange"}
_UNSET = object()


class Fault:
    KINDS = ("status", "reset", "truncate", "stall", "trickle")

    def __init__(self, kind, path=None, method=None, first_attempts=None, every=None, nth=None, times=None,
                 status=503, code=None, retry_after=None, close=False, fraction=_UNSET, seconds=1.0,
                 probability=None, seed=0, ranged=None, rate=1024):
        if kind not in self.KINDS:
            raise ValueError(f"Fault: kind {kind!r} is not one of {', '.join(self.KINDS)}")
        if sum(x is not None for x in (first_attempts, every, nth, probability)) > 1:
            raise ValueError("Fault: give at most one of first_attempts, every, nth, probability")
        if probability is not None and not 0 <= probability <= 1:
            raise ValueError(f"Fault: probability {probability} is not in [0, 1]")
        if fraction is _UNSET:
            fraction = None if kind in ("stall", "trickle") else 0.5
        if kind == "trickle" and not rate > 0:
            raise ValueError(f"Fault: trickle needs a rate above 0 bytes/s, got {rate}")
        if fraction is None and kind == "truncate":
            raise ValueError("Fault: truncate needs a fraction")
        if fraction is not None and not 0 <= fraction < 1:
            raise ValueError(f"Fault: fraction {fraction} is not in [0, 1)")
        self.kind = kind
        self.path = path
        self.method = method.upper() if method else None
        self.first_attempts = first_attempts
        self.every = every
        self.nth = set(nth) if nth is not None else None
        self.times = times
        self.status = status
        self.code = code or _S3_CODES.get(status, "InternalError")
        self.retry_after = retry_after
        self.close = close
        self.fraction = fraction
        self.seconds = seconds
        self.probability = probability
        self.seed = seed
        self.ranged = ranged
        self.index = 0  # place in the plan (set_plan), so that two rules draw apart
        self.rate = rate
        self.seen = 0  # requests this rule selected
        self.fired = 0

    def __repr__(self):
        return f"Fault({self.kind!r}, path={self.path!r}, fired={self.fired})"

    def _select(self, method, path, rng=None):
        return (
            (self.path is None or fnmatch.fnmatchcase(path, self.path))
            and (self.method is None or self.method == method)
            and (self.ranged is None
                 or (self.ranged == rng if isinstance(self.ranged, str)
                     else self.ranged == (rng is not None)))
        )

    def _fires(self, attempt, ident=None):
        if self.times is not None and self.fired >= self.times:
            return False
        if self.probability is not None:
            return self._draw(ident, attempt) < self.probability
        if self.first_attempts is not None:
            return attempt <= self.first_attempts
        if self.every is not None:
            return self.seen % self.every == 0
        if self.nth is not None:
            return self.seen in self.nth
        return True

    def _draw(self, ident, attempt):
        """A number in [0, 1) fixed by the seed, the rule and the request's
        attempt, not by arrival order (the server answers in many threads)."""
        method, path, rng = ident or ("", "", None)
        key = f"{self.seed}\0{self.index}\0{method}\0{path}\0{rng or ''}\0{attempt}".encode()
        h = hashlib.blake2b(key, digest_size=8).digest()
        return int.from_bytes(h, "little") / 2.0**64

    def _stats(self):
        return {"kind": self.kind, "path": self.path, "status": self.status if self.kind == "status" else None,
                "retry_after": self.retry_after, "seconds": self.seconds, "fraction": self.fraction,
                "seen": self.seen, "fired": self.fired}


class _FaultHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True

    def server_bind(self):
        # no getfqdn(): a reverse DNS lookup has no place in a loopback test
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class _FaultHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "stk-fault"
    sys_version = ""

    def setup(self):
        super().setup()
        self.owner = self.server.owner
        if self.owner.nodelay:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn_id = self.owner._register(self.connection)

    def finish(self):
        try:
            super().finish()
        finally:
            self.owner._unregister(self.connection)

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._serve(True)

    def do_HEAD(self):
        self._serve(False)

    def _error_body(self, status, code, message):
        resource = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<Resource>{resource.replace('&', '&amp;').replace('<', '&lt;')}</Resource></Error>"
        ).encode()

    def _reset(self):
        # SO_LINGER 0: closing sends RST. Closed through the descriptor, now:
        # the socket object would wait for its file objects; detached, it and
        # they close nothing later (no stray close of a reused descriptor).
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        os.close(self.connection.detach())
        self.close_connection = True

    def _serve(self, with_body):
        owner = self.owner
        with owner._lock:
            owner._in_progress += 1
        method = self.command
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        rng = self.headers.get("Range")
        fault, attempt = owner._pick(method, path, rng)
        entry = {
            "method": method, "path": path, "range": rng, "status": None, "bytes": 0,
            "fault": fault.kind if fault else None, "attempt": attempt, "connection": self.conn_id,
            "completed": False, "time": time.time(),
        }
        try:
            self._respond(fault, path, rng, with_body, entry)
        except (ConnectionError, OSError):
            self.close_connection = True
        finally:
            owner._log(entry)

    def _respond(self, fault, path, rng, with_body, entry):
        owner = self.owner
        if fault and fault.kind == "stall" and fault.fraction is None:
            owner._stopping.wait(fault.seconds)
        if fault and fault.kind == "reset" and fault.fraction is None:
            self._reset()
            return
        if fault and fault.kind == "status":
            self._send_error(fault.status, fault.code, "injected fault", entry, with_body,
                             retry_after=fault.retry_after, close=fault.close)
            return
        full = os.path.realpath(os.path.join(owner.root, path.lstrip("/")))
        if not (full + os.sep).startswith(owner.root + os.sep) or not os.path.isfile(full):
            self._send_error(404, "NoSuchKey", "The specified key does not exist.", entry, with_body)
            return
        with open(full, "rb") as f:
            st = os.fstat(f.fileno())
            size = st.st_size
            start, end, status = 0, size - 1, 200
            m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", rng or "")
            if m and (m[1] or m[2]) and not (m[1] and m[2] and int(m[2]) < int(m[1])):
                if not m[1]:
                    n = int(m[2])
                    start = max(0, size - n) if n else size
                else:
                    start = int(m[1])
                    end = size - 1 if not m[2] else min(int(m[2]), size - 1)
                if start >= size:
                    self._send_error(416, "InvalidRange", "The requested range is not satisfiable", entry,
                                     with_body, extra={"Content-Range": f"bytes */{size}"})
                    return
                status = 206
            length = end - start + 1 if size else 0
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(length))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{st.st_size:x}-{st.st_mtime_ns:x}"')
            self.send_header("Last-Modified", self.date_time_string(int(st.st_mtime)))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            entry["status"] = status
            if not with_body:
                entry["completed"] = True
                return
            if fault and fault.kind == "trickle":
                self._trickle(f, start, length, fault.rate, entry)
                return
            first = length
            if fault and fault.fraction is not None:
                first = int(length * fault.fraction)
            sent = self.connection.sendfile(f, start, first) if first else 0
            entry["bytes"] = sent
            if fault and fault.kind == "reset":
                self._reset()
                return
            if fault and fault.kind == "truncate":
                self.connection.shutdown(socket.SHUT_WR)
                self.close_connection = True
                return
            if fault and fault.kind == "stall" and fault.fraction is not None:
                owner._stopping.wait(fault.seconds)
            if sent < length:
                entry["bytes"] += self.connection.sendfile(f, start + sent, length - sent)
            entry["completed"] = entry["bytes"] == length

    def _trickle(self, f, start, length, rate, entry):
        # The body in pieces of at most 256 bytes, paced at `rate` bytes/s,
        # so the client never sees a stall, only a slow transfer.
        piece = max(1, min(256, int(rate)))
        sent = 0
        t0 = time.monotonic()
        while sent < length and not self.owner._stopping.is_set():
            f.seek(start + sent)
            data = f.read(min(piece, length - sent))
            self.connection.sendall(data)
            sent += len(data)
            entry["bytes"] = sent
            wait = t0 + sent / rate - time.monotonic()
            if wait > 0:
                self.owner._stopping.wait(wait)
        entry["completed"] = sent == length

    def _send_error(self, status, code, message, entry, with_body, retry_after=None, close=False, extra=None):
        body = self._error_body(status, code, message)
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        entry["status"] = status
        if with_body:
            self.wfile.write(body)
            entry["bytes"] = len(body)
        entry["completed"] = True


class FaultServer(_Server):
    def __init__(self, root, plan=(), port=None, log_limit=None, nodelay=False):
        self.root = os.path.realpath(root)
        self.nodelay = nodelay
        self.log_limit = log_limit
        self._answered = 0
        self._want_port = port or 0
        self.port = None
        self.url = None
        self._lock = threading.Lock()
        self._entries = collections.deque(maxlen=log_limit)
        self._in_progress = 0
        self._conns = {}
        self._next_conn = 0
        self._attempts = collections.Counter()
        self._httpd = None
        self._thread = None
        self._stopping = threading.Event()
        self.set_plan(plan)

    def set_plan(self, plan):
        rules = [p if isinstance(p, Fault) else Fault(**p) for p in plan or ()]
        for k, rule in enumerate(rules):
            rule.index = k
        with self._lock:
            self.plan = rules
            self._attempts.clear()
            self._answered = 0

    def start(self):
        if self._httpd is not None:
            return
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"FaultServer: root {self.root} is not a directory")
        self._stopping.clear()
        self._httpd = _FaultHTTPServer((LOCAL, self._want_port), _FaultHandler)
        self._httpd.owner = self
        self.port = self._httpd.server_address[1]
        self.url = f"http://{LOCAL}:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="stk-fault-server", daemon=True)
        self._thread.start()

    def stop(self):
        if self._httpd is None:
            return
        self._stopping.set()
        self._httpd.shutdown()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._httpd.server_close()
        self._thread.join(5)
        self._httpd = None

    def _register(self, sock):
        with self._lock:
            self._next_conn += 1
            self._conns[sock] = self._next_conn
            return self._next_conn

    def _unregister(self, sock):
        with self._lock:
            self._conns.pop(sock, None)

    def _pick(self, method, path, rng):
        with self._lock:
            ident = (method, path, rng)
            self._attempts[ident] += 1
            attempt = self._attempts[ident]
            self._answered += 1
            chosen = None
            for rule in self.plan:
                if not rule._select(method, path, rng):
                    continue
                rule.seen += 1
                if chosen is None and rule._fires(attempt, ident):
                    rule.fired += 1
                    chosen = rule
            return chosen, attempt

    def _log(self, entry):
        with self._lock:
            self._entries.append(entry)
            self._in_progress -= 1

    def requests(self, at_least=0, timeout=5.0):
        """The log, once it has at_least entries and no request is being
        answered (a client may have its response before its entry is written),
        or after timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                out = [dict(e) for e in self._entries]
                busy = self._in_progress
            if (len(out) >= at_least and not busy) or time.monotonic() >= deadline:
                return out
            time.sleep(0.005)

    def clear_requests(self):
        with self._lock:
            self._entries.clear()

    def fault_stats(self):
        with self._lock:
            return {"requests": self._answered, "rules": [r._stats() for r in self.plan]}


# ---------------------------------------------------------------------------
# DelayProxy

def parse_bandwidth(text):
    """Bytes a second from "1Gbit", "100Mbit/s", "125MB", "1e8" (decimal units)."""
    m = re.fullmatch(r"\s*([0-9.]+(?:[eE][0-9]+)?)\s*([kKmMgG]?)(bit|b|B)?(?:/s|ps)?\s*", str(text))
    if not m:
        raise ValueError(f"bad bandwidth {text!r}: give e.g. 1Gbit, 100Mbit, 125MB (a second)")
    v = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()]
    if m.group(3) in ("bit", "b"):
        v /= 8
    if v <= 0:
        raise ValueError(f"bad bandwidth {text!r}: must be above zero")
    return v


_EOF = b"<eof>"
_ABORT = b"<abort>"


class _Pipe:
    """One direction of a proxied connection: bytes read from src at time t
    are written to dst at t + delay, in order; reading never waits for writing."""

    def __init__(self, proxy, conn, counter):
        self.proxy = proxy
        self.conn = conn
        self.loop = proxy._loop
        self.counter = counter
        self.queue = collections.deque()
        self.queued = 0
        self.src = None
        self.dst = None
        self.timer = None
        self.not_before = 0.0
        self.link_free = 0.0  # when the capped link has sent what is queued (bandwidth)
        self.paused = False
        self.dst_full = False
        self.done = False

    def push(self, item):
        ready = self.loop.time()
        if item is not _EOF and item is not _ABORT:
            self.proxy._stats[self.counter] += len(item)
            self.queued += len(item)
            if self.proxy.bandwidth:
                # The link sends one piece after another at the capped rate.
                self.link_free = max(self.link_free, ready) + len(item) / self.proxy.bandwidth
                ready = self.link_free
        else:
            ready = max(ready, self.link_free)
        when = max(ready + self.proxy.delay, self.not_before)
        self.queue.append((when, item))
        self._flow()
        self._arm()

    def _flow(self):
        want_pause = self.queued > self.proxy.buffer_bytes or self.dst_full
        if self.src is not None and want_pause != self.paused and not self.src.is_closing():
            self.paused = want_pause
            if want_pause:
                self.src.pause_reading()
            else:
                self.src.resume_reading()

    def set_dst(self, transport):
        self.dst = transport
        self._arm()

    def _arm(self):
        if self.timer is None and self.queue and self.dst is not None:
            self.timer = self.loop.call_at(self.queue[0][0], self._fire)

    def _fire(self):
        self.timer = None
        now = self.loop.time()
        while self.queue and self.queue[0][0] <= now:
            _, item = self.queue.popleft()
            if self.done or self.dst.is_closing():
                self.queue.clear()
                self.queued = 0
                break
            if item is _EOF:
                self.done = True
                if self.dst.can_write_eof():
                    self.dst.write_eof()
                else:
                    self.dst.close()
                if self.conn.up.done and self.conn.down.done:
                    self.conn.close()
            elif item is _ABORT:
                self.done = True
                self.dst.abort()
            else:
                self.queued -= len(item)
                self.dst.write(item)
        self._flow()
        self._arm()

    def cancel(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class _End(asyncio.Protocol):
    """One socket of a proxied connection: reads into `out`, writes from `inp`."""

    def __init__(self, conn, out, inp):
        self.conn = conn
        self.out = out
        self.inp = inp
        self.transport = None
        self.eof = False

    def connection_made(self, transport):
        self.transport = transport
        transport.set_write_buffer_limits(high=8 << 20)
        self.out.src = transport
        self.inp.set_dst(transport)

    def data_received(self, data):
        self.out.push(data)

    def eof_received(self):
        self.eof = True
        self.out.push(_EOF)
        return True  # keep the other direction open

    def connection_lost(self, exc):
        if not self.eof:
            self.out.push(_ABORT)
        self.out.src = None
        self.conn.lost(self)

    def pause_writing(self):
        self.inp.dst_full = True
        self.inp._flow()

    def resume_writing(self):
        self.inp.dst_full = False
        self.inp._flow()


class _Conn:
    def __init__(self, proxy):
        self.proxy = proxy
        self.up = _Pipe(proxy, self, "bytes_up")
        self.down = _Pipe(proxy, self, "bytes_down")
        self.client = _End(self, self.up, self.down)
        self.server = None
        self.ends = set()
        self.closed = False

    def lost(self, end):
        self.ends.discard(end)
        if not self.ends:
            self.close()

    def close(self, abort=False):
        """Closes both sockets: close() still sends what they buffer, abort() does not."""
        if not self.closed:
            self.closed = True
            self.proxy._conns.discard(self)
            self.proxy._stats["active"] -= 1
        for end in list(self.ends):
            if end.transport is not None:
                if abort:
                    end.transport.abort()
                else:
                    end.transport.close()
        self.up.cancel()
        self.down.cancel()


class DelayProxy(_Server):
    def __init__(self, target_host, target_port, one_way_ms, port=None, connect_rtt=True,
                 buffer_bytes=64 << 20, bandwidth=None):
        self.target = (target_host, int(target_port))
        self.bandwidth = parse_bandwidth(bandwidth) if isinstance(bandwidth, str) else bandwidth
        self.one_way_ms = one_way_ms
        self.delay = one_way_ms / 1000.0
        self.connect_rtt = connect_rtt
        self.buffer_bytes = buffer_bytes
        self._want_port = port or 0
        self.port = None
        self.url = None
        self._loop = None
        self._thread = None
        self._server = None
        self._conns = set()
        self._stats = collections.Counter(connections=0, active=0, bytes_up=0, bytes_down=0)

    def start(self):
        if self._loop is not None:
            return
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="stk-delay-proxy", daemon=True)
        self._thread.start()
        try:
            fut = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
            fut.result(10)
        except BaseException:
            self.stop()
            raise
        self.url = f"http://{LOCAL}:{self.port}"

    async def _start(self):
        self._server = await self._loop.create_server(self._accept, LOCAL, self._want_port, backlog=256)
        self.port = self._server.sockets[0].getsockname()[1]

    def _accept(self):
        conn = _Conn(self)
        self._conns.add(conn)
        conn.ends.add(conn.client)
        self._stats["connections"] += 1
        self._stats["active"] += 1
        if self.connect_rtt:
            # the client's first bytes would reach the server after its
            # handshake (one RTT) and one more one-way trip
            conn.up.not_before = self._loop.time() + 3 * self.delay
        self._loop.create_task(self._connect(conn))
        return conn.client

    async def _connect(self, conn):
        try:
            transport, proto = await self._loop.create_connection(
                lambda: _End(conn, conn.down, conn.up), self.target[0], self.target[1]
            )
            if conn.closed:
                transport.abort()
                return
            conn.server = proto
            conn.ends.add(proto)
        except OSError:
            if conn.client.transport is not None:
                conn.client.transport.abort()

    def stop(self):
        if self._loop is None:
            return

        async def shutdown():
            if self._server is not None:
                self._server.close()
            for conn in list(self._conns):
                conn.close(abort=True)

        if self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(5)
            except Exception:
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
        self._loop = None

    def stats(self):
        return dict(self._stats)


# ---------------------------------------------------------------------------
# ServerProcess and the command line


class ServerProcess(_Server):
    def __init__(self, kind, *args, timeout=30.0):
        self.kind = kind
        self.args = [str(a) for a in args]
        self.timeout = timeout
        self.proc = None
        self._dir = None
        self.url = self.port = self.ready = self.pid = None

    def start(self):
        if self.proc is not None:
            return
        self._dir = tempfile.mkdtemp(prefix="stk-server-")
        ready = os.path.join(self._dir, "ready")
        out = os.path.join(self._dir, "out.log")
        cmd = [sys.executable, os.path.abspath(__file__), self.kind, *self.args, "--ready-file", ready]
        self.proc = _popen(cmd, out)
        self.pid = self.proc.pid
        deadline = time.monotonic() + self.timeout
        while not os.path.exists(ready):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = _read(out)
                self.stop()
                raise RuntimeError(f"ServerProcess {self.kind}: did not start: {err}")
            time.sleep(0.01)
        with open(ready) as f:
            self.ready = f.read().strip()
        self.url = self.ready
        self.port = int(self.ready.rsplit(":", 1)[1])

    def stop(self):
        _stop(self.proc, timeout=10.0)
        self.proc = None
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _write_atomic(path, text):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Run one of stoker's test servers on 127.0.0.1.")
    sub = ap.add_subparsers(dest="kind", required=True)
    p = sub.add_parser("nginx")
    p.add_argument("root")
    p.add_argument("--http2", action="store_true")
    p.add_argument("--tls", action="store_true")
    p.add_argument("--cafile", help="with --tls: where to copy the server's self-signed certificate")
    p.add_argument("--access-log")
    p = sub.add_parser("s3")
    p.add_argument("--access-key", default=os.environ.get("AWS_ACCESS_KEY_ID", "stoker-test-key"))
    p.add_argument("--secret-key", default=os.environ.get("AWS_SECRET_ACCESS_KEY", "stoker-test-secret"))
    p.add_argument("--region", default="us-east-1")
    p.add_argument("--dir")
    p.add_argument("--anonymous-read", action="store_true")
    p.add_argument("--bucket", action="append", default=[])
    p.add_argument("--upload", nargs=3, action="append", default=[], metavar=("BUCKET", "PREFIX", "LOCAL_DIR"))
    p = sub.add_parser("fault")
    p.add_argument("root")
    p.add_argument("--plan", default="[]")
    p.add_argument("--log")
    p.add_argument("--log-limit", type=int)
    p.add_argument("--stats-file")
    p.add_argument("--nodelay", action="store_true")
    p = sub.add_parser("proxy")
    p.add_argument("target")
    p.add_argument("--delay-ms", type=float, required=True)
    p.add_argument("--no-connect-rtt", action="store_true")
    p.add_argument("--bandwidth", help="per connection and direction, e.g. 1Gbit")
    p.add_argument("--stats-file")
    for p in sub.choices.values():
        p.add_argument("--port", type=int)
        p.add_argument("--ready-file", required=True)
    a = ap.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    if a.kind == "nginx":
        server = Nginx(a.root, http2=a.http2, port=a.port, access_log=a.access_log, tls=a.tls)
    elif a.kind == "s3":
        server = S3Server(a.access_key, a.secret_key, a.region, port=a.port, directory=a.dir,
                          anonymous_read=a.anonymous_read)
    elif a.kind == "fault":
        plan = a.plan
        if plan.startswith("@"):
            with open(plan[1:]) as f:
                plan = f.read()
        server = FaultServer(a.root, json.loads(plan), port=a.port, log_limit=a.log_limit,
                             nodelay=a.nodelay)
    else:
        target = a.target.split("://", 1)[-1].rstrip("/")
        host, port = target.rsplit(":", 1)
        server = DelayProxy(host, int(port), a.delay_ms, port=a.port, connect_rtt=not a.no_connect_rtt,
                            bandwidth=parse_bandwidth(a.bandwidth) if a.bandwidth else None)

    with server:
        if a.kind == "s3":
            buckets = list(dict.fromkeys(a.bucket + [u[0] for u in a.upload]))
            for b in buckets:
                server.create_bucket(b)
            for bucket, prefix, local in a.upload:
                server.put_dir(bucket, prefix, local)
        if a.kind == "nginx" and a.tls and a.cafile:
            shutil.copyfile(server.cafile, a.cafile)
        url = getattr(server, "url", None) or getattr(server, "endpoint")
        _write_atomic(a.ready_file, url + "\n")
        ticks = 0
        while not stop.wait(0.5):
            proc = getattr(server, "proc", None)
            if proc is not None and proc.poll() is not None:
                print(f"stk_servers: {a.kind} exited with {proc.returncode}", file=sys.stderr)
                return 1
            ticks += 1
            if a.kind == "fault" and a.stats_file and ticks % 2 == 0:
                _write_atomic(a.stats_file, json.dumps(server.fault_stats()) + "\n")
        if a.kind == "fault" and a.stats_file:
            _write_atomic(a.stats_file, json.dumps(server.fault_stats()) + "\n")
        if a.kind == "fault" and a.log:
            _write_atomic(a.log, "".join(json.dumps(e) + "\n" for e in server.requests()))
        if a.kind == "proxy" and a.stats_file:
            _write_atomic(a.stats_file, json.dumps(server.stats()) + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, RuntimeError, ValueError, S3Error) as e:
        print(f"stk_servers: {e}", file=sys.stderr)
        sys.exit(1)
