// A session's page: the conversation as the server renders it (pages of journal entries,
// older ones on scroll), then live: the page attaches to the session over ACP
// (`_acpd/session/attach`, observer unless the user takes control) and re-reads the newest
// blocks whenever an update arrives. A controller answers permissions, prompts, cancels and
// switches mode or config options through the same connection as any client.
import { api, el, describeClients, wireSignOut } from '/web/common.js';
import { Peer } from '/web/acp.js';

const id = decodeURIComponent(location.pathname.split('/').pop());
const wanted = new URLSearchParams(location.search).get('role') === 'controller' ? 'controller' : 'observer';
const log = document.getElementById('log');
const older = document.getElementById('older');
const turn = document.getElementById('turn');
const permissions = document.getElementById('permissions');
const composer = document.getElementById('composer');
const cancel = document.getElementById('cancel');
const entriesUrl = `/web/api/sessions/${encodeURIComponent(id)}/entries`;

let lastSeq = 0; // the newest journal seq the page has read
let oldestSeq = null; // the oldest one, for paging back
let hasOlder = false;
let peer = null;
let role = null;
const asked = new Map(); // permission requests waiting for a click, by JSON-RPC id

function blockNode(b) {
  const node = el('div', { class: `block block-${b.kind}` });
  node.dataset.seq = b.seq;
  node.dataset.last = b.last;
  node.dataset.open = b.open;
  if (b.tool) node.dataset.tool = b.tool;
  if (b.partial) node.dataset.partial = 'true';
  node.innerHTML = b.html; // rendered and sanitized by acpd (render.rs)
  return node;
}

// A tool call's later update merges into the block the page already shows for it.
function mergeTool(existing, update) {
  const status = update.querySelector('.status');
  const old = existing.querySelector('.status');
  if (status && old) old.replaceWith(status);
  for (const sel of ['.tool-locations', '.tool-input']) {
    const fresh = update.querySelector(sel);
    if (!fresh) continue;
    const stale = existing.querySelector(sel);
    if (stale) stale.replaceWith(fresh); else existing.append(fresh);
  }
  const content = update.querySelectorAll('.diff, .terminal, .tool-output');
  if (content.length) {
    existing.querySelectorAll('.diff, .terminal, .tool-output').forEach((n) => n.remove());
    existing.append(...content);
  }
  existing.dataset.last = update.dataset.last;
}

function append(b) {
  const node = blockNode(b);
  if (b.partial && b.tool) {
    const existing = [...log.querySelectorAll('[data-tool]')].find((n) => n.dataset.tool === b.tool);
    if (existing) {
      mergeTool(existing, node);
      return;
    }
  }
  log.append(node);
}

function atBottom() {
  return window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
}

async function firstPage() {
  const page = await api(`${entriesUrl}?limit=200`);
  page.blocks.forEach(append);
  lastSeq = page.lastSeq || 0;
  oldestSeq = page.firstSeq;
  hasOlder = page.more;
  older.hidden = !hasOlder;
  window.scrollTo(0, document.body.scrollHeight);
}

let loadingOlder = false;
async function loadOlder() {
  if (!hasOlder || loadingOlder || oldestSeq === null) return;
  loadingOlder = true;
  try {
    const page = await api(`${entriesUrl}?before=${oldestSeq}&limit=200`);
    const height = document.body.scrollHeight;
    const first = log.firstChild;
    for (const b of page.blocks) log.insertBefore(blockNode(b), first);
    window.scrollBy(0, document.body.scrollHeight - height);
    if (page.firstSeq !== null) oldestSeq = page.firstSeq;
    hasOlder = page.more;
    older.hidden = !hasOlder;
  } finally {
    loadingOlder = false;
  }
}

// Live: re-read from the first block that may still grow (a message being streamed).
let refreshing = false;
let again = false;
async function refresh() {
  if (refreshing) { again = true; return; }
  refreshing = true;
  try {
    do {
      again = false;
      const follow = atBottom();
      const tail = log.lastElementChild;
      const from = tail && tail.dataset.open === 'true' ? Number(tail.dataset.seq) : lastSeq + 1;
      const page = await api(`${entriesUrl}?after=${from - 1}&limit=500`);
      if (page.lastSeq === null) break;
      for (const node of [...log.children]) if (Number(node.dataset.seq) >= from) node.remove();
      page.blocks.forEach(append);
      lastSeq = Math.max(lastSeq, page.lastSeq);
      if (page.more) again = true;
      if (follow) window.scrollTo(0, document.body.scrollHeight);
    } while (again);
  } catch (e) {
    turn.textContent = `Cannot read the conversation: ${e.message}`;
  } finally {
    refreshing = false;
  }
}

let scheduled = null;
function scheduleRefresh() {
  if (scheduled) return;
  scheduled = setTimeout(() => { scheduled = null; refresh(); }, 60);
}

function showPresence(clients) {
  document.getElementById('presence').textContent = clients && clients.length ? `Attached: ${describeClients(clients)}` : '';
}

function askPermission(params, rpcId) {
  return new Promise((resolve) => {
    const tool = params.toolCall || {};
    const box = el('div', { class: 'permission' });
    box.dataset.request = String(rpcId);
    box.dataset.tool = tool.toolCallId || '';
    box.append(el('p', { class: 'permission-title', text: `Permission: ${tool.title || 'the agent asks'}` }));
    const paths = (tool.locations || []).map((l) => l.path).filter(Boolean);
    if (paths.length) box.append(el('p', { class: 'muted', text: paths.join(', ') }));
    const buttons = el('div', { class: 'row' });
    for (const option of params.options || []) {
      const b = el('button', { type: 'button', class: `option option-${option.kind || 'other'}`, text: option.name || option.optionId });
      b.dataset.option = option.optionId;
      b.addEventListener('click', () => {
        box.replaceChildren(el('p', { class: 'resolved', text: `You chose: ${option.name || option.optionId}` }));
        asked.delete(String(rpcId));
        setTimeout(() => box.remove(), 4000);
        resolve({ outcome: { outcome: 'selected', optionId: option.optionId } });
      });
      buttons.append(b);
    }
    box.append(buttons);
    permissions.append(box);
    box.scrollIntoView({ block: 'nearest' });
    asked.set(String(rpcId), { box, resolve });
  });
}

function withdraw(requestId) {
  const waiting = asked.get(String(requestId));
  if (!waiting) return;
  asked.delete(String(requestId));
  waiting.box.remove();
  waiting.resolve({ outcome: { outcome: 'cancelled' } });
}

function resolved(p) {
  const who = p.decidedBy ? `${p.decidedBy.principal}${p.decidedBy.name ? ' (' + p.decidedBy.name + ')' : ''}` : 'another client';
  const choice = p.outcome && p.outcome.optionId ? p.outcome.optionId : (p.outcome && p.outcome.outcome) || '';
  for (const box of permissions.querySelectorAll('.permission')) {
    if (box.dataset.tool === (p.toolCallId || '')) box.remove();
  }
  permissions.append(el('p', { class: 'resolved', text: `Permission answered by ${who}: ${choice}` }));
}

function showModes(meta) {
  const select = document.getElementById('mode');
  const modes = meta.modes && meta.modes.availableModes;
  if (!modes || !modes.length) return;
  select.replaceChildren(...modes.map((m) => el('option', { value: m.id, text: m.name || m.id })));
  select.value = meta.currentModeId || meta.modes.currentModeId || '';
  select.hidden = false;
  select.addEventListener('change', () => {
    peer.request('session/set_mode', { sessionId: id, modeId: select.value })
      .catch((e) => { turn.textContent = `Mode not changed: ${e.message}`; });
  });
}

function showOptions(options) {
  const box = document.getElementById('options');
  box.replaceChildren();
  for (const o of options || []) {
    if (o.type !== 'select' || !Array.isArray(o.options)) continue;
    const select = el('select', { 'aria-label': o.name || o.id });
    select.dataset.config = o.id;
    select.append(...o.options.map((v) => el('option', { value: v.value, text: v.name || v.value })));
    select.value = o.currentValue;
    select.addEventListener('change', () => {
      peer.request('session/set_config_option', { sessionId: id, configId: o.id, value: select.value })
        .then((r) => { if (r && r.configOptions) showOptions(r.configOptions); })
        .catch((e) => { turn.textContent = `Option not changed: ${e.message}`; });
    });
    box.append(el('label', { class: 'option-label', text: `${o.name || o.id} ` }, select));
  }
}

// Whether a turn is running, whoever started it: the session's status, polled.
let ownTurn = false;
function showRunning(running) {
  if (ownTurn) return;
  cancel.disabled = !running;
  if (running) {
    turn.textContent = 'A turn is running.';
    turn.dataset.state = 'running';
  } else if (turn.dataset.state === 'running') {
    turn.textContent = 'The turn ended.';
    turn.dataset.state = 'ended';
  }
}

async function pollStatus() {
  try {
    const meta = await api(`/web/api/sessions/${encodeURIComponent(id)}`);
    document.getElementById('title').textContent = meta.title || '(untitled)';
    if (role === 'controller') showRunning(meta.running);
  } catch (_) { /* shown on the next read */ }
  setTimeout(pollStatus, 2000);
}

let controlsWired = false;
function enableControls(meta) {
  composer.hidden = false;
  if (controlsWired) return;
  controlsWired = true;
  showModes(meta);
  showOptions(meta.configOptions);
  composer.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const input = document.getElementById('prompt');
    const text = input.value;
    if (!text.trim()) return;
    input.value = '';
    turn.textContent = 'Running…';
    turn.dataset.state = 'running';
    cancel.disabled = false;
    ownTurn = true;
    peer.request('session/prompt', { sessionId: id, prompt: [{ type: 'text', text }] })
      .then((r) => {
        turn.textContent = `Turn ended: ${r.stopReason}`;
        turn.dataset.state = r.stopReason;
      })
      .catch((e) => {
        turn.textContent = `Prompt failed: ${e.message}`;
        turn.dataset.state = 'error';
      })
      .finally(() => { ownTurn = false; cancel.disabled = true; scheduleRefresh(); });
  });
  cancel.addEventListener('click', () => peer.notify('session/cancel', { sessionId: id }));
  // Ctrl+Enter (⌘+Enter) sends; Enter alone is a new line.
  document.getElementById('prompt').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) composer.requestSubmit();
  });
}

// A lost connection (a phone's network, a daemon restart) attaches again after the last seq
// read, with backoff.
let retryMs = 1000;
let leaving = false;
window.addEventListener('pagehide', () => { leaving = true; });

async function connect(meta) {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  peer = new Peer(`${scheme}//${location.host}/acp?agent=${encodeURIComponent(meta.agent)}`);
  peer.onNotification = (method, p) => {
    if (method === 'session/update') {
      const u = p.update || {};
      if (u.sessionUpdate === 'config_option_update' && role === 'controller') showOptions(u.configOptions);
      if (u.sessionUpdate === 'current_mode_update') document.getElementById('mode').value = u.currentModeId;
      scheduleRefresh();
    } else if (method === '_acpd/session/presence') {
      showPresence(p.clients);
    } else if (method === '_acpd/session/request_resolved') {
      resolved(p);
    } else if (method === '$/cancel_request') {
      withdraw(p.requestId);
    }
  };
  peer.onRequest = async (method, p, rpcId) => {
    if (method === 'session/request_permission' && role === 'controller') return askPermission(p, rpcId);
    throw { code: -32601, message: `the web console does not serve ${method}` };
  };
  peer.onClose = () => {
    document.body.dataset.connection = 'closed';
    if (leaving) return;
    // The daemon asks a controller that attaches again about what is still open.
    for (const rpcId of [...asked.keys()]) withdraw(rpcId);
    turn.textContent = 'Disconnected; attaching again…';
    setTimeout(() => {
      connect(meta)
        .then(() => { retryMs = 1000; turn.textContent = ''; scheduleRefresh(); })
        .catch(() => { /* its close schedules the next try */ });
    }, retryMs);
    retryMs = Math.min(retryMs * 2, 15000);
  };
  await peer.opened;
  await peer.request('initialize', {
    protocolVersion: 1,
    clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
    clientInfo: { name: 'acpd-web', title: 'acpd web console', version: '1' },
  });
  let answer;
  try {
    answer = await peer.request('_acpd/session/attach', { sessionId: id, afterSeq: lastSeq, role: wanted });
  } catch (e) {
    // Beyond the journal's end (it was trimmed meanwhile): attached all the same.
    if (!(e.data && e.data.lastSeq !== undefined)) throw e;
    answer = { role: wanted, clients: [] };
  }
  role = answer.role;
  document.body.dataset.role = role;
  document.body.dataset.connection = 'attached';
  document.getElementById('role').textContent = role;
  document.getElementById('control').hidden = role === 'controller';
  document.getElementById('observe').hidden = role !== 'controller';
  showPresence(answer.clients);
  if (role === 'controller') {
    enableControls(meta);
    showRunning(meta.running);
  }
}

async function main() {
  wireSignOut();
  const meta = await api(`/web/api/sessions/${encodeURIComponent(id)}`);
  document.getElementById('title').textContent = meta.title || '(untitled)';
  document.title = `acpd · ${meta.title || id}`;
  document.getElementById('meta').textContent = `${meta.agent} · ${meta.cwd}`;
  await firstPage();
  older.addEventListener('click', loadOlder);
  window.addEventListener('scroll', () => { if (window.scrollY < 80) loadOlder(); });
  setTimeout(pollStatus, 2000);
  try {
    await connect(meta);
  } catch (e) {
    turn.textContent = `Cannot attach: ${e.message || 'connection failed'}; trying again…`;
    return;
  }
  scheduleRefresh();
}

main().catch((e) => { turn.textContent = `Cannot open the session: ${e.message}`; });
