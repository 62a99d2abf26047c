// The watchdog's parts in one process, without MPI (monitor/watchdog.h, flight_recorder.h,
// progress_board.h): the flight recorder keeps exactly the last N operations in order;
// operations that finish in time never trigger it; a hung one is reported with its operation,
// group, sequence number and the peer whose progress file shows it has not arrived; the
// directories of jobs whose owner is gone are cleaned, the others kept. The scenarios that end
// a job run under mpirun in tests/e2e/watchdog.sh and watchdog_dirs.sh.
#include "meshtrain/monitor/watchdog.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "support/temp_files.h"
#include "meshtrain/monitor/flight_recorder.h"
#include "meshtrain/monitor/progress_board.h"
#include "meshtrain/monitor/watchdog_dirs.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir() {
  std::string pattern = (fs::temp_directory_path() / "meshtrain-watchdog-test-XXXXXX").string();
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

TEST(FlightRecorder, KeepsExactlyTheLastNOperationsInOrder) {
  FlightRecorder recorder(4);
  EXPECT_TRUE(recorder.snapshot().empty());
  for (std::uint64_t i = 1; i <= 2; ++i) {
    recorder.record(CommOp::all_reduce, 7, -1, i, 16 * i, static_cast<std::int64_t>(i));
  }
  EXPECT_EQ(recorder.snapshot().size(), 2u);  // fewer than N: all of them
  for (std::uint64_t i = 3; i <= 10; ++i) {
    const std::uint64_t id =
        recorder.record(i % 2 == 0 ? CommOp::send : CommOp::all_gather, 7, i % 2 == 0 ? 1 : -1, i,
                        16 * i, static_cast<std::int64_t>(i));
    EXPECT_EQ(id, i);
    if (i % 2 == 0) recorder.finish(id, static_cast<std::int64_t>(100 + i));
  }
  recorder.finish(3, 999);  // left the ring: must not touch id 7, which took its slot
  const std::vector<FlightRecord> records = recorder.snapshot();
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(recorder.recorded(), 10u);
  for (std::size_t k = 0; k < records.size(); ++k) {
    const FlightRecord& r = records[k];
    const std::uint64_t i = 7 + k;
    EXPECT_EQ(r.id, i);
    EXPECT_EQ(r.seq, i);
    EXPECT_EQ(r.bytes, 16 * i);
    EXPECT_EQ(r.op, i % 2 == 0 ? CommOp::send : CommOp::all_gather);
    EXPECT_EQ(r.peer, i % 2 == 0 ? 1 : -1);
    EXPECT_EQ(r.start_ns, static_cast<std::int64_t>(i));
    EXPECT_EQ(r.end_ns, i % 2 == 0 ? static_cast<std::int64_t>(100 + i) : 0) << "id " << i;
  }
}

TEST(Watchdog, OperationsThatFinishInTimeNeverTriggerIt) {
  const fs::path dir = fresh_dir();
  Watchdog wd;
  const watchdog::GroupHandle group = wd.register_group("dp{0,2}", {0, 2});
  bool fired = false;
  wd.start_local(dir.string(), 0,
                 {.timeout_s = 0.2, .recorder_size = 16, .on_expiry = [&](const std::string&) {
                    fired = true;
                  }});
  ASSERT_TRUE(wd.running());
  EXPECT_TRUE(fs::exists(dir / "rank0.progress"));
  for (std::uint64_t seq = 1; seq <= 40; ++seq) {
    const watchdog::OpInfo op{.op = CommOp::all_reduce, .group = group, .seq = seq, .bytes = 64};
    const std::uint64_t id = wd.posted(op, watchdog::now_ns());
    wd.blocking(op, watchdog::now_ns());
    wd.done(id, op, watchdog::now_ns());
    // Idle between operations for 4 × the timeout in all: time outside an operation is no hang.
    if (seq % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const std::vector<FlightRecord> records = wd.recorder_snapshot();
  ASSERT_EQ(records.size(), 16u);
  for (std::size_t k = 0; k < records.size(); ++k) {
    EXPECT_EQ(records[k].seq, 25 + k);
    EXPECT_NE(records[k].end_ns, 0);
    EXPECT_EQ(wd.group_name(records[k].group), "dp{0,2}");
  }
  const progress::Slot& slot = wd.progress().slots[group.slot];
  EXPECT_EQ(slot.entered.load(), 40u);
  EXPECT_EQ(slot.completed.load(), 40u);
  wd.stop();
  EXPECT_FALSE(fired);
  EXPECT_FALSE(fs::exists(dir)) << "the last rank to stop removes the directory";
  wd.unregister_group(group);
}

// Writes world rank 1's progress file as its watchdog would: in `group`, collective #2 entered
// and completed, not blocked now.
void write_peer_board(const fs::path& path, std::uint64_t key) {
  auto board = std::make_unique<progress::Board>();
  board->world_rank = 1;
  board->state.store(1);
  board->slots[0].key.store(key);
  board->slots[0].entered.store(2);
  board->slots[0].completed.store(2);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(board.get()), sizeof(progress::Board));
}

// World rank 0 blocks in all-reduce #3 (16 bytes) of `group` under a watchdog with a 0.1 s
// timeout writing into `dir`, until the watchdog reports; returns the report and the path of
// the flight-recorder dump it wrote.
struct HungReport {
  std::string report, dump;
};
HungReport report_of_hung_all_reduce(Watchdog& wd, const fs::path& dir,
                                     const watchdog::GroupHandle& group) {
  std::mutex mutex;
  std::condition_variable cv;
  std::string report;
  wd.start_local(dir.string(), 0,
                 {.timeout_s = 0.1, .recorder_size = 4, .on_expiry = [&](const std::string& r) {
                    const std::lock_guard lock(mutex);
                    report = r;
                    cv.notify_all();
                  }});
  const watchdog::OpInfo op{.op = CommOp::all_reduce, .group = group, .seq = 3, .bytes = 16};
  const std::uint64_t id = wd.posted(op, watchdog::now_ns());
  wd.blocking(op, watchdog::now_ns());
  {
    // The bound only turns a watchdog that never fires into a failure instead of a hang.
    std::unique_lock lock(mutex);
    cv.wait_for(lock, std::chrono::seconds(60), [&] { return !report.empty(); });
  }
  wd.done(id, op, watchdog::now_ns());
  HungReport out{report, wd.dump_path()};
  wd.stop();
  return out;
}

TEST(Watchdog, ReportsTheHungOperationAndThePeerThatHasNotArrived) {
  const fs::path dir = fresh_dir();
  Watchdog wd;
  const watchdog::GroupHandle group = wd.register_group("world{0,1}", {0, 1});
  write_peer_board(dir / "rank1.progress", group.key);
  const auto [report, dump] = report_of_hung_all_reduce(wd, dir, group);
  EXPECT_NE(report.find("world rank 0: all_reduce on world{0,1} (collective #3 of the group, 16 "
                        "bytes) has not completed after"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("world rank 1: has not reached collective #3 (last entered #2, completed "
                        "#2); now not in a communication operation"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("not arrived: world rank 1"), std::string::npos) << report;
  EXPECT_NE(report.find(dump), std::string::npos) << report;
  std::ifstream in(dump);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("1 all_reduce world{0,1} 3 - 16 "), std::string::npos) << text;
  EXPECT_NE(text.find("in_flight"), std::string::npos) << text;
  wd.unregister_group(group);
  fs::remove_all(dir);
}

// World rank 1 in the hung collective #3 (entered, blocked in it), its heartbeat written by
// `beat_ns`; returns the report of world rank 0, blocked in the same collective.
std::string report_with_peer_heartbeat(const std::function<std::int64_t()>& beat_ns) {
  const fs::path dir = fresh_dir();
  Watchdog wd;
  const watchdog::GroupHandle group = wd.register_group("world{0,1}", {0, 1});
  const fs::path peer = dir / "rank1.progress";
  write_peer_board(peer, group.key);
  const int fd = ::open(peer.c_str(), O_RDWR);
  void* mapped =
      ::mmap(nullptr, sizeof(progress::Board), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  EXPECT_NE(mapped, MAP_FAILED);
  auto* board = static_cast<progress::Board*>(mapped);
  board->slots[0].entered.store(3);
  std::snprintf(board->slots[0].name, sizeof(board->slots[0].name), "world{0,1}");
  board->current_op.store(static_cast<std::uint32_t>(CommOp::all_reduce) + 1);
  board->current_key.store(group.key);
  board->current_seq.store(3);
  std::atomic<bool> done{false};
  board->heartbeat_ns.store(beat_ns());
  std::thread peer_thread([&] {
    while (!done) {
      board->heartbeat_ns.store(beat_ns());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  const std::string report = report_of_hung_all_reduce(wd, dir, group).report;
  done = true;
  peer_thread.join();
  ::munmap(mapped, sizeof(progress::Board));
  wd.unregister_group(group);
  fs::remove_all(dir);
  return report;
}

// Issue 17: a rank stopped (kill -STOP) inside the collective looked like one waiting in it, so
// the report said "not arrived: none found". Its heartbeat, 5 s old and never advancing, names it.
TEST(Watchdog, NamesAPeerFrozenInsideTheCollectiveByItsHeartbeat) {
  const std::int64_t frozen_at = watchdog::now_ns() - 5'000'000'000;
  const std::string report = report_with_peer_heartbeat([&] { return frozen_at; });
  EXPECT_NE(report.find("world rank 1: reached collective #3; now blocked in all_reduce on "
                        "world{0,1} #3 — but frozen: its process has not run for"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("frozen (not running, so the operation cannot complete): world rank 1"),
            std::string::npos)
      << report;
}

// The same peer, its watchdog beating every 10 ms: waiting in the collective, not frozen.
TEST(Watchdog, APeerWhoseHeartbeatAdvancesIsNotCalledFrozen) {
  const std::string report = report_with_peer_heartbeat([] { return watchdog::now_ns(); });
  EXPECT_NE(report.find("world rank 1: reached collective #3; now blocked in all_reduce"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("frozen"), std::string::npos) << report;
}

// The owner file's format as watchdog_dirs.h documents it, written by hand.
fs::path fake_job_dir(const fs::path& parent, const std::string& name, const std::string& host,
                      const std::string& boot, long long pid, unsigned long long start,
                      const std::vector<std::string>& files) {
  const fs::path dir = parent / name;
  fs::create_directories(dir);
  std::ofstream(dir / "owner") << "meshtrain-watchdog-owner 1\nhost " << host << "\nboot " << boot
                               << "\npid " << pid << "\nstart " << start << "\n";
  for (const std::string& f : files) std::ofstream(dir / f) << "x";
  return dir;
}

TEST(WatchdogDirs, DirectoriesOfGoneOwnersAreCleanedTheOthersKept) {
  const test::TempDir tmp;
  const fs::path parent = tmp.path();
  const fs::path live = watchdog_dirs::create(parent.string());  // owned by this process
  ASSERT_FALSE(live.empty());
  EXPECT_TRUE(live.filename().string().starts_with("meshtrain-watchdog-")) << live;
  std::ofstream(live / "rank0.progress") << "x";
  const pid_t child = ::fork();  // a process that is gone: exited and reaped
  if (child == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof(name) - 1), 0);
  const std::string host = name;
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  ASSERT_FALSE(boot.empty());
  const std::vector<std::string> boards{"rank0.progress", "rank1.progress"};
  const fs::path dead =
      fake_job_dir(parent, "meshtrain-watchdog-dead", host, boot, child, 1, boards);
  const fs::path dumped = fake_job_dir(parent, "meshtrain-watchdog-dumped", host, boot, child, 1,
                                       {"rank0.progress", "flight_recorder.rank0.txt"});
  const fs::path rebooted = fake_job_dir(parent, "meshtrain-watchdog-rebooted", host,
                                         "another-boot", ::getpid(), 1, boards);
  // This process's pid with another start time: the pid was reused by a later process.
  const fs::path reused =
      fake_job_dir(parent, "meshtrain-watchdog-reused", host, boot, ::getpid(), 1, boards);
  const fs::path foreign =
      fake_job_dir(parent, "meshtrain-watchdog-foreign", "another-host", boot, child, 1, boards);
  const fs::path other = fake_job_dir(parent, "not-a-watchdog-dir", host, boot, child, 1, boards);
  const fs::path unowned = parent / "meshtrain-watchdog-unowned";
  fs::create_directories(unowned);
  std::ofstream(unowned / "rank0.progress") << "x";

  EXPECT_EQ(watchdog_dirs::remove_stale(parent.string()), 4);
  for (const fs::path& gone : {dead, rebooted, reused}) EXPECT_FALSE(fs::exists(gone)) << gone;
  EXPECT_TRUE(fs::exists(dumped / "flight_recorder.rank0.txt")) << "the dump must stay";
  EXPECT_FALSE(fs::exists(dumped / "rank0.progress"));
  EXPECT_FALSE(fs::exists(dumped / "owner"));
  EXPECT_TRUE(fs::exists(live / "owner") && fs::exists(live / "rank0.progress"));
  EXPECT_TRUE(fs::exists(foreign / "owner") && fs::exists(foreign / "rank0.progress"));
  EXPECT_TRUE(fs::exists(other / "owner"));
  EXPECT_TRUE(fs::exists(unowned / "rank0.progress"));
  EXPECT_EQ(watchdog_dirs::remove_stale(parent.string()), 0);  // nothing left to judge

  watchdog_dirs::remove_job_files(live.string());  // what the last rank to stop does
  EXPECT_FALSE(fs::exists(live));
}

}  // namespace
}  // namespace meshtrain
