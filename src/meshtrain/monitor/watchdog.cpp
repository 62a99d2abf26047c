#include "meshtrain/monitor/watchdog.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>
#include <ranges>
#include <thread>

#include "meshtrain/core/error.h"
#include "meshtrain/monitor/progress_board.h"
#include "meshtrain/monitor/watchdog_dirs.h"

namespace meshtrain {
namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

// Groups by key (for members and names in reports) and interned names (for the recorder,
// whose records outlive their groups). Touched when groups are made and at expiry, never on
// the hot path.
struct Registry {
  std::mutex mutex;
  std::vector<std::string> names;  // by name_id
  std::map<std::string, std::uint32_t> name_ids;
  std::map<std::string, std::uint32_t> instances;  // groups of that name created so far
  struct Group {
    std::string name;
    std::vector<int> world_ranks;
  };
  std::map<std::uint64_t, Group> groups;  // alive, by key
};

}  // namespace

// The watchdog's groups and progress records, and while it runs its thread and recorder; all
// but the registry, the board's records and the recorder pointer are touched by start/stop
// (main thread, nothing in flight) and the watchdog thread.
struct Watchdog::State {
  Registry registry;
  progress::LocalBoard board;
  std::atomic<FlightRecorder*> recorder{nullptr};
  WatchdogOptions options;
  std::string dir;
  int world_rank = 0;
  // Host name of every world rank (gethostname at start, "" when unknown): peers on another
  // host publish their progress in that host's directory, which this one cannot read.
  std::vector<std::string> hosts;
  std::int64_t start_ns = 0;
  std::thread thread;
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;  // ~Watchdog stops the thread before the State goes
};

namespace {

using State = Watchdog::State;

std::string group_name_of(State& s, std::uint32_t name_id) {
  const std::lock_guard lock(s.registry.mutex);
  return name_id < s.registry.names.size() ? s.registry.names[name_id] : std::string("?");
}

std::string dump_file(const State& s) {
  return fmt::format("{}/flight_recorder.rank{}.txt", s.dir, s.world_rank);
}
std::string board_file(const std::string& dir, int world_rank) {
  return fmt::format("{}/rank{}.progress", dir, world_rank);
}

std::string host_of(const State& s, int world_rank) {
  const auto i = static_cast<std::size_t>(world_rank);
  return world_rank >= 0 && i < s.hosts.size() ? s.hosts[i] : std::string();
}

std::string op_name(std::uint32_t op_plus_one) {
  return std::string(to_string(static_cast<CommOp>(op_plus_one - 1)));
}

std::string describe(const watchdog::OpInfo& op, const std::string& group) {
  if (op.peer >= 0) {
    const bool send = op.op == CommOp::send;
    return fmt::format("{} {} world rank {} on {} ({} #{} {} that peer, {} bytes)",
                       to_string(op.op), send ? "to" : "from", op.peer, group, to_string(op.op),
                       op.seq, send ? "to" : "from", op.bytes);
  }
  return fmt::format("{} on {} (collective #{} of the group, {} bytes)", to_string(op.op), group,
                     op.seq, op.bytes);
}

// Writes the recorder, oldest first, one operation a line; "" or why it failed.
std::string write_dump(State& s, std::string_view why) {
  const FlightRecorder* r = s.recorder.load(kRelaxed);
  if (r == nullptr) return "no recorder";
  const std::vector<FlightRecord> records = r->snapshot();
  std::FILE* f = std::fopen(dump_file(s).c_str(), "w");
  if (f == nullptr) return fmt::format("cannot write {}", dump_file(s));
  const std::int64_t now = watchdog::now_ns();
  fmt::print(f,
             "# meshtrain flight recorder of world rank {} (pid {}): the last {} of {} "
             "operations (parallel.flight_recorder_size = {}), {}\n"
             "# times in s since the watchdog started; duration of an operation in flight = "
             "until this dump (t = {:.6f})\n"
             "# id op group seq peer bytes start_s duration_s state\n",
             s.world_rank, ::getpid(), records.size(), r->recorded(), r->capacity(), why,
             static_cast<double>(now - s.start_ns) * 1e-9);
  for (const FlightRecord& rec : records) {
    const std::int64_t end = rec.end_ns != 0 ? rec.end_ns : now;
    fmt::print(f, "{} {} {} {} {} {} {:.6f} {:.6f} {}\n", rec.id, to_string(rec.op),
               group_name_of(s, rec.group), rec.seq,
               rec.peer >= 0 ? std::to_string(rec.peer) : std::string("-"), rec.bytes,
               static_cast<double>(rec.start_ns - s.start_ns) * 1e-9,
               static_cast<double>(end - rec.start_ns) * 1e-9,
               rec.end_ns != 0 ? "completed" : "in_flight");
  }
  const bool ok = std::fclose(f) == 0;
  return ok ? "" : fmt::format("cannot write {}", dump_file(s));
}

std::chrono::nanoseconds tick_of(double timeout_s) {
  const double tick_s = std::min(timeout_s / 4.0, 0.5);
  return std::chrono::nanoseconds(static_cast<std::int64_t>(tick_s * 1e9));
}

// This rank's watchdog thread is running: see progress::Board::heartbeat_ns.
void beat(State& s) noexcept { s.board.get().heartbeat_ns.store(watchdog::now_ns(), kRelaxed); }

// The world ranks the timed-out operation waits for (the group's members, or the one peer of a
// send/recv), this rank included.
std::vector<int> members_of(State& s, const watchdog::OpInfo& op) {
  if (op.peer >= 0) return {op.peer};
  Registry& reg = s.registry;
  const std::lock_guard lock(reg.mutex);
  const auto it = reg.groups.find(op.group.key);
  return it != reg.groups.end() ? it->second.world_ranks : std::vector<int>{};
}

// Peers (world rank → seconds since their last heartbeat) whose watchdog thread has stopped
// running: a process stopped by SIGSTOP or a debugger, or starved of CPU. A peer beats every
// tick even while blocked in MPI. One whose beat is older than two ticks is watched until its
// beat would be `stale` old (4 ticks, at least 1 s) and called frozen only if it never beat in
// between, so a thread that was merely scheduled late is not blamed. Waits at most `stale`.
std::map<int, double> frozen_peers(State& s, const std::vector<int>& peers) {
  const std::int64_t tick = tick_of(s.options.timeout_s).count();
  const std::int64_t stale = std::max<std::int64_t>(4 * tick, 1'000'000'000);
  std::map<int, std::int64_t> late;  // peer → the beat seen
  std::int64_t decide_at = 0;
  const std::int64_t now = watchdog::now_ns();
  for (const int peer : peers) {
    if (peer == s.world_rank) continue;
    const auto view = progress::read_peer(board_file(s.dir, peer), 0, false);
    if (!view || view->stopped || view->heartbeat_ns == 0) continue;
    if (now - view->heartbeat_ns <= 2 * tick) continue;
    late[peer] = view->heartbeat_ns;
    decide_at = std::max(decide_at, view->heartbeat_ns + stale);
  }
  while (!late.empty() && watchdog::now_ns() < decide_at) {
    beat(s);  // this rank's own peers may be judging it meanwhile
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::map<int, double> frozen;
  for (const auto& [peer, seen] : late) {
    const auto view = progress::read_peer(board_file(s.dir, peer), 0, false);
    if (view && !view->stopped && view->heartbeat_ns == seen) {
      frozen[peer] = static_cast<double>(watchdog::now_ns() - seen) * 1e-9;
    }
  }
  return frozen;
}

// One line per peer of the timed-out operation, and the peers that have not arrived. Reading a
// peer's board also asks it to dump its recorder (when `ask_dump`); a frozen peer cannot.
std::string report_peers(State& s, const watchdog::OpInfo& op, bool ask_dump,
                         const std::map<int, double>& frozen, std::vector<int>& missing,
                         std::vector<int>& unreachable, std::vector<int>& asked) {
  std::string out;
  for (const int peer : members_of(s, op)) {
    if (peer == s.world_rank) continue;
    const auto view = progress::read_peer(board_file(s.dir, peer), op.group.key, ask_dump);
    const std::string host = host_of(s, peer);
    if (!view && !host.empty() && host != host_of(s, s.world_rank)) {
      // Its board lives on its own host; MPI, the only channel to it, is the stuck one.
      out += fmt::format(
          "\n[watchdog]   world rank {} (host {}): no report — on another host, its progress "
          "is not readable from here (not reached); if the link to {} or that host failed, "
          "it is a rank behind it",
          peer, host, host);
      unreachable.push_back(peer);
      continue;
    }
    if (!view) {
      out += fmt::format(
          "\n[watchdog]   world rank {}: no progress file in {} (its process is gone, or it "
          "could not create the file)",
          peer, s.dir);
      missing.push_back(peer);
      continue;
    }
    const auto stopped_for = frozen.find(peer);
    if (!view->stopped && stopped_for == frozen.end()) asked.push_back(peer);
    std::string now;
    if (view->stopped) {
      now =
          "it has left training (its watchdog stopped: finished, or failed on its own — see "
          "its message)";
    } else if (view->current_op == 0) {
      now =
          "now not in a communication operation (computing, sleeping or stuck outside "
          "communication)";
    } else {
      now = fmt::format(
          "now blocked in {}{} on {} #{}", op_name(view->current_op),
          view->current_peer >= 0 ? fmt::format(" with world rank {}", view->current_peer)
                                  : std::string(),
          view->current_group.empty() ? "another group" : view->current_group, view->current_seq);
    }
    if (stopped_for != frozen.end()) {
      now += fmt::format(
          " — but frozen: its process has not run for {:.1f} s (stopped by a signal such as "
          "SIGSTOP, held in a debugger, or starved of CPU)",
          stopped_for->second);
    }
    if (op.peer >= 0) {
      // The matching operation is the other direction, with this rank, on the same group.
      const auto want =
          static_cast<std::uint32_t>(op.op == CommOp::send ? CommOp::recv : CommOp::send) + 1;
      const bool matched = !view->stopped && view->current_op == want &&
                           view->current_peer == s.world_rank && view->current_key == op.group.key;
      if (!matched) missing.push_back(peer);
      out += fmt::format("\n[watchdog]   world rank {}: {}{}", peer, now,
                         matched ? " (the matching operation)" : "");
      continue;
    }
    if (!view->in_group) {
      out += fmt::format("\n[watchdog]   world rank {}: no record of this group; {}", peer, now);
      missing.push_back(peer);
    } else if (view->entered < op.seq) {
      out += fmt::format(
          "\n[watchdog]   world rank {}: has not reached collective #{} (last entered #{}, "
          "completed #{}); {}",
          peer, op.seq, view->entered, view->completed, now);
      missing.push_back(peer);
    } else {
      const bool same_call = view->current_op == static_cast<std::uint32_t>(op.op) + 1 &&
                             view->current_key == op.group.key && view->current_seq == op.seq;
      const bool other_call = !same_call && view->current_key == op.group.key &&
                              view->current_seq == op.seq && view->current_op != 0;
      out += fmt::format("\n[watchdog]   world rank {}: reached collective #{}; {}{}", peer, op.seq,
                         now,
                         other_call ? " — another operation under the same number: a rank "
                                      "skipped or reordered a collective "
                                      "(parallel.debug_collectives names the calls)"
                                    : "");
    }
  }
  return out;
}

[[noreturn]] void end_process() {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(kWatchdogExitCode);
}

void expire(State& s, const watchdog::OpInfo& op, double waited_s) {
  std::string group;
  {
    Registry& reg = s.registry;
    const std::lock_guard lock(reg.mutex);
    const auto it = reg.groups.find(op.group.key);
    if (it != reg.groups.end()) group = it->second.name;
  }
  if (group.empty()) group = group_name_of(s, op.group.name_id);
  const bool ask_dump = !s.options.on_expiry;
  std::vector<int> missing, unreachable, asked;
  std::string report = fmt::format(
      "[watchdog] world rank {}: {} has not completed after {:.3g} s (parallel.comm_timeout_s = "
      "{:g})",
      s.world_rank, describe(op, group), waited_s, s.options.timeout_s);
  const std::map<int, double> frozen = frozen_peers(s, members_of(s, op));
  report += report_peers(s, op, ask_dump, frozen, missing, unreachable, asked);
  std::string none = unreachable.empty() ? "none found (every peer has reached it)"
                                         : "none found among the peers it could read";
  if (!frozen.empty()) none += "; a frozen peer holds it up (below)";
  report +=
      fmt::format("\n[watchdog] not arrived: {}",
                  missing.empty() ? none : fmt::format("world rank {}", fmt::join(missing, ", ")));
  if (!frozen.empty()) {
    report += fmt::format(
        "\n[watchdog] frozen (not running, so the operation cannot complete): "
        "world rank {}",
        fmt::join(std::views::keys(frozen), ", "));
  }
  if (!unreachable.empty()) {
    report += fmt::format(
        "\n[watchdog] unreachable from host {} (on other hosts, no report): world rank {}",
        host_of(s, s.world_rank), fmt::join(unreachable, ", "));
  }
  const std::string failed = write_dump(s, "written when the watchdog expired");
  const FlightRecorder* r = s.recorder.load(kRelaxed);
  report += failed.empty()
                ? fmt::format(
                      "\n[watchdog] flight recorder (last {} operations of world rank {}): "
                      "{}{}",
                      r->capacity(), s.world_rank, dump_file(s),
                      asked.empty() ? "" : "; peers asked to dump theirs beside it")
                : fmt::format("\n[watchdog] flight recorder not written: {}", failed);
  if (s.options.on_expiry) {
    s.options.on_expiry(report);
    return;
  }
  fmt::print(stderr, "{}\n[watchdog] ending the job (exit code {})\n", report, kWatchdogExitCode);
  std::fflush(stderr);
  // Give the asked peers' watchdogs (they wake at least every 0.5 s) a moment to dump before
  // mpirun tears them down.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!asked.empty() && std::chrono::steady_clock::now() < until) {
    beat(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::erase_if(asked, [&](int peer) {
      const auto view = progress::read_peer(board_file(s.dir, peer), 0, false);
      return !view || view->dumped || view->stopped;
    });
  }
  end_process();
}

void run(State& s) {
  const auto tick = tick_of(s.options.timeout_s);
  const auto timeout_ns = static_cast<std::int64_t>(s.options.timeout_s * 1e9);
  std::int64_t reported_since = 0;
  std::unique_lock lock(s.mutex);
  while (!s.wake.wait_for(lock, tick, [&] { return s.stop; })) {
    beat(s);
    progress::Board& b = s.board.get();
    if (b.dump_requested.load(std::memory_order_acquire) != 0 && b.dumped.load(kRelaxed) == 0) {
      (void)write_dump(s, "written because a peer's operation timed out");
      b.dumped.store(1, std::memory_order_release);
    }
    const std::int64_t since = b.current_since_ns.load(std::memory_order_acquire);
    if (since == 0 || since == reported_since) continue;
    const std::int64_t waited = watchdog::now_ns() - since;
    if (waited < timeout_ns) continue;
    watchdog::OpInfo op;
    op.op = static_cast<CommOp>(b.current_op.load(kRelaxed) - 1);
    op.peer = b.current_peer.load(kRelaxed);
    op.group.key = b.current_key.load(kRelaxed);
    op.seq = b.current_seq.load(kRelaxed);
    op.bytes = b.current_bytes.load(kRelaxed);
    if (b.current_since_ns.load(std::memory_order_acquire) != since) continue;  // it moved on
    reported_since = since;
    expire(s, op, static_cast<double>(waited) * 1e-9);
  }
}

// Every world rank's host name, by world rank: one all_gather of kHostChars floats a rank (a
// byte a float, exact), at start while the network works.
std::vector<std::string> gather_hosts(ProcessGroup& world) {
  constexpr std::size_t kHostChars = 64;
  std::array<char, kHostChars> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) name[0] = '\0';
  std::vector<float> mine(kHostChars), all(kHostChars * static_cast<std::size_t>(world.size()));
  for (std::size_t i = 0; i < kHostChars; ++i) mine[i] = static_cast<unsigned char>(name[i]);
  world.all_gather(mine, all);
  const std::vector<int>& ranks = world.world_ranks();
  std::vector<std::string> hosts(static_cast<std::size_t>(*std::ranges::max_element(ranks) + 1));
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    std::string& host = hosts[static_cast<std::size_t>(ranks[r])];
    for (std::size_t i = 0; i < kHostChars && all[r * kHostChars + i] != 0.0F; ++i) {
      host += static_cast<char>(all[r * kHostChars + i]);
    }
  }
  return hosts;
}

}  // namespace

std::int64_t watchdog::now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Watchdog::Watchdog() : state_(std::make_unique<State>()) {}

Watchdog::~Watchdog() { stop(); }

watchdog::GroupHandle Watchdog::register_group(const std::string& name,
                                               const std::vector<int>& world_ranks) {
  Registry& reg = state_->registry;
  const std::lock_guard lock(reg.mutex);
  watchdog::GroupHandle g;
  auto [it, fresh] = reg.name_ids.try_emplace(name, static_cast<std::uint32_t>(reg.names.size()));
  if (fresh) reg.names.push_back(name);
  g.name_id = it->second;
  g.key = progress::group_key(name, reg.instances[name]++);
  g.slot = state_->board.claim_slot(g.key, name);
  reg.groups[g.key] = {name, world_ranks};
  return g;
}

void Watchdog::unregister_group(const watchdog::GroupHandle& group) noexcept {
  Registry& reg = state_->registry;
  const std::lock_guard lock(reg.mutex);
  state_->board.release_slot(group.slot);
  reg.groups.erase(group.key);
}

std::uint64_t Watchdog::posted(const watchdog::OpInfo& op, std::int64_t at_ns) noexcept {
  if (op.peer < 0 && op.group.slot >= 0) {
    progress::Slot& slot = state_->board.get().slots[op.group.slot];
    if (slot.key.load(kRelaxed) == op.group.key) slot.entered.store(op.seq, kRelaxed);
  }
  FlightRecorder* r = state_->recorder.load(kRelaxed);
  return r == nullptr ? 0 : r->record(op.op, op.group.name_id, op.peer, op.seq, op.bytes, at_ns);
}

void Watchdog::blocking(const watchdog::OpInfo& op, std::int64_t at_ns) noexcept {
  progress::Board& b = state_->board.get();
  b.current_op.store(static_cast<std::uint32_t>(op.op) + 1, kRelaxed);
  b.current_peer.store(op.peer, kRelaxed);
  b.current_key.store(op.group.key, kRelaxed);
  b.current_seq.store(op.seq, kRelaxed);
  b.current_bytes.store(op.bytes, kRelaxed);
  b.current_since_ns.store(at_ns, std::memory_order_release);
}

void Watchdog::not_blocking() noexcept {
  progress::Board& b = state_->board.get();
  b.current_since_ns.store(0, std::memory_order_release);
  b.current_op.store(0, kRelaxed);
}

void Watchdog::done(std::uint64_t id, const watchdog::OpInfo& op, std::int64_t at_ns) noexcept {
  not_blocking();
  progress::Board& b = state_->board.get();
  if (op.peer < 0 && op.group.slot >= 0) {
    progress::Slot& slot = b.slots[op.group.slot];
    // Non-blocking collectives may complete out of order: keep the highest.
    if (slot.key.load(kRelaxed) == op.group.key && slot.completed.load(kRelaxed) < op.seq) {
      slot.completed.store(op.seq, kRelaxed);
    }
  }
  if (FlightRecorder* r = state_->recorder.load(kRelaxed)) r->finish(id, at_ns);
}

namespace {
// A CommEvent as the watchdog records it: its group id is the address of the group's handle.
watchdog::OpInfo info_of(const CommEvent& e) noexcept {
  return {.op = e.op,
          .group = *reinterpret_cast<const watchdog::GroupHandle*>(e.group),
          .peer = e.peer,
          .seq = e.seq,
          .bytes = e.bytes};
}
}  // namespace

std::uint64_t Watchdog::group_added(const ProcessGroup& group) {
  auto handle = std::make_unique<watchdog::GroupHandle>(
      register_group(group.name(), group.world_ranks()));
  return reinterpret_cast<std::uintptr_t>(handle.release());
}

void Watchdog::group_removed(const ProcessGroup& /*group*/, std::uint64_t id) noexcept {
  const std::unique_ptr<watchdog::GroupHandle> handle(
      reinterpret_cast<watchdog::GroupHandle*>(id));
  unregister_group(*handle);
}

std::uint64_t Watchdog::started(const CommEvent& op, std::int64_t at_ns) noexcept {
  return posted(info_of(op), at_ns);
}

void Watchdog::blocking(const CommEvent& op, std::int64_t at_ns) noexcept {
  blocking(info_of(op), at_ns);
}

void Watchdog::finished(const CommEvent& op, CommEnd /*how*/, std::int64_t /*start_ns*/,
                        std::int64_t end_ns) noexcept {
  done(op.token, info_of(op), end_ns);
}
void Watchdog::start(ProcessGroup& world, const WatchdogOptions& options) {
  if (world.size() == 1 || running()) return;
  std::array<char, 512> dir{};
  if (world.rank() == 0) {
    // Jobs that were killed leave their directories; theirs go before this one's is made.
    const std::string parent = watchdog_dirs::parent();
    watchdog_dirs::remove_stale(parent);
    const std::string created = watchdog_dirs::create(parent);
    if (created.size() < dir.size()) {
      std::copy(created.begin(), created.end(), dir.begin());
    } else {
      watchdog_dirs::remove_job_files(created);
    }
  }
  world.broadcast(std::as_writable_bytes(std::span<char>(dir)), 0);
  if (dir[0] == '\0') {
    // Every rank reads the same TMPDIR, so each can name the folder rank 0 could not use.
    throw CommError(fmt::format(
        "the watchdog could not create its directory {}/meshtrain-watchdog-XXXXXX on world "
        "rank 0 ($TMPDIR, else /tmp); point TMPDIR to a writable directory",
        watchdog_dirs::parent()));
  }
  // On another host (a /tmp of its own) the directory is not there: make it, for the ranks of
  // that host. The last rank of each host to stop removes it (LocalBoard::unmap_file).
  if (world.rank() != 0) ::mkdir(dir.data(), 0700);
  state_->hosts = gather_hosts(world);
  start_local(dir.data(), world.world_ranks()[static_cast<std::size_t>(world.rank())], options);
  world.barrier();  // every progress file exists before the first watched operation
}

void Watchdog::start_local(const std::string& dir, int world_rank, const WatchdogOptions& options) {
  if (running()) return;
  State& s = *state_;
  s.options = options;
  s.dir = dir;
  s.world_rank = world_rank;
  s.start_ns = watchdog::now_ns();
  s.stop = false;
  if (!s.board.map_file(board_file(dir, world_rank), world_rank)) {
    fmt::print(stderr,
               "[watchdog] world rank {}: cannot create {}; peers will report this rank as "
               "unknown when an operation times out\n",
               world_rank, board_file(dir, world_rank));
  }
  s.recorder.store(new FlightRecorder(std::max<std::size_t>(1, options.recorder_size)), kRelaxed);
  beat(s);
  s.thread = std::thread([&s] { run(s); });
}

void Watchdog::stop() noexcept {
  if (!running()) return;
  State& s = *state_;
  {
    const std::lock_guard lock(s.mutex);
    s.stop = true;
  }
  s.wake.notify_all();
  s.thread.join();
  delete s.recorder.exchange(nullptr, kRelaxed);
  s.board.unmap_file(s.dir);
  s.options.on_expiry = nullptr;
  s.hosts.clear();
}

bool Watchdog::running() const noexcept { return state_->recorder.load(kRelaxed) != nullptr; }

std::vector<FlightRecord> Watchdog::recorder_snapshot() const {
  const FlightRecorder* r = state_->recorder.load(kRelaxed);
  return r == nullptr ? std::vector<FlightRecord>{} : r->snapshot();
}

std::string Watchdog::group_name(std::uint32_t name_id) const {
  return group_name_of(*state_, name_id);
}

std::string Watchdog::dump_path() const {
  return running() ? dump_file(*state_) : std::string();
}

const progress::Board& Watchdog::progress() const noexcept { return state_->board.get(); }

WatchdogScope::WatchdogScope(Watchdog& watchdog, ProcessGroup& world,
                             const WatchdogOptions& options)
    : watchdog_(watchdog), owner_(!watchdog.running()) {
  watchdog.start(world, options);
  owner_ = owner_ && watchdog.running();
}

WatchdogScope::~WatchdogScope() {
  if (owner_) watchdog_.stop();
}

}  // namespace meshtrain
