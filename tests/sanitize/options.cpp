// Default options of the sanitizers in a TRELLIS_SANITIZE build (the runtimes call these weak
// hooks at start-up; ASAN_OPTIONS etc. in the environment still override them). Suppressions come
// from the checked-in files next to this one and name third-party libraries only.
#include <cstdlib>

extern "C" {

const char* __asan_default_options() {
  // An error ends the process with a report and exit code 1; leaks are checked (LSan).
  return "detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=0";
}

// Asked at exit, when the environment can be read (it cannot yet when the options above are).
// Leak checking is off in a rank started by mpirun: OpenMPI loads its components with dlopen and
// unloads them in MPI_Finalize, so what they never free is reported from "<unknown module>"
// frames that no suppression can attribute to OpenMPI (measured: 57 leak reports for a 2-rank
// `train`, none in trellis code). Every single-process run, the supervisor `trellis launch`
// included, keeps leak checking.
int __lsan_is_turned_off() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

const char* __lsan_default_options() {
  return "suppressions=" TRELLIS_SANITIZE_DIR "/lsan.supp:print_suppressions=0";
}

const char* __ubsan_default_options() {
  return "print_stacktrace=1:halt_on_error=1:suppressions=" TRELLIS_SANITIZE_DIR "/ubsan.supp";
}
}
