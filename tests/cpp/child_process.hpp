// Test helper: waits for a forked child and checks that it exited with status 0.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

namespace shardlab_test {

// Success when child `pid` exits with status 0 within 30 s; a child still running then is
// killed and reported as hung in `what`.
inline ::testing::AssertionResult ChildExitsCleanly(pid_t pid, const std::string& what) {
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return ::testing::AssertionFailure() << "the forked child hung in " << what;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!WIFEXITED(status)) return ::testing::AssertionFailure() << "the forked child died (status " << status << ")";
  if (WEXITSTATUS(status) != 0) {
    return ::testing::AssertionFailure() << "the forked child exited with status " << WEXITSTATUS(status);
  }
  return ::testing::AssertionSuccess();
}

}  // namespace shardlab_test
