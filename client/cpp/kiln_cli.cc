// kiln: command-line client of kilnd.
//
// Exit codes a script can rely on:
//   0 success, 1 cache miss (get) or nothing exported, 2 bad usage or input, 3 kilnd unreachable,
//   4 any other error reported by kilnd, 5 a kernel failed to compile.

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/byte_size.h"
#include "common/ed25519.h"
#include "common/platform.h"
#include "bundle.h"
#include "common/gpu_targets.h"
#include "oci_registry.h"
#include "target_bundles.h"
#include "kiln/autostart.h"
#include "kiln/client.h"
#include "progress_line.h"

namespace {

namespace fs = std::filesystem;

enum ExitCode {
  kOk = 0,
  kMiss = 1,
  kUsage = 2,
  kUnreachable = 3,
  kServiceError = 4,
  kCompileFailed = 5
};

constexpr const char* kUsageText =
    "usage: kiln [--endpoint TARGET] [--no-autostart] COMMAND ...\n"
    "  compile FILE.{ttir,ttgir,llir,ptx} --target cuda:90 [--target cuda:80 ...]\n"
    "          [--num-warps N] [--num-stages N] [--option NAME=JSON ...]\n"
    "          [--toolchain VERSION|KEY] -o OUTDIR\n"
    "                                   compile for each target (in parallel; over a\n"
    "                                   fleet's kilnds in turn) into\n"
    "                                   OUTDIR/<backend>_<arch>/<kernel>.<ext>\n"
    "  toolchains                       list the Triton toolchains kilnd compiles with\n"
    "  stats [--json]                   print kilnd's statistics\n"
    "  gc SIZE                          evict least recently used entries down to SIZE (e.g. 5GiB)\n"
    "  verify                           re-hash every stored blob; drop corrupt ones\n"
    "  health [--wait SECONDS]          check that kilnd serves this caller (and its shared cache);\n"
    "                                   --wait also waits for its toolchains' first probes\n"
    "  put NAMESPACE KEY NAME=FILE ...  store files as one cache entry\n"
    "  get NAMESPACE KEY [-o DIR]       fetch an entry; writes its blobs into DIR\n"
    "  misses [--last N] [--json]       the latest compiles and what was new for each\n"
    "  export FILE [--namespace NS] [--since 24h] [--sign KEY.pem] [--strict]\n"
    "                                   write this user's entries (all, or one namespace,\n"
    "                                   or those stored lately) to a bundle file; never\n"
    "                                   the client's memos, which hold for this machine only;\n"
    "                                   --sign: an Ed25519 private key (PEM) signs it. An\n"
    "                                   entry over the bundle entry limit is left out and\n"
    "                                   counted (--strict: fails the export); nothing to\n"
    "                                   write exits 1 and writes no file\n"
    "  import FILE [--replace]          kilnd checks all of a bundle, then stores what it may:\n"
    "                                   signed by a key of its trusted_bundle_keys, its entries\n"
    "                                   (never native code); otherwise only Triton kernels,\n"
    "                                   which kilnd compiles; all or nothing. --replace: a\n"
    "                                   trusted bundle replaces entries that differ\n"
    "  push FILE REGISTRY/REPO:TAG [--target cuda:80 ... [--sign KEY.pem]]\n"
    "                                   publish a bundle to an OCI registry (docker's login:\n"
    "                                   its credential helpers or auths; or $KILN_REGISTRY_TOKEN;\n"
    "                                   CAs: SSL_CERT_FILE); with --target, an index of a bundle\n"
    "                                   per GPU target, its kernels compiled by kilnd\n"
    "  pull REGISTRY/REPO[:TAG|@sha256:HEX] [-o FILE] [--target cuda:89 ...] [--replace]\n"
    "                                   fetch a bundle, its digests checked, and import it\n"
    "                                   (or only write it to FILE); of an index, the bundles\n"
    "                                   for --target, else for kilnd's GPUs\n"
    "  prewarm FILE --target cuda:89 [--target ...]\n"
    "                                   compile a bundle's kernels for other GPUs, stored\n"
    "                                   where clients of those GPUs look them up\n"
    "Endpoint: --endpoint, else $KILN_ENDPOINT, else the per-user local socket. Where that\n"
    "kilnd is not running, compile, toolchains, put, get, export, import and prewarm start it\n"
    "($KILN_KILND, else kilnd beside kiln or on PATH) unless --no-autostart. A farm's\n"
    "kilnd: grpcs://HOST:PORT, with $KILN_CA_FILE, $KILN_CLIENT_CERT and $KILN_CLIENT_KEY\n"
    "and/or $KILN_TOKEN_FILE. A fleet: kilnds comma-separated (HOST:PORT,HOST:PORT), calls go\n"
    "round robin and move on when one is gone.\n"
    "Exit codes: 0 ok, 1 miss (or nothing exported), 2 usage or bad input, 3 kilnd\n"
    "            unreachable, 4 service error, 5 a kernel failed to compile.\n";

// `context` (e.g. the target) goes before the message when given.
int Fail(const absl::Status& status, absl::string_view context = "") {
  std::cerr << "kiln: " << context << (context.empty() ? "" : ": ") << status.message() << "\n";
  if (kiln::CompileErrorOf(status).has_value()) return kCompileFailed;
  // Cancelled: kilnd stopped while the call was in flight.
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) || absl::IsCancelled(status)) {
    return kUnreachable;
  }
  if (absl::IsInvalidArgument(status)) return kUsage;
  return kServiceError;
}

int Usage(absl::string_view problem) {
  std::cerr << "kiln: " << problem << "\n" << kUsageText;
  return kUsage;
}

int Health(kiln::Client& client, const std::vector<std::string>& args) {
  double wait_seconds = 0;
  if (args.size() == 2 && args[0] == "--wait") {
    if (!absl::SimpleAtod(args[1], &wait_seconds) || wait_seconds < 0) {
      return Usage("--wait needs a number of seconds");
    }
  } else if (!args.empty()) {
    return Usage("health takes only --wait SECONDS");
  }
  const absl::Status status = wait_seconds > 0
                                  ? client.WaitUntilServing(absl::Seconds(wait_seconds))
                                  : client.CheckHealth();
  if (!status.ok()) return Fail(status);
  // The health protocol answers anyone (load balancers ask it); whether kilnd
  // serves this caller, its token or certificate, a call of its own says.
  absl::StatusOr<kiln::v1::GetStatsResponse> stats = client.Stats();
  if (absl::IsUnauthenticated(stats.status()) || absl::IsPermissionDenied(stats.status())) {
    return Fail(stats.status());
  }
  // kilnd serves before it has probed a toolchain it never saw; one waiting
  // for it to be ready wants to compile next, so it waits for that too (the
  // list answers once the probes under way end).
  if (wait_seconds > 0) {
    if (absl::StatusOr<std::vector<kiln::v1::Toolchain>> toolchains = client.Toolchains(); !toolchains.ok()) {
      return Fail(toolchains.status());
    }
  }
  std::cout << "SERVING " << client.endpoint() << "\n";
  // A fleet's shared cache being down fails no request, so kilnd still
  // serves; say so here, where an operator looks first.
  if (stats.ok() && !stats->shared_cache_state().empty() && stats->shared_cache_state() != "off") {
    std::cout << "shared cache (Redis): " << stats->shared_cache_state() << "\n";
  }
  // A full disk fails no request either: results are served, not stored.
  if (stats.ok() && !stats->disk_full_since().empty()) {
    std::cout << "cache: disk full since " << stats->disk_full_since() << "; "
              << stats->puts_refused_disk_full()
              << " results served but not stored (free disk space, lower max_cache_size, or "
                 "run kiln gc)\n";
  }
  return kOk;
}

int Put(kiln::Client& client, const std::vector<std::string>& args) {
  if (args.size() < 3) return Usage("put needs NAMESPACE KEY and at least one NAME=FILE");
  std::vector<std::pair<std::string, std::string>> blobs;
  for (size_t i = 2; i < args.size(); ++i) {
    const size_t equals = args[i].find('=');
    if (equals == std::string::npos || equals == 0) {
      return Usage(absl::StrFormat("'%s' is not NAME=FILE", args[i]));
    }
    const std::string path = args[i].substr(equals + 1);
    std::ifstream in(path, std::ios::binary);
    if (!in) return Usage(absl::StrFormat("cannot read %s", path));
    blobs.emplace_back(args[i].substr(0, equals),
                       std::string(std::istreambuf_iterator<char>(in), {}));
  }
  if (absl::Status status = client.Put(args[0], args[1], blobs); !status.ok()) {
    return Fail(status);
  }
  std::cout << "stored " << blobs.size() << " blob(s) under " << args[0] << "/" << args[1] << "\n";
  return kOk;
}

int Get(kiln::Client& client, const std::vector<std::string>& args) {
  if (args.size() != 2 && !(args.size() == 4 && args[2] == "-o")) {
    return Usage("get needs NAMESPACE KEY [-o DIR]");
  }
  absl::StatusOr<std::optional<kiln::v1::CacheEntry>> entry = client.Lookup(args[0], args[1]);
  if (!entry.ok()) return Fail(entry.status());
  if (!entry->has_value()) {
    std::cerr << "kiln: miss: no entry " << args[0] << "/" << args[1] << "\n";
    return kMiss;
  }
  for (const kiln::v1::Blob& blob : (*entry)->blobs()) {
    std::cout << absl::StrFormat("%-40s %10d bytes\n", blob.name(), blob.size());
    if (args.size() != 4) continue;
    std::error_code error;
    fs::create_directories(args[3], error);
    std::ofstream out(fs::path(args[3]) / blob.name(), std::ios::binary);
    out << blob.data();
    if (!out) {
      std::cerr << "kiln: cannot write " << (fs::path(args[3]) / blob.name()).string() << "\n";
      return kUsage;
    }
  }
  return kOk;
}

int Stats(kiln::Client& client, const std::vector<std::string>& args) {
  const bool json = args.size() == 1 && args[0] == "--json";
  if (!args.empty() && !json) return Usage("stats takes only --json");
  absl::StatusOr<kiln::v1::GetStatsResponse> stats = client.Stats();
  if (!stats.ok()) return Fail(stats.status());
  std::cout << (json ? kiln::FormatStatsJson(*stats) : kiln::FormatStats(*stats));
  return kOk;
}

// Stage of an IR file, from its extension.
const std::map<std::string, kiln::v1::Stage>& StagesByExtension() {
  static const auto* stages = new std::map<std::string, kiln::v1::Stage>{
      {".ttir", kiln::v1::STAGE_TTIR},
      {".ttgir", kiln::v1::STAGE_TTGIR},
      {".llir", kiln::v1::STAGE_LLIR},
      {".ptx", kiln::v1::STAGE_PTX}};
  return *stages;
}

struct CompileArgs {
  std::string file;
  std::vector<kiln::v1::Target> targets;
  std::map<std::string, std::string> options;  // name -> JSON value
  std::string toolchain;
  std::string out_dir;
};

absl::StatusOr<CompileArgs> ParseCompileArgs(const std::vector<std::string>& args) {
  CompileArgs parsed;
  const std::map<std::string, std::string> option_flags = {{"--num-warps", "num_warps"},
                                                           {"--num-stages", "num_stages"},
                                                           {"--num-ctas", "num_ctas"}};
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const bool has_value = i + 1 < args.size();
    if (arg == "--target" && has_value) {
      absl::StatusOr<kiln::v1::Target> target = kiln::ParseTarget(args[++i]);
      if (!target.ok()) return target.status();
      parsed.targets.push_back(*target);
    } else if (option_flags.contains(arg) && has_value) {
      int number = 0;
      if (!absl::SimpleAtoi(args[++i], &number) || number <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(arg, " needs a positive whole number"));
      }
      parsed.options[option_flags.at(arg)] = absl::StrCat(number);
    } else if (arg == "--option" && has_value) {
      const std::string& option = args[++i];
      const size_t equals = option.find('=');
      if (equals == std::string::npos || equals == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--option '", option, "' is not NAME=JSON, e.g. enable_fp_fusion=false"));
      }
      parsed.options[option.substr(0, equals)] = option.substr(equals + 1);
    } else if (arg == "--toolchain" && has_value) {
      parsed.toolchain = args[++i];
    } else if (arg == "-o" && has_value) {
      parsed.out_dir = args[++i];
    } else if (!absl::StartsWith(arg, "-") && parsed.file.empty()) {
      parsed.file = arg;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
  }
  if (parsed.file.empty() || parsed.targets.empty() || parsed.out_dir.empty()) {
    return absl::InvalidArgumentError("compile needs FILE, at least one --target and -o OUTDIR");
  }
  return parsed;
}

std::string OptionsJson(const std::map<std::string, std::string>& options) {
  std::vector<std::string> fields;
  for (const auto& [name, value] : options) fields.push_back(absl::StrCat("\"", name, "\": ", value));
  return absl::StrCat("{", absl::StrJoin(fields, ", "), "}");
}

absl::Status WriteArtifacts(const kiln::CompiledKernel& kernel, const fs::path& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  for (const auto& [kind, data] : kernel.artifacts) {
    const fs::path path = dir / absl::StrCat(kernel.name, ".", kind);
    std::ofstream out(path, std::ios::binary);
    out << data;
    if (!out) return absl::InvalidArgumentError(absl::StrCat("cannot write ", path.string()));
  }
  if (!kernel.ptxas_log.empty()) std::ofstream(dir / "ptxas.log") << kernel.ptxas_log;
  return absl::OkStatus();
}

int Compile(kiln::Client& client, const std::vector<std::string>& args) {
  absl::StatusOr<CompileArgs> parsed = ParseCompileArgs(args);
  if (!parsed.ok()) return Usage(parsed.status().message());
  const fs::path file(parsed->file);
  const auto stage = StagesByExtension().find(file.extension().string());
  if (stage == StagesByExtension().end()) {
    return Usage(absl::StrCat(parsed->file, ": unknown IR kind; name it .ttir, .ttgir, .llir or .ptx"));
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return Usage(absl::StrCat("cannot read ", parsed->file));
  kiln::CompileInput input;
  input.ir.assign(std::istreambuf_iterator<char>(in), {});
  if (input.ir.empty()) return Usage(absl::StrCat(parsed->file, " is empty"));
  input.stage = stage->second;
  input.toolchain = parsed->toolchain;
  input.options_json = OptionsJson(parsed->options);
  // Every target compiles at once; kilnd spreads them over its workers, and
  // an endpoint listing a fleet's kilnds gets them one each in turn.
  std::vector<std::unique_ptr<kiln::Client>> kilnds;
  if (const std::vector<std::string> listed = kiln::FleetEndpoints(client.endpoint());
      listed.size() > 1) {
    for (const std::string& endpoint : listed) {
      kiln::ClientOptions one;
      one.endpoint = endpoint;
      kilnds.push_back(std::make_unique<kiln::Client>(std::move(one)));
    }
  }
  std::vector<kiln::CompileInput> inputs;
  std::vector<bool> asked_the_fleet;
  std::vector<std::future<absl::StatusOr<kiln::CompiledKernel>>> futures;
  for (const kiln::v1::Target& target : parsed->targets) {
    input.target = target;
    kiln::Client& kilnd = kilnds.empty() ? client : *kilnds[futures.size() % kilnds.size()];
    inputs.push_back(input);
    asked_the_fleet.push_back(&kilnd == &client);
    futures.push_back(kilnd.CompileFuture(input));
  }
  // Results are reported as they come, under a status line on a terminal.
  const absl::Time started = absl::Now();
  kiln::ProgressLine progress(std::cout, kiln::platform::StdoutIsTerminal());
  std::vector<bool> reported(futures.size(), false);
  size_t done = 0;
  size_t failed = 0;
  int exit_code = kOk;
  while (done < futures.size()) {
    progress.Update(absl::StrFormat("compiling %s: %d/%d done, %d running, %d failed, %.1f s",
                                    file.filename().string(), done, futures.size(),
                                    futures.size() - done, failed,
                                    absl::ToDoubleSeconds(absl::Now() - started)));
    for (size_t i = 0; i < futures.size(); ++i) {
      if (reported[i] || futures[i].wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
        continue;
      }
      absl::StatusOr<kiln::CompiledKernel> kernel = futures[i].get();
      if (!asked_the_fleet[i] && absl::IsUnavailable(kernel.status())) {
        // Its kilnd went away: any other of the fleet.
        asked_the_fleet[i] = true;
        futures[i] = client.CompileFuture(inputs[i]);
        continue;
      }
      reported[i] = true;
      ++done;
      const kiln::v1::Target& target = parsed->targets[i];
      const std::string label = absl::StrCat(target.backend(), ":", target.arch());
      if (!kernel.ok()) {
        ++failed;
        progress.Clear();  // the error goes to stderr, on the terminal too
        exit_code = std::max(exit_code, Fail(kernel.status(), label));
        if (auto error = kiln::CompileErrorOf(kernel.status()); error && !error->log().empty()) {
          std::cerr << error->log() << "\n";
        }
        continue;
      }
      const fs::path dir =
          fs::path(parsed->out_dir) / absl::StrCat(target.backend(), "_", target.arch());
      if (absl::Status written = WriteArtifacts(*kernel, dir); !written.ok()) {
        exit_code = std::max(exit_code, Fail(written));
        continue;
      }
      progress.Print(absl::StrFormat("%s %s: %s -> %s (%d bytes of cubin)", kernel->name, label,
                                     kernel->cache_hit ? "cache hit" : "compiled", dir.string(),
                                     kernel->cubin().size()));
    }
    if (done < futures.size()) {
      // Wake when the first unreported one is ready, or to redraw the elapsed time.
      for (size_t i = 0; i < futures.size(); ++i) {
        if (!reported[i]) {
          futures[i].wait_for(std::chrono::milliseconds(100));
          break;
        }
      }
    }
  }
  return exit_code;
}

// "90m", "24h", "7d": how far back an export reaches.
absl::StatusOr<absl::Duration> ParseAge(const std::string& text) {
  absl::Duration age;
  int days = 0;
  if (absl::EndsWith(text, "d") && absl::SimpleAtoi(text.substr(0, text.size() - 1), &days) && days >= 0) {
    return absl::Hours(24) * days;
  }
  if (absl::ParseDuration(text, &age) && age >= absl::ZeroDuration()) return age;
  return absl::InvalidArgumentError(
      absl::StrFormat("--since '%s': write an age such as 90m, 24h or 7d", text));
}

// Entries an export could not write (over the bundle entry limit): said once,
// in the summary, rather than once each.
struct LeftOut {
  int count = 0;
  uint64_t bytes = 0;
  std::string first;  // the first one's reason

  void Add(const absl::Status& why, uint64_t entry_bytes) {
    if (count++ == 0) first = std::string(why.message());
    bytes += entry_bytes;
  }
  std::string Summary() const {
    return absl::StrFormat("left out %d %s (%s), first: %s", count, count == 1 ? "entry" : "entries",
                           kiln::FormatByteSize(bytes), first);
  }
};

// The Python client's memos (kiln/triton/memos.py): values fingerprinted by
// this machine's files, which no other machine's files ever match.
constexpr absl::string_view kMachineLocalNamespace = "kiln-memos";

absl::StatusOr<kiln::Ed25519PrivateKey> ReadSigningKey(const std::string& path) {
  absl::StatusOr<std::string> pem = kiln::platform::ReadWholeFile(path);
  if (!pem.ok()) return absl::InvalidArgumentError(absl::StrFormat("cannot read the key %s", path));
  return kiln::Ed25519PrivateKey::FromPem(*pem, path);
}

int Export(kiln::Client& client, const std::vector<std::string>& args) {
  kiln::v1::ListEntriesRequest request;
  std::string file;
  std::string sign_key;
  bool strict = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const bool has_value = i + 1 < args.size();
    if (args[i] == "--strict") {
      strict = true;
    } else if (args[i] == "--namespace" && has_value) {
      request.set_namespace_(args[++i]);
    } else if (args[i] == "--since" && has_value) {
      absl::StatusOr<absl::Duration> age = ParseAge(args[++i]);
      if (!age.ok()) return Usage(age.status().message());
      request.set_since_unix_ms(absl::ToUnixMillis(absl::Now() - *age));
    } else if (args[i] == "--sign" && has_value) {
      sign_key = args[++i];
    } else if (file.empty() && !absl::StartsWith(args[i], "--")) {
      file = args[i];
    } else {
      return Usage(absl::StrFormat("export: unexpected '%s'", args[i]));
    }
  }
  if (file.empty()) return Usage("export needs FILE");
  std::optional<kiln::Ed25519PrivateKey> signer;
  if (!sign_key.empty()) {
    absl::StatusOr<kiln::Ed25519PrivateKey> key = ReadSigningKey(sign_key);
    if (!key.ok()) return Usage(absl::StrCat("export: ", key.status().message()));
    signer = *std::move(key);
  }
  absl::StatusOr<kiln::BundleWriter> bundle =
      kiln::BundleWriter::Create(file, signer.has_value() ? &*signer : nullptr);
  if (!bundle.ok()) return Fail(bundle.status());
  kiln::ProgressLine progress(std::cout, kiln::platform::StdoutIsTerminal());
  uint64_t bytes = 0;  // of the entries written
  LeftOut left_out;
  int memos = 0;  // the client's, left out
  do {
    absl::StatusOr<kiln::v1::ListEntriesResponse> page = client.ListEntries(request);
    if (!page.ok()) return Fail(page.status());
    for (const kiln::v1::ListedEntry& listed : page->entries()) {
      if (listed.namespace_() == kMachineLocalNamespace) {
        ++memos;
        continue;
      }
      // Each entry is read as a client would: kilnd checks every blob's digest.
      absl::StatusOr<std::optional<kiln::v1::CacheEntry>> entry =
          client.Lookup(listed.namespace_(), listed.key());
      if (!entry.ok()) return Fail(entry.status());
      if (!entry->has_value()) continue;  // evicted since it was listed
      kiln::v1::BundleEntry out;
      out.set_namespace_(listed.namespace_());
      out.set_key(listed.key());
      uint64_t entry_bytes = 0;
      for (const kiln::v1::Blob& blob : (*entry)->blobs()) {
        *out.add_blobs() = blob;
        entry_bytes += blob.data().size();
      }
      if (absl::Status added = bundle->Add(out); !added.ok()) {
        progress.Clear();
        left_out.Add(added, entry_bytes);
        if (strict) return Fail(added, "export --strict: nothing written");
        continue;
      }
      bytes += entry_bytes;
      progress.Update(absl::StrFormat("exporting: %d entries, %s", bundle->entries(),
                                      kiln::FormatByteSize(bytes)));
    }
    request.set_after(page->next_after());
  } while (request.after() != 0);
  if (bundle->entries() == 0) {
    // A publisher's CI would push an empty bundle as if it were the cache.
    progress.Clear();
    std::string why = left_out.Summary();
    if (left_out.count == 0 && memos > 0) {
      why = absl::StrFormat("only the client's memos matched (%d), which hold for this machine only", memos);
    } else if (left_out.count == 0) {
      why = "no entries matched (is this the kilnd that compiled them? check --namespace and --since)";
    }
    std::cerr << "kiln: export: nothing written to " << file << ": " << why << "\n";
    return kMiss;
  }
  if (absl::Status written = bundle->Finish(); !written.ok()) return Fail(written);
  std::error_code error;
  const uint64_t file_size = fs::file_size(file, error);
  progress.Print(absl::StrFormat("exported %d entries (%s of blobs, a %s file) to %s%s", bundle->entries(),
                                 kiln::FormatByteSize(bytes),
                                 error ? "?" : kiln::FormatByteSize(file_size), file,
                                 signer.has_value() ? ", signed by key " + signer->id() : ""));
  if (left_out.count > 0) std::cout << "  " << left_out.Summary() << "\n";
  return kOk;
}

// What kilnd made of a bundle (`kiln import`, `kiln pull`).
void PrintImportReport(const std::string& file, const kiln::v1::ImportBundleResponse& report) {
  std::string signer = "unsigned";
  if (!report.signed_by().empty()) {
    signer = absl::StrCat("signed by key ", report.signed_by(),
                          report.trusted() ? ", which kilnd trusts"
                                           : ", which kilnd does not trust (trusted_bundle_keys)");
  }
  std::cout << absl::StrFormat("imported %s: %d entries, %s\n", file, report.entries(), signer);
  std::cout << absl::StrFormat("  stored %d, already stored %d, stored with other bytes %d%s, "
                               "kernels compiled by kilnd %d\n",
                               report.stored(), report.unchanged(), report.conflicts(),
                               report.conflicts() == 0 ? ""
                               : report.replaced() > 0
                                   ? absl::StrFormat(" (replaced: %d)", report.replaced())
                                   : " (kept; --replace replaces them from a trusted bundle)",
                               report.compiled());
  for (const kiln::v1::RefusedEntries& refused : report.refused()) {
    std::cout << absl::StrFormat("  refused %d: %s (first: %s)\n", refused.count(), refused.reason(),
                                 refused.example());
  }
  if (report.launchers_ahead() > 0) {
    std::cout << absl::StrFormat("  launchers to build ahead, in the background: %d\n", report.launchers_ahead());
  }
  if (report.compile_failures_count() > 0) {
    std::cout << absl::StrFormat("  not compiled %d:\n", report.compile_failures_count());
    for (const std::string& failure : report.compile_failures()) std::cout << "    " << failure << "\n";
  }
}

int Import(kiln::Client& client, const std::vector<std::string>& args) {
  std::string file;
  bool replace = false;
  for (const std::string& arg : args) {
    if (arg == "--replace") {
      replace = true;
    } else if (file.empty() && !absl::StartsWith(arg, "--")) {
      file = arg;
    } else {
      return Usage(absl::StrFormat("import: unexpected '%s'", arg));
    }
  }
  if (file.empty()) return Usage("import needs FILE");
  std::error_code error;
  const uint64_t size = fs::file_size(file, error);
  if (error) return Usage(absl::StrFormat("import: cannot read %s: %s", file, error.message()));
  // kilnd receives the file, checks all of it, then stores what its trust
  // lets in, all or nothing.
  kiln::ProgressLine progress(std::cout, kiln::platform::StdoutIsTerminal());
  absl::StatusOr<kiln::v1::ImportBundleResponse> imported =
      client.ImportBundle(file, replace, [&](uint64_t sent) {
        progress.Update(absl::StrFormat("sending %s: %s of %s", file, kiln::FormatByteSize(sent),
                                        kiln::FormatByteSize(size)));
      });
  progress.Clear();
  if (!imported.ok()) return Fail(imported.status());
  PrintImportReport(file, *imported);
  return kOk;
}

// Pushes a bundle file to an OCI registry, checked whole first; with
// --target, a bundle for each target (compiled by kilnd) under one index.
int Push(kiln::Client& client, const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  std::vector<kiln::v1::Target> targets;
  std::string sign_key;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--target" && i + 1 < args.size()) {
      absl::StatusOr<kiln::v1::Target> target = kiln::ParseTarget(args[++i]);
      if (!target.ok()) return Usage(target.status().message());
      targets.push_back(*target);
    } else if (args[i] == "--sign" && i + 1 < args.size()) {
      sign_key = args[++i];
    } else if (!absl::StartsWith(args[i], "--")) {
      positional.push_back(args[i]);
    } else {
      return Usage(absl::StrFormat("push: unexpected '%s'", args[i]));
    }
  }
  if (positional.size() != 2) return Usage("push needs FILE and REGISTRY/REPOSITORY:TAG");
  if (!sign_key.empty() && targets.empty()) {
    return Usage("push: --sign signs the bundles --target makes; sign a bundle itself with kiln export --sign");
  }
  const std::string& file = positional[0];
  absl::StatusOr<kiln::OciReference> reference = kiln::ParseOciReference(positional[1]);
  if (!reference.ok()) return Usage(reference.status().message());
  uint64_t entries = 0;
  absl::StatusOr<kiln::BundleReader> checked = kiln::ForEachBundleEntry(file, [&](kiln::v1::BundleEntry&&) {
    ++entries;
    return absl::OkStatus();
  });
  if (!checked.ok()) return Fail(checked.status(), "nothing was pushed");
  const std::string signer = checked->signature().has_value() ? checked->signature()->key_id : "";
  if (targets.empty()) {
    absl::StatusOr<kiln::PushedBundle> pushed = kiln::PushBundle({file, entries, signer, "", {}}, *reference);
    if (!pushed.ok()) return Fail(pushed.status());
    std::cout << absl::StrFormat("pushed %s (%d entries, %s, %s) to %s@%s\n", file, entries,
                                 signer.empty() ? "unsigned" : "signed by key " + signer,
                                 kiln::FormatByteSize(pushed->bytes), reference->ToString(),
                                 pushed->manifest_digest);
    return kOk;
  }
  std::optional<kiln::Ed25519PrivateKey> key;
  if (!sign_key.empty()) {
    absl::StatusOr<kiln::Ed25519PrivateKey> read = ReadSigningKey(sign_key);
    if (!read.ok()) return Usage(read.status().message());
    key = *std::move(read);
  } else if (!signer.empty()) {
    std::cerr << "kiln: push: " << file << " is signed, but the bundles made for each target are not without "
              << "--sign KEY: consumers will compile their kernels\n";
  }
  std::error_code error;
  const fs::path directory = fs::temp_directory_path() / absl::StrFormat("kiln-push-%08x", std::random_device()());
  fs::create_directories(directory, error);
  kiln::ProgressLine progress(std::cout, kiln::platform::StdoutIsTerminal());
  absl::StatusOr<std::vector<kiln::TargetBundle>> made = kiln::MakeTargetBundles(
      client, file, targets, key.has_value() ? &*key : nullptr, directory,
      [&](const std::string& line) { progress.Update(line); });
  progress.Clear();
  const auto cleanup = [&] { fs::remove_all(directory, error); };
  if (!made.ok()) {
    cleanup();
    return Fail(made.status(), "nothing was pushed");
  }
  std::vector<kiln::BundleToPush> bundles;
  for (const kiln::TargetBundle& bundle : *made) {
    bundles.push_back({bundle.file, bundle.entries, key.has_value() ? key->id() : "", bundle.target, bundle.tritons});
    std::cout << absl::StrFormat("%s: %d entries, %d of them kernels%s%s\n", bundle.target, bundle.entries,
                                 bundle.kernels,
                                 bundle.tritons.empty() ? "" : " of Triton " + absl::StrJoin(bundle.tritons, ", "),
                                 bundle.left_out.empty() ? "" : absl::StrFormat("; %d kernels left out:",
                                                                                bundle.left_out.size()));
    for (const std::string& why : bundle.left_out) std::cout << "  " << why << "\n";
  }
  absl::StatusOr<kiln::PushedBundle> pushed = kiln::PushBundleIndex(bundles, *reference);
  cleanup();
  if (!pushed.ok()) return Fail(pushed.status());
  std::cout << absl::StrFormat("pushed an index of %d targets (%s, %s) to %s@%s\n", bundles.size(),
                               key.has_value() ? "signed by key " + key->id() : "unsigned",
                               kiln::FormatByteSize(pushed->bytes), reference->ToString(), pushed->manifest_digest);
  return kOk;
}

// Fetches a bundle from an OCI registry: into a file (-o), or imported by
// kilnd. Of an index, the bundles for --target, else for kilnd's GPUs.
int Pull(kiln::Client& client, const std::vector<std::string>& args) {
  std::string ref;
  std::string out;
  bool replace = false;
  std::vector<std::string> targets;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "-o" && i + 1 < args.size()) {
      out = args[++i];
    } else if (args[i] == "--replace") {
      replace = true;
    } else if (args[i] == "--target" && i + 1 < args.size()) {
      absl::StatusOr<kiln::v1::Target> target = kiln::ParseTarget(args[++i]);
      if (!target.ok()) return Usage(target.status().message());
      targets.push_back(kiln::TargetName(*target));
    } else if (ref.empty() && !absl::StartsWith(args[i], "-")) {
      ref = args[i];
    } else {
      return Usage(absl::StrFormat("pull: unexpected '%s'", args[i]));
    }
  }
  if (ref.empty()) return Usage("pull needs REGISTRY/REPOSITORY:TAG (or @sha256:HEX)");
  absl::StatusOr<kiln::OciReference> reference = kiln::ParseOciReference(ref);
  if (!reference.ok()) return Usage(reference.status().message());
  const bool import = out.empty();
  if (targets.empty()) {
    // kilnd's GPUs (its gpu_targets, or what nvidia-smi told it); else this machine's.
    if (absl::StatusOr<kiln::v1::GetStatsResponse> stats = import ? client.Stats() : absl::UnavailableError("");
        stats.ok()) {
      targets.assign(stats->gpu_targets().begin(), stats->gpu_targets().end());
    }
    if (targets.empty()) targets = kiln::DetectGpuTargets();
  }
  std::random_device random;
  const fs::path file = import ? fs::temp_directory_path() /
                                     absl::StrFormat("kiln-pull-%08x.kilnbundle", random())
                               : fs::path(out);
  kiln::ProgressLine progress(std::cout, kiln::platform::StdoutIsTerminal());
  kiln::PullOptions options;
  options.targets = targets;
  // Of an index, kernels of a Triton kilnd has toolchains of (all, where it has none yet).
  if (absl::StatusOr<std::vector<kiln::v1::Toolchain>> toolchains =
          import ? client.Toolchains() : absl::UnavailableError("");
      toolchains.ok()) {
    for (const kiln::v1::Toolchain& toolchain : *toolchains) options.tritons.push_back(toolchain.triton_version());
  }
  options.received = [&](uint64_t received) {
    progress.Update(absl::StrFormat("fetching %s: %s", ref, kiln::FormatByteSize(received)));
  };
  absl::StatusOr<kiln::PulledBundle> pulled = kiln::PullBundle(*reference, file, options);
  progress.Clear();
  if (!pulled.ok()) return Fail(pulled.status());
  const std::string& digest = pulled->manifest_digest;
  if (!import) {
    for (const kiln::PulledFile& pulled_file : pulled->files) {
      std::cout << absl::StrFormat("fetched %s@%s%s to %s\n", reference->ToString(), digest,
                                   pulled_file.target.empty() ? "" : " for " + pulled_file.target,
                                   pulled_file.path.string());
    }
    return kOk;
  }
  int exit_code = kOk;
  for (const kiln::PulledFile& pulled_file : pulled->files) {
    absl::StatusOr<kiln::v1::ImportBundleResponse> imported = client.ImportBundle(pulled_file.path, replace);
    std::error_code error;
    fs::remove(pulled_file.path, error);
    if (!imported.ok()) {
      exit_code = std::max(exit_code, Fail(imported.status(), pulled_file.target));
      continue;
    }
    PrintImportReport(absl::StrCat(reference->ToString(), "@", digest,
                                   pulled_file.target.empty() ? "" : " for " + pulled_file.target),
                      *imported);
  }
  return exit_code;
}

int Prewarm(kiln::Client& client, const std::vector<std::string>& args) {
  std::string file;
  std::vector<kiln::v1::Target> targets;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--target" && i + 1 < args.size()) {
      absl::StatusOr<kiln::v1::Target> target = kiln::ParseTarget(args[++i]);
      if (!target.ok()) return Usage(target.status().message());
      targets.push_back(*target);
    } else if (file.empty() && !absl::StartsWith(args[i], "--")) {
      file = args[i];
    } else {
      return Usage(absl::StrFormat("prewarm: unexpected '%s'", args[i]));
    }
  }
  if (file.empty() || targets.empty()) return Usage("prewarm needs FILE and at least one --target");
  absl::StatusOr<std::vector<kiln::RecordedKernel>> recorded = kiln::RecordedKernels(file);
  if (!recorded.ok()) return Fail(recorded.status());
  const std::vector<kiln::RecordedKernel>& kernels = *recorded;
  if (kernels.empty()) {
    std::cerr << "kiln: " << file << " holds no recorded Triton kernel (entries with "
              << "<kernel>.source); export a cache that the kiln Python client filled\n";
    return kUsage;
  }
  std::vector<std::pair<size_t, size_t>> jobs;
  for (size_t k = 0; k < kernels.size(); ++k) {
    for (size_t t = 0; t < targets.size(); ++t) jobs.emplace_back(k, t);
  }
  const absl::Time started = absl::Now();
  kiln::ProgressLine progress(std::cout, kiln::platform::StdoutIsTerminal());
  size_t compiled = 0, cached = 0, skipped = 0, failed = 0, reported = 0;
  int exit_code = kOk;
  const bool whole = kiln::PrewarmEach(client, kernels, targets, jobs, [&](size_t k, size_t t, const auto& result) {
    ++reported;
    const std::string label = absl::StrCat(kernels[k].name, " ", kiln::TargetName(targets[t]));
    if (!result.ok()) {
      ++failed;
      progress.Clear();
      exit_code = std::max(exit_code, Fail(result.status(), label));
    } else if (!result->skipped().empty()) {
      ++skipped;
      progress.Print(absl::StrFormat("%s: skipped: %s", label, result->skipped()));
    } else if (result->compile().has_error()) {
      ++failed;
      progress.Clear();
      std::cerr << "kiln: " << label << ": " << result->compile().error().message() << "\n";
      exit_code = std::max(exit_code, static_cast<int>(kCompileFailed));
    } else {
      ++(result->compile().cache_hit() ? cached : compiled);
      progress.Print(absl::StrFormat("%s: %s", label, result->compile().cache_hit() ? "cache hit" : "compiled"));
    }
  }, [&](size_t running) {
    progress.Update(absl::StrFormat("prewarming %s: %d/%d done, %d running, %d failed, %.1f s",
                                    fs::path(file).filename().string(), reported, jobs.size(), running, failed,
                                    absl::ToDoubleSeconds(absl::Now() - started)));
  });
  if (!whole) {
    std::cerr << "kiln: stopped after that error; " << jobs.size() - reported
              << " kernel and target pairs were not sent\n";
    return exit_code;
  }
  progress.Print(absl::StrFormat(
      "prewarmed %d kernels for %d targets: %d compiled, %d already cached, %d skipped, %d "
      "failed, %.1f s",
      kernels.size(), targets.size(), compiled, cached, skipped, failed,
      absl::ToDoubleSeconds(absl::Now() - started)));
  return exit_code;
}

int Misses(kiln::Client& client, const std::vector<std::string>& args) {
  uint32_t last = 20;
  bool json = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--last" && i + 1 < args.size()) {
      if (!absl::SimpleAtoi(args[++i], &last) || last == 0 || last > 1000) {
        return Usage("--last needs a number from 1 to 1000");
      }
    } else if (args[i] == "--json") {
      json = true;
    } else {
      return Usage(absl::StrFormat("misses: unexpected '%s'", args[i]));
    }
  }
  absl::StatusOr<kiln::v1::ListMissesResponse> misses = client.ListMisses(last);
  if (!misses.ok()) return Fail(misses.status());
  if (json) {
    std::cout << kiln::FormatJson(*misses);
    return kOk;
  }
  for (const kiln::v1::Miss& miss : misses->misses()) {
    std::cout << absl::FormatTime("%H:%M:%S  ", absl::FromUnixMillis(miss.unix_ms()),
                                  absl::LocalTimeZone())
              << absl::StrFormat("%-40s  %s\n", miss.kernel().empty() ? miss.key().substr(0, 16) : miss.kernel(),
                                 absl::StrJoin(miss.reasons(), ", "));
  }
  return kOk;
}

int Toolchains(kiln::Client& client, const std::vector<std::string>& args) {
  if (!args.empty()) return Usage("toolchains takes no arguments");
  absl::StatusOr<std::vector<kiln::v1::Toolchain>> toolchains = client.Toolchains();
  if (!toolchains.ok()) return Fail(toolchains.status());
  if (toolchains->empty()) std::cout << "no toolchain registered (kilnd --toolchain=/path/to/python)\n";
  for (const kiln::v1::Toolchain& toolchain : *toolchains) {
    std::cout << absl::StrFormat("triton %-8s python %-5s %s  key %s...\n", toolchain.triton_version(),
                                 toolchain.python_version(), toolchain.python_executable(),
                                 toolchain.triton_key().substr(0, 16));
  }
  return kOk;
}

int Gc(kiln::Client& client, const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("gc needs one SIZE, e.g. kiln gc 5GiB");
  absl::StatusOr<uint64_t> size = kiln::ParseByteSize(args[0]);
  if (!size.ok()) return Usage(size.status().message());
  absl::StatusOr<kiln::v1::EvictResponse> evicted = client.Evict(*size);
  if (!evicted.ok()) return Fail(evicted.status());
  std::cout << "evicted " << evicted->evicted_entries() << " entries; "
            << kiln::FormatByteSize(evicted->disk_bytes()) << " on disk\n";
  return kOk;
}

int Verify(kiln::Client& client, const std::vector<std::string>& args) {
  if (!args.empty()) return Usage("verify takes no arguments");
  absl::StatusOr<kiln::v1::VerifyResponse> report = client.Verify();
  if (!report.ok()) return Fail(report.status());
  std::cout << "checked " << report->blobs_checked() << " blobs; " << report->corrupt_blobs()
            << " corrupt (dropped with their entries)\n";
  return report->corrupt_blobs() == 0 ? kOk : kServiceError;
}

// Commands that need kilnd's cache or compiler start the user's kilnd when
// none serves; those that report on or maintain a running kilnd never do (a
// kilnd started to answer them would have nothing to say).
bool StartsKilnd(const std::string& command) {
  static const auto* starting = new std::set<std::string>{
      "compile", "toolchains", "put", "get", "export", "import", "prewarm", "pull"};
  return starting->contains(command);
}

}  // namespace

int main(int argc, char** argv) {
  // A registry that closes early, or a credential helper that exits unread, is an error, not the end of kiln.
  kiln::platform::IgnoreBrokenPipes();
  std::vector<std::string> args(argv + 1, argv + argc);
  kiln::ClientOptions options;
  bool autostart = true;
  while (!args.empty() && (args[0] == "--endpoint" || args[0] == "--no-autostart")) {
    if (args[0] == "--no-autostart") {
      autostart = false;
      args.erase(args.begin());
      continue;
    }
    if (args.size() < 2) return Usage("--endpoint needs a TARGET");
    options.endpoint = args[1];
    args.erase(args.begin(), args.begin() + 2);
  }
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kUsageText;
    return args.empty() ? kUsage : kOk;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  using Command = int (*)(kiln::Client&, const std::vector<std::string>&);
  const std::map<std::string, Command> commands = {
      {"compile", Compile}, {"toolchains", Toolchains}, {"stats", Stats}, {"gc", Gc},
      {"verify", Verify},   {"health", Health},         {"put", Put},     {"get", Get},
      {"export", Export},   {"import", Import},         {"misses", Misses},
      {"prewarm", Prewarm}, {"push", Push},         {"pull", Pull}};
  const auto found = commands.find(command);
  if (found == commands.end()) return Usage(absl::StrFormat("unknown command '%s'", command));
  // A question about the command starts nothing and asks no kilnd.
  if (std::find(args.begin(), args.end(), "--help") != args.end() ||
      std::find(args.begin(), args.end(), "-h") != args.end()) {
    std::cout << kUsageText;
    return kOk;
  }
  // A pull into a file (-o) needs no kilnd, nor a push but of bundles kilnd makes for targets.
  const auto has = [&](const char* flag) { return std::find(args.begin(), args.end(), flag) != args.end(); };
  const bool needs_kilnd = (StartsKilnd(command) && !(command == "pull" && has("-o"))) ||
                           (command == "push" && has("--target"));
  if (autostart && needs_kilnd) {
    absl::StatusOr<kiln::Autostart> started = kiln::StartUserKilndIfNotServing(options);
    if (!started.ok()) return Fail(started.status());
    if (*started == kiln::Autostart::kStarted) {
      std::cerr << "kiln: no kilnd was serving; started one, which keeps serving "
                << "(--no-autostart: never start one)\n";
    }
  }
  // After any start: on Windows the new kilnd's endpoint file names its port.
  kiln::Client client(options);
  const int exit_code = found->second(client, args);
  // gRPC ends its background threads while the process exits, and a process
  // exiting meanwhile can crash in them on Windows (timing-dependent; grpc/grpc
  // issue 43440): kiln.exe once exited with a page fault under Wine in CI right
  // after printing its answer. A command has nothing left to release here, so
  // the process ends without the static destructors that race those threads.
  std::cout.flush();
  std::cerr.flush();
  std::_Exit(exit_code);
}
