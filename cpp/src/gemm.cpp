// GEMM driver: ISA dispatch, the GotoBLAS loop nest around the packed micro-kernels, work
// splitting across the thread pool (thread_pool.hpp), and the naive reference.
#include "shardlab/gemm.hpp"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>

#include "kernels/dispatch.hpp"
#include "kernels/gemm_microkernel.hpp"
#include "shardlab/buffer_pool.hpp"
#include "shardlab/cpu_features.hpp"
#include "shardlab/thread_pool.hpp"

namespace shardlab {
namespace gemm_detail {
namespace {

// The baseline path: plain loops the compiler may vectorize with SSE2 only.
constexpr int kScalarMr = 4;
constexpr int kScalarNr = 8;

void kernel_scalar(int64_t kc, const void* a_, const void* b_, float* c, int64_t ldc,
                   bool accumulate) {
  const float* a = static_cast<const float*>(a_);
  const float* b = static_cast<const float*>(b_);
  float acc[kScalarMr][kScalarNr] = {};
  for (int64_t k = 0; k < kc; ++k) {
    for (int r = 0; r < kScalarMr; ++r)
      for (int j = 0; j < kScalarNr; ++j) acc[r][j] += a[r] * b[j];
    a += kScalarMr;
    b += kScalarNr;
  }
  for (int r = 0; r < kScalarMr; ++r)
    for (int j = 0; j < kScalarNr; ++j)
      c[r * ldc + j] = accumulate ? c[r * ldc + j] + acc[r][j] : acc[r][j];
}

}  // namespace

}  // namespace gemm_detail

namespace kernels::scalar {

using namespace gemm_detail;

KernelSet gemm_kernels(DType type) {
  KernelSet ks;
  ks.mr = kScalarMr;
  ks.nr = kScalarNr;
  ks.mc = 128;
  ks.kc = 256;
  ks.nc = 2048;
  ks.kernel = kernel_scalar;
  set_f32_packers<kScalarMr, kScalarNr>(ks, type);
  return ks;
}

}  // namespace kernels::scalar

namespace {

using gemm_detail::KernelSet;

KernelSet select_kernels(DType type) { return SHARDLAB_KERNEL(gemm_kernels)(type); }

// Per-thread packing buffers, kept between calls so many small batched GEMMs do not allocate.
class PackBuffer {
 public:
  void* get(size_t bytes) {
    if (bytes > capacity_) {
      const size_t want = (bytes + 4095) / 4096 * 4096;
      data_.reset();
      capacity_ = 0;
      data_.reset(static_cast<char*>(aligned_allocate("gemm", 64, want)));
      capacity_ = want;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> data_;
  size_t capacity_ = 0;
};

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// One C block (m x n) = A block (m x k) @ B block (k x n) on one thread: the five loops of
// GotoBLAS. B panels (kc x nc) are packed once per (jc, pc) and reused for every A block;
// each A block (mc x kc) is reused for every nr-wide micro-panel of B.
void gemm_block(const KernelSet& ks, const GemmOperand& a, const GemmOperand& b, float* c,
                int64_t ldc) {
  static thread_local PackBuffer a_buf, b_buf;
  const int64_t m = a.rows, n = b.cols, k = a.cols;
  const int mr = ks.mr, nr = ks.nr;
  const int64_t kc_max = std::min(ks.kc, round_up(k, ks.kpack));
  const int64_t nc_max = std::min(ks.nc, round_up(n, nr));
  const int64_t mc_max = std::min(ks.mc, round_up(m, mr));
  char* bp = static_cast<char*>(b_buf.get(static_cast<size_t>(nc_max * kc_max * ks.elem_bytes)));
  // One more micro-panel than a block: the spare one packs a single A micro-panel (below).
  char* ap = static_cast<char*>(
      a_buf.get(static_cast<size_t>((mc_max + mr) * kc_max * ks.elem_bytes)));
  // A row-major fp32 A times a narrow B (N <= 8 micro-panels) is read in place: each element
  // would be packed for just 8 micro-kernel passes, and at N = 128 (K = 512, M = 1024, one
  // thread) skipping the pack made the GEMM 5-10% faster. At N = 512 (32 passes) the packed
  // panel's unit-stride reads win by 3-4%, so wider B keeps packing.
  const bool rows_a = ks.kernel_rows_a && a.col_stride == 1 && n <= 8 * nr && a.row_stride > 0;
  alignas(64) float edge[16 * 64];  // an overhanging tile; every KernelSet has mr <= 16, nr <= 64

  for (int64_t jc = 0; jc < n; jc += ks.nc) {
    const int64_t nc = std::min(ks.nc, n - jc);
    for (int64_t pc = 0; pc < k; pc += ks.kc) {
      const int64_t kc = std::min(ks.kc, k - pc);
      const int64_t kcp = round_up(kc, ks.kpack);
      const bool accumulate = pc > 0;
      ks.pack_b(b, pc, kc, jc, nc, bp);
      for (int64_t ic = 0; ic < m; ic += ks.mc) {
        const int64_t mc = std::min(ks.mc, m - ic);
        // Only the part micro-panel at the block's end is packed when A is read in place.
        const int64_t packed_from = rows_a ? mc / mr * mr : 0;
        const float* a_block = rows_a ? static_cast<const float*>(a.data) + ic * a.row_stride + pc : nullptr;
        if (packed_from < mc) ks.pack_a(a, ic + packed_from, mc - packed_from, pc, kc, ap);
        for (int64_t jr = 0; jr < nc; jr += nr) {
          const int nr_eff = static_cast<int>(std::min<int64_t>(nr, nc - jr));
          const char* bpanel = bp + jr * kcp * ks.elem_bytes;
          for (int64_t ir = 0; ir < mc; ir += mr) {
            const int mr_eff = static_cast<int>(std::min<int64_t>(mr, mc - ir));
            const char* apanel = ap + (ir - packed_from) * kcp * ks.elem_bytes;
            float* ct = c + (ic + ir) * ldc + jc + jr;
            if (ir < packed_from) {
              if (nr_eff == nr) {
                ks.kernel_rows_a(kc, a_block + ir * a.row_stride, a.row_stride, bpanel, ct, ldc, accumulate);
                continue;
              }
              // A part panel of B: this A micro-panel was not packed; pack it alone.
              ks.pack_a(a, ic + ir, mr, pc, kc, ap + mc * kcp * ks.elem_bytes);
              apanel = ap + mc * kcp * ks.elem_bytes;
            } else if (mr_eff == mr && nr_eff == nr) {
              ks.kernel(kc, apanel, bpanel, ct, ldc, accumulate);
              continue;
            }
            ks.kernel(kc, apanel, bpanel, edge, nr, false);
            for (int r = 0; r < mr_eff; ++r)
              for (int j = 0; j < nr_eff; ++j)
                ct[r * ldc + j] = accumulate ? ct[r * ldc + j] + edge[r * nr + j] : edge[r * nr + j];
          }
        }
      }
    }
  }
}

void validate(const GemmProblem& p) {
  if (p.type != DType::float32 && p.type != DType::bfloat16) {
    throw std::invalid_argument("[gemm] operands of dtype " + dtype_name(p.type) +
                                "; the kernel multiplies float32 or bfloat16");
  }
  const size_t rank = p.batch_shape.size();
  if (p.a_batch_strides.size() != rank || p.b_batch_strides.size() != rank ||
      p.c_batch_strides.size() != rank) {
    throw std::invalid_argument("[gemm] batch_shape has " + std::to_string(rank) +
                                " dims but the batch stride lists have " +
                                std::to_string(p.a_batch_strides.size()) + ", " +
                                std::to_string(p.b_batch_strides.size()) + " and " +
                                std::to_string(p.c_batch_strides.size()) +
                                "; give one stride per batch dim (0 to broadcast)");
  }
  if (p.a.cols != p.b.rows) {
    throw std::invalid_argument("[gemm] a is " + std::to_string(p.a.rows) + "x" +
                                std::to_string(p.a.cols) + " and b " + std::to_string(p.b.rows) +
                                "x" + std::to_string(p.b.cols) + ": inner dimensions " +
                                std::to_string(p.a.cols) + " and " + std::to_string(p.b.rows) +
                                " differ");
  }
  if (p.a.rows < 0 || p.a.cols < 0 || p.b.cols < 0) {
    throw std::invalid_argument("[gemm] negative matrix dimension");
  }
  for (int64_t d : p.batch_shape) {
    if (d < 0) throw std::invalid_argument("[gemm] negative batch dimension " + std::to_string(d));
  }
}

// Offsets (in elements) of matrix `index` of the batch, for A, B and C.
struct BatchOffsets {
  int64_t a = 0, b = 0, c = 0;
};

BatchOffsets batch_offsets(const GemmProblem& p, int64_t index) {
  BatchOffsets o;
  for (size_t d = p.batch_shape.size(); d-- > 0;) {
    const int64_t i = index % p.batch_shape[d];
    index /= p.batch_shape[d];
    o.a += i * p.a_batch_strides[d];
    o.b += i * p.b_batch_strides[d];
    o.c += i * p.c_batch_strides[d];
  }
  return o;
}

size_t elem_size(DType t) { return t == DType::float32 ? 4 : 2; }

GemmOperand offset(const GemmOperand& x, int64_t elems, DType t) {
  GemmOperand y = x;
  y.data = static_cast<const char*>(x.data) + elems * static_cast<int64_t>(elem_size(t));
  return y;
}

}  // namespace

void gemm(const GemmProblem& p) {
  validate(p);
  const int64_t batch = std::accumulate(p.batch_shape.begin(), p.batch_shape.end(), int64_t{1},
                                        std::multiplies<int64_t>());
  const int64_t m = p.a.rows, n = p.b.cols, k = p.a.cols;
  if (batch == 0 || m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t t = 0; t < batch; ++t) {
      float* c = p.c + batch_offsets(p, t).c;
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * p.c_row_stride, c + i * p.c_row_stride + n, 0.0f);
    }
    return;
  }
  const KernelSet ks = select_kernels(p.type);

  // Tasks = batch x parts, each a row or column slab of one C, run by one thread with its own
  // packing buffers. `parts` makes the task count a multiple of the thread count (one big GEMM
  // splits in two for two threads; three batched GEMMs split in two each), so threads finish
  // together; large batches are not split, as splitting repeats the packing of one operand.
  const double flops = 2.0 * static_cast<double>(batch) * m * n * k;
  const int threads = flops < 2e5 ? 1 : max_threads();
  int64_t parts = 1;
  if (threads > 1 && batch < 8 * threads) parts = threads / std::gcd<int64_t>(batch, threads);
  // Split the larger of M and N: that repeats the packing of the smaller operand.
  const bool split_m = m >= n;
  const int64_t unit = split_m ? ks.mr : ks.nr;
  const int64_t extent = split_m ? m : n;
  const int64_t slab = round_up((extent + parts - 1) / parts, unit);
  parts = (extent + slab - 1) / slab;
  const int64_t tasks = batch * parts;

  parallel_for(tasks, threads, [&](int64_t t) {
    const BatchOffsets o = batch_offsets(p, t / parts);
    const int64_t lo = (t % parts) * slab, len = std::min(slab, extent - lo);
    GemmOperand a = offset(p.a, o.a, p.type), b = offset(p.b, o.b, p.type);
    float* c = p.c + o.c;
    if (split_m) {
      a = offset(a, lo * a.row_stride, p.type);
      a.rows = len;
      c += lo * p.c_row_stride;
    } else {
      b = offset(b, lo * b.col_stride, p.type);
      b.cols = len;
      c += lo;
    }
    gemm_block(ks, a, b, c, p.c_row_stride);
  });
}

void gemm_reference(const GemmProblem& p) {
  validate(p);
  const int64_t batch = std::accumulate(p.batch_shape.begin(), p.batch_shape.end(), int64_t{1},
                                        std::multiplies<int64_t>());
  const auto load = [&](const GemmOperand& x, int64_t base, int64_t i, int64_t j) -> double {
    const int64_t idx = base + i * x.row_stride + j * x.col_stride;
    if (p.type == DType::float32) return static_cast<const float*>(x.data)[idx];
    return gemm_detail::load_as_f32(static_cast<const uint16_t*>(x.data) + idx);
  };
  for (int64_t t = 0; t < batch; ++t) {
    const BatchOffsets o = batch_offsets(p, t);
    for (int64_t i = 0; i < p.a.rows; ++i) {
      for (int64_t j = 0; j < p.b.cols; ++j) {
        double s = 0.0;
        for (int64_t q = 0; q < p.a.cols; ++q) s += load(p.a, o.a, i, q) * load(p.b, o.b, q, j);
        p.c[o.c + i * p.c_row_stride + j] = static_cast<float>(s);
      }
    }
  }
}

}  // namespace shardlab
