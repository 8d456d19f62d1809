// Spend and approvals (issue 44's console side), from the usage API (src/web/usage.rs): on the
// sessions page what the principal spent today and this month with a chart of spend per day
// (an SVG drawn here); on a session's page its tokens and cost, the budgets that apply and
// every permission decision with who made it. A turn whose agent reported nothing is counted
// as a turn of unknown usage, never as zero tokens.
import { api, el, when } from '/web/common.js';

const SVG = 'http://www.w3.org/2000/svg';
const CHART_DAYS = 30;
const REFRESH_MS = 5000;

const num = (n) => Number(n || 0).toLocaleString('en-US');

// Sums of rollup rows: tokens by kind, turns, and cost per currency (`null`: none reported).
export function total(rows) {
  const t = { turns: 0, unknownTurns: 0, input: 0, output: 0, cached: 0, thought: 0, cost: null };
  for (const r of rows) {
    t.turns += r.turns;
    t.unknownTurns += r.unknownTurns;
    t.input += r.inputTokens || 0;
    t.output += r.outputTokens || 0;
    t.cached += r.cachedTokens || 0;
    t.thought += r.thoughtTokens || 0;
    if (r.cost !== null && r.cost !== undefined) {
      t.cost = t.cost || {};
      const c = r.currency || '?';
      t.cost[c] = (t.cost[c] || 0) + r.cost;
    }
  }
  t.tokens = t.input + t.output + t.thought;
  return t;
}

export function costText(cost) {
  if (!cost) return 'no cost reported';
  // Cents for a unit and more; small amounts to four places, without trailing zeros.
  const amount = (a) => (a >= 1 ? a.toFixed(2) : String(Number(a.toFixed(4))));
  return Object.entries(cost).map(([c, a]) => `${amount(a)} ${c}`).join(' + ');
}

function unknownText(t) {
  if (!t.unknownTurns) return '';
  return `${t.unknownTurns} of ${t.turns} turn${t.turns === 1 ? '' : 's'} reported no usage (unknown, not zero)`;
}

// One figure: a label and its value, each with a data- name the tests read.
function figure(name, label, value) {
  const node = el('div', { class: 'figure' }, el('span', { class: 'figure-label', text: label }), el('span', { class: 'figure-value', text: value }));
  node.dataset.figure = name;
  return node;
}

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = text;
  return node;
}

const dayOf = (d) => d.toISOString().slice(0, 10);

// Spend per day over the last CHART_DAYS days (UTC, as the store counts): a bar of tokens for
// every day with turns, and beside it a thinner bar of cost when any day reported one.
export function chart(rows, today) {
  const end = new Date(`${today}T00:00:00Z`);
  const days = [];
  for (let i = CHART_DAYS - 1; i >= 0; i--) days.push(dayOf(new Date(end.getTime() - i * 86400000)));
  const byDay = new Map();
  for (const r of rows) {
    if (!byDay.has(r.day)) byDay.set(r.day, []);
    byDay.get(r.day).push(r);
  }
  const totals = new Map([...byDay].map(([d, rs]) => [d, total(rs)]));
  const maxTokens = Math.max(1, ...[...totals.values()].map((t) => t.tokens));
  const costOf = (t) => (t.cost ? Object.values(t.cost).reduce((a, b) => a + b, 0) : 0);
  const maxCost = Math.max(0, ...[...totals.values()].map(costOf));
  const [w, h, pad, slot] = [CHART_DAYS * 14, 90, 14, 14];
  const root = svg('svg', { viewBox: `0 0 ${w} ${h + pad}`, class: 'spend-chart', role: 'img', 'aria-label': `Spend per day, last ${CHART_DAYS} days` });
  root.append(svg('line', { x1: 0, x2: w, y1: h, y2: h, class: 'axis' }));
  days.forEach((day, i) => {
    const t = totals.get(day);
    if (!t) return;
    const x = i * slot + 2;
    const bh = Math.max(1, Math.round((t.tokens / maxTokens) * (h - 4)));
    const bar = svg('rect', { x, y: h - bh, width: maxCost ? 6 : 10, height: bh, class: 'bar bar-tokens' });
    bar.dataset.day = day;
    bar.dataset.tokens = t.tokens;
    const parts = [`${day}: ${num(t.tokens)} tokens`, `${t.turns} turns`];
    if (t.unknownTurns) parts.push(`${t.unknownTurns} of unknown usage`);
    if (t.cost) parts.push(costText(t.cost));
    bar.append(svg('title', {}, parts.join(', ')));
    root.append(bar);
    const c = costOf(t);
    if (maxCost && c) {
      const ch = Math.max(1, Math.round((c / maxCost) * (h - 4)));
      const cbar = svg('rect', { x: x + 7, y: h - ch, width: 4, height: ch, class: 'bar bar-cost' });
      cbar.dataset.day = day;
      cbar.append(svg('title', {}, `${day}: ${costText(t.cost)}`));
      root.append(cbar);
    }
  });
  for (const [i, label] of [[0, days[0]], [CHART_DAYS - 1, days[CHART_DAYS - 1]]]) {
    root.append(svg('text', { x: i === 0 ? 0 : w, y: h + pad - 2, class: 'chart-label', 'text-anchor': i === 0 ? 'start' : 'end' }, label.slice(5)));
  }
  return root;
}

function budgetRow(b) {
  const used = b.unit === 'tokens' ? `${num(b.used)} of ${num(b.limit)} tokens` : `${b.used} of ${b.limit} ${b.unit}`;
  const meter = el('meter', { min: 0, max: 100, low: 50, high: 80, optimum: 0, value: Math.min(100, b.usedPercent) });
  const tr = el('tr', { class: `budget budget-${b.status}` },
    el('td', { text: b.id }),
    el('td', { text: used }),
    el('td', {}, meter, document.createTextNode(` ${b.usedPercent} %`)),
    el('td', { text: b.action }),
    el('td', { class: 'budget-status', text: b.status }),
    el('td', { text: b.resetsAt ? when(b.resetsAt) : 'never (per session)' }));
  tr.dataset.budget = b.id;
  return tr;
}

function budgetTable(budgets) {
  if (!budgets || !budgets.length) return el('p', { class: 'muted', text: 'No budget applies.' });
  return el('table', { class: 'compact budgets' },
    el('thead', {}, el('tr', {}, ...['Budget', 'Used', '', 'Action', 'State', 'Resets'].map((t) => el('th', { text: t })))),
    el('tbody', {}, ...budgets.map(budgetRow)));
}

function whoDecided(p) {
  if (p.automatic) return 'acpd, automatically (approve preset)';
  const by = p.decidedBy;
  if (!by) return p.outcome === 'cancelled' ? 'nobody (withdrawn)' : 'acpd';
  return `${by.principal || '?'}${by.name ? ` (${by.name})` : ''}`;
}

function decisionRow(p) {
  const option = p.optionId ? `${p.optionId}${p.optionKind ? ` (${p.optionKind})` : ''}` : p.outcome;
  const tr = el('tr', { class: p.automatic ? 'decision automatic' : 'decision' },
    el('td', { text: when(p.at) }),
    el('td', { text: `${p.title || p.toolCallId || 'a tool call'}${p.kind ? ` [${p.kind}]` : ''}` }),
    el('td', { class: 'decision-option', text: option }),
    el('td', { class: 'decision-who', text: whoDecided(p) }),
    el('td', { text: p.automatic ? 'yes' : 'no' }));
  tr.dataset.automatic = p.automatic;
  return tr;
}

function decisionTable(list) {
  if (!list.length) return el('p', { class: 'muted', text: 'No permission was asked.' });
  return el('table', { class: 'compact decisions' },
    el('thead', {}, el('tr', {}, ...['When', 'Tool call', 'Option', 'Decided by', 'Automatic'].map((t) => el('th', { text: t })))),
    el('tbody', {}, ...list.map(decisionRow)));
}

function tokenFigures(t) {
  return [
    figure('input', 'Input tokens', num(t.input)),
    figure('output', 'Output tokens', num(t.output)),
    figure('cached', 'Cached tokens', num(t.cached)),
    figure('thought', 'Thought tokens', num(t.thought)),
    figure('cost', 'Cost', costText(t.cost)),
    figure('turns', 'Turns', num(t.turns)),
  ];
}

// A session's page: the panel `#spend` (a <details>), its summary line filled at once.
export function wireSessionSpend(sessionId) {
  const panel = document.getElementById('spend');
  if (!panel) return;
  const summary = document.getElementById('spend-summary');
  const body = document.getElementById('spend-body');
  const load = async () => {
    let data;
    try {
      data = await api(`/web/api/sessions/${encodeURIComponent(sessionId)}/usage`);
    } catch (e) {
      summary.textContent = `(cannot read: ${e.message})`;
      return;
    }
    const t = total(data.usage);
    const n = data.permissions.length;
    summary.textContent = `${num(t.tokens)} tokens · ${costText(t.cost)} · ${n} decision${n === 1 ? '' : 's'}`;
    body.replaceChildren(
      el('div', { class: 'figures' }, ...tokenFigures(t)),
      el('p', { class: 'muted unknown-turns', text: unknownText(t) }),
      el('h3', { text: 'Budgets' }), budgetTable(data.budgets),
      el('h3', { text: 'Permission decisions' }), decisionTable(data.permissions));
    panel.dataset.loaded = 'true';
  };
  load();
  setInterval(load, REFRESH_MS);
}

// The sessions page: today's and this month's spend, the chart, the principal's budgets.
export function wirePrincipalSpend() {
  const box = document.getElementById('spend');
  if (!box) return;
  const load = async () => {
    const since = dayOf(new Date(Date.now() - (CHART_DAYS - 1) * 86400000));
    let data;
    try {
      data = await api(`/web/api/usage?since=${since}`);
    } catch (e) {
      box.replaceChildren(el('p', { class: 'muted', text: `Cannot read the spend: ${e.message}` }));
      return;
    }
    const month = data.today.slice(0, 8);
    const today = total(data.usage.filter((r) => r.day === data.today));
    const thisMonth = total(data.usage.filter((r) => r.day.startsWith(month)));
    const line = (name, label, t) => {
      const p = el('p', { class: 'spend-line' },
        el('strong', { text: `${label}: ` }),
        document.createTextNode(`${num(t.tokens)} tokens (${num(t.input)} in, ${num(t.output)} out, ${num(t.cached)} cached, ${num(t.thought)} thought) · ${costText(t.cost)} · ${num(t.turns)} turns`));
      if (t.unknownTurns) p.append(el('span', { class: 'muted', text: ` · ${unknownText(t)}` }));
      p.dataset.spend = name;
      return p;
    };
    const parts = [el('h2', { text: 'Spend' }), line('today', 'Today', today), line('month', 'This month', thisMonth)];
    if (data.usage.length) parts.push(chart(data.usage, data.today));
    if (data.budgets && data.budgets.length) parts.push(budgetTable(data.budgets));
    box.replaceChildren(...parts);
    box.dataset.loaded = 'true';
  };
  load();
  setInterval(load, REFRESH_MS * 2);
}
