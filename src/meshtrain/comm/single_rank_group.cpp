#include "meshtrain/comm/single_rank_group.h"

#include <vector>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

std::vector<int> iota(int size) {
  std::vector<int> ranks(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) ranks[static_cast<std::size_t>(r)] = r;
  return ranks;
}

// Rank `rank` of `size` without a backend. ProcessGroup never calls the backend for a group
// of one rank, and a layout-only group must never communicate: reaching it is a bug.
class DetachedGroup final : public ProcessGroup {
 public:
  DetachedGroup(int rank, int size, std::string axis_name)
      : ProcessGroup(rank, iota(size), std::move(axis_name)) {}

  std::unique_ptr<ProcessGroup> do_split(int /*color*/, int /*key*/,
                                         std::string axis_name) const override {
    MT_CHECK(size() == 1, "a detached group of {} ranks cannot split", size());
    return std::make_unique<DetachedGroup>(0, 1, std::move(axis_name));
  }

 protected:
  [[noreturn]] static void unreachable() {
    MT_CHECK(false, "a group without a backend (single rank or layout only) tried to communicate");
    throw Error("unreachable");
  }
  void do_all_reduce_sum(std::span<float>) override { unreachable(); }
  void do_all_reduce_sum(std::span<double>) override { unreachable(); }
  void do_all_reduce_sum(std::span<std::int32_t>) override { unreachable(); }
  void do_all_reduce_sum(std::span<std::int64_t>) override { unreachable(); }
  void do_all_reduce_max(std::span<float>) override { unreachable(); }
  void do_all_reduce_max(std::span<std::int32_t>) override { unreachable(); }
  void do_broadcast(std::span<std::byte>, int) override { unreachable(); }
  void do_barrier() override { unreachable(); }
  void do_reduce_scatter_sum(std::span<const float>, std::span<float>) override { unreachable(); }
  void do_all_gather(std::span<const float>, std::span<float>) override { unreachable(); }
  void do_all_gather(std::span<const std::int32_t>, std::span<std::int32_t>) override {
    unreachable();
  }
  void do_all_to_all(std::span<const float>, std::span<float>) override { unreachable(); }
  void do_all_to_all(std::span<const std::int32_t>, std::span<std::int32_t>) override {
    unreachable();
  }
  void do_all_to_allv(std::span<const float>, std::span<const std::int64_t>, std::span<float>,
                      std::span<const std::int64_t>) override {
    unreachable();
  }
  void do_send(std::span<const float>, int, int) override { unreachable(); }
  void do_recv(std::span<float>, int, int) override { unreachable(); }
  std::unique_ptr<CommRequest> do_isend(std::span<const float>, int, int) override {
    unreachable();
  }
  std::unique_ptr<CommRequest> do_irecv(std::span<float>, int, int) override { unreachable(); }
  std::unique_ptr<CommRequest> do_iall_gather(std::span<const float>, std::span<float>) override {
    unreachable();
  }
  std::unique_ptr<CommRequest> do_iall_reduce_sum(std::span<float>, float) override {
    unreachable();
  }
  std::unique_ptr<CommRequest> do_ireduce_scatter_sum(std::span<float>, std::span<float>) override {
    unreachable();
  }
};

}  // namespace

std::unique_ptr<ProcessGroup> single_rank_group(std::string axis_name) {
  return std::make_unique<DetachedGroup>(0, 1, std::move(axis_name));
}

std::unique_ptr<ProcessGroup> detached_group(int rank, int size, std::string axis_name) {
  MT_CHECK(size >= 1 && rank >= 0 && rank < size, "rank {} of {}", rank, size);
  return std::make_unique<DetachedGroup>(rank, size, std::move(axis_name));
}

}  // namespace meshtrain
