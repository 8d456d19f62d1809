// A session's page: the conversation as the server renders it (pages of journal entries,
// older ones on scroll), then live: the page attaches to the session over ACP
// (`_acpd/session/attach`, observer unless the user takes control) and re-reads the newest
// blocks whenever an update arrives. A controller answers permissions, prompts, cancels and
// switches mode or config options through the same connection as any client.
//
// The page follows the conversation's end unless the user scrolled up ("Jump to latest"
// brings it back); how a turn ended (cancelled, failed and why) and who answered a permission
// are marked in the conversation itself; a permission waiting for this page puts a count in
// the tab's title and, if the user allowed it, a browser notification. What the session spent
// and who approved what is a panel of its own (`usage.js`).
import { api, el, describeClients, wireSignOut, errorText } from '/web/common.js';
import { Peer } from '/web/acp.js';
import { wireSessionSpend } from '/web/usage.js';

const id = decodeURIComponent(location.pathname.split('/').pop());
const wanted = new URLSearchParams(location.search).get('role') === 'controller' ? 'controller' : 'observer';
const log = document.getElementById('log');
const older = document.getElementById('older');
const turn = document.getElementById('turn');
const permissions = document.getElementById('permissions');
const composer = document.getElementById('composer');
const cancel = document.getElementById('cancel');
const jump = document.getElementById('jump');
const notifyButton = document.getElementById('notify');
const entriesUrl = `/web/api/sessions/${encodeURIComponent(id)}/entries`;

let lastSeq = 0; // the newest journal seq the page has read
let oldestSeq = null; // the oldest one, for paging back
let hasOlder = false;
let peer = null;
let role = null;
const asked = new Map(); // permission requests waiting for a click, by JSON-RPC id
let me = null; // the signed-in principal's name
let baseTitle = 'acpd';

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

// Following the end: on until the user scrolls up away from it, on again when they scroll
// back or jump. Content that grows (a block, a permission in the dock, the composer) moves the
// page down only while following; growth alone fires no scroll event, so it never turns
// following off (measuring "at the bottom" after the dock grew did). Only a scroll *up* turns
// it off: our own scroll to the end fires its event a frame later, and the page may have grown
// in between (the live stream attaching), so "not at the bottom" then is no user's doing.
let follow = true;
let lastY = 0;

function atBottom() {
  return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 40;
}

function toBottom() {
  window.scrollTo(0, document.documentElement.scrollHeight);
}

function setFollow(on) {
  follow = on;
  jump.hidden = on;
  document.body.dataset.follow = on;
}

function wireFollow() {
  window.addEventListener('scroll', () => {
    const y = window.scrollY;
    if (atBottom()) setFollow(true);
    else if (y < lastY) setFollow(false);
    lastY = y;
    if (y < 80) loadOlder();
  }, { passive: true });
  new ResizeObserver(() => { if (follow) toBottom(); }).observe(document.body);
  jump.addEventListener('click', () => { setFollow(true); toBottom(); });
}

async function firstPage() {
  const page = await api(`${entriesUrl}?limit=200`);
  page.blocks.forEach(append);
  lastSeq = page.lastSeq || 0;
  oldestSeq = page.firstSeq;
  hasOlder = page.more;
  older.hidden = !hasOlder;
  toBottom();
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

// Live: re-read from the first block that may still grow (a message being streamed). Reads
// and markers run one at a time, in order (`work`), so a marker lands after what the journal
// held when it was made.
async function readNew() {
  try {
    for (;;) {
      const tail = log.lastElementChild;
      const from = tail && tail.dataset.open === 'true' ? Number(tail.dataset.seq) : lastSeq + 1;
      const page = await api(`${entriesUrl}?after=${from - 1}&limit=500`);
      if (page.lastSeq === null) break;
      for (const node of [...log.children]) if (Number(node.dataset.seq) >= from) node.remove();
      page.blocks.forEach(append);
      lastSeq = Math.max(lastSeq, page.lastSeq);
      if (!page.more) break;
    }
  } catch (e) {
    turn.textContent = `Cannot read the conversation: ${e.message}`;
  }
}

let work = Promise.resolve();
let readQueued = false;
function refresh() {
  if (readQueued) return work;
  readQueued = true;
  work = work.then(() => { readQueued = false; return readNew(); });
  return work;
}

// A marker in the conversation (a turn's end, a permission's answer): after everything the
// journal holds now. Its seq is the last read, so re-reads never take it away; the message
// before it is closed (what comes after it is newer than the marker).
function mark(kind, text) {
  work = work.then(async () => {
    await readNew();
    const node = el('div', { class: `marker marker-${kind}`, role: 'note', text });
    node.dataset.seq = lastSeq;
    node.dataset.marker = kind;
    log.append(node);
  });
  return work;
}

let scheduled = null;
function scheduleRefresh() {
  if (scheduled) return;
  scheduled = setTimeout(() => { scheduled = null; refresh(); }, 60);
}

function showPresence(clients) {
  document.getElementById('presence').textContent = clients && clients.length ? `Attached: ${describeClients(clients)}` : '';
}

// The tab's title counts the permissions waiting for this page; a new one notifies when the
// user allowed notifications and is looking elsewhere.
function showWaiting(added) {
  const n = asked.size;
  document.title = n ? `(${n}) ${baseTitle}` : baseTitle;
  document.body.dataset.waiting = n;
  if (!added || !('Notification' in window) || Notification.permission !== 'granted') return;
  if (document.visibilityState === 'visible' && document.hasFocus()) return;
  try {
    const note = new Notification(`acpd: approval waiting (${n})`, { body: added, tag: `acpd-${id}` });
    note.addEventListener('click', () => { window.focus(); note.close(); });
    document.body.dataset.notified = Number(document.body.dataset.notified || 0) + 1;
  } catch (_) { /* a browser that allows notifications only from a service worker */ }
}

function wireNotify() {
  if (!('Notification' in window) || Notification.permission !== 'default') return;
  notifyButton.hidden = false;
  notifyButton.addEventListener('click', async () => {
    const answer = await Notification.requestPermission();
    notifyButton.hidden = answer !== 'default';
  });
}

const youAre = () => (me ? `you (${me})` : 'you');

function askPermission(params, rpcId) {
  return new Promise((resolve) => {
    const tool = params.toolCall || {};
    const what = tool.title || 'the agent asks';
    const box = el('div', { class: 'permission' });
    box.dataset.request = String(rpcId);
    box.dataset.tool = tool.toolCallId || '';
    box.append(el('p', { class: 'permission-title', text: `Permission: ${what}` }));
    const paths = (tool.locations || []).map((l) => l.path).filter(Boolean);
    if (paths.length) box.append(el('p', { class: 'muted', text: paths.join(', ') }));
    const buttons = el('div', { class: 'row' });
    for (const option of params.options || []) {
      const b = el('button', { type: 'button', class: `option option-${option.kind || 'other'}`, text: option.name || option.optionId });
      b.dataset.option = option.optionId;
      b.addEventListener('click', () => {
        const name = option.name || option.optionId;
        box.replaceChildren(el('p', { class: 'resolved', text: `You chose: ${name}` }));
        asked.delete(String(rpcId));
        showWaiting(null);
        setTimeout(() => box.remove(), 4000);
        resolve({ outcome: { outcome: 'selected', optionId: option.optionId } });
        mark('permission', `Permission “${what}”: ${youAre()} chose ${name}`);
      });
      buttons.append(b);
    }
    box.append(buttons);
    permissions.append(box);
    asked.set(String(rpcId), { box, resolve, options: params.options || [] });
    showWaiting(`Permission: ${what}`);
  });
}

function withdraw(requestId) {
  const waiting = asked.get(String(requestId));
  if (!waiting) return;
  asked.delete(String(requestId));
  waiting.box.remove();
  showWaiting(null);
  waiting.resolve({ outcome: { outcome: 'cancelled' } });
}

// Another client answered a permission: said in the conversation, by whom, with the option's
// name when this page was asked too.
function resolved(p) {
  const who = p.decidedBy ? `${p.decidedBy.principal}${p.decidedBy.name ? ' (' + p.decidedBy.name + ')' : ''}` : 'another client';
  const optionId = p.outcome && p.outcome.optionId;
  let choice = optionId || (p.outcome && p.outcome.outcome) || 'answered';
  for (const [rpcId, waiting] of asked) {
    if (waiting.box.dataset.tool !== (p.toolCallId || '')) continue;
    const option = waiting.options.find((o) => o.optionId === optionId);
    if (option && option.name) choice = option.name;
    waiting.box.remove();
    asked.delete(rpcId);
  }
  showWaiting(null);
  mark('permission', `Permission answered by ${who}: ${choice}`);
}

// One mode control: an agent that offers its mode as a config option (category "mode") as
// well as through session modes gets only the config option's select.
const modeOption = (options) => (options || []).find((o) => o.category === 'mode' && o.type === 'select');

function showModes(meta) {
  const select = document.getElementById('mode');
  const modes = meta.modes && meta.modes.availableModes;
  if (!modes || !modes.length || modeOption(meta.configOptions)) return;
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
    if (o.category) select.dataset.category = o.category;
    select.append(...o.options.map((v) => el('option', { value: v.value, text: v.name || v.value })));
    select.value = o.currentValue;
    select.addEventListener('change', () => {
      peer.request('session/set_config_option', { sessionId: id, configId: o.id, value: select.value })
        .then((r) => { if (r && r.configOptions) showOptions(r.configOptions); })
        .catch((e) => { turn.textContent = `Option not changed: ${e.message}`; });
    });
    box.append(el('label', { class: 'option-label', text: `${o.name || o.id} ` }, select));
  }
  if (modeOption(options)) document.getElementById('mode').hidden = true;
}

// Whether a turn is running, whoever started it: the session's status, polled.
let ownTurn = false;
let cancelAsked = false; // this page cancelled another client's turn
function showRunning(running) {
  if (ownTurn) return;
  cancel.disabled = !running;
  if (running) {
    turn.textContent = 'A turn is running.';
    turn.dataset.state = 'running';
  } else if (turn.dataset.state === 'running') {
    turn.textContent = 'The turn ended.';
    turn.dataset.state = 'ended';
    if (cancelAsked) mark('cancelled', `Turn cancelled by ${youAre()}`);
    cancelAsked = false;
  }
}

// How a turn of this page ended, in the conversation (a normal end needs no marker).
function turnEnded(result, error) {
  if (error) {
    const why = errorText(error);
    turn.textContent = `Prompt failed: ${why}`;
    turn.dataset.state = 'error';
    return mark('failed', `Turn failed: ${why}`);
  }
  const reason = (result && result.stopReason) || 'unknown';
  turn.textContent = `Turn ended: ${reason}`;
  turn.dataset.state = reason;
  const words = {
    cancelled: 'Turn cancelled',
    max_tokens: 'Turn stopped: the model reached its token limit',
    max_turn_requests: 'Turn stopped: too many model requests in one turn',
    refusal: 'Turn stopped: the agent refused',
  };
  if (reason === 'end_turn') return refresh();
  return mark(reason === 'cancelled' ? 'cancelled' : 'stopped', words[reason] || `Turn ended: ${reason}`);
}

function setTitle(title) {
  document.getElementById('title').textContent = title || '(untitled)';
  baseTitle = `acpd · ${title || id}`;
  showWaiting(null);
}

async function pollStatus() {
  try {
    const meta = await api(`/web/api/sessions/${encodeURIComponent(id)}`);
    setTitle(meta.title);
    if (role === 'controller') showRunning(meta.running);
    // Whatever a lost notification left out (the page's own prompt is not echoed to it).
    if (meta.lastSeq > lastSeq) refresh();
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
    // Sending is following: the page shows the prompt and what answers it.
    setFollow(true);
    toBottom();
    peer.request('session/prompt', { sessionId: id, prompt: [{ type: 'text', text }] })
      .then((r) => turnEnded(r, null), (e) => turnEnded(null, e))
      .finally(() => { ownTurn = false; cancel.disabled = true; });
    // acpd does not echo a client's own prompt to it: read it from the journal.
    setTimeout(refresh, 150);
  });
  cancel.addEventListener('click', () => {
    if (!ownTurn) cancelAsked = true;
    peer.notify('session/cancel', { sessionId: id });
  });
  // Enter sends, Shift+Enter (or Alt+Enter) starts a new line; on a touch screen, whose
  // keyboard has no Shift+Enter, Enter is a new line and the Send button sends.
  // Ctrl+Enter (⌘+Enter) sends everywhere.
  const touch = window.matchMedia('(pointer: coarse)');
  document.getElementById('prompt').addEventListener('keydown', (ev) => {
    if (ev.key !== 'Enter' || ev.isComposing) return;
    const plain = !ev.shiftKey && !ev.altKey && !touch.matches;
    if (ev.ctrlKey || ev.metaKey || plain) {
      ev.preventDefault();
      composer.requestSubmit();
    }
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
      if (u.sessionUpdate === 'current_mode_update') {
        document.getElementById('mode').value = u.currentModeId;
        const asOption = document.querySelector('select[data-category="mode"]');
        if (asOption) asOption.value = u.currentModeId;
      }
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
    wireNotify();
  }
}

async function main() {
  wireSignOut();
  const meta = await api(`/web/api/sessions/${encodeURIComponent(id)}`);
  setTitle(meta.title);
  api('/web/api/me').then((who) => { me = who.principal; }).catch(() => {});
  document.getElementById('meta').textContent = `${meta.agent} · ${meta.cwd}`;
  wireSessionSpend(id);
  await firstPage();
  older.addEventListener('click', loadOlder);
  wireFollow();
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
