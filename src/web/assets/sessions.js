// The sessions page: the principal's sessions, newest first, paged like session/list and
// polled every two seconds (a JSON read; cheaper to build than a push channel).
import { api, el, when, describeClients, wireSignOut } from '/web/common.js';

const POLL_MS = 2000;
const tbody = document.querySelector('#sessions tbody');
const status = document.getElementById('status');
const more = document.getElementById('more');
let pages = 1;

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

more.addEventListener('click', () => { pages += 1; load(); });
wireSignOut();
api('/web/api/me').then((me) => { document.getElementById('who').textContent = me.principal; });
poll();
