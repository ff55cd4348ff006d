// Tests of group commit alone (cache/group_commit.h): callers' items share
// commits, each item is committed once and in order, and a caller returns
// only once its own items are committed. Threads against each other: in the
// TSan build too.

#include "cache/group_commit.h"

#include <atomic>
#include <future>
#include <thread>

#include "gtest/gtest.h"

namespace kiln::cache {
namespace {

struct Item {
  int caller = 0;
  int index = 0;
  bool committed = false;  // set by the commit function
};

TEST(GroupCommitTest, ALoneCallersItemsAreCommittedInOrderAtMostMaxAGroup) {
  std::vector<std::vector<Item*>> groups;
  GroupCommit<Item> commit(3, [&](const std::vector<Item*>& group) {
    groups.push_back(group);
    for (Item* item : group) item->committed = true;
  });
  std::vector<Item> items(7);
  std::vector<Item*> pointers;
  for (Item& item : items) pointers.push_back(&item);

  commit.Commit(pointers);
  for (const Item& item : items) EXPECT_TRUE(item.committed);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0], (std::vector<Item*>{&items[0], &items[1], &items[2]}));
  EXPECT_EQ(groups[1], (std::vector<Item*>{&items[3], &items[4], &items[5]}));
  EXPECT_EQ(groups[2], (std::vector<Item*>{&items[6]}));
  commit.Commit({});
  EXPECT_EQ(groups.size(), 3u) << "nothing queued: nothing committed";
}

TEST(GroupCommitTest, ItemsQueuedWhileACommitRunsShareTheNextOne) {
  // The first commit holds until the other callers have queued theirs: the
  // next commit then takes them all at once.
  constexpr int kOthers = 6;
  std::promise<void> others_queued;
  std::shared_future<void> others_queued_future = others_queued.get_future().share();
  std::atomic<int> commits{0};
  std::mutex groups_mutex;
  std::vector<size_t> group_sizes;
  GroupCommit<Item> commit(100, [&](const std::vector<Item*>& group) {
    if (commits.fetch_add(1) == 0) others_queued_future.wait();
    std::lock_guard lock(groups_mutex);
    group_sizes.push_back(group.size());
    for (Item* item : group) item->committed = true;
  });

  Item first_item;
  std::thread first([&] {
    Item* pointer = &first_item;
    commit.Commit({&pointer, 1});
  });
  while (commits.load() == 0) std::this_thread::yield();  // the first commit runs

  std::vector<Item> items(kOthers);
  std::vector<std::thread> others;
  std::atomic<int> queued{0};
  for (Item& item : items) {
    others.emplace_back([&, pointer = &item] {
      queued.fetch_add(1);
      commit.Commit({&pointer, 1});
      EXPECT_TRUE(pointer->committed) << "returned before its item was committed";
    });
  }
  while (queued.load() < kOthers) std::this_thread::yield();
  // Each has queued, or is about to: give them the moment to take the lock.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  others_queued.set_value();
  first.join();
  for (std::thread& thread : others) thread.join();

  EXPECT_TRUE(first_item.committed);
  std::lock_guard lock(groups_mutex);
  ASSERT_EQ(group_sizes.front(), 1u);
  size_t total = 0;
  for (size_t size : group_sizes) total += size;
  EXPECT_EQ(total, 1u + kOthers) << "each item committed once";
  EXPECT_LT(group_sizes.size(), 1u + kOthers) << "the waiting callers shared commits";
}

TEST(GroupCommitTest, ManyCallersEachItemCommittedOnceAndEachCallersInOrder) {
  constexpr int kCallers = 8;
  constexpr int kItemsEach = 200;
  std::mutex order_mutex;
  std::vector<std::vector<int>> committed_order(kCallers);
  std::atomic<size_t> largest_group{0};
  GroupCommit<Item> commit(16, [&](const std::vector<Item*>& group) {
    size_t largest = largest_group.load();
    while (group.size() > largest && !largest_group.compare_exchange_weak(largest, group.size())) {
    }
    std::lock_guard lock(order_mutex);
    for (Item* item : group) {
      EXPECT_FALSE(item->committed) << "committed twice";
      item->committed = true;
      committed_order[static_cast<size_t>(item->caller)].push_back(item->index);
    }
  });

  std::vector<std::thread> callers;
  for (int caller = 0; caller < kCallers; ++caller) {
    callers.emplace_back([&, caller] {
      std::vector<Item> items(kItemsEach);
      for (int sent = 0; sent < kItemsEach;) {
        // Calls of 1 to 5 items, as Put and PutMany's slices send them.
        const int count = std::min(1 + sent % 5, kItemsEach - sent);
        std::vector<Item*> call;
        for (int i = sent; i < sent + count; ++i) {
          items[static_cast<size_t>(i)] = {caller, i, false};
          call.push_back(&items[static_cast<size_t>(i)]);
        }
        commit.Commit(call);
        for (const Item* item : call) EXPECT_TRUE(item->committed);
        sent += count;
      }
    });
  }
  for (std::thread& thread : callers) thread.join();

  EXPECT_LE(largest_group.load(), 16u);
  for (int caller = 0; caller < kCallers; ++caller) {
    const std::vector<int>& order = committed_order[static_cast<size_t>(caller)];
    ASSERT_EQ(order.size(), static_cast<size_t>(kItemsEach));
    for (int i = 0; i < kItemsEach; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
  }
}

}  // namespace
}  // namespace kiln::cache
