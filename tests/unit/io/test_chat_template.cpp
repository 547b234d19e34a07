// Chat templates byte for byte against @huggingface/jinja: the real DeepSeek-V3 and Qwen3
// templates over a set of conversations, and small templates covering the Jinja subset.
#include <gtest/gtest.h>

#include <fstream>

#include "io/chat_template.h"
#include "io/jinja.h"
#include "peers.h"

namespace ms {
namespace {

using ojson = nlohmann::ordered_json;

ojson msg(const char* role, ojson content) { return ojson{{"role", role}, {"content", std::move(content)}}; }

ojson weather_tool() {
  return ojson::parse(R"({"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "城市 name"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}})");
}

// Conversations for one model; tool calls take the shape that model's template reads.
std::vector<std::pair<ojson, ojson>> conversations(const std::string& model) {
  std::vector<std::pair<ojson, ojson>> out;  // (messages, tools)
  out.push_back({ojson::array({msg("user", "Hello!")}), nullptr});
  out.push_back({ojson::array({msg("system", "You are a helpful assistant."), msg("user", "What is 2+2?")}), nullptr});
  out.push_back({ojson::array({msg("system", "Be brief."), msg("user", "Hi"), msg("assistant", "Hello! How can I help?"),
                               msg("user", "Tell me a joke about C++.\nMake it short."),
                               msg("assistant", "Why did the template fail? It had no concept."),
                               msg("user", "另一个？ 😀 <b>bold</b> \"quotes\" and \\backslash")}),
                 nullptr});
  out.push_back({ojson::array({msg("system", "First system."), msg("system", "Second system."), msg("user", "Go")}),
                 nullptr});
  out.push_back({ojson::array({msg("user", "Think first."),
                               msg("assistant", "<think>\nThe user wants thought.\n</think>\n\nDone thinking."),
                               msg("user", "Again?")}),
                 nullptr});
  ojson call;
  if (model == "qwen3") {
    call = ojson::array({{{"type", "function"},
                          {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}, {"unit", "celsius"}}}}}},
                         {{"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Tokyo\"}"}}}}});
    ojson assistant = msg("assistant", "Let me check.");
    assistant["tool_calls"] = call;
    ojson reasoning = msg("assistant", "It is sunny in Paris and rainy in Tokyo.");
    reasoning["reasoning_content"] = "Both tools answered.";
    out.push_back({ojson::array({msg("system", "Use tools."), msg("user", "Weather in Paris and Tokyo?"), assistant,
                                 msg("tool", "{\"temp\": 21}"), msg("tool", "{\"temp\": 14}"), reasoning}),
                   ojson::array({weather_tool()})});
    out.push_back({ojson::array({msg("user", "Weather in Oslo?")}), ojson::array({weather_tool()})});
  } else {
    call = ojson::array({{{"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}},
                         {{"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Tokyo\"}"}}}}});
    ojson assistant = msg("assistant", nullptr);
    assistant["tool_calls"] = call;
    out.push_back({ojson::array({msg("system", "Use tools."), msg("user", "Weather in Paris and Tokyo?"), assistant,
                                 msg("tool", "{\"temp\": 21}"), msg("tool", "{\"temp\": 14}"),
                                 msg("assistant", "Sunny in Paris, rainy in Tokyo."), msg("user", "Thanks")}),
                   nullptr});
  }
  return out;
}

class ChatTemplateTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateTest, RendersLikeHuggingFaceJinja) {
  test::require_peers();
  std::string dir = test::peer_model_dir(GetParam());
  ChatTemplate tmpl = ChatTemplate::load(dir);
  std::vector<ojson> extras = {ojson::object()};
  if (GetParam() == "qwen3") extras = {ojson::object(), {{"enable_thinking", true}}, {{"enable_thinking", false}}};
  ojson cases = ojson::array();
  for (const auto& [messages, tools] : conversations(GetParam()))
    for (bool gen : {false, true})
      for (const auto& extra : extras)
        cases.push_back({{"messages", messages}, {"tools", tools}, {"add_generation_prompt", gen}, {"extra", extra}});
  auto ref = test::run_peer("chat_template_ref.mjs", {{"model_dir", dir}, {"cases", cases}})["rendered"];
  ASSERT_EQ(ref.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(ref[i].is_string()) << "the reference failed on case " << i << ": " << ref[i].dump();
    ChatTemplate::Inputs in;
    in.messages = cases[i]["messages"];
    in.tools = cases[i]["tools"];
    in.add_generation_prompt = cases[i]["add_generation_prompt"].get<bool>();
    in.extra = cases[i]["extra"];
    EXPECT_EQ(tmpl.render(in), ref[i].get<std::string>()) << "case " << i << ": " << cases[i].dump();
  }
}

TEST_P(ChatTemplateTest, CommandLinePrintsThePromptExactly) {
  test::require_peers();
  std::string dir = test::peer_model_dir(GetParam());
  auto [messages, tools] = conversations(GetParam()).back();
  std::string file = test::temp_dir() + "/messages.json";
  std::ofstream(file) << ojson{{"messages", messages}, {"tools", tools}}.dump();
  ojson extra = GetParam() == "qwen3" ? ojson{{"enable_thinking", false}} : ojson::object();
  ojson cases = ojson::array({{{"messages", messages}, {"tools", tools}, {"add_generation_prompt", true}, {"extra", extra}}});
  auto ref = test::run_peer("chat_template_ref.mjs", {{"model_dir", dir}, {"cases", cases}})["rendered"][0];
  ASSERT_TRUE(ref.is_string()) << ref.dump();
  std::string out;
  std::string var = GetParam() == "qwen3" ? " --var enable_thinking=false" : "";
  ASSERT_EQ(test::run_command(test::moeserve_bin() + " chat-template --model-path " + dir + " --messages-file " + file +
                                  " --add-generation-prompt" + var + " 2>/dev/null",
                              out),
            0)
      << out;
  EXPECT_EQ(out, ref.get<std::string>());
}

INSTANTIATE_TEST_SUITE_P(RealTemplates, ChatTemplateTest, ::testing::Values("qwen3", "deepseek_v3"));

// Small templates over the Jinja features chat templates use; each is rendered by both.
TEST(Jinja, FeaturesRenderLikeHuggingFaceJinja) {
  const std::vector<std::string> templates = {
      "{% for m in messages %}{{ loop.index }}/{{ loop.length }} {{ m.role }}{% if loop.first %} first{% endif %}"
      "{% if loop.last %} last{% endif %}|{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}\n{% endfor %}",
      "{%- for m in messages[::-1] -%}\n  {{- m['content'] | trim -}};\n{%- endfor %}",
      "{{ messages[1:] | length }} {{ messages[-1].role }} {{ messages[0:2] | map(attribute='role') | join(',') }}",
      "{% set ns = namespace(n=0, seen='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{% set ns.seen = ns.seen + m.role[0] %}{% endfor %}{{ ns.n }} {{ ns.seen }}",
      "{{ tools | tojson }}\n{{ tools[0] | tojson(indent=2) }}\n{{ {'a': [1, 2.5, none, true], 'b': 'ü\"'} | tojson }}",
      "{% if messages[0].content.startswith('  sys') and messages[0].content.endswith('!  ') %}yes{% else %}no{% endif %}"
      " {{ 'a,b,,c'.split(',') | tojson }} {{ 'x  y z'.split() | tojson }} [{{ messages[0].content.strip() }}]"
      " [{{ messages[0].content.lstrip() }}] [{{ messages[0].content.rstrip() }}]",
      "{{ 'Hello World'.upper() }} {{ 'Hello World'.lower() }} {{ 'hello world' | title }} {{ 'aXa'.replace('a', 'b') }}"
      " {{ 'abc' | upper }} {{ 'a-b-c' | replace('-', '+') }}",
      "{% if 'b' in 'abc' %}1{% endif %}{% if 'x' not in ['a', 'b'] %}2{% endif %}{% if 'role' in messages[0] %}3{% endif %}"
      "{% if undefined_var is defined %}4{% endif %}{% if messages is defined %}5{% endif %}{% if none is none %}6{% endif %}"
      "{% if messages[0].content is string %}7{% endif %}{% if 3 is odd %}8{% endif %}{% if messages[0].nope is not defined %}9{% endif %}",
      "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 10 / 4 }} {{ 1 + 2 * 3 - 4 }} {{ 'a' ~ 1 ~ 'b' }}"
      " {{ 'yes' if messages else 'no' }} {{ (1, 2)[1] }} {{ [1, 2, 3][-1] }} {{ 'abcdef'[1:4] }} {{ 'abcdef'[::-2] }}",
      "{# a comment #}  {%- if true %}\n    kept line\n  {%- endif %}\n  {% if true %}\n    trimmed block\n  {% endif %}\nend",
      "{% macro show(m, prefix='> ') %}{{ prefix }}{{ m.role }}: {{ m.content }}{% endmacro %}"
      "{% for m in messages %}{{ show(m) }}\n{% endfor %}{{ show(messages[0], prefix='* ') }}",
      "{% for k, v in {'x': 1, 'y': 2}.items() %}{{ k }}={{ v }};{% endfor %} {% for m in messages if m.role != 'system' %}"
      "{{ m.role }}{% else %}none{% endfor %} {% for x in [] %}x{% else %}empty{% endfor %}",
      "{{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ ['b', 'a', 'C'] | sort | join }}"
      " {{ [3, 1, 2] | first }} {{ [3, 1, 2] | last }} {{ undefined_thing | default('dflt') }} {{ [1, 1, 2] | unique | list | length }}",
      "{% set greeting %}Hi {{ messages[1].content }}{% endset %}{{ greeting }} {% set a, b = 1, 2 %}{{ a + b }}"
      " {{ messages[0].get('content') | length }} {{ messages[0].get('missing', 'd') }} {{ {'k': 'v'}.keys() | list | tojson }}",
      "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{% if loop.index > 3 %}{% break %}{% endif %}"
      "{{ m.role }} {% endfor %}",
      "{{ bos_token }}{% for m in messages %}{{ '<|' + m.role + '|>' + m.content | trim + '\\n' }}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}",
  };
  ojson messages = ojson::array({msg("system", "  sys prompt!  "), msg("user", "Hello there"),
                                 msg("assistant", "\n General Kenobi \n"), msg("user", "ü ñ 中文 🙂")});
  ojson cases = ojson::array();
  for (const auto& t : templates) {
    (void)t;
    cases.push_back({{"messages", messages}, {"tools", ojson::array({weather_tool()})}, {"add_generation_prompt", true},
                     {"extra", {{"bos_token", "<s>"}}}});
  }
  for (size_t i = 0; i < templates.size(); ++i) {
    auto ref = test::run_peer("chat_template_ref.mjs", {{"template", templates[i]}, {"cases", ojson::array({cases[i]})}});
    ASSERT_TRUE(ref["rendered"][0].is_string()) << "template " << i << ": reference failed: " << ref.dump();
    ChatTemplate tmpl(templates[i], ojson{{"bos_token", "<s>"}}, "feature template " + std::to_string(i));
    ChatTemplate::Inputs in;
    in.messages = messages;
    in.tools = cases[i]["tools"];
    in.add_generation_prompt = true;
    EXPECT_EQ(tmpl.render(in), ref["rendered"][0].get<std::string>()) << "template " << i << ":\n" << templates[i];
  }
}

std::string render_error(const std::string& source) {
  try {
    ChatTemplate tmpl(source, ojson::object(), "bad.jinja");
    tmpl.render(ChatTemplate::Inputs{});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Jinja, WhatItCannotRenderIsAClearError) {
  EXPECT_NE(render_error("a\n{% filter upper %}x{% endfilter %}").find("line 2: unsupported tag {% filter %}"), std::string::npos)
      << render_error("a\n{% filter upper %}x{% endfilter %}");
  EXPECT_NE(render_error("{{ 'x' | frobnicate }}").find("unsupported filter 'frobnicate'"), std::string::npos);
  EXPECT_NE(render_error("{% if x %}unclosed").find("missing {% elif or else or endif %}"), std::string::npos)
      << render_error("{% if x %}unclosed");
  EXPECT_NE(render_error("\n\n{{ raise_exception('Only user and assistant roles') }}").find("line 3"), std::string::npos);
  EXPECT_NE(render_error("{{ raise_exception('Only user and assistant roles') }}").find("Only user and assistant roles"),
            std::string::npos);
  EXPECT_NE(render_error("{{ nothing.attr }}").find("'nothing' is undefined"), std::string::npos)
      << render_error("{{ nothing.attr }}");
  EXPECT_NE(render_error("{{ 'a' + 1 }}").find("unsupported operand"), std::string::npos);
  EXPECT_NE(render_error("{{ 'unterminated }}").find("bad.jinja"), std::string::npos);
}

}  // namespace
}  // namespace ms
