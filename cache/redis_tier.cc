// SharedTier on Redis through hiredis (Debian's libhiredis-dev).
//
// Layout under the configured prefix, content-addressed so that two entries
// sharing a blob store it once:
//   <prefix>b:<sha256 hex>            a blob's content
//   <prefix>e:<sha256 hex of ns\0key> the entry: "<name>\t<sha256 hex>\n" per blob
// Blobs are written before the entry that names them. Eviction is Redis's own
// (maxmemory-policy allkeys-lru): an entry whose blob went is a miss.

#include <hiredis/hiredis.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cache/shared_tier.h"
#include "common/fmt_absl.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

constexpr size_t kMaxBacklog = 256;
// After a failure, the tier is not tried again for this long.
constexpr absl::Duration kRetryAfter = absl::Seconds(2);

struct RedisAddress {
  std::string host;
  int port = 6379;
  std::string password;
  int db = 0;
};

absl::StatusOr<RedisAddress> ParseRedisUrl(absl::string_view url) {
  const auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "redis_url '%s' %s; write redis://[:PASSWORD@]HOST[:PORT][/DB]", url, why));
  };
  if (!absl::ConsumePrefix(&url, "redis://")) return invalid("does not start with redis://");
  RedisAddress address;
  if (const size_t at = url.rfind('@'); at != absl::string_view::npos) {
    absl::string_view credentials = url.substr(0, at);
    absl::ConsumePrefix(&credentials, ":");  // redis://:PASSWORD@ (no user)
    address.password = std::string(credentials);
    url.remove_prefix(at + 1);
  }
  if (const size_t slash = url.find('/'); slash != absl::string_view::npos) {
    if (!absl::SimpleAtoi(url.substr(slash + 1), &address.db) || address.db < 0) {
      return invalid("has a database that is not a number");
    }
    url = url.substr(0, slash);
  }
  if (const size_t colon = url.rfind(':'); colon != absl::string_view::npos) {
    if (!absl::SimpleAtoi(url.substr(colon + 1), &address.port) || address.port <= 0 ||
        address.port > 65535) {
      return invalid("has a port that is not a number from 1 to 65535");
    }
    url = url.substr(0, colon);
  }
  if (url.empty()) return invalid("names no host");
  address.host = std::string(url);
  return address;
}

struct ReplyDeleter {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

struct ContextDeleter {
  void operator()(redisContext* context) const { redisFree(context); }
};

// One connection, used by one thread at a time.
class Connection {
 public:
  Connection(const RedisAddress& address, absl::Duration timeout)
      : address_(address), timeout_(absl::ToTimeval(timeout)) {}

  // A reply, or the reason there is none (the connection is then closed).
  template <typename... Args>
  absl::StatusOr<Reply> Command(const char* format, Args... args) {
    if (context_ == nullptr) RETURN_IF_ERROR(Connect());
    Reply reply(static_cast<redisReply*>(redisCommand(context_.get(), format, args...)));
    return Checked(std::move(reply));
  }

  absl::StatusOr<Reply> CommandArgv(const std::vector<std::string>& arguments) {
    if (context_ == nullptr) RETURN_IF_ERROR(Connect());
    std::vector<const char*> pointers;
    std::vector<size_t> lengths;
    for (const std::string& argument : arguments) {
      pointers.push_back(argument.data());
      lengths.push_back(argument.size());
    }
    Reply reply(static_cast<redisReply*>(redisCommandArgv(
        context_.get(), static_cast<int>(arguments.size()), pointers.data(), lengths.data())));
    return Checked(std::move(reply));
  }

 private:
  absl::Status Connect() {
    context_.reset(redisConnectWithTimeout(address_.host.c_str(), address_.port, timeout_));
    if (context_ == nullptr || context_->err != 0) {
      const std::string why = context_ == nullptr ? "out of memory" : context_->errstr;
      context_.reset();
      return absl::UnavailableError(
          absl::StrFormat("cannot connect to %s:%d: %s", address_.host, address_.port, why));
    }
    redisSetTimeout(context_.get(), timeout_);
    if (!address_.password.empty()) {
      Reply reply(static_cast<redisReply*>(
          redisCommand(context_.get(), "AUTH %b", address_.password.data(),
                       address_.password.size())));
      absl::StatusOr<Reply> checked = Checked(std::move(reply));
      if (!checked.ok()) return checked.status();
    }
    if (address_.db != 0) {
      absl::StatusOr<Reply> checked = Checked(Reply(
          static_cast<redisReply*>(redisCommand(context_.get(), "SELECT %d", address_.db))));
      if (!checked.ok()) return checked.status();
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Reply> Checked(Reply reply) {
    if (reply == nullptr) {
      const std::string why = context_->errstr;
      context_.reset();  // the protocol state is unknown after an I/O error
      return absl::UnavailableError(why);
    }
    if (reply->type == REDIS_REPLY_ERROR) {
      const std::string why(reply->str, reply->len);
      context_.reset();
      return absl::UnavailableError(why);
    }
    return reply;
  }

  const RedisAddress address_;
  const timeval timeout_;
  std::unique_ptr<redisContext, ContextDeleter> context_;
};

class RedisTier final : public SharedTier {
 public:
  RedisTier(RedisAddress address, RedisOptions options)
      : address_(std::move(address)),
        options_(std::move(options)),
        reader_(address_, options_.timeout),
        writer_(address_, options_.timeout),
        writer_thread_([this] { WriteLoop(); }) {}

  ~RedisTier() override {
    {
      std::lock_guard lock(backlog_mutex_);
      stopping_ = true;
    }
    backlog_changed_.notify_all();
    writer_thread_.join();
  }

  std::optional<NamedContent> Fetch(absl::string_view ns, absl::string_view key) override {
    if (!Usable()) return std::nullopt;
    std::lock_guard lock(reader_mutex_);
    const std::string entry_key = EntryKey(ns, key);
    absl::StatusOr<Reply> entry = reader_.Command("GET %b", entry_key.data(), entry_key.size());
    if (!entry.ok()) return Failed(entry.status());
    Succeeded();
    if ((*entry)->type == REDIS_REPLY_NIL) {
      misses_.fetch_add(1);
      return std::nullopt;
    }
    // name -> digest (hex), as the entry lists them
    std::vector<std::pair<std::string, std::string>> listed;
    bool well_formed = (*entry)->type == REDIS_REPLY_STRING;
    if (well_formed) {
      for (absl::string_view line :
           absl::StrSplit(absl::string_view((*entry)->str, (*entry)->len), '\n',
                          absl::SkipEmpty())) {
        const std::pair<absl::string_view, absl::string_view> named =
            absl::StrSplit(line, absl::MaxSplits('\t', 1));
        if (named.first.empty() || named.second.size() != 2 * kSha256Size) well_formed = false;
        listed.emplace_back(named.first, named.second);
      }
    }
    if (!well_formed || listed.empty()) return Rejected(entry_key, "the entry does not parse");
    std::vector<std::string> command = {"MGET"};
    for (const auto& [name, digest] : listed) command.push_back(BlobKey(digest));
    absl::StatusOr<Reply> blobs = reader_.CommandArgv(command);
    if (!blobs.ok()) return Failed(blobs.status());
    if ((*blobs)->type != REDIS_REPLY_ARRAY || (*blobs)->elements != listed.size()) {
      return Rejected(entry_key, "MGET answered something else than its blobs");
    }
    NamedContent content;
    for (size_t i = 0; i < listed.size(); ++i) {
      const redisReply* blob = (*blobs)->element[i];
      if (blob->type == REDIS_REPLY_NIL) {
        misses_.fetch_add(1);  // evicted by Redis since the entry was written
        return std::nullopt;
      }
      std::string data = blob->type == REDIS_REPLY_STRING ? std::string(blob->str, blob->len) : "";
      if (DigestHex(DigestBytes(Sha256(data))) != listed[i].second) {
        return Rejected(entry_key, absl::StrCat("blob '", listed[i].first,
                                                "' does not have the SHA-256 the entry lists"));
      }
      content.emplace_back(listed[i].first, std::move(data));
    }
    hits_.fetch_add(1);
    return content;
  }

  void Offer(std::string ns, std::string key, NamedContent blobs) override {
    for (const auto& [name, data] : blobs) {
      if (name.empty() || name.find_first_of("\t\n") != std::string::npos) return;
    }
    if (!Usable()) return;
    {
      std::lock_guard lock(backlog_mutex_);
      if (backlog_.size() >= kMaxBacklog) return;
      backlog_.push_back({std::move(ns), std::move(key), std::move(blobs)});
    }
    backlog_changed_.notify_one();
  }

  SharedTierStats Stats() override {
    SharedTierStats stats;
    {
      std::lock_guard lock(state_mutex_);
      stats.state = down_reason_.empty()
                        ? std::string("up")
                        : absl::StrCat("down since ", absl::FormatTime("%H:%M:%S", down_since_,
                                                                      absl::LocalTimeZone()),
                                       ": ", down_reason_);
    }
    stats.hits = hits_.load();
    stats.misses = misses_.load();
    stats.errors = errors_.load();
    stats.stores = stores_.load();
    return stats;
  }

 private:
  struct Pending {
    std::string ns;
    std::string key;
    NamedContent blobs;
  };

  std::string EntryKey(absl::string_view ns, absl::string_view key) const {
    return absl::StrCat(
        options_.prefix, "e:",
        DigestHex(DigestBytes(Sha256(absl::StrCat(ns, absl::string_view("\0", 1), key)))));
  }
  std::string BlobKey(absl::string_view hex_digest) const {
    return absl::StrCat(options_.prefix, "b:", hex_digest);
  }

  // False while the tier is down and not yet due for another try.
  bool Usable() {
    std::lock_guard lock(state_mutex_);
    return down_reason_.empty() || absl::Now() >= retry_at_;
  }

  std::nullopt_t Failed(const absl::Status& status) {
    errors_.fetch_add(1);
    std::lock_guard lock(state_mutex_);
    if (down_reason_.empty()) {
      spdlog::warn("shared cache (Redis at {}:{}) unavailable: {}; serving from this kilnd's "
                   "own cache until it is back",
                   address_.host, address_.port, status.message());
      down_since_ = absl::Now();
    }
    down_reason_ = std::string(status.message());
    retry_at_ = absl::Now() + kRetryAfter;
    return std::nullopt;
  }

  void Succeeded() {
    std::lock_guard lock(state_mutex_);
    if (!down_reason_.empty()) {
      spdlog::info("shared cache (Redis at {}:{}) is back", address_.host, address_.port);
      down_reason_.clear();
    }
  }

  std::nullopt_t Rejected(absl::string_view entry_key, absl::string_view why) {
    errors_.fetch_add(1);
    spdlog::error("shared cache: {} not used: {} (poisoned or truncated in Redis)", entry_key,
                  why);
    return std::nullopt;
  }

  void WriteLoop() {
    std::unique_lock lock(backlog_mutex_);
    while (true) {
      backlog_changed_.wait(lock, [this] { return stopping_ || !backlog_.empty(); });
      if (stopping_) return;
      Pending pending = std::move(backlog_.front());
      backlog_.pop_front();
      lock.unlock();
      if (absl::Status status = Write(pending); status.ok()) {
        stores_.fetch_add(1);
        Succeeded();
      } else {
        Failed(status);
      }
      lock.lock();
    }
  }

  absl::Status Write(const Pending& pending) {
    std::string listing;
    for (const auto& [name, data] : pending.blobs) {
      const std::string digest = DigestHex(DigestBytes(Sha256(data)));
      const std::string blob_key = BlobKey(digest);
      // Content-addressed: a blob already there has these bytes.
      absl::StatusOr<Reply> stored = writer_.Command("SET %b %b NX", blob_key.data(),
                                                     blob_key.size(), data.data(), data.size());
      if (!stored.ok()) return stored.status();
      absl::StrAppend(&listing, name, "\t", digest, "\n");
    }
    const std::string entry_key = EntryKey(pending.ns, pending.key);
    return writer_
        .Command("SET %b %b", entry_key.data(), entry_key.size(), listing.data(), listing.size())
        .status();
  }

  const RedisAddress address_;
  const RedisOptions options_;

  std::mutex reader_mutex_;
  Connection reader_;  // guarded by reader_mutex_
  Connection writer_;  // the writer thread's

  std::mutex state_mutex_;
  std::string down_reason_;  // guarded by state_mutex_; empty: up
  absl::Time down_since_;    // guarded by state_mutex_
  absl::Time retry_at_;      // guarded by state_mutex_

  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> misses_{0};
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> stores_{0};

  std::mutex backlog_mutex_;
  std::condition_variable backlog_changed_;
  std::deque<Pending> backlog_;  // guarded by backlog_mutex_
  bool stopping_ = false;        // guarded by backlog_mutex_
  std::thread writer_thread_;    // last: starts once everything it uses exists
};

}  // namespace

absl::StatusOr<std::unique_ptr<SharedTier>> OpenRedisTier(const RedisOptions& options) {
  absl::StatusOr<RedisAddress> address = ParseRedisUrl(options.url);
  if (!address.ok()) return address.status();
  return std::make_unique<RedisTier>(*std::move(address), options);
}

}  // namespace kiln::cache
