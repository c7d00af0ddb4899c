// A permit and a settle on Scheduler.Channel from Node (@grpc/grpc-js), from the proto alone,
// run by tests/test_permit_node.py.
//
// usage: node permit_client.js TARGET TOKEN PROTO_DIR BUDGET
// Acquires a session, asks for a permit on BUDGET (answered `queued` and then `granted` on the
// same ref, or `granted` at once), settles it with a usage, half-closes and expects status OK.
// Prints one JSON line with what it saw; exits non-zero on any surprise.
"use strict";

const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const [target, token, protoDir, budget] = process.argv.slice(2);
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
  console.error(`node permit client: ${msg}`);
  process.exit(1);
}
setTimeout(() => fail("timed out"), 20000).unref();

const call = client.Channel(md);
const seen = { permit: [], permit_id: null, settled: null, status: null };
let phase = "acquire";

call.on("data", (resp) => {
  for (const ev of resp.events) {
    if (ev.kind === "error") fail(`error event: ${JSON.stringify(ev.error.status)}`);
    if (phase === "acquire" && ev.kind === "event") {
      phase = "permit";
      const estimate = { input_tokens: 800, output_tokens: 200 };
      call.write({ commands: [{ ref: "2", request_permit: { session_id: "np", budget, estimate } }] });
    } else if (ev.kind === "permit") {
      if (ev.ref !== "2") fail(`permit answer on ref ${ev.ref}`);
      seen.permit.push(ev.permit.state);
      seen.permit_id = ev.permit.permit_id;
      if (ev.permit.state === "granted") {
        phase = "settle";
        const usage = { input_tokens: 700, output_tokens: 50 };
        call.write({ commands: [{ ref: "3", settle_permit: { session_id: "np", permit_id: seen.permit_id, usage } }] });
      }
    } else if (ev.kind === "settled") {
      seen.settled = { ref: ev.ref, charged: ev.settled.charged, refunded: ev.settled.refunded };
      phase = "done";
      call.end();
    }
  }
});
call.on("status", (st) => {
  seen.status = st.code;
  console.log(JSON.stringify(seen));
  process.exit(phase === "done" && st.code === 0 ? 0 : 1);
});
call.on("error", () => {}); // the status says it
call.write({ commands: [{ ref: "1", acquire: { session_id: "np", qos: "QOS_CLASS_BURSTABLE" } }] });
