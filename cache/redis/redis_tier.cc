// SharedTier on Redis through hiredis (Debian's libhiredis-dev).
//
// Layout under the configured prefix, content-addressed so that two entries
// sharing a blob store it once (<h>: the SHA-256 hex of "ns\0key"):
//   <prefix>b:<sha256 hex>  a blob's content
//   <prefix>e:<h>           the entry: "<name>\t<sha256 hex>\n" per blob
//   <prefix>c:<h>           the claim of the kilnd compiling it: its id, with a
//                           lease it renews while it compiles
//   <prefix>d:<h>           the channel on which the claim's end is published
// Blobs are written before the entry that names them, and the claim ends
// after the entry is written. Eviction is Redis's own (maxmemory-policy
// allkeys-lru): an entry whose blob went is a miss.

#include <hiredis/hiredis.h>
#include <poll.h>

#include <atomic>
#include <random>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cache/redis/redis_tier.h"
#include "common/fmt_absl.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

// Entries waiting to be written (an outage's compiles, replayed once Redis is
// back): at most this many, and this many bytes; the oldest go first.
constexpr size_t kMaxBacklog = 512;
constexpr size_t kMaxBacklogBytes = 256 << 20;
// The last line of a signed entry: "hmac-sha256\t<hex>". No blob has that
// name (Triton's are "<kernel>.<ext>").
constexpr absl::string_view kSignatureName = "hmac-sha256\t";
// While the tier is down no request asks it (a hung Redis would cost each
// miss the lookup timeout); a monitor PINGs it this often instead, and says
// it is back. While it is up, the monitor notices an outage that no request
// has met yet within kCheckWhileUp.
constexpr absl::Duration kCheckWhileDown = absl::Seconds(1);
constexpr absl::Duration kCheckWhileUp = absl::Seconds(5);
// A claim lapses this long after its kilnd last renewed it (a kilnd that died
// holds up the others at most this long); renewed every kRenewEvery.
constexpr int kLeaseMillis = 30000;
constexpr absl::Duration kRenewEvery = absl::Seconds(10);
// A waiter also looks for itself this often, in case a notice went missing.
constexpr absl::Duration kLookEvery = absl::Seconds(1);

// Compare-and-renew and compare-and-delete of a claim: only its holder's id.
constexpr char kRenewScript[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], "
    "ARGV[2]) else return 0 end";
constexpr char kReleaseScript[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else "
    "return 0 end";

std::string RandomId() {
  std::random_device random;
  return absl::StrFormat("%08x%08x", random(), random());
}

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

  // A reply; UNAVAILABLE when Redis could not be reached or did not answer
  // in time (the connection is then closed), FAILED_PRECONDITION when it
  // answered with an error (out of memory, a command refused).
  template <typename... Args>
  absl::StatusOr<Reply> Command(const char* format, Args... args) {
    if (context_ == nullptr) RETURN_IF_ERROR(Connect());
    Reply reply(static_cast<redisReply*>(redisCommand(context_.get(), format, args...)));
    return Checked(std::move(reply));
  }

  // After SUBSCRIBE: whether a message came within `wait` (consumed).
  absl::StatusOr<bool> AwaitMessage(absl::Duration wait) {
    if (context_ == nullptr) return absl::UnavailableError("not connected");
    void* buffered = nullptr;
    if (redisReaderGetReply(context_->reader, &buffered) == REDIS_OK && buffered != nullptr) {
      freeReplyObject(buffered);
      return true;
    }
    // poll(), not a socket timeout: hiredis gives up a connection that timed out.
    pollfd socket{context_->fd, POLLIN, 0};
    const int ready = poll(&socket, 1, static_cast<int>(absl::ToInt64Milliseconds(wait)));
    if (ready == 0) return false;
    if (ready < 0 || redisBufferRead(context_.get()) != REDIS_OK) {
      const std::string why = context_->errstr;
      context_.reset();
      return absl::UnavailableError(why.empty() ? "lost the connection" : why);
    }
    void* reply = nullptr;
    if (redisReaderGetReply(context_->reader, &reply) != REDIS_OK) {
      context_.reset();
      return absl::UnavailableError("unreadable message");
    }
    if (reply == nullptr) return false;  // part of a message so far
    freeReplyObject(reply);
    return true;
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
      if (absl::Status status = Checked(std::move(reply)).status(); !status.ok()) {
        return Unusable(status);
      }
    }
    if (address_.db != 0) {
      absl::Status status =
          Checked(Reply(static_cast<redisReply*>(
                      redisCommand(context_.get(), "SELECT %d", address_.db))))
              .status();
      if (!status.ok()) return Unusable(status);
    }
    return absl::OkStatus();
  }

  // A connection whose AUTH or SELECT was refused serves nothing: an outage
  // until an operator mends the URL or Redis.
  absl::Status Unusable(const absl::Status& status) {
    context_.reset();
    return absl::UnavailableError(status.message());
  }

  absl::StatusOr<Reply> Checked(Reply reply) {
    if (reply == nullptr) {
      const std::string why = context_->errstr;
      context_.reset();  // the protocol state is unknown after an I/O error
      return absl::UnavailableError(why);
    }
    if (reply->type == REDIS_REPLY_ERROR) {
      // The protocol stays in step after an error reply: keep the connection.
      return absl::FailedPreconditionError(std::string(reply->str, reply->len));
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
        reader_(address_, options_.lookup_timeout),
        writer_(address_, options_.timeout),
        monitor_(address_, options_.lookup_timeout),
        writer_thread_([this] { WriteLoop(); }),
        monitor_thread_([this] { MonitorLoop(); }) {}

  ~RedisTier() override {
    {
      std::lock_guard lock(backlog_mutex_);
      stopping_ = true;
    }
    backlog_changed_.notify_all();
    {
      std::lock_guard lock(monitor_mutex_);
      monitor_stopping_ = true;
    }
    monitor_wakeup_.notify_all();
    writer_thread_.join();
    monitor_thread_.join();
  }

  std::optional<NamedContent> Fetch(absl::string_view ns, absl::string_view key) override {
    if (!Up()) return std::nullopt;
    const absl::Time start = absl::Now();
    std::optional<NamedContent> content = FetchChecked(ns, key);
    (content.has_value() ? hit_latency_ : miss_latency_).Record(absl::Now() - start);
    return content;
  }

  // Queued even while the tier is down: what is compiled during an outage
  // reaches the fleet once Redis is back.
  void Offer(std::string ns, std::string key, NamedContent blobs) override {
    for (const auto& [name, data] : blobs) {
      if (name.empty() || name.find_first_of("\t\n") != std::string::npos) {
        return Release(ns, key);
      }
    }
    {
      std::lock_guard lock(backlog_mutex_);
      Queue(Pending{std::move(ns), std::move(key), std::move(blobs)}, /*oldest=*/false);
    }
    backlog_changed_.notify_one();
  }

  Turn AwaitTurn(absl::string_view ns, absl::string_view key, absl::Duration patience) override {
    if (!Up()) return Turn::kCompileHere;
    const std::string hash = KeyHash(ns, key);
    const std::string claim_key = absl::StrCat(options_.prefix, "c:", hash);
    const std::string channel = absl::StrCat(options_.prefix, "d:", hash);
    const std::string entry_key = absl::StrCat(options_.prefix, "e:", hash);
    const absl::Time deadline = absl::Now() + patience;
    absl::StatusOr<Turn> turn = TryClaim(claim_key, entry_key);
    if (!turn.ok()) return CompileHereAfter(turn.status());
    if (*turn != Turn::kCompileHere) return *turn;
    // Another kilnd compiles it: wait for the notice that its claim ended, on
    // a connection of our own (a subscribed connection takes no commands).
    Connection notices(address_, options_.lookup_timeout);
    absl::StatusOr<Reply> subscribed =
        notices.Command("SUBSCRIBE %b", channel.data(), channel.size());
    if (!subscribed.ok()) return CompileHereAfter(subscribed.status());
    while (true) {
      // Also right after subscribing: the claim may have ended before.
      turn = TryClaim(claim_key, entry_key);
      if (!turn.ok()) return CompileHereAfter(turn.status());
      if (*turn == Turn::kDone) compiles_awaited_.fetch_add(1);
      if (*turn != Turn::kCompileHere) return *turn;
      if (stop_waiting_.load()) return Turn::kCompileHere;
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        spdlog::warn("shared cache: waited {} for another kilnd's compile of {}; compiling here",
                     absl::FormatDuration(patience), entry_key);
        return Turn::kCompileHere;
      }
      absl::StatusOr<bool> noticed = notices.AwaitMessage(std::min(left, kLookEvery));
      if (!noticed.ok()) return CompileHereAfter(noticed.status());
    }
  }

  void StopWaiting() override { stop_waiting_ = true; }

  void Release(absl::string_view ns, absl::string_view key) override {
    const std::string hash = KeyHash(ns, key);
    if (!Forget(absl::StrCat(options_.prefix, "c:", hash))) return;
    std::lock_guard lock(reader_mutex_);
    if (absl::Status status = EndClaim(reader_, hash); !status.ok()) Failed(status);
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
    stats.compiles_awaited = compiles_awaited_.load();
    {
      std::lock_guard lock(backlog_mutex_);
      stats.backlog = backlog_.size();
      stats.dropped = dropped_;
    }
    stats.hit_latency = hit_latency_.Summarize();
    stats.miss_latency = miss_latency_.Summarize();
    return stats;
  }

 private:
  // Fetch, on the reader connection, without the timing.
  std::optional<NamedContent> FetchChecked(absl::string_view ns, absl::string_view key) {
    std::lock_guard lock(reader_mutex_);
    // Went down while this request waited for the connection: do not queue
    // up behind a hung Redis.
    if (!Up()) return std::nullopt;
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
    std::string signature;  // hex, from the last line when signed
    bool well_formed = (*entry)->type == REDIS_REPLY_STRING;
    const absl::string_view value =
        well_formed ? absl::string_view((*entry)->str, (*entry)->len) : absl::string_view();
    absl::string_view listing = value;
    if (const size_t last = value.rfind(kSignatureName); last != absl::string_view::npos &&
                                                          (last == 0 || value[last - 1] == '\n')) {
      listing = value.substr(0, last);
      signature = std::string(absl::StripTrailingAsciiWhitespace(
          value.substr(last + kSignatureName.size())));
    }
    if (well_formed) {
      for (absl::string_view line : absl::StrSplit(listing, '\n', absl::SkipEmpty())) {
        const std::pair<absl::string_view, absl::string_view> named =
            absl::StrSplit(line, absl::MaxSplits('\t', 1));
        if (named.first.empty() || named.second.size() != 2 * kSha256Size) well_formed = false;
        listed.emplace_back(named.first, named.second);
      }
    }
    if (!well_formed || listed.empty()) return Rejected(entry_key, "the entry does not parse");
    if (!options_.secret.empty() &&
        !SameDigest(signature, DigestHex(DigestBytes(Sign(entry_key, listing))))) {
      return Rejected(entry_key, signature.empty()
                                     ? "the entry is not signed (written by a kilnd without "
                                       "this fleet's redis_secret_file?)"
                                     : "the entry's signature is not this fleet's");
    }
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

  struct Pending {
    std::string ns;
    std::string key;
    NamedContent blobs;
    size_t Bytes() const {
      size_t bytes = 0;
      for (const auto& [name, data] : blobs) bytes += data.size();
      return bytes;
    }
  };

  // Puts `pending` in the backlog: at its end, or at its front when it is
  // the oldest (a write the outage interrupted); then drops the oldest
  // entries past the bounds. Needs backlog_mutex_.
  void Queue(Pending pending, bool oldest) {
    backlog_bytes_ += pending.Bytes();
    if (oldest) {
      backlog_.push_front(std::move(pending));
    } else {
      backlog_.push_back(std::move(pending));
    }
    while (backlog_.size() > kMaxBacklog || backlog_bytes_ > kMaxBacklogBytes) {
      Pending dropped = std::move(backlog_.front());
      backlog_.pop_front();
      backlog_bytes_ -= dropped.Bytes();
      if (dropped_++ == 0) {
        spdlog::warn("shared cache: more entries wait for Redis than kilnd keeps ({} entries, {} "
                     "MiB); the oldest are dropped and counted in kiln stats",
                     kMaxBacklog, kMaxBacklogBytes >> 20);
      }
      // Its claim, if any, lapses in Redis.
      Forget(absl::StrCat(options_.prefix, "c:", KeyHash(dropped.ns, dropped.key)));
    }
  }

  static std::string KeyHash(absl::string_view ns, absl::string_view key) {
    return DigestHex(DigestBytes(Sha256(absl::StrCat(ns, absl::string_view("\0", 1), key))));
  }
  std::string EntryKey(absl::string_view ns, absl::string_view key) const {
    return absl::StrCat(options_.prefix, "e:", KeyHash(ns, key));
  }

  // kClaimed when this kilnd got the claim, kDone when the entry is there,
  // kCompileHere when another kilnd holds the claim.
  absl::StatusOr<Turn> TryClaim(const std::string& claim_key, const std::string& entry_key) {
    std::lock_guard lock(reader_mutex_);
    if (!Up()) return NotAsked();
    ASSIGN_OR_RETURN(Reply exists, reader_.Command("EXISTS %b", entry_key.data(), entry_key.size()));
    if (exists->type == REDIS_REPLY_INTEGER && exists->integer == 1) return Turn::kDone;
    ASSIGN_OR_RETURN(Reply claimed, reader_.Command("SET %b %b NX PX %d", claim_key.data(),
                                                    claim_key.size(), id_.data(), id_.size(),
                                                    kLeaseMillis));
    Succeeded();
    if (claimed->type != REDIS_REPLY_STATUS) return Turn::kCompileHere;  // nil: held by another
    // The claimant before us may have written the entry and ended its claim
    // between our EXISTS and our SET: look again, now that the claim is ours.
    ASSIGN_OR_RETURN(Reply stored, reader_.Command("EXISTS %b", entry_key.data(), entry_key.size()));
    if (stored->type == REDIS_REPLY_INTEGER && stored->integer == 1) {
      RETURN_IF_ERROR(EndClaim(reader_, claim_key.substr(options_.prefix.size() + 2)));
      return Turn::kDone;
    }
    std::lock_guard held(claims_mutex_);
    claims_held_.insert(claim_key);
    return Turn::kClaimed;
  }

  // Whether this kilnd held `claim_key`, which it no longer does.
  bool Forget(const std::string& claim_key) {
    std::lock_guard lock(claims_mutex_);
    return claims_held_.erase(claim_key) > 0;
  }

  // Deletes this kilnd's claim of <h> ("<prefix>c:<h>") and tells the waiters.
  absl::Status EndClaim(Connection& connection, const std::string& hash) {
    const std::string claim_key = absl::StrCat(options_.prefix, "c:", hash);
    const std::string channel = absl::StrCat(options_.prefix, "d:", hash);
    RETURN_IF_ERROR(connection
                        .Command("EVAL %s 1 %b %b", kReleaseScript, claim_key.data(),
                                 claim_key.size(), id_.data(), id_.size())
                        .status());
    return connection.Command("PUBLISH %b ended", channel.data(), channel.size()).status();
  }

  void RenewClaims() {
    std::vector<std::string> held;
    {
      std::lock_guard lock(claims_mutex_);
      held.assign(claims_held_.begin(), claims_held_.end());
    }
    for (const std::string& claim_key : held) {
      absl::StatusOr<Reply> renewed =
          writer_.Command("EVAL %s 1 %b %b %d", kRenewScript, claim_key.data(), claim_key.size(),
                          id_.data(), id_.size(), kLeaseMillis);
      if (!renewed.ok()) return static_cast<void>(Failed(renewed.status()));
    }
  }
  std::string BlobKey(absl::string_view hex_digest) const {
    return absl::StrCat(options_.prefix, "b:", hex_digest);
  }

  // Requests ask the tier only while it is up; the monitor says when it is
  // back.
  bool Up() {
    std::lock_guard lock(state_mutex_);
    return down_reason_.empty();
  }

  // Redis was not asked: it is down.
  static absl::Status NotAsked() { return absl::CancelledError("the shared cache is down"); }

  // An outage (UNAVAILABLE: unreachable, or no answer in time) takes the
  // tier down; any other error (Redis refused a command) costs that request
  // only.
  std::nullopt_t Failed(const absl::Status& status) {
    if (absl::IsCancelled(status)) return std::nullopt;
    errors_.fetch_add(1);
    if (!absl::IsUnavailable(status)) {
      spdlog::warn("shared cache (Redis at {}:{}) refused a command: {}", address_.host,
                   address_.port, status.message());
      return std::nullopt;
    }
    std::unique_lock lock(state_mutex_);
    if (down_reason_.empty()) {
      spdlog::warn("shared cache (Redis at {}:{}) unavailable: {}; serving from this kilnd's "
                   "own cache until it is back",
                   address_.host, address_.port, status.message());
      down_since_ = absl::Now();
      down_reason_ = std::string(status.message());
      // The monitor may be in its long wait while up: from now on it checks
      // every kCheckWhileDown.
      lock.unlock();
      { std::lock_guard monitor(monitor_mutex_); }
      monitor_wakeup_.notify_all();
      return std::nullopt;
    }
    down_reason_ = std::string(status.message());
    return std::nullopt;
  }

  Turn CompileHereAfter(const absl::Status& status) {
    Failed(status);
    return Turn::kCompileHere;
  }

  void Succeeded() {
    {
      std::lock_guard lock(state_mutex_);
      if (down_reason_.empty()) return;
      spdlog::info("shared cache (Redis at {}:{}) is back", address_.host, address_.port);
      down_reason_.clear();
    }
    // The writer waits for the tier to come back to write the backlog.
    { std::lock_guard lock(backlog_mutex_); }
    backlog_changed_.notify_all();
  }

  void MonitorLoop() {
    std::unique_lock lock(monitor_mutex_);
    while (true) {
      const bool up = Up();
      monitor_wakeup_.wait_for(lock,
                               absl::ToChronoMilliseconds(up ? kCheckWhileUp : kCheckWhileDown),
                               [&] { return monitor_stopping_ || Up() != up; });
      if (monitor_stopping_) return;
      lock.unlock();
      if (absl::Status status = monitor_.Command("PING").status(); status.ok()) {
        Succeeded();
      } else {
        Failed(status);
      }
      lock.lock();
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
    absl::Time renewed = absl::Now();
    while (true) {
      backlog_changed_.wait_for(lock, absl::ToChronoMilliseconds(kRenewEvery),
                                [this] { return stopping_ || (!backlog_.empty() && Up()); });
      if (stopping_) return;
      if (!Up()) continue;
      if (absl::Now() - renewed >= kRenewEvery) {
        lock.unlock();
        RenewClaims();
        renewed = absl::Now();
        lock.lock();
      }
      if (backlog_.empty()) continue;
      Pending pending = std::move(backlog_.front());
      backlog_.pop_front();
      backlog_bytes_ -= pending.Bytes();
      lock.unlock();
      absl::Status status = Write(pending);
      if (!status.ok()) Failed(status);
      if (absl::IsUnavailable(status)) {
        // Written once Redis is back; its claim, if any, lapses meanwhile.
        lock.lock();
        Queue(std::move(pending), /*oldest=*/true);
        continue;
      }
      if (status.ok()) {
        stores_.fetch_add(1);
        Succeeded();
      }
      // The entry is there (or never will be): waiters may look now.
      const std::string hash = KeyHash(pending.ns, pending.key);
      if (Forget(absl::StrCat(options_.prefix, "c:", hash))) {
        if (absl::Status ended = EndClaim(writer_, hash); !ended.ok()) Failed(ended);
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
    if (!options_.secret.empty()) {
      absl::StrAppend(&listing, kSignatureName, DigestHex(DigestBytes(Sign(entry_key, listing))),
                      "\n");
    }
    return writer_
        .Command("SET %b %b", entry_key.data(), entry_key.size(), listing.data(), listing.size())
        .status();
  }

  // Covers the entry's key too: a signed listing moved under another key fails.
  Sha256Digest Sign(absl::string_view entry_key, absl::string_view listing) const {
    return HmacSha256(options_.secret, absl::StrCat(entry_key, "\n", listing));
  }

  const RedisAddress address_;
  const RedisOptions options_;

  std::mutex reader_mutex_;
  Connection reader_;  // guarded by reader_mutex_
  Connection writer_;  // the writer thread's
  Connection monitor_;  // the monitor thread's

  std::mutex state_mutex_;
  std::string down_reason_;  // guarded by state_mutex_; empty: up
  absl::Time down_since_;    // guarded by state_mutex_

  std::atomic<uint64_t> hits_{0};
  LatencyHistogram hit_latency_;
  LatencyHistogram miss_latency_;
  std::atomic<uint64_t> misses_{0};
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> stores_{0};
  std::atomic<uint64_t> compiles_awaited_{0};
  std::atomic<bool> stop_waiting_{false};

  const std::string id_ = RandomId();  // this kilnd's, in the claims it holds
  std::mutex claims_mutex_;
  absl::flat_hash_set<std::string> claims_held_;  // guarded by claims_mutex_

  std::mutex backlog_mutex_;
  std::condition_variable backlog_changed_;
  std::deque<Pending> backlog_;  // guarded by backlog_mutex_
  size_t backlog_bytes_ = 0;     // guarded by backlog_mutex_
  uint64_t dropped_ = 0;         // guarded by backlog_mutex_
  bool stopping_ = false;        // guarded by backlog_mutex_

  std::mutex monitor_mutex_;
  std::condition_variable monitor_wakeup_;
  bool monitor_stopping_ = false;  // guarded by monitor_mutex_

  // Last: they start once everything they use exists.
  std::thread writer_thread_;
  std::thread monitor_thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SharedTier>> OpenRedisTier(const RedisOptions& options) {
  absl::StatusOr<RedisAddress> address = ParseRedisUrl(options.url);
  if (!address.ok()) return address.status();
  return std::make_unique<RedisTier>(*std::move(address), options);
}

}  // namespace kiln::cache
