#include "shardlab/buffer_pool.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

namespace shardlab {
namespace {

constexpr std::size_t kPooledMin = std::size_t{1} << 20;  // below 1 MiB malloc is cheap enough
constexpr std::size_t kAlign = std::size_t{1} << 21;       // 2 MiB: transparent huge pages

struct Pool {
  std::mutex mu;
  std::multimap<std::size_t, void*> free_list;  // size class -> buffers
  std::size_t cached = 0;
  std::size_t capacity = std::size_t{4} << 30;
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: numpy may free buffers during interpreter exit
  return *p;
}

// Large buffers are mapped and unmapped directly, so a buffer the cache lets go returns to
// the system at once (freed through malloc it could stay in the heap, resident).
std::size_t mapped_bytes(std::size_t cls) { return (cls + kAlign - 1) / kAlign * kAlign; }

// "32", "1.5", "4096": GiB as Python's f"{g:.3g}" (whole GiB from 1000 up).
std::string gib(double bytes) {
  const double g = bytes / double(std::size_t{1} << 30);
  char buf[64];
  if (g < 1000) {
    std::snprintf(buf, sizeof buf, "%.3g", g);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f", std::ceil(g));
  }
  return buf;
}

// The system refused a request that check_alloc let through (memory in use by others).
[[noreturn]] void refused(const char* op, std::size_t bytes) {
  throw AllocationError(std::string("[") + op + "] needs " + gib(static_cast<double>(bytes)) +
                        " GiB and the system refused it (this machine has " + gib(physical_memory_bytes()) +
                        " GiB, less of it free); free other arrays (pool_release() returns the cached "
                        "buffers), or use an abstract mesh (make_mesh(..., abstract=True))");
}

void* map_buffer(std::size_t cls, const char* op) {
  void* p = mmap(nullptr, mapped_bytes(cls), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) refused(op, cls);
  madvise(p, mapped_bytes(cls), MADV_HUGEPAGE);
  return p;
}

void unmap_buffer(void* p, std::size_t cls) { munmap(p, mapped_bytes(cls)); }

// Size classes: round up to a multiple of 1/8 of the next power of two (<= 12.5% waste).
std::size_t size_class(std::size_t bytes) {
  std::size_t p = kPooledMin;
  while (p < bytes) p <<= 1;
  const std::size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}

}  // namespace

double physical_memory_bytes() {
  static const double total = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 9.2e18;
  }();
  return total;
}

void check_alloc(const char* op, double bytes, const std::string& hint) {
  const double total = physical_memory_bytes();
  if (bytes > total) {
    throw AllocationError(std::string("[") + op + "] needs " + gib(bytes) + " GiB, more than the " + gib(total) +
                          " GiB this machine has" + (hint.empty() ? "" : "; " + hint));
  }
}

std::size_t checked_bytes(const char* op, const std::vector<std::int64_t>& shape, std::size_t itemsize,
                          const std::string& hint) {
  double bytes = static_cast<double>(itemsize);
  for (const std::int64_t s : shape) bytes *= static_cast<double>(s);
  check_alloc(op, bytes, hint);
  std::size_t exact = itemsize;
  for (const std::int64_t s : shape) exact *= static_cast<std::size_t>(s);
  return exact;
}

void* pool_allocate(std::size_t bytes, const char* op) {
  check_alloc(op, static_cast<double>(bytes));
  if (bytes < kPooledMin) {
    void* p = std::malloc(bytes ? bytes : 1);
    if (!p) refused(op, bytes);
    return p;
  }
  const std::size_t cls = size_class(bytes);
  Pool& pl = pool();
  {
    std::lock_guard<std::mutex> lock(pl.mu);
    auto it = pl.free_list.find(cls);
    if (it != pl.free_list.end()) {
      void* p = it->second;
      pl.free_list.erase(it);
      pl.cached -= cls;
      return p;
    }
  }
  return map_buffer(cls, op);
}

void* aligned_allocate(const char* op, std::size_t align, std::size_t bytes) {
  check_alloc(op, static_cast<double>(bytes));
  const std::size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded ? rounded : align);
  if (!p) refused(op, bytes);
  return p;
}

void pool_free(void* ptr, std::size_t bytes) {
  if (ptr == nullptr) return;
  if (bytes < kPooledMin) {
    std::free(ptr);
    return;
  }
  const std::size_t cls = size_class(bytes);
  Pool& pl = pool();
  {
    std::lock_guard<std::mutex> lock(pl.mu);
    if (pl.cached + cls <= pl.capacity) {
      pl.free_list.emplace(cls, ptr);
      pl.cached += cls;
      return;
    }
  }
  unmap_buffer(ptr, cls);
}

std::size_t pool_cached_bytes() {
  std::lock_guard<std::mutex> lock(pool().mu);
  return pool().cached;
}

std::size_t pool_capacity() {
  std::lock_guard<std::mutex> lock(pool().mu);
  return pool().capacity;
}

void pool_set_capacity(std::size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(pool().mu);
    pool().capacity = bytes;
  }
  if (pool_cached_bytes() > bytes) pool_release();
}

void pool_release() {
  std::multimap<std::size_t, void*> drop;
  {
    std::lock_guard<std::mutex> lock(pool().mu);
    drop.swap(pool().free_list);
    pool().cached = 0;
  }
  for (auto& kv : drop) unmap_buffer(kv.second, kv.first);
}

}  // namespace shardlab
