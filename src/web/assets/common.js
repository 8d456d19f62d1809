// Shared by the console's pages: the JSON API, sign-out, small DOM helpers.
// Text from the server is set with textContent; only the conversation blocks, which the
// server renders and sanitizes, are inserted as HTML.

export async function api(path, options = {}) {
  const init = { credentials: 'same-origin', headers: {}, ...options };
  if (init.body !== undefined && typeof init.body !== 'string') {
    init.body = JSON.stringify(init.body);
    init.headers['content-type'] = 'application/json';
  }
  const resp = await fetch(path, init);
  if (resp.status === 401) {
    location.href = '/login';
    throw new Error('not signed in');
  }
  const text = await resp.text();
  const data = text ? JSON.parse(text) : null;
  if (!resp.ok) {
    const err = new Error((data && data.error) || `HTTP ${resp.status}`);
    err.status = resp.status;
    throw err;
  }
  return data;
}

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === 'class') node.className = v;
    else if (k === 'text') node.textContent = v;
    else if (k.startsWith('data-')) node.dataset[k.slice(5)] = v;
    else if (k.startsWith('aria-')) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) node.append(c);
  return node;
}

export function when(iso) {
  const d = new Date(iso);
  return isNaN(d) ? '' : d.toLocaleString();
}

export function describeClients(clients) {
  return (clients || [])
    .map((c) => `${c.principal}${c.name ? ' (' + c.name + ')' : ''}: ${c.role}`)
    .join(', ');
}

export function wireSignOut() {
  const button = document.getElementById('signout');
  if (!button) return;
  button.addEventListener('click', async () => {
    try {
      await api('/web/api/logout', { method: 'POST' });
    } finally {
      location.href = '/login';
    }
  });
}

// A JSON-RPC error (or any thrown value) as a person reads it: the error's data says why
// when the message is generic ("Authentication required" with data.message "no model is
// configured …"); both are given when they differ.
export function errorText(e) {
  if (!e) return 'failed';
  const message = e.message || String(e);
  const data = e.data;
  let detail = null;
  if (typeof data === 'string') detail = data;
  else if (data && typeof data.message === 'string') detail = data.message;
  else if (data && typeof data.reason === 'string') detail = data.reason;
  if (!detail || detail === message) return message;
  return `${message}: ${detail}`;
}
