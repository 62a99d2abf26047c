#include "meshtrain/config/load.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <variant>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

// A setting is an integer, a number, a flag, free text, or one of the names of a config enum
// (config.h's tables).
using FieldRef = std::variant<std::int64_t*, double*, bool*, std::string*, ModelFamily*, LrScaling*,
                              RecomputeMode*, Precision*, CpCommMode*, PipelineSchedule*,
                              MoeDropPolicy*, DataFormat*, DataSampler*, FaultValue*, FaultPhase*>;
struct Field {
  std::string key;  // "section.name"
  FieldRef ref;
};

// The one list of keys: loading, overriding, printing and "did you mean" all read it, so a new
// setting is added in exactly one place besides its struct.
std::vector<Field> fields_of(Config& c) {
  return {
      {"model.family", &c.model.family},
      {"model.n_layer", &c.model.n_layer},
      {"model.n_head", &c.model.n_head},
      {"model.n_kv_head", &c.model.n_kv_head},
      {"model.n_embd", &c.model.n_embd},
      {"model.ffn_hidden", &c.model.ffn_hidden},
      {"model.block_size", &c.model.block_size},
      {"model.vocab_size", &c.model.vocab_size},
      {"model.bias", &c.model.bias},
      {"model.dropout", &c.model.dropout},
      {"model.init_std", &c.model.init_std},
      {"model.norm_eps", &c.model.norm_eps},
      {"model.rope_theta", &c.model.rope_theta},
      {"model.moe_experts", &c.model.moe_experts},
      {"model.moe_top_k", &c.model.moe_top_k},
      {"model.moe_ffn_hidden", &c.model.moe_ffn_hidden},
      {"model.moe_layer_freq", &c.model.moe_layer_freq},
      {"model.moe_capacity_factor", &c.model.moe_capacity_factor},
      {"model.moe_token_drop_policy", &c.model.moe_token_drop_policy},
      {"model.moe_aux_loss_coeff", &c.model.moe_aux_loss_coeff},
      {"model.moe_z_loss_coeff", &c.model.moe_z_loss_coeff},
      {"training.micro_batch", &c.training.micro_batch},
      {"training.accumulation", &c.training.accumulation},
      {"training.global_batch", &c.training.global_batch},
      {"training.max_steps", &c.training.max_steps},
      {"training.lr", &c.training.lr},
      {"training.min_lr", &c.training.min_lr},
      {"training.warmup_steps", &c.training.warmup_steps},
      {"training.lr_decay_steps", &c.training.lr_decay_steps},
      {"training.lr_scaling", &c.training.lr_scaling},
      {"training.lr_base_batch", &c.training.lr_base_batch},
      {"training.weight_decay", &c.training.weight_decay},
      {"training.beta1", &c.training.beta1},
      {"training.beta2", &c.training.beta2},
      {"training.eps", &c.training.eps},
      {"training.grad_clip", &c.training.grad_clip},
      {"training.check_for_nan_in_grad", &c.training.check_for_nan_in_grad},
      {"training.eval_interval", &c.training.eval_interval},
      {"training.eval_batches", &c.training.eval_batches},
      {"training.log_interval", &c.training.log_interval},
      {"training.seed", &c.training.seed},
      {"training.threads", &c.training.threads},
      {"training.recompute", &c.training.recompute},
      {"training.peak_flops_per_core", &c.training.peak_flops_per_core},
      {"training.precision", &c.training.precision},
      {"training.loss_scale_init", &c.training.loss_scale_init},
      {"training.loss_scale_growth_interval", &c.training.loss_scale_growth_interval},
      {"training.loss_scale_growth", &c.training.loss_scale_growth},
      {"training.loss_scale_backoff", &c.training.loss_scale_backoff},
      {"training.loss_scale_hysteresis", &c.training.loss_scale_hysteresis},
      {"training.straggler_interval", &c.training.straggler_interval},
      {"training.straggler_threshold", &c.training.straggler_threshold},
      {"parallel.dp", &c.parallel.dp},
      {"parallel.tp", &c.parallel.tp},
      {"parallel.pp", &c.parallel.pp},
      {"parallel.cp", &c.parallel.cp},
      {"parallel.ep", &c.parallel.ep},
      {"parallel.cp_comm", &c.parallel.cp_comm},
      {"parallel.sequence_parallel", &c.parallel.sequence_parallel},
      {"parallel.pp_schedule", &c.parallel.pp_schedule},
      {"parallel.virtual_stages", &c.parallel.virtual_stages},
      {"parallel.pp_layers", &c.parallel.pp_layers},
      {"parallel.bucket_mib", &c.parallel.bucket_mib},
      {"parallel.overlap_grad_reduce", &c.parallel.overlap_grad_reduce},
      {"parallel.zero_stage", &c.parallel.zero_stage},
      {"parallel.debug_collectives", &c.parallel.debug_collectives},
      {"parallel.comm_timeout_s", &c.parallel.comm_timeout_s},
      {"parallel.flight_recorder_size", &c.parallel.flight_recorder_size},
      {"data.dir", &c.data.dir},
      {"data.format", &c.data.format},
      {"data.train_file", &c.data.train_file},
      {"data.val_file", &c.data.val_file},
      {"data.sampler", &c.data.sampler},
      {"data.tokenizer", &c.data.tokenizer},
      {"checkpoint.dir", &c.checkpoint.dir},
      {"checkpoint.save_final", &c.checkpoint.save_final},
      {"checkpoint.interval", &c.checkpoint.interval},
      {"checkpoint.keep_last", &c.checkpoint.keep_last},
      {"checkpoint.async", &c.checkpoint.async},
      {"checkpoint.resume", &c.checkpoint.resume},
      {"checkpoint.init_from", &c.checkpoint.init_from},
      {"fault_injection.nonfinite_grad_step", &c.fault_injection.nonfinite_grad_step},
      {"fault_injection.nonfinite_grad_rank", &c.fault_injection.nonfinite_grad_rank},
      {"fault_injection.nonfinite_grad_value", &c.fault_injection.nonfinite_grad_value},
      {"fault_injection.slow_rank", &c.fault_injection.slow_rank},
      {"fault_injection.slow_phase", &c.fault_injection.slow_phase},
      {"fault_injection.slow_seconds", &c.fault_injection.slow_seconds},
      {"fault_injection.kill_step", &c.fault_injection.kill_step},
      {"fault_injection.kill_rank", &c.fault_injection.kill_rank},
      {"fault_injection.hang_step", &c.fault_injection.hang_step},
      {"fault_injection.hang_rank", &c.fault_injection.hang_rank},
  };
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The name after the section: `lr` of `training.lr` (the whole key when it has no section).
std::string_view name_in_section(std::string_view key) {
  const auto dot = key.find('.');
  return dot == std::string_view::npos ? key : key.substr(dot + 1);
}

// Distance of `key` to a known key: the smaller of the whole-key distance and the distance of
// the names after the section (so `optim.lr` finds `training.lr`).
std::size_t key_distance(std::string_view key, std::string_view known) {
  return std::min(edit_distance(key, known),
                  edit_distance(name_in_section(key), name_in_section(known)) + 1);
}

// Megatron-LM's and nanoGPT's names for settings meshtrain spells otherwise, matched on the
// name after the section with '-' read as '_' (so `--training.micro-batch-size` and
// `data.path` find theirs): what a user of either tool types first.
struct Alias {
  std::string_view name, fix;
};
constexpr Alias kAliases[] = {
    {"fp16", "set training.precision = \"fp16\""},
    {"bf16", "set training.precision = \"bf16\""},
    {"micro_batch_size", "use training.micro_batch"},
    {"batch_size", "use training.micro_batch (per rank) or training.global_batch"},
    {"global_batch_size", "use training.global_batch"},
    {"gradient_accumulation_steps", "use training.accumulation"},
    {"seq_length", "use model.block_size"},
    {"seq_len", "use model.block_size"},
    {"num_layers", "use model.n_layer"},
    {"hidden_size", "use model.n_embd"},
    {"num_attention_heads", "use model.n_head"},
    {"learning_rate", "use training.lr"},
    {"train_iters", "use training.max_steps"},
    {"max_iters", "use training.max_steps"},
    {"eval_iters", "use training.eval_batches"},
    {"save_interval", "use checkpoint.interval"},
    {"data_path", "use data.dir (a folder `meshtrain prepare` wrote)"},
    {"path", "use data.dir (a folder `meshtrain prepare` wrote)"},
    {"tensor_model_parallel_size", "use parallel.tp"},
    {"pipeline_model_parallel_size", "use parallel.pp"},
    {"context_parallel_size", "use parallel.cp"},
    {"expert_model_parallel_size", "use parallel.ep"},
};

ConfigIssue unknown_key(const std::string& key, const std::vector<Field>& fields) {
  std::string name(name_in_section(key));
  std::replace(name.begin(), name.end(), '-', '_');
  for (const Alias& alias : kAliases) {
    if (name == alias.name)
      return {key, "(unknown key)", "not a meshtrain setting", std::string(alias.fix)};
  }
  const Field* best = &fields.front();
  for (const Field& f : fields) {
    if (key_distance(key, f.key) < key_distance(key, best->key)) best = &f;
  }
  // A far match misleads (`training.bogus` is not `model.bias`): suggest only a near one.
  if (key_distance(key, best->key) > std::max<std::size_t>(2, name.size() / 3)) {
    return {key, "(unknown key)", "not a meshtrain setting",
            "no setting is close to it; docs/configuration.md lists every key"};
  }
  return {
      key, "(unknown key)", "not a meshtrain setting",
      fmt::format("did you mean `{}`? (docs/configuration.md lists every key)", best->key)};
}

std::string type_name(const FieldRef& ref) {
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::int64_t>) return "an integer";
        if constexpr (std::is_same_v<T, double>) return "a finite number";
        if constexpr (std::is_same_v<T, bool>) return "true or false";
        if constexpr (std::is_enum_v<T>) return "one of: " + allowed_names<T>();
        return "a string";
      },
      ref);
}

// The fix for a name that is not one of an enum setting's: its default and the other names.
template <ConfigEnum E>
std::string fix_for_enum(const std::string& key, E default_value, bool command_line) {
  std::string others;
  for (const auto& entry : enum_names(default_value)) {
    if (entry.value != default_value) others += fmt::format(", {}", entry.name);
  }
  return command_line
             ? fmt::format("pass --{} {} (or{})", key, to_string(default_value), others.substr(1))
             : fmt::format("set {} = \"{}\" (or{})", key, to_string(default_value),
                           others.substr(1));
}

// The default value of `field`, as its type (fields_of a default Config).
template <typename T>
T default_of(const Field& field) {
  Config defaults;
  for (const Field& f : fields_of(defaults)) {
    if (f.key == field.key) return *std::get<T*>(f.ref);
  }
  return T{};
}

// How to write a value of the field's type in TOML; a string's example is the setting's own
// (its default, or a typical value where the default is empty).
std::string fix_for_type(const Field& field) {
  return std::visit(
      [&](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::int64_t>) return "write a whole number, e.g. 4";
        if constexpr (std::is_same_v<T, double>) return "write a finite number, e.g. 1e-3";
        if constexpr (std::is_same_v<T, bool>) return "write true or false, without quotes";
        if constexpr (std::is_enum_v<T>) {
          return fix_for_enum(field.key, default_of<T>(field), /*command_line=*/false);
        }
        std::string example = default_of<std::string>(field);
        if (field.key == "parallel.pp_layers") example = "3,1";  // its default is empty
        return fmt::format("write it as one string in double quotes, e.g. {} = \"{}\"", field.key,
                           example);
      },
      field.ref);
}

// Sets a field from a TOML node; false when the node has the wrong type.
bool assign(const FieldRef& ref, const toml::node& node) {
  return std::visit(
      [&](auto* p) -> bool {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::int64_t>) {
          if (auto v = node.value_exact<std::int64_t>()) return *p = *v, true;
        } else if constexpr (std::is_same_v<T, double>) {
          // Integers widen; inf and nan are TOML floats but no setting accepts them.
          if (auto v = node.value<double>(); v && std::isfinite(*v)) return *p = *v, true;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (auto v = node.value_exact<bool>()) return *p = *v, true;
        } else if constexpr (std::is_enum_v<T>) {
          if (auto v = node.value_exact<std::string>()) {
            if (auto e = parse_enum<T>(*v)) return *p = *e, true;
          }
        } else {
          if (auto v = node.value_exact<std::string>()) return *p = *v, true;
        }
        return false;
      },
      ref);
}

// Sets a field from command-line text; false when the text does not parse as the type.
bool assign_text(const FieldRef& ref, const std::string& text) {
  return std::visit(
      [&](auto* p) -> bool {
        using T = std::remove_pointer_t<decltype(p)>;
        const char* end = text.data() + text.size();
        if constexpr (std::is_same_v<T, std::int64_t>) {
          std::int64_t v = 0;
          auto [ptr, ec] = std::from_chars(text.data(), end, v);
          if (ec != std::errc() || ptr != end) return false;
          *p = v;
        } else if constexpr (std::is_same_v<T, double>) {
          double v = 0;
          auto [ptr, ec] = std::from_chars(text.data(), end, v);
          if (ec != std::errc() || ptr != end || !std::isfinite(v)) return false;
          *p = v;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (text != "true" && text != "false") return false;
          *p = text == "true";
        } else if constexpr (std::is_enum_v<T>) {
          const std::optional<T> v = parse_enum<T>(text);
          if (!v) return false;
          *p = *v;
        } else {
          *p = text;
        }
        return true;
      },
      ref);
}

// True when `text` is written as a whole number but does not fit the integer field's int64:
// its rule is the range, not the type ("must be an integer" would mislead).
bool beyond_int64(const Field& field, const std::string& text) {
  if (!std::holds_alternative<std::int64_t*>(field.ref)) return false;
  std::int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  return ec == std::errc::result_out_of_range && ptr == text.data() + text.size();
}

// How to pass a value of the field's type on the command line.
std::string fix_for_text(const Field& field) {
  return std::visit(
      [&](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_enum_v<T>) {
          return fix_for_enum(field.key, default_of<T>(field), /*command_line=*/true);
        }
        return fmt::format("pass --{} <{}>", field.key, type_name(field.ref));
      },
      field.ref);
}

std::string node_text(const toml::node& node) {
  std::ostringstream out;
  node.visit([&](const auto& v) { out << v; });
  return out.str();
}

Field* find_field(std::vector<Field>& fields, std::string_view key) {
  auto it =
      std::find_if(fields.begin(), fields.end(), [&](const Field& f) { return f.key == key; });
  return it == fields.end() ? nullptr : &*it;
}

void apply_table(const toml::table& root, std::vector<Field>& fields,
                 std::vector<ConfigIssue>& issues) {
  for (const auto& [section, section_node] : root) {
    const toml::table* table = section_node.as_table();
    if (table == nullptr || section_node.is_array_of_tables()) {
      const std::string name(section.str());
      const bool known = std::any_of(fields.begin(), fields.end(), [&](const Field& f) {
        return f.key.rfind(name + ".", 0) == 0;
      });
      issues.push_back(known ? ConfigIssue{name, node_text(section_node),
                                           "a section must be a table of settings",
                                           fmt::format("write a [{}] header with `key = value` "
                                                       "lines under it",
                                                       name)}
                             : unknown_key(name, fields));
      continue;
    }
    for (const auto& [name, node] : *table) {
      const std::string key = fmt::format("{}.{}", section.str(), name.str());
      Field* field = find_field(fields, key);
      if (field == nullptr) {
        issues.push_back(unknown_key(key, fields));
      } else if (!assign(field->ref, node)) {
        issues.push_back({key, node_text(node), fmt::format("must be {}", type_name(field->ref)),
                          fix_for_type(*field)});
      }
    }
  }
}

}  // namespace

Config load_config_text(const std::string& toml_text, const std::string& source,
                        const std::vector<Override>& overrides) {
  Config config;
  config.source = source;
  std::vector<Field> fields = fields_of(config);
  std::vector<ConfigIssue> issues;
  try {
    const toml::table root = toml::parse(toml_text, source);
    apply_table(root, fields, issues);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    issues.push_back({fmt::format("{}:{}:{}", source, where.line, where.column), "(syntax)",
                      std::string(e.description()), "fix the TOML syntax at that position"});
  }
  for (const auto& [key, text] : overrides) {
    Field* field = find_field(fields, key);
    if (field == nullptr) {
      issues.push_back(unknown_key(key, fields));
    } else if (!assign_text(field->ref, text)) {
      const std::string rule =
          beyond_int64(*field, text)
              ? "must fit a 64-bit integer (magnitude at most 9223372036854775807; the "
                "setting's own range is narrower)"
              : fmt::format("must be {}", type_name(field->ref));
      issues.push_back({key, text, rule, fix_for_text(*field)});
    }
  }
  if (!issues.empty()) throw ConfigError(source, std::move(issues));
  return config;
}

Config load_config_file(const std::filesystem::path& path, const std::vector<Override>& overrides) {
  std::error_code ec;
  std::ifstream in(path);
  if (!std::filesystem::is_regular_file(path, ec) || !in) {
    throw ConfigError(path.string(),
                      {{"config file", path.string(), "must be an existing, readable TOML file",
                        "pass the config first: meshtrain train configs/shakespeare_char.toml "
                        "[--section.key value ...]"}});
  }
  std::stringstream text;
  text << in.rdbuf();
  return load_config_text(text.str(), path.string(), overrides);
}

std::vector<Override> parse_overrides(const std::vector<std::string>& args) {
  std::vector<Override> out;
  std::vector<ConfigIssue> issues;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0 || arg.find('.') == std::string::npos) {
      issues.push_back({"command line", arg, "expected `--section.key value`",
                        "write overrides as e.g. `--training.max_steps 100`"});
      continue;
    }
    const std::string body = arg.substr(2);
    if (const auto eq = body.find('='); eq != std::string::npos) {
      out.emplace_back(body.substr(0, eq), body.substr(eq + 1));
    } else if (i + 1 < args.size() &&
               !(args[i + 1].rfind("--", 0) == 0 && args[i + 1].find('.') != std::string::npos)) {
      out.emplace_back(body, args[++i]);
    } else {
      issues.push_back({body, "(missing)", "an override needs a value",
                        fmt::format("write `--{} <value>`", body)});
    }
  }
  if (!issues.empty()) throw ConfigError("the command line", std::move(issues));
  return out;
}

std::string to_toml(const Config& config) {
  Config copy = config;
  std::string out;
  std::string section;
  for (const Field& f : fields_of(copy)) {
    const std::string sec = f.key.substr(0, f.key.find('.'));
    if (sec != section) {
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", sec);
      section = sec;
    }
    const std::string name = f.key.substr(f.key.find('.') + 1);
    std::visit(
        [&](auto* p) {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, std::string>) {
            out += fmt::format("{} = \"{}\"\n", name, *p);
          } else if constexpr (std::is_enum_v<T>) {
            out += fmt::format("{} = \"{}\"\n", name, to_string(*p));
          } else {
            out += fmt::format("{} = {}\n", name, *p);
          }
        },
        f.ref);
  }
  return out;
}

std::string checkpoint_toml(const Config& config) {
  Config copy = config;
  copy.fault_injection = {};
  return to_toml(copy);
}

}  // namespace meshtrain
