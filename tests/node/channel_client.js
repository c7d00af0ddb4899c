// Drives Scheduler.Channel from Node (@grpc/grpc-js), from the proto alone: a second
// implementation of the channel's client side, run by tests/test_channel_node.py.
//
// usage: node channel_client.js TARGET TOKEN PROTO_DIR
// Acquires two sessions in one message, waits for both Granted, checks a per-session error (a
// renew quoting an unknown lease: NOT_FOUND as a SessionError), releases both in one message,
// waits for both Ended{RELEASED} and `released` answers, half-closes and expects status OK.
// Prints one JSON line with what it saw; exits non-zero on any surprise.
"use strict";

const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const [target, token, protoDir] = process.argv.slice(2);
const def = protoLoader.loadSync(path.join(protoDir, "slotsched/v1/scheduler.proto"), {
  keepCase: true,
  longs: String,
  enums: String,
  oneofs: true,
  includeDirs: [protoDir],
});
const v1 = grpc.loadPackageDefinition(def).slotsched.v1;
const client = new v1.Scheduler(target, grpc.credentials.createInsecure());
const md = new grpc.Metadata();
md.set("authorization", `Bearer ${token}`);

function fail(msg) {
  console.error(`node channel client: ${msg}`);
  process.exit(1);
}
setTimeout(() => fail("timed out"), 15000).unref();

const call = client.Channel(md);
const seen = { granted: {}, ended: {}, released: [], error: null, status: null };
let phase = "acquire";

call.on("data", (resp) => {
  for (const ev of resp.events) {
    if (ev.kind === "event") {
      const kind = ev.event.event;
      if (kind === "granted") seen.granted[ev.session_id] = ev.event.granted;
      if (kind === "ended") seen.ended[ev.session_id] = ev.event.ended.reason;
    } else if (ev.kind === "error") {
      seen.error = { ref: ev.ref, session_id: ev.session_id, code: ev.error.status.code, message: ev.error.status.message };
    } else if (ev.kind === "released") {
      seen.released.push(ev.ref);
    }
  }
  if (phase === "acquire" && seen.granted.a && seen.granted.b) {
    phase = "error";
    call.write({ commands: [{ ref: "3", renew: { session_id: "a", lease_id: "no-such-lease", epoch: "1" } }] });
  }
  if (phase === "error" && seen.error) {
    phase = "release";
    const release = (ref, sid) => ({
      ref,
      release: { session_id: sid, lease_id: seen.granted[sid].lease.lease_id, epoch: seen.granted[sid].lease.epoch },
    });
    call.write({ commands: [release("4", "a"), release("5", "b")] });
  }
  if (phase === "release" && seen.released.length === 2 && seen.ended.a && seen.ended.b) {
    phase = "closing";
    call.end();
  }
});
call.on("error", (err) => fail(`channel failed: ${err.code} ${err.details}`));
call.on("status", (st) => {
  seen.status = st.code;
  const grants = Object.fromEntries(
    Object.entries(seen.granted).map(([sid, g]) => [sid, { lease_id: g.lease.lease_id, grant: g.grant.length > 0 }])
  );
  console.log(JSON.stringify({ grants, ended: seen.ended, released: seen.released, error: seen.error, status: st.code, phase }));
  process.exit(st.code === grpc.status.OK && phase === "closing" ? 0 : 1);
});

call.write({
  commands: [
    { ref: "1", acquire: { session_id: "a", qos: "QOS_CLASS_BURSTABLE" } },
    { ref: "2", acquire: { session_id: "b", qos: "QOS_CLASS_BURSTABLE" } },
  ],
});
