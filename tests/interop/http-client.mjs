// Interop check: the official npm SDK's Streamable HTTP transport
// (`@agentclientprotocol/sdk/experimental/http-client`) against a running acpd.
// Usage: ACPD_URL=http://127.0.0.1:7420/acp ACPD_CWD=/some/dir [ACPD_TOKEN=…] node http-client.mjs
// Exit 0 when initialize → session/new → session/prompt ("echo hi", scripted agent) gave
// the updates and the end_turn answer through the SDK's POST + SSE streams.
import { createHttpStream } from "@agentclientprotocol/sdk/experimental/http-client";

const url = process.env.ACPD_URL;
const cwd = process.env.ACPD_CWD;
const headers = process.env.ACPD_TOKEN ? { Authorization: `Bearer ${process.env.ACPD_TOKEN}` } : {};
const stream = createHttpStream(url, { headers });
const writer = stream.writable.getWriter();
const reader = stream.readable.getReader();
const seen = [];

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
clearTimeout(timer);
console.error(`ok: session ${sessionId}, ${seen.length} messages`);
