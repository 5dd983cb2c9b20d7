#include "shardlab/collectives.hpp"

#include "shardlab/ops.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace shardlab {
namespace {

std::string axes_str(const AxisNames& axes) {
  if (axes.size() == 1) return "'" + axes[0] + "'";
  std::string out = "(";
  for (std::size_t i = 0; i < axes.size(); ++i) out += (i ? ", '" : "'") + axes[i] + "'";
  return out + ")";
}

// Checks that `in` is mesh-factorized storage for `mesh` and resolves the axis names.
std::vector<int> check(const Mesh& mesh, const Shape& in, const AxisNames& axes, const std::string& op) {
  if (axes.empty()) throw std::invalid_argument("[" + op + "] needs at least one axis name");
  const auto idx = resolve_axes(mesh, axes, op);
  if (static_cast<int>(in.size()) < mesh.ndim()) {
    throw std::invalid_argument("[" + op + "] storage of rank " + std::to_string(in.size()) +
                                " has fewer dims than the mesh's " + std::to_string(mesh.ndim()));
  }
  for (int a = 0; a < mesh.ndim(); ++a) {
    if (in[a] != 1 && in[a] != mesh.axis_sizes()[a]) {
      throw std::invalid_argument("[" + op + "] storage dim " + std::to_string(a) + " has size " +
                                  std::to_string(in[a]) + "; it must be 1 or the size " +
                                  std::to_string(mesh.axis_sizes()[a]) + " of axis '" +
                                  mesh.axis_names()[a] + "'");
    }
  }
  return idx;
}

int norm_axis(int axis, int rank, const std::string& op, const std::string& what) {
  if (axis < -rank || axis >= rank) {
    throw std::invalid_argument("[" + op + "] " + what + " " + std::to_string(axis) +
                                " is out of range for a value of rank " +
                                std::to_string(rank > 0 ? rank : 0));
  }
  return axis < 0 ? axis + rank : axis;
}

void check_out(const ArrayRef& in, const ArrayRef& out, const Shape& want, const std::string& op) {
  if (out.shape != want) {
    throw std::invalid_argument("[" + op + "] output storage has shape " + shape_str(out.shape) +
                                ", expected " + shape_str(want));
  }
  if (out.dtype != in.dtype) throw std::invalid_argument("[" + op + "] output dtype differs from input");
}

std::int64_t mesh_stride(const ArrayRef& a, int axis) { return a.shape[axis] == 1 ? 0 : a.strides[axis]; }

// Product of the sizes of axes[j+1:], the stride multiplier of the j-th axis in a
// major-to-minor flattening.
std::int64_t minor_size(const Mesh& mesh, const std::vector<int>& axes, std::size_t j) {
  std::int64_t p = 1;
  for (std::size_t t = j + 1; t < axes.size(); ++t) p *= mesh.axis_sizes()[axes[t]];
  return p;
}

ArrayRef insert_unit_dim(ArrayRef a, int pos) {
  a.shape.insert(a.shape.begin() + pos, 1);
  a.strides.insert(a.strides.begin() + pos, 0);
  return a;
}

// The view of `a` at linear index `linear` along `axes` (those dims become size 1).
ArrayRef fix_axes(const Mesh& mesh, ArrayRef a, const std::vector<int>& axes, std::int64_t linear) {
  for (int j = static_cast<int>(axes.size()) - 1; j >= 0; --j) {
    const std::int64_t m = mesh.axis_sizes()[axes[j]];
    const std::int64_t c = linear % m;
    linear /= m;
    if (a.shape[axes[j]] != 1) a.data = static_cast<char*>(a.data) + c * a.strides[axes[j]];
    a.shape[axes[j]] = 1;
  }
  return a;
}

void check_root(const Mesh& mesh, const std::vector<int>& idx, std::int64_t root, const std::string& op) {
  const std::int64_t n = mesh.group_size(idx);
  if (root < 0 || root >= n) {
    throw std::invalid_argument("[" + op + "] root " + std::to_string(root) +
                                " is outside the group of " + std::to_string(n) + " devices");
  }
}

std::int64_t local_count(const Mesh& mesh, const Shape& s) {
  std::int64_t n = 1;
  for (std::size_t d = mesh.ndim(); d < s.size(); ++d) n *= s[d];
  return n;
}

// `full_elems`: elements of V (see ring_bytes_sent) per device.
Event make_event(Op op, const Mesh& mesh, const AxisNames& axes,
                 const std::vector<int>& idx, const ArrayRef& in, const Shape& out_shape,
                 std::int64_t full_elems) {
  Event e;
  e.op = op_name(op);
  e.axes = axes;
  e.group_size = mesh.group_size(idx);
  e.num_groups = mesh.size() / e.group_size;
  e.dtype = in.dtype;
  const auto item = static_cast<std::int64_t>(itemsize(in.dtype));
  e.bytes_in = local_count(mesh, in.shape) * item;
  e.bytes_out = local_count(mesh, out_shape) * item;
  e.bytes_sent = ring_bytes_sent(e.op, e.group_size, static_cast<double>(full_elems * item));
  return e;
}

// (dst, src) views over `out`'s dims with dim `dim` expanded into one dim per axis in `idx`
// (which source device: the input's mesh strides) followed by a dim of size `base`.
std::pair<ArrayRef, ArrayRef> expand_views(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out,
                                           const std::vector<int>& idx, int dim, std::int64_t base) {
  ArrayRef dv{out.data, out.dtype, {}, {}}, sv{in.data, in.dtype, {}, {}};
  for (int i = 0; i < out.ndim(); ++i) {
    if (i == dim) {
      for (std::size_t j = 0; j < idx.size(); ++j) {
        dv.shape.push_back(mesh.axis_sizes()[idx[j]]);
        dv.strides.push_back(out.strides[i] * base * minor_size(mesh, idx, j));
        sv.strides.push_back(mesh_stride(in, idx[j]));
      }
      dv.shape.push_back(base);
    } else {
      dv.shape.push_back(out.shape[i]);
    }
    dv.strides.push_back(out.strides[i]);
    sv.strides.push_back(in.strides[i]);
  }
  sv.shape = dv.shape;
  return {dv, sv};
}

// Tiled gather of local dim `ax` of `in` into the same dim of `out` (n times longer).
void gather_views(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out,
                  const std::vector<int>& idx, int ax) {
  const int k = mesh.ndim();
  const auto views = expand_views(mesh, in, out, idx, k + ax, in.shape[k + ax]);
  copy_strided(views.first, views.second);
}

// (dst, src) views for a tiled scatter of local dim `d`: src has dst's dims followed by one
// reduction dim per axis (the contributing devices). The receiving device's index along the
// axes selects the chunk.
std::pair<ArrayRef, ArrayRef> scatter_views(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out,
                                            const std::vector<int>& idx, int d) {
  const int k = mesh.ndim();
  const std::int64_t chunk = in.shape[k + d] / mesh.group_size(idx);
  ArrayRef sv{in.data, in.dtype, out.shape, {}};
  for (int i = 0; i < out.ndim(); ++i) sv.strides.push_back(in.strides[i]);
  for (std::size_t j = 0; j < idx.size(); ++j) {
    sv.strides[idx[j]] = in.strides[k + d] * chunk * minor_size(mesh, idx, j);
  }
  for (std::size_t j = 0; j < idx.size(); ++j) {
    sv.shape.push_back(mesh.axis_sizes()[idx[j]]);
    sv.strides.push_back(mesh_stride(in, idx[j]));
  }
  return {out, sv};
}

}  // namespace

namespace {

Shape gather_like_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes, int axis, bool tiled,
                        const std::string& op) {
  const auto idx = check(mesh, in, axes, op);
  const int k = mesh.ndim(), r = static_cast<int>(in.size()) - k;
  const std::int64_t n = mesh.group_size(idx);
  Shape out = in;
  for (int a : idx) out[a] = 1;
  if (tiled) {
    if (r == 0) throw std::invalid_argument("[" + op + "] tiled=True needs a value of rank >= 1, got a scalar");
    out[k + norm_axis(axis, r, op, "axis")] *= n;
  } else {
    out.insert(out.begin() + k + norm_axis(axis, r + 1, op, "axis"), n);
  }
  return out;
}

}  // namespace

Shape all_gather_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes, int axis, bool tiled) {
  return gather_like_shape(mesh, in, axes, axis, tiled, op_name(Op::all_gather));
}

Event all_gather(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
                 int axis, bool tiled) {
  check_out(in, out, all_gather_shape(mesh, in.shape, axes, axis, tiled), op_name(Op::all_gather));
  const auto idx = resolve_axes(mesh, axes, op_name(Op::all_gather));
  const int k = mesh.ndim(), r = in.ndim() - k;
  if (tiled) {
    gather_views(mesh, in, out, idx, norm_axis(axis, r, op_name(Op::all_gather), "axis"));
  } else {
    const int ax = norm_axis(axis, r + 1, op_name(Op::all_gather), "axis");
    gather_views(mesh, insert_unit_dim(in, k + ax), out, idx, ax);
  }
  return make_event(Op::all_gather, mesh, axes, idx, in, out.shape, local_count(mesh, out.shape));
}

Shape all_reduce_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes) {
  const auto idx = check(mesh, in, axes, op_name(Op::psum));
  Shape out = in;
  for (int a : idx) out[a] = 1;
  return out;
}

Event all_reduce(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
                 ReduceOp op) {
  const std::string name = op_name(all_reduce_op(op));
  check_out(in, out, all_reduce_shape(mesh, in.shape, axes), name);
  const auto idx = resolve_axes(mesh, axes, name);
  ArrayRef sv{in.data, in.dtype, out.shape, in.strides};
  for (int a : idx) {
    sv.shape.push_back(mesh.axis_sizes()[a]);
    sv.strides.push_back(mesh_stride(in, a));
  }
  reduce_strided(out, sv, static_cast<int>(idx.size()), op);
  return make_event(all_reduce_op(op), mesh, axes, idx, in, out.shape, local_count(mesh, in.shape));
}

namespace {

Shape scatter_like_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes, int scatter_dimension,
                         bool tiled, const std::string& op) {
  const auto idx = check(mesh, in, axes, op);
  const int k = mesh.ndim(), r = static_cast<int>(in.size()) - k;
  const std::int64_t n = mesh.group_size(idx);
  const int d = norm_axis(scatter_dimension, r, op, "scatter_dimension");
  const std::int64_t l = in[k + d];
  Shape out = in;
  for (int a : idx) out[a] = mesh.axis_sizes()[a];
  if (tiled) {
    if (l % n != 0) {
      throw std::invalid_argument("[" + op + "] scatter_dimension " + std::to_string(d) +
                                  " has size " + std::to_string(l) + ", which is not divisible by " +
                                  std::to_string(n) + ", the size of " + axes_str(axes));
    }
    out[k + d] = l / n;
  } else {
    if (l != n) {
      throw std::invalid_argument("[" + op + "] scatter_dimension " + std::to_string(d) +
                                  " has size " + std::to_string(l) + ", which is not the size " +
                                  std::to_string(n) + " of " + axes_str(axes) +
                                  "; untiled " + op + " needs them equal (or pass tiled=True)");
    }
    out.erase(out.begin() + k + d);
  }
  return out;
}

}  // namespace

Shape psum_scatter_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes,
                         int scatter_dimension, bool tiled) {
  return scatter_like_shape(mesh, in, axes, scatter_dimension, tiled, op_name(Op::psum_scatter));
}

Event psum_scatter(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
                   int scatter_dimension, bool tiled) {
  check_out(in, out, psum_scatter_shape(mesh, in.shape, axes, scatter_dimension, tiled), op_name(Op::psum_scatter));
  const auto idx = resolve_axes(mesh, axes, op_name(Op::psum_scatter));
  const int d = norm_axis(scatter_dimension, in.ndim() - mesh.ndim(), op_name(Op::psum_scatter), "scatter_dimension");
  const ArrayRef o = tiled ? out : insert_unit_dim(out, mesh.ndim() + d);
  const auto views = scatter_views(mesh, in, o, idx, d);
  reduce_strided(views.first, views.second, static_cast<int>(idx.size()), ReduceOp::sum);
  return make_event(Op::psum_scatter, mesh, axes, idx, in, out.shape, local_count(mesh, in.shape));
}

Shape all_to_all_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes, int split_axis,
                       int concat_axis, bool tiled) {
  const auto idx = check(mesh, in, axes, op_name(Op::all_to_all));
  const int k = mesh.ndim(), r = static_cast<int>(in.size()) - k;
  const std::int64_t n = mesh.group_size(idx);
  const int s = norm_axis(split_axis, r, op_name(Op::all_to_all), "split_axis");
  const int c = norm_axis(concat_axis, r, op_name(Op::all_to_all), "concat_axis");
  const std::int64_t l = in[k + s];
  Shape out = in;
  for (int a : idx) out[a] = mesh.axis_sizes()[a];
  if (tiled) {
    if (l % n != 0) {
      throw std::invalid_argument("[" + op_name(Op::all_to_all) + "] split_axis " + std::to_string(s) + " has size " +
                                  std::to_string(l) + ", which is not divisible by " +
                                  std::to_string(n) + ", the size of " + axes_str(axes));
    }
    out[k + s] /= n;
    out[k + c] *= n;
  } else if (l != n) {
    throw std::invalid_argument("[" + op_name(Op::all_to_all) + "] split_axis " + std::to_string(s) + " has size " +
                                std::to_string(l) + ", which is not the axis size " +
                                std::to_string(n) + " of " + axes_str(axes) +
                                "; untiled all_to_all needs them equal (or pass tiled=True)");
  } else {
    // As jax.lax.all_to_all: the split dim goes away and a dim of size n appears at concat_axis.
    out.erase(out.begin() + k + s);
    out.insert(out.begin() + k + c, n);
  }
  return out;
}

Event all_to_all(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
                 int split_axis, int concat_axis, bool tiled) {
  check_out(in, out, all_to_all_shape(mesh, in.shape, axes, split_axis, concat_axis, tiled), op_name(Op::all_to_all));
  const auto idx = resolve_axes(mesh, axes, op_name(Op::all_to_all));
  const int k = mesh.ndim(), r = in.ndim() - k;
  int s = norm_axis(split_axis, r, op_name(Op::all_to_all), "split_axis");
  int c = norm_axis(concat_axis, r, op_name(Op::all_to_all), "concat_axis");
  ArrayRef iv = in, ov = out;
  if (!tiled && s != c) {
    // As jax.lax does: insert a unit concat dim, run the tiled form, squeeze the split dim.
    if (s < c) {
      c += 1;
    } else {
      s += 1;
    }
    iv = insert_unit_dim(in, k + c);
    ov = insert_unit_dim(out, k + s);
  }
  const std::int64_t chunk = iv.shape[k + s] / mesh.group_size(idx);
  const std::int64_t base = s == c ? chunk : iv.shape[k + c];
  auto [dv, sv] = expand_views(mesh, iv, ov, idx, k + c, base);
  // The receiving device's own index along the axes selects the chunk of the split dim.
  for (std::size_t j = 0; j < idx.size(); ++j) {
    sv.strides[idx[j]] = iv.strides[k + s] * chunk * minor_size(mesh, idx, j);
  }
  copy_strided(dv, sv);
  return make_event(Op::all_to_all, mesh, axes, idx, in, out.shape, local_count(mesh, in.shape));
}

Shape ppermute_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes, const Perm& perm) {
  const auto idx = check(mesh, in, axes, op_name(Op::ppermute));
  const std::int64_t n = mesh.group_size(idx);
  std::vector<char> src_seen(n, 0), dst_seen(n, 0);
  for (const auto& [src, dst] : perm) {
    for (std::int64_t v : {src, dst}) {
      if (v < 0 || v >= n) {
        throw std::invalid_argument("[" + op_name(Op::ppermute) + "] index " + std::to_string(v) + " in perm pair (" +
                                    std::to_string(src) + ", " + std::to_string(dst) +
                                    ") is outside [0, " + std::to_string(n) + "), the size of " +
                                    axes_str(axes));
      }
    }
    if (src_seen[src]++) {
      throw std::invalid_argument("[" + op_name(Op::ppermute) + "] source " + std::to_string(src) +
                                  " appears twice in perm; each device sends at most once");
    }
    if (dst_seen[dst]++) {
      throw std::invalid_argument("[" + op_name(Op::ppermute) + "] destination " + std::to_string(dst) +
                                  " appears twice in perm; each device receives at most once");
    }
  }
  Shape out = in;
  for (int a : idx) out[a] = mesh.axis_sizes()[a];
  return out;
}

Event ppermute(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
               const Perm& perm) {
  check_out(in, out, ppermute_shape(mesh, in.shape, axes, perm), op_name(Op::ppermute));
  const auto idx = resolve_axes(mesh, axes, op_name(Op::ppermute));
  if (static_cast<std::int64_t>(perm.size()) < mesh.group_size(idx)) fill_zero(out);
  for (const auto& [src, dst] : perm) {
    copy_strided(fix_axes(mesh, out, idx, dst), fix_axes(mesh, in, idx, src));
  }
  Event e = make_event(Op::ppermute, mesh, axes, idx, in, out.shape, local_count(mesh, in.shape));
  if (perm.empty()) e.bytes_sent = 0;
  return e;
}

Shape axis_index_shape(const Mesh& mesh, const AxisNames& axes) {
  const auto idx = resolve_axes(mesh, axes, "axis_index");
  Shape out(mesh.ndim(), 1);
  for (int a : idx) out[a] = mesh.axis_sizes()[a];
  return out;
}

void axis_index(const Mesh& mesh, const ArrayRef& out, const AxisNames& axes) {
  const Shape want = axis_index_shape(mesh, axes);
  if (out.shape != want || out.dtype != DType::int32) {
    throw std::invalid_argument("[axis_index] output must be int32 with shape " + shape_str(want));
  }
  const auto idx = resolve_axes(mesh, axes, "axis_index");
  const std::int64_t total = mesh.group_size(idx);
  for (std::int64_t linear = 0; linear < total; ++linear) {
    const std::int32_t v = static_cast<std::int32_t>(linear);
    std::memcpy(fix_axes(mesh, out, idx, linear).data, &v, sizeof v);
  }
}

Shape broadcast_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes, std::int64_t root) {
  const auto idx = check(mesh, in, axes, op_name(Op::broadcast));
  check_root(mesh, idx, root, op_name(Op::broadcast));
  Shape out = in;
  for (int a : idx) out[a] = 1;
  return out;
}

Event broadcast(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
                std::int64_t root) {
  check_out(in, out, broadcast_shape(mesh, in.shape, axes, root), op_name(Op::broadcast));
  const auto idx = resolve_axes(mesh, axes, op_name(Op::broadcast));
  copy_strided(out, fix_axes(mesh, in, idx, root));
  return make_event(Op::broadcast, mesh, axes, idx, in, out.shape, local_count(mesh, in.shape));
}

Shape reduce_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes, std::int64_t root) {
  const auto idx = check(mesh, in, axes, op_name(Op::reduce));
  check_root(mesh, idx, root, op_name(Op::reduce));
  Shape out = in;
  for (int a : idx) out[a] = mesh.axis_sizes()[a];
  return out;
}

Event reduce(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
             std::int64_t root, ReduceOp op) {
  check_out(in, out, reduce_shape(mesh, in.shape, axes, root), op_name(Op::reduce));
  const auto idx = resolve_axes(mesh, axes, op_name(Op::reduce));
  fill_zero(out);
  all_reduce(mesh, in, fix_axes(mesh, out, idx, root), axes, op);
  return make_event(Op::reduce, mesh, axes, idx, in, out.shape, local_count(mesh, in.shape));
}

Shape gather_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes, std::int64_t root,
                   int axis, bool tiled) {
  Shape out = gather_like_shape(mesh, in, axes, axis, tiled, op_name(Op::gather));
  const auto idx = resolve_axes(mesh, axes, op_name(Op::gather));
  check_root(mesh, idx, root, op_name(Op::gather));
  for (int a : idx) out[a] = mesh.axis_sizes()[a];
  return out;
}

Event gather(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
             std::int64_t root, int axis, bool tiled) {
  check_out(in, out, gather_shape(mesh, in.shape, axes, root, axis, tiled), op_name(Op::gather));
  const auto idx = resolve_axes(mesh, axes, op_name(Op::gather));
  fill_zero(out);
  all_gather(mesh, in, fix_axes(mesh, out, idx, root), axes, axis, tiled);
  return make_event(Op::gather, mesh, axes, idx, in, out.shape, local_count(mesh, out.shape));
}

Shape scatter_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes, std::int64_t root,
                    int scatter_dimension, bool tiled) {
  Shape out = scatter_like_shape(mesh, in, axes, scatter_dimension, tiled, op_name(Op::scatter));
  check_root(mesh, resolve_axes(mesh, axes, op_name(Op::scatter)), root, op_name(Op::scatter));
  return out;
}

Event scatter(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
              std::int64_t root, int scatter_dimension, bool tiled) {
  check_out(in, out, scatter_shape(mesh, in.shape, axes, root, scatter_dimension, tiled), op_name(Op::scatter));
  const auto idx = resolve_axes(mesh, axes, op_name(Op::scatter));
  const int d = norm_axis(scatter_dimension, in.ndim() - mesh.ndim(), op_name(Op::scatter), "scatter_dimension");
  const ArrayRef o = tiled ? out : insert_unit_dim(out, mesh.ndim() + d);
  auto views = scatter_views(mesh, fix_axes(mesh, in, idx, root), o, idx, d);
  ArrayRef src = views.second;  // drop the reduction dims: one source, the root
  src.shape.resize(views.first.shape.size());
  src.strides.resize(views.first.shape.size());
  copy_strided(views.first, src);
  return make_event(Op::scatter, mesh, axes, idx, in, out.shape, local_count(mesh, in.shape));
}

}  // namespace shardlab
