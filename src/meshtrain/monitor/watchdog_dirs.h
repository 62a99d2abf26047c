// src/meshtrain/monitor/watchdog_dirs.h
//
// The watchdog's directories, `$TMPDIR/meshtrain-watchdog-XXXXXX` (/tmp without TMPDIR): world
// rank 0 creates one per job (Watchdog::start), every rank maps its progress file there, and
// the last rank to stop normally removes it (LocalBoard::unmap_file). A job that does not stop
// normally — kill -9, mpirun ending its ranks after one failed, MPI_Abort, the watchdog's own
// exit 4 — leaves it behind. So the directory records its owner, and the directories whose
// owner is gone are cleaned by the next job's rank 0 before it creates its own, and by
// `meshtrain launch` when its job has ended (issue 17 item 8).
//
// The owner is world rank 0's process, in the file `owner`:
//   meshtrain-watchdog-owner 1
//   host <gethostname()>
//   boot <the kernel's boot id, /proc/sys/kernel/random/boot_id>
//   pid <pid>
//   start <the process's start time, field 22 of /proc/<pid>/stat, clock ticks since boot>
// It is gone when, on the same host, the boot id differs (a reboot), or no process <pid>
// exists, or it has another start time (the pid was reused) or is a zombie. A directory of
// another host (a TMPDIR shared between nodes) or without an owner file (being created, or
// written by a meshtrain before this one) is never touched. Cleaning removes the progress
// files and the owner file, then the directory if that left it empty: flight-recorder dumps
// (a watchdog timeout's) stay, and with them the directory the report named.
#pragma once

#include <string>
#include <string_view>

namespace meshtrain::watchdog_dirs {

inline constexpr std::string_view kPrefix = "meshtrain-watchdog-";
inline constexpr std::string_view kOwnerFile = "owner";

/// $TMPDIR, or /tmp when it is unset or empty.
std::string parent();

/// Creates `<parent>/meshtrain-watchdog-XXXXXX` (mkdtemp) holding this process's owner file;
/// "" when the directory cannot be created. Without /proc, or when the owner file cannot be
/// written, the directory has none (it is then never cleaned as stale).
std::string create(const std::string& parent);

/// Removes the progress files (*.progress) and the owner file of `dir`, then `dir` if it is
/// empty; errors are ignored (another process may clean it at the same time).
void remove_job_files(const std::string& dir) noexcept;

/// Cleans (remove_job_files) every watchdog directory directly under `parent` whose owner is
/// gone (see the file comment); returns how many it cleaned. Never throws.
int remove_stale(const std::string& parent) noexcept;

}  // namespace meshtrain::watchdog_dirs
