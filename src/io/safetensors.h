// safetensors: mmapped, zero-copy reading of one file or a sharded checkpoint
// (model.safetensors.index.json), and writing of small files (logits, tests, demo models).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ms {

// One mmapped .safetensors file. Every header entry is validated when the file is opened:
// a truncated file or a header that lies about offsets, dtypes or shapes is refused with the
// file and tensor named.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  Tensor get(const std::string& name) const;  // a view into the mapping
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    DType dtype;
    Shape shape;
    size_t begin, end;  // byte offsets into the data section
  };
  std::string path_;
  std::shared_ptr<Buffer> mapping_;
  size_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: model.safetensors.index.json when present, otherwise
// every *.safetensors file in it. Names are unique across shards.
class WeightStore {
 public:
  static WeightStore open_dir(const std::string& dir);
  static WeightStore open_file(const std::string& path);

  bool has(const std::string& name) const { return where_.count(name) != 0; }
  Tensor get(const std::string& name) const;  // throws naming the tensor when absent
  std::vector<std::string> names() const;
  const std::string& dir() const { return dir_; }
  size_t total_bytes() const;

 private:
  void add_file(std::shared_ptr<SafetensorsFile> file);

  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

// Writes tensors (any dtype, host) to `path` in safetensors format.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace ms
