// Speculative decoding with DeepSeek's MTP layer is lossless: on deepseek-v3-tiny (which has
// one), the four reference prompts decoded greedily together give exactly the tokens of the
// engine without speculation, for 1..4 draft steps, with chunked prefill, the radix cache and
// retraction; no slot leaks once idle. The fixture's weights are random, so the MTP guesses
// rarely agree with the target: the accept length measured from the counters stays near 1.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>

#include "io/safetensors.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/spec_mtp_draft.h"
#include "runtime/spec_replay_draft.h"
#include "test_support.h"

namespace ms {
namespace {

constexpr int kPrompts = 4;
constexpr int kNewTokens = 24;

class SpeculativeMtpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = load_model(test::fixture_dir("deepseek-v3-tiny")).release();
    auto ref = WeightStore::open_file(test::fixture_dir("deepseek-v3-tiny") + "/reference.safetensors");
    for (int i = 0; i < kPrompts; ++i)
      prompts_.push_back(test::to_ids(ref.get("prompt." + std::to_string(i) + ".input_ids")));
    EngineOptions o;
    o.max_total_tokens = 4096;
    o.scheduler.enable_radix_cache = false;
    Engine plain(*model_, o);
    for (const GenerateResult& r : plain.generate(requests())) baseline_.push_back(r.output_ids);
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  static std::vector<GenerateRequest> requests() { return test::greedy_requests(prompts_, kNewTokens); }
  static EngineOptions spec_options(int steps) {
    EngineOptions o;
    o.max_total_tokens = 4096;
    o.speculative.algorithm = "NEXTN";
    o.speculative.num_steps = steps;
    return o;
  }
  static int64_t total_prompt_tokens() {
    int64_t n = 0;
    for (const auto& p : prompts_) n += int64_t(p.size());
    return n;
  }

  // Outputs equal the plain engine's; the counters add up; nothing leaks.
  // `before`: the counters before this generate call (an engine can serve several).
  static void expect_lossless(Engine& engine, const std::vector<GenerateResult>& results, const std::string& label,
                              const SpeculativeStats& before = {}) {
    ASSERT_EQ(results.size(), size_t(kPrompts)) << label;
    int64_t emitted = 0;
    for (int i = 0; i < kPrompts; ++i) {
      EXPECT_EQ(results[size_t(i)].output_ids, baseline_[size_t(i)]) << label << " prompt " << i;
      emitted += int64_t(results[size_t(i)].output_ids.size());
    }
    const EngineStats s = engine.stats();
    ASSERT_TRUE(s.speculative) << label;
    // Each request's first token comes from its prefill, every other one from a verify, except
    // that a retracted request's recompute samples one more from its prefill.
    const int64_t verified = s.spec.emitted_tokens - before.emitted_tokens;
    EXPECT_LE(verified, emitted - kPrompts) << label;
    EXPECT_GE(verified, emitted - kPrompts - s.scheduler.retractions) << label;
    EXPECT_EQ(s.spec.verified_seqs, std::accumulate(s.spec.accept_histogram.begin(), s.spec.accept_histogram.end(),
                                                    int64_t(0))) << label;
    EXPECT_EQ(s.scheduler.decode_batches, s.spec.verify_forwards) << label;
    EXPECT_GT(s.spec.draft_forwards, 0) << label;
    EXPECT_EQ(s.pool_used, s.cached_slots) << label << ": slots of rejected drafts must go back to the pool";
  }

  static CausalLM* model_;
  static std::vector<std::vector<int32_t>> prompts_, baseline_;
};

CausalLM* SpeculativeMtpTest::model_ = nullptr;
std::vector<std::vector<int32_t>> SpeculativeMtpTest::prompts_, SpeculativeMtpTest::baseline_;

TEST_F(SpeculativeMtpTest, GreedyIsLosslessForOneToFourSteps) {
  for (int steps = 1; steps <= 4; ++steps) {
    EngineOptions o = spec_options(steps);
    o.scheduler.enable_radix_cache = false;
    Engine engine(*model_, o);
    const std::string label = "steps " + std::to_string(steps);
    expect_lossless(engine, engine.generate(requests()), label);
    const EngineStats s = engine.stats();
    EXPECT_EQ(s.scheduler.extend_batches, 1) << label << ": all four prompts prefill together";
    EXPECT_EQ(s.pool_used, 0) << label;
    // A full verify drafts `steps` tokens; the last ones of a request draft fewer.
    EXPECT_LE(s.spec.drafted_tokens, s.spec.verified_seqs * steps) << label;
    EXPECT_GT(s.spec.drafted_tokens, s.spec.verified_seqs * (steps - 1)) << label;
    // Draft forwards: one observe per step, plus steps - 1 chain forwards per verify.
    EXPECT_LE(s.spec.draft_forwards, s.scheduler.extend_batches + s.spec.verify_forwards * steps) << label;
  }
}

// Random weights: the MTP layer guesses at random, so a verify gains little beyond the target's
// own token. The bound is on the measured ratio, not on a recorded value.
TEST_F(SpeculativeMtpTest, RandomModelAcceptsNearOneToken) {
  Engine engine(*model_, spec_options(3));
  engine.generate(requests());
  const SpeculativeStats s = engine.stats().spec;
  ASSERT_GT(s.verified_seqs, 0);
  const double accept_length = double(s.emitted_tokens) / double(s.verified_seqs);
  EXPECT_GE(accept_length, 1.0);
  EXPECT_LT(accept_length, 1.5);
  EXPECT_DOUBLE_EQ(accept_length, s.mean_accept_length());
  EXPECT_LT(s.acceptance_rate(), 0.25);
  EXPECT_GT(s.draft_seconds, 0.0);
  EXPECT_GT(s.draft_overhead(), 0.0);
  EXPECT_LT(s.draft_overhead(), 1.0);
}

TEST_F(SpeculativeMtpTest, ChunkedPrefill) {
  EngineOptions o = spec_options(3);
  o.scheduler.chunked_prefill_size = 16;
  Engine engine(*model_, o);
  expect_lossless(engine, engine.generate(requests()), "chunked-16");
  EXPECT_GE(engine.stats().scheduler.extend_batches, (total_prompt_tokens() + 15) / 16);
}

// The second pass reuses every prompt from the cache: the draft's KV in those slots came with
// them, and the outputs still match.
TEST_F(SpeculativeMtpTest, RadixCacheReuse) {
  EngineOptions o = spec_options(2);
  o.scheduler.chunked_prefill_size = 64;
  Engine engine(*model_, o);
  expect_lossless(engine, engine.generate(requests()), "radix, first pass");
  const SpeculativeStats first = engine.stats().spec;
  std::vector<GenerateResult> second = engine.generate(requests());
  expect_lossless(engine, second, "radix, second pass", first);
  for (int i = 0; i < kPrompts; ++i)
    EXPECT_EQ(second[size_t(i)].cached_tokens, int(prompts_[size_t(i)].size()) - 1) << "prompt " << i;
  engine.flush_cache();
  EXPECT_EQ(engine.stats().pool_used, 0);
}

// A pool that holds the prompts but not the outputs (nor the drafts): verifies shrink their
// drafts and decoding retracts requests, which are recomputed; the output does not change.
TEST_F(SpeculativeMtpTest, RetractionUnderMemoryPressure) {
  for (bool radix : {false, true}) {
    EngineOptions o = spec_options(3);
    o.max_total_tokens = total_prompt_tokens() + 9;
    o.scheduler.enable_radix_cache = radix;
    o.scheduler.conservativeness = 0.0;
    Engine engine(*model_, o);
    const std::string label = radix ? "retraction+radix" : "retraction";
    expect_lossless(engine, engine.generate(requests()), label);
    EXPECT_GT(engine.stats().scheduler.retractions, 0) << label;
  }
}

// Sampling (temperature > 0) goes through speculative sampling: same seed, same tokens, and the
// counters add up as for greedy.
TEST_F(SpeculativeMtpTest, SamplingIsReproducible) {
  std::vector<GenerateRequest> reqs = requests();
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].sampling.temperature = 0.7f;
    reqs[i].sampling.top_p = 0.9f;
    reqs[i].sampling.seed = 100 + i;
  }
  std::vector<std::vector<int32_t>> first;
  for (int run = 0; run < 2; ++run) {
    Engine engine(*model_, spec_options(2));
    std::vector<GenerateResult> results = engine.generate(reqs);
    for (size_t i = 0; i < results.size(); ++i) {
      ASSERT_EQ(results[i].output_ids.size(), size_t(kNewTokens));
      if (run == 0) first.push_back(results[i].output_ids);
      else EXPECT_EQ(results[i].output_ids, first[i]) << "prompt " << i;
    }
    EXPECT_EQ(engine.stats().spec.emitted_tokens, int64_t(kPrompts) * (kNewTokens - 1));
  }
}

// The replay of known tokens decides what is verified (so verifies accept several tokens and
// the MTP layer observes several positions at once), while the MTP draft observes every step
// and proposes too: its first guess must be what the MTP layer predicts from the whole sequence
// (Generator::mtp_logits), so its KV and hidden state follow the accepts and rollbacks.
class ShadowMtpDraft : public DraftModel {
 public:
  struct Guess {
    std::vector<int32_t> sequence;  // the request's tokens when it guessed
    int32_t token;
  };
  ShadowMtpDraft(std::unique_ptr<MtpDraft> mtp, std::unique_ptr<ReplayDraft> replay)
      : mtp_(std::move(mtp)), replay_(std::move(replay)) {}
  size_t kv_bytes_per_slot() const override { return mtp_->kv_bytes_per_slot(); }
  void attach(int64_t slots, int rows) override { mtp_->attach(slots, rows); }
  void observe(std::span<const DraftSeq> seqs, const Tensor& hidden, const ReqToTokenTable& table) override {
    mtp_->observe(seqs, hidden, table);
  }
  std::vector<std::vector<int32_t>> propose(std::span<const DraftSeq> seqs, const ReqToTokenTable& table) override {
    const std::vector<std::vector<int32_t>> guesses = mtp_->propose(seqs, table);
    for (size_t i = 0; i < seqs.size(); ++i) {
      EXPECT_EQ(int(guesses[i].size()), seqs[i].count);
      if (!guesses[i].empty()) guesses_.push_back({seqs[i].req->fill_ids(), guesses[i][0]});
    }
    return replay_->propose(seqs, table);
  }
  int64_t forward_passes() const override { return mtp_->forward_passes(); }
  const std::vector<Guess>& guesses() const { return guesses_; }
  const ReplayDraft& replay() const { return *replay_; }

 private:
  std::unique_ptr<MtpDraft> mtp_;
  std::unique_ptr<ReplayDraft> replay_;
  std::vector<Guess> guesses_;
};

TEST_F(SpeculativeMtpTest, MtpStateFollowsMultiTokenAccepts) {
  std::map<std::vector<int32_t>, std::vector<int32_t>> truth;
  for (int i = 0; i < kPrompts; ++i) truth[prompts_[size_t(i)]] = baseline_[size_t(i)];
  auto shadow = std::make_unique<ShadowMtpDraft>(std::make_unique<MtpDraft>(*model_, false),
                                                 std::make_unique<ReplayDraft>(truth, 0.3, 5, model_->config.vocab_size));
  const ShadowMtpDraft* draft = shadow.get();
  EngineOptions o = spec_options(3);
  o.scheduler.chunked_prefill_size = 32;
  Engine engine(*model_, o, {}, std::move(shadow));
  expect_lossless(engine, engine.generate(requests()), "shadow");
  EXPECT_GT(engine.stats().spec.mean_accept_length(), 1.8) << "the replay should make verifies accept several tokens";
  Generator gen(*model_);
  int checked = 0;
  for (const auto& g : draft->guesses()) {
    const Tensor logits = gen.mtp_logits(g.sequence);
    std::vector<float> last = logits.narrow_rows(logits.size(0) - 1, 1).to_vector();
    std::vector<float> sorted = last;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if (sorted[0] - sorted[1] < 1e-4f) continue;  // too close to call across batch shapes
    ++checked;
    EXPECT_EQ(g.token, int32_t(std::max_element(last.begin(), last.end()) - last.begin()))
        << "after " << g.sequence.size() << " tokens";
  }
  EXPECT_GE(checked, int(draft->guesses().size()) * 9 / 10);
  EXPECT_GT(checked, 20);
}

TEST(SpeculativeOptions, RefusesWhatIsNotSupported) {
  auto model = load_model(test::fixture_dir("deepseek-v3-tiny"));
  auto refused = [&](SpeculativeOptions spec, const std::string& needle) {
    EngineOptions o;
    o.max_total_tokens = 1024;
    o.speculative = spec;
    try {
      Engine engine(*model, o);
      ADD_FAILURE() << "accepted, expected an error with \"" << needle << "\"";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused({"MEDUSA", 3, 1, 0}, "--speculative-algorithm");
  refused({"EAGLE", 3, 2, 0}, "--speculative-eagle-topk");
  refused({"EAGLE", 3, 1, 5}, "--speculative-num-draft-tokens");
  refused({"NEXTN", 0, 1, 0}, "--speculative-num-steps");
  auto fp8 = load_model(test::fixture_dir("deepseek-v3-fp8-tiny"));  // num_nextn_predict_layers 0
  EngineOptions o;
  o.max_total_tokens = 1024;
  o.speculative.algorithm = "NEXTN";
  EXPECT_THROW(Engine(*fp8, o), Error);
  o.speculative.num_draft_tokens = 4;  // steps + 1, as SGLang sets it
  EXPECT_NO_THROW(Engine(*model, o));
}

// `moeserve generate` of 12 greedy tokens after a fixed prompt: its output ids.
std::vector<int> generate_ids(const std::string& dir, const std::string& extra, std::string& output) {
  const std::string cmd = test::moeserve_bin() + " generate --model-path " + dir +
                          " --ids 3,17,99,5 --max-new-tokens 12 --ignore-eos --max-total-tokens 512 " + extra;
  EXPECT_EQ(test::run_command(cmd, output), 0) << output;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') return nlohmann::json::parse(line).at("output_ids").get<std::vector<int>>();
  ADD_FAILURE() << "no result line in: " << output;
  return {};
}

TEST(SpeculativeCli, GenerateReportsAcceptLengthAndMatchesPlain) {
  const std::string dir = test::fixture_dir("deepseek-v3-tiny");
  auto run = [&](const std::string& extra, std::string& output) { return generate_ids(dir, extra, output); };
  std::string plain_out, spec_out;
  const std::vector<int> plain = run("", plain_out);
  const std::vector<int> spec = run(
      "--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 "
      "--speculative-num-draft-tokens 4",
      spec_out);
  EXPECT_EQ(plain.size(), 12u);
  EXPECT_EQ(spec, plain);
  EXPECT_NE(spec_out.find("speculative: "), std::string::npos) << spec_out;
  EXPECT_NE(spec_out.find("accept_length="), std::string::npos) << spec_out;
  EXPECT_NE(spec_out.find("draft_overhead="), std::string::npos) << spec_out;
  EXPECT_EQ(plain_out.find("speculative: "), std::string::npos) << plain_out;
  std::string bad;
  EXPECT_NE(test::run_command(test::moeserve_bin() + " generate --model-path " + dir +
                                  " --ids 3 --speculative-algorithm NEXTN --speculative-eagle-topk 4",
                              bad),
            0);
  EXPECT_NE(bad.find("--speculative-eagle-topk"), std::string::npos) << bad;
}

// DeepSeek's FP8 checkpoints store the MTP layer in FP8 blocks too (eh_proj, its attention and
// experts), and its shared expert is where TP sharding of FP8 blocks breaks first (SGLang broke
// there twice). A random FP8 checkpoint with an MTP layer drafts losslessly on one rank and over
// ranks with shared-experts fusion (the default); without fusion the load is refused naming the
// shared experts of layer 1 and of the MTP layer, and the fix.
TEST(SpeculativeCli, Fp8MtpLayerLoadsUnderFusionAndOverRanks) {
  const std::string dir = test::temp_dir() + "/fp8-mtp";
  std::string out;
  ASSERT_EQ(test::run_command(test::moeserve_bin() +
                                  " make-random-model --shape deepseek-v3 --fp8 --layers 2 --set hidden_size=256 "
                                  "--set intermediate_size=512 --set moe_intermediate_size=128 --set n_routed_experts=8 "
                                  "--set num_experts_per_tok=2 --set n_group=2 --set topk_group=1 --set num_attention_heads=4 "
                                  "--set num_key_value_heads=4 --set q_lora_rank=128 --set kv_lora_rank=128 "
                                  "--set qk_nope_head_dim=32 --set qk_rope_head_dim=64 --set v_head_dim=32 "
                                  "--set vocab_size=512 " + dir,
                              out),
            0)
      << out;
  ASSERT_NE(out.find("(2 layers"), std::string::npos) << out;
  const std::string ranks = "--tp 2 --dp 2 --enable-dp-attention --ep-size 2 ";
  const std::vector<int> plain = generate_ids(dir, "", out);
  ASSERT_EQ(plain.size(), 12u) << out;
  for (const std::string& where : {std::string(), ranks})
    for (int steps : {1, 3}) {
      const std::vector<int> spec =
          generate_ids(dir, where + "--speculative-algorithm NEXTN --speculative-num-steps " + std::to_string(steps), out);
      EXPECT_EQ(spec, plain) << where << steps << " steps: " << out;
      EXPECT_NE(out.find("draft_forwards="), std::string::npos) << out;
    }
  EXPECT_NE(test::run_command(test::moeserve_bin() + " generate --model-path " + dir + " --ids 3 " + ranks +
                                  "--disable-shared-experts-fusion --speculative-algorithm NEXTN",
                              out),
            0);
  EXPECT_NE(out.find("shared_experts.gate_proj"), std::string::npos) << out;
  EXPECT_NE(out.find("[2 weights]"), std::string::npos) << "layer 1's and the MTP layer's: " << out;
  EXPECT_NE(out.find("fix: shared-experts fusion"), std::string::npos) << out;
}

// bench-speculative: with every draft right, each verify of 3 drafts emits 4 tokens, so the
// 8 tokens after the prefill take 2 target forwards instead of 8; with every draft wrong, 8.
TEST(SpeculativeCli, BenchSpeculativeCountsForwards) {
  std::string output;
  const std::string cmd = test::moeserve_bin() + " bench-speculative --model-path " +
                          test::fixture_dir("deepseek-v3-tiny") +
                          " --batch-size 2 --input-len 5 --output-len 9 --speculative-num-steps 3 --error-rates 0,1 --mtp";
  ASSERT_EQ(test::run_command(cmd, output), 0) << output;
  std::vector<nlohmann::json> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 4u) << output;
  EXPECT_EQ(lines[0].at("draft"), "none");
  EXPECT_EQ(lines[0].at("decode_batches"), 8);
  EXPECT_EQ(lines[1].at("error_rate"), 0.0);
  EXPECT_EQ(lines[1].at("decode_batches"), 2);
  EXPECT_DOUBLE_EQ(lines[1].at("accept_length").get<double>(), 4.0);
  EXPECT_EQ(lines[2].at("decode_batches"), 8);
  EXPECT_DOUBLE_EQ(lines[2].at("accept_length").get<double>(), 1.0);
  EXPECT_EQ(lines[3].at("draft"), "mtp");
  EXPECT_GT(lines[3].at("decode_tokens_per_s").get<double>(), 0.0);
}

}  // namespace
}  // namespace ms
