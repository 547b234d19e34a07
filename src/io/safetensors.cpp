#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace ms {
namespace fs = std::filesystem;
using json = nlohmann::json;

static std::shared_ptr<Buffer> map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  MS_CHECK(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("cannot stat ", path);
  }
  size_t size = size_t(st.st_size);
  void* p = nullptr;
  if (size > 0) {
    p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    MS_CHECK(p != MAP_FAILED, "cannot mmap ", path, ": ", std::strerror(errno));
  } else {
    ::close(fd);
  }
  auto buf = std::make_shared<Buffer>();
  buf->data = p;
  buf->bytes = size;
  buf->keep_alive = std::shared_ptr<void>(p, [size](void* q) { if (q) ::munmap(q, size); });
  return buf;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), mapping_(map_file(path)) {
  const auto* bytes = static_cast<const uint8_t*>(mapping_->data);
  size_t size = mapping_->bytes;
  MS_CHECK(size >= 8, path, ": truncated safetensors file (", size, " bytes, no header length)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  MS_CHECK(header_len <= size - 8, path, ": header length ", header_len, " exceeds the file size ", size);
  data_start_ = 8 + header_len;
  json header;
  try {
    header = json::parse(bytes + 8, bytes + data_start_);
  } catch (const json::exception& e) {
    fail(path, ": header is not valid JSON (", e.what(), ")");
  }
  MS_CHECK(header.is_object(), path, ": header is not a JSON object");
  size_t data_size = size - data_start_;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (info.is_object())
        for (auto& [k, v] : info.items())
          if (v.is_string()) metadata_[k] = v.get<std::string>();
      continue;
    }
    auto where = [&] { return path + ": tensor " + name; };
    MS_CHECK(info.is_object() && info.contains("dtype") && info.contains("shape") && info.contains("data_offsets"),
             where(), ": entry needs dtype, shape and data_offsets");
    Entry e;
    try {
      e.dtype = dtype_from_name(info["dtype"].get<std::string>());
    } catch (const std::exception& ex) {
      fail(where(), ": ", ex.what());
    }
    MS_CHECK(info["shape"].is_array(), where(), ": shape is not a list");
    uint64_t n = 1;
    for (auto& d : info["shape"]) {
      MS_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0, where(), ": bad dimension ", d.dump());
      e.shape.push_back(d.get<int64_t>());
      n *= uint64_t(e.shape.back());
    }
    auto& off = info["data_offsets"];
    MS_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
             where(), ": data_offsets must be two non-negative integers");
    e.begin = off[0].get<size_t>();
    e.end = off[1].get<size_t>();
    MS_CHECK(e.begin <= e.end && e.end <= data_size, where(), ": data_offsets [", e.begin, ", ", e.end,
             "] fall outside the ", data_size, "-byte data section (truncated file?)");
    MS_CHECK(e.end - e.begin == n * dtype_size(e.dtype), where(), ": ", e.end - e.begin, " bytes for ",
             dtype_name(e.dtype), shape_str(e.shape), ", which needs ", n * dtype_size(e.dtype));
    entries_.emplace(name, std::move(e));
  }
}

Tensor SafetensorsFile::get(const std::string& name) const {
  auto it = entries_.find(name);
  MS_CHECK(it != entries_.end(), path_, ": no tensor named ", name);
  const Entry& e = it->second;
  return Tensor::from_buffer(mapping_, data_start_ + e.begin, e.dtype, e.shape);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (auto& [k, v] : entries_) out.push_back(k);
  return out;
}

void WeightStore::add_file(std::shared_ptr<SafetensorsFile> file) {
  for (auto& name : file->names()) {
    auto [it, fresh] = where_.emplace(name, file.get());
    MS_CHECK(fresh, "tensor ", name, " appears in both ", it->second->path(), " and ", file->path());
  }
  files_.push_back(std::move(file));
}

WeightStore WeightStore::open_file(const std::string& path) {
  WeightStore s;
  s.dir_ = fs::path(path).parent_path().string();
  s.add_file(std::make_shared<SafetensorsFile>(path));
  return s;
}

WeightStore WeightStore::open_dir(const std::string& dir) {
  WeightStore s;
  s.dir_ = dir;
  MS_CHECK(fs::is_directory(dir), "model path ", dir, " is not a directory");
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    json j;
    try {
      std::ifstream in(index);
      j = json::parse(in);
    } catch (const json::exception& e) {
      fail(index.string(), ": not valid JSON (", e.what(), ")");
    }
    MS_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), index.string(), ": no weight_map object");
    std::map<std::string, std::vector<std::string>> by_file;
    for (auto& [name, file] : j["weight_map"].items()) {
      MS_CHECK(file.is_string(), index.string(), ": weight_map entry ", name, " is not a file name");
      by_file[file.get<std::string>()].push_back(name);
    }
    for (auto& [file, names] : by_file) {
      fs::path p = fs::path(dir) / file;
      MS_CHECK(fs::exists(p), "shard ", p.string(), " listed in ", index.filename().string(), " is missing");
      auto f = std::make_shared<SafetensorsFile>(p.string());
      for (auto& name : names)
        MS_CHECK(f->has(name), index.filename().string(), " puts tensor ", name, " in ", file,
                 ", which does not hold it");
      s.add_file(std::move(f));
    }
    return s;
  }
  std::vector<fs::path> files;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors" && e.path().filename() != "reference.safetensors")
      files.push_back(e.path());
  MS_CHECK(!files.empty(), "no *.safetensors files in ", dir);
  std::sort(files.begin(), files.end());
  for (auto& p : files) s.add_file(std::make_shared<SafetensorsFile>(p.string()));
  return s;
}

Tensor WeightStore::get(const std::string& name) const {
  auto it = where_.find(name);
  MS_CHECK(it != where_.end(), "checkpoint in ", dir_, " has no tensor ", name);
  return it->second->get(name);
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  for (auto& [k, v] : where_) out.push_back(k);
  return out;
}

size_t WeightStore::total_bytes() const {
  size_t n = 0;
  for (auto& [name, file] : where_) n += file->get(name).nbytes();
  return n;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (auto& [name, t] : tensors) {
    header[name] = {{"dtype", std::string(dtype_name(t.dtype()))},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h.push_back(' ');
  std::ofstream out(path, std::ios::binary);
  MS_CHECK(out, "cannot write ", path);
  uint64_t len = h.size();
  char lenbuf[8];
  for (int i = 0; i < 8; ++i) lenbuf[i] = char((len >> (8 * i)) & 0xff);
  out.write(lenbuf, 8);
  out.write(h.data(), std::streamsize(h.size()));
  for (auto& [name, t] : tensors) {
    Tensor c = t.is_contiguous() ? t : t.clone();
    out.write(static_cast<const char*>(c.raw()), std::streamsize(c.nbytes()));
  }
  MS_CHECK(out.good(), "failed writing ", path);
}

}  // namespace ms
