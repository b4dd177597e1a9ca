// A KV-parallel group in one process, for the dist tests and benchmarks (dist.md "KV-parallel
// groups"): P members, each a block manager on its own page source and an executor whose graphs
// attend over the member's range of positions and merge through the in-process group, driven
// over one kv::KvParallelCache; beside them one process ("whole") whose cache holds every
// position. A script of sequences runs step by step through both: the same segments, the
// group's steps with each member's block tables and slots, the whole process's with its own.
// Member 0 runs on the caller's thread, the others on threads of their own that live as long
// as the group (so a step costs no thread start).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "folio/base/check.h"
#include "folio/base/result.h"
#include "folio/base/thread_pool.h"
#include "folio/device/host_virtual_memory.h"
#include "folio/dist/group_step_collectives.h"
#include "folio/dist/in_process_collectives.h"
#include "folio/exec/arena_memory.h"
#include "folio/exec/executor.h"
#include "folio/exec/multi_shape_arena.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/kv/block_manager.h"
#include "folio/kv/fixed_page_source.h"
#include "folio/kv/kv_parallel_cache.h"
#include "folio/memory/page_pool.h"
#include "folio/model/llama_model.h"

namespace folio::testing {

struct KvParallelGroupOptions {
  model::LlamaShape shape;  // the generated model's
  uint64_t model_seed = 41;
  DType kv_dtype = DType::kF32;
  exec::ExecutionMode mode = exec::ExecutionMode::kGraph;
  int32_t num_members = 2;
  int32_t block_size = 8;
  int32_t tokens_per_member = 32;
  // Each member's cache: pages of blocks_per_page blocks, num_dummy_blocks of them reserved
  // for padding. The whole process gets num_members times the pages.
  int32_t blocks_per_page = 12;
  int32_t member_pages = 1;
  int32_t num_dummy_blocks = 4;  // covers the ladder's largest padding
  std::vector<int32_t> bucket_ladder = {1, 2, 4, 8, 16, 32, 64};
  int32_t max_sequences = 4;
  int32_t threads_per_member = 1;
};

// One sequence of a script: its tokens (prompt, then what it generated) and how many of them
// have their KV written.
struct ScriptSequence {
  kv::SeqId id;
  std::vector<int32_t> tokens;
  int32_t num_computed = 0;
};

// One step's arrays for one executor.
struct KvpStepArrays {
  std::vector<int32_t> token_ids, positions, slot_mapping, query_start, seq_lens, block_tables,
      logit_indices;
  int32_t max_blocks_per_sequence = 0;
  ir::StepBatch batch() const {
    return ir::StepBatch{.token_ids = token_ids,
                         .positions = positions,
                         .slot_mapping = slot_mapping,
                         .query_start = query_start,
                         .seq_lens = seq_lens,
                         .block_tables = block_tables,
                         .logit_indices = logit_indices,
                         .adapter_ids = {},
                         .max_blocks_per_sequence = max_blocks_per_sequence,
                         .adapter_slots = {}};
  }
};

// A block manager on its own page source and an executor over its cache.
class KvpWorker {
 public:
  KvpWorker(const KvParallelGroupOptions& options) : threads_(options.threads_per_member) {}

  Status init(const KvParallelGroupOptions& options, const model::LlamaModel& model,
              device::VirtualMemory& vm, memory::PagePool& page_pool, int32_t max_context_tokens,
              int32_t num_pages, int64_t kv_range_begin, int64_t kv_range_end,
              exec::StepCollectives* collectives, const std::string& name) {
    kv::BlockManagerOptions kv_options;
    kv_options.geometry = model.kv_cache_geometry(options.block_size, options.kv_dtype);
    kv_options.max_context_tokens = max_context_tokens;
    kv_options.watermark = 0.0;
    kv_options.num_dummy_blocks = options.num_dummy_blocks;
    source_ = std::make_unique<kv::FixedPageSource>(
        kv_options.geometry.block_bytes() * options.blocks_per_page, num_pages);
    FOLIO_ASSIGN_OR_RETURN(manager_, kv::BlockManager::create(kv_options, *source_, copier_));
    arena_ = exec::MultiShapeArena::create(std::make_unique<exec::DedicatedArenaMemory>(vm));
    const int64_t num_blocks = int64_t{num_pages} * options.blocks_per_page;
    max_blocks_per_sequence_ = (max_context_tokens + options.block_size - 1) / options.block_size;
    const ir::KvCacheShape kv_cache{kv_options.geometry, num_blocks, max_blocks_per_sequence_};
    model::LlamaGraphOptions graph_options;
    graph_options.kv_range_begin = kv_range_begin;
    graph_options.kv_range_end = kv_range_end;
    exec::ExecutorOptions executor_options;
    executor_options.name = name;
    executor_options.max_sequences = options.max_sequences;
    executor_options.max_logit_rows = options.max_sequences;
    executor_options.mode = options.mode;
    executor_options.first_dummy_block = manager_->dummy_block().value();
    executor_options.num_dummy_blocks = options.num_dummy_blocks;
    executor_options.bucket_ladder = options.bucket_ladder;
    executor_options.collectives = collectives;
    const exec::ExecutorResources resources{
        threads_, *arena_, page_pool, model.weights(),
        exec::KvCacheBinding{manager_->layout(), num_blocks, 0}};
    FOLIO_ASSIGN_OR_RETURN(
        executor_, exec::Executor::create(model.graph_factory(kv_cache, graph_options), resources,
                                          executor_options));
    return Status();
  }

  kv::BlockManager& manager() { return *manager_; }
  exec::Executor& executor() { return *executor_; }
  int32_t max_blocks_per_sequence() const { return max_blocks_per_sequence_; }

 private:
  ThreadPool threads_;
  std::unique_ptr<kv::FixedPageSource> source_;
  kv::HostKvBlockCopier copier_;
  std::unique_ptr<kv::BlockManager> manager_;
  std::unique_ptr<exec::MultiShapeArena> arena_;
  std::unique_ptr<exec::Executor> executor_;
  int32_t max_blocks_per_sequence_ = 0;
};

// A thread that runs one job at a time for its owner: post() hands it over, wait() returns
// when it is done.
class MemberThread {
 public:
  MemberThread() : thread_([this] { loop(); }) {}
  ~MemberThread() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void post(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      job_ = std::move(job);
    }
    wake_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return !job_; });
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stopping_ || job_; });
      if (stopping_ && !job_) return;
      std::function<void()> job = job_;
      lock.unlock();
      job();
      lock.lock();
      job_ = nullptr;
      done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::function<void()> job_;
  bool stopping_ = false;
  std::thread thread_;
};

// Forwards a member's step collectives and counts what its all_gathers received from the
// other members (the KV-parallel exchange), in bytes.
class CountingStepCollectives final : public exec::StepCollectives {
 public:
  explicit CountingStepCollectives(exec::StepCollectives& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Status all_reduce_sum(std::span<float> values) override { return inner_.all_reduce_sum(values); }
  Status all_gather(std::span<const float> input, std::span<float> output) override {
    received_bytes_ += static_cast<int64_t>((output.size() - input.size()) * sizeof(float));
    return inner_.all_gather(input, output);
  }
  int64_t received_bytes() const { return received_bytes_; }

 private:
  exec::StepCollectives& inner_;
  int64_t received_bytes_ = 0;  // written by the member's thread, read between steps
};

class KvParallelGroup {
 public:
  static Result<std::unique_ptr<KvParallelGroup>> create(const KvParallelGroupOptions& options) {
    std::unique_ptr<KvParallelGroup> group(new KvParallelGroup(options));
    FOLIO_RETURN_IF_ERROR(group->init());
    return group;
  }
  ~KvParallelGroup() { threads_.clear(); }

  const KvParallelGroupOptions& options() const { return options_; }
  const model::LlamaModel& model() const { return *model_; }
  device::VirtualMemory& vm() { return *vm_; }
  memory::PagePool& page_pool() { return *page_pool_; }
  KvpWorker& whole() { return *whole_; }
  KvpWorker& member(int32_t g) { return *members_[static_cast<size_t>(g)]; }
  kv::KvParallelCache& cache() { return *cache_; }
  // Bytes member g's all_gathers received from the others so far.
  int64_t received_bytes(int32_t g) const {
    return counting_[static_cast<size_t>(g)]->received_bytes();
  }
  int32_t context() const { return options_.tokens_per_member * options_.num_members; }

  // Admits a sequence in both the whole process and the group (all or nothing over the
  // members it spans); returns the tokens the prefix cache served, which must agree.
  Result<int32_t> allocate(const ScriptSequence& sequence) {
    FOLIO_ASSIGN_OR_RETURN(const kv::AllocateOutcome one,
                           whole_->manager().allocate(sequence.id, sequence.tokens));
    FOLIO_ASSIGN_OR_RETURN(const kv::KvpAllocateOutcome spread,
                           cache_->allocate(sequence.id, sequence.tokens));
    if (one.admission != kv::Admission::kAdmitted || spread.admission != kv::Admission::kAdmitted) {
      return resource_exhausted("sequence {} not admitted", sequence.id);
    }
    if (one.num_cached_tokens != spread.num_cached_tokens) {
      return internal_error("sequence {}: {} cached tokens in one process, {} in the group",
                            sequence.id, one.num_cached_tokens, spread.num_cached_tokens);
    }
    return spread.num_cached_tokens;
  }

  // The next step's segments: each sequence's uncomputed tokens, at most `chunk` of them.
  static std::vector<kv::StepSegment> plan_step(const std::vector<ScriptSequence>& sequences,
                                                int32_t chunk) {
    std::vector<kv::StepSegment> segments;
    for (const ScriptSequence& sequence : sequences) {
      const int32_t remaining =
          static_cast<int32_t>(sequence.tokens.size()) - sequence.num_computed;
      if (remaining > 0) {
        segments.push_back({sequence.id, sequence.num_computed, std::min(remaining, chunk)});
      }
    }
    return segments;
  }

  // The whole process's arrays (index -1) or member g's for `segments`.
  Result<KvpStepArrays> arrays(const std::vector<ScriptSequence>& sequences,
                               const std::vector<kv::StepSegment>& segments, int32_t g) {
    KvpStepArrays arrays;
    std::vector<kv::SeqId> seqs;
    arrays.query_start.push_back(0);
    for (const kv::StepSegment& segment : segments) {
      const ScriptSequence& sequence = find(sequences, segment.seq);
      for (int32_t i = 0; i < segment.num_tokens; ++i) {
        arrays.token_ids.push_back(
            sequence.tokens[static_cast<size_t>(segment.first_position + i)]);
        arrays.positions.push_back(segment.first_position + i);
      }
      arrays.query_start.push_back(static_cast<int32_t>(arrays.token_ids.size()));
      arrays.seq_lens.push_back(segment.first_position + segment.num_tokens);
      if (segment.first_position + segment.num_tokens ==
          static_cast<int32_t>(sequence.tokens.size())) {
        arrays.logit_indices.push_back(arrays.query_start.back() - 1);
      }
      seqs.push_back(segment.seq);
    }
    arrays.slot_mapping.assign(arrays.token_ids.size(), -1);
    KvpWorker& worker = g < 0 ? *whole_ : member(g);
    arrays.max_blocks_per_sequence = worker.max_blocks_per_sequence();
    arrays.block_tables.resize(seqs.size() * static_cast<size_t>(arrays.max_blocks_per_sequence));
    if (g < 0) {
      FOLIO_RETURN_IF_ERROR(whole_->manager().fill_block_tables(
          seqs, arrays.max_blocks_per_sequence, arrays.block_tables));
      FOLIO_RETURN_IF_ERROR(whole_->manager().fill_slot_mapping(segments, arrays.slot_mapping));
    } else {
      FOLIO_RETURN_IF_ERROR(
          cache_->fill_block_tables(g, seqs, arrays.max_blocks_per_sequence, arrays.block_tables));
      FOLIO_RETURN_IF_ERROR(cache_->fill_slot_mapping(g, segments, arrays.slot_mapping));
    }
    return arrays;
  }

  // Runs one step on every member (member 0 here, the others on their threads); returns
  // member 0's logits, and in `member_logits` (when given) every member's.
  Result<std::vector<float>> run_members(const std::vector<KvpStepArrays>& member_arrays,
                                         std::vector<std::vector<float>>* member_logits = nullptr) {
    const auto members = static_cast<size_t>(options_.num_members);
    std::vector<Result<std::vector<float>>> results(members, std::vector<float>());
    const auto run = [&](size_t g) {
      Result<ir::StepOutput> output = members_[g]->executor().execute(member_arrays[g].batch());
      results[g] = output.ok() ? Result<std::vector<float>>(std::vector<float>(
                                     output->logits.begin(), output->logits.end()))
                               : Result<std::vector<float>>(output.status());
    };
    for (size_t g = 1; g < members; ++g) threads_[g - 1]->post([&run, g] { run(g); });
    run(0);
    for (size_t g = 1; g < members; ++g) threads_[g - 1]->wait();
    for (size_t g = 0; g < members; ++g) {
      if (!results[g].ok()) {
        return results[g].status().with_context(fmt::format("KV-parallel member {}", g));
      }
    }
    if (member_logits != nullptr) {
      member_logits->clear();
      for (size_t g = 0; g < members; ++g) member_logits->push_back(*results[g]);
    }
    return std::move(results[0]).value();
  }

  // After a step of `segments`: marks their tokens computed in both, and appends `next_tokens`
  // (one per segment that reached its sequence's end, in order; -1: append nothing).
  Status commit(std::vector<ScriptSequence>& sequences,
                const std::vector<kv::StepSegment>& segments,
                const std::vector<int32_t>& next_tokens) {
    size_t row = 0;
    for (const kv::StepSegment& segment : segments) {
      ScriptSequence& sequence = find(sequences, segment.seq);
      sequence.num_computed = segment.first_position + segment.num_tokens;
      FOLIO_RETURN_IF_ERROR(whole_->manager().mark_computed(sequence.id, sequence.num_computed));
      FOLIO_RETURN_IF_ERROR(cache_->mark_computed(sequence.id, sequence.num_computed));
      if (sequence.num_computed < static_cast<int32_t>(sequence.tokens.size())) continue;
      const int32_t token = next_tokens.at(row++);
      if (token < 0) continue;
      sequence.tokens.push_back(token);
      FOLIO_ASSIGN_OR_RETURN(const kv::AppendOutcome one,
                             whole_->manager().append_slot(sequence.id, token));
      FOLIO_ASSIGN_OR_RETURN(const kv::KvpAppendOutcome spread,
                             cache_->append_slot(sequence.id, token));
      if (one.status != kv::AppendStatus::kAppended ||
          spread.status != kv::AppendStatus::kAppended) {
        return resource_exhausted("no block for sequence {}'s next token", sequence.id);
      }
    }
    return Status();
  }

 private:
  explicit KvParallelGroup(const KvParallelGroupOptions& options) : options_(options) {}

  // Sequences: std::vector<ScriptSequence>, const or not.
  template <typename Sequences>
  static auto find(Sequences& sequences, kv::SeqId id) -> decltype(*sequences.begin()) {
    const auto found = std::find_if(sequences.begin(), sequences.end(),
                                    [&](const ScriptSequence& s) { return s.id == id; });
    FOLIO_CHECK(found != sequences.end(), "sequence {} is not in the script", id);
    return *found;
  }

  Status init() {
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufWriter writer,
                           model::make_random_llama_writer(options_.shape, options_.model_seed));
    FOLIO_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, writer.write_to_buffer());
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::parse_owned(std::move(bytes)));
    FOLIO_ASSIGN_OR_RETURN(model_, model::LlamaModel::from_file(std::move(file)));
    FOLIO_ASSIGN_OR_RETURN(vm_, device::make_host_virtual_memory());
    memory::PagePoolOptions pool_options;
    pool_options.name = "kv_parallel_group";
    pool_options.page_size = size_t{64} << 10;
    pool_options.num_pages = 4096;
    FOLIO_ASSIGN_OR_RETURN(page_pool_, memory::PagePool::create(*vm_, pool_options));
    const int32_t members = options_.num_members;
    whole_ = std::make_unique<KvpWorker>(options_);
    FOLIO_RETURN_IF_ERROR(whole_->init(options_, *model_, *vm_, *page_pool_, context(),
                                       options_.member_pages * members, 0, 0, nullptr, "whole"));
    FOLIO_ASSIGN_OR_RETURN(group_, dist::make_in_process_group(members, std::chrono::seconds(60)));
    std::vector<kv::BlockManager*> managers;
    for (int32_t g = 0; g < members; ++g) {
      step_collectives_.push_back(
          std::make_unique<dist::GroupStepCollectives>(*group_[static_cast<size_t>(g)]));
      counting_.push_back(std::make_unique<CountingStepCollectives>(*step_collectives_.back()));
      members_.push_back(std::make_unique<KvpWorker>(options_));
      const int64_t begin = int64_t{g} * options_.tokens_per_member;
      FOLIO_RETURN_IF_ERROR(
          members_.back()->init(options_, *model_, *vm_, *page_pool_, options_.tokens_per_member,
                                options_.member_pages, begin, begin + options_.tokens_per_member,
                                counting_.back().get(), fmt::format("member_{}", g)));
      managers.push_back(&members_.back()->manager());
    }
    FOLIO_ASSIGN_OR_RETURN(cache_,
                           kv::KvParallelCache::create(managers, options_.tokens_per_member));
    for (int32_t g = 1; g < members; ++g) threads_.push_back(std::make_unique<MemberThread>());
    return Status();
  }

  KvParallelGroupOptions options_;
  std::unique_ptr<model::LlamaModel> model_;
  std::unique_ptr<device::VirtualMemory> vm_;
  std::unique_ptr<memory::PagePool> page_pool_;
  std::unique_ptr<KvpWorker> whole_;
  std::vector<std::unique_ptr<dist::Collectives>> group_;
  std::vector<std::unique_ptr<dist::GroupStepCollectives>> step_collectives_;
  std::vector<std::unique_ptr<CountingStepCollectives>> counting_;
  std::vector<std::unique_ptr<KvpWorker>> members_;
  std::unique_ptr<kv::KvParallelCache> cache_;
  std::vector<std::unique_ptr<MemberThread>> threads_;  // members 1.. (last: joined first)
};

}  // namespace folio::testing
