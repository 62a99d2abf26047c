#include "meshtrain/comm/single_rank_group.h"

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

class SingleRankGroup final : public ProcessGroup {
 public:
  explicit SingleRankGroup(std::string axis_name) : ProcessGroup(0, {0}, std::move(axis_name)) {}

  std::unique_ptr<ProcessGroup> split(int /*color*/, int /*key*/,
                                      std::string axis_name) const override {
    return std::make_unique<SingleRankGroup>(std::move(axis_name));
  }

 protected:
  // ProcessGroup never calls the backend for a group of one rank; reaching here is a bug.
  [[noreturn]] static void unreachable() {
    MT_CHECK(false, "a single-rank group reached its backend");
    throw Error("unreachable");
  }
  void do_all_reduce_sum(std::span<float>) override { unreachable(); }
  void do_all_reduce_sum(std::span<double>) override { unreachable(); }
  void do_all_reduce_max(std::span<float>) override { unreachable(); }
  void do_broadcast(std::span<std::byte>, int) override { unreachable(); }
  void do_barrier() override { unreachable(); }
  void do_reduce_scatter_sum(std::span<const float>, std::span<float>) override { unreachable(); }
  void do_all_gather(std::span<const float>, std::span<float>) override { unreachable(); }
  void do_all_to_all(std::span<const float>, std::span<float>) override { unreachable(); }
  void do_send(std::span<const float>, int, int) override { unreachable(); }
  void do_recv(std::span<float>, int, int) override { unreachable(); }
  std::unique_ptr<CommRequest> do_isend(std::span<const float>, int, int) override {
    unreachable();
  }
  std::unique_ptr<CommRequest> do_irecv(std::span<float>, int, int) override { unreachable(); }
  std::unique_ptr<CommRequest> do_iall_gather(std::span<const float>, std::span<float>) override {
    unreachable();
  }
};

}  // namespace

std::unique_ptr<ProcessGroup> single_rank_group(std::string axis_name) {
  return std::make_unique<SingleRankGroup>(std::move(axis_name));
}

}  // namespace meshtrain
