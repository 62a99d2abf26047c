#include "meshtrain/comm/shared_window.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <new>
#include <thread>
#include <utility>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

// 256 KiB of floats: small enough that a 4 MiB bucket splits into 16 claimable pieces (both
// members share the work), large enough that a claim's atomic costs nothing next to it.
constexpr std::size_t kChunk = std::size_t{64} << 10;
constexpr std::size_t kPage = 4096;

std::size_t round_up(std::size_t bytes, std::size_t to) { return (bytes + to - 1) / to * to; }

void check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw CommError(fmt::format("{} failed: {}", what, std::string_view(text, length)));
}

// A float is NaN or ±inf exactly when its 8 exponent bits are all ones.
constexpr std::uint32_t kExponent = 0x7f800000u;

std::uint32_t bits_of(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

// True when x[0, n) holds no NaN or ±inf: the largest exponent field, vectorised as integer
// max with no branch per element (as kernels::all_finite, which comm does not link:
// docs/architecture.md).
bool block_finite(const float* x, std::size_t n) noexcept {
  std::uint32_t worst = 0;
  for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, bits_of(x[i]) & kExponent);
  return worst != kExponent;
}

// Lowers `line` to x[i]'s (index << 32 | bits) for the first non-finite x[i], i in [0, n), whose
// index in its buffer is at + i; one vectorised read pass when there is none, the common case.
void note_first_non_finite(std::atomic<std::uint64_t>& line, const float* x, std::size_t n,
                           std::size_t at) {
  if (block_finite(x, n)) [[likely]]
    return;
  std::size_t i = 0;
  while (i < n && (bits_of(x[i]) & kExponent) != kExponent) ++i;
  const std::uint64_t mine = (std::uint64_t{at + i} << 32) | bits_of(x[i]);
  std::uint64_t seen = line.load(std::memory_order_relaxed);
  while (mine < seen && !line.compare_exchange_weak(seen, mine, std::memory_order_relaxed)) {
  }
}

// Out = scale · (Σ_m buffers[m][i] in member order), stored into every buffer, for i in
// [begin, end): the f32 sum, then one multiply (no FMA can form), bitwise a sum followed by a
// separate scaling pass. Each block of the inputs is checked for non-finite values before it
// is overwritten (a second read of the block, from L1); member m's first one lowers
// non_finite[m]. The 2-member case is the one the dp = 2 runs take; its loop vectorises
// without a scratch.
void sum_into_all(const std::vector<float*>& buffers, std::size_t begin, std::size_t end,
                  float scale, std::atomic<std::uint64_t>* const* non_finite) {
  constexpr std::size_t kBlock = 512;
  if (buffers.size() == 2) {
    float* __restrict a = buffers[0];
    float* __restrict b = buffers[1];
    for (std::size_t at = begin; at < end; at += kBlock) {
      const std::size_t n = std::min(kBlock, end - at);
      note_first_non_finite(*non_finite[0], a + at, n, at);
      note_first_non_finite(*non_finite[1], b + at, n, at);
      for (std::size_t i = at; i < at + n; ++i) {
        const float s = (a[i] + b[i]) * scale;
        a[i] = s;
        b[i] = s;
      }
    }
    return;
  }
  alignas(64) float acc[kBlock];
  for (std::size_t at = begin; at < end; at += kBlock) {
    const std::size_t n = std::min(kBlock, end - at);
    for (std::size_t m = 0; m < buffers.size(); ++m) {
      note_first_non_finite(*non_finite[m], buffers[m] + at, n, at);
    }
    std::memcpy(acc, buffers[0] + at, n * sizeof(float));
    for (std::size_t m = 1; m < buffers.size(); ++m) {
      const float* __restrict in = buffers[m] + at;
      for (std::size_t i = 0; i < n; ++i) acc[i] += in[i];
    }
    for (std::size_t i = 0; i < n; ++i) acc[i] *= scale;
    for (float* buffer : buffers) std::memcpy(buffer + at, acc, n * sizeof(float));
  }
}

// Spins briefly (a peer on another core is usually close behind), then yields the core, then
// sleeps: with more ranks than cores (the dp = 4 tests on 2 cores) a spinning waiter would
// take the time the member it waits for needs. A hang is the watchdog's to report: the wait
// runs inside a watched request (ProcessGroup::iall_reduce_sum).
class Backoff {
 public:
  void pause() {
    ++rounds_;
    if (rounds_ < 64) return;
    if (rounds_ < 4096) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

 private:
  int rounds_ = 0;
};

}  // namespace

class SharedAllReduce final : public CommRequest {
 public:
  // `last`: this member's post completed the set; its first test() then claims nothing.
  SharedAllReduce(const SharedWindow& window, std::uint64_t epoch, float scale, bool last)
      : window_(window), epoch_(epoch), scale_(scale), pause_(last) {}
  ~SharedAllReduce() override { wait(); }
  void wait() override {
    Backoff backoff;
    while (!done_ && !(done_ = window_.advance(epoch_, scale_, /*claim=*/true))) backoff.pause();
  }
  bool test() override {
    const bool claim = !std::exchange(pause_, false);
    return done_ || (done_ = window_.advance(epoch_, scale_, claim));
  }
  std::optional<NonFiniteInput> first_non_finite_input() const override {
    MT_CHECK(done_, "first_non_finite_input: the all-reduce has not completed; wait() first");
    MT_CHECK(window_.epoch_ == epoch_,
             "first_non_finite_input: this member posted the buffer again since this request");
    return window_.first_non_finite_input();
  }

 private:
  const SharedWindow& window_;
  std::uint64_t epoch_;
  float scale_;
  bool pause_;
  bool done_ = false;
};

SharedWindow::SharedWindow(MPI_Comm node_comm, std::size_t count) : count_(count) {
  check(MPI_Comm_rank(node_comm, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(node_comm, &size_), "MPI_Comm_size");
  if (count >= (std::size_t{1} << 32)) {
    throw CommError(
        fmt::format("a shared-memory window of {} floats per member: at most 2^32 − 1 "
                    "(non-finite inputs are noted by 32-bit index)",
                    count));
  }
  const std::size_t control = sizeof(Line) * static_cast<std::size_t>(kCounterLines + 2 * size_);
  const std::size_t data = round_up(std::max<std::size_t>(count, 1) * sizeof(float), kPage);
  // Member 0's part holds the control words, a page of its own ahead of its buffer. Each part
  // is allocated apart (alloc_shared_noncontig), so a member's pages are first touched — and
  // placed — by that member.
  // + 64: OpenMPI does not align the parts; each is aligned up inside its own (the offset
  // within a page is the same in every process that maps it).
  const std::size_t mine = (rank_ == 0 ? round_up(control, kPage) : 0) + data + 64;
  MPI_Info info = MPI_INFO_NULL;
  check(MPI_Info_create(&info), "MPI_Info_create");
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  void* base = nullptr;
  const int code =
      MPI_Win_allocate_shared(static_cast<MPI_Aint>(mine), 1, info, node_comm, &base, &win_);
  MPI_Info_free(&info);
  check(code, "MPI_Win_allocate_shared");
  buffers_.resize(static_cast<std::size_t>(size_));
  for (int m = 0; m < size_; ++m) {
    MPI_Aint bytes = 0;
    int unit = 0;
    void* part = nullptr;
    check(MPI_Win_shared_query(win_, m, &bytes, &unit, &part), "MPI_Win_shared_query");
    auto* at =
        static_cast<std::byte*>(part) + (64 - reinterpret_cast<std::uintptr_t>(part) % 64) % 64;
    if (m == 0) {
      control_ = reinterpret_cast<Line*>(at);
      at += round_up(control, kPage);
    }
    buffers_[static_cast<std::size_t>(m)] = reinterpret_cast<float*>(at);
  }
  for (int m = 0; m < size_; ++m) non_finite_lines_.push_back(&non_finite(m).value);
  std::memset(buffers_[static_cast<std::size_t>(rank_)], 0, data);
  if (rank_ == 0) {
    for (int i = 0; i < kCounterLines + size_; ++i) new (&control_[i]) Line{0};
    for (int m = 0; m < size_; ++m) new (&non_finite(m)) Line{kAllFinite};
  }
  // Nobody reads a control word or posts before member 0 has set them.
  check(MPI_Barrier(node_comm), "MPI_Barrier");
}

SharedWindow::~SharedWindow() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized == 0 && std::uncaught_exceptions() == 0) MPI_Win_free(&win_);
}

std::size_t SharedWindow::chunks() const noexcept {
  return std::max<std::size_t>(1, (count_ + kChunk - 1) / kChunk);
}

void SharedWindow::reduce_chunk(std::size_t chunk, float scale) const noexcept {
  const std::size_t begin = chunk * kChunk;
  sum_into_all(buffers_, begin, std::min(count_, begin + kChunk), scale, non_finite_lines_.data());
}

bool SharedWindow::advance(std::uint64_t epoch, float scale, bool claim) const noexcept {
  const std::uint64_t per_post = chunks();
  const std::uint64_t through = epoch * per_post;  // tickets of every post up to this one
  if (done().value.load(std::memory_order_acquire) >= through) return true;
  if (!claim) return false;
  for (int m = 0; m < size_; ++m) {
    if (posted(m).value.load(std::memory_order_acquire) < epoch) return false;
  }
  std::uint64_t ticket = claimed().value.load(std::memory_order_relaxed);
  while (ticket < through) {
    if (claimed().value.compare_exchange_weak(ticket, ticket + 1, std::memory_order_acq_rel,
                                              std::memory_order_relaxed)) {
      reduce_chunk(static_cast<std::size_t>(ticket - (epoch - 1) * per_post), scale);
      done().value.fetch_add(1, std::memory_order_release);
      ++ticket;
    }
  }
  return done().value.load(std::memory_order_acquire) >= through;
}

std::optional<NonFiniteInput> SharedWindow::first_non_finite_input() const noexcept {
  // Every chunk's note was made before its done() increment (release), which the completed
  // request has read (acquire); the next post of this member resets the line.
  const std::uint64_t packed = non_finite(rank_).value.load(std::memory_order_relaxed);
  if (packed == kAllFinite) return std::nullopt;
  const auto bits = static_cast<std::uint32_t>(packed);
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return NonFiniteInput{.element = static_cast<std::int64_t>(packed >> 32), .value = value};
}

std::unique_ptr<CommRequest> SharedWindow::iall_reduce_sum(float scale) {
  if (done().value.load(std::memory_order_acquire) < epoch_ * chunks()) {
    // Posting now would let peers sum this buffer while the previous sum still writes it.
    throw Error(
        "a shared-memory all-reduce was posted before this rank's previous one on the same "
        "buffer completed; wait for (or test until done) the previous request first");
  }
  ++epoch_;
  // No peer reads this line before the post below publishes it (release), and none can
  // still be summing the previous post's chunks: they were all done (checked above).
  non_finite(rank_).value.store(kAllFinite, std::memory_order_relaxed);
  // Arrive before publishing the post: post e − 1 completed only after every member's post
  // e − 1 was published (acquired by whoever summed, released on through done()), so every
  // arrival of e − 1 happens before any of e, and exactly one member's makes it e · size.
  const std::uint64_t before = arrivals().value.fetch_add(1, std::memory_order_relaxed);
  const bool last = size_ > 1 && before + 1 == epoch_ * static_cast<std::uint64_t>(size_);
  posted(rank_).value.store(epoch_, std::memory_order_release);
  return std::make_unique<SharedAllReduce>(*this, epoch_, scale, last);
}

}  // namespace meshtrain
