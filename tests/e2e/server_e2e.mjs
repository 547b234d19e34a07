// End-to-end tests of `moeserve serve` through the official openai client and raw HTTP.
//   node tests/e2e/server_e2e.mjs MOESERVE_BIN api|bad|disconnect|speculative|speculative_parallel|parallel|load
//        [clients] [tokens]
// Each mode starts its own server on a free loopback port with a fresh demo model (random
// weights, a real byte-level BPE tokenizer) and exits non-zero on the first failed check.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import http from 'node:http';

const require = createRequire(join(import.meta.dirname, '../peers/package.json'));
const OpenAI = require('openai').default ?? require('openai');
const [bin, mode, arg1, arg2] = process.argv.slice(2);
const work = mkdtempSync(join(tmpdir(), 'moeserve-e2e-'));
const model = join(work, 'demo');
let server;

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

async function startServer(extra = [], modelPath = null) {
  if (!modelPath) execFileSync(bin, ['make-demo-model', model], { stdio: 'ignore' });
  server = spawn(bin, ['serve', '--model-path', modelPath ?? model, '--port', '0', '--max-total-tokens', '65536',
                       '--max-running-requests', '256', ...extra], { stdio: ['ignore', 'pipe', 'inherit'] });
  const url = await new Promise((resolve, reject) => {
    let out = '';
    server.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/ready (http:\/\/\S+)/);
      if (m) resolve(m[1]);
    });
    server.on('exit', (code) => reject(new Error(`server exited with ${code}`)));
  });
  return url;
}

async function raw(url, path, body, { method = 'POST', headers = {} } = {}) {
  const res = await fetch(url + path, { method, body: typeof body === 'string' ? body : JSON.stringify(body),
                                        headers: { 'Content-Type': 'application/json', ...headers } });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch {}
  return { status: res.status, text, json };
}

// What `moeserve generate` produces for the same prompt, greedily.
function generateText(prompt, maxTokens) {
  const file = join(work, 'in.jsonl');
  writeFileSync(file, JSON.stringify({ text: prompt, max_new_tokens: maxTokens, temperature: 0, ignore_eos: true }) + '\n');
  const out = execFileSync(bin, ['generate', '--model-path', model, '--input-file', file]).toString();
  return JSON.parse(out.trim().split('\n').pop());
}

async function apiTests(url) {
  const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'none' });
  const prompt = 'The router chooses a few experts for each token';
  const ref = generateText(prompt, 24);
  // Greedy completions equal generate's, as text and as token ids.
  const c = await client.completions.create({ model: 'demo', prompt, max_tokens: 24, temperature: 0,
                                              ignore_eos: true, skip_special_tokens: false });
  check(c.choices[0].text === ref.text, `completion text ${JSON.stringify(c.choices[0].text)} == generate ${JSON.stringify(ref.text)}`);
  check(c.usage.completion_tokens === 24 && c.usage.prompt_tokens > 0, 'completion usage');
  const g = await raw(url, '/generate', { text: prompt, sampling_params: { max_new_tokens: 24, temperature: 0, ignore_eos: true } });
  check(JSON.stringify(g.json.output_ids) === JSON.stringify(ref.output_ids), '/generate output_ids == generate');
  // Streaming gives the same text, chunk by chunk, then usage.
  const stream = await client.completions.create({ model: 'demo', prompt, max_tokens: 24, temperature: 0, stream: true,
                                                   ignore_eos: true, skip_special_tokens: false,
                                                   stream_options: { include_usage: true } });
  let text = '', usage = null, chunks = 0;
  for await (const ch of stream) {
    if (ch.choices.length) text += ch.choices[0].text, ++chunks;
    if (ch.usage) usage = ch.usage;
  }
  check(text === ref.text && chunks > 1, 'streamed text == generate');
  check(usage && usage.completion_tokens === 24, 'stream usage');
  // The same prompt again reuses the radix cache.
  const again = await client.completions.create({ model: 'demo', prompt, max_tokens: 4, temperature: 0 });
  check(again.usage.prompt_tokens_details.cached_tokens > 0, 'cached_tokens on a repeated prompt');
  // Chat (template applied), non-stream and stream agree.
  const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Hello! How are you today?' }];
  const chat = await client.chat.completions.create({ model: 'demo', messages, max_tokens: 16, temperature: 0, ignore_eos: true });
  check(chat.choices[0].message.role === 'assistant' && chat.usage.completion_tokens === 16, 'chat response');
  let chatText = '';
  for await (const ch of await client.chat.completions.create({ model: 'demo', messages, max_tokens: 16, temperature: 0,
                                                                 ignore_eos: true, stream: true }))
    chatText += ch.choices[0]?.delta?.content ?? '';
  check(chatText === chat.choices[0].message.content, 'chat stream == chat');
  // n > 1 with a seed: n choices, repeatable.
  const nreq = { model: 'demo', prompt: [prompt, 'Hello'], n: 3, max_tokens: 8, temperature: 1.0, seed: 7, ignore_eos: true };
  const n1 = await client.completions.create(nreq), n2 = await client.completions.create(nreq);
  check(n1.choices.length === 6 && n1.choices.every((ch, i) => ch.index === i), 'n=3 x 2 prompts: 6 choices in order');
  check(JSON.stringify(n1.choices.map((x) => x.text)) === JSON.stringify(n2.choices.map((x) => x.text)), 'seeded n>1 repeats');
  check(n1.usage.completion_tokens === 48, 'n>1 usage');
  // Stop strings: cut where generate's text first shows the stop string.
  const stopAt = ref.text.slice(6, 8);
  const s = await client.completions.create({ model: 'demo', prompt, max_tokens: 24, temperature: 0, stop: [stopAt],
                                              skip_special_tokens: false });
  check(s.choices[0].finish_reason === 'stop' && s.choices[0].text === ref.text.slice(0, ref.text.indexOf(stopAt)),
        `stop ${JSON.stringify(stopAt)}: ${JSON.stringify(s.choices[0].text)}`);
  let st = '';
  for await (const ch of await client.completions.create({ model: 'demo', prompt, max_tokens: 24, temperature: 0,
                                                           stop: [stopAt], stream: true, skip_special_tokens: false }))
    st += ch.choices[0]?.text ?? '';
  check(st === s.choices[0].text, 'streamed stop text');
  // Logprobs: completions (top-N dicts) and chat (content entries).
  const lp = await client.completions.create({ model: 'demo', prompt, max_tokens: 5, temperature: 0, logprobs: 3 });
  const L = lp.choices[0].logprobs;
  check(L.tokens.length === 5 && L.token_logprobs.every((x) => x <= 0) && Object.keys(L.top_logprobs[0]).length >= 1,
        'completion logprobs');
  check(Math.max(...Object.values(L.top_logprobs[0])) <= L.token_logprobs[0] + 1e-5, 'greedy token is the top logprob');
  const clp = await client.chat.completions.create({ model: 'demo', messages, max_tokens: 4, temperature: 0,
                                                    logprobs: true, top_logprobs: 2 });
  check(clp.choices[0].logprobs.content.length === 4 && clp.choices[0].logprobs.content[0].top_logprobs.length === 2,
        'chat logprobs');
  const models = await client.models.list();
  check(models.data.length === 1, '/v1/models');
  for (const p of ['/health', '/get_model_info', '/get_server_info', '/metrics'])
    check((await raw(url, p, undefined, { method: 'GET' })).status === 200, `GET ${p}`);
  const metrics = (await raw(url, '/metrics', undefined, { method: 'GET' })).text;
  for (const m of ['num_running_reqs', 'num_queue_reqs', 'token_usage', 'cache_hit_rate', 'time_to_first_token_seconds_bucket',
                   'inter_token_latency_seconds_bucket', 'e2e_request_latency_seconds_count', 'gen_throughput'])
    check(metrics.includes('moeserve:' + m), `metric ${m}`);
  check((await raw(url, '/flush_cache', {})).status === 200, 'flush_cache');
}

async function badInputTests(url) {
  const auth = { Authorization: 'Bearer sekret' };
  const post = (path, body) => raw(url, path, body, { headers: auth });
  const ok = { model: 'demo', prompt: 'Hello', max_tokens: 4 };
  const cases = [
    ['no API key', () => raw(url, '/v1/completions', ok), 401],
    ['wrong API key', () => raw(url, '/v1/completions', ok, { headers: { Authorization: 'Bearer nope' } }), 401],
    ['malformed JSON', () => post('/v1/completions', '{"model": "demo", "prompt": '), 400],
    ['body not an object', () => post('/v1/completions', '[1, 2]'), 400],
    ['empty body', () => post('/v1/completions', ''), 400],
    ['missing prompt', () => post('/v1/completions', { model: 'demo' }), 400],
    ['prompt of wrong type', () => post('/v1/completions', { ...ok, prompt: 42 }), 400],
    ['empty prompt', () => post('/v1/completions', { ...ok, prompt: '' }), 400],
    ['token id out of vocab', () => post('/v1/completions', { ...ok, prompt: [1, 99999999] }), 400],
    ['negative token id', () => post('/v1/completions', { ...ok, prompt: [1, -3] }), 400],
    ['unknown field', () => post('/v1/completions', { ...ok, frobnicate: true }), 400],
    ['max_tokens 0', () => post('/v1/completions', { ...ok, max_tokens: 0 }), 400],
    ['max_tokens negative', () => post('/v1/completions', { ...ok, max_tokens: -5 }), 400],
    ['max_tokens a string', () => post('/v1/completions', { ...ok, max_tokens: '10' }), 400],
    ['max_tokens past the context', () => post('/v1/completions', { ...ok, max_tokens: 10000000 }), 400],
    ['prompt longer than the context', () => post('/v1/completions', { ...ok, prompt: Array(5000).fill(5) }), 400],
    ['temperature negative', () => post('/v1/completions', { ...ok, temperature: -1 }), 400],
    ['top_p 0', () => post('/v1/completions', { ...ok, top_p: 0 }), 400],
    ['huge n', () => post('/v1/completions', { ...ok, n: 100000 }), 400],
    ['n 0', () => post('/v1/completions', { ...ok, n: 0 }), 400],
    ['logprobs too many', () => post('/v1/completions', { ...ok, logprobs: 1000 }), 400],
    ['stop of wrong type', () => post('/v1/completions', { ...ok, stop: [1, 2] }), 400],
    ['stream_options without stream', () => post('/v1/completions', { ...ok, stream_options: { include_usage: true } }), 400],
    ['chat without messages', () => post('/v1/chat/completions', { model: 'demo' }), 400],
    ['chat with a bad role', () => post('/v1/chat/completions', { model: 'demo', messages: [{ role: 'wizard', content: 'x' }] }), 400],
    ['chat content of wrong type', () => post('/v1/chat/completions', { model: 'demo', messages: [{ role: 'user', content: 7 }] }), 400],
    ['chat image part', () => post('/v1/chat/completions', { model: 'demo', messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }), 400],
    ['top_logprobs without logprobs', () => post('/v1/chat/completions', { model: 'demo', messages: [{ role: 'user', content: 'x' }], top_logprobs: 2 }), 400],
    ['generate with text and input_ids', () => post('/generate', { text: 'a', input_ids: [1] }), 400],
    ['generate unknown sampling param', () => post('/generate', { text: 'a', sampling_params: { warp: 9 } }), 400],
    ['generate max_new_tokens 0', () => post('/generate', { text: 'a', sampling_params: { max_new_tokens: 0 } }), 400],
    ['oversized body', () => post('/v1/completions', { ...ok, prompt: 'x'.repeat(40 << 20) }), 413],
    ['unknown route', () => post('/v1/nothing', ok), 404],
  ];
  for (const [what, send, status] of cases) {
    const r = await send();
    check(r.status === status, `${what}: HTTP ${r.status}, expected ${status} (${r.text.slice(0, 200)})`);
    const e = r.json?.error;
    check(e && typeof e.message === 'string' && typeof e.type === 'string' && 'code' in e, `${what}: OpenAI error body`);
  }
  check((await raw(url, '/health', undefined, { method: 'GET' })).status === 200, '/health after bad input');
  const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'sekret' });
  const c = await client.completions.create({ model: 'demo', prompt: 'Hello', max_tokens: 6, ignore_eos: true });
  check(c.usage.completion_tokens === 6, 'a normal request after bad input');
  console.log(`${cases.length} kinds of bad request refused`);
}

async function serverInfo(url) {
  return (await raw(url, '/get_server_info', undefined, { method: 'GET' })).json.internal_states[0];
}

// Streams that the client abandons after a few tokens: their requests end and their KV slots
// come back while other streams carry on.
async function disconnectTests(url) {
  const body = JSON.stringify({ model: 'demo', prompt: 'Hello', max_tokens: 3000, stream: true, ignore_eos: true });
  const abandon = () => new Promise((resolve, reject) => {
    const req = http.request(url + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' } }, (res) => {
      let chunks = 0;
      res.on('data', () => { if (++chunks === 5) { req.destroy(); resolve(); } });
      res.on('error', () => {});
    });
    req.on('error', () => {});
    req.end(body);
  });
  await Promise.all(Array.from({ length: 8 }, abandon));
  let info;
  for (let i = 0; i < 100; ++i) {
    info = await serverInfo(url);
    if (info.num_running_reqs === 0 && info.num_waiting_reqs === 0 && info.kv_used_tokens === 0) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  check(info.num_running_reqs === 0 && info.kv_used_tokens === 0, `KV freed after disconnects: ${JSON.stringify(info)}`);
  const metrics = (await raw(url, '/metrics', undefined, { method: 'GET' })).text;
  check(/moeserve:num_aborted_requests_total\{[^}]*\} 8\b/.test(metrics), 'the 8 abandoned requests were aborted');
  const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'none' });
  check((await client.completions.create({ model: 'demo', prompt: 'Hi', max_tokens: 4, ignore_eos: true })).usage.completion_tokens === 4,
        'serving after disconnects');
}

function rssKb(pid) {
  return Number(readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]);
}

// `clients` concurrent streaming chat clients, each asking for `tokens` tokens, twice over
// (the second round checks that memory stays flat).
async function loadTest(url, clients, tokens) {
  const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'none', maxRetries: 0, timeout: 600000 });
  const round = async () => {
    const t0 = performance.now();
    const ttft = [], itl = [];
    const one = async (i) => {
      const start = performance.now();
      let last = 0, count = 0;
      const stream = await client.chat.completions.create({ model: 'demo', stream: true, max_tokens: tokens, ignore_eos: true,
        temperature: 0.8, seed: i, messages: [{ role: 'user', content: `Request ${i}: tell me about experts.` }],
        stream_options: { include_usage: true } });
      let usage = null;
      for await (const ch of stream) {
        if (ch.usage) usage = ch.usage;
        if (!ch.choices.length || !ch.choices[0].delta?.content) continue;
        const now = performance.now();
        if (!count) ttft.push(now - start); else itl.push(now - last);
        last = now, ++count;
      }
      check(usage && usage.completion_tokens === tokens, `client ${i}: ${usage?.completion_tokens} tokens, expected ${tokens}`);
    };
    await Promise.all(Array.from({ length: clients }, (_, i) => one(i)));
    const secs = (performance.now() - t0) / 1000;
    const pct = (a, p) => a.sort((x, y) => x - y)[Math.min(a.length - 1, Math.floor(a.length * p))];
    return { seconds: secs, req_per_s: clients / secs, out_tok_per_s: clients * tokens / secs,
             ttft_ms_p50: pct(ttft, 0.5), ttft_ms_p99: pct(ttft, 0.99), itl_ms_p50: pct(itl, 0.5), itl_ms_p99: pct(itl, 0.99) };
  };
  const r1 = await round();
  const rss1 = rssKb(server.pid);
  const r2 = await round();
  const rss2 = rssKb(server.pid);
  console.log(JSON.stringify({ clients, tokens, round1: r1, round2: r2, rss_mb_after_round1: rss1 / 1024, rss_mb_after_round2: rss2 / 1024 }));
  check(rss2 < rss1 * 1.1 + 20 * 1024, `memory flat: ${rss1} kB then ${rss2} kB`);
  const info = await serverInfo(url);
  check(info.kv_used_tokens === 0 && info.num_running_reqs === 0, 'idle after the load');
}

// MTP speculative decoding through the server (a DeepSeek fixture: token ids only): the same
// ids as `moeserve generate` without speculation, and the acceptance metrics exported. Over
// ranks (speculative_parallel) several prompts at once, so the DP groups verify side by side.
const fixture = join(import.meta.dirname, '../fixtures/deepseek-v3-tiny');
async function speculativeTests(url, prompts = [[5, 17, 3, 99, 410, 7]]) {
  const plain = prompts.map((ids) => JSON.parse(execFileSync(bin, ['generate', '--model-path', fixture, '--ids', ids.join(','),
                                                                   '--max-new-tokens', '12', '--ignore-eos']).toString()));
  const results = await Promise.all(prompts.map((ids) => raw(url, '/generate',
    { input_ids: ids, sampling_params: { max_new_tokens: 12, temperature: 0, ignore_eos: true } })));
  results.forEach((res, i) => {
    check(res.status === 200, `generate: ${res.status} ${res.text}`);
    check(JSON.stringify(JSON.parse(res.text).output_ids) === JSON.stringify(plain[i].output_ids),
          `speculative ids ${res.text} equal plain ${JSON.stringify(plain[i])}`);
  });
  const metrics = (await raw(url, '/metrics', undefined, { method: 'GET' })).text;
  const m = metrics.match(/moeserve:spec_accept_length\{[^}]*\} ([0-9.e+-]+)/);
  check(m && Number(m[1]) >= 1, `spec_accept_length exported: ${m && m[1]}`);
  check(/moeserve:spec_verify_forwards_total\{[^}]*\} [1-9]/.test(metrics), 'verify forwards counted');
}

// The server over four CPU ranks (two DP-attention groups, experts split over four EP ranks):
// the same greedy ids as one rank, and the whole API and a burst of streams on top of it.
const parallelFlags = ['--tp', '4', '--dp', '2', '--enable-dp-attention', '--ep-size', '4'];
async function parallelTests(url) {
  const ids = [5, 17, 3, 99, 410, 7];
  const one = JSON.parse(execFileSync(bin, ['generate', '--model-path', model, '--ids', ids.join(','),
                                            '--max-new-tokens', '12', '--ignore-eos']).toString());
  const res = await raw(url, '/generate', { input_ids: ids, sampling_params: { max_new_tokens: 12, temperature: 0, ignore_eos: true } });
  check(res.status === 200, `generate: ${res.status} ${res.text}`);
  check(JSON.stringify(JSON.parse(res.text).output_ids) === JSON.stringify(one.output_ids),
        `4-rank ids ${res.text} equal one rank's ${JSON.stringify(one)}`);
  await apiTests(url);
  await loadTest(url, 32, 8);
}

async function main() {
  const extra = mode === 'bad' ? ['--api-key', 'sekret'] : mode === 'parallel' ? parallelFlags : [];
  const spec = mode === 'speculative' || mode === 'speculative_parallel';
  const specFlags = ['--speculative-algorithm', 'NEXTN', '--speculative-num-steps', '3', '--speculative-num-draft-tokens', '4',
                     ...(mode === 'speculative_parallel' ? ['--tp', '2', '--dp', '2', '--enable-dp-attention', '--ep-size', '2'] : [])];
  const url = await startServer(spec ? specFlags : extra, spec ? fixture : null);
  if (mode === 'speculative') await speculativeTests(url);
  else if (mode === 'speculative_parallel') await speculativeTests(url, [[5, 17, 3, 99, 410, 7], [9, 8, 7], [300, 12, 41, 1000, 2]]);
  else if (mode === 'api') await apiTests(url);
  else if (mode === 'parallel') await parallelTests(url);
  else if (mode === 'bad') await badInputTests(url);
  else if (mode === 'disconnect') await disconnectTests(url);
  else if (mode === 'load') await loadTest(url, Number(arg1 ?? 64), Number(arg2 ?? 16));
  else throw new Error(`unknown mode ${mode}`);
  // Graceful shutdown on SIGTERM: the process exits 0.
  const code = await new Promise((resolve) => { server.on('exit', (c) => resolve(c)); server.kill('SIGTERM'); });
  check(code === 0, `server exit status ${code} after SIGTERM`);
  server = null;
  console.log(`${mode}: passed`);
}

main().catch((e) => { console.error(e.stack ?? String(e)); process.exitCode = 1; })
  .finally(() => { if (server) server.kill('SIGKILL'); rmSync(work, { recursive: true, force: true }); });
