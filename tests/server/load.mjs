// load.mjs: bounded load test on loopback: CLIENTS concurrent streaming clients for DURATION
// seconds against a running `fp4serve serve`. Every stream must be 200, parse, end with
// [DONE]; afterwards /metrics must show 0 running / 0 waiting requests and 0 used KV blocks, and
// the server's RSS (from /proc/PID) must not grow after warm-up. Prints p50/p99 time to first
// token and inter-token latency. usage: node load.mjs PORT KEY CLIENTS DURATION_S SERVER_PID
import http from 'node:http';
import fs from 'node:fs';

const [port, key, clients, duration, pid] = [+process.argv[2], process.argv[3], +process.argv[4], +process.argv[5], process.argv[6]];
const agent = new http.Agent({ keepAlive: true, maxSockets: clients + 8 });
const ttft = [], itl = [];
let requests = 0, tokens = 0, errors = 0;
const errSamples = [];
const t0 = Date.now(), end = t0 + duration * 1000;
const rss = () => { try { return +fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1] / 1024; } catch { return NaN; } };
const heap = () => new Promise((res) => http.get({ host: '127.0.0.1', port, path: '/metrics', agent: false }, (r) => {
  let b = ''; r.on('data', (d) => { b += d; }); r.on('end', () => { const m = b.match(/^fp4serve:process_heap_bytes (\d+)$/m); res(m ? +m[1] / 1048576 : NaN); });
}).on('error', () => res(NaN)));

function streamOnce(i) {
  return new Promise((resolve) => {
    const chat = i % 2 === 0;
    const maxTokens = 16 + Math.floor(Math.random() * 33);
    const body = JSON.stringify(chat
      ? { messages: [{ role: 'user', content: `client ${i} says hi ${Math.random()}` }], max_tokens: maxTokens, stream: true, stream_options: { include_usage: true } }
      : { prompt: `Once upon a time ${i} ${Math.random()}`, max_tokens: maxTokens, stream: true, stream_options: { include_usage: true } });
    const start = performance.now();
    let last = 0, buf = '', done = false, usage = null, n = 0;
    const fail = (why) => { errors++; if (errSamples.length < 5) errSamples.push(why); resolve(); };
    const r = http.request({ host: '127.0.0.1', port, method: 'POST', path: chat ? '/v1/chat/completions' : '/v1/completions', agent,
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body), Authorization: `Bearer ${key}` } }, (res) => {
      if (res.statusCode !== 200) { res.resume(); return fail(`status ${res.statusCode}`); }
      res.setEncoding('utf8');
      res.on('data', (d) => {
        buf += d;
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, k);
          buf = buf.slice(k + 2);
          if (!ev.startsWith('data: ')) { fail(`bad event ${ev.slice(0, 80)}`); continue; }
          const data = ev.slice(6);
          if (data === '[DONE]') { done = true; continue; }
          let j;
          try { j = JSON.parse(data); } catch { fail(`bad JSON ${data.slice(0, 80)}`); continue; }
          if (j.error) { fail(`error event ${j.error.message}`); continue; }
          if (j.usage) usage = j.usage;
          const now = performance.now();
          for (const c of j.choices) {
            const has = chat ? (c.delta.content !== undefined || c.finish_reason) : true;
            if (!has) continue;
            if (n === 0) ttft.push(now - start); else itl.push(now - last);
            last = now;
            n++;
          }
        }
      });
      res.on('end', () => {
        if (!done) return fail('stream ended without [DONE]');
        if (!usage || usage.completion_tokens < 1) return fail('no usage');
        requests++;
        tokens += usage.completion_tokens;
        resolve();
      });
      res.on('error', (e) => fail(String(e)));
    });
    r.on('error', (e) => fail(String(e)));
    r.end(body);
  });
}

async function client(i) {
  while (Date.now() < end) await streamOnce(i);
}

// warm-up: a quarter of the run and every client through at least one request (threads, malloc
// arenas and the KV pool are then allocated)
let rssWarm = NaN, heapWarm = NaN;
const warm = setInterval(async () => {
  if (Number.isNaN(rssWarm) && Date.now() - t0 >= duration * 250 && requests + errors >= clients) {
    rssWarm = rss();
    clearInterval(warm);
    heapWarm = await heap();
  }
}, 100);
const rssStart = rss();
await Promise.all(Array.from({ length: clients }, (_, i) => client(i)));
clearInterval(warm);
const elapsed = (Date.now() - t0) / 1000;
const rssEnd = rss();
agent.destroy();

const pct = (a, p) => { if (!a.length) return NaN; const s = [...a].sort((x, y) => x - y); return s[Math.min(s.length - 1, Math.floor(p / 100 * s.length))]; };
console.log(`load: ${clients} streaming clients for ${elapsed.toFixed(1)} s: ${requests} requests, ${errors} errors, ${tokens} tokens (${(tokens / elapsed).toFixed(0)} tok/s aggregate)`);
console.log(`load: TTFT p50 ${pct(ttft, 50).toFixed(1)} ms, p99 ${pct(ttft, 99).toFixed(1)} ms; inter-token p50 ${pct(itl, 50).toFixed(1)} ms, p99 ${pct(itl, 99).toFixed(1)} ms`);
const heapEnd = await heap();
console.log(`load: server RSS ${rssStart.toFixed(1)} MB at start, ${rssWarm.toFixed(1)} MB after warm-up, ${rssEnd.toFixed(1)} MB at the end; ` +
  `heap in use ${heapWarm.toFixed(1)} MB after warm-up (requests in flight), ${heapEnd.toFixed(1)} MB at the end (idle)`);
if (errSamples.length) console.log(`load: first errors: ${errSamples.join(' | ')}`);

// the server must be idle again: no running, waiting or KV in use
let m = {};
for (let t = 0; t < 50; t++) {
  const text = await new Promise((res) => http.get({ host: '127.0.0.1', port, path: '/metrics' }, (r) => { let b = ''; r.on('data', (d) => { b += d; }); r.on('end', () => res(b)); }).on('error', () => res('')));
  for (const name of ['num_requests_running', 'num_requests_waiting', 'kv_cache_used_blocks', 'kv_cache_usage_perc']) {
    const mm = text.match(new RegExp(`^fp4serve:${name}\\{[^}]*\\} (\\S+)$`, 'm'));
    m[name] = mm ? +mm[1] : NaN;
  }
  if (m.num_requests_running === 0 && m.num_requests_waiting === 0 && m.kv_cache_used_blocks === 0) break;
  await new Promise((r) => setTimeout(r, 100));
}
console.log(`load: /metrics afterwards: ${JSON.stringify(m)}`);
let fails = 0;
const check = (c, what) => { console.log(`${c ? 'ok' : 'FAIL'}: ${what}`); if (!c) fails++; };
check(errors === 0, `0 errors (${errors})`);
check(requests > 0, `requests completed (${requests})`);
check(m.num_requests_running === 0 && m.num_requests_waiting === 0, 'no running or waiting requests afterwards');
check(m.kv_cache_used_blocks === 0 && m.kv_cache_usage_perc === 0, 'no KV blocks in use afterwards');
// after warm-up (threads, arenas and the KV pool are allocated) the RSS must stay flat
// Memory: the heap in use (malloc's own count, from /metrics) once idle must not exceed what it
// was mid-run; RSS is printed but not judged, since it also grows while KV pages are first
// touched. Under AddressSanitizer (FP4S_LOAD_NO_RSS=1) malloc statistics are ASan's, and
// LeakSanitizer at exit is the check.
const growth = heapEnd - heapWarm;
if (process.env.FP4S_LOAD_NO_RSS === '1') check(true, 'memory growth not judged under ASan; LeakSanitizer checks at exit');
else check(Number.isFinite(growth) && growth <= 1, `no heap growth: ${heapWarm.toFixed(1)} MB mid-run -> ${heapEnd.toFixed(1)} MB idle`);
console.log(`load: ${5 - fails} passed, ${fails} failed`);
process.exit(fails ? 1 : 0);
