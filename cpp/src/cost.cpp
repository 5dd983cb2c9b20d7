#include "shardlab/cost.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>

namespace shardlab {

namespace {

using Perm = std::vector<std::pair<std::int64_t, std::int64_t>>;

// A message forwarded hop by hop. dir +1 walks i -> i+1, -1 walks i -> i-1, 0 is a single hop
// through the source's switch port to `dst`. Hop k (1-based) happens in step start + k.
struct Path {
  std::int64_t src;
  int dir;
  std::int64_t hops;
  double bytes;
  std::int64_t start;
  std::int64_t dst;
};

std::int64_t mod(std::int64_t a, std::int64_t n) { return ((a % n) + n) % n; }

// Directed link used by hop k of p: [0, n) are the i -> i+1 links (switch: i's egress port),
// [n, 2n) the i -> i-1 links.
std::int64_t link_of(const Path& p, std::int64_t k, std::int64_t n, Topology t) {
  if (p.dir == 0) return p.src;
  const std::int64_t u = mod(p.src + p.dir * (k - 1), n);
  if (t == Topology::switched) return u;
  return p.dir > 0 ? u : n + u;
}

// The time reversal of p (ReduceScatter from AllGather, reduce from broadcast, scatter from
// gather). A unidirectional ring cannot send backwards, so there the reversed message walks the
// same way round and ends where p started.
Path reversed(const Path& p, std::int64_t total_steps, std::int64_t n, Topology t) {
  const std::int64_t start = total_steps - p.start - p.hops;
  if (p.dir == 0) return Path{p.dst, 0, p.hops, p.bytes, start, p.src};
  if (t == Topology::uni_ring) return Path{mod(p.src - p.dir * p.hops, n), p.dir, p.hops, p.bytes, start, -1};
  const std::int64_t end = mod(p.src + p.dir * p.hops, n);
  return Path{end, -p.dir, p.hops, p.bytes, start, -1};
}

std::int64_t steps_of(const std::vector<Path>& paths) {
  std::int64_t s = 0;
  for (const auto& p : paths) s = std::max(s, p.start + p.hops);
  return s;
}

// Shortest-path unicast of `bytes` from s to d (the antipodal case on a ring is split in halves).
void route(std::vector<Path>& out, std::int64_t s, std::int64_t d, double bytes, std::int64_t n,
           Topology t) {
  if (s == d || bytes == 0) return;
  switch (t) {
    case Topology::switched: out.push_back({s, 0, 1, bytes, 0, d}); return;
    case Topology::uni_ring: out.push_back({s, +1, mod(d - s, n), bytes, 0, -1}); return;
    case Topology::line:
      out.push_back({s, d > s ? +1 : -1, d > s ? d - s : s - d, bytes, 0, -1});
      return;
    case Topology::ring: {
      const std::int64_t cw = mod(d - s, n), ccw = n - cw;
      if (cw < ccw) out.push_back({s, +1, cw, bytes, 0, -1});
      else if (ccw < cw) out.push_back({s, -1, ccw, bytes, 0, -1});
      else {
        out.push_back({s, +1, cw, bytes / 2, 0, -1});
        out.push_back({s, -1, ccw, bytes / 2, 0, -1});
      }
      return;
    }
  }
}

// Ring AllGather: every shard is forwarded along the ring until each device has it.
std::vector<Path> all_gather_paths(std::int64_t n, Topology t, double shard) {
  std::vector<Path> paths;
  for (std::int64_t i = 0; i < n; ++i) {
    switch (t) {
      case Topology::uni_ring:
      case Topology::switched: paths.push_back({i, +1, n - 1, shard, 0, -1}); break;
      case Topology::line:
        if (i < n - 1) paths.push_back({i, +1, n - 1 - i, shard, 0, -1});
        if (i > 0) paths.push_back({i, -1, i, shard, 0, -1});
        break;
      case Topology::ring:
        if (n % 2 == 1) {
          paths.push_back({i, +1, (n - 1) / 2, shard, 0, -1});
          paths.push_back({i, -1, (n - 1) / 2, shard, 0, -1});
        } else {
          // The device opposite gets half the shard from each side, so both directions carry
          // (n-1)/2 shards per link.
          for (int dir : {+1, -1}) {
            paths.push_back({i, dir, n / 2, shard / 2, 0, -1});
            if (n / 2 - 1 > 0) paths.push_back({i, dir, n / 2 - 1, shard / 2, 0, -1});
          }
        }
        break;
    }
  }
  return paths;
}

std::vector<Path> reverse_all(const std::vector<Path>& paths, std::int64_t n, Topology t) {
  const std::int64_t total = steps_of(paths);
  std::vector<Path> out;
  out.reserve(paths.size());
  for (const auto& p : paths) out.push_back(reversed(p, total, n, t));
  return out;
}

std::vector<Path> broadcast_paths(std::int64_t n, Topology t, double bytes, std::int64_t root) {
  std::vector<Path> paths;
  switch (t) {
    case Topology::uni_ring:
    case Topology::switched: paths.push_back({root, +1, n - 1, bytes, 0, -1}); break;
    case Topology::line:
      if (root < n - 1) paths.push_back({root, +1, n - 1 - root, bytes, 0, -1});
      if (root > 0) paths.push_back({root, -1, root, bytes, 0, -1});
      break;
    case Topology::ring:
      // Half the message goes each way round the whole ring: every link carries V/2 each way.
      paths.push_back({root, +1, n - 1, bytes / 2, 0, -1});
      paths.push_back({root, -1, n - 1, bytes / 2, 0, -1});
      break;
  }
  return paths;
}

void check_perm(const Perm& perm, std::int64_t n) {
  std::set<std::int64_t> srcs, dsts;
  for (const auto& [s, d] : perm) {
    if (s < 0 || s >= n || d < 0 || d >= n)
      throw std::invalid_argument("[ppermute] pair (" + std::to_string(s) + ", " +
                                  std::to_string(d) + ") is out of range for an axis of size " +
                                  std::to_string(n));
    if (!srcs.insert(s).second)
      throw std::invalid_argument("[ppermute] source " + std::to_string(s) +
                                  " appears twice in perm; each device sends at most once");
    if (!dsts.insert(d).second)
      throw std::invalid_argument("[ppermute] destination " + std::to_string(d) +
                                  " appears twice in perm; each device receives at most once");
  }
}

Perm shift_by_one(std::int64_t n) {
  Perm p;
  for (std::int64_t i = 0; i < n; ++i) p.push_back({i, (i + 1) % n});
  return p;
}

AxisSchedule tally(Collective op, std::int64_t n, Topology t, double bytes,
                   const std::vector<Path>& paths) {
  AxisSchedule s;
  s.op = op;
  s.size = n;
  s.topology = t;
  s.bytes = bytes;
  s.steps = steps_of(paths);
  std::vector<double> total(2 * n, 0.0);
  // Per-step maxima need steps x links memory; skip them on very long axes.
  const bool per_step = s.steps * 2 * n <= (std::int64_t{1} << 22);
  std::vector<double> by_step(per_step ? s.steps * 2 * n : 0, 0.0);
  for (const auto& p : paths) {
    for (std::int64_t k = 1; k <= p.hops; ++k) {
      const std::int64_t l = link_of(p, k, n, t);
      total[l] += p.bytes;
      if (per_step) by_step[(p.start + k - 1) * 2 * n + l] += p.bytes;
    }
  }
  if (per_step) {
    s.step_max_bytes.assign(s.steps, 0.0);
    for (std::int64_t st = 0; st < s.steps; ++st)
      s.step_max_bytes[st] =
          *std::max_element(by_step.begin() + st * 2 * n, by_step.begin() + (st + 1) * 2 * n);
  }
  for (std::int64_t l = 0; l < 2 * n; ++l) {
    if (total[l] == 0) continue;
    const std::int64_t u = l < n ? l : l - n;
    std::int64_t v = -1;
    if (t != Topology::switched) v = l < n ? mod(u + 1, n) : mod(u - 1, n);
    s.links.push_back({u, v, total[l]});
    s.max_link_bytes = std::max(s.max_link_bytes, total[l]);
    s.total_link_bytes += total[l];
  }
  return s;
}

}  // namespace

AxisSchedule schedule_axis(Collective op, std::int64_t n, Topology t, double bytes,
                           const Perm& perm, std::int64_t root) {
  const std::string name = "[" + collective_name(op) + "] ";
  if (n < 1) throw std::invalid_argument(name + "axis size " + std::to_string(n) + " must be >= 1");
  if (!(bytes >= 0) || !std::isfinite(bytes))
    throw std::invalid_argument(name + "bytes " + std::to_string(bytes) +
                                " must be a finite number >= 0");
  if (root < 0 || root >= n)
    throw std::invalid_argument(name + "root " + std::to_string(root) +
                                " is out of range for an axis of size " + std::to_string(n));
  if (op != Collective::ppermute && !perm.empty())
    throw std::invalid_argument(name + "perm is only meaningful for ppermute");
  if (op == Collective::ppermute) check_perm(perm, n);
  if (n == 1) return tally(op, n, t, bytes, {});

  std::vector<Path> paths;
  const double shard = bytes / static_cast<double>(n);
  switch (op) {
    case Collective::all_gather: paths = all_gather_paths(n, t, shard); break;
    case Collective::reduce_scatter: paths = reverse_all(all_gather_paths(n, t, shard), n, t); break;
    case Collective::all_reduce: {
      paths = reverse_all(all_gather_paths(n, t, shard), n, t);
      const std::int64_t offset = steps_of(paths);
      for (auto p : all_gather_paths(n, t, shard)) {
        p.start += offset;
        paths.push_back(p);
      }
      break;
    }
    case Collective::all_to_all: {
      const double block = shard / static_cast<double>(n);
      for (std::int64_t s = 0; s < n; ++s)
        for (std::int64_t d = 0; d < n; ++d) route(paths, s, d, block, n, t);
      break;
    }
    case Collective::ppermute:
      for (const auto& [s, d] : perm.empty() ? shift_by_one(n) : perm)
        route(paths, s, d, bytes, n, t);
      break;
    case Collective::broadcast: paths = broadcast_paths(n, t, bytes, root); break;
    case Collective::reduce: paths = reverse_all(broadcast_paths(n, t, bytes, root), n, t); break;
    case Collective::gather:
      for (std::int64_t s = 0; s < n; ++s) route(paths, s, root, shard, n, t);
      break;
    case Collective::scatter: {
      std::vector<Path> g;
      for (std::int64_t s = 0; s < n; ++s) route(g, s, root, shard, n, t);
      paths = reverse_all(g, n, t);
      break;
    }
  }
  return tally(op, n, t, bytes, paths);
}

namespace {

// One stage of a multi-axis collective: a 1-D collective on one axis, and the fraction of V
// that its 1-D array holds.
struct Stage {
  Collective op;
  std::size_t axis;
  double scale;
};

std::vector<Stage> stages_for(Collective op, const std::vector<std::size_t>& order,
                              const std::vector<AxisLinks>& axes) {
  double n_total = 1;
  for (const auto& a : axes) n_total *= static_cast<double>(a.size);
  std::vector<Stage> st;
  auto grow = [&](Collective one) {
    double done = 1;
    for (std::size_t a : order) {
      done *= static_cast<double>(axes[a].size);
      st.push_back({one, a, done / n_total});
    }
  };
  auto shrink = [&](Collective one) {
    double done = 1;
    for (std::size_t a : order) {
      st.push_back({one, a, 1.0 / done});
      done *= static_cast<double>(axes[a].size);
    }
  };
  switch (op) {
    case Collective::all_gather: grow(Collective::all_gather); break;
    case Collective::gather: grow(Collective::gather); break;
    case Collective::reduce_scatter: shrink(Collective::reduce_scatter); break;
    case Collective::scatter: shrink(Collective::scatter); break;
    case Collective::all_reduce: {
      shrink(Collective::reduce_scatter);
      double size = 1.0;
      for (std::size_t a : order) size /= static_cast<double>(axes[a].size);
      for (auto it = order.rbegin(); it != order.rend(); ++it) {
        size *= static_cast<double>(axes[*it].size);
        st.push_back({Collective::all_gather, *it, size});
      }
      break;
    }
    case Collective::all_to_all:
      for (std::size_t a : order)
        st.push_back({Collective::all_to_all, a, static_cast<double>(axes[a].size) / n_total});
      break;
    case Collective::broadcast:
    case Collective::reduce:
    case Collective::ppermute:
      for (std::size_t a : order) st.push_back({op, a, 1.0});
      break;
  }
  return st;
}

struct Candidate {
  std::vector<double> load;  // bytes on the busiest link of each axis
  double latency = 0;
  std::int64_t hops = 0;
};

void check_axes(Collective op, double bytes, const std::vector<AxisLinks>& axes) {
  const std::string name = "[" + collective_name(op) + "] ";
  if (!(bytes >= 0) || !std::isfinite(bytes))
    throw std::invalid_argument(name + "bytes " + std::to_string(bytes) +
                                " must be a finite number >= 0");
  for (const auto& a : axes) {
    if (a.size < 1)
      throw std::invalid_argument(name + "axis " + a.label + " has size " +
                                  std::to_string(a.size) + "; sizes must be >= 1");
    if (a.size > 1 && !(a.link_bandwidth > 0))
      throw std::invalid_argument(name + "axis " + a.label + " has link bandwidth " +
                                  std::to_string(a.link_bandwidth) + "; it must be > 0");
    if (a.hop_latency < 0)
      throw std::invalid_argument(name + "axis " + a.label + " has a negative hop latency");
  }
}

CollectiveTime finish(const Candidate& c, const std::vector<AxisLinks>& axes, std::string plan) {
  CollectiveTime r;
  r.axis_link_bytes = c.load;
  for (std::size_t a = 0; a < axes.size(); ++a)
    if (c.load[a] > 0)
      r.bandwidth_seconds = std::max(r.bandwidth_seconds, c.load[a] / axes[a].link_bandwidth);
  r.latency_seconds = c.latency;
  r.hops = c.hops;
  r.seconds = std::max(r.bandwidth_seconds, r.latency_seconds);
  r.plan = std::move(plan);
  return r;
}

// ppermute over several axes: the flattened (major-to-minor) index pairs are routed one axis
// at a time, major axis first; messages on different lines of an axis use different links.
CollectiveTime multi_axis_ppermute(double bytes, const std::vector<AxisLinks>& axes,
                                   const Perm& perm_in) {
  std::int64_t n_total = 1;
  for (const auto& a : axes) n_total *= a.size;
  check_perm(perm_in, n_total);
  const Perm perm = perm_in.empty() ? shift_by_one(n_total) : perm_in;
  auto coords = [&](std::int64_t flat) {
    std::vector<std::int64_t> c(axes.size());
    for (std::size_t a = axes.size(); a-- > 0;) {
      c[a] = flat % axes[a].size;
      flat /= axes[a].size;
    }
    return c;
  };
  Candidate c;
  c.load.assign(axes.size(), 0.0);
  for (std::size_t a = 0; a < axes.size(); ++a) {
    // Group the messages by the line of axis a they travel on.
    std::map<std::vector<std::int64_t>, Perm> lines;
    for (const auto& [s, d] : perm) {
      auto cs = coords(s), cd = coords(d);
      if (cs[a] == cd[a]) continue;
      std::vector<std::int64_t> key;
      for (std::size_t b = 0; b < axes.size(); ++b)
        if (b != a) key.push_back(b < a ? cd[b] : cs[b]);
      lines[key].push_back({cs[a], cd[a]});
    }
    std::int64_t steps = 0;
    for (const auto& [key, p] : lines) {
      const auto s = schedule_axis(Collective::ppermute, axes[a].size, axes[a].topology, bytes, p);
      c.load[a] = std::max(c.load[a], s.max_link_bytes);
      steps = std::max(steps, s.steps);
    }
    c.hops += steps;
    c.latency += static_cast<double>(steps) * axes[a].hop_latency;
  }
  return finish(c, axes, "dimension-ordered routing, major axis first");
}

}  // namespace

CollectiveTime collective_time(Collective op, double bytes, const std::vector<AxisLinks>& axes_in,
                               const Perm& perm) {
  check_axes(op, bytes, axes_in);
  std::vector<AxisLinks> axes;
  for (const auto& a : axes_in)
    if (a.size > 1) axes.push_back(a);
  if (axes.empty()) {
    if (!perm.empty() && op == Collective::ppermute) check_perm(perm, 1);
    return CollectiveTime{};
  }
  if (op == Collective::ppermute) {
    if (axes.size() == 1) {
      const auto s = schedule_axis(op, axes[0].size, axes[0].topology, bytes, perm);
      Candidate c{{s.max_link_bytes}, static_cast<double>(s.steps) * axes[0].hop_latency, s.steps};
      return finish(c, axes, "shortest paths");
    }
    return multi_axis_ppermute(bytes, axes, perm);
  }
  if (!perm.empty())
    throw std::invalid_argument("[" + collective_name(op) + "] perm is only meaningful for ppermute");

  // Loads scale linearly with V, so each (1-D op, axis) is scheduled once with V = 1.
  std::map<std::pair<int, std::size_t>, AxisSchedule> unit;
  auto sched = [&](Collective one, std::size_t a) -> const AxisSchedule& {
    auto key = std::make_pair(static_cast<int>(one), a);
    auto it = unit.find(key);
    if (it == unit.end())
      it = unit.emplace(key, schedule_axis(one, axes[a].size, axes[a].topology, 1.0)).first;
    return it->second;
  };
  auto evaluate = [&](const std::vector<std::vector<std::size_t>>& orders) {
    Candidate c;
    c.load.assign(axes.size(), 0.0);
    const double f = 1.0 / static_cast<double>(orders.size());
    for (const auto& order : orders) {
      double lat = 0;
      std::int64_t hops = 0;
      for (const auto& st : stages_for(op, order, axes)) {
        const auto& s = sched(st.op, st.axis);
        c.load[st.axis] += f * bytes * st.scale * s.max_link_bytes;
        lat += static_cast<double>(s.steps) * axes[st.axis].hop_latency;
        hops += s.steps;
      }
      if (lat >= c.latency) {
        c.latency = lat;
        c.hops = hops;
      }
    }
    return c;
  };
  auto describe = [&](const std::vector<std::size_t>& order) {
    std::string s;
    for (std::size_t a : order) s += (s.empty() ? "" : " -> ") + axes[a].label;
    return s;
  };

  std::vector<std::size_t> given(axes.size());
  std::iota(given.begin(), given.end(), 0);
  const bool splittable = op == Collective::all_gather || op == Collective::reduce_scatter ||
                          op == Collective::all_reduce || op == Collective::all_to_all;
  if (axes.size() == 1 || !splittable)
    return finish(evaluate({given}), axes, axes.size() == 1 ? "ring algorithm" : describe(given));

  CollectiveTime best;
  best.seconds = std::numeric_limits<double>::infinity();
  auto consider = [&](const std::vector<std::vector<std::size_t>>& orders, std::string plan) {
    auto r = finish(evaluate(orders), axes, std::move(plan));
    if (r.seconds < best.seconds * (1 - 1e-12)) best = r;
  };
  // Even split over the cyclic rotations: at every stage each axis serves a different part,
  // which is how the book's V / (W N_axes) is reached on a symmetric torus.
  std::vector<std::vector<std::size_t>> rotations;
  for (std::size_t r = 0; r < axes.size(); ++r) {
    std::vector<std::size_t> o;
    for (std::size_t i = 0; i < axes.size(); ++i) o.push_back(given[(r + i) % axes.size()]);
    rotations.push_back(o);
  }
  consider(rotations, "even split over " + std::to_string(axes.size()) + " rotations of " +
                          describe(given));
  // A single order wins on uneven axes (slow axis first on the small array: GPU IB then NVLink).
  if (axes.size() <= 4) {
    std::vector<std::size_t> o = given;
    do consider({o}, describe(o));
    while (std::next_permutation(o.begin(), o.end()));
  }
  return best;
}

namespace {

double effective_bidi(const AxisLinks& a) {
  switch (a.topology) {
    // The headline formulas assume a wraparound ring; a line is priced as one (the link-level
    // model gives the book's own correction for it).
    case Topology::ring:
    case Topology::line: return 2 * a.link_bandwidth;
    case Topology::uni_ring:
    case Topology::switched: return a.link_bandwidth;
  }
  return a.link_bandwidth;
}

double book_hops(Collective op, const AxisLinks& a) {
  const double n = static_cast<double>(a.size);
  if (a.topology == Topology::switched)
    return op == Collective::all_to_all || op == Collective::ppermute ? 1.0 : n - 1;
  if (op == Collective::ppermute) return 1.0;
  return a.topology == Topology::uni_ring ? n - 1 : n / 2;
}

}  // namespace

BookTime book_collective_time(Collective op, double bytes, const std::vector<AxisLinks>& axes_in) {
  check_axes(op, bytes, axes_in);
  BookTime r;
  const bool known = op == Collective::all_gather || op == Collective::reduce_scatter ||
                     op == Collective::all_reduce || op == Collective::all_to_all ||
                     op == Collective::ppermute;
  if (!known) return r;
  r.available = true;
  std::vector<AxisLinks> axes;
  for (const auto& a : axes_in)
    if (a.size > 1) axes.push_back(a);
  if (axes.empty()) return r;

  double n_total = 1;
  for (const auto& a : axes) n_total *= static_cast<double>(a.size);
  for (const auto& a : axes) r.latency_seconds += book_hops(op, a) * a.hop_latency;

  if (op == Collective::ppermute) {
    r.bandwidth_seconds = bytes / axes.back().link_bandwidth;
    r.latency_seconds = axes.back().hop_latency;
  } else if (op == Collective::all_to_all) {
    for (const auto& a : axes) {
      const double n = static_cast<double>(a.size), w = a.link_bandwidth;
      double t = 0;
      switch (a.topology) {
        case Topology::ring:
        case Topology::line: t = bytes * n / (4 * n_total * 2 * w); break;
        case Topology::uni_ring: t = bytes * n / (2 * n_total * w); break;
        case Topology::switched: t = bytes / (n_total * w); break;
      }
      r.bandwidth_seconds = std::max(r.bandwidth_seconds, t);
    }
  } else {
    // Torus axes add their bandwidth; switched levels (NVLink, InfiniBand, DCN) are a hierarchy
    // whose slowest level bounds the time, each level seeing the array divided by the faster
    // levels below it.
    double torus_bw = 0;
    std::vector<const AxisLinks*> switched;
    for (const auto& a : axes) {
      if (a.topology == Topology::switched) switched.push_back(&a);
      else torus_bw += effective_bidi(a);
    }
    double t = torus_bw > 0 ? bytes / torus_bw : 0;
    for (const auto* a : switched) {
      double below = 1;
      for (const auto* b : switched)
        if (b != a && b->link_bandwidth > a->link_bandwidth) below *= static_cast<double>(b->size);
      t = std::max(t, bytes / (below * a->link_bandwidth));
    }
    r.bandwidth_seconds = t;
    if (op == Collective::all_reduce) {
      r.bandwidth_seconds *= 2;
      r.latency_seconds *= 2;
    }
  }
  r.seconds = std::max(r.bandwidth_seconds, r.latency_seconds);
  return r;
}

}  // namespace shardlab
