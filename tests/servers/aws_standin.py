#!/usr/bin/python3
"""Loopback stand-ins for the AWS credential providers, and an S3 that checks
which credentials signed each request (docs/remote.md, "Credentials").
Python's standard library only.

One ThreadingHTTPServer on 127.0.0.1 answers:
  STS        POST / (a form) or GET /?Action=...: AssumeRoleWithWebIdentity;
             checks Version=2011-06-15, RoleArn == role_arn, a RoleSessionName,
             and WebIdentityToken == jwt; else 400 with an STS XML error (or
             403 AccessDenied for a wrong token). Answers the XML of
             AssumeRoleWithWebIdentityResponse.
  container  GET /container/creds: checks `Authorization` when auth_token is
             set (401 otherwise); JSON AccessKeyId, SecretAccessKey, Token,
             Expiration.
  IMDSv2     PUT /latest/api/token (needs X-aws-ec2-metadata-token-ttl-seconds,
             else 400); GET /latest/meta-data/iam/security-credentials/ (the
             role name) and .../ROLE (JSON as the container's plus Code
             "Success"), both with the X-aws-ec2-metadata-token header (401
             without or with a wrong one).
  S3         GET/HEAD /BUCKET/KEY (path-style), files under ROOT: the SigV4
             signature is checked with the secret of the key id it names (keys
             issued here, plus the static pairs envkey / envsecret and
             profkey / profsecret); a key whose
             token was marked expired gets `expired_status` (400) ExpiredToken;
             an unknown key 403 InvalidAccessKeyId; a bad signature 403
             SignatureDoesNotMatch; an unsigned request 403 AccessDenied.
  admin      GET /_admin/set?NAME=VALUE&... sets config (first_ttl, ttl,
             expired_status, jwt, role_arn, auth_token; ttl values in seconds);
             GET /_admin/expire?key=KEYID marks that key's token expired;
             GET /_admin/state -> JSON {"counts": {endpoint: n}, "issued":
             [key ids], "s3": [{"key": key id or null, "status": n,
             "token": bool}], "s3_log": "KEY:STATUS,..." (the same, flat),
             "sessions": [RoleSessionName...]}; GET /_admin/reset clears the
             counts and the S3 log.
Issue i (1-based, whichever provider) gives key id STANDINKEY{i}, secret
"standin/secret+{i}", token "standin-token-{i}-" followed by 600 x's, and
Expiration now + ttl (the next issue after first_ttl is set: now + first_ttl).

Command line: aws_standin.py ROOT --ready-file F [--port P]; writes
"http://127.0.0.1:PORT" to F once it serves; runs until SIGTERM.
"""

import argparse
import datetime
import hashlib
import hmac
import http.server
import json
import os
import signal
import sys
import threading
import urllib.parse

STATIC = {"envkey": "envsecret", "profkey": "profsecret"}


def _iso(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _hmac(key, msg):
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.cfg = {"first_ttl": None, "ttl": 3600, "expired_status": 400,
                    "jwt": "header.payload.signature", "role_arn": "arn:aws:iam::123456789012:role/standin",
                    "auth_token": None}
        self.issued = {}  # key id -> (secret, token)
        self.order = []
        self.expired = set()
        self.counts = {}
        self.s3 = []
        self.sessions = []

    def count(self, what):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def issue(self):
        import time
        with self.lock:
            i = len(self.order) + 1
            key, secret = f"STANDINKEY{i}", f"standin/secret+{i}"
            token = f"standin-token-{i}-" + "x" * 600
            ttl = self.cfg["ttl"]
            if self.cfg["first_ttl"] is not None:  # the next issue only
                ttl, self.cfg["first_ttl"] = self.cfg["first_ttl"], None
            self.issued[key] = (secret, token)
            self.order.append(key)
            return key, secret, token, _iso(time.time() + float(ttl))


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    @property
    def st(self):
        return self.server.state

    def _send(self, status, body=b"", ctype="application/xml", head=False):
        if isinstance(body, str):
            body = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _s3_error(self, status, code, head=False):
        self._send(status, f"<?xml version=\"1.0\"?><Error><Code>{code}</Code>"
                           f"<Message>stand-in says {code}</Message></Error>", head=head)

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n).decode() if n else ""

    # ---- dispatch ----
    def do_PUT(self):
        if self.path == "/latest/api/token":
            self.st.count("imds_token")
            if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return self._send(400, "missing ttl", "text/plain")
            return self._send(200, "standin-imds-token", "text/plain")
        self._send(405, "", "text/plain")

    def do_POST(self):
        u = urllib.parse.urlsplit(self.path)
        if u.path == "/":
            return self._sts(dict(urllib.parse.parse_qsl(self._body(), keep_blank_values=True)))
        self._send(405, "", "text/plain")

    def do_HEAD(self):
        self._get(head=True)

    def do_GET(self):
        self._get(head=False)

    def _get(self, head):
        u = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(u.query, keep_blank_values=True))
        if u.path == "/" and "Action" in q:
            return self._sts(q)
        if u.path.startswith("/_admin/"):
            return self._admin(u.path[8:], q)
        if u.path == "/container/creds":
            return self._container()
        if u.path.startswith("/latest/meta-data/iam/security-credentials/"):
            return self._imds(u.path[len("/latest/meta-data/iam/security-credentials/"):])
        return self._s3(u, head)

    # ---- providers ----
    def _sts(self, q):
        self.st.count("sts")
        cfg = self.st.cfg
        if q.get("Action") != "AssumeRoleWithWebIdentity" or q.get("Version") != "2011-06-15" \
                or q.get("RoleArn") != cfg["role_arn"] or not q.get("RoleSessionName"):
            return self._send(400, "<ErrorResponse><Error><Code>ValidationError</Code>"
                                   "<Message>bad parameters</Message></Error></ErrorResponse>")
        if q.get("WebIdentityToken") != cfg["jwt"]:
            return self._send(403, "<ErrorResponse><Error><Code>AccessDenied</Code>"
                                   "<Message>Not authorized</Message></Error></ErrorResponse>")
        with self.st.lock:
            self.st.sessions.append(q["RoleSessionName"])
        key, secret, token, exp = self.st.issue()
        esc = lambda s: s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")  # noqa: E731
        self._send(200, f"""<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <SubjectFromWebIdentityToken>system:serviceaccount:ns:sa</SubjectFromWebIdentityToken>
    <AssumedRoleUser><Arn>{esc(cfg["role_arn"])}/x</Arn><AssumedRoleId>AROA:x</AssumedRoleId></AssumedRoleUser>
    <Credentials>
      <AccessKeyId>{key}</AccessKeyId>
      <SecretAccessKey>{esc(secret)}</SecretAccessKey>
      <SessionToken>{esc(token)}</SessionToken>
      <Expiration>{exp}</Expiration>
    </Credentials>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>""")

    def _creds_json(self, imds=False):
        key, secret, token, exp = self.st.issue()
        d = {"AccessKeyId": key, "SecretAccessKey": secret, "Token": token, "Expiration": exp}
        if imds:
            d = dict({"Code": "Success", "LastUpdated": exp, "Type": "AWS-HMAC"}, **d)
        return json.dumps(d, indent=2).replace("/", "\\/")  # as some servers escape it

    def _container(self):
        self.st.count("container")
        want = self.st.cfg["auth_token"]
        if want and self.headers.get("Authorization") != want:
            return self._send(401, "{}", "application/json")
        self._send(200, self._creds_json(), "application/json")

    def _imds(self, role):
        self.st.count("imds_role" if role else "imds_list")
        if self.headers.get("X-aws-ec2-metadata-token") != "standin-imds-token":
            return self._send(401, "", "text/plain")
        if not role:
            return self._send(200, "standin-role", "text/plain")
        if role != "standin-role":
            return self._send(404, "", "text/plain")
        self._send(200, self._creds_json(imds=True), "text/plain")

    def _admin(self, what, q):
        st = self.st
        with st.lock:
            if what == "set":
                for k, v in q.items():
                    st.cfg[k] = None if v == "" else (int(v) if k.endswith("ttl") or k.endswith("status") else v)
            elif what == "expire":
                st.expired.add(q["key"])
            elif what == "reset":
                st.counts.clear()
                st.s3.clear()
        if what == "state":
            with st.lock:
                log = ",".join(f"{e['key']}:{e['status']}" for e in st.s3)
                body = json.dumps({"counts": st.counts, "issued": st.order, "s3": st.s3,
                                   "s3_log": log, "sessions": st.sessions})
            return self._send(200, body, "application/json")
        self._send(200, "ok", "text/plain")

    # ---- S3 ----
    def _verify(self, u):
        """(key id, verdict): verdict None when the signature is right."""
        auth = self.headers.get("Authorization") or ""
        if not auth.startswith("AWS4-HMAC-SHA256 "):
            return None, "AccessDenied"
        parts = dict(p.strip().split("=", 1) for p in auth[len("AWS4-HMAC-SHA256 "):].split(","))
        cred = parts.get("Credential", "").split("/")
        if len(cred) != 5:
            return None, "AuthorizationHeaderMalformed"
        key, date, region, service = cred[0], cred[1], cred[2], cred[3]
        with self.st.lock:
            secret = self.st.issued.get(key, (STATIC.get(key), None))[0]
        if secret is None:
            return key, "InvalidAccessKeyId"
        signed = parts.get("SignedHeaders", "").split(";")
        canon = "".join(f"{h}:{' '.join((self.headers.get(h) or '').split())}\n" for h in signed)
        query = "&".join(sorted(u.query.split("&"))) if u.query else ""
        creq = "\n".join([self.command, u.path, query, canon, ";".join(signed),
                          self.headers.get("x-amz-content-sha256") or ""])
        amz_date = self.headers.get("x-amz-date") or ""
        sts = "\n".join(["AWS4-HMAC-SHA256", amz_date, f"{date}/{region}/{service}/aws4_request",
                         hashlib.sha256(creq.encode()).hexdigest()])
        k = ("AWS4" + secret).encode()
        for p in (date, region, service, "aws4_request"):
            k = _hmac(k, p)
        if hmac.new(k, sts.encode(), hashlib.sha256).hexdigest() != parts.get("Signature"):
            return key, "SignatureDoesNotMatch"
        return key, None

    def _s3(self, u, head):
        self.st.count("s3")
        key, verdict = self._verify(u)
        token = self.headers.get("x-amz-security-token")
        status = 200
        with self.st.lock:
            issued = self.st.issued.get(key)
            expired = key in self.st.expired
            exp_status = self.st.cfg["expired_status"]
        if verdict is None and issued and token != issued[1]:
            verdict = "InvalidToken"
        if verdict is None and expired:
            verdict = "ExpiredToken"
        path = os.path.join(self.server.root, urllib.parse.unquote(u.path).lstrip("/"))
        if verdict:
            status = exp_status if verdict == "ExpiredToken" else (
                400 if verdict in ("InvalidToken", "AuthorizationHeaderMalformed") else 403)
            self._s3_error(status, verdict, head)
        elif not os.path.isfile(path):
            status = 404
            self._s3_error(404, "NoSuchKey", head)
        else:
            with open(path, "rb") as f:
                self._send(200, f.read(), "application/octet-stream", head)
        with self.st.lock:
            self.st.s3.append({"key": key, "status": status, "token": token is not None})


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root, port=0):
        super().__init__(("127.0.0.1", port), Handler)
        self.root = root
        self.state = State()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--ready-file", required=True)
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    srv = Server(a.root, a.port)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown).start())
    tmp = a.ready_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(srv.url)
    os.replace(tmp, a.ready_file)
    srv.serve_forever()
    srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
