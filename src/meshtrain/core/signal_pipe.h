// src/meshtrain/core/signal_pipe.h — a signal handler that writes each signal's number into a
// pipe (the self-pipe trick), so that a loop polling the pipe sees the signal between its other
// events: `meshtrain launch`'s supervisor catches the signals it forwards to its job this way
// (launch/supervisor.cpp). The pipe's write end is process-wide state that a signal handler
// reads, so it lives here in core/, beside the stop signal's (stop_signal.h).
#pragma once

namespace meshtrain {

/// From now on signal_pipe_handler writes each signal it takes, as one byte, into `write_fd`
/// (a non-blocking pipe; −1: the signals are dropped). One pipe per process: the supervisor's.
void set_signal_pipe(int write_fd) noexcept;

/// A handler for sigaction: one write(2) to the pipe, errno preserved (async-signal-safe).
extern "C" void signal_pipe_handler(int sig);

}  // namespace meshtrain
