// AdapterManager: the tiers, holding, loading, eviction and unloading, and its invariants under
// randomized operation sequences with pool pressure. Runs under ThreadSanitizer too (the loader
// thread, and eviction notices from allocating threads).
#include "folio/lora/adapter_manager.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "folio/device/host_virtual_memory.h"
#include "folio/lora/adapter_writer.h"
#include "folio/model/llama_adapter_targets.h"

namespace folio::lora {
namespace {

constexpr size_t kPageBytes = 16 * 1024;

class AdapterManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = std::filesystem::temp_directory_path() /
                 fmt::format("folio_adapter_manager_test_{}_{}", ::getpid(),
                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(directory_);
    Result<std::unique_ptr<device::VirtualMemory>> vm = device::make_host_virtual_memory();
    ASSERT_TRUE(vm.ok());
    vm_ = std::move(*vm);
  }
  void TearDown() override {
    manager_.reset();
    pool_.reset();
    std::filesystem::remove_all(directory_);
  }

  void make_pool(int64_t num_pages) {
    memory::PagePoolOptions options;
    options.page_size = kPageBytes;
    options.num_pages = num_pages;
    options.high_watermark = 1.0;
    options.low_watermark = 1.0;
    options.thread_cache_pages = 0;
    Result<std::unique_ptr<memory::PagePool>> pool = memory::PagePool::create(*vm_, options);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
  }

  void make_manager(AdapterManagerOptions options) {
    options.metrics = &registry_;
    Result<std::unique_ptr<AdapterManager>> manager =
        AdapterManager::create(base_, *pool_, options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = std::move(*manager);
  }

  // Writes a random adapter file of `rank` and returns its path.
  std::string write_adapter(const std::string& name, int64_t rank, uint64_t seed) {
    RandomAdapterOptions options;
    options.rank = rank;
    options.seed = seed;
    Result<gguf::GgufWriter> writer = make_random_adapter_writer(base_, options);
    EXPECT_TRUE(writer.ok()) << writer.status();
    const std::string path = (directory_ / fmt::format("{}.gguf", name)).string();
    EXPECT_TRUE(writer->write_file(path).ok());
    return path;
  }

  AdapterId register_adapter(const std::string& name, int64_t rank = 4, uint64_t seed = 1) {
    Result<AdapterInfo> info = manager_->register_adapter(name, write_adapter(name, rank, seed));
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->id : 0;
  }

  // Acquires `id`, waiting for its load; returns whether it is now held.
  bool acquire_loaded(AdapterId id) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      Result<AdapterReadiness> readiness = manager_->acquire(id);
      if (!readiness.ok()) return false;
      if (*readiness == AdapterReadiness::kReady) return true;
      manager_->wait_for_loads();
    }
    return false;
  }

  // What a hot copy of `bytes` takes from the pool: whole pages.
  static int64_t pages_of(int64_t bytes) {
    const auto page = static_cast<int64_t>(kPageBytes);
    return (bytes + page - 1) / page * page;
  }

  double counter(const std::string& text) const {
    const std::string rendered = registry_.render();
    const std::string line = fmt::format("\n{} ", text);
    const size_t at = rendered.find(line);
    if (at == std::string::npos) return -1;
    return std::stod(rendered.substr(at + line.size()));
  }

  model::LlamaShape base_;
  std::filesystem::path directory_;
  metrics::Registry registry_;
  std::unique_ptr<device::VirtualMemory> vm_;
  std::unique_ptr<memory::PagePool> pool_;
  std::unique_ptr<AdapterManager> manager_;
};

TEST_F(AdapterManagerTest, ColdAdapterLoadsHotAndBindsToATableSlot) {
  make_pool(256);
  make_manager({});
  const AdapterId id = register_adapter("alpha");
  EXPECT_EQ(manager_->tier(id), AdapterTier::kCold);
  Result<AdapterReadiness> first = manager_->acquire(id);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first, AdapterReadiness::kLoading);
  manager_->wait_for_loads();
  EXPECT_EQ(manager_->tier(id), AdapterTier::kHot);
  ASSERT_TRUE(acquire_loaded(id));

  const int64_t ids[] = {0, id, id};
  std::span<const int32_t> slots = manager_->bind_step(ids);
  ASSERT_EQ(slots.size(), 3u);
  EXPECT_EQ(slots[0], 0);
  EXPECT_EQ(slots[1], 1);
  EXPECT_EQ(slots[2], 1);
  const exec::AdapterTableBinding table = manager_->table_binding();
  const int32_t query = model::llama_adapter_target_index(0, model::LlamaProjection::kQuery);
  const kernels::LoraSlotWeights& weights = table.slots[query * table.num_slots + 1];
  EXPECT_EQ(weights.rank, 4);
  EXPECT_EQ(weights.format, kernels::LoraWeightFormat::kF16);
  EXPECT_EQ(table.slots[query * table.num_slots + 0].rank, 0);
  manager_->check_invariants();
  manager_->release(id);
  manager_->maintain();
  manager_->check_invariants();
  pool_->check_invariants();
  // The acquire that missed is counted once, as a miss; the next one is a hit.
  EXPECT_EQ(counter("folio_lora_requests_total{tier=\"cold\"}"), 1);
  EXPECT_EQ(counter("folio_lora_requests_total{tier=\"hot\"}"), 0);
  ASSERT_TRUE(acquire_loaded(id));
  manager_->release(id);
  EXPECT_EQ(counter("folio_lora_requests_total{tier=\"hot\"}"), 1);
}

// Hot budget full of idle adapters and no warm budget: the least recently used idle one goes
// cold so the new one loads (a request must never wait for room no one will free).
TEST_F(AdapterManagerTest, FullHotBudgetWithNoWarmRoomEvictsAnIdleHotAdapter) {
  make_pool(256);
  make_manager({});
  const int64_t footprint = pages_of(manager_->get(register_adapter("probe"))->hot_bytes);
  manager_.reset();
  AdapterManagerOptions options;
  options.hot_budget_bytes = footprint;
  options.warm_budget_bytes = 0;
  make_manager(options);
  const AdapterId first = register_adapter("first", 4, 1);
  const AdapterId second = register_adapter("second", 4, 2);
  ASSERT_TRUE(acquire_loaded(first));
  manager_->release(first);
  ASSERT_TRUE(acquire_loaded(second));
  EXPECT_EQ(manager_->tier(second), AdapterTier::kHot);
  EXPECT_EQ(manager_->tier(first), AdapterTier::kCold);
  // While `second` is held nothing can make room: `first` waits, it does not fail.
  EXPECT_EQ(*manager_->acquire(first), AdapterReadiness::kLoading);
  manager_->release(second);
  ASSERT_TRUE(acquire_loaded(first));
  manager_->release(first);
  manager_->check_invariants();
}

TEST_F(AdapterManagerTest, HotBudgetFullLoadsWarmAndWarmBudgetEvictsLeastRecentlyUsed) {
  make_pool(512);
  AdapterManagerOptions options;
  const AdapterId probe_id = [&] {
    make_manager({});
    return register_adapter("probe");
  }();
  const int64_t hot_bytes = pages_of(manager_->get(probe_id)->hot_bytes);
  const int64_t warm_bytes = manager_->get(probe_id)->warm_bytes;
  manager_.reset();
  options.hot_budget_bytes = 2 * hot_bytes;
  options.warm_budget_bytes = 2 * warm_bytes;
  make_manager(options);
  std::vector<AdapterId> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(register_adapter(fmt::format("a{}", i)));
  for (const AdapterId id : ids) {
    ASSERT_TRUE(acquire_loaded(id));
    const int64_t step_ids[] = {id};
    manager_->bind_step(step_ids);
    manager_->release(id);
    manager_->maintain();
    manager_->check_invariants();
  }
  EXPECT_EQ(manager_->tier(ids[0]), AdapterTier::kHot);
  EXPECT_EQ(manager_->tier(ids[1]), AdapterTier::kHot);
  // Three more went warm; the warm budget holds two, so the least recently used went cold.
  EXPECT_EQ(manager_->tier(ids[2]), AdapterTier::kCold);
  EXPECT_EQ(manager_->tier(ids[3]), AdapterTier::kWarm);
  EXPECT_EQ(manager_->tier(ids[4]), AdapterTier::kWarm);
  const AdapterManagerStats stats = manager_->stats();
  EXPECT_EQ(stats.hot.adapters, 2);
  EXPECT_EQ(stats.warm.adapters, 2);
  EXPECT_LE(stats.hot.bytes, options.hot_budget_bytes);
  EXPECT_LE(stats.warm.bytes, options.warm_budget_bytes);
  // A warm adapter is bound in the int8 format, computed on directly.
  ASSERT_TRUE(acquire_loaded(ids[4]));
  const int64_t step_ids[] = {ids[4]};
  manager_->bind_step(step_ids);
  const exec::AdapterTableBinding table = manager_->table_binding();
  EXPECT_EQ(table.slots[1].format, kernels::LoraWeightFormat::kInt8);
  manager_->release(ids[4]);
}

TEST_F(AdapterManagerTest, FrequentWarmAdapterIsPromotedAndRareHotOneDemoted) {
  make_pool(512);
  make_manager({});
  const AdapterId probe = register_adapter("probe");
  const int64_t hot_bytes = pages_of(manager_->get(probe)->hot_bytes);
  manager_.reset();
  AdapterManagerOptions options;
  options.hot_budget_bytes = hot_bytes;  // one hot adapter
  options.window_steps = 64;
  options.promote_frequency = 8;
  options.demote_frequency = 2;
  make_manager(options);
  const AdapterId rare = register_adapter("rare", 4, 1);
  const AdapterId popular = register_adapter("popular", 4, 2);
  ASSERT_TRUE(acquire_loaded(rare));  // hot: the budget had room
  manager_->release(rare);
  ASSERT_TRUE(acquire_loaded(popular));  // warm: it had not
  EXPECT_EQ(manager_->tier(popular), AdapterTier::kWarm);
  // One long request is one use, however many steps it runs: no promotion.
  const int64_t step_ids[] = {popular};
  for (int step = 0; step < 40; ++step) {
    manager_->bind_step(step_ids);
    manager_->maintain();
  }
  manager_->wait_for_loads();
  manager_->maintain();
  EXPECT_EQ(manager_->tier(popular), AdapterTier::kWarm);
  // Many requests are: each admitted in its own step, while the first still runs.
  for (int request = 0; request < 10; ++request) {
    ASSERT_TRUE(acquire_loaded(popular));
    manager_->bind_step(step_ids);
    manager_->maintain();
    manager_->release(popular);
  }
  manager_->release(popular);  // a promotion waits for the last holder
  for (int step = 0; step < 16; ++step) {
    manager_->maintain();
    manager_->wait_for_loads();
  }
  EXPECT_EQ(manager_->tier(popular), AdapterTier::kHot);
  EXPECT_EQ(manager_->tier(rare), AdapterTier::kWarm);
  EXPECT_GE(counter("folio_lora_promotions_total"), 1);
  EXPECT_GE(counter("folio_lora_demotions_total"), 1);
  manager_->check_invariants();
}

TEST_F(AdapterManagerTest, PoolEvictsUnheldHotAdapterButNeverAHeldOne) {
  make_pool(64);
  make_manager({});
  const AdapterId held = register_adapter("held", 4, 1);
  const AdapterId idle = register_adapter("idle", 4, 2);
  ASSERT_TRUE(acquire_loaded(held));
  ASSERT_TRUE(acquire_loaded(idle));
  manager_->release(idle);
  ASSERT_EQ(manager_->tier(idle), AdapterTier::kHot);
  // Another owner (the KV cache) takes every page it can get.
  std::vector<memory::PageAllocation> others;
  for (;;) {
    memory::PageAllocationRequest request;
    request.content = memory::ContentType::kKvCache;
    Result<memory::PageAllocation> pages = pool_->allocate(request);
    if (!pages.ok()) break;
    others.push_back(std::move(*pages));
  }
  manager_->maintain();
  EXPECT_EQ(manager_->tier(idle), AdapterTier::kCold);
  EXPECT_EQ(manager_->tier(held), AdapterTier::kHot);
  EXPECT_EQ(counter("folio_lora_evictions_total"), 1);
  manager_->check_invariants();
  pool_->check_invariants();
  manager_->release(held);
}

TEST_F(AdapterManagerTest, FailedLoadFailsTheAskerOnceAndLaterAsksRetry) {
  make_pool(256);
  make_manager({});
  const AdapterId id = register_adapter("broken");
  const std::string path = manager_->get(id)->path;
  std::filesystem::resize_file(path, 100);  // truncated after registration
  ASSERT_EQ(*manager_->acquire(id), AdapterReadiness::kLoading);
  manager_->wait_for_loads();
  Result<AdapterReadiness> failed = manager_->acquire(id);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("broken"), std::string::npos) << failed.status();
  EXPECT_NE(failed.status().message().find(path), std::string::npos) << failed.status();
  // The next request tries again (and fails again: the file is still bad).
  ASSERT_EQ(*manager_->acquire(id), AdapterReadiness::kLoading);
  manager_->wait_for_loads();
  EXPECT_FALSE(manager_->acquire(id).ok());
  EXPECT_EQ(manager_->tier(id), AdapterTier::kCold);
  EXPECT_EQ(counter("folio_lora_load_failures_total"), 2);
}

TEST_F(AdapterManagerTest, ChangedFileIsRefusedRatherThanServedUnderTheOldNamespace) {
  make_pool(256);
  make_manager({});
  const AdapterId id = register_adapter("changing", 4, 1);
  write_adapter("changing", 4, 99);  // same path, other weights
  ASSERT_EQ(*manager_->acquire(id), AdapterReadiness::kLoading);
  manager_->wait_for_loads();
  Result<AdapterReadiness> refused = manager_->acquire(id);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("changed"), std::string::npos) << refused.status();
}

TEST_F(AdapterManagerTest, UnregisteredWhileHeldStaysUntilReleasedThenFrees) {
  make_pool(256);
  make_manager({});
  const AdapterId id = register_adapter("leaving");
  const int64_t old_namespace = manager_->get(id)->kv_namespace();
  ASSERT_TRUE(acquire_loaded(id));
  ASSERT_TRUE(manager_->unregister_adapter("leaving").ok());
  EXPECT_FALSE(manager_->find("leaving").has_value());
  Result<AdapterReadiness> again = manager_->acquire(id);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kNotFound);
  manager_->maintain();
  EXPECT_EQ(manager_->tier(id), AdapterTier::kHot);  // its running sequence still computes
  const int64_t step_ids[] = {id};
  manager_->bind_step(step_ids);
  manager_->release(id);
  manager_->maintain();
  EXPECT_EQ(manager_->tier(id), AdapterTier::kCold);
  EXPECT_EQ(manager_->stats().hot.bytes, 0);
  EXPECT_EQ(pool_->stats().pages_free, pool_->num_pages())
      << "the adapter's pages were not given back";
  // The name can be registered again; it gets a new id.
  const AdapterId reloaded = register_adapter("leaving", 4, 7);
  EXPECT_NE(reloaded, id);
  // Other weights under the same name: another KV namespace.
  EXPECT_NE(manager_->get(reloaded)->kv_namespace(), old_namespace);
}

TEST_F(AdapterManagerTest, BadRegistrationsNameTheProblemAndRegisterNothing) {
  make_pool(64);
  make_manager({});
  EXPECT_EQ(manager_->register_adapter("x", (directory_ / "missing.gguf").string()).status().code(),
            StatusCode::kNotFound);
  model::LlamaShape other = base_;
  other.hidden_size = 128;
  RandomAdapterOptions options;
  Result<gguf::GgufWriter> writer = make_random_adapter_writer(other, options);
  ASSERT_TRUE(writer.ok());
  const std::string wrong = (directory_ / "wrong.gguf").string();
  ASSERT_TRUE(writer->write_file(wrong).ok());
  Result<AdapterInfo> mismatched = manager_->register_adapter("wrong", wrong);
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.status().message().find("blk.0."), std::string::npos) << mismatched.status();
  EXPECT_FALSE(manager_->register_adapter("base", write_adapter("b", 4, 1)).ok());
  register_adapter("twice");
  EXPECT_EQ(manager_->register_adapter("twice", write_adapter("t2", 4, 2)).status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(manager_->stats().registered, 1);
}

// Random acquires, releases, steps, unregistrations and re-registrations, with another owner
// grabbing and freeing pool pages: after every operation each adapter is in exactly one tier,
// held adapters are resident and pinned, tier bytes add up and stay in budget, and the pool's
// own invariants hold.
TEST_F(AdapterManagerTest, InvariantsHoldUnderRandomizedOperations) {
  make_pool(96);
  make_manager({});
  const AdapterId probe = register_adapter("probe");
  const int64_t hot_bytes = pages_of(manager_->get(probe)->hot_bytes);
  const int64_t warm_bytes = manager_->get(probe)->warm_bytes;
  manager_.reset();
  AdapterManagerOptions options;
  options.hot_budget_bytes = 4 * hot_bytes;
  options.warm_budget_bytes = 6 * warm_bytes;
  options.window_steps = 32;
  options.promote_frequency = 4;
  options.demote_frequency = 1;
  make_manager(options);

  std::mt19937_64 random(20261125);
  std::vector<std::string> names;
  std::vector<AdapterId> ids;
  for (int i = 0; i < 16; ++i) {
    names.push_back(fmt::format("r{}", i));
    ids.push_back(register_adapter(names.back(), 1 + i % 8, static_cast<uint64_t>(i + 1)));
  }
  std::vector<int> holds(ids.size(), 0);
  std::vector<memory::PageAllocation> others;
  for (int operation = 0; operation < 3000; ++operation) {
    const size_t index = random() % ids.size();
    switch (random() % 7) {
      case 0:
      case 1: {
        Result<AdapterReadiness> readiness = manager_->acquire(ids[index]);
        if (readiness.ok() && *readiness == AdapterReadiness::kReady) ++holds[index];
        break;
      }
      case 2:
        if (holds[index] > 0) {
          manager_->release(ids[index]);
          --holds[index];
        }
        break;
      case 3: {
        std::vector<int64_t> step;
        for (size_t i = 0; i < ids.size(); ++i) {
          if (holds[i] > 0 && random() % 2 == 0) step.push_back(ids[i]);
        }
        std::span<const int32_t> slots = manager_->bind_step(step);
        ASSERT_EQ(slots.size(), step.size());
        manager_->maintain();
        break;
      }
      case 4:
        if (random() % 2 == 0) {
          memory::PageAllocationRequest request;
          request.content = memory::ContentType::kKvCache;
          request.num_pages = 1 + static_cast<int64_t>(random() % 4);
          Result<memory::PageAllocation> pages = pool_->allocate(request);
          if (pages.ok()) others.push_back(std::move(*pages));
        } else if (!others.empty()) {
          others.erase(others.begin() + static_cast<long>(random() % others.size()));
        }
        break;
      case 5:
        if (random() % 8 == 0 && holds[index] == 0) {
          ASSERT_TRUE(manager_->unregister_adapter(names[index]).ok());
          names[index] = fmt::format("r{}_{}", index, operation);
          ids[index] =
              register_adapter(names[index], 1 + static_cast<int64_t>(random() % 8), random());
        }
        break;
      case 6:
        manager_->maintain();
        if (random() % 4 == 0) manager_->wait_for_loads();
        break;
    }
    manager_->check_invariants();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (holds[i] > 0) {
        ASSERT_NE(manager_->tier(ids[i]), AdapterTier::kCold);
      }
    }
    const AdapterManagerStats stats = manager_->stats();
    ASSERT_LE(stats.hot.adapters + stats.warm.adapters, stats.registered + 16);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    while (holds[i]-- > 0) manager_->release(ids[i]);
  }
  manager_->wait_for_loads();
  manager_->maintain();
  manager_->check_invariants();
  pool_->check_invariants();
}

}  // namespace
}  // namespace folio::lora
