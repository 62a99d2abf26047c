#include "meshtrain/launch/supervisor.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/core/signal_pipe.h"

namespace meshtrain {
namespace {

// The signals that stop the job (and end the restarts). The first is passed to mpirun as
// SIGUSR1, which OpenMPI forwards to every rank (ess_base_forward_signals' defaults) and the
// ranks answer by checkpointing and exiting 5 (core/stop_signal.h); SIGTERM to mpirun would
// instead end the ranks within ≈2 s (SIGTERM after odls_base_sigkill_timeout = 1 s, SIGKILL
// 1 s later), too soon for a step and a checkpoint. A second one is passed as SIGTERM: the
// user insists, the job ends now.
constexpr std::array<int, 4> kForwarded = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};

// Catches kForwarded into a pipe the attempt loop polls, and ignores SIGPIPE (a
// closed stdout must not kill the launcher while its job runs); restores everything after.
class SignalCatcher {
 public:
  SignalCatcher() {
    if (::pipe2(fds_.data(), O_CLOEXEC | O_NONBLOCK) != 0) {
      throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
    }
    set_signal_pipe(fds_[1]);
    struct sigaction action = {};
    action.sa_handler = signal_pipe_handler;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (std::size_t i = 0; i < kForwarded.size(); ++i) {
      ::sigaction(kForwarded[i], &action, &saved_[i]);
    }
    struct sigaction ignore = {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, &saved_pipe_);
  }
  SignalCatcher(const SignalCatcher&) = delete;
  SignalCatcher& operator=(const SignalCatcher&) = delete;
  ~SignalCatcher() {
    for (std::size_t i = 0; i < kForwarded.size(); ++i) {
      ::sigaction(kForwarded[i], &saved_[i], nullptr);
    }
    ::sigaction(SIGPIPE, &saved_pipe_, nullptr);
    set_signal_pipe(-1);
    ::close(fds_[0]);
    ::close(fds_[1]);
  }

  int read_fd() const noexcept { return fds_[0]; }

  // Signals caught since the last call.
  std::vector<int> take() {
    std::vector<int> signals;
    unsigned char byte = 0;
    while (::read(fds_[0], &byte, 1) == 1) signals.push_back(byte);
    return signals;
  }

 private:
  std::array<int, 2> fds_ = {-1, -1};
  std::array<struct sigaction, kForwarded.size()> saved_ = {};
  struct sigaction saved_pipe_ = {};
};

void write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed stdout: keep running the job, drop its output
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

std::string join(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) {
    if (!out.empty()) out += ' ';
    out += a;
  }
  return out;
}

struct Attempt {
  int spawn_errno = 0;  // mpirun could not be executed
  pid_t pid = -1;       // mpirun's, and the id of the session it led
  AttemptStatus status;
  FailedRank failed;
  bool interrupted = false;
  bool ended_stuck = false;  // mpirun outlived the grace period after a failure and was killed
  double seconds = 0;
};

// fork + exec of mpirun in a new session (setsid), stdin from /dev/null, stdout/stderr into
// the given pipes. Returns the pid, or -1 with `spawn_errno` set.
pid_t spawn(const std::vector<std::string>& argv, int out_w, int err_w, int& spawn_errno) {
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);

  std::array<int, 2> exec_error = {-1, -1};  // the child reports a failed exec here
  if (::pipe2(exec_error.data(), O_CLOEXEC) != 0) {
    spawn_errno = errno;
    return -1;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    spawn_errno = errno;
    ::close(exec_error[0]);
    ::close(exec_error[1]);
    return -1;
  }
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec.
    ::setsid();  // the ranks join this session: one id finds every process of the attempt
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // the launcher killed -9 takes its job down with it
    if (::getppid() != parent) ::_exit(1);
    ::signal(SIGPIPE, SIG_DFL);  // an ignored signal would stay ignored across exec
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out_w, 1);
    ::dup2(err_w, 2);
    ::execv(cargv[0], cargv.data());
    const int e = errno;
    [[maybe_unused]] const ssize_t n = ::write(exec_error[1], &e, sizeof e);
    ::_exit(127);
  }
  ::close(exec_error[1]);
  int child_errno = 0;
  ssize_t n = 0;
  do {
    n = ::read(exec_error[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  ::close(exec_error[0]);
  if (n == static_cast<ssize_t>(sizeof child_errno)) {
    ::waitpid(pid, nullptr, 0);
    spawn_errno = child_errno;
    return -1;
  }
  return pid;
}

// Ends an mpirun that has not exited `grace_s` after the first sign of a failed rank (the
// scanners' failed()): SIGKILL to its process group (it leads its session and group); the
// ranks it started in groups of their own go in kill_leftovers. Once per attempt.
void end_if_stuck(const std::array<MpirunOutputScanner, 2>& scanners, double grace_s, pid_t pid,
                  std::optional<std::chrono::steady_clock::time_point>& failed_at, Attempt& attempt,
                  std::FILE* log) {
  if (attempt.ended_stuck) return;
  const auto now = std::chrono::steady_clock::now();
  if (!failed_at) {
    for (const MpirunOutputScanner& s : scanners) {
      if (s.failed().rank || s.failed().watchdog) failed_at = now;
    }
    return;
  }
  if (std::chrono::duration<double>(now - *failed_at).count() < grace_s) return;
  const FailedRank& f = scanners[1].failed().rank ? scanners[1].failed() : scanners[0].failed();
  fmt::print(log,
             "meshtrain launch: mpirun has not exited {:g} s (--grace) after {}; killing its "
             "process group (SIGKILL)\n",
             grace_s,
             f.rank ? fmt::format("rank {} failed", *f.rank)
                    : std::string("a rank's watchdog ended the job"));
  std::fflush(log);
  ::kill(-pid, SIGKILL);
  attempt.ended_stuck = true;
}

Attempt run_attempt(const std::vector<std::string>& argv, const SupervisorIo& io,
                    SignalCatcher& signals, double grace_s) {
  Attempt attempt;
  const auto start = std::chrono::steady_clock::now();
  std::array<int, 2> out_pipe = {-1, -1};
  std::array<int, 2> err_pipe = {-1, -1};
  if (::pipe2(out_pipe.data(), O_CLOEXEC) != 0) {
    attempt.spawn_errno = errno;
    return attempt;
  }
  if (::pipe2(err_pipe.data(), O_CLOEXEC) != 0) {
    attempt.spawn_errno = errno;
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return attempt;
  }
  const pid_t pid = spawn(argv, out_pipe[1], err_pipe[1], attempt.spawn_errno);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (pid < 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    return attempt;
  }
  attempt.pid = pid;

  // mpirun writes its own messages to stderr, the ranks' output goes to either stream: scan
  // both, each with its own line buffer.
  std::array<MpirunOutputScanner, 2> scanners;
  const std::array<int, 2> targets = {io.out_fd, io.err_fd};
  std::array<pollfd, 3> fds = {pollfd{out_pipe[0], POLLIN, 0}, pollfd{err_pipe[0], POLLIN, 0},
                               pollfd{signals.read_fd(), POLLIN, 0}};
  std::array<char, 65536> buffer{};
  bool exited = false;
  int wait_status = 0;
  std::optional<std::chrono::steady_clock::time_point> failed_at;
  while (true) {
    // While mpirun runs, wake up now and then to notice its exit even if a stray process
    // holds the pipes open; once it has exited, take what is already there and stop.
    const int ready = ::poll(fds.data(), fds.size(), exited ? 0 : 200);
    if (ready < 0 && errno != EINTR) break;
    for (std::size_t s = 0; s < 2 && ready > 0; ++s) {
      if (fds[s].fd < 0 || (fds[s].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t n = ::read(fds[s].fd, buffer.data(), buffer.size());
      if (n > 0) {
        write_all(targets[s], buffer.data(), static_cast<std::size_t>(n));
        scanners[s].feed({buffer.data(), static_cast<std::size_t>(n)});
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[s].fd);
        fds[s].fd = -1;  // poll ignores negative descriptors
      }
    }
    for (const int sig : signals.take()) {
      const std::string name =
          sigabbrev_np(sig) ? fmt::format("SIG{}", sigabbrev_np(sig)) : std::to_string(sig);
      if (!attempt.interrupted) {
        fmt::print(io.log,
                   "meshtrain launch: got {}; asking every rank to finish its step, write a "
                   "checkpoint and stop (SIGUSR1 to mpirun); no restart after this; a second "
                   "signal ends the job at once\n",
                   name);
      } else {
        fmt::print(io.log,
                   "meshtrain launch: got {} again; ending the job now (SIGTERM to "
                   "mpirun)\n",
                   name);
      }
      std::fflush(io.log);
      if (!exited) ::kill(pid, attempt.interrupted ? SIGTERM : SIGUSR1);
      attempt.interrupted = true;
    }
    if (!exited) {
      if (::waitpid(pid, &wait_status, WNOHANG) == pid) exited = true;
      if (!exited) end_if_stuck(scanners, grace_s, pid, failed_at, attempt, io.log);
    } else if (ready <= 0) {
      break;
    }
    // Both streams closed before the exit: poll still wakes every 200 ms (the signal pipe), so
    // the wait stays bounded by the grace once a rank has failed.
  }
  for (int s = 0; s < 2; ++s) {
    if (fds[s].fd >= 0) ::close(fds[s].fd);
    scanners[s].finish();
  }
  if (WIFSIGNALED(wait_status)) {
    attempt.status = {.signaled = true, .code = WTERMSIG(wait_status)};
  } else {
    attempt.status = {.signaled = false, .code = WEXITSTATUS(wait_status)};
  }
  // mpirun's own messages (stderr) first; a rank may print something similar to stdout.
  attempt.failed = scanners[1].failed().rank ? scanners[1].failed() : scanners[0].failed();
  attempt.failed.launch_failed =
      scanners[0].failed().launch_failed || scanners[1].failed().launch_failed;
  attempt.failed.watchdog = scanners[0].failed().watchdog || scanners[1].failed().watchdog;
  attempt.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return attempt;
}

// Live (not zombie) processes of session `sid`, from /proc/<pid>/stat.
std::vector<pid_t> session_processes(pid_t sid) {
  std::vector<pid_t> found;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  while (const dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    std::ifstream stat_file(fmt::format("/proc/{}/stat", pid));
    std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
    // pid (comm) state ppid pgrp session ...; comm may hold blanks and parentheses.
    const std::size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    char state = 0;
    long ppid = 0;
    long pgrp = 0;
    long session = 0;
    if (!(rest >> state >> ppid >> pgrp >> session)) continue;
    if (session == sid && state != 'Z' && state != 'X') found.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(proc);
  return found;
}

void reap_children() {
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

// Kills (SIGKILL) every process of the attempt's session that outlived mpirun and reaps the
// ones that were handed to the launcher (it is their subreaper). Returns how many it killed.
std::size_t kill_leftovers(pid_t sid) {
  std::size_t killed = 0;
  // Bounded: a process in uninterruptible sleep may take a moment to die; 5 s is plenty and
  // keeps a stuck kernel from hanging the launcher.
  for (int round = 0; round < 250; ++round) {
    reap_children();
    const std::vector<pid_t> left = session_processes(sid);
    if (left.empty()) break;
    for (const pid_t p : left) {
      if (::kill(p, SIGKILL) == 0 && round == 0) ++killed;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  reap_children();
  return killed;
}

// Waits `seconds` unless a signal comes first; true when one came (it stays readable for the
// caller's take()).
bool wait_for_signal(SignalCatcher& signals, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd fd = {signals.read_fd(), POLLIN, 0};
    if (::poll(&fd, 1, static_cast<int>(left.count())) > 0) return true;
  }
}

}  // namespace

int supervise(const LaunchPlan& plan, int max_restarts, const SupervisorIo& io,
              const SupervisorPolicy& policy) {
  // Ranks whose mpirun died become the launcher's children rather than init's, so it can
  // reap them after killing them.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  SignalCatcher signals;
  int restarts = 0;
  while (true) {
    const std::vector<std::string> argv = mpirun_argv(plan, restarts);
    fmt::print(io.log, "meshtrain launch: attempt {} of at most {}: {}\n", restarts + 1,
               max_restarts + 1, join(argv));
    std::fflush(io.log);
    const Attempt attempt = run_attempt(argv, io, signals, policy.grace_s);
    if (attempt.spawn_errno != 0) {
      fmt::print(io.log, "meshtrain launch: cannot run {}: {}\n", argv[0],
                 std::strerror(attempt.spawn_errno));
      return 1;
    }
    if (const std::size_t killed = kill_leftovers(attempt.pid); killed > 0) {
      fmt::print(io.log, "meshtrain launch: killed {} process{} of the job that outlived mpirun\n",
                 killed, killed == 1 ? "" : "es");
    }
    if (!attempt.status.signaled && attempt.status.code == 0) {
      fmt::print(io.log, "meshtrain launch: the job finished{}\n",
                 restarts == 0
                     ? std::string()
                     : fmt::format(" after {} restart{}", restarts, restarts == 1 ? "" : "s"));
      std::fflush(io.log);
      return 0;
    }
    const bool interrupted = attempt.interrupted || !signals.take().empty();
    const std::string what = describe_failure(attempt.status, attempt.failed);
    const RetryDecision decision =
        decide_retry(attempt.status, attempt.failed, interrupted, restarts, max_restarts);
    if (!decision.restart) {
      fmt::print(io.log, "meshtrain launch: {} after {:.1f} s; not restarting: {} (exit code {})\n",
                 what, attempt.seconds, decision.reason, attempt.status.shell_code());
      std::fflush(io.log);
      return attempt.status.shell_code();
    }
    ++restarts;
    const double delay =
        std::min(policy.restart_delay_s * std::exp2(restarts - 1), kMaxRestartDelayS);
    fmt::print(io.log,
               "meshtrain launch: restart {} of {}: {} after {:.1f} s{}; resuming from the newest "
               "complete checkpoint in {:g} s\n",
               restarts, max_restarts, what, attempt.seconds,
               attempt.ended_stuck ? " (mpirun killed after the grace)" : "", delay);
    std::fflush(io.log);
    if (wait_for_signal(signals, delay)) {
      fmt::print(io.log, "meshtrain launch: got a stop signal while waiting; not restarting\n");
      std::fflush(io.log);
      signals.take();
      return attempt.status.shell_code();
    }
  }
}

}  // namespace meshtrain
