// A small JSON-RPC 2.0 peer over acpd's /acp WebSocket (one message per text frame). The
// browser sends the console's cookie with the upgrade; acpd takes it from this origin only.

export class Peer {
  constructor(url) {
    this.ws = new WebSocket(url);
    this.nextId = 1;
    this.pending = new Map();
    this.onNotification = () => {};
    this.onRequest = async () => { throw { code: -32601, message: 'method not found' }; };
    this.onClose = () => {};
    this.opened = new Promise((resolve, reject) => {
      this.ws.addEventListener('open', resolve, { once: true });
      this.ws.addEventListener('error', reject, { once: true });
    });
    this.ws.addEventListener('message', (ev) => this.receive(ev.data));
    this.ws.addEventListener('close', (ev) => {
      for (const { reject } of this.pending.values()) reject({ code: -32000, message: 'connection closed' });
      this.pending.clear();
      this.onClose(ev);
    });
  }

  send(msg) {
    this.ws.send(JSON.stringify({ jsonrpc: '2.0', ...msg }));
  }

  request(method, params) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.send({ id, method, params });
    });
  }

  notify(method, params) {
    this.send({ method, params });
  }

  async receive(text) {
    let msg;
    try {
      msg = JSON.parse(text);
    } catch (_) {
      return;
    }
    if (msg.method === undefined) {
      const waiting = this.pending.get(msg.id);
      if (!waiting) return;
      this.pending.delete(msg.id);
      if (msg.error) waiting.reject(msg.error);
      else waiting.resolve(msg.result);
      return;
    }
    if (msg.id === undefined || msg.id === null) {
      this.onNotification(msg.method, msg.params || {});
      return;
    }
    try {
      const result = await this.onRequest(msg.method, msg.params || {}, msg.id);
      this.send({ id: msg.id, result });
    } catch (e) {
      this.send({ id: msg.id, error: { code: e.code || -32603, message: e.message || 'failed' } });
    }
  }
}
