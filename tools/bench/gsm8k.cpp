#include "gsm8k.h"

#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace ms::bench {

std::vector<Gsm8kItem> read_gsm8k(const std::string& path) {
  std::ifstream in(path);
  MS_CHECK(in, "--data-path: cannot open ", path);
  std::vector<Gsm8kItem> items;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      auto j = nlohmann::json::parse(line);
      items.push_back({j.at("question").get<std::string>(), j.at("answer").get<std::string>()});
    } catch (const std::exception& e) {
      fail(path, ":", line_no, ": expected {\"question\": ..., \"answer\": ...}: ", e.what());
    }
  }
  MS_CHECK(!items.empty(), path, ": no questions");
  return items;
}

std::optional<int64_t> extract_answer(const std::string& text) {
  std::optional<int64_t> last;
  size_t i = 0;
  while (i < text.size()) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    // Digits run across commas ("1,234"), as they do once commas are deleted.
    int64_t value = 0;
    bool overflow = false;
    for (; i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == ','); ++i) {
      if (text[i] == ',') continue;
      if (value > (INT64_MAX - 9) / 10) overflow = true;
      else value = value * 10 + (text[i] - '0');
    }
    last = overflow ? std::nullopt : std::optional<int64_t>(value);
  }
  return last;
}

std::string gsm8k_example(const Gsm8kItem& item, bool include_answer) {
  std::string s = "Question: " + item.question + "\nAnswer:";
  if (include_answer) s += " " + item.answer;
  return s;
}

std::string gsm8k_few_shot(const std::vector<Gsm8kItem>& items, int num_shots) {
  MS_CHECK(num_shots >= 0 && size_t(num_shots) <= items.size(), "--num-shots ", num_shots, ": the data file has ",
           items.size(), " items");
  std::string s;
  for (int i = 0; i < num_shots; ++i) s += gsm8k_example(items[size_t(i)], true) + "\n\n";
  return s;
}

const std::vector<std::string>& gsm8k_stop() {
  static const std::vector<std::string> stop = {"Question", "Assistant:", "<|separator|>"};
  return stop;
}

Gsm8kScore score_gsm8k(const std::vector<Gsm8kItem>& items, const std::vector<std::string>& generations) {
  MS_CHECK(generations.size() <= items.size(), "score_gsm8k: ", generations.size(), " generations for ", items.size(),
           " items");
  Gsm8kScore score;
  for (size_t i = 0; i < generations.size(); ++i) {
    const auto label = extract_answer(items[i].answer);
    MS_CHECK(label, "GSM8K item ", i, " has no numeric answer: ", items[i].answer.substr(0, 80));
    const auto pred = extract_answer(generations[i]);
    ++score.questions;
    if (!pred) ++score.invalid;
    else if (*pred == *label) ++score.correct;
  }
  return score;
}

}  // namespace ms::bench
