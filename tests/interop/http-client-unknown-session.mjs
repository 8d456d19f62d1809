// Interop check: the official npm SDK's Streamable HTTP client keeps its connection when a
// request names a session acpd does not know. The SDK opens the session's stream (GET with
// Acp-Session-Id) before it POSTs; a 401/403/404/410 there would close the whole transport.
// Usage: ACPD_URL=http://127.0.0.1:7420/acp ACPD_CWD=/some/dir [ACPD_TOKEN=…] node this.mjs
// Exit 0 when, on one connection: session/load of a stale id is answered -32002,
// session/delete of an unknown id is answered {}, and then session/new + session/prompt
// ("echo hi", scripted agent) end the turn with the echo.
import { createHttpStream } from "@agentclientprotocol/sdk/experimental/http-client";

const url = process.env.ACPD_URL;
const cwd = process.env.ACPD_CWD;
const headers = process.env.ACPD_TOKEN ? { Authorization: `Bearer ${process.env.ACPD_TOKEN}` } : {};
const stream = createHttpStream(url, { headers });
const writer = stream.writable.getWriter();
const reader = stream.readable.getReader();
const seen = [];

// The answer (result or error) to request `id`.
async function call(id, method, params) {
  await writer.write({ jsonrpc: "2.0", id, method, params });
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`stream ended waiting for ${method}`);
    seen.push(value);
    if (!("method" in value) && value.id === id) return value;
  }
}

const timer = setTimeout(() => { console.error("timed out", JSON.stringify(seen)); process.exit(2); }, 20000);
const init = await call(1, "initialize", { protocolVersion: 1, clientCapabilities: {}, clientInfo: { name: "sdk-interop", version: "0" } });
if (init.result?.protocolVersion !== 1) throw new Error(`initialize: ${JSON.stringify(init)}`);
const stale = "00000000-0000-4000-8000-000000000000";
const load = await call(2, "session/load", { sessionId: stale, cwd, mcpServers: [] });
if (load.error?.code !== -32002) throw new Error(`load of a stale id: ${JSON.stringify(load)}`);
console.error(`stale load: ${load.error.code} ${load.error.message}`);
const del = await call(3, "session/delete", { sessionId: "11111111-1111-4111-8111-111111111111" });
if (del.error || JSON.stringify(del.result) !== "{}") throw new Error(`delete of an unknown id: ${JSON.stringify(del)}`);
console.error("unknown delete: {}");
const created = await call(4, "session/new", { cwd, mcpServers: [] });
const sessionId = created.result?.sessionId;
if (!sessionId) throw new Error(`session/new: ${JSON.stringify(created)}`);
const answer = await call(5, "session/prompt", { sessionId, prompt: [{ type: "text", text: "echo hi" }] });
const texts = seen
  .filter((m) => m.method === "session/update" && m.params.update.sessionUpdate === "agent_message_chunk")
  .map((m) => m.params.update.content.text);
if (answer.result?.stopReason !== "end_turn" || texts.join("") !== "hi") {
  throw new Error(`prompt: ${JSON.stringify(answer)} ${JSON.stringify(texts)}`);
}
await writer.close();
clearTimeout(timer);
console.error(`ok: the connection survived and ran session ${sessionId}`);
