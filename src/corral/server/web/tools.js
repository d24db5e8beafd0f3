// The Tools card: an environment's @tool methods over POST /mcp, on a stateful HTTP session
// of the tab's own (a second instance, opened at the first call and closed when the tab
// goes away), not on the episode's instance: corral/1 has no tool call.

import { h, $, clear } from './dom.js';
import { json } from './values.js';
import { plain } from './arrays.js';
import { FormWithJson } from './forms.js';

export class Tools {
  // http: wire.js's http.
  constructor({ http }) {
    this.http = http;
    this.tools = [];
    this.form = null;
    this.session = null;
    this.rpcId = 0;
  }

  rpc(method, params, session) {
    const headers = session ? { 'X-Corral-Session': session } : {};
    return this.http('mcp', { method: 'POST', body: { jsonrpc: '2.0', id: ++this.rpcId, method, params }, headers });
  }

  async load() {
    const reply = await this.rpc('tools/list', {}).catch(() => null);
    this.tools = reply?.result?.tools || [];
    $('#tools-card').hidden = this.tools.length === 0;
    if (!this.tools.length) return;
    clear($('#tool-select'), this.tools.map((t, i) => h('option', { value: String(i), text: t.name })));
    $('#tool-select').onchange = () => this.show();
    $('#tool-call').onclick = () => this.call();
    this.show();
  }

  get current() {
    return this.tools[Number($('#tool-select').value)];
  }

  show() {
    const tool = this.current;
    $('#tool-description').textContent = tool.description || '';
    this.form = new FormWithJson(tool.inputSchema || { type: 'object', properties: {} }, { id: 'tool', label: tool.name });
    clear($('#tool-form'), this.form.el);
    clear($('#tool-result'));
  }

  async call() {
    const tool = this.current;
    if (!tool) return;
    const result = $('#tool-result');
    let args;
    try {
      args = this.form.value;
    } catch (e) {
      clear(result, h('p', { class: 'warn tool-error', text: e.message }));
      return;
    }
    try {
      if (!this.session) this.session = (await this.http('sessions', { method: 'POST' })).session_id;
      const reply = await this.rpc('tools/call', { name: tool.name, arguments: args }, this.session);
      if (reply.error) {
        clear(result, h('div', { class: 'warn tool-error', role: 'alert' }, h('span', { class: 'code', text: String(reply.error.code) }), ' ', reply.error.message, reply.error.data ? h('pre', { class: 'obj', text: json(reply.error.data) }) : null));
        return;
      }
      const out = reply.result || {};
      const texts = (out.content || []).map((c) => c.text ?? json(c)).join('\n');
      clear(result, h('div', { class: out.isError ? 'warn tool-error' : 'tool-ok' }, out.isError ? h('span', { class: 'code', text: 'TOOL_ERROR' }) : null, h('pre', { class: 'long', text: out.structuredContent !== undefined ? json(plain(out.structuredContent)) : texts })));
    } catch (e) {
      clear(result, h('p', { class: 'warn tool-error', text: `${e.code}: ${e.message}` }));
    }
  }

  // The tab goes away: free the tool session (keepalive: the request outlives the page).
  close() {
    if (this.session) fetch(new URL(`../sessions/${encodeURIComponent(this.session)}`, location.href), { method: 'DELETE', keepalive: true });
  }
}
