// Memory pressure end to end below the engine loop: the handler over a real page pool and KV
// cache (levels from utilization, each level's actions, metrics), and the scheduler's side of
// each action (no new admissions, a smaller prefill chunk, preemption, no prefetch).
#include "folio/engine/memory_pressure_handler.h"

#include <gtest/gtest.h>

#include <deque>
#include <memory>

#include "folio/device/host_virtual_memory.h"
#include "folio/kv/block_copier.h"
#include "folio/kv/pool_page_source.h"
#include "scheduler_test_util.h"
#include "testing/tokens.h"

namespace folio::engine {
namespace {

using memory::PressureLevel;

constexpr int32_t kBlockSize = 8;
constexpr size_t kPageBytes = 4096;  // 16 blocks of 256 bytes
constexpr int64_t kNumPages = 20;    // one is the dummy blocks'

class MemoryPressureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    vm_ = std::move(device::make_host_virtual_memory()).value();
    memory::PagePoolOptions pool_options;
    pool_options.name = "pressure-test";
    pool_options.page_size = kPageBytes;
    pool_options.num_pages = kNumPages;
    // The pool's own watermark eviction off: only pressure handling evicts here.
    pool_options.high_watermark = 1.0;
    pool_options.low_watermark = 1.0;
    pool_options.thread_cache_pages = 0;
    pool_ = std::move(memory::PagePool::create(*vm_, pool_options)).value();
    source_ = std::make_unique<kv::PoolPageSource>(*pool_);
    kv::BlockManagerOptions kv_options;
    kv_options.geometry = {kBlockSize, 1, 1, 4, DType::kF32};  // 256-byte blocks
    kv_options.max_context_tokens = 1024;
    kv_options.watermark = 0.0;
    manager_ = std::move(kv::BlockManager::create(kv_options, *source_, copier_).value());
  }

  void TearDown() override {
    sequences_.clear();
    scheduler_.reset();
    manager_.reset();
    source_.reset();
    adapter_pages_.clear();
    pool_.reset();
  }

  void make_scheduler(SchedulerOptions options = {}) {
    scheduler_ = std::move(Scheduler::create(options, *manager_, false).value());
  }

  std::unique_ptr<MemoryPressureHandler> make_handler(MemoryPressureOptions options = {}) {
    PressureSources sources;
    sources.pool = pool_.get();
    sources.block_manager = manager_.get();
    sources.registry = &registry_;
    sources.release_idle_captures = [this](int64_t idle_steps) {
      last_idle_steps_ = idle_steps;
      ++release_calls_;
      return int64_t{4096};
    };
    auto handler = MemoryPressureHandler::create(options, sources);
    EXPECT_TRUE(handler.ok()) << handler.status().to_string();
    return std::move(handler).value();
  }

  // A sequence whose KV is written and then let go: its full blocks stay CACHED.
  void cache_prompt(int64_t seq, int32_t length) {
    const std::vector<int32_t> prompt =
        folio::testing::tokens(length, static_cast<int32_t>(seq) * 1000);
    ASSERT_TRUE(manager_->allocate(kv::SeqId(seq), prompt).ok());
    ASSERT_TRUE(manager_->mark_computed(kv::SeqId(seq), length).ok());
    ASSERT_TRUE(manager_->free(kv::SeqId(seq)).ok());
  }

  // An unused hot adapter's pages: unpinned, evictable before KV.
  void hold_adapter_pages(int32_t pages) {
    memory::PageAllocationRequest request;
    request.num_pages = pages;
    request.content = memory::ContentType::kAdapterWeights;
    request.pinned = false;
    adapter_pages_.push_back(std::move(pool_->allocate(request)).value());
  }

  Sequence* add(int32_t prompt_length, int32_t num_preemptions = 0) {
    const int64_t id = static_cast<int64_t>(sequences_.size()) + 1000;
    sequences_.push_back(testing::make_sequence(id, prompt_length, clock_.now()));
    sequences_.back()->num_preemptions = num_preemptions;
    scheduler_->add(sequences_.back().get());
    return sequences_.back().get();
  }

  StepPlan step() { return testing::run_step(*scheduler_, *manager_, clock_.now()); }

  double metric(const std::string& series) {
    const std::string text = registry_.render();
    const size_t at = text.find("\n" + series + " ");
    EXPECT_NE(at, std::string::npos) << series << " not in\n" << text;
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + series.size() + 2));
  }

  std::unique_ptr<device::VirtualMemory> vm_;
  std::unique_ptr<memory::PagePool> pool_;
  std::unique_ptr<kv::PoolPageSource> source_;
  kv::HostKvBlockCopier copier_;
  std::unique_ptr<kv::BlockManager> manager_;
  std::unique_ptr<Scheduler> scheduler_;
  std::deque<std::unique_ptr<Sequence>> sequences_;
  std::vector<memory::PageAllocation> adapter_pages_;
  metrics::Registry registry_;
  ManualClock clock_;
  int64_t last_idle_steps_ = 0;
  int release_calls_ = 0;
};

TEST_F(MemoryPressureTest, ActionsEscalateWithTheLevel) {
  const PressureActions normal = pressure_actions(PressureLevel::kNormal);
  EXPECT_FALSE(normal.evict_cold_content || normal.stop_prefetch || normal.stop_admission ||
               normal.shrink_prefill_chunk || normal.prefer_cheaper_preemption || normal.preempt ||
               normal.release_idle_captures);
  const PressureActions warning = pressure_actions(PressureLevel::kWarning);
  EXPECT_TRUE(warning.evict_cold_content && warning.stop_prefetch && warning.release_idle_captures);
  EXPECT_FALSE(warning.stop_admission || warning.shrink_prefill_chunk || warning.preempt);
  const PressureActions critical = pressure_actions(PressureLevel::kCritical);
  EXPECT_TRUE(critical.evict_cold_content && critical.stop_admission &&
              critical.shrink_prefill_chunk && critical.prefer_cheaper_preemption);
  EXPECT_FALSE(critical.preempt);
  const PressureActions out_of_memory = pressure_actions(PressureLevel::kOutOfMemory);
  EXPECT_TRUE(out_of_memory.preempt && out_of_memory.stop_admission &&
              out_of_memory.evict_cold_content);
}

// Warning evicts by the pool's content priorities: the unused adapter's pages and the KV pages
// that only hold CACHED blocks go, down to the warning exit threshold where evictable content
// allows; what keeps running (an owned sequence) stays. Utilization counts pinned pages only.
TEST_F(MemoryPressureTest, WarningEvictsColdContentDownToTheExitThreshold) {
  make_scheduler();
  hold_adapter_pages(2);
  for (int64_t seq = 1; seq <= 2; ++seq) cache_prompt(seq, 16 * kBlockSize);  // a page each
  // The running sequence shares the dummy blocks' page.
  const std::vector<int32_t> running = folio::testing::tokens(40, 77);
  ASSERT_TRUE(manager_->allocate(kv::SeqId(99), running).ok());
  memory::PageAllocationRequest request;
  request.num_pages = 14;
  request.content = memory::ContentType::kActivation;
  request.pinned = true;
  memory::PageAllocation pinned = std::move(pool_->allocate(request)).value();
  std::unique_ptr<MemoryPressureHandler> handler = make_handler();
  const int64_t owned = manager_->counts().owned;
  // The activation and the KV pages holding OWNED blocks are pinned; adapters and the pages of
  // CACHED blocks are held but evictable.
  ASSERT_GE(handler->utilization(), 0.80);
  ASSERT_LT(handler->utilization(), 0.95);
  ASSERT_LE(pool_->stats().pages_free, 1);

  EXPECT_EQ(handler->before_schedule(*scheduler_, false), PressureLevel::kWarning);
  EXPECT_EQ(handler->counts().adapter_pages_evicted, 2);  // priority 3 before KV's 5
  EXPECT_GT(handler->counts().kv_pages_evicted, 0);
  // Down to the exit threshold (15 of 20 pages held), or as far as evictable content allows.
  const memory::PoolStats after = pool_->stats();
  EXPECT_TRUE(after.pages_free >= 5 || after.pages_unpinned == 0) << after.pages_free;
  EXPECT_TRUE(manager_->contains(kv::SeqId(99)));
  EXPECT_EQ(manager_->counts().owned, owned);
  manager_->process_evictions().ignore();
  manager_->check_invariants();
  pool_->check_invariants();
  EXPECT_EQ(release_calls_, 1);
  EXPECT_EQ(last_idle_steps_, handler->options().idle_capture_steps);
  EXPECT_FALSE(scheduler_->pressure().prefetch_adapters);
  EXPECT_TRUE(scheduler_->pressure().admit_new);

  EXPECT_EQ(metric("folio_memory_pressure_level"), 1);
  EXPECT_EQ(metric("folio_memory_pressure_transitions_total{level=\"warning\"}"), 1);
  EXPECT_EQ(metric("folio_memory_pressure_evicted_pages_total{content=\"adapter_weights\"}"), 2);
  EXPECT_EQ(metric("folio_memory_pressure_released_graph_bytes_total"), 4096);

  // The pinned content gone: below the exit, normal, and the scheduler is told nothing.
  pinned = memory::PageAllocation();
  EXPECT_EQ(handler->before_schedule(*scheduler_, false), PressureLevel::kNormal);
  EXPECT_TRUE(scheduler_->pressure().prefetch_adapters);
  EXPECT_EQ(metric("folio_memory_pressure_level"), 0);
}

// Under a KV cap the KV cache can be full while the pool is nearly empty: the scheduler's actions
// answer the budget's level, but nothing is evicted from the pool (it would free nothing the KV
// cache can use), and CACHED blocks do not count (the cache reuses them by itself).
TEST_F(MemoryPressureTest, AFullKvCapActsOnTheSchedulerButEvictsNothing) {
  manager_.reset();
  source_ = std::make_unique<kv::PoolPageSource>(*pool_, 0, /*max_pages_held=*/5);
  kv::BlockManagerOptions kv_options;
  kv_options.geometry = {kBlockSize, 1, 1, 4, DType::kF32};
  kv_options.max_context_tokens = 1024;
  kv_options.watermark = 0.0;
  manager_ = std::move(kv::BlockManager::create(kv_options, *source_, copier_).value());
  make_scheduler();
  hold_adapter_pages(2);
  cache_prompt(1, 4 * kBlockSize);  // 4 CACHED blocks
  for (int64_t seq = 2; seq <= 11; ++seq) {
    const int32_t num_blocks = seq == 11 ? 3 : 8;
    const std::vector<int32_t> prompt =
        folio::testing::tokens(num_blocks * kBlockSize, static_cast<int32_t>(seq) * 1000);
    auto outcome = manager_->allocate(kv::SeqId(seq), prompt);
    ASSERT_TRUE(outcome.ok());
    ASSERT_EQ(outcome->admission, kv::Admission::kAdmitted) << seq;
  }
  std::unique_ptr<MemoryPressureHandler> handler = make_handler();
  ASSERT_GE(handler->utilization(), 0.95);  // 75 + 1 dummy of 80 blocks owned
  EXPECT_EQ(handler->before_schedule(*scheduler_, false), PressureLevel::kCritical);
  EXPECT_FALSE(scheduler_->pressure().admit_new);
  EXPECT_EQ(scheduler_->pressure().preemptions, 0);
  EXPECT_EQ(handler->counts().pages_evicted, 0);
  EXPECT_EQ(release_calls_, 0);
  EXPECT_EQ(adapter_pages_.size(), 1u);
  EXPECT_TRUE(pool_->stats()
                  .per_content[memory::content_index(memory::ContentType::kAdapterWeights)]
                  .pages_in_use == 2);
  EXPECT_EQ(manager_->counts().cached, 4);
  manager_->check_invariants();
}

TEST_F(MemoryPressureTest, CriticalStopsNewAdmissionsAndShrinksTheChunk) {
  SchedulerOptions options;
  options.prefill_chunk_size = 256;
  options.max_num_batched_tokens = 1024;
  make_scheduler(options);
  // Pinned content nothing can evict: 19 of 20 pages held.
  memory::PageAllocationRequest request;
  request.num_pages = 18;
  request.content = memory::ContentType::kActivation;
  request.pinned = true;
  adapter_pages_.push_back(std::move(pool_->allocate(request)).value());
  std::unique_ptr<MemoryPressureHandler> handler = make_handler();
  ASSERT_EQ(handler->before_schedule(*scheduler_, false), PressureLevel::kCritical);
  EXPECT_FALSE(scheduler_->pressure().admit_new);
  EXPECT_EQ(scheduler_->pressure().prefill_chunk_limit, 64);  // a quarter of 256
  EXPECT_TRUE(scheduler_->pressure().prefer_cheaper_preemption);
  EXPECT_EQ(scheduler_->pressure().preemptions, 0);

  Sequence* fresh = add(8);
  Sequence* preempted_before = add(8, /*num_preemptions=*/1);
  const StepPlan plan = step();
  EXPECT_EQ(fresh->status, SequenceStatus::kWaiting);
  EXPECT_EQ(preempted_before->status, SequenceStatus::kRunning);
  ASSERT_EQ(plan.segments.size(), 1u);

  // A long prompt admitted at normal pressure runs in chunks of the cut size at critical.
  adapter_pages_.clear();
  EXPECT_EQ(handler->before_schedule(*scheduler_, false), PressureLevel::kNormal);
  step();  // admits `fresh`
  Sequence* long_prompt = add(400);
  StepPlan admitted = step();
  EXPECT_EQ(long_prompt->status, SequenceStatus::kRunning);
  EXPECT_EQ(admitted.segments.back().num_tokens, 256);
  SchedulerPressure critical;
  critical.prefill_chunk_limit = 64;
  scheduler_->set_pressure(critical);
  const StepPlan chunked = step();
  EXPECT_EQ(chunked.segments.back().sequence, long_prompt);
  EXPECT_EQ(chunked.segments.back().num_tokens, 64);
}

TEST_F(MemoryPressureTest, OutOfMemoryPreemptsOneVictimPerStepButNeverTheLast) {
  SchedulerOptions options;
  make_scheduler(options);
  Sequence* first = add(16);
  Sequence* second = add(16);
  step();
  step();
  ASSERT_EQ(scheduler_->num_running(), 2);
  MemoryPressureOptions pressure_options;
  pressure_options.preempt_ahead = true;
  std::unique_ptr<MemoryPressureHandler> handler = make_handler(pressure_options);
  // A failed append is out of memory whatever the utilization; it preempted what it needed, so
  // with the pool itself nearly empty nothing more is preempted.
  ASSERT_EQ(handler->before_schedule(*scheduler_, /*allocation_failed=*/true),
            PressureLevel::kOutOfMemory);
  EXPECT_FALSE(scheduler_->pressure().admit_new);
  EXPECT_EQ(scheduler_->pressure().preemptions, 0);
  step();

  // The pool out of pages (pinned content nothing can evict): one victim per step.
  memory::PageAllocationRequest request;
  request.num_pages = static_cast<int32_t>(pool_->stats().pages_free);
  request.content = memory::ContentType::kActivation;
  request.pinned = true;
  adapter_pages_.push_back(std::move(pool_->allocate(request)).value());
  ASSERT_EQ(handler->before_schedule(*scheduler_, false), PressureLevel::kOutOfMemory);
  EXPECT_EQ(scheduler_->pressure().preemptions, 1);
  StepPlan plan = scheduler_->schedule(clock_.now());
  handler->after_schedule(plan);
  EXPECT_EQ(plan.num_preempted_for_pressure, 1);
  EXPECT_EQ(plan.num_preempted_by_recompute, 1);
  EXPECT_EQ(second->status, SequenceStatus::kWaiting);  // the later arrival
  EXPECT_EQ(first->status, SequenceStatus::kRunning);
  scheduler_->complete(plan);
  for (const ScheduledSegment& segment : plan.segments) segment.sequence->tokens.push_back(7);
  EXPECT_EQ(handler->counts().preemptions, 1);
  EXPECT_EQ(metric("folio_memory_pressure_preemptions_total"), 1);

  // Still out of memory: the last running sequence is kept.
  ASSERT_EQ(handler->before_schedule(*scheduler_, false), PressureLevel::kOutOfMemory);
  plan = scheduler_->schedule(clock_.now());
  EXPECT_EQ(plan.num_preempted_for_pressure, 0);
  EXPECT_EQ(first->status, SequenceStatus::kRunning);
  scheduler_->complete(plan);
  scheduler_->check_invariants();
}

TEST_F(MemoryPressureTest, BadOptionsAreRefused) {
  MemoryPressureOptions options;
  options.thresholds.critical = memory::PressureBand{0.5, 0.4};
  PressureSources sources;
  sources.pool = pool_.get();
  sources.block_manager = manager_.get();
  sources.registry = &registry_;
  EXPECT_EQ(MemoryPressureHandler::create(options, sources).status().code(),
            StatusCode::kInvalidArgument);
  options = MemoryPressureOptions{};
  options.critical_chunk_fraction = 0.0;
  EXPECT_EQ(MemoryPressureHandler::create(options, sources).status().code(),
            StatusCode::kInvalidArgument);
  sources.pool = nullptr;
  EXPECT_EQ(MemoryPressureHandler::create(MemoryPressureOptions{}, sources).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace folio::engine
