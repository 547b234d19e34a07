// The requests one HTTP call put into the engine (n choices of each prompt) and the outputs
// coming back. The engine's callbacks run on its stepping thread and only queue outputs here;
// the HTTP thread waits for them, turns them into JSON or SSE, and aborts whatever is left
// when it goes away (a disconnected client, a shutdown).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/engine.h"
#include "server/metrics.h"

namespace ms::server {

struct ChoiceEvent {
  size_t index;  // which submitted request
  StreamOutput output;
};

class RequestGroup {
 public:
  // `stopping` set means the server is shutting down: waits end and the requests are aborted.
  RequestGroup(EngineApi& engine, Metrics& metrics, const std::atomic<bool>& stopping);
  ~RequestGroup();
  RequestGroup(const RequestGroup&) = delete;
  RequestGroup& operator=(const RequestGroup&) = delete;

  // Checks every request first (a 400 naming the first bad one, nothing submitted), then
  // submits them all.
  void submit(std::vector<GenerateRequest> requests);
  // The outputs that arrived, waiting up to `timeout` for at least one.
  std::vector<ChoiceEvent> wait(std::chrono::milliseconds timeout);
  // Every output until all requests finished, in arrival order.
  std::vector<ChoiceEvent> wait_all();
  bool done() const;  // all finished and every output taken
  void abort();       // ends every unfinished request (they report finish_reason abort)
  size_t size() const { return ids_.size(); }

 private:
  struct State;
  EngineApi& engine_;
  Metrics& metrics_;
  const std::atomic<bool>& stopping_;
  std::shared_ptr<State> state_;  // shared with the engine's callbacks, which may outlive this
  std::vector<RequestId> ids_;
};

}  // namespace ms::server
