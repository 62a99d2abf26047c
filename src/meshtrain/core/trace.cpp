#include "meshtrain/core/trace.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace meshtrain::trace {
namespace {

struct Recorder {
  std::vector<Event> events;
  std::size_t capacity = 0;
  std::int64_t dropped = 0;
  std::int32_t step = -1;
  bool window = false;
  std::thread::id thread;
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
