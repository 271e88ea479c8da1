#include "trellis/train/stop_signal.h"

#include <csignal>

namespace trellis {
namespace {
volatile std::sig_atomic_t g_caught = 0;
extern "C" void on_stop_signal(int sig) { g_caught = sig; }
}  // namespace

void catch_stop_signals() {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
}

int caught_stop_signal() { return int(g_caught); }

}  // namespace trellis
