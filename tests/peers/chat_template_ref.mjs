// Reference chat-template renderer for the moeserve tests: @huggingface/jinja with the
// variables transformers' apply_chat_template passes (special tokens that are set, messages,
// tools, add_generation_prompt, extra keyword arguments).
//   node chat_template_ref.mjs REQUEST.json RESPONSE.json
// REQUEST:  {"model_dir": DIR (its tokenizer_config.json chat_template) | "template": SOURCE,
//            "cases": [{"messages": [...], "tools": [...] | null, "add_generation_prompt": bool,
//                       "extra": {...}}]}
// RESPONSE: {"rendered": [string | {"error": message}]}
import { readFileSync, writeFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";

const [requestPath, responsePath] = process.argv.slice(2);
const request = JSON.parse(readFileSync(requestPath, "utf8"));

let source = request.template;
const specialTokens = {};
if (request.model_dir) {
  const config = JSON.parse(readFileSync(`${request.model_dir}/tokenizer_config.json`, "utf8"));
  source = config.chat_template;
  for (const key of ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]) {
    const t = config[key];
    const content = t && typeof t === "object" ? t.content : t;
    if (content) specialTokens[key] = content;
  }
  if (config.additional_special_tokens) specialTokens.additional_special_tokens = config.additional_special_tokens;
}
const template = new Template(source);
const rendered = request.cases.map((c) => {
  try {
    return template.render({
      ...specialTokens,
      messages: c.messages,
      tools: c.tools ?? null,
      add_generation_prompt: !!c.add_generation_prompt,
      ...(c.extra ?? {}),
    });
  } catch (e) {
    return { error: String(e.message ?? e) };
  }
});
writeFileSync(responsePath, JSON.stringify({ rendered }));
