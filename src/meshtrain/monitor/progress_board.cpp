#include "meshtrain/monitor/progress_board.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <new>

#include "meshtrain/monitor/watchdog_dirs.h"

namespace meshtrain::progress {
namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

void copy_board(const Board& from, Board& to) noexcept {
  for (std::size_t i = 0; i < kMaxGroups; ++i) {
    to.slots[i].key.store(from.slots[i].key.load(kRelaxed), kRelaxed);
    to.slots[i].entered.store(from.slots[i].entered.load(kRelaxed), kRelaxed);
    to.slots[i].completed.store(from.slots[i].completed.load(kRelaxed), kRelaxed);
    std::memcpy(to.slots[i].name, from.slots[i].name, sizeof(to.slots[i].name));
  }
}

// Maps an existing board file read-write (peers write dump_requested); nullptr if unusable.
Board* map_existing(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  void* p = ::mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return nullptr;
  auto* board = static_cast<Board*>(p);
  if (board->magic != kMagic) {
    ::munmap(p, sizeof(Board));
    return nullptr;
  }
  return board;
}

}  // namespace

std::uint64_t group_key(std::string_view name, std::uint32_t instance) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  h ^= (static_cast<std::uint64_t>(instance) + 1) * 0x9e3779b97f4a7c15ULL;
  return h == 0 ? 1 : h;
}

LocalBoard::LocalBoard() : memory_(std::make_unique<Board>()), board_(memory_.get()) {}

LocalBoard::~LocalBoard() {
  Board* board = board_.load(kRelaxed);
  if (board != memory_.get()) ::munmap(board, sizeof(Board));
}

int LocalBoard::claim_slot(std::uint64_t key, std::string_view name) noexcept {
  Board& b = get();
  for (std::size_t i = 0; i < kMaxGroups; ++i) {
    Slot& s = b.slots[i];
    if (s.key.load(kRelaxed) != 0) continue;
    s.entered.store(0, kRelaxed);
    s.completed.store(0, kRelaxed);
    const std::size_t n = std::min(name.size(), sizeof(s.name) - 1);
    std::memcpy(s.name, name.data(), n);
    s.name[n] = '\0';
    s.key.store(key, std::memory_order_release);
    return static_cast<int>(i);
  }
  return -1;
}

void LocalBoard::release_slot(int slot) noexcept {
  if (slot >= 0) get().slots[slot].key.store(0, std::memory_order_release);
}

bool LocalBoard::map_file(const std::string& path, int world_rank) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const bool sized = ::ftruncate(fd, static_cast<off_t>(sizeof(Board))) == 0;
  void* p = sized ? ::mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
  ::close(fd);
  if (p == MAP_FAILED) {
    ::unlink(path.c_str());
    return false;
  }
  auto* board = new (p) Board();
  board->world_rank = world_rank;
  board->pid = static_cast<std::int32_t>(::getpid());
  copy_board(*memory_, *board);
  board->state.store(1, std::memory_order_release);
  board_.store(board, std::memory_order_release);
  return true;
}

void LocalBoard::unmap_file(const std::string& dir) noexcept {
  Board* board = board_.load(kRelaxed);
  if (board == memory_.get()) return;
  copy_board(*board, *memory_);
  board_.store(memory_.get(), std::memory_order_release);
  board->state.store(2, std::memory_order_seq_cst);
  ::munmap(board, sizeof(Board));
  // Every rank marks itself stopped before it looks at the others, so the last one to stop
  // sees all stopped and cleans up (two may both do it: removing twice is harmless).
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".progress") continue;
    Board* peer = map_existing(entry.path().string());
    const bool stopped = peer == nullptr || peer->state.load(std::memory_order_seq_cst) == 2;
    if (peer != nullptr) ::munmap(peer, sizeof(Board));
    if (!stopped) return;
  }
  watchdog_dirs::remove_job_files(dir);  // the dumps stay, and the directory with them
}

std::optional<PeerView> read_peer(const std::string& path, std::uint64_t key, bool request_dump) {
  Board* b = map_existing(path);
  if (b == nullptr) return std::nullopt;
  PeerView v;
  v.current_op = b->current_op.load(std::memory_order_acquire);
  v.current_peer = b->current_peer.load(kRelaxed);
  v.current_key = b->current_key.load(kRelaxed);
  v.current_seq = b->current_seq.load(kRelaxed);
  for (const Slot& s : b->slots) {
    const std::uint64_t k = s.key.load(std::memory_order_acquire);
    if (k == 0) continue;
    if (k == key) {
      v.in_group = true;
      v.entered = s.entered.load(kRelaxed);
      v.completed = s.completed.load(kRelaxed);
    }
    if (v.current_op != 0 && k == v.current_key) {
      v.current_group.assign(s.name, strnlen(s.name, sizeof(s.name)));
    }
  }
  v.dumped = b->dumped.load(std::memory_order_acquire) != 0;
  v.stopped = b->state.load(std::memory_order_acquire) == 2;
  v.heartbeat_ns = b->heartbeat_ns.load(kRelaxed);
  if (request_dump) b->dump_requested.store(1, std::memory_order_release);
  ::munmap(b, sizeof(Board));
  return v;
}

}  // namespace meshtrain::progress
