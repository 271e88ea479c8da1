// `trellis train`: every config key is a flag (--batch-size for batch_size), settable from a
// TOML file (--config) and --set key=value too. Precedence: defaults < file < --set < flags;
// epochs and val_per_epoch, when set, replace steps and val_every unless those are given on the
// command line.
#include <fmt/format.h>

#include <algorithm>

#include "trellis/cli/commands.h"
#include "trellis/cli/ensemble.h"
#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"
#include "trellis/train/config.h"
#include "trellis/train/stop_signal.h"
#include "trellis/train/trainer.h"

namespace trellis {

namespace {

std::string flag_name(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return "--" + key;
}

struct TrainArgs {
  TrainConfig cfg;
  std::vector<ConfigKey> keys = config_keys(cfg);
  std::string config_file;
  std::vector<std::string> sets;
  bool dump = false;
  bool dry_run = false, json = false;
  std::vector<std::pair<std::string, CLI::Option*>> flag_opts;
  std::vector<std::string> flag_values;
};

}  // namespace

Command add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* sub = app.add_subcommand("train", "train a Transformer (one process or under mpirun)");
  sub->add_option("--config", args->config_file, "TOML file of key = value settings")
      ->check(CLI::ExistingFile);
  sub->add_option("--set", args->sets, "override one setting: --set key=value (repeatable)");
  sub->add_flag("--dump-config", args->dump, "print the effective configuration as TOML and exit");
  sub->add_flag("--dry-run", args->dry_run,
                "print the predicted memory per rank of this layout (parameters, gradients, "
                "optimizer state, activations) and exit; one process, any --dp/--tp/--pp");
  sub->add_flag("--json", args->json, "with --dry-run: the prediction as JSON");
  args->flag_values.resize(args->keys.size());
  for (size_t i = 0; i < args->keys.size(); ++i) {
    ConfigKey& k = args->keys[i];
    const std::string def = k.get();
    CLI::Option* opt;
    const bool boolean = k.type == "BOOL";
    // Booleans work as bare flags (--quiet) and with a value (--tensorboard false); a default
    // string would fill in for the missing value, so theirs goes into the help text instead.
    opt = sub->add_option(flag_name(k.name), args->flag_values[i],
                          boolean ? k.help + " (default " + def + ")" : k.help)
              ->type_name(boolean ? "[BOOL]" : k.type);
    if (boolean)
      opt->expected(0, 1);
    else
      opt->default_str(def);
    opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // the last occurrence wins
    args->flag_opts.emplace_back(k.name, opt);
  }
  auto run = [args](Communicator& world) {
    if (!args->config_file.empty()) apply_toml_file(args->keys, args->config_file);
    for (const std::string& s : args->sets) {
      const size_t eq = s.find('=');
      TRELLIS_REQUIRE(eq != std::string::npos && eq > 0, "--set expects key=value, got '{}'", s);
      apply_setting(args->keys, s.substr(0, eq), s.substr(eq + 1));
    }
    // A bare boolean flag means true; an empty value for any other key is that value (e.g.
    // --augment "" switches off a config's augmentation).
    for (size_t i = 0; i < args->flag_opts.size(); ++i)
      if (args->flag_opts[i].second->count() > 0)
        apply_setting(args->keys, args->flag_opts[i].first,
                      args->flag_values[i].empty() && args->keys[i].type == "BOOL"
                          ? "true"
                          : args->flag_values[i]);
    // A count given on the command line wins over the other unit from the config file.
    auto on_command_line = [&](const std::string& key) {
      for (size_t i = 0; i < args->flag_opts.size(); ++i)
        if (args->flag_opts[i].first == key && args->flag_opts[i].second->count() > 0) return true;
      return std::any_of(args->sets.begin(), args->sets.end(),
                         [&](const std::string& s) { return s.starts_with(key + "="); });
    };
    if (on_command_line("steps") && !on_command_line("epochs")) args->cfg.epochs = 0.0;
    if (on_command_line("val_every") && !on_command_line("val_per_epoch"))
      args->cfg.val_per_epoch = 0.0;
    if (args->dump) {
      fmt::print("{}", dump_config(args->keys));
      return 0;
    }
    if (args->dry_run) return dry_run(args->cfg, args->json);
    catch_stop_signals();
    return train_ensemble(args->cfg, world);
  };
  return {sub, run};
}

}  // namespace trellis
