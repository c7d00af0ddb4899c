// Acquires in named pools from Node (@grpc/grpc-js), from the proto alone: a second
// implementation of pool selection on the wire, run by tests/test_node_pools.py.
//
// usage: node pool_acquire.js TARGET ACME_TOKEN GLOBEX_TOKEN PROTO_DIR
// Against a three-pool platform (cpu-a, cpu-b, gpu: tests/grpc_fixtures.py pools_policy_yaml),
// each on the per-session Acquire stream: a session naming pool gpu, one selecting kind=cpu, one
// more in gpu (full: it queues there, with the pool and a reason), an unknown pool, a selector
// matching nothing, and globex (no gpu quota) in gpu. The refusals' google.rpc.Status is decoded
// from grpc-status-details-bin (BadRequest field, ErrorInfo reason). Prints one JSON line.
"use strict";

const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");
const protobuf = require("protobufjs");

const [target, acmeToken, globexToken, protoDir] = process.argv.slice(2);
const opts = { keepCase: true, longs: String, enums: String, oneofs: true, includeDirs: [protoDir] };
const v1 = grpc.loadPackageDefinition(
  protoLoader.loadSync(path.join(protoDir, "slotsched/v1/scheduler.proto"), opts)
).slotsched.v1;
const rpcTypes = new protobuf.Root();
rpcTypes.resolvePath = (_origin, target) => path.join(protoDir, target);
rpcTypes.loadSync(["google/rpc/status.proto", "google/rpc/error_details.proto"], { keepCase: true });
const Status = rpcTypes.lookupType("google.rpc.Status");

function fail(msg) {
  console.error(`node pool client: ${msg}`);
  process.exit(1);
}
setTimeout(() => fail("timed out"), 20000).unref();

function metadata(token) {
  const md = new grpc.Metadata();
  md.set("authorization", `Bearer ${token}`);
  return md;
}
const acme = new v1.Scheduler(target, grpc.credentials.createInsecure());

// The google.rpc.Status of a refusal: its code, the BadRequest fields and the ErrorInfo reason.
function details(err) {
  const raw = err.metadata && err.metadata.get("grpc-status-details-bin")[0];
  const out = { code: err.code, message: err.details, fields: [], reason: "" };
  if (!raw) return out;
  for (const any of Status.decode(raw).details) {
    const name = any.type_url.split("/").pop();
    const msg = rpcTypes.lookupType(name).decode(any.value);
    if (name === "google.rpc.BadRequest") out.fields = msg.field_violations.map((v) => v.field);
    if (name === "google.rpc.ErrorInfo") out.reason = msg.reason;
  }
  return out;
}

// Opens an Acquire stream; resolves with its first event, or with the refusal.
function acquire(token, request) {
  return new Promise((resolve) => {
    const call = acme.Acquire({ qos: "QOS_CLASS_BURSTABLE", ...request }, metadata(token));
    let done = false;
    call.on("data", (ev) => {
      if (!done) {
        done = true;
        resolve({ call, event: ev });
      }
    });
    call.on("error", (err) => {
      if (!done) {
        done = true;
        resolve({ call, error: details(err) });
      }
    });
  });
}

async function main() {
  const seen = {};
  const g1 = await acquire(acmeToken, { session_id: "g1", pool: "gpu" });
  seen.named = g1.event.granted ? { pool: g1.event.granted.lease.pool, worker: g1.event.granted.lease.slot.worker_id } : g1;
  const c1 = await acquire(acmeToken, { session_id: "c1", selector: { kind: "cpu" } });
  seen.selected = c1.event.granted ? { pool: c1.event.granted.lease.pool } : c1;
  const g2 = await acquire(acmeToken, { session_id: "g2", pool: "gpu" });
  seen.queued = g2.event && g2.event.queued ? { pool: g2.event.queued.pool, reason: g2.event.queued.reason } : g2;
  seen.unknown = (await acquire(acmeToken, { session_id: "u1", pool: "nowhere" })).error;
  seen.no_match = (await acquire(acmeToken, { session_id: "u2", selector: { kind: "tpu" } })).error;
  seen.no_quota = (await acquire(globexToken, { session_id: "x1", pool: "gpu" })).error;
  // g1 released: g2, waiting in gpu, is granted there; then both end RELEASED.
  const next = (c) => new Promise((resolve) => c.call.once("data", resolve));
  const ended = (c) =>
    new Promise((resolve) => {
      const on = (ev) => (ev.ended ? resolve(ev.ended.reason) : c.call.once("data", on));
      c.call.once("data", on);
    });
  const release = (lease, token) =>
    new Promise((resolve, reject) =>
      acme.Release({ session_id: lease.session_id, lease_id: lease.lease_id, epoch: lease.epoch }, metadata(token), (e) =>
        e ? reject(e) : resolve()
      )
    );
  const g1Ended = ended(g1);
  const g2Next = next(g2);
  await release(g1.event.granted.lease, acmeToken);
  const regrant = await g2Next;
  seen.after_release = regrant.granted ? { pool: regrant.granted.lease.pool } : regrant;
  const g2Ended = ended(g2);
  await release(regrant.granted.lease, acmeToken);
  seen.ended = [await g1Ended, await g2Ended];
  c1.call.cancel();
  console.log(JSON.stringify(seen));
  process.exit(0);
}
main().catch((e) => fail(String(e && e.stack)));
