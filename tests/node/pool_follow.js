// Follows per-pool leaders from Node (@grpc/grpc-js), from the proto and the documented metadata
// alone: a second implementation of `serve --leadership pool` routing, run by
// tests/test_node_pool_follow.py.
//
// usage: node pool_follow.js TARGETS TOKEN PROTO_DIR POOL...
// TARGETS is a comma-separated list of HOST:PORT. For each pool, in order, a Burstable session
// is acquired on the per-session Acquire stream, starting at the FIRST target. A refusal
// UNAVAILABLE with ErrorInfo reason NOT_LEADER naming that pool (trailing `x-slotsched-pool`, or
// the ErrorInfo's metadata `pool`) and its leader (trailing `x-slotsched-leader`, or the
// ErrorInfo's `leader`) is followed to that leader: one grpc Client per address, shared by the
// pools that go there. A refusal naming no leader (an election under way), or a replica that
// cannot be reached, sends the next attempt to the next target after `retry-after-ms` (200 ms if
// absent). Any other refusal, or a NOT_LEADER naming another pool, is a failure. Once granted,
// the lease is released on the replica that granted it.
//
// Prints one JSON line per pool:
//   {"pool", "granted_by": address, "redirects": leaders followed, "retries": next-target tries,
//    "lease_pool": the granted lease's pool, "released": bool}
"use strict";

const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");
const protobuf = require("protobufjs");

const [targetList, token, protoDir, ...pools] = process.argv.slice(2);
const targets = (targetList || "").split(",").filter((t) => t);
if (!targets.length || !token || !protoDir || !pools.length) {
  console.error("usage: node pool_follow.js TARGETS TOKEN PROTO_DIR POOL...");
  process.exit(2);
}
const opts = { keepCase: true, longs: String, enums: String, oneofs: true, includeDirs: [protoDir] };
const v1 = grpc.loadPackageDefinition(
  protoLoader.loadSync(path.join(protoDir, "slotsched/v1/scheduler.proto"), opts)
).slotsched.v1;
const rpcTypes = new protobuf.Root();
rpcTypes.resolvePath = (_origin, target) => path.join(protoDir, target);
rpcTypes.loadSync(["google/rpc/status.proto", "google/rpc/error_details.proto"], { keepCase: true });
const Status = rpcTypes.lookupType("google.rpc.Status");

const LEADER = "x-slotsched-leader";
const POOL = "x-slotsched-pool";
const RETRY_AFTER = "retry-after-ms";
const MAX_HOPS = 20; // per pool: leaders followed plus targets tried

function fail(msg) {
  console.error(`node pool follow: ${msg}`);
  process.exit(1);
}
setTimeout(() => fail("timed out"), 30000).unref();

function metadata() {
  const md = new grpc.Metadata();
  md.set("authorization", `Bearer ${token}`);
  return md;
}

// One client per address, shared by every pool that goes there.
const clients = new Map();
function client(address) {
  if (!clients.has(address)) clients.set(address, new v1.Scheduler(address, grpc.credentials.createInsecure()));
  return clients.get(address);
}

function first(md, key) {
  const v = md ? md.get(key)[0] : undefined;
  return v === undefined ? "" : String(v);
}

// A refusal: its code and message, the trailing keys this client reads, and the ErrorInfo.
function refusal(err) {
  const md = err.metadata;
  const out = {
    code: err.code,
    message: err.details,
    leader: first(md, LEADER),
    pool: first(md, POOL),
    retryAfterMs: first(md, RETRY_AFTER),
    reason: "",
    info: {},
  };
  const raw = md && md.get("grpc-status-details-bin")[0];
  if (raw) {
    for (const any of Status.decode(raw).details) {
      const name = any.type_url.split("/").pop();
      if (name !== "google.rpc.ErrorInfo") continue;
      const info = rpcTypes.lookupType(name).decode(any.value);
      out.reason = info.reason;
      out.info = info.metadata || {};
    }
  }
  return out;
}

// Opens an Acquire stream on `address`; resolves with its Granted event (queued events are
// waited through), or with the refusal it ends with.
function acquire(address, sessionId, pool) {
  return new Promise((resolve) => {
    const call = client(address).Acquire(
      { session_id: sessionId, qos: "QOS_CLASS_BURSTABLE", pool },
      metadata()
    );
    let done = false;
    const settle = (v) => {
      if (!done) {
        done = true;
        resolve(v);
      }
    };
    call.on("data", (ev) => {
      if (ev.granted) settle({ call, granted: ev.granted });
      else if (ev.ended) settle({ call, ended: ev.ended });
    });
    call.on("error", (err) => settle({ call, error: refusal(err) }));
    call.on("end", () => settle({ call, error: { code: grpc.status.OK, message: "stream ended before a grant" } }));
  });
}

function release(address, lease) {
  return new Promise((resolve) =>
    client(address).Release(
      { session_id: lease.session_id, lease_id: lease.lease_id, epoch: lease.epoch },
      metadata(),
      (e) => resolve(e ? `${e.code}: ${e.details}` : true)
    )
  );
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function follow(pool) {
  let index = 0; // the target tried when no leader is named
  let address = targets[0];
  let redirects = 0;
  let retries = 0;
  const sessionId = `follow-${pool}`;
  for (let hop = 0; hop <= MAX_HOPS; hop++) {
    const got = await acquire(address, sessionId, pool);
    if (got.granted) {
      const lease = got.granted.lease;
      const ended = new Promise((resolve) => {
        got.call.on("data", (ev) => ev.ended && resolve(ev.ended.reason));
        got.call.on("error", () => resolve("error"));
        got.call.on("end", () => resolve("end"));
      });
      const released = await release(address, lease);
      if (released === true) await ended;
      else got.call.cancel();
      return { pool, granted_by: address, redirects, retries, lease_pool: lease.pool, released };
    }
    if (got.ended) fail(`${pool} at ${address}: ended before a grant: ${JSON.stringify(got.ended)}`);
    const err = got.error;
    if (err.code !== grpc.status.UNAVAILABLE) fail(`${pool} at ${address}: refused: ${JSON.stringify(err)}`);
    if (err.reason === "NOT_LEADER") {
      const named = err.pool || err.info.pool || "";
      if (named !== pool) fail(`${pool} at ${address}: NOT_LEADER names pool ${JSON.stringify(named)}`);
      const leader = err.leader || err.info.leader || "";
      if (leader) {
        if (leader === address) fail(`${pool} at ${address}: NOT_LEADER names this replica as the leader`);
        address = leader;
        redirects += 1;
        continue;
      }
    }
    // No leader named (an election under way) or the replica unreachable: the next target, later.
    const wait = Number.parseInt(err.retryAfterMs, 10);
    await sleep(Number.isFinite(wait) && wait >= 0 ? wait : 200);
    index = (index + 1) % targets.length;
    address = targets[index];
    retries += 1;
  }
  fail(`${pool}: no grant after ${MAX_HOPS} hops`);
}

async function main() {
  for (const pool of pools) console.log(JSON.stringify(await follow(pool)));
  for (const c of clients.values()) c.close();
  process.exit(0);
}
main().catch((e) => fail(String(e && e.stack)));
