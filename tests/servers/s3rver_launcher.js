'use strict';
// Starts @20minutes/s3rver 4.0.4 for stoker's tests (tests/servers/stk_servers.py,
// class S3Server). Run as
//   node --openssl-legacy-provider s3rver_launcher.js CONFIG.json
// (the legacy provider: s3rver encrypts ListObjectsV2 continuation tokens with DES).
// CONFIG holds: modules (the node_modules folder), directory (data), address,
// port (0 = any), accessKey, secretKey, region, anonymousRead, requestLog (a file
// of JSON lines, one per request), readyFile (written with the port once listening).
//
// On top of the stock server, so that a client tested against it behaves against S3:
//   - one account key pair, the configured one (the built-in S3RVER/S3RVER is revoked);
//   - requests without a signature are refused (403 AccessDenied) unless anonymousRead
//     is set, and then only GET/HEAD (the stock server lets anyone do anything);
//   - a credential scope naming another region is refused (400
//     AuthorizationHeaderMalformed, as S3 does; the stock server accepts any region);
//   - Range: `bytes=-N` (suffix) and `bytes=0-0` are served as RFC 9110 says (the
//     stock server returns bytes 0..N and the whole object), a range past the end is
//     416, a malformed or multi-range header is ignored (200, whole object);
//   - ListObjectsV2 lists keys in UTF-8 byte order, as S3 does, and pages without
//     losing keys (the stock server walks its directory tree, so that keys such as
//     "a b" and "a" or "a-b" and "a/c" come out of order and a continuation token
//     skips some of them);
//   - a request log for the tests.
const fs = require('fs');
const path = require('path');

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const base = path.join(config.modules, '@20minutes', 's3rver');
const S3rver = require(base);
const AWSAccount = require(path.join(base, 'lib', 'models', 'account'));
const S3Error = require(path.join(base, 'lib', 'models', 'error'));
const S3Object = require(path.join(base, 'lib', 'models', 'object'));
const FilesystemStore = require(path.join(base, 'lib', 'stores', 'filesystem'));
const objectCtrl = require(path.join(base, 'lib', 'controllers', 'object'));
const { walk } = require(path.join(base, 'lib', 'utils'));

AWSAccount.DUMMY_ACCOUNT.revokeAccessKey('S3RVER');
AWSAccount.DUMMY_ACCOUNT.createKeyPair(config.accessKey, config.secretKey);

const OBJECT_SUFFIX = '._S3rver_object';
const utf8Compare = (a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b));

// ListObjects(V2) in S3's order. Common prefixes (with a delimiter) are reported
// on the page that holds the first key under them, so each appears once; the
// controller makes the continuation token from the last object of the page.
FilesystemStore.prototype.listObjects = async function (bucket, options) {
  const { delimiter = '', startAfter = '', prefix = '', maxKeys = Infinity } = options;
  const bucketPath = this.getBucketPath(bucket);
  const all = [];
  for (const p of walk(bucketPath)) {
    if (p.endsWith(OBJECT_SUFFIX)) {
      all.push(p.slice(bucketPath.length + 1, -OBJECT_SUFFIX.length));
    }
  }
  all.sort(utf8Compare);
  const keys = [];
  const prefixes = new Set();
  let isTruncated = false;
  for (const key of all) {
    if (!key.startsWith(prefix) || utf8Compare(key, startAfter) <= 0) continue;
    const idx = delimiter ? key.slice(prefix.length).indexOf(delimiter) : -1;
    if (idx === -1) {
      if (keys.length === maxKeys) {
        isTruncated = true;
        break;
      }
      keys.push(key);
    } else {
      const cp = key.slice(0, prefix.length + idx + delimiter.length);
      // reported where its first key is: not when startAfter lies inside it
      if (!(startAfter.startsWith(cp) && utf8Compare(startAfter, cp) > 0)) prefixes.add(cp);
    }
  }
  const objects = [];
  for (const key of keys) {
    try {
      objects.push(new S3Object(bucket, key, null, await this.getMetadata(bucket, key)));
    } catch (err) {
      if (err.code !== 'ENOENT') throw err;
    }
  }
  return { objects, commonPrefixes: [...prefixes].sort(utf8Compare), isTruncated };
};

// GET/HEAD Object with a correct single range.
const stockGetObject = objectCtrl.getObject;
objectCtrl.getObject = async function (ctx) {
  const header = ctx.headers.range;
  if (header === undefined) return stockGetObject(ctx);
  const m = /^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$/.exec(header);
  if (!m || (m[1] === '' && m[2] === '') || (m[1] !== '' && m[2] !== '' && Number(m[2]) < Number(m[1]))) {
    delete ctx.headers.range; // not a single valid range: ignored, as RFC 9110 allows
    return stockGetObject(ctx);
  }
  const store = ctx.store;
  ctx.store = Object.create(store);
  ctx.store.getObject = async (bucket, key) => {
    let metadata;
    try {
      metadata = await store.getMetadata(bucket, key);
    } catch (err) {
      if (err.code === 'ENOENT') return null;
      throw err;
    }
    const size = Number(metadata['content-length']);
    let start;
    let end;
    if (m[1] === '') {
      start = Math.max(0, size - Number(m[2]));
      end = size - 1;
      if (Number(m[2]) === 0) start = size; // bytes=-0: unsatisfiable
    } else {
      start = Number(m[1]);
      end = m[2] === '' ? size - 1 : Math.min(Number(m[2]), size - 1);
    }
    const object = new S3Object(bucket, key, null, metadata);
    object.range = { start, end };
    if (start >= size) return object; // no content: the controller answers 416
    object.content = fs.createReadStream(store.getResourcePath(bucket, key, 'object'), { start, end });
    await new Promise((resolve, reject) => object.content.on('open', resolve).on('error', reject));
    return object;
  };
  return stockGetObject(ctx);
};

const logFd = fs.openSync(config.requestLog, 'a');

function credentialRegion(ctx) {
  let cred = ctx.query['X-Amz-Credential'];
  if (!cred) {
    const m = /Credential=([^,\s]+)/.exec(ctx.headers.authorization || '');
    cred = m ? m[1] : '';
  }
  const parts = cred.split('/');
  return parts.length === 5 ? parts[2] : null;
}

// The log has a line when a request comes ({"start": id}) and its entry when
// its response is over, so that a reader knows which requests are in progress.
let lastId = 0;

async function gate(ctx, next) {
  const id = ++lastId;
  fs.writeSync(logFd, JSON.stringify({ start: id }) + '\n');
  const t0 = process.hrtime.bigint();
  const range = ctx.get('range') || null;
  const signed =
    'authorization' in ctx.headers || 'X-Amz-Algorithm' in ctx.query || 'Signature' in ctx.query;
  ctx.res.on('close', () => {
    const entry = {
      id,
      method: ctx.method,
      path: ctx.path,
      uri: ctx.originalUrl,
      status: ctx.res.statusCode,
      range,
      bytes: ctx.method === 'HEAD' ? 0 : Number(ctx.res.getHeader('content-length') || 0),
      completed: ctx.res.writableFinished,
      signed,
      time: Date.now() / 1000,
      request_time: Number(process.hrtime.bigint() - t0) / 1e9,
    };
    fs.writeSync(logFd, JSON.stringify(entry) + '\n');
  });
  if (!signed && !(config.anonymousRead && ['GET', 'HEAD'].includes(ctx.method))) {
    throw new S3Error('AccessDenied', 'Access Denied');
  }
  const region = signed ? credentialRegion(ctx) : null;
  if (region !== null && region !== config.region) {
    throw new S3Error(
      'AuthorizationHeaderMalformed',
      // (no quotes around the names: s3rver's XML builder escapes them twice)
      `The authorization header is malformed; the region ${region} is wrong; ` +
        `expecting ${config.region}`,
      { Region: config.region },
    );
  }
  return next();
}

const server = new S3rver({
  directory: config.directory,
  address: config.address,
  port: config.port,
  silent: true,
  vhostBuckets: false,
});
// first in the chain: before routing and the signature check
server.middleware.unshift(gate);
server.run().then(
  ({ port }) => {
    const tmp = config.readyFile + '.tmp';
    fs.writeFileSync(tmp, String(port) + '\n');
    fs.renameSync(tmp, config.readyFile);
  },
  (err) => {
    console.error('s3rver: ' + err.message);
    process.exit(1);
  },
);
// Test data needs no orderly close: open keep-alive connections would only delay it.
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => process.exit(0));
