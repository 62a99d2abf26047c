#include "meshtrain/train/step_trace.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"
#include "meshtrain/core/staged_file.h"
#include "meshtrain/core/system.h"
#include "meshtrain/core/trace.h"

namespace meshtrain {
namespace {

using trace::Event;
using trace::Kind;

std::int64_t host_hash() {
  return static_cast<std::int64_t>(std::hash<std::string>{}(host_name()) >> 1);
}

// One rank's buffer as bytes: a header, the events (raw: every rank runs this binary), the
// windows (step, end, group count, bytes per group) and the group names, '\n'-separated.
struct Blob {
  std::vector<std::byte> bytes;
  void put(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    bytes.insert(bytes.end(), b, b + n);
  }
  void put(std::int64_t v) { put(&v, sizeof v); }
};

struct Reader {
  std::span<const std::byte> bytes;
  std::size_t at = 0;
  void get(void* p, std::size_t n) {
    MT_CHECK(at + n <= bytes.size(), "trace buffer truncated at {} of {}", at, bytes.size());
    std::memcpy(p, bytes.data() + at, n);
    at += n;
  }
  std::int64_t get() {
    std::int64_t v = 0;
    get(&v, sizeof v);
    return v;
  }
};

// What rank 0 learns of each rank.
struct RankTrace {
  std::int64_t t0_ns = 0, host = 0, dropped = 0;
  std::vector<Event> events;
  struct Window {
    std::int64_t step, end_ns;
    std::vector<std::int64_t> bytes;
  };
  std::vector<Window> windows;
  std::vector<std::string> names;
};

RankTrace parse(std::span<const std::byte> bytes) {
  Reader in{bytes};
  RankTrace r;
  r.t0_ns = in.get();
  r.host = in.get();
  r.dropped = in.get();
  r.events.resize(static_cast<std::size_t>(in.get()));
  const auto windows = static_cast<std::size_t>(in.get());
  in.get(r.events.data(), r.events.size() * sizeof(Event));
  for (std::size_t w = 0; w < windows; ++w) {
    RankTrace::Window win{.step = in.get(), .end_ns = in.get(), .bytes = {}};
    win.bytes.resize(static_cast<std::size_t>(in.get()));
    in.get(win.bytes.data(), win.bytes.size() * sizeof(std::int64_t));
    r.windows.push_back(std::move(win));
  }
  std::string names(bytes.size() - in.at, '\0');
  in.get(names.data(), names.size());
  for (std::size_t pos = 0; pos < names.size();) {
    const std::size_t end = names.find('\n', pos);
    r.names.push_back(names.substr(pos, end - pos));
    pos = end == std::string::npos ? names.size() : end + 1;
  }
  return r;
}

std::string axis_of(const std::string& group) { return group.substr(0, group.find('{')); }

// The Trace Event Format record of `e` on process `pid`; `origin` is time 0 (ns).
nlohmann::json to_json(const Event& e, const RankTrace& r, int pid, std::int64_t origin) {
  nlohmann::json j = {{"ph", "X"},
                      {"pid", pid},
                      {"ts", static_cast<double>(e.start_ns - origin) * 1e-3},
                      {"dur", static_cast<double>(e.end_ns - e.start_ns) * 1e-3}};
  nlohmann::json args = {{"step", e.step + 1}};
  const std::string kind(trace::to_string(e.kind));
  if (e.kind == Kind::comm || e.kind == Kind::comm_wait) {
    const std::string& group = r.names.at(static_cast<std::size_t>(e.group));
    const std::string op(to_string(static_cast<CommOp>(e.op)));
    j["name"] =
        fmt::format("{}{} {}", e.kind == Kind::comm_wait ? "wait " : "", op, axis_of(group));
    j["cat"] = kind;
    j["tid"] = 1;
    args["op"] = op;
    args["group"] = group;
    args["axis"] = axis_of(group);
    args["wait_us"] = static_cast<double>(e.wait_ns) * 1e-3;
    if (e.kind == Kind::comm) {
      args["bytes"] = e.bytes;
      args["in_step_window"] = e.in_window;
      args["nonblocking"] = e.nonblocking;
    }
    if (e.peer >= 0) args["peer"] = e.peer;
  } else {
    const bool block = e.kind == Kind::block_forward || e.kind == Kind::block_backward;
    j["cat"] = e.kind == Kind::step ? "step" : block ? "block" : "phase";
    j["tid"] = 0;
    if (e.kind == Kind::step) {
      j["name"] = fmt::format("step {}", e.step + 1);
    } else if (block) {
      j["name"] = fmt::format("block {} {}", e.block,
                              e.kind == Kind::block_forward ? "forward" : "backward");
      args["block"] = e.block;
    } else {
      j["name"] = kind;
    }
    if (e.microbatch >= 0) args["microbatch"] = e.microbatch;
    if (e.chunk >= 0) args["chunk"] = e.chunk;
  }
  j["args"] = std::move(args);
  return j;
}

nlohmann::json metadata(const char* what, int pid, int tid, const std::string& name) {
  return {{"ph", "M"}, {"name", what}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}

// Where rank r's times start: rank 0's clock reading for the ranks on its host (one
// CLOCK_MONOTONIC), the rank's own reading after the barrier elsewhere.
std::int64_t origin_of(const std::vector<RankTrace>& ranks, std::size_t r) {
  return ranks[r].host == ranks[0].host ? ranks[0].t0_ns : ranks[r].t0_ns;
}

nlohmann::json clock_note(const std::vector<RankTrace>& ranks) {
  std::int64_t lo = ranks[0].t0_ns, hi = ranks[0].t0_ns, same = 0;
  for (const RankTrace& r : ranks) {
    if (r.host != ranks[0].host) continue;
    ++same;
    lo = std::min(lo, r.t0_ns);
    hi = std::max(hi, r.t0_ns);
  }
  return {{"clock", "CLOCK_MONOTONIC"},
          {"ranks_on_rank0_host", same},
          {"other_hosts_aligned_by", "the clock read after a world barrier"},
          {"barrier_exit_skew_us", static_cast<double>(hi - lo) * 1e-3}};
}

// The whole file: metadata, every rank's events, and under "meshtrain" the counters' bytes per
// group and step window and the dropped-event counts (viewers ignore unknown top-level keys).
nlohmann::json chrome_trace(const std::vector<RankTrace>& ranks, const MeshShape& shape) {
  nlohmann::json events = nlohmann::json::array();
  nlohmann::json counters = nlohmann::json::array();
  nlohmann::json dropped = nlohmann::json::object();
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const int pid = static_cast<int>(r);
    const RankTrace& rank = ranks[r];
    const MeshCoords c = shape.coords_of(pid);
    events.push_back(
        metadata("process_name", pid, 0,
                 fmt::format("rank {} (pp {}, dp {}, cp {}, tp {})", pid, c.pp, c.dp, c.cp, c.tp)));
    events.push_back({{"ph", "M"},
                      {"name", "process_sort_index"},
                      {"pid", pid},
                      {"args", {{"sort_index", pid}}}});
    events.push_back(metadata("thread_name", pid, 0, "phases"));
    events.push_back(metadata("thread_name", pid, 1, "comm"));
    const std::int64_t origin = origin_of(ranks, r);
    for (const Event& e : rank.events) events.push_back(to_json(e, rank, pid, origin));
    for (const RankTrace::Window& w : rank.windows) {
      nlohmann::json bytes = nlohmann::json::object();
      for (std::size_t g = 0; g < w.bytes.size(); ++g) {
        if (w.bytes[g] != 0) bytes[rank.names.at(g)] = w.bytes[g];
      }
      counters.push_back({{"rank", pid}, {"step", w.step + 1}, {"bytes", bytes}});
    }
    dropped[std::to_string(pid)] = rank.dropped;
    if (rank.dropped > 0 && !rank.events.empty()) {
      events.push_back({{"ph", "i"},
                        {"s", "p"},
                        {"pid", pid},
                        {"tid", 0},
                        {"name", fmt::format("trace buffer full: dropped {} events", rank.dropped)},
                        {"ts", static_cast<double>(rank.events.back().end_ns - origin) * 1e-3}});
    }
  }
  return {{"traceEvents", events},
          {"displayTimeUnit", "ms"},
          {"otherData", clock_note(ranks)},
          {"meshtrain", {{"window_comm_bytes", counters}, {"dropped_events", dropped}}}};
}

}  // namespace

StepTrace::StepTrace(std::string path, std::int64_t steps, bool log, const TraceObserver& comm)
    : path_(std::move(path)), steps_(steps), log_(log), comm_(comm) {}

StepTrace::~StepTrace() {
  if (on()) trace::reset();
}

void StepTrace::start(ProcessGroup& world) {
  if (!on()) return;
  trace::reset();
  world.barrier();
  t0_ns_ = trace::now_ns();
}

void StepTrace::begin_step(std::int64_t step) {
  if (!on()) return;
  if (first_step_ < 0) first_step_ = step;
  step_ = step;
  recording_ = step < first_step_ + steps_;
  if (!recording_) return;
  trace::set_step(static_cast<std::int32_t>(step));
  trace::start(kCapacity);
  step_start_ns_ = trace::now_ns();
}

void StepTrace::open_window() {
  if (!recording_) return;
  window_start_ = comm_.counted_bytes();
  trace::set_window(true);
}

void StepTrace::close_window() {
  if (!recording_) return;
  trace::set_window(false);
  Window w{.step = step_, .end_ns = trace::now_ns(), .bytes = comm_.counted_bytes()};
  for (std::size_t g = 0; g < std::min(w.bytes.size(), window_start_.size()); ++g) {
    w.bytes[g] -= window_start_[g];
  }
  windows_.push_back(std::move(w));
}

void StepTrace::end_step() {
  if (!recording_) return;
  Event e;
  e.kind = Kind::step;
  e.start_ns = step_start_ns_;
  e.end_ns = trace::now_ns();
  trace::record(e);
  trace::stop();
  recording_ = false;
}

void StepTrace::write(ProcessGroup& world, const MeshShape& shape) {
  if (!on()) return;
  trace::stop();  // the gather below is not part of the trace
  Blob mine;
  const std::vector<Event>& events = trace::events();
  for (std::int64_t v :
       {t0_ns_, host_hash(), trace::dropped(), static_cast<std::int64_t>(events.size()),
        static_cast<std::int64_t>(windows_.size())}) {
    mine.put(v);
  }
  mine.put(events.data(), events.size() * sizeof(Event));
  for (const Window& w : windows_) {
    mine.put(w.step);
    mine.put(w.end_ns);
    mine.put(static_cast<std::int64_t>(w.bytes.size()));
    mine.put(w.bytes.data(), w.bytes.size() * sizeof(std::int64_t));
  }
  std::string names;
  for (const std::string& n : comm_.group_names()) names += (names.empty() ? "" : "\n") + n;
  mine.put(names.data(), names.size());

  // Every rank's buffer reaches rank 0 (one broadcast per rank over the world).
  std::vector<RankTrace> ranks;
  for (int root = 0; root < world.size(); ++root) {
    std::int64_t n = static_cast<std::int64_t>(mine.bytes.size());
    world.broadcast(std::as_writable_bytes(std::span<std::int64_t>(&n, 1)), root);
    std::vector<std::byte> bytes = root == world.rank() ? mine.bytes : std::vector<std::byte>();
    bytes.resize(static_cast<std::size_t>(n));
    world.broadcast(bytes, root);
    if (world.rank() == 0) ranks.push_back(parse(bytes));
  }
  if (world.rank() != 0) return;
  const std::string text = chrome_trace(ranks, shape).dump();
  StagedFile(path_, std::as_bytes(std::span<const char>(text))).commit();
  if (log_) fmt::print("wrote the trace of {} rank(s) to {}\n", ranks.size(), path_);
}

}  // namespace meshtrain
