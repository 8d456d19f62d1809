// The sign-in page: a one-time code arrives in the URL fragment (never sent to a server),
// is removed from the address bar at once and exchanged for the console's cookie.
import { el } from '/web/common.js';

const message = document.getElementById('message');

function show(text, kind) {
  message.replaceChildren(el('h2', { text: kind === 'error' ? 'Not signed in' : 'Signing in' }), el('p', { text }));
  message.className = `message ${kind}`;
  message.hidden = false;
}

async function exchange(body) {
  const resp = await fetch('/web/api/login', {
    method: 'POST',
    credentials: 'same-origin',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  if (resp.ok) {
    location.replace('/');
    return;
  }
  let why = `Sign-in failed (HTTP ${resp.status}).`;
  try {
    why = (await resp.json()).error || why;
  } catch (_) { /* not JSON */ }
  show(why, 'error');
}

function fromFragment() {
  const code = new URLSearchParams(location.hash.slice(1)).get('code');
  if (!code) return;
  history.replaceState(null, '', '/login');
  show('Checking the link…', 'info');
  exchange({ code });
}
fromFragment();
// A second link opened in this tab changes only the fragment: no new page load.
window.addEventListener('hashchange', fromFragment);

document.getElementById('token-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const input = document.getElementById('token');
  const token = input.value.trim();
  input.value = '';
  if (token) exchange({ token });
});
