"""Interop check: the official Python SDK (PyPI `agent-client-protocol`, module `acp`) as an
editor that launches acp-shim as its stdio agent, against a running acpd hosting the scripted
agent.

Usage: ACPD_SHIM=/path/acp-shim ACPD_URL=ws://… ACPD_TOKEN_FILE=… ACPD_CWD=/dir
       [ACPD_SHIM_LOG=file] python python-client.py
Exit 0 when, through the SDK's typed client side: initialize; session/new; a prompt that
streams, asks a permission this client answers, and ends with end_turn; session/load on a
new connection replaying the journal (the same text merged per message, plus the prompt, then
the session's state once);
session/cancel ending a waiting turn with stopReason "cancelled". Exit 1 with the first
mismatch, 2 on timeout. Results go to stderr, one `ok:` line per step.
"""

import asyncio
import contextlib
import importlib.metadata
import logging
import os
import sys

from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process, text_block
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    Implementation,
    RequestPermissionResponse,
)

STREAMED = 50
CHUNK = 32
SCRIPT = f"echo before\nstream {STREAMED} {CHUNK}\npermission\necho after"
EXPECTED_TEXTS = (
    ["before"]
    + [f"{i}:".ljust(CHUNK, "x") for i in range(STREAMED)]
    + ["permission: selected allow-once", "after"]
)
WAIT_SECS = 30


class Mismatch(Exception):
    """What the SDK saw is not what acpd should have sent."""


def check(ok, what):
    if not ok:
        raise Mismatch(what)


class SdkErrors(logging.Handler):
    """The SDK logs (and drops) messages it cannot handle, e.g. an update its schema rejects:
    for this check each such log line is a failure."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.lines = []

    def emit(self, record):
        self.lines.append(self.format(record))


class Editor:
    """The SDK's `Client` side: records what the agent sends and answers permission requests
    with the option of kind `allow_once`."""

    def __init__(self):
        self.updates = []  # (sessionId, _meta.acpd.seq, update as JSON)
        self.asked = []  # (toolCallId, [optionId])
        self.extensions = []  # `_acpd/...` notifications, by method

    async def session_update(self, session_id, update, **meta):
        seq = (meta.get("acpd") or {}).get("seq")
        as_json = update.model_dump(mode="json", by_alias=True, exclude_none=True)
        self.updates.append((session_id, seq, as_json))

    async def request_permission(self, session_id, tool_call, options, **meta):
        self.asked.append((tool_call.tool_call_id, [o.option_id for o in options]))
        allow = next((o for o in options if o.kind == "allow_once"), None)
        if allow is None:
            raise RequestError.invalid_params({"details": "no allow_once option"})
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=allow.option_id)
        )

    async def ext_notification(self, method, params):
        self.extensions.append(method)

    async def ext_method(self, method, params):
        raise RequestError.method_not_found(method)

    def texts(self, since=0):
        return [
            u["content"]["text"]
            for (_, _, u) in self.updates[since:]
            if u["sessionUpdate"] == "agent_message_chunk" and u["content"]["type"] == "text"
        ]


@contextlib.asynccontextmanager
async def shim(editor, log):
    """acp-shim as the agent command, the way an editor configures it."""
    command = os.environ["ACPD_SHIM"]
    args = ["--token-file", os.environ["ACPD_TOKEN_FILE"], os.environ["ACPD_URL"]]
    env = {k: os.environ[k] for k in ("XDG_DATA_HOME", "ACPD_LOG") if k in os.environ}
    async with spawn_agent_process(
        editor, command, *args, env=env, transport_kwargs={"stderr": log}
    ) as (conn, process):
        yield conn


async def initialize(conn):
    version = importlib.metadata.version("agent-client-protocol")
    init = await conn.initialize(
        protocol_version=PROTOCOL_VERSION,
        client_capabilities=ClientCapabilities(),
        client_info=Implementation(name="python-sdk-interop", version=version),
    )
    check(init.protocol_version == 1, f"initialize: protocolVersion {init.protocol_version}")
    check(init.agent_capabilities.load_session, f"initialize: no loadSession: {init}")
    return version


async def until(pred, what):
    """Waits (bounded) until `pred()`: the SDK handles notifications on tasks of their own."""
    for _ in range(1000):
        if pred():
            return
        await asyncio.sleep(0.01)
    raise Mismatch(f"waited 10 s for {what}")


async def first_connection(cwd, log):
    """initialize, session/new, the streaming prompt with its permission request."""
    editor = Editor()
    async with shim(editor, log) as conn:
        version = await initialize(conn)
        sid = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
        answer = await conn.prompt(session_id=sid, prompt=[text_block(SCRIPT)])
        check(answer.stop_reason == "end_turn", f"prompt: stopReason {answer.stop_reason}")
        texts = editor.texts()
        check(texts == EXPECTED_TEXTS, f"prompt: streamed texts {texts}")
        check(len(editor.asked) == 1, f"permission asked {editor.asked}")
        check(
            editor.asked[0][1] == ["allow-once", "allow-always", "reject-once", "reject-always"],
            f"permission options {editor.asked}",
        )
        check(all(s == sid for (s, _, _) in editor.updates), "updates for another session")
        seqs = [q for (_, q, _) in editor.updates]
        check(all(isinstance(q, int) for q in seqs), f"updates without _meta.acpd.seq: {seqs}")
        check(seqs == sorted(set(seqs)), f"seqs not increasing: {seqs}")
    print(f"ok: initialize with SDK {version}, protocolVersion 1", file=sys.stderr)
    print(
        f"ok: session {sid}: {len(editor.updates)} updates streamed, permission answered allow-once",
        file=sys.stderr,
    )
    return sid, editor.updates


async def second_connection(cwd, log, sid, live):
    """A new shim, initialize, session/load (the replay), then a turn ended by session/cancel."""
    editor = Editor()
    async with shim(editor, log) as conn:
        await initialize(conn)
        await conn.load_session(cwd=cwd, session_id=sid, mcp_servers=[])
        # The replay comes before the answer, and the SDK dispatches each notification
        # before the answer resumes us: what is recorded now is exactly the replay.
        replayed = list(editor.updates)
        users = [u for u in replayed if u[2]["sessionUpdate"] == "user_message_chunk"]
        agent = [u for u in replayed if u[2]["sessionUpdate"] != "user_message_chunk"]
        check(
            [u[2]["content"].get("text") for u in users] == [SCRIPT],
            f"load: replayed prompts {users}",
        )
        # A load replays the history merged per message, then the session's state (commands,
        # mode, config options) once each, after it (README, "session/load").
        state = ("available_commands_update", "current_mode_update", "config_option_update")
        history = [u for u in agent if u[2]["sessionUpdate"] not in state]
        after = [u for u in agent if u[2]["sessionUpdate"] in state]
        live_history = [u for u in live if u[2]["sessionUpdate"] not in state]

        def text(us):
            return "".join(u[2].get("content", {}).get("text", "") for u in us)

        check(text(history) == text(live_history), f"load: replay differs from the live updates\n{agent}\n{live}")
        check(len(history) <= len(live_history), f"load: replay longer than the live turn: {history}")
        check(agent[len(history):] == after, f"load: the state is not after the history: {agent}")
        kinds = [u[2]["sessionUpdate"] for u in after]
        check(len(kinds) == len(set(kinds)), f"load: state replayed twice: {kinds}")
        seqs = [q for (_, q, _) in history]
        check(seqs == sorted(set(seqs)), f"load: seqs not increasing: {seqs}")
        print(f"ok: session/load replayed {len(replayed)} updates on a new connection", file=sys.stderr)

        mark = len(editor.updates)
        turn = asyncio.create_task(
            conn.prompt(session_id=sid, prompt=[text_block("echo waiting\nwait_for_cancel")])
        )
        await until(lambda: "waiting" in editor.texts(mark), "the turn to start")
        await conn.cancel(session_id=sid)
        answer = await asyncio.wait_for(turn, 10)
        check(answer.stop_reason == "cancelled", f"cancel: stopReason {answer.stop_reason}")
        print("ok: session/cancel ended the turn with stopReason cancelled", file=sys.stderr)


async def main():
    errors = SdkErrors()
    logging.getLogger().addHandler(errors)
    cwd = os.environ["ACPD_CWD"]
    log_path = os.environ.get("ACPD_SHIM_LOG", os.devnull)
    with open(log_path, "ab") as log:
        sid, live = await first_connection(cwd, log)
        await second_connection(cwd, log, sid, live)
    check(not errors.lines, f"the SDK logged errors: {errors.lines}")


if __name__ == "__main__":
    try:
        asyncio.run(asyncio.wait_for(main(), WAIT_SECS))
    except Mismatch as e:
        print(f"failed: {e}", file=sys.stderr)
        sys.exit(1)
    except (RequestError, ConnectionError) as e:
        print(f"failed: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    except asyncio.TimeoutError:
        print(f"timed out after {WAIT_SECS} s", file=sys.stderr)
        sys.exit(2)
