// An agent's login, run on acpd's host and shown here (issue 43's console side): the page
// opens `/acp/login?agent=NAME` (subprotocol acpd.login.v1, the console's cookie) and shows
// the login's terminal as plain text (escape sequences dropped), the URLs it prints as links,
// a device code it prints in large type, and how it ended. A line typed in the input goes to
// the login with Enter; "Cancel" sends Ctrl-C.
//
// A login that waits for its OAuth redirect on a loopback port of acpd's host cannot get it
// from this browser (its localhost is another machine's): the address the sign-in ended on is
// pasted here, and the page makes that request through the link's forwarded connection, as
// acp-shim's forwarding does for an editor.
//
// A browser never sees why a WebSocket upgrade was refused, so the page asks
// `/web/api/logins` first, and again when the socket closes before the login started: its
// `refusal` is exactly what `/acp/login` answers.
import { api, el, wireSignOut } from '/web/common.js';

const parts = location.pathname.split('/');
const agent = decodeURIComponent(parts[parts.length - 2] || '');
const screen = document.getElementById('screen');
const start = document.getElementById('start');
const interrupt = document.getElementById('interrupt');
const inputForm = document.getElementById('input-form');
const input = document.getElementById('input');
const urls = document.getElementById('urls');
const outcome = document.getElementById('outcome');
const refusalBox = document.getElementById('refusal');
const callbackForm = document.getElementById('callback-form');
const callbackResult = document.getElementById('callback-result');

const TERMINAL = 0;
const TUNNEL = 1;
const MAX_SCREEN = 256 * 1024; // characters kept; older output is dropped
const CALLBACK_WAIT_MS = 15000;
const COLS = 100;
const ROWS = 30;

let ws = null;
let started = false;
let ended = false;
const listening = new Set(); // the login's loopback ports on acpd's host
const tunnels = new Map(); // forwarded connection → { chunks, done }
let nextConn = 1;

function setState(state, text) {
  document.body.dataset.login = state;
  document.getElementById('state').textContent = text;
}

// Terminal output as plain text: escape sequences dropped (also when a chunk splits one), a
// lone carriage return starts the line again, backspace takes a character back.
const term = { text: '', lineStart: 0, pendingCr: false, escape: '' };
const decoder = new TextDecoder();

function termWrite(bytes) {
  let s = term.escape + decoder.decode(bytes, { stream: true });
  term.escape = '';
  let out = term.text;
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (c === '\x1b') {
      const end = escapeEnd(s, i);
      if (end < 0) { term.escape = s.slice(i); break; }
      i = end;
      continue;
    }
    if (term.pendingCr) {
      term.pendingCr = false;
      if (c !== '\n') out = out.slice(0, term.lineStart);
    }
    if (c === '\n') { out += '\n'; term.lineStart = out.length; }
    else if (c === '\r') term.pendingCr = true;
    else if (c === '\b' || c === '\x7f') { if (out.length > term.lineStart) out = out.slice(0, -1); }
    else if (c === '\t' || c >= ' ') out += c;
  }
  if (out.length > MAX_SCREEN) {
    const cut = out.length - MAX_SCREEN;
    out = out.slice(cut);
    term.lineStart = Math.max(0, term.lineStart - cut);
  }
  term.text = out;
  screen.textContent = out;
  screen.scrollTop = screen.scrollHeight;
  findCode(out.slice(Math.max(0, out.length - 4096)));
}

// Where the escape sequence at `i` ends (its last index), -1 if the text ends inside it.
function escapeEnd(s, i) {
  const kind = s[i + 1];
  if (kind === undefined) return -1;
  if (kind === '[') {
    for (let j = i + 2; j < s.length; j++) if (s[j] >= '@' && s[j] <= '~') return j;
    return -1;
  }
  if (kind === ']' || kind === 'P' || kind === '_') {
    for (let j = i + 2; j < s.length; j++) {
      if (s[j] === '\x07') return j;
      if (s[j] === '\x1b' && s[j + 1] === '\\') return j + 1;
      if (s[j] === '\x1b' && s[j + 1] === undefined) return -1;
    }
    return -1;
  }
  if (kind === '(' || kind === ')') return s[i + 2] === undefined ? -1 : i + 2;
  return i + 1;
}

// A device-flow code ("enter the code WDJB-MJHT"): the newest line that speaks of a code and
// holds groups of capitals and digits joined by dashes.
function findCode(text) {
  const lines = text.split('\n').reverse();
  for (const line of lines) {
    if (!/code/i.test(line)) continue;
    const m = line.match(/\b([A-Z0-9]{3,}(?:-[A-Z0-9]{3,})+)\b/);
    if (!m) continue;
    document.getElementById('code').textContent = m[1];
    document.getElementById('device-code').hidden = false;
    return;
  }
}

function showUrl(url) {
  if (!/^https?:\/\//.test(url)) return;
  if ([...urls.querySelectorAll('a')].some((a) => a.href === url || a.textContent === url)) return;
  const link = el('a', { href: url, text: url, target: '_blank', rel: 'noopener noreferrer' });
  urls.append(el('li', {}, link));
}

function showListening(port) {
  listening.add(port);
  const ports = [...listening].join(', ');
  document.getElementById('callback-hint').textContent =
    `The login waits for its sign-in redirect on port ${ports} of acpd's host. If your browser ` +
    `ends on an address at http://localhost:${[...listening][0]}/… that does not load (this ` +
    `device's localhost is not acpd's host), paste that address here and the page delivers it.`;
  callbackForm.hidden = false;
}

function finish(kind, text) {
  ended = true;
  setState(kind, kind === 'success' ? 'done' : 'failed');
  outcome.className = `message ${kind === 'success' ? 'success' : 'error'}`;
  outcome.textContent = text;
  outcome.hidden = false;
  inputForm.hidden = true;
  interrupt.hidden = true;
  callbackForm.hidden = true;
  start.textContent = 'Start the login again';
  start.hidden = false;
}

function onControl(c) {
  switch (c.type) {
    case 'started':
      started = true;
      setState('running', 'running');
      document.getElementById('command').textContent = `Running: ${c.command}`;
      break;
    case 'url':
      showUrl(c.url);
      break;
    case 'listening':
      showListening(c.port);
      break;
    case 'close': {
      const t = tunnels.get(c.conn);
      if (t) t.done();
      break;
    }
    case 'exit':
      if (c.code === 0) finish('success', 'Logged in: the login exited with status 0.');
      else finish('failure', `The login failed: exit status ${c.code}${c.message ? ` (${c.message})` : ''}.`);
      break;
    case 'error':
      finish('failure', `The login could not start: ${c.message}`);
      break;
    default:
  }
}

function onBinary(buf) {
  const bytes = new Uint8Array(buf);
  if (bytes[0] === TERMINAL) termWrite(bytes.subarray(1));
  else if (bytes[0] === TUNNEL && bytes.length >= 5) {
    const conn = new DataView(buf).getUint32(1);
    const t = tunnels.get(conn);
    if (t) t.chunks.push(bytes.slice(5));
  }
}

function sendControl(c) {
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(c));
}

function sendTerminal(text) {
  if (!ws || ws.readyState !== WebSocket.OPEN) return;
  const body = new TextEncoder().encode(text);
  const frame = new Uint8Array(body.length + 1);
  frame[0] = TERMINAL;
  frame.set(body, 1);
  ws.send(frame);
}

async function refusal() {
  const info = await api('/web/api/logins');
  const entry = info.logins.find((l) => l.agent === agent);
  if (!entry) return { status: 404, message: 'no hosted agent of that name (the built-in agent has no login)' };
  return entry.refusal;
}

function showRefusal(r) {
  refusalBox.replaceChildren(el('strong', { text: 'acpd refuses this login: ' }), document.createTextNode(r.message));
  refusalBox.dataset.status = r.status;
  refusalBox.hidden = false;
  setState('refused', 'refused');
}

function begin() {
  started = false;
  ended = false;
  listening.clear();
  term.text = '';
  term.lineStart = 0;
  screen.textContent = '';
  screen.hidden = false;
  urls.replaceChildren();
  outcome.hidden = true;
  refusalBox.hidden = true;
  callbackForm.hidden = true;
  callbackResult.textContent = '';
  document.getElementById('device-code').hidden = true;
  start.hidden = true;
  setState('connecting', 'starting');
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const q = `agent=${encodeURIComponent(agent)}&cols=${COLS}&rows=${ROWS}`;
  const sock = new WebSocket(`${scheme}//${location.host}/acp/login?${q}`, 'acpd.login.v1');
  ws = sock;
  sock.binaryType = 'arraybuffer';
  // A socket of an earlier run (its close may come late) no longer speaks for the page.
  sock.addEventListener('open', () => {
    if (sock !== ws) return;
    inputForm.hidden = false;
    interrupt.hidden = false;
    input.focus();
  });
  sock.addEventListener('message', (ev) => {
    if (sock !== ws) return;
    if (typeof ev.data === 'string') {
      try { onControl(JSON.parse(ev.data)); } catch (_) { /* not ours */ }
    } else onBinary(ev.data);
  });
  sock.addEventListener('close', async () => {
    if (sock !== ws) return;
    for (const t of [...tunnels.values()]) t.done();
    if (ended) return;
    if (!started) {
      try {
        const r = await refusal();
        if (r) {
          showRefusal(r);
          finish('failure', 'The login did not start.');
          return;
        }
      } catch (_) { /* said below */ }
      finish('failure', 'The login link closed before the login started.');
      return;
    }
    finish('failure', 'The link to the login closed before it ended.');
  });
}

// The pasted callback address, requested on the login's port through the link.
async function deliver(address) {
  let u;
  try {
    u = new URL(address);
  } catch (_) {
    callbackResult.textContent = 'That is not an address.';
    return;
  }
  const port = Number(u.port || (u.protocol === 'https:' ? 443 : 80));
  if (u.protocol !== 'http:' || !['localhost', '127.0.0.1', '[::1]'].includes(u.hostname)) {
    callbackResult.textContent = 'Only an http://localhost address the login listens on can be delivered.';
    return;
  }
  if (!listening.has(port)) {
    callbackResult.textContent = `The login does not listen on port ${port} (it listens on ${[...listening].join(', ')}).`;
    return;
  }
  const conn = nextConn++;
  const answer = new Promise((resolve) => {
    const t = { chunks: [], done: () => { tunnels.delete(conn); resolve(t.chunks); } };
    tunnels.set(conn, t);
    setTimeout(() => { if (tunnels.has(conn)) { sendControl({ type: 'close', conn }); t.done(); } }, CALLBACK_WAIT_MS);
  });
  sendControl({ type: 'open', conn, port });
  const request = new TextEncoder().encode(
    `GET ${u.pathname}${u.search} HTTP/1.1\r\nHost: ${u.host}\r\nUser-Agent: acpd-web\r\nAccept: */*\r\nConnection: close\r\n\r\n`);
  const frame = new Uint8Array(request.length + 5);
  frame[0] = TUNNEL;
  new DataView(frame.buffer).setUint32(1, conn);
  frame.set(request, 5);
  ws.send(frame);
  callbackResult.textContent = 'Delivering…';
  const chunks = await answer;
  const text = new TextDecoder().decode(await new Blob(chunks).arrayBuffer());
  if (!text) {
    callbackResult.textContent = 'No answer from the login on that port.';
    return;
  }
  const [head, ...body] = text.split('\r\n\r\n');
  const status = head.split('\r\n')[0].replace(/^HTTP\/[\d.]+\s*/, '');
  callbackResult.textContent = `The login answered: ${status}${body.length ? ` — ${body.join('\r\n\r\n').slice(0, 500)}` : ''}`;
}

async function main() {
  wireSignOut();
  document.getElementById('title').textContent = `Log in agent ${agent}`;
  document.title = `acpd · log in ${agent}`;
  start.addEventListener('click', begin);
  interrupt.addEventListener('click', () => sendTerminal('\x03'));
  inputForm.addEventListener('submit', (ev) => {
    ev.preventDefault();
    sendTerminal(`${input.value}\r`);
    input.value = '';
  });
  callbackForm.addEventListener('submit', (ev) => {
    ev.preventDefault();
    deliver(document.getElementById('callback-url').value.trim());
  });
  let info;
  try {
    info = await api('/web/api/logins');
  } catch (e) {
    showRefusal({ status: e.status || 0, message: `cannot ask acpd: ${e.message}` });
    return;
  }
  const entry = info.logins.find((l) => l.agent === agent);
  if (!entry) {
    showRefusal({ status: 404, message: 'no hosted agent of that name (the built-in agent has no login)' });
    return;
  }
  document.getElementById('command').textContent = entry.command
    ? `Its login: ${entry.command}`
    : "Its login: the agent's own terminal login";
  if (entry.refusal) {
    showRefusal(entry.refusal);
    // Another login of the agent runs: it may end soon.
    if (entry.refusal.status === 409) start.hidden = false;
    return;
  }
  setState('ready', 'ready');
  start.hidden = false;
}

main();
