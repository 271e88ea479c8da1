// sgemm paths on GPT-2 shapes: OpenBLAS, BLIS (both loaded with dlopen, so neither has to be the
// BLAS the build links) and oneDNN's dnnl_sgemm (called directly, what trellis uses), at 1 and 2
// threads. Prints a markdown table of median GFLOP/s and the max abs error of sampled entries of C
// against a double-precision dot product.
//
//   build/gemm_paths [--reps R] [--rounds N] [--threads 1,2] [--samples S] [--only SUBSTRING]
//                    [--quick]
//   OPENBLAS_CORETYPE=SkylakeX build/gemm_paths      # OpenBLAS's AVX-512 kernels
//   OPENBLAS_CORETYPE=Haswell  build/gemm_paths      # its AVX2 kernels
//
// OpenBLAS picks its kernels from OPENBLAS_CORETYPE when the library is loaded, so the program
// cannot switch it itself; run it once per core type (the header line says which was used).
// BLIS and oneDNN choose their kernels from CPUID alone.
//
// Row-major throughout: C[M,N] = op(A) op(B), op(A) is M x K, op(B) is K x N; "NT" means B is
// stored transposed (N x K, e.g. logits = x @ wte^T), "TN" that A is (K x M, e.g. a weight
// gradient x^T @ dy). Timing: every (shape, threads) runs each library `reps` times in a block,
// the blocks rotate over the libraries `rounds` times (order reversed every other round) with a
// pause between blocks so spinning worker threads of one library do not steal cores from the
// next; the reported time is the median of the rounds x reps samples. GFLOP/s = 2 M N K / time.
//
// Paths can be overridden: --openblas PATH, --blis PATH (empty string = skip that library);
// --only SUBSTRING keeps the shapes whose description contains it.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

// CBLAS enum values (cblas.h) so we need no CBLAS header.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
using cblas_sgemm_t = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                               int, float, float*, int);

struct Shape {
  const char* what;
  bool ta, tb;
  int64_t M, K, N;
};

// GPT-2 shapes (B*T = 2048 rows for baby at 8x256, 256 rows for gpt2 at 4x64).
const std::vector<Shape> kShapes = {
    {"baby c_attn fwd", false, false, 2048, 384, 1152},
    {"baby mlp c_proj fwd", false, false, 2048, 1536, 384},
    {"baby c_fc dW (TN)", true, false, 384, 2048, 1536},
    {"gpt2 logits x@wte^T (NT)", false, true, 256, 768, 50304},
    {"gpt2 wte grad (TN)", true, false, 768, 256, 50304},
    {"attention q@k^T tile", false, true, 256, 64, 256},
    {"small 256^2x64", false, false, 256, 256, 64},
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void* open_lib(const std::string& path) {
  if (path.empty()) return nullptr;
  // RTLD_DEEPBIND: the library's own symbols first, so its cblas/BLAS entry points never resolve
  // to another BLAS already in the process.
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (!h) std::fprintf(stderr, "# skipping %s: %s\n", path.c_str(), dlerror());
  return h;
}

template <typename T>
T sym(void* h, const char* name) {
  return reinterpret_cast<T>(dlsym(h, name));
}

// Leading dimensions of row-major storage of A, B, C.
int64_t lda_of(const Shape& s) { return s.ta ? s.M : s.K; }
int64_t ldb_of(const Shape& s) { return s.tb ? s.K : s.N; }

void cblas_call(cblas_sgemm_t f, const Shape& s, const float* A, const float* B, float* C) {
  f(kRowMajor, s.ta ? kTrans : kNoTrans, s.tb ? kTrans : kNoTrans, int(s.M), int(s.N), int(s.K),
    1.0f, A, int(lda_of(s)), B, int(ldb_of(s)), 0.0f, C, int(s.N));
}

float a_at(const Shape& s, const float* A, int64_t i, int64_t k) {
  return s.ta ? A[k * s.M + i] : A[i * s.K + k];
}
float b_at(const Shape& s, const float* B, int64_t k, int64_t j) {
  return s.tb ? B[j * s.K + k] : B[k * s.N + j];
}

double max_abs_err(const Shape& s, const float* A, const float* B, const float* C, int samples) {
  std::mt19937_64 rng(1234);
  double worst = 0.0;
  for (int t = 0; t < samples; ++t) {
    const int64_t i = int64_t(rng() % uint64_t(s.M)), j = int64_t(rng() % uint64_t(s.N));
    double ref = 0.0;
    for (int64_t k = 0; k < s.K; ++k) ref += double(a_at(s, A, i, k)) * double(b_at(s, B, k, j));
    worst = std::max(worst, std::fabs(ref - double(C[i * s.N + j])));
  }
  return worst;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    out.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return out;
}

enum class Kind { OpenBLAS, BLIS, OneDNN };

// A library as loaded inside one measuring child process.
struct Lib {
  std::string name, header;
  std::function<void(int)> set_threads;
  std::function<void(const Shape&, const float*, const float*, float*)> gemm;
};

bool load_lib(Kind kind, const std::string& path, Lib& lib) {
  if (kind == Kind::OneDNN) {
    const dnnl_version_t* v = dnnl_version();
    lib.name = "oneDNN";
    lib.header = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                 std::to_string(v->patch) + " (" +
                 (v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other") +
                 " runtime), dnnl_sgemm called directly";
    lib.set_threads = [](int n) { omp_set_num_threads(n); };
    lib.gemm = [](const Shape& s, const float* A, const float* B, float* C) {
      const dnnl_status_t st = dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K, 1.0f,
                                          A, lda_of(s), B, ldb_of(s), 0.0f, C, s.N);
      if (st != dnnl_success) {
        std::fprintf(stderr, "dnnl_sgemm failed: %d\n", int(st));
        std::_Exit(1);
      }
    };
    return true;
  }
  void* h = open_lib(path);
  if (!h) return false;
  auto f = sym<cblas_sgemm_t>(h, "cblas_sgemm");
  if (!f) return false;
  lib.gemm = [f](const Shape& s, const float* A, const float* B, float* C) {
    cblas_call(f, s, A, B, C);
  };
  if (kind == Kind::OpenBLAS) {
    auto set = sym<void (*)(int)>(h, "openblas_set_num_threads");
    auto core = sym<char* (*)()>(h, "openblas_get_corename");
    auto cfg = sym<char* (*)()>(h, "openblas_get_config");
    if (!set) return false;
    const char* env = std::getenv("OPENBLAS_CORETYPE");
    const std::string corename = core ? core() : "?";
    lib.name = "OpenBLAS-" + corename;
    lib.header = std::string(cfg ? cfg() : "OpenBLAS") + ", kernels " + corename +
                 " (OPENBLAS_CORETYPE=" + (env ? env : "unset") + ")";
    lib.set_threads = set;
  } else {
    auto set = sym<void (*)(long)>(h, "bli_thread_set_num_threads");
    auto ver = sym<const char* (*)()>(h, "bli_info_get_version_str");
    auto arch_id = sym<int (*)()>(h, "bli_arch_query_id");
    auto arch_str = sym<const char* (*)(int)>(h, "bli_arch_string");
    if (!set) return false;
    const std::string arch = (arch_id && arch_str) ? arch_str(arch_id()) : "?";
    lib.name = "BLIS-" + arch;
    lib.header = "BLIS " + std::string(ver ? ver() : "?") + " (OpenMP), kernels " + arch;
    lib.set_threads = [set](int n) { set(long(n)); };
  }
  return true;
}

// Runs fn in a forked child and returns what it wrote (empty on failure). Every measurement
// runs in a fresh process that loads only the library it measures: thread pools of one library
// (OpenBLAS' pthreads, a spinning OpenMP team) cannot steal cores from another, and nothing a
// library started survives into the next measurement. The parent never touches any of them.
std::string in_child(const std::function<std::string()>& fn) {
  int fd[2];
  if (pipe(fd) != 0) return "";
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    const std::string out = fn();
    size_t off = 0;
    while (off < out.size()) {
      const ssize_t w = write(fd[1], out.data() + off, out.size() - off);
      if (w <= 0) break;
      off += size_t(w);
    }
    close(fd[1]);
    std::_Exit(0);
  }
  close(fd[1]);
  std::string out;
  char buf[4096];
  for (ssize_t r; (r = read(fd[0], buf, sizeof buf)) > 0;) out.append(buf, size_t(r));
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "";
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3, rounds = 3, samples = 64;
  std::vector<int> threads = {1, 2};
  std::string openblas_path = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0";
  std::string blis_path = "/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4";
  bool quick = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gemm_paths: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--reps") reps = std::max(1, std::atoi(next()));
    else if (a == "--rounds") rounds = std::max(1, std::atoi(next()));
    else if (a == "--samples") samples = std::max(1, std::atoi(next()));
    else if (a == "--threads") threads = parse_list(next());
    else if (a == "--openblas") openblas_path = next();
    else if (a == "--blis") blis_path = next();
    else if (a == "--quick") quick = true;
    else if (a == "--only") only = next();
    else {
      std::fprintf(stderr,
                   "usage: gemm_paths [--reps R] [--rounds N] [--threads 1,2] [--samples S] "
                   "[--openblas PATH] [--blis PATH] [--only SUBSTRING] [--quick]\n");
      return 2;
    }
  }
  if (quick) reps = 1, rounds = 1;

  // Probe each library in a child: name and version line, or skip it.
  struct Entry {
    Kind kind;
    std::string path, name;
  };
  std::vector<Entry> libs;
  for (auto [kind, path] : {std::pair{Kind::OpenBLAS, openblas_path}, {Kind::BLIS, blis_path},
                            {Kind::OneDNN, std::string("-")}}) {
    if (path.empty()) continue;
    const std::string info = in_child([&, kind = kind, path = path] {
      Lib lib;
      return load_lib(kind, path, lib) ? lib.name + "\n" + lib.header : std::string();
    });
    if (info.empty()) {
      std::fprintf(stderr, "# skipping %s\n", path.c_str());
      continue;
    }
    const size_t nl = info.find('\n');
    libs.push_back({kind, path, info.substr(0, nl)});
    std::printf("# %s\n", info.substr(nl + 1).c_str());
  }
  std::printf("# each number: median of %d rounds x %d calls, every round a fresh process per "
              "library (libraries in rotating order); GFLOP/s = 2MNK/t; err = max |C - C_double| "
              "over %d sampled entries of C (inputs uniform in [-1, 1])\n\n",
              rounds, reps, samples);
  std::printf("| shape | M x K x N | op | thr |");
  for (const auto& l : libs) std::printf(" %s GFLOP/s | err |", l.name.c_str());
  std::printf("\n|---|---|---|---|");
  for (size_t i = 0; i < libs.size(); ++i) std::printf("---:|---:|");
  std::printf("\n");
  std::fflush(stdout);

  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const Shape& s : kShapes) {
    if (!only.empty() && std::string(s.what).find(only) == std::string::npos) continue;
    std::vector<float> A(size_t(s.M * s.K)), B(size_t(s.K * s.N)), C(size_t(s.M * s.N));
    for (auto& x : A) x = dist(rng);
    for (auto& x : B) x = dist(rng);
    const double flop = 2.0 * double(s.M) * double(s.N) * double(s.K);
    for (int nt : threads) {
      std::vector<std::vector<double>> times(libs.size());
      std::vector<double> err(libs.size(), NAN);
      for (int r = 0; r < rounds; ++r) {
        for (size_t k = 0; k < libs.size(); ++k) {
          const size_t li = size_t(r + int(k)) % libs.size();
          const std::string out = in_child([&] {
            Lib lib;
            if (!load_lib(libs[li].kind, libs[li].path, lib)) return std::string();
            lib.set_threads(nt);
            std::fill(C.begin(), C.end(), std::nanf(""));
            lib.gemm(s, A.data(), B.data(), C.data());  // warm-up: JIT, thread pool, pages
            char num[64];
            std::snprintf(num, sizeof num, "%.6e",
                          r == 0 ? max_abs_err(s, A.data(), B.data(), C.data(), samples) : -1.0);
            std::string res = num;
            for (int i = 0; i < reps; ++i) {
              const double t0 = now();
              lib.gemm(s, A.data(), B.data(), C.data());
              std::snprintf(num, sizeof num, " %.9e", now() - t0);
              res += num;
            }
            return res;
          });
          if (out.empty()) {
            std::fprintf(stderr, "gemm_paths: %s failed on %s\n", libs[li].name.c_str(), s.what);
            return 1;
          }
          const char* p = out.c_str();
          char* end = nullptr;
          const double e = std::strtod(p, &end);
          if (e >= 0) err[li] = e;
          for (p = end;; p = end) {
            const double t = std::strtod(p, &end);
            if (end == p) break;
            times[li].push_back(t);
          }
        }
      }
      std::printf("| %s | %lldx%lldx%lld | %c%c | %d |", s.what, (long long)s.M, (long long)s.K,
                  (long long)s.N, s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', nt);
      for (size_t li = 0; li < libs.size(); ++li)
        std::printf(" %.1f | %.1e |", flop / median(times[li]) / 1e9, err[li]);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}
