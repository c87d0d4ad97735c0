// raw_http.mjs: every kind of bad input over raw HTTP against a running `fp4serve serve`
// (loopback only). Each must get the right status and an OpenAI-shaped error
// {"error":{"message","type","code"}}, and the server must stay up for other requests.
// usage: node raw_http.mjs PORT API_KEY READ_TIMEOUT_S MAX_MODEL_LEN
import http from 'node:http';
import net from 'node:net';

const [port, key, readTimeout, maxLen] = [+process.argv[2], process.argv[3], +process.argv[4], +process.argv[5]];
const host = '127.0.0.1';
let pass = 0, fail = 0;
const ok = (cond, what) => { if (cond) { pass++; console.log(`ok: ${what}`); } else { fail++; console.log(`FAIL: ${what}`); } };

function req(method, path, body, { auth = key, headers = {} } = {}) {
  return new Promise((resolve) => {
    const h = { ...headers };
    if (auth) h.Authorization = `Bearer ${auth}`;
    let data = body;
    if (body !== undefined && typeof body !== 'string' && !Buffer.isBuffer(body)) data = JSON.stringify(body);
    if (data !== undefined) { h['Content-Type'] = 'application/json'; h['Content-Length'] = Buffer.byteLength(data); }
    const r = http.request({ host, port, method, path, headers: h, agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString();
        let json = null;
        try { json = JSON.parse(text); } catch { /* SSE or text */ }
        resolve({ status: res.statusCode, text, json, headers: res.headers });
      });
    });
    r.on('error', (e) => resolve({ status: 0, text: String(e), json: null }));
    if (data !== undefined) r.write(data);
    r.end();
  });
}

// Raw socket: send `parts` (strings/buffers, with delays between) and collect the whole reply.
function raw(parts, { delayMs = 0, closeAfterMs = 0, maxWaitMs = 30000 } = {}) {
  return new Promise((resolve) => {
    const s = net.connect(port, host);
    let out = '';
    let done = false;
    const fin = () => { if (!done) { done = true; s.destroy(); resolve(out); } };
    s.on('data', (d) => { out += d.toString('latin1'); });
    s.on('error', fin);
    s.on('close', fin);
    setTimeout(fin, maxWaitMs);
    (async () => {
      for (const p of parts) {
        if (done) return;
        s.write(p);
        if (delayMs) await new Promise((r) => setTimeout(r, delayMs));
      }
      if (closeAfterMs) setTimeout(fin, closeAfterMs);
    })();
  });
}

const statusOf = (reply) => +(reply.match(/^HTTP\/1\.[01] (\d+)/) || [0, 0])[1];
const bodyOf = (reply) => { const i = reply.indexOf('\r\n\r\n'); try { return JSON.parse(reply.slice(i + 4)); } catch { return null; } };
const isErr = (j, code) => j && j.error && typeof j.error.message === 'string' && typeof j.error.type === 'string' && j.error.code === code;

async function expectErr(name, method, path, body, code, opts) {
  const r = await req(method, path, body, opts);
  ok(r.status === code && isErr(r.json, code), `${name}: ${code} ${r.json && r.json.error ? JSON.stringify(r.json.error.message) : r.text.slice(0, 120)}`);
  return r;
}

async function metric(name, label = '') {
  const r = await req('GET', '/metrics', undefined, { auth: null });
  const m = r.text.match(new RegExp(`^fp4serve:${name}\\{[^}]*${label}\\} (\\S+)$`, 'm'));
  return m ? +m[1] : NaN;
}

const C = '/v1/completions', CH = '/v1/chat/completions';
const msgs = [{ role: 'user', content: 'hello' }];

// a good request works, so failures below are about the input
let r = await req('POST', C, { prompt: 'Hello', max_tokens: 4 });
ok(r.status === 200 && r.json.choices.length === 1 && r.json.usage.completion_tokens >= 1, 'baseline completion 200');

// auth
await expectErr('missing API key', 'POST', C, { prompt: 'x', max_tokens: 1 }, 401, { auth: null });
await expectErr('wrong API key', 'POST', C, { prompt: 'x', max_tokens: 1 }, 401, { auth: key + 'x' });
await expectErr('wrong API key, same length', 'POST', C, { prompt: 'x', max_tokens: 1 }, 401, { auth: key.slice(0, -1) + (key.endsWith('a') ? 'b' : 'a') });
await expectErr('models without key', 'GET', '/v1/models', undefined, 401, { auth: null });
r = await req('GET', '/health', undefined, { auth: null });
ok(r.status === 200 && r.json.status === 'ok', '/health needs no key');
{
  // one Date header, ours (civetweb's own comes from gmtime(), shared by its worker threads)
  const h = await raw(['GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n']);
  const dates = h.split('\r\n\r\n')[0].split('\r\n').filter((l) => /^date:/i.test(l));
  ok(dates.length === 1 && /^Date: \w{3}, \d{2} \w{3} \d{4} \d{2}:\d{2}:\d{2} GMT$/.test(dates[0]),
     `one well-formed Date header: ${JSON.stringify(dates)}`);
}
r = await req('GET', '/metrics', undefined, { auth: null });
ok(r.status === 200 && r.text.includes('fp4serve:num_requests_running'), '/metrics needs no key');

// malformed bodies
await expectErr('invalid JSON', 'POST', C, '{"prompt": "x", max_tokens: }', 400);
await expectErr('truncated JSON', 'POST', CH, '{"messages": [', 400);
await expectErr('JSON array body', 'POST', C, '[1,2]', 400);
await expectErr('empty body', 'POST', C, '', 400);
await expectErr('invalid UTF-8', 'POST', C, Buffer.from([0x7b, 0x22, 0x70, 0x72, 0x6f, 0x6d, 0x70, 0x74, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0x22, 0x7d]), 400);

// wrong types
await expectErr('max_tokens string', 'POST', C, { prompt: 'x', max_tokens: 'ten' }, 400);
await expectErr('max_tokens float', 'POST', C, { prompt: 'x', max_tokens: 1.5 }, 400);
await expectErr('temperature string', 'POST', C, { prompt: 'x', temperature: 'hot' }, 400);
await expectErr('stream number', 'POST', C, { prompt: 'x', stream: 1 }, 400);
await expectErr('prompt object', 'POST', C, { prompt: { a: 1 } }, 400);
await expectErr('messages string', 'POST', CH, { messages: 'hi' }, 400);
await expectErr('messages empty', 'POST', CH, { messages: [] }, 400);
await expectErr('message without role', 'POST', CH, { messages: [{ content: 'x' }] }, 400);
await expectErr('unknown role', 'POST', CH, { messages: [{ role: 'wizard', content: 'x' }] }, 400);
await expectErr('content number', 'POST', CH, { messages: [{ role: 'user', content: 5 }] }, 400);
await expectErr('image content part', 'POST', CH, { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }, 400);
await expectErr('stop number', 'POST', C, { prompt: 'x', stop: 5 }, 400);
await expectErr('stop too many', 'POST', C, { prompt: 'x', stop: ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i'] }, 400);
await expectErr('logit_bias bad key', 'POST', C, { prompt: 'x', logit_bias: { abc: 1 } }, 400);
await expectErr('logit_bias out of range', 'POST', C, { prompt: 'x', logit_bias: { 5: 1000 } }, 400);
await expectErr('seed string', 'POST', C, { prompt: 'x', seed: 'abc' }, 400);
await expectErr('stream_options not object', 'POST', C, { prompt: 'x', stream: true, stream_options: 3 }, 400);

// out-of-range values
await expectErr('negative max_tokens', 'POST', C, { prompt: 'x', max_tokens: -5 }, 400);
await expectErr('zero max_tokens', 'POST', CH, { messages: msgs, max_tokens: 0 }, 400);
await expectErr('huge max_tokens', 'POST', C, { prompt: 'x', max_tokens: 1e12 }, 400);
await expectErr('max_tokens over context', 'POST', CH, { messages: msgs, max_completion_tokens: maxLen }, 400);
await expectErr('temperature negative', 'POST', C, { prompt: 'x', temperature: -1 }, 400);
await expectErr('top_p zero', 'POST', C, { prompt: 'x', top_p: 0 }, 400);
await expectErr('n too large', 'POST', C, { prompt: 'x', n: 1000 }, 400);
await expectErr('top_logprobs > 20', 'POST', CH, { messages: msgs, logprobs: true, top_logprobs: 50 }, 400);
await expectErr('top_logprobs without logprobs', 'POST', CH, { messages: msgs, top_logprobs: 2 }, 400);
await expectErr('prompt token out of vocab', 'POST', C, { prompt: [1, 2, 99999999] }, 400);
const long = 'word '.repeat(maxLen * 2);
r = await expectErr('prompt over the context', 'POST', C, { prompt: long, max_tokens: 4 }, 400);
ok(r.json && /maximum context length/.test(r.json.error.message), 'context error names the limit');
await expectErr('chat prompt over the context', 'POST', CH, { messages: [{ role: 'user', content: long }] }, 400);

// fields
await expectErr('unknown model', 'POST', C, { model: 'gpt-17', prompt: 'x' }, 404);
r = await req('POST', C, { prompt: 'x', max_tokens: 2, user: 'me', metadata: { a: 1 }, some_future_field: [1, 2] });
ok(r.status === 200, 'unknown fields are ignored (vLLM behaviour)');
await expectErr('tools unsupported', 'POST', CH, { messages: msgs, tools: [{ type: 'function', function: { name: 'f' } }] }, 400);
await expectErr('json_schema unsupported', 'POST', CH, { messages: msgs, response_format: { type: 'json_schema' } }, 400);
await expectErr('echo unsupported', 'POST', C, { prompt: 'x', echo: true }, 400);

// routing
await expectErr('unknown path', 'GET', '/v2/nothing', undefined, 404);
await expectErr('GET on completions', 'GET', C, undefined, 405);
r = await req('GET', '/version');
ok(r.status === 200 && typeof r.json.version === 'string', '/version');
r = await req('POST', '/tokenize', { prompt: 'hello world' });
ok(r.status === 200 && r.json.count === r.json.tokens.length && r.json.max_model_len === maxLen, '/tokenize');
const toks = r.json.tokens;
r = await req('POST', '/detokenize', { tokens: toks });
ok(r.status === 200 && r.json.prompt.includes('hello world'), `/detokenize round trip: ${JSON.stringify(r.json)}`);
await expectErr('/detokenize bad id', 'POST', '/detokenize', { tokens: [-1] }, 400);
await expectErr('/tokenize bad prompt', 'POST', '/tokenize', { prompt: 3 }, 400);
r = await req('POST', '/tokenize', { messages: msgs });
ok(r.status === 200 && r.json.count > 3, '/tokenize messages (chat template)');

// 10 MB body: refused by Content-Length before reading it
{
  const big = Buffer.alloc(10 << 20, 0x20);
  const reply = await raw([`POST ${C} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: ${big.length}\r\n\r\n`, big], { maxWaitMs: 15000 });
  ok(statusOf(reply) === 413 && isErr(bodyOf(reply), 413), `10 MB body: ${statusOf(reply)}`);
  // the same without Content-Length (chunked): read up to the limit, then refused
  const chunk = Buffer.alloc(1 << 20, 0x20);
  const parts = [`POST ${C} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nTransfer-Encoding: chunked\r\n\r\n`];
  for (let i = 0; i < 10; i++) parts.push(`${chunk.length.toString(16)}\r\n`, chunk, '\r\n');
  parts.push('0\r\n\r\n');
  const reply2 = await raw(parts, { maxWaitMs: 15000 });
  ok(statusOf(reply2) === 413 && isErr(bodyOf(reply2), 413), `10 MB chunked body: ${statusOf(reply2)}`);
}

// a request sent one byte per second must not hold a worker for ever: the body, then the headers
{
  const body = JSON.stringify({ prompt: 'x', max_tokens: 1 });
  const head = `POST ${C} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Length: ${body.length}\r\n\r\n`;
  const t0 = Date.now();
  const slowBody = raw([head, ...body.split('')], { delayMs: 1000, maxWaitMs: (readTimeout + 15) * 1000 });
  const slowHead = raw(('GET /v1/models HTTP/1.1\r\nHost: x\r\n' + 'X-Pad: ' + 'a'.repeat(60) + '\r\n\r\n').split(''), { delayMs: 1000, maxWaitMs: (readTimeout + 15) * 1000 });
  // meanwhile other requests are served
  await new Promise((res) => setTimeout(res, 500));
  r = await req('POST', C, { prompt: 'Hello', max_tokens: 4 });
  ok(r.status === 200, 'a normal request is served while slow clients trickle');
  const [rb, rh] = await Promise.all([slowBody, slowHead]);
  const dt = (Date.now() - t0) / 1000;
  ok(statusOf(rb) === 408 && isErr(bodyOf(rb), 408), `slow body: ${statusOf(rb)} after ${dt.toFixed(1)} s`);
  // civetweb itself times out header reading and calls it a malformed request (400); our
  // http_error callback gives it the OpenAI shape
  const sh = statusOf(rh);
  ok((sh === 408 || sh === 400) && isErr(bodyOf(rh), sh), `slow headers: ${sh}, OpenAI-shaped, connection closed`);
  ok(dt < readTimeout + 8, `slow clients dropped within the read timeout (${dt.toFixed(1)} s, limit ${readTimeout} s)`);
}

// a client gone mid-stream: its sequence is cancelled and its KV slot freed
{
  const abortedBefore = await metric('request_success_total', 'finished_reason="abort"');
  const body = JSON.stringify({ prompt: 'Once upon', max_tokens: maxLen - 16, ignore_eos: true, stream: true });
  const reply = await raw([`POST ${C} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`], { closeAfterMs: 300 });
  ok(/data: \{/.test(reply) && !/\[DONE\]/.test(reply), `stream started, client left before the end: ${reply.slice(0, 300)}`);
  let running = -1;
  for (let i = 0; i < 50; i++) {
    running = await metric('num_requests_running');
    if (running === 0) break;
    await new Promise((res) => setTimeout(res, 100));
  }
  ok(running === 0, 'running sequences back to 0 after the disconnect');
  ok(await metric('kv_cache_used_blocks') === 0, 'no KV blocks used after the disconnect');
  const abortedAfter = await metric('request_success_total', 'finished_reason="abort"');
  ok(abortedAfter === abortedBefore + 1, `the sequence ended as aborted (${abortedBefore} -> ${abortedAfter})`);
}

// still up, still right
r = await req('GET', '/health', undefined, { auth: null });
ok(r.status === 200, 'server still healthy');
r = await req('POST', CH, { messages: msgs, max_tokens: 4 });
ok(r.status === 200 && r.json.choices[0].message.role === 'assistant', 'chat still works');
console.log(`raw_http: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
