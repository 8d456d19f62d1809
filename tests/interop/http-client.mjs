// Interop check: the official npm SDK's Streamable HTTP transport
// (`@agentclientprotocol/sdk/experimental/http-client`) against a running acpd.
// Usage: ACPD_URL=http://127.0.0.1:7420/acp ACPD_CWD=/some/dir [ACPD_TOKEN=…] node http-client.mjs
// Exit 0 when initialize → session/new → session/prompt ("echo hi", scripted agent) gave
// the updates and the end_turn answer through the SDK's POST + SSE streams, and the SDK's
// documented ACP v1 reconnect (a new transport, initialize, session/load) replays them.
import { createHttpStream } from "@agentclientprotocol/sdk/experimental/http-client";

const url = process.env.ACPD_URL;
const cwd = process.env.ACPD_CWD;
const headers = process.env.ACPD_TOKEN ? { Authorization: `Bearer ${process.env.ACPD_TOKEN}` } : {};
let stream = createHttpStream(url, { headers });
let writer = stream.writable.getWriter();
let reader = stream.readable.getReader();
let seen = [];

async function call(id, method, params) {
  await writer.write({ jsonrpc: "2.0", id, method, params });
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`stream ended waiting for ${method}`);
    seen.push(value);
    if (!("method" in value) && value.id === id) {
      if (value.error) throw new Error(`${method}: ${JSON.stringify(value.error)}`);
      return value.result;
    }
  }
}

const timer = setTimeout(() => { console.error("timed out", JSON.stringify(seen)); process.exit(2); }, 20000);
const init = await call(1, "initialize", { protocolVersion: 1, clientCapabilities: {}, clientInfo: { name: "sdk-interop", version: "0" } });
if (init.protocolVersion !== 1) throw new Error(`initialize: ${JSON.stringify(init)}`);
const { sessionId } = await call(2, "session/new", { cwd, mcpServers: [] });
const answer = await call(3, "session/prompt", { sessionId, prompt: [{ type: "text", text: "echo hi" }] });
const texts = seen
  .filter((m) => m.method === "session/update" && m.params.update.sessionUpdate === "agent_message_chunk")
  .map((m) => m.params.update.content.text);
if (answer.stopReason !== "end_turn" || texts.join("") !== "hi") {
  throw new Error(`prompt: ${JSON.stringify(answer)} ${JSON.stringify(texts)}`);
}
await writer.close();

// Reconnect the way the SDK documents for ACP v1: a new transport, initialize, session/load.
stream = createHttpStream(url, { headers });
writer = stream.writable.getWriter();
reader = stream.readable.getReader();
const first = seen.length;
seen = [];
const again = await call(1, "initialize", { protocolVersion: 1, clientCapabilities: {}, clientInfo: { name: "sdk-interop", version: "0" } });
if (!again.agentCapabilities?.loadSession) throw new Error(`no loadSession: ${JSON.stringify(again)}`);
await call(2, "session/load", { sessionId, cwd, mcpServers: [] });
const replayed = seen
  .filter((m) => m.method === "session/update" && m.params.update.sessionUpdate === "agent_message_chunk")
  .map((m) => m.params.update.content.text);
if (replayed.join("") !== "hi") throw new Error(`load replayed ${JSON.stringify(replayed)}`);
await writer.close();
clearTimeout(timer);
console.error(`ok: session ${sessionId}, ${first} messages, reloaded on a new connection`);
