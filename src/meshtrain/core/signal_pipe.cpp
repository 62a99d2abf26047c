#include "meshtrain/core/signal_pipe.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace meshtrain {
namespace {

// Lock-free, so the handler may read it while the main thread sets it.
std::atomic<int> g_write_fd{-1};
static_assert(std::atomic<int>::is_always_lock_free);

}  // namespace

void set_signal_pipe(int write_fd) noexcept { g_write_fd.store(write_fd); }

extern "C" void signal_pipe_handler(int sig) {
  const int saved = errno;
  const auto byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_write_fd.load(), &byte, 1);
  errno = saved;
}

}  // namespace meshtrain
