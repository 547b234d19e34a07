// The engine on the GPU with CUDA graphs against the engine without them: greedy generation on
// every fixture (decode steps replayed, greedy ids picked on the device), and speculative
// decoding with the MTP draft's chain steps replayed. Ids are compared up to the first step
// whose margin between the top two logits of the op-by-op run is below 5e-2 (bf16 cannot
// resolve smaller ones; the graph's attention splits its keys differently), as the fixture
// tests do. Also: the GPU argmax against the host's, ties included, and the copy kernel that
// moves a step's ids and metadata between the device and mapped host memory.
#include <algorithm>

#include "cuda_test_util.h"
#include "io/safetensors.h"
#include "kernels/cuda/cuda_common.h"
#include "runtime/engine.h"
#include "runtime/spec_mtp_draft.h"

namespace ms {
namespace {
using namespace test;

constexpr float kMarginBf16 = 5e-2f;
constexpr int kNewTokens = 16;

TEST(CudaArgmax, MatchesHostArgmaxWithTiesToTheLowerIndex) {
  MS_REQUIRE_CUDA();
  for (DType dtype : {DType::BF16, DType::F32}) {
    // Long rows are cut into chunks reduced by separate blocks (more chunks the fewer the rows),
    // so ties are planted across chunk boundaries whatever the chunk length.
    for (int64_t vocab : {int64_t(7), int64_t(1000), int64_t(129280), int64_t(151936)}) {
      Tensor host = randn({5, vocab}, 3.0f);
      float* row0 = host.data<float>();  // the maximum every 997 elements of the last half
      for (int64_t j = vocab / 2; j < vocab; j += 997) row0[j] = 50.0f;
      float* row2 = host.data<float>() + 2 * vocab;  // a tie: the lower index must win
      row2[vocab / 3] = row2[vocab - 1] = 100.0f;
      float* row3 = host.data<float>() + 3 * vocab;  // all equal
      std::fill(row3, row3 + vocab, -1.0f);
      float* row4 = host.data<float>() + 4 * vocab;  // the last half all equal to the maximum
      std::fill(row4 + vocab / 2, row4 + vocab, 20.0f);
      Tensor dev = gpu(host, dtype);
      const auto whole = ops::argmax_rows(host);
      EXPECT_EQ(ops::argmax_rows(dev), whole) << dtype_name(dtype) << " vocab " << vocab;
      EXPECT_EQ(whole[2], int32_t(vocab / 3));
      EXPECT_EQ(whole[3], 0);
      EXPECT_EQ(whole[4], int32_t(vocab / 2));
      // Rows [1, 4) of the device tensor: a view whose first row is not the buffer's.
      const auto part = ops::argmax_rows(dev.narrow_rows(1, 3));
      EXPECT_EQ(part, std::vector<int32_t>(whole.begin() + 1, whole.begin() + 4));
      // One row at a time: batch-1 decode, the most chunks a row.
      for (int64_t r = 0; r < 5; ++r)
        EXPECT_EQ(ops::argmax_rows(dev.narrow_rows(r, 1))[0], whole[size_t(r)])
            << dtype_name(dtype) << " vocab " << vocab << " row " << r;
    }
  }
}

// The pieces of overlap scheduling: the argmax left on the device, its ids read back later, and
// an embedding whose placeholders read them.
TEST(CudaOverlap, ArgmaxIdsFeedTheNextEmbeddingOnTheDevice) {
  MS_REQUIRE_CUDA();
  const Tensor logits = gpu(randn({3, 1000}, 2.0f), DType::BF16);
  const std::vector<int32_t> want = ops::argmax_rows(logits);
  Tensor ids = Tensor::empty(DType::I32, {4}, Device::CUDA);
  Tensor first = ids.narrow_rows(0, 3);
  ops::argmax_rows_into(logits, first);
  auto readback = ops::make_host_readback(Device::CUDA, 4);
  readback->start(first);
  Tensor table = randn({1000, 64}, 1.0f);
  Tensor out = Tensor::empty(DType::BF16, {4, 64}, Device::CUDA);
  const std::vector<int32_t> tokens = {-3, 5, -1, -2};
  ops::embedding(gpu(table, DType::BF16), tokens, out, &ids);
  const std::span<const int32_t> back = readback->wait();
  ASSERT_EQ(back.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(back[size_t(r)], want[size_t(r)]) << "row " << r;
  const std::vector<float> got = out.to_vector(), rows = gpu(table, DType::BF16).to_vector();
  const int32_t source[4] = {want[2], 5, want[0], want[1]};
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < 64; ++i)
      ASSERT_EQ(got[size_t(t * 64 + i)], rows[size_t(source[t] * 64 + i)]) << "token " << t << " dim " << i;
}

// cuda::copy_words, as the graphs' upload and the readback use it: words from mapped host memory to
// the device and back, at 16-byte-aligned starts (the vector loop and its tail) and at a start one
// word in (the word loop alone), the words around the copied range untouched.
TEST(CudaOverlap, CopyWordsMovesWordsToAndFromMappedHostMemory) {
  MS_REQUIRE_CUDA();
  constexpr int64_t kMax = 70001, kRoom = kMax + 8;
  auto* in = static_cast<int32_t*>(cuda::alloc_mapped(kRoom * 4));
  auto* out = static_cast<int32_t*>(cuda::alloc_mapped(kRoom * 4));
  auto* in_dev = static_cast<int32_t*>(cuda::mapped_device_ptr(in));
  auto* out_dev = static_cast<int32_t*>(cuda::mapped_device_ptr(out));
  Tensor dev = Tensor::empty(DType::I32, {kRoom}, Device::CUDA);
  for (const int64_t n : {int64_t(1), int64_t(3), int64_t(4), int64_t(5), int64_t(4099), kMax})
    for (const int64_t at : {int64_t(0), int64_t(1)}) {
      for (int64_t i = 0; i < kRoom; ++i) in[i] = int32_t(i * 7 + n), out[i] = -1;
      cuda::copy_words(in_dev + at, dev.data<int32_t>() + at, n);
      cuda::copy_words(dev.data<int32_t>() + at, out_dev + at, n);
      ASSERT_EQ(cudaStreamSynchronize(cuda::stream()), cudaSuccess);
      for (int64_t i = 0; i < kRoom; ++i) {
        const int32_t want = i >= at && i < at + n ? int32_t(i * 7 + n) : -1;
        ASSERT_EQ(out[i], want) << n << " words at " << at << ": word " << i;
      }
    }
  cudaFreeHost(in);
  cudaFreeHost(out);
}

// copy_word_ranges (a captured step's upload: the per-token words, then the kv slots from the
// first that changed) copies exactly the words of its two ranges, empty ones included, from
// mapped host memory to the device.
TEST(CudaOverlap, CopyWordRangesMovesOnlyItsRanges) {
  MS_REQUIRE_CUDA();
  constexpr int64_t kRoom = 70010;
  auto* in = static_cast<int32_t*>(cuda::alloc_mapped(kRoom * 4));
  auto* out = static_cast<int32_t*>(cuda::alloc_mapped(kRoom * 4));
  auto* in_dev = static_cast<int32_t*>(cuda::mapped_device_ptr(in));
  auto* out_dev = static_cast<int32_t*>(cuda::mapped_device_ptr(out));
  Tensor dev = Tensor::empty(DType::I32, {kRoom}, Device::CUDA);
  using R = cuda::WordRange;
  for (const auto& [a, b] : std::vector<std::pair<R, R>>{
           {{0, 5}, {100, 3}}, {{0, 0}, {7, 1}}, {{0, 5}, {5, 0}}, {{0, 70001}, {70001, 0}}, {{3, 4}, {9, 4099}}}) {
    for (int64_t i = 0; i < kRoom; ++i) in[i] = int32_t(i * 7 + 1), out[i] = -1;
    cuda::copy_words(out_dev, dev.data<int32_t>(), kRoom);
    cuda::copy_word_ranges(in_dev, dev.data<int32_t>(), a, b);
    cuda::copy_words(dev.data<int32_t>(), out_dev, kRoom);
    ASSERT_EQ(cudaStreamSynchronize(cuda::stream()), cudaSuccess);
    for (int64_t i = 0; i < kRoom; ++i) {
      const bool in_range = (i >= a.at && i < a.at + a.n) || (i >= b.at && i < b.at + b.n);
      ASSERT_EQ(out[i], in_range ? int32_t(i * 7 + 1) : -1)
          << "ranges " << a.at << "+" << a.n << ", " << b.at << "+" << b.n << ": word " << i;
    }
  }
  cudaFreeHost(in);
  cudaFreeHost(out);
}

std::unique_ptr<CausalLM> load_gpu(const std::string& fixture) {
  LoadOptions o;
  o.device = Device::CUDA;
  o.act_dtype = DType::BF16;
  return load_model(fixture_dir(fixture), o);
}

// Three of the fixture's reference prompts, greedy; with logprobs of the top two tokens when
// the margins are wanted (that run samples on the host).
std::vector<GenerateRequest> requests(const std::string& fixture, bool margins) {
  auto ref = WeightStore::open_file(fixture_dir(fixture) + "/reference.safetensors");
  std::vector<GenerateRequest> out;
  for (int i = 0; i < 3; ++i) {
    GenerateRequest g;
    g.input_ids = to_ids(ref.get("prompt." + std::to_string(i) + ".input_ids"));
    g.sampling.temperature = 0.0f;
    g.sampling.max_new_tokens = kNewTokens;
    g.sampling.ignore_eos = true;
    g.sampling.top_logprobs_num = margins ? 2 : 0;
    out.push_back(g);
  }
  return out;
}

EngineOptions engine_options(bool graphs) {
  EngineOptions o;
  o.max_total_tokens = 2048;
  o.scheduler.max_running_requests = 8;
  o.cuda_graph.disable = !graphs;
  o.cuda_graph.max_bs = 8;
  return o;
}

// Compares `got` with `want` up to the first step whose margin in `want` is below bf16's
// resolution; returns the steps compared.
int compare_up_to_margin(const std::vector<GenerateResult>& got, const std::vector<GenerateResult>& want,
                         const std::string& what) {
  int compared = 0;
  for (size_t r = 0; r < want.size(); ++r) {
    const auto& w = want[r];
    EXPECT_EQ(got[r].output_ids.size(), w.output_ids.size()) << what << " request " << r;
    for (size_t s = 0; s < w.output_ids.size() && s < got[r].output_ids.size(); ++s) {
      const auto& top = w.logprobs.at(s).top;
      if (top.size() < 2 || top[0].logprob - top[1].logprob < kMarginBf16) break;
      EXPECT_EQ(got[r].output_ids[s], w.output_ids[s]) << what << " request " << r << " step " << s;
      if (got[r].output_ids[s] != w.output_ids[s]) break;  // the rest follows another context
      ++compared;
    }
  }
  return compared;
}

class CudaEngineGraphTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaEngineGraphTest, GreedyGenerateWithGraphsEqualsOpByOp) {
  MS_REQUIRE_CUDA();
  auto model = load_gpu(GetParam());
  Engine eager(*model, engine_options(false));
  const std::vector<GenerateResult> want = eager.generate(requests(GetParam(), true));
  Engine graphs(*model, engine_options(true));
  const std::vector<GenerateResult> got = graphs.generate(requests(GetParam(), false));
  const int compared = compare_up_to_margin(got, want, GetParam());
  EXPECT_GT(compared, 0) << "no step was resolvable";
  // Three requests decode together (padded to a graph of 4): every decode step is a replay.
  const EngineStats stats = graphs.stats();
  EXPECT_GT(stats.cuda_graph_replays, 0);
  EXPECT_EQ(stats.cuda_graph_replays, stats.scheduler.decode_batches);
  EXPECT_EQ(eager.stats().cuda_graph_replays, 0);
  std::printf("[ graphs ] %s: %d greedy steps compared\n", GetParam().c_str(), compared);
}

// Overlap scheduling: each decode step is issued before the previous step's ids reach the host,
// and its graph reads them as placeholders on the device. The same batches run as one step at a
// time (a request that ends by length is left out of the step after its last one either way),
// so the ids are equal.
TEST_P(CudaEngineGraphTest, OverlapGivesTheIdsOfOneStepAtATime) {
  MS_REQUIRE_CUDA();
  auto model = load_gpu(GetParam());
  std::vector<GenerateRequest> reqs = requests(GetParam(), false);
  reqs[1].sampling.max_new_tokens = 5;  // the batch shrinks mid-run
  EngineOptions one_o = engine_options(true);
  one_o.disable_overlap_schedule = true;
  Engine one(*model, one_o), overlap(*model, engine_options(true));
  const std::vector<GenerateResult> want = one.generate(reqs), got = overlap.generate(reqs);
  for (size_t r = 0; r < reqs.size(); ++r) EXPECT_EQ(got[r].output_ids, want[r].output_ids) << "request " << r;
  EXPECT_EQ(one.stats().overlapped_steps, 0);
  EXPECT_GE(overlap.stats().overlapped_steps, kNewTokens);  // the prefill and every decode step
  EXPECT_EQ(overlap.stats().cuda_graph_replays, one.stats().cuda_graph_replays);
  EXPECT_GT(overlap.stats().cuda_graph_replays, 0);
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, CudaEngineGraphTest, ::testing::ValuesIn(test::all_fixtures()),
                         test::FixtureName());

using Proposals = std::vector<std::vector<std::vector<int32_t>>>;

// The MTP draft, recording every proposal it makes into `sink`.
class RecordingMtp : public MtpDraft {
 public:
  RecordingMtp(const CausalLM& model, CudaGraphSettings graphs, Proposals* sink)
      : MtpDraft(model, false, graphs), sink_(sink) {}
  std::vector<std::vector<int32_t>> propose(std::span<const DraftSeq> seqs, const ReqToTokenTable& table) override {
    auto out = MtpDraft::propose(seqs, table);
    sink_->push_back(out);
    return out;
  }

 private:
  Proposals* sink_;
};

// Speculative decoding with graphs (the target's verify steps and the MTP draft's chain steps
// replayed) gives the plain engine's greedy ids, for 1 to 4 draft steps; its drafts are the
// op-by-op draft's.
TEST(CudaSpeculativeGraphs, MtpDraftUnderGraphsIsLosslessAndDraftsAsOpByOp) {
  MS_REQUIRE_CUDA();
  const std::string fixture = "deepseek-v3-tiny";
  auto model = load_gpu(fixture);
  Engine plain(*model, engine_options(false));
  const std::vector<GenerateResult> want = plain.generate(requests(fixture, true));
  for (int steps : {1, 2, 3, 4}) {
    Proposals proposals[2];
    for (bool graphs : {false, true}) {
      EngineOptions o = engine_options(graphs);
      o.speculative.algorithm = "NEXTN";
      o.speculative.num_steps = steps;
      auto owned = std::make_unique<RecordingMtp>(*model, o.cuda_graph, &proposals[graphs]);
      const RecordingMtp* draft = owned.get();
      Engine engine(*model, o, Detokenizer{}, std::move(owned));
      const std::vector<GenerateResult> got = engine.generate(requests(fixture, false));
      const std::string what = fixture + " steps=" + std::to_string(steps) + (graphs ? " graphs" : " op by op");
      EXPECT_GT(compare_up_to_margin(got, want, what), 0) << what;
      if (graphs) {
        EXPECT_GT(engine.stats().cuda_graph_replays - draft->graph_replays(), 0) << what << ": no verify replayed";
        if (steps > 1) {
          EXPECT_GT(draft->graph_replays(), 0) << what;
        }
      } else {
        EXPECT_EQ(engine.stats().cuda_graph_replays, 0) << what;
        EXPECT_EQ(draft->graph_replays(), 0) << what;
      }
    }
    // Drafts beyond the first come from chain steps (replayed or not); while both runs decode
    // the same tokens their proposals must agree but for near-ties of the MTP head.
    int same = 0, total = 0;
    const Proposals &a = proposals[0], &b = proposals[1];
    for (size_t c = 0; c < std::min(a.size(), b.size()) && a[c].size() == b[c].size(); ++c)
      for (size_t r = 0; r < a[c].size() && a[c][r].size() == b[c][r].size(); ++r)
        for (size_t j = 1; j < a[c][r].size(); ++j) same += a[c][r][j] == b[c][r][j], ++total;
    if (steps > 1) {
      EXPECT_GT(total, 0);
      EXPECT_GE(same * 10, total * 9) << same << " of " << total << " chain drafts agree";
    }
    std::printf("[ graphs ] speculative steps=%d: %d of %d chain drafts agree\n", steps, same, total);
  }
}

}  // namespace
}  // namespace ms
