#include "runtime/radix_cache.h"

#include <algorithm>
#include <queue>

#include "core/check.h"

namespace ms {

RadixCache::RadixCache(SlotAllocator& pool) : pool_(pool), root_(std::make_unique<RadixNode>()) {}

RadixCache::~RadixCache() = default;

static size_t common_prefix(std::span<const int32_t> a, const std::vector<int32_t>& b) {
  size_t n = std::min(a.size(), b.size()), i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// child's edge [0, at) becomes a new node between child and its parent; child keeps the rest.
// The new node inherits child's lock count: every lock on child also covers its ancestors.
RadixNode* RadixCache::split(RadixNode* child, size_t at) {
  MS_ASSERT(at > 0 && at < child->key.size());
  RadixNode* parent = child->parent;
  auto mid = std::make_unique<RadixNode>();
  mid->key.assign(child->key.begin(), child->key.begin() + std::ptrdiff_t(at));
  mid->slots.assign(child->slots.begin(), child->slots.begin() + std::ptrdiff_t(at));
  mid->parent = parent;
  mid->lock_ref = child->lock_ref;
  mid->last_access = child->last_access;
  child->key.erase(child->key.begin(), child->key.begin() + std::ptrdiff_t(at));
  child->slots.erase(child->slots.begin(), child->slots.begin() + std::ptrdiff_t(at));
  auto& slot_in_parent = parent->children.at(mid->key[0]);
  std::unique_ptr<RadixNode> owned_child = std::move(slot_in_parent);
  child->parent = mid.get();
  mid->children.emplace(child->key[0], std::move(owned_child));
  RadixNode* raw = mid.get();
  slot_in_parent = std::move(mid);
  return raw;
}

PrefixMatch RadixCache::match_prefix(std::span<const int32_t> key) {
  PrefixMatch m{{}, root_.get()};
  const uint64_t now = ++clock_;
  RadixNode* node = root_.get();
  size_t pos = 0;
  while (pos < key.size()) {
    auto it = node->children.find(key[pos]);
    if (it == node->children.end()) break;
    RadixNode* child = it->second.get();
    size_t n = common_prefix(key.subspan(pos), child->key);
    if (n < child->key.size()) child = split(child, n);
    child->last_access = now;
    m.slots.insert(m.slots.end(), child->slots.begin(), child->slots.end());
    node = child;
    pos += n;  // a split above leaves no child that continues the key, so the walk ends
  }
  m.last_node = node;
  return m;
}

int RadixCache::insert(std::span<const int32_t> key, std::span<const int32_t> slots) {
  MS_CHECK(key.size() == slots.size(), "radix insert: ", key.size(), " tokens but ", slots.size(), " slots");
  const uint64_t now = ++clock_;
  RadixNode* node = root_.get();
  size_t pos = 0;
  while (pos < key.size()) {
    auto it = node->children.find(key[pos]);
    if (it == node->children.end()) {
      auto leaf = std::make_unique<RadixNode>();
      leaf->key.assign(key.begin() + std::ptrdiff_t(pos), key.end());
      leaf->slots.assign(slots.begin() + std::ptrdiff_t(pos), slots.end());
      leaf->parent = node;
      leaf->last_access = now;
      evictable_ += int64_t(leaf->key.size());
      node->children.emplace(key[pos], std::move(leaf));
      break;
    }
    RadixNode* child = it->second.get();
    size_t n = common_prefix(key.subspan(pos), child->key);
    if (n < child->key.size()) child = split(child, n);
    child->last_access = now;
    node = child;
    pos += n;
  }
  return int(std::min(pos, key.size()));
}

void RadixCache::lock(RadixNode* node) {
  for (; node != root_.get(); node = node->parent) {
    if (node->lock_ref == 0) {
      evictable_ -= int64_t(node->key.size());
      protected_ += int64_t(node->key.size());
    }
    ++node->lock_ref;
  }
}

void RadixCache::unlock(RadixNode* node) {
  for (; node != root_.get(); node = node->parent) {
    MS_ASSERT(node->lock_ref > 0);
    if (node->lock_ref == 1) {
      evictable_ += int64_t(node->key.size());
      protected_ -= int64_t(node->key.size());
    }
    --node->lock_ref;
  }
}

int64_t RadixCache::evict(int64_t num_tokens) {
  auto older = [](const RadixNode* a, const RadixNode* b) { return a->last_access > b->last_access; };
  std::priority_queue<RadixNode*, std::vector<RadixNode*>, decltype(older)> leaves(older);
  std::vector<RadixNode*> stack{root_.get()};
  while (!stack.empty()) {
    RadixNode* n = stack.back();
    stack.pop_back();
    for (auto& [tok, child] : n->children) stack.push_back(child.get());
    if (n != root_.get() && n->children.empty() && n->lock_ref == 0) leaves.push(n);
  }
  int64_t freed = 0;
  while (freed < num_tokens && !leaves.empty()) {
    RadixNode* leaf = leaves.top();
    leaves.pop();
    pool_.free(leaf->slots);
    freed += int64_t(leaf->slots.size());
    evictable_ -= int64_t(leaf->key.size());
    RadixNode* parent = leaf->parent;
    parent->children.erase(leaf->key[0]);  // destroys leaf
    if (parent != root_.get() && parent->children.empty() && parent->lock_ref == 0) leaves.push(parent);
  }
  return freed;
}

void RadixCache::free_subtree(RadixNode* node) {
  for (auto& [tok, child] : node->children) free_subtree(child.get());
  pool_.free(node->slots);
}

void RadixCache::reset() {
  MS_CHECK(protected_ == 0, "radix cache: cannot flush while ", protected_, " cached tokens are in use");
  free_subtree(root_.get());
  root_ = std::make_unique<RadixNode>();
  evictable_ = 0;
}

}  // namespace ms
