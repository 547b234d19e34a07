// Writes the tokenizer benchmark text to stdout: about 4 MB of mixed code, English comments
// and prose, and the multilingual test corpus (CJK, Arabic, Hindi, Thai, emoji, ...), with lines
// interleaved by a fixed-seed generator. Only pinned inputs are used (the npm packages of
// package-lock.json and tests/data/tokenizer_corpus.json), so the text is the same everywhere.
//   node tests/peers/bench_text.mjs > /tmp/tokenizer_bench.txt
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const modules = join(here, "node_modules");
const jinjaSrc = join(modules, "@huggingface/jinja/src");
const code = [
  ...readdirSync(jinjaSrc).sort().map((f) => join(jinjaSrc, f)),
  join(modules, "@lenml/tokenizers/src/tokenizers/tokenizers.js"),
  join(modules, "@lenml/tokenizers/src/tokenizers/utils/maths.js"),
].flatMap((f) => readFileSync(f, "utf8").split("\n"));
const corpus = JSON.parse(readFileSync(join(here, "../data/tokenizer_corpus.json"), "utf8")).filter((s) => s.length > 0);

let seed = 12345;
const next = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
const target = 4_000_000;
const parts = [];
let size = 0;
while (size < target) {
  // Two thirds code and comments (a run of consecutive lines), one third multilingual text.
  let block;
  if (next() < 0.66) {
    const start = Math.floor(next() * code.length);
    block = code.slice(start, start + 1 + Math.floor(next() * 30)).join("\n") + "\n";
  } else {
    block = corpus[Math.floor(next() * corpus.length)] + "\n";
  }
  parts.push(block);
  size += Buffer.byteLength(block);
}
process.stdout.write(parts.join(""));
