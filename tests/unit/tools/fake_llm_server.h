// An in-process stand-in for an LLM server, for the benchmark clients' tests: SGLang's native
// POST /generate and OpenAI's POST /v1/completions, both streamed, generating exactly
// max_new_tokens tokens at a fixed pace (or a scripted reply). It records what every request
// asked for, when it arrived, and how many requests were in flight at once, as seen from the
// server side.
#pragma once
#include <httplib.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace ms::test {

class FakeLlmServer {
 public:
  struct Seen {
    std::string path;
    nlohmann::json body;
    double arrival_s;  // from the server's start
  };
  // Words of the reply to a prompt text; empty: one word per requested token.
  using Script = std::function<std::vector<std::string>(const std::string& prompt_text)>;

  explicit FakeLlmServer(std::chrono::milliseconds per_token, Script script = {}, std::string model_dir = {})
      : per_token_(per_token), script_(std::move(script)), model_dir_(std::move(model_dir)) {
    std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-stream: a failed write, not death
    server_.new_task_queue = [] { return new httplib::ThreadPool(96); };
    server_.Post("/generate", [this](const httplib::Request& req, httplib::Response& res) { serve(req, res, true); });
    server_.Post("/v1/completions",
                 [this](const httplib::Request& req, httplib::Response& res) { serve(req, res, false); });
    server_.Get("/get_model_info", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(nlohmann::json{{"model_path", model_dir_}}.dump(), "application/json");
    });
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})", "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    start_ = std::chrono::steady_clock::now();
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeLlmServer() {
    server_.stop();
    thread_.join();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int max_in_flight() const { return max_in_flight_.load(); }
  int in_flight() const { return in_flight_.load(); }
  // Requests whose arrival index (0-based, in order of arrival) satisfies `refuse` get a 400.
  void refuse_when(std::function<bool(int)> refuse) { refuse_ = std::move(refuse); }
  std::vector<Seen> seen() const {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  struct Stream {
    std::vector<std::string> words;
    std::vector<int32_t> ids;
    int prompt_tokens = 0;
    bool native = true, closed = false;
  };

  void serve(const httplib::Request& req, httplib::Response& res, bool native) {
    const int now = ++in_flight_;
    for (int m = max_in_flight_.load(); now > m && !max_in_flight_.compare_exchange_weak(m, now);) {
    }
    auto body = nlohmann::json::parse(req.body);
    int index = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      index = int(seen_.size());
      seen_.push_back({req.path, body, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count()});
    }
    if (refuse_ && refuse_(index)) {
      --in_flight_;
      res.status = 400;
      res.set_content(R"({"error":{"message":"refused by the test","type":"invalid_request_error","code":400}})",
                      "application/json");
      return;
    }
    auto s = std::make_shared<Stream>();
    s->native = native;
    const nlohmann::json prompt = native ? (body.contains("text") ? body["text"] : body["input_ids"]) : body["prompt"];
    s->prompt_tokens = prompt.is_array() ? int(prompt.size()) : 0;
    const int max_new = native ? body["sampling_params"]["max_new_tokens"].get<int>() : body["max_tokens"].get<int>();
    if (script_ && prompt.is_string()) s->words = script_(prompt.get<std::string>());
    else
      for (int i = 0; i < max_new; ++i) s->words.push_back(" w" + std::to_string(i));
    res.set_chunked_content_provider(
        "text/event-stream", [this, s](size_t, httplib::DataSink& sink) { return stream(*s, sink); },
        [this, s](bool) {
          if (!s->closed) --in_flight_;  // the client went away mid-stream
        });
  }

  bool stream(Stream& s, httplib::DataSink& sink) {
    std::string text;
    for (size_t i = 0; i < s.words.size(); ++i) {
      std::this_thread::sleep_for(per_token_);
      text += s.words[i];
      s.ids.push_back(int32_t(i % 1000));
      nlohmann::json event;
      if (s.native)
        event = {{"text", text}, {"output_ids", s.ids},
                 {"meta_info", {{"prompt_tokens", s.prompt_tokens}, {"completion_tokens", int(i + 1)}}}};
      else
        event = {{"choices", {{{"index", 0}, {"text", s.words[i]}, {"finish_reason", nullptr}}}}};
      if (!write_event(sink, event.dump())) return false;
    }
    if (!s.native) {
      nlohmann::json usage = {{"prompt_tokens", s.prompt_tokens}, {"completion_tokens", s.words.size()}};
      write_event(sink, nlohmann::json{{"choices", nlohmann::json::array()}, {"usage", usage}}.dump());
    }
    write_event(sink, "[DONE]");
    // Leaves the in-flight count before the client can see the end of the stream, so the
    // count never includes a request the client has already finished.
    s.closed = true;
    --in_flight_;
    sink.done();
    return true;
  }
  static bool write_event(httplib::DataSink& sink, const std::string& data) {
    const std::string line = "data: " + data + "\n\n";
    return sink.write(line.data(), line.size());
  }

  std::chrono::milliseconds per_token_;
  Script script_;
  std::function<bool(int)> refuse_;
  std::string model_dir_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::chrono::steady_clock::time_point start_;
  std::atomic<int> in_flight_{0}, max_in_flight_{0};
  mutable std::mutex mu_;
  std::vector<Seen> seen_;
};

}  // namespace ms::test
