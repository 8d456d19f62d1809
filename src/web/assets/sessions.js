// The sessions page: the principal's sessions, newest first, paged like session/list and
// polled every two seconds (a JSON read; cheaper to build than a push channel). "New session"
// starts one over ACP (`session/new` on the /acp WebSocket, like any client) and opens it.
// Above the list: the principal's spend (`usage.js`) and the agents whose login the principal
// may run from here (`agent-login.js`).
import { api, el, when, describeClients, wireSignOut, errorText } from '/web/common.js';
import { Peer } from '/web/acp.js';
import { wirePrincipalSpend } from '/web/usage.js';

const POLL_MS = 2000;
const tbody = document.querySelector('#sessions tbody');
const status = document.getElementById('status');
const more = document.getElementById('more');
let pages = 1;
let recentDirs = []; // the listed sessions' directories, newest first

function row(s) {
  const link = el('a', { href: `/s/${encodeURIComponent(s.sessionId)}`, text: s.title || '(untitled)' });
  const state = el('span', { class: s.running ? 'badge running' : 'badge idle', text: s.running ? 'running' : 'idle' });
  return el('tr', { 'data-session': s.sessionId },
    el('td', { class: 'title' }, link),
    el('td', { 'data-label': 'Agent', text: s.agent }),
    el('td', { class: 'cwd', 'data-label': 'Directory', text: s.cwd }),
    el('td', { 'data-label': 'Updated', text: when(s.updatedAt) }),
    el('td', { 'data-label': 'State' }, state),
    el('td', { class: 'attached', 'data-label': 'Attached', text: describeClients(s.clients) || '—' }));
}

async function load() {
  const rows = [];
  let cursor = null;
  let next = null;
  for (let i = 0; i < pages; i++) {
    const q = cursor ? `?cursor=${encodeURIComponent(cursor)}` : '';
    const page = await api(`/web/api/sessions${q}`);
    rows.push(...page.sessions.map(row));
    next = page.nextCursor;
    if (!next) break;
    cursor = next;
  }
  tbody.replaceChildren(...rows);
  recentDirs = [...new Set(rows.map((r) => r.querySelector('td.cwd').textContent))];
  more.hidden = !next;
  status.textContent = rows.length ? '' : 'No sessions yet.';
}

async function poll() {
  try {
    await load();
  } catch (e) {
    status.textContent = `Cannot load the sessions: ${e.message}`;
  }
  setTimeout(poll, POLL_MS);
}

// "New session": the agent profiles and allowed directories from the API, the directories of
// recent sessions as suggestions; `session/new` on a connection of its own, then the page.
const form = document.getElementById('new-form');
const agentSelect = document.getElementById('new-agent');
const cwdInput = document.getElementById('new-cwd');
const newStatus = document.getElementById('new-status');

async function openNewForm() {
  form.hidden = false;
  newStatus.textContent = '';
  try {
    const info = await api('/web/api/agents');
    agentSelect.replaceChildren(...info.agents.map((a) => el('option', { value: a, text: a === info.defaultAgent ? `${a} (default)` : a })));
    agentSelect.value = info.defaultAgent;
    const dirs = [...new Set([...recentDirs, ...info.roots])];
    document.getElementById('new-dirs').replaceChildren(...dirs.map((d) => el('option', { value: d })));
    if (!cwdInput.value && dirs.length) cwdInput.value = dirs[0];
  } catch (e) {
    newStatus.textContent = `Cannot read the agent profiles: ${e.message}`;
  }
  cwdInput.focus();
}

async function startSession(agent, cwd) {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const peer = new Peer(`${scheme}//${location.host}/acp?agent=${encodeURIComponent(agent)}`);
  try {
    await peer.opened;
    await peer.request('initialize', {
      protocolVersion: 1,
      clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
      clientInfo: { name: 'acpd-web', title: 'acpd web console', version: '1' },
    });
    const r = await peer.request('session/new', { cwd, mcpServers: [] });
    return r.sessionId;
  } finally {
    peer.ws.close();
  }
}

document.getElementById('new').addEventListener('click', openNewForm);
document.getElementById('new-cancel').addEventListener('click', () => { form.hidden = true; });
form.addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const cwd = cwdInput.value.trim();
  if (!cwd.startsWith('/')) {
    newStatus.textContent = 'The directory must be an absolute path.';
    return;
  }
  const create = document.getElementById('new-create');
  create.disabled = true;
  newStatus.textContent = 'Starting the agent…';
  try {
    const sid = await startSession(agentSelect.value, cwd);
    location.href = `/s/${encodeURIComponent(sid)}?role=controller`;
  } catch (e) {
    newStatus.textContent = `Cannot start a session: ${errorText(e)}`;
    create.disabled = false;
  }
});

// The hosted agents this principal may log in (a login of one that runs now is listed too).
async function showLogins() {
  const info = await api('/web/api/logins');
  const mine = info.logins.filter((l) => !l.refusal || l.refusal.status === 409);
  const items = mine.map((l) => {
    const link = el('a', { href: `/agents/${encodeURIComponent(l.agent)}/login`, text: `Log in ${l.agent}` });
    const item = el('li', {}, link);
    if (l.refusal) item.append(el('span', { class: 'muted', text: ' (a login of it is running)' }));
    item.dataset.agent = l.agent;
    return item;
  });
  document.getElementById('agent-login-list').replaceChildren(...items);
  document.getElementById('agent-logins').hidden = !items.length;
}

more.addEventListener('click', () => { pages += 1; load(); });
wirePrincipalSpend();
showLogins().catch(() => { /* the section stays hidden */ });
wireSignOut();
api('/web/api/me').then((me) => { document.getElementById('who').textContent = me.principal; });
poll();
