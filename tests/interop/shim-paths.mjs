// Interop check: the official npm SDK's stdio stream (`ndJsonStream`) in front of acp-shim with
// a path mapping, against a running acpd hosting the scripted agent.
// Usage: ACPD_SHIM=/path/acp-shim ACPD_URL=ws://… LOCAL=/Users/ed/app REMOTE=/box/app node shim-paths.mjs
// Exit 0 when the editor's paths went out as the box's and the box's came back as the editor's:
// session/new cwd, a prompt's resource_link, tool call locations / diff / link, fs and
// terminal requests, the session/list filter and its answer.
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import { ndJsonStream } from "@agentclientprotocol/sdk";

const { ACPD_SHIM, ACPD_URL, LOCAL, REMOTE } = process.env;
const child = spawn(ACPD_SHIM, ["--map", `${LOCAL}=${REMOTE}`, ACPD_URL], { stdio: ["pipe", "pipe", "inherit"] });
const stream = ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
const writer = stream.writable.getWriter();
const reader = stream.readable.getReader();
const seen = [];
const asked = {};

const answers = {
  "fs/read_text_file": { content: "text" },
  "terminal/create": { terminalId: "t1" },
  "terminal/wait_for_exit": { exitCode: 0 },
  "terminal/output": { output: "hi", truncated: false },
  "terminal/release": {},
};

async function call(id, method, params) {
  await writer.write({ jsonrpc: "2.0", id, method, params });
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`stream ended waiting for ${method}`);
    seen.push(value);
    if ("method" in value && "id" in value) {
      (asked[value.method] ??= []).push(value.params);
      await writer.write({ jsonrpc: "2.0", id: value.id, result: answers[value.method] ?? {} });
    } else if (!("method" in value) && value.id === id) {
      if (value.error) throw new Error(`${method}: ${JSON.stringify(value.error)}`);
      return value.result;
    }
  }
}

function check(ok, what) {
  if (!ok) {
    console.error(`failed: ${what}\n${JSON.stringify(seen)}`);
    process.exit(1);
  }
}

const timer = setTimeout(() => { console.error("timed out", JSON.stringify(seen)); process.exit(2); }, 20000);
const clientCapabilities = { fs: { readTextFile: true, writeTextFile: true }, terminal: true };
await call(1, "initialize", { protocolVersion: 1, clientCapabilities, clientInfo: { name: "sdk-shim", version: "0" } });
const { sessionId } = await call(2, "session/new", { cwd: LOCAL, mcpServers: [] });
const script = `where\nlinks\nlocate ${REMOTE}/a.rs\nread ${REMOTE}/a.rs\nterminal_at ${REMOTE} echo hi`;
const prompt = [
  { type: "text", text: script },
  { type: "resource_link", name: "b", uri: `file://${LOCAL}/b.rs` },
];
const answer = await call(3, "session/prompt", { sessionId, prompt });
check(answer.stopReason === "end_turn", `prompt answer ${JSON.stringify(answer)}`);
const updates = seen.filter((m) => m.method === "session/update").map((m) => m.params.update);
const texts = updates.filter((u) => u.sessionUpdate === "agent_message_chunk").map((u) => u.content.text);
check(texts.includes(`cwd: ${REMOTE} dirs: null`), "the agent saw the box's cwd");
check(texts.includes(`links: file://${REMOTE}/b.rs`), "the agent saw the box's link");
const tool = updates.find((u) => u.sessionUpdate === "tool_call");
check(tool?.locations?.[0]?.path === `${LOCAL}/a.rs`, "tool call location is local");
check(tool?.content?.[0]?.path === `${LOCAL}/a.rs`, "diff path is local");
check(tool?.content?.[1]?.content?.uri === `file://${LOCAL}/a.rs`, "tool call link is local");
check(asked["fs/read_text_file"]?.[0]?.path === `${LOCAL}/a.rs`, "fs read path is local");
check(asked["terminal/create"]?.[0]?.cwd === LOCAL, "terminal cwd is local");
const list = await call(4, "session/list", { cwd: LOCAL });
const listed = list.sessions.find((s) => s.sessionId === sessionId);
check(listed?.cwd === LOCAL, `listed under the local cwd: ${JSON.stringify(list)}`);
await writer.close();
clearTimeout(timer);
console.error(`ok: session ${sessionId}, ${seen.length} messages`);
child.kill();
