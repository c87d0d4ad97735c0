// openai_client.mjs: the official `openai` npm client drives a running `fp4serve serve`
// (loopback): models, chat and completions, streaming and not, usage, n > 1, seeds, logprobs,
// stop strings, and an authentication error. usage: node openai_client.mjs OPENAI_DIR PORT KEY
import { createRequire } from 'node:module';

const [dir, port, key] = process.argv.slice(2);
const require = createRequire(`${dir}/package.json`);
const OpenAI = require('openai');
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key, maxRetries: 0, timeout: 60000 });
let pass = 0, fail = 0;
const ok = (cond, what) => { if (cond) { pass++; console.log(`ok: ${what}`); } else { fail++; console.log(`FAIL: ${what}`); } };

const models = await client.models.list();
const model = models.data[0].id;
ok(models.data.length === 1 && typeof model === 'string', `models.list: ${model}`);
const msgs = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say hello.' }];

// chat, not streamed; greedy so the streamed run below must give the same text
const chat = await client.chat.completions.create({ model, messages: msgs, max_tokens: 12, temperature: 0 });
const c0 = chat.choices[0];
ok(chat.object === 'chat.completion' && c0.message.role === 'assistant' && typeof c0.message.content === 'string', 'chat: message');
ok(['stop', 'length'].includes(c0.finish_reason), `chat: finish_reason ${c0.finish_reason}`);
ok(chat.usage.prompt_tokens > 0 && chat.usage.completion_tokens > 0 &&
   chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens, `chat: usage ${JSON.stringify(chat.usage)}`);

// chat, streamed, with usage
const stream = await client.chat.completions.create({ model, messages: msgs, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true } });
let text = '', usage = null, finish = null, role = null, chunks = 0;
for await (const ch of stream) {
  chunks++;
  if (ch.usage) usage = ch.usage;
  for (const c of ch.choices) {
    if (c.delta.role) role = c.delta.role;
    if (c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
}
ok(role === 'assistant' && chunks > 2, `chat stream: ${chunks} chunks`);
ok(text === c0.message.content, `chat stream text equals the non-streamed text (greedy): ${JSON.stringify(text)}`);
ok(finish === c0.finish_reason, 'chat stream: same finish_reason');
ok(usage && usage.prompt_tokens === chat.usage.prompt_tokens && usage.completion_tokens === chat.usage.completion_tokens, `chat stream: usage ${JSON.stringify(usage)}`);

// completions, not streamed and streamed
const comp = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 10, temperature: 0 });
ok(comp.object === 'text_completion' && typeof comp.choices[0].text === 'string' && comp.usage.completion_tokens > 0, 'completions: text and usage');
const cs = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 10, temperature: 0, stream: true, stream_options: { include_usage: true } });
let ctext = '', cusage = null;
for await (const ch of cs) {
  if (ch.usage) cusage = ch.usage;
  for (const c of ch.choices) ctext += c.text;
}
ok(ctext === comp.choices[0].text, 'completions stream text equals the non-streamed text');
ok(cusage && cusage.completion_tokens === comp.usage.completion_tokens, `completions stream: usage ${JSON.stringify(cusage)}`);

// max_tokens honoured exactly when the model does not stop (ignore_eos is a vLLM extra field)
const exact = await client.completions.create({ model, prompt: 'a', max_tokens: 7, ignore_eos: true });
ok(exact.usage.completion_tokens === 7 && exact.choices[0].finish_reason === 'length', 'max_tokens 7 -> 7 tokens, length');

// n > 1 with a seed: each choice its own sequence (seed + index), reproducible
const n3 = await client.completions.create({ model, prompt: 'The', max_tokens: 8, n: 3, seed: 42, temperature: 1, ignore_eos: true });
const n3b = await client.completions.create({ model, prompt: 'The', max_tokens: 8, n: 3, seed: 42, temperature: 1, ignore_eos: true });
ok(n3.choices.length === 3 && n3.choices.map((c) => c.index).sort().join() === '0,1,2', 'n=3: three choices');
ok(n3.choices.map((c) => c.text).join('|') === n3b.choices.map((c) => c.text).join('|'), 'n=3 with a seed is reproducible');
ok(new Set(n3.choices.map((c) => c.text)).size > 1, 'n=3: choices differ (seed + index)');
ok(n3.usage.completion_tokens === 24, `n=3: usage counts all choices (${n3.usage.completion_tokens})`);
const ns = await client.chat.completions.create({ model, messages: msgs, max_tokens: 5, n: 2, stream: true, seed: 1 });
const seen = new Set();
for await (const ch of ns) for (const c of ch.choices) seen.add(c.index);
ok(seen.size === 2, 'n=2 streamed: both indices appear');

// logprobs
const lp = await client.chat.completions.create({ model, messages: msgs, max_tokens: 5, logprobs: true, top_logprobs: 3, ignore_eos: true });
const lc = lp.choices[0].logprobs && lp.choices[0].logprobs.content;
ok(lc && lc.length === 5 && lc.every((e) => typeof e.token === 'string' && e.logprob <= 0 && e.top_logprobs.length === 3), 'chat logprobs with top_logprobs 3');
const clp = await client.completions.create({ model, prompt: 'x', max_tokens: 4, logprobs: 2, ignore_eos: true });
ok(clp.choices[0].logprobs.tokens.length === 4 && clp.choices[0].logprobs.top_logprobs.length === 4, 'completions logprobs');

// stop strings: the text never contains the stop string
const base = (await client.completions.create({ model, prompt: 'Hello', max_tokens: 30, temperature: 0, ignore_eos: true })).choices[0].text;
if (base.length > 6) {
  const stop = base.slice(3, 5);
  const st = await client.completions.create({ model, prompt: 'Hello', max_tokens: 30, temperature: 0, ignore_eos: true, stop: [stop] });
  ok(st.choices[0].finish_reason === 'stop' && !st.choices[0].text.includes(stop) && base.startsWith(st.choices[0].text), `stop string ${JSON.stringify(stop)} cuts the text`);
} else {
  ok(true, 'stop string (skipped: short text)');
}

// errors come back as the client's typed errors
try {
  await new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'wrong', maxRetries: 0 }).models.list();
  ok(false, 'wrong key must fail');
} catch (e) {
  ok(e instanceof OpenAI.AuthenticationError && e.status === 401, `wrong key: ${e.constructor.name} ${e.status}`);
}
try {
  await client.chat.completions.create({ model, messages: msgs, max_tokens: -1 });
  ok(false, 'negative max_tokens must fail');
} catch (e) {
  ok(e instanceof OpenAI.BadRequestError && /max_tokens/.test(e.message), `negative max_tokens: ${e.status} ${e.message}`);
}
try {
  await client.chat.completions.create({ model: 'nope', messages: msgs });
  ok(false, 'unknown model must fail');
} catch (e) {
  ok(e instanceof OpenAI.NotFoundError, `unknown model: ${e.status}`);
}
console.log(`openai_client: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
