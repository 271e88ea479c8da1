// `trellis launch`: starts a training job (mpirun, srun under Slurm, or one process), watches it,
// and when it fails relaunches it with --resume from the newest complete checkpoint, as torchrun's
// --max-restarts does. It can shrink the world (data-parallel size first) when ranks cannot be
// brought back; the global checkpoint reshards to the new layout on load.
#include <signal.h>
#include <sys/wait.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "trellis/cli/commands.h"
#include "trellis/core/error.h"
#include "trellis/io/checkpoint.h"

namespace trellis {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::system_clock;

// Exit codes of `trellis launch`.
constexpr int kExitOk = 0, kExitBadInput = 2, kExitGaveUp = 3, kExitInterrupted = 130;

struct LaunchArgs {
  int np = 1, min_np = 0, max_restarts = 3;
  double backoff = 5.0;
  std::string hosts, launcher = "auto";
  std::vector<std::string> launcher_args, command;
};

volatile sig_atomic_t g_interrupted = 0;
volatile sig_atomic_t g_job = 0;  // the running attempt's pid (0: none)
// SIGTERM (a scheduler, `kill`) reaches this process alone, so it goes on to the job, whose ranks
// then save their step and exit (train/stop_signal.h); Ctrl-C's SIGINT reaches the whole
// process group already.
void on_signal(int sig) {
  g_interrupted = 1;
  if (sig == SIGTERM && g_job > 0) kill(pid_t(g_job), SIGTERM);
}

// What the supervisor needs of the run's settings, read back from `train … --dump-config` so
// that config files, --set and flags resolve exactly as `train` resolves them.
struct RunSettings {
  std::string out;
  int64_t batch_size = 0, micro_batch_size = 0;
  int dp = 0, tp = 1, pp = 1;
};

struct Child {
  int status = 0;  // waitpid's
  std::string output;
};

// Runs argv with TRELLIS_RESTART=restart in its environment; waits for it. capture: collect its
// stdout instead of passing it through.
Child spawn(const std::vector<std::string>& argv, int restart, bool capture, bool job = false) {
  int pipefd[2] = {-1, -1};
  if (capture) TRELLIS_CHECK(pipe(pipefd) == 0, "pipe failed");
  const pid_t pid = fork();
  TRELLIS_CHECK(pid >= 0, "fork failed");
  if (pid == 0) {
    if (capture) {
      dup2(pipefd[1], STDOUT_FILENO);
      close(pipefd[0]);
      close(pipefd[1]);
    }
    setenv("TRELLIS_RESTART", std::to_string(restart).c_str(), 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "trellis launch: error: cannot run %s\n", args[0]);
    _exit(kExitBadInput);
  }
  Child c;
  if (job) g_job = pid;
  if (capture) {
    close(pipefd[1]);
    char buf[4096];
    for (ssize_t n; (n = read(pipefd[0], buf, sizeof buf)) > 0;) c.output.append(buf, size_t(n));
    close(pipefd[0]);
  }
  while (waitpid(pid, &c.status, 0) < 0 && errno == EINTR) {
  }
  g_job = 0;
  return c;
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string cause(int status) {
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
  return fmt::format("exit code {}", exit_code(status));
}

RunSettings read_settings(const std::string& self, const std::vector<std::string>& train) {
  std::vector<std::string> argv = {self};
  argv.insert(argv.end(), train.begin(), train.end());
  argv.push_back("--dump-config");
  const Child c = spawn(argv, 0, true);
  // train printed its own one-line error: a bad configuration is never retried.
  if (exit_code(c.status) != 0) throw Error(ErrorKind::Input, "the train settings are invalid");
  const toml::table t = toml::parse(c.output);
  RunSettings s;
  s.out = t["out"].value_or(std::string("out"));
  s.batch_size = t["batch_size"].value_or(int64_t(0));
  s.micro_batch_size = t["micro_batch_size"].value_or(int64_t(0));
  s.dp = int(t["dp"].value_or(int64_t(0)));
  s.tp = int(t["tp"].value_or(int64_t(1)));
  s.pp = int(t["pp"].value_or(int64_t(1)));
  return s;
}

int64_t checkpoint_step(const std::string& dir) {
  if (dir.empty()) return 0;
  const std::string name = fs::path(dir).filename().string();  // step_NNNNNNNN
  return std::stoll(name.substr(5));
}

// The last training step metrics.jsonl recorded (0: none).
int64_t last_logged_step(const std::string& out) {
  std::ifstream in(out + "/metrics.jsonl");
  int64_t step = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("loss")) step = std::max(step, j.value("step", int64_t(0)));
  }
  return step;
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The data-parallel size for a world of at most `max_world` ranks: the largest dp that keeps
// tp x pp and divides the global batch into whole micro-batches; 0 if none reaches min_world.
int shrink_dp(const RunSettings& s, int max_world, int min_world) {
  const int cell = s.tp * s.pp;
  for (int dp = max_world / cell; dp >= 1 && dp * cell >= min_world; --dp) {
    if (s.batch_size % dp != 0) continue;
    if (s.micro_batch_size > 0 && (s.batch_size / dp) % s.micro_batch_size != 0) continue;
    return dp;
  }
  return 0;
}

std::vector<std::string> job_argv(const LaunchArgs& a, const std::string& self, int np,
                                  const std::vector<std::string>& train, bool resume, int dp) {
  std::string launcher = a.launcher;
  if (launcher == "auto")
    launcher = std::getenv("SLURM_JOB_ID")  ? "srun"
               : np == 1 && a.hosts.empty() ? "none"
                                            : "mpirun";
  std::vector<std::string> argv;
  if (launcher == "mpirun") {
    argv = {"mpirun", "-np", std::to_string(np), "-x", "TRELLIS_RESTART"};
    if (!a.hosts.empty()) argv.insert(argv.end(), {"-H", a.hosts});
  } else if (launcher == "srun") {
    // --kill-on-bad-exit: one rank's failure ends the step, as under mpirun (Slurm's default
    // lets the others wait for it). --mpi=pmix: Slurm's default (MpiDefault=none) gives ranks
    // no MPI bootstrap; OpenMPI 4 speaks PMIx. SLURM_MPI_TYPE or a --launcher-arg=--mpi=...
    // (later on the line, so it wins) chooses another.
    argv = {"srun", "-n", std::to_string(np), "--kill-on-bad-exit=1"};
    if (!std::getenv("SLURM_MPI_TYPE")) argv.push_back("--mpi=pmix");
  }
  argv.insert(argv.end(), a.launcher_args.begin(), a.launcher_args.end());
  argv.push_back(self);
  argv.insert(argv.end(), train.begin(), train.end());
  if (resume) argv.push_back("--resume");
  if (dp > 0) argv.insert(argv.end(), {"--dp", std::to_string(dp)});
  return argv;
}

// The smallest world to shrink to (--min-np, default --np), once the options are checked.
int check_launch_args(const LaunchArgs& a) {
  TRELLIS_REQUIRE(!a.command.empty() && a.command[0] == "train",
                  "launch runs `train`: trellis launch [options] -- train [train options]");
  TRELLIS_REQUIRE(a.np >= 1, "--np must be >= 1 (got {})", a.np);
  TRELLIS_REQUIRE(a.max_restarts >= 0, "--max-restarts must be >= 0 (got {})", a.max_restarts);
  TRELLIS_REQUIRE(a.backoff >= 0.0, "--backoff must be >= 0 (got {})", a.backoff);
  const int min_np = a.min_np > 0 ? a.min_np : a.np;
  TRELLIS_REQUIRE(min_np <= a.np, "--min-np {} exceeds --np {}", min_np, a.np);
  TRELLIS_REQUIRE(a.launcher == "auto" || a.launcher == "mpirun" || a.launcher == "srun" ||
                      a.launcher == "none",
                  "--launcher must be auto, mpirun, srun or none (got {})", a.launcher);
  TRELLIS_REQUIRE(a.launcher != "none" || a.np == 1, "--launcher none runs one process (--np 1)");
  return min_np;
}

// What a failed attempt lost: the steps after the newest checkpoint, and the time since it was
// written (or since the attempt started, if it is older).
struct Loss {
  std::string latest;  // the newest complete checkpoint ("": none)
  int64_t reached = 0, saved = 0;
  double seconds = 0;
};

Loss work_lost(const std::string& out, Clock::time_point started, Clock::time_point failed_at) {
  Loss l;
  l.latest = find_latest_checkpoint(out);
  l.reached = last_logged_step(out);
  l.saved = checkpoint_step(l.latest);
  auto since = started;
  if (!l.latest.empty()) {
    const auto written = std::chrono::file_clock::to_sys(fs::last_write_time(l.latest));
    since = std::max(since, std::chrono::time_point_cast<Clock::duration>(written));
  }
  l.seconds = seconds_between(since, failed_at);
  return l;
}

// The world of the next attempt: ranks that fail twice in a row before a new checkpoint are
// taken as lost, and the data-parallel size shrinks (as far as min_np allows).
struct World {
  int np = 1, dp = 0, stalled = 0;
};

void shrink_if_stalled(World& w, const RunSettings& s, int min_np) {
  if (w.stalled >= 2 && w.np > min_np) {
    const int new_dp = shrink_dp(s, w.np - 1, min_np);
    if (new_dp > 0) {
      w.dp = new_dp;
      w.np = new_dp * s.tp * s.pp;
      w.stalled = 0;
    }
  }
}

// One row of OUT/restarts.jsonl and the line on stderr for a relaunch.
void report_restart(const LaunchArgs& a, const RunSettings& s, int restart, int status,
                    const Loss& l, const World& w, int old_np) {
  nlohmann::json row = {
      {"restart", restart + 1},
      {"cause", cause(status)},
      {"exit_code", exit_code(status)},
      {"step_reached", l.reached},
      {"resume_from", l.latest.empty() ? nlohmann::json() : nlohmann::json(l.latest)},
      {"resume_step", l.saved},
      {"steps_lost", std::max<int64_t>(0, l.reached - l.saved)},
      {"time_lost_s", l.seconds},
      {"world", w.np}};
  if (w.np != old_np) row["world_before"] = old_np;
  fs::create_directories(s.out);
  std::ofstream(s.out + "/restarts.jsonl", std::ios::app) << row.dump() << "\n";
  fmt::print(stderr,
             "trellis launch: the job failed ({}) at step {}; restart {}/{} from {} ({} steps, "
             "{:.1f} s lost){} in {:g} s\n",
             cause(status), l.reached, restart + 1, a.max_restarts,
             l.latest.empty() ? "the start" : l.latest, std::max<int64_t>(0, l.reached - l.saved),
             l.seconds,
             w.np != old_np ? fmt::format(", world {} -> {} (dp {})", old_np, w.np, w.dp) : "",
             a.backoff);
}

int run_launch(const LaunchArgs& a) {
  const int min_np = check_launch_args(a);
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const RunSettings s = read_settings(self, a.command);
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);

  World w{a.np, 0, 0};
  std::string resumed_from;  // the checkpoint the current attempt started from
  for (int restart = 0;; ++restart) {
    const auto started = Clock::now();
    const Child c =
        spawn(job_argv(a, self, w.np, a.command, restart > 0, w.dp), restart, false, true);
    const auto failed_at = Clock::now();
    const int code = exit_code(c.status);
    if (code == kExitOk) {
      if (restart > 0) fmt::print("trellis launch: done after {} restart(s)\n", restart);
      return kExitOk;
    }
    if (g_interrupted) return kExitInterrupted;
    if (code == kExitBadInput) {
      fmt::print(stderr, "trellis launch: the job refused its input (exit code 2): not retried\n");
      return kExitBadInput;
    }
    const Loss lost = work_lost(s.out, started, failed_at);
    w.stalled = lost.latest != resumed_from ? 0 : w.stalled + 1;
    resumed_from = lost.latest;
    if (restart == a.max_restarts) {
      fmt::print(stderr,
                 "trellis launch: error: the job failed ({}) at step {} and {} restart(s) are "
                 "used up; newest checkpoint: {}\n",
                 cause(c.status), lost.reached, a.max_restarts,
                 lost.latest.empty() ? "none" : lost.latest);
      return kExitGaveUp;
    }
    const int old_np = w.np;
    shrink_if_stalled(w, s, min_np);
    report_restart(a, s, restart, c.status, lost, w, old_np);
    std::this_thread::sleep_for(std::chrono::duration<double>(a.backoff));
    if (g_interrupted) return kExitInterrupted;
  }
}

}  // namespace

Command add_launch_command(CLI::App& app) {
  auto a = std::make_shared<LaunchArgs>();
  CLI::App* sub = app.add_subcommand(
      "launch",
      "run `train` under mpirun/srun and restart it from its newest checkpoint when it fails "
      "(exit codes: 0 done, 2 bad input (never retried), 3 restarts used up, 130 interrupted)");
  sub->add_option("--np", a->np, "ranks")->capture_default_str();
  sub->add_option("--hosts", a->hosts, "mpirun -H host list, e.g. node1:8,node2:8");
  sub->add_option("--max-restarts", a->max_restarts, "relaunches after failures")
      ->capture_default_str();
  sub->add_option("--backoff", a->backoff, "seconds to wait before each relaunch")
      ->capture_default_str();
  sub->add_option("--min-np", a->min_np,
                  "smallest world to shrink to when ranks fail twice in a row without a new "
                  "checkpoint (data-parallel size shrinks; default: --np, never shrink)");
  sub->add_option("--launcher", a->launcher,
                  "auto (srun under Slurm, mpirun for several ranks, none for one), mpirun, srun "
                  "or none")
      ->capture_default_str();
  sub->add_option("--launcher-arg", a->launcher_args,
                  "one more argument for mpirun/srun (repeatable), e.g. --launcher-arg=--mca")
      ->allow_extra_args(false);
  sub->add_option("command", a->command, "-- train [train options]")->required();
  return {sub, [a](Communicator&) { return run_launch(*a); }};
}

}  // namespace trellis
