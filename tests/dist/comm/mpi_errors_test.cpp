// MPI errors come back as CommErrors naming the operation and the group, not as an abort from
// inside MPI (issue 17 item 3): MpiRuntime and every MpiProcessGroup set MPI_ERRORS_RETURN.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "dist_env.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

// Under MPI's default handler (MPI_ERRORS_ARE_FATAL) the refused send below would end every
// rank of the test binary from inside MPI_Send.
TEST(MpiErrors, WorldAndSelfReturnErrorCodes) {
  for (MPI_Comm comm : {MPI_COMM_WORLD, MPI_COMM_SELF}) {
    MPI_Errhandler handler = MPI_ERRHANDLER_NULL;
    ASSERT_EQ(MPI_Comm_get_errhandler(comm, &handler), MPI_SUCCESS);
    EXPECT_EQ(handler, MPI_ERRORS_RETURN);
  }
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  float x = 0.0f;
  const int code = MPI_Send(&x, 1, MPI_FLOAT, size + 3, 0, MPI_COMM_WORLD);  // no such rank
  int error_class = MPI_SUCCESS;
  MPI_Error_class(code, &error_class);
  EXPECT_EQ(error_class, MPI_ERR_RANK);
}

std::vector<int> pairs() { return test::launched_world_size() >= 2 ? std::vector<int>{2} : std::vector<int>{}; }

class MpiErrorsOfAGroup : public ::testing::TestWithParam<int> {};

// A message longer than the receive buffer is MPI_ERR_TRUNCATE on the receiver: a CommError
// naming the call, the group and the rank, and the group stays usable afterwards.
TEST_P(MpiErrorsOfAGroup, ATruncatedReceiveIsACommErrorNamingTheGroup) {
  const auto world = test::runtime().world_group();
  const bool member = world->rank() < GetParam();
  const auto pair = world->split(member ? 0 : 1, world->rank(), "pair");
  if (member) {
    if (pair->rank() == 0) {
      const std::vector<float> eight(8, 1.0f);
      pair->send(eight, 1, 7);
    } else {
      std::vector<float> four(4);
      try {
        pair->recv(four, 0, 7);
        ADD_FAILURE() << "a receive of 4 floats took a message of 8 without an error";
      } catch (const CommError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("MPI_Recv failed on group '" + pair->name() + "' (rank 1 of 2)"),
                  std::string::npos)
            << what;
        EXPECT_NE(what.find("MPI_ERR_TRUNCATE"), std::string::npos) << what;
      }
    }
    std::vector<float> one{1.0f};
    pair->all_reduce_sum(one);
    EXPECT_EQ(one[0], 2.0f);
  }
  world->barrier();
}
INSTANTIATE_TEST_SUITE_P(World, MpiErrorsOfAGroup, ::testing::ValuesIn(pairs()));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MpiErrorsOfAGroup);

}  // namespace
}  // namespace meshtrain
