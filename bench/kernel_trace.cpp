// Every kernel's start and end on the GPU, kernels replayed from CUDA graphs included, which the
// engine's own --trace-ops cannot see (it brackets ops with events, so it times eager steps only,
// and the events stop the kernels from overlapping as they do in a graph). A CUPTI injection
// library: the CUDA driver loads it at cuInit when CUDA_INJECTION64_PATH names it, so any program
// is traced unchanged:
//   CUDA_INJECTION64_PATH=build/libms_kernel_trace.so MS_KERNEL_TRACE=trace.tsv moeserve bench-one-batch ...
// One line a kernel, in the order CUPTI hands them over: start and end (ns, GPU clock), the graph
// and graph node that launched it (0 when launched directly), grid, block, dynamic + static shared
// memory, registers a thread, and the kernel's name without its return type and parameter list.
// Copies and memsets come as lines too ("[memcpy HtoD 16384 bytes]", no grid): in a graph they are
// nodes between kernels, which a kernel launched early cannot overlap.
// bench/kernel_trace_summary.py turns the lines into per-step timelines.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace {

std::mutex g_mu;
FILE* g_out = nullptr;
constexpr size_t kBufferBytes = size_t(8) << 20;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "kernel_trace: %s failed: %s\n", what, msg ? msg : "?");
}

// The demangled name without its return type and parameter list (template arguments kept: they
// tell variants apart). The parameter list is the parenthesis that closes the name, found from the
// end: "(anonymous namespace)" earlier in the name is not it.
std::string short_name(const char* mangled) {
  if (!mangled) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  if (!s.empty() && s.back() == ')') {
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')') ++depth;
      else if (s[i] == '(' && --depth == 0) {
        s.resize(i);
        break;
      }
    }
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  return s;
}

const char* copy_kind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    default: return "other";
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mu);
  CUpti_Activity* rec = nullptr;
  while (g_out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      std::fprintf(g_out, "%llu\t%llu\t%u\t%llu\t-\t-\t-\t0\t[memcpy %s %llu bytes]\n", (unsigned long long)m->start,
                   (unsigned long long)m->end, m->graphId, (unsigned long long)m->graphNodeId,
                   copy_kind(m->copyKind), (unsigned long long)m->bytes);
      continue;
    }
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      std::fprintf(g_out, "%llu\t%llu\t%u\t%llu\t-\t-\t-\t0\t[memset %llu bytes]\n", (unsigned long long)m->start,
                   (unsigned long long)m->end, m->graphId, (unsigned long long)m->graphNodeId,
                   (unsigned long long)m->bytes);
      continue;
    }
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    std::fprintf(g_out, "%llu\t%llu\t%u\t%llu\t%d,%d,%d\t%d,%d,%d\t%d+%d\t%u\t%s\n", (unsigned long long)k->start,
                 (unsigned long long)k->end, k->graphId, (unsigned long long)k->graphNodeId, k->gridX, k->gridY,
                 k->gridZ, k->blockX, k->blockY, k->blockZ, k->dynamicSharedMemory, k->staticSharedMemory,
                 unsigned(k->registersPerThread), short_name(k->name).c_str());
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  if (dropped && g_out) std::fprintf(g_out, "# %zu records dropped\n", dropped);
  std::free(buffer);
}

void at_exit() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_out) std::fclose(g_out), g_out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection(void) {
  const char* path = std::getenv("MS_KERNEL_TRACE");
  g_out = std::fopen(path && *path ? path : "kernel_trace.tsv", "w");
  if (!g_out) {
    std::perror("kernel_trace: cannot open the output");
    return 0;
  }
  std::fprintf(g_out, "# start_ns\tend_ns\tgraph\tnode\tgrid\tblock\tsmem (dynamic+static)\tregs\tkernel\n");
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(kernels)");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "cuptiActivityEnable(memcpy)");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "cuptiActivityEnable(memset)");
  std::atexit(at_exit);
  return 1;
}
