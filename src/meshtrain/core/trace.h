// src/meshtrain/core/trace.h
//
// The whole-step trace recorder (`meshtrain train --trace`, docs/tracing.md): one process-wide
// buffer of timed events — the step's phases (data, forward/backward per micro-batch and chunk,
// transformer blocks, gradient reduction, optimizer, evaluation, checkpoint) and every
// ProcessGroup operation with its group, bytes and wait (recorded by monitor/trace_observer.h,
// which numbers the groups). train/step_trace.h turns the buffers of all ranks into one
// Chrome-trace file.
//
// Process-wide, and so in core/: the phases are recorded from deep inside the model (each
// transformer block) and the stage runner; handing a recorder to every layer call for an
// off-by-default diagnostic would change every forward/backward signature, and a Scope must
// cost one load when off.
//
// Off unless start() was called: every hook then costs one relaxed atomic load and a branch.
// Only the thread that called start() records (the training loop); other threads (the
// watchdog, the checkpoint writer) are ignored, so the buffer needs no lock. The buffer is
// bounded: once `capacity` events are held, further ones are counted in dropped() and lost.
// Times are CLOCK_MONOTONIC nanoseconds (std::chrono::steady_clock on Linux).
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>
#include <vector>

namespace meshtrain::trace {

/// What an event is. Phases and blocks sit on the rank's main track, operations on its comm one.
enum class Kind : std::uint8_t {
  step,             // one optimizer step: its phases, evaluation and checkpoint
  data,             // reading one micro-batch's tokens and targets
  forward,          // F of (micro-batch, chunk)
  backward,         // B of (micro-batch, chunk), weight gradients included
  backward_input,   // zero-bubble B: the input gradient only
  backward_weight,  // zero-bubble W: the deferred weight gradients
  grad_reduce,      // the gradient reduction over the replicas (and tied embeddings)
  grad_norm,        // the loss reduction, the fp16 overflow check and the gradient norm
  optimizer,        // the AdamW update
  eval,             // evaluation on the val split
  checkpoint,       // saving a checkpoint
  block_forward,    // one transformer block's forward (inside a forward or eval)
  block_backward,   // one transformer block's backward
  comm,             // a ProcessGroup operation (blocking, or the posting of a non-blocking one)
  comm_wait,        // the wait() of a non-blocking operation, when it blocked
};
inline constexpr std::size_t kNumKinds = 15;
std::string_view to_string(Kind kind);

/// One event; POD, so the ranks exchange buffers as bytes (every rank runs the same binary).
struct Event {
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::int64_t bytes = 0;    // comm: the message size the byte counters count; else 0
  std::int64_t wait_ns = 0;  // comm: time blocked (see docs/tracing.md); else 0
  std::int32_t step = -1;    // 0-based step being run, -1 before the first
  std::int32_t group = -1;   // comm: TraceObserver's index of the group (group_names())
  std::int32_t peer = -1;    // comm, point to point: the peer's world rank
  std::int16_t microbatch = -1, chunk = -1, block = -1;
  Kind kind = Kind::step;
  std::uint8_t op = 0;       // comm: CommOp
  bool in_window = false;    // comm: inside the step's metrics window (set_window)
  bool nonblocking = false;  // comm: the posting of isend / irecv / iall_gather
};

namespace detail {
inline std::atomic<bool> on{false};
}  // namespace detail

/// True while recording (start() called, stop() not); the hooks' fast path.
inline bool enabled() noexcept { return detail::on.load(std::memory_order_relaxed); }

/// Starts recording on the calling thread into a buffer of at most `capacity` events (the
/// buffer keeps what it already holds).
void start(std::size_t capacity);
/// Pauses recording (the buffer is kept); start() resumes it.
void stop();
/// Drops every event and the dropped count, and stops.
void reset();
/// The step stamped on events from now on, and whether the metrics window is open.
void set_step(std::int32_t step);
void set_window(bool open);

std::int64_t now_ns() noexcept;

/// Appends `e` when recording on the recording thread; returns its index, or -1.
std::int64_t record(const Event& e);
/// Adds a wait to event `index` (a non-blocking operation's record); no-op for -1.
void add_wait(std::int64_t index, std::int64_t wait_ns);
const std::vector<Event>& events();
std::int64_t dropped();

/// Records [construction, destruction) as one event of `kind` when recording.
class Scope {
 public:
  explicit Scope(Kind kind, int microbatch = -1, int chunk = -1, int block = -1) noexcept {
    if (!enabled()) return;
    e_.kind = kind;
    e_.microbatch = static_cast<std::int16_t>(microbatch);
    e_.chunk = static_cast<std::int16_t>(chunk);
    e_.block = static_cast<std::int16_t>(block);
    e_.start_ns = now_ns();
    active_ = true;
  }
  ~Scope() {
    if (!active_) return;
    e_.end_ns = now_ns();
    record(e_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Event e_;
  bool active_ = false;
};

}  // namespace meshtrain::trace
