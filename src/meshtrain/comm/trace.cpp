#include "meshtrain/comm/trace.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "meshtrain/comm/process_group.h"

namespace meshtrain::trace {
namespace {

struct Recorder {
  std::vector<Event> events;
  std::size_t capacity = 0;
  std::int64_t dropped = 0;
  std::int32_t step = -1;
  bool window = false;
  std::thread::id thread;
  // Groups are made and destroyed on any thread (tests build meshes in threads): locked.
  std::mutex groups_mutex;
  std::vector<std::string> names;
  std::map<std::string, std::int32_t, std::less<>> ids;
  std::vector<const ProcessGroup*> live;
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

}  // namespace

std::string_view to_string(Kind kind) {
  static constexpr std::string_view kNames[kNumKinds] = {
      "step",           "data",      "forward",   "backward", "backward_input", "backward_weight",
      "grad_reduce",    "grad_norm", "optimizer", "eval",     "checkpoint",     "block_forward",
      "block_backward", "comm",      "comm_wait"};
  const auto i = static_cast<std::size_t>(kind);
  return i < kNumKinds ? kNames[i] : "unknown";
}

void start(std::size_t capacity) {
  Recorder& r = recorder();
  r.capacity = capacity;
  r.events.reserve(std::min<std::size_t>(capacity, 1 << 16));
  r.thread = std::this_thread::get_id();
  detail::on.store(true, std::memory_order_relaxed);
}

void stop() { detail::on.store(false, std::memory_order_relaxed); }

void reset() {
  stop();
  Recorder& r = recorder();
  r.events.clear();
  r.dropped = 0;
  r.step = -1;
  r.window = false;
}

void set_step(std::int32_t step) { recorder().step = step; }
void set_window(bool open) { recorder().window = open; }

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::int32_t group_id(const std::string& name) {
  Recorder& r = recorder();
  const std::lock_guard lock(r.groups_mutex);
  const auto [it, added] = r.ids.try_emplace(name, static_cast<std::int32_t>(r.names.size()));
  if (added) r.names.push_back(name);
  return it->second;
}

const std::vector<std::string>& group_names() { return recorder().names; }

void register_group(const ProcessGroup* group) {
  Recorder& r = recorder();
  const std::lock_guard lock(r.groups_mutex);
  r.live.push_back(group);
}

void unregister_group(const ProcessGroup* group) {
  Recorder& r = recorder();
  const std::lock_guard lock(r.groups_mutex);
  std::erase(r.live, group);
}

std::vector<std::int64_t> counted_bytes() {
  Recorder& r = recorder();
  const std::lock_guard lock(r.groups_mutex);
  std::vector<std::int64_t> bytes(r.names.size(), 0);
  for (const ProcessGroup* g : r.live) {
    const std::int32_t id = r.ids.find(g->name())->second;
    for (std::size_t op = 0; op < kNumCommOps; ++op) {
      bytes[static_cast<std::size_t>(id)] += g->counter(static_cast<CommOp>(op)).bytes;
    }
  }
  return bytes;
}

std::int64_t record(const Event& e) {
  Recorder& r = recorder();
  if (!enabled() || std::this_thread::get_id() != r.thread) return -1;
  if (r.events.size() >= r.capacity) {
    ++r.dropped;
    return -1;
  }
  r.events.push_back(e);
  r.events.back().step = r.step;
  r.events.back().in_window = r.window;
  return static_cast<std::int64_t>(r.events.size()) - 1;
}

void add_wait(std::int64_t index, std::int64_t wait_ns) {
  std::vector<Event>& events = recorder().events;
  if (index < 0 || static_cast<std::size_t>(index) >= events.size()) return;
  events[static_cast<std::size_t>(index)].wait_ns += wait_ns;
}

const std::vector<Event>& events() { return recorder().events; }
std::int64_t dropped() { return recorder().dropped; }

}  // namespace meshtrain::trace
