// An in-process KV-parallel group as an engine::StepRunner, for engine tests (dist.md
// "KV-parallel groups"): P executors, each over a KV cache of its own holding the step setup's
// blocks, with member graphs (LlamaGraphOptions::kv_range_begin/end) that merge their partial
// attention through an in-process collective group. run() runs member g on
// batch.for_kv_member(g) (member 0 on the caller's thread, the others on threads of their own,
// testing/kv_parallel_group.h's MemberThread) and returns member 0's logits.
//
// Made from a ModelEngine's RemoteStepSetup (kv_parallel_members, kv_tokens_per_member, block
// ids, buckets, limits), so the engine's block ids and slots mean the same here; the model is
// opened again from its file (one per runner: the members share its weights).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "folio/base/result.h"
#include "folio/base/thread_pool.h"
#include "folio/device/host_virtual_memory.h"
#include "folio/dist/group_step_collectives.h"
#include "folio/dist/in_process_collectives.h"
#include "folio/engine/model_engine.h"
#include "folio/engine/step_runner.h"
#include "folio/exec/arena_memory.h"
#include "folio/exec/executor.h"
#include "folio/exec/multi_shape_arena.h"
#include "folio/memory/page_pool.h"
#include "folio/model/llama_model.h"
#include "testing/kv_parallel_group.h"

namespace folio::testing {

class KvParallelStepRunner final : public engine::StepRunner {
 public:
  // Errors: a setup that names no group (kv_parallel_members < 2), or executors that cannot be
  // made for it.
  static Result<std::unique_ptr<KvParallelStepRunner>> create(const std::string& model_path,
                                                              const engine::RemoteStepSetup& setup,
                                                              int32_t threads_per_member = 1) {
    if (setup.kv_parallel_members < 2 || setup.kv_tokens_per_member <= 0) {
      return invalid_argument("the step setup names no KV-parallel group ({} members of {} tokens)",
                              setup.kv_parallel_members, setup.kv_tokens_per_member);
    }
    std::unique_ptr<KvParallelStepRunner> runner(new KvParallelStepRunner(setup));
    FOLIO_RETURN_IF_ERROR(runner->init(model_path, threads_per_member));
    return runner;
  }
  ~KvParallelStepRunner() override { threads_.clear(); }

  Result<ir::StepOutput> run(const ir::StepBatch& step) override {
    const auto members = static_cast<size_t>(setup_.kv_parallel_members);
    if (step.num_kv_members() != setup_.kv_parallel_members) {
      return invalid_argument("step carries {} KV-parallel members' arrays, the group has {}",
                              step.num_kv_members(), setup_.kv_parallel_members);
    }
    ++num_steps_;
    std::vector<Result<ir::StepOutput>> results(members, ir::StepOutput{});
    const auto run_member = [&](size_t g) {
      results[g] = members_[g]->executor->execute(step.for_kv_member(static_cast<int32_t>(g)));
    };
    for (size_t g = 1; g < members; ++g) threads_[g - 1]->post([&run_member, g] { run_member(g); });
    run_member(0);
    for (size_t g = 1; g < members; ++g) threads_[g - 1]->wait();
    for (size_t g = 0; g < members; ++g) {
      if (!results[g].ok()) {
        return results[g].status().with_context(fmt::format("KV-parallel member {}", g));
      }
    }
    return std::move(results[0]).value();
  }

  int32_t vocab_size() const override { return static_cast<int32_t>(model_->shape().vocab_size); }
  int32_t max_logit_rows() const override { return setup_.max_logit_rows; }
  int64_t num_steps() const { return num_steps_; }

 private:
  struct Member {
    explicit Member(int threads) : pool(threads) {}
    ThreadPool pool;
    std::vector<std::byte> kv;  // the member's KV cache: num_kv_blocks blocks
    std::unique_ptr<exec::MultiShapeArena> arena;
    std::unique_ptr<exec::Executor> executor;
  };

  explicit KvParallelStepRunner(const engine::RemoteStepSetup& setup) : setup_(setup) {}

  Status init(const std::string& model_path, int32_t threads_per_member) {
    FOLIO_ASSIGN_OR_RETURN(model_, model::LlamaModel::open(model_path));
    FOLIO_ASSIGN_OR_RETURN(vm_, device::make_host_virtual_memory());
    memory::PagePoolOptions pool_options;
    pool_options.name = "kv_parallel_step_runner";
    pool_options.page_size = size_t{64} << 10;
    pool_options.num_pages = 2048;
    FOLIO_ASSIGN_OR_RETURN(page_pool_, memory::PagePool::create(*vm_, pool_options));
    const int32_t num_members = setup_.kv_parallel_members;
    FOLIO_ASSIGN_OR_RETURN(group_,
                           dist::make_in_process_group(num_members, std::chrono::seconds(60)));
    const ir::KvCacheGeometry geometry =
        model_->kv_cache_geometry(setup_.block_size, setup_.kv_dtype);
    const ir::KvCacheShape kv_cache{geometry, setup_.num_kv_blocks, setup_.max_blocks_per_sequence};
    for (int32_t g = 0; g < num_members; ++g) {
      collectives_.push_back(
          std::make_unique<dist::GroupStepCollectives>(*group_[static_cast<size_t>(g)]));
      auto member = std::make_unique<Member>(threads_per_member);
      // One page of every block: the block ids are the engine's, [0, num_kv_blocks).
      member->kv.assign(static_cast<size_t>(setup_.num_kv_blocks * geometry.block_bytes()),
                        std::byte{0});
      const kv::KvLayoutNumbers numbers{member->kv.data(),
                                        setup_.num_kv_blocks * geometry.block_bytes(),
                                        static_cast<int32_t>(setup_.num_kv_blocks),
                                        geometry.block_bytes(),
                                        geometry.block_size,
                                        geometry.num_layers,
                                        geometry.num_kv_heads,
                                        geometry.head_dim,
                                        geometry.dtype};
      member->arena =
          exec::MultiShapeArena::create(std::make_unique<exec::DedicatedArenaMemory>(*vm_));
      model::LlamaGraphOptions graph_options;
      graph_options.kv_range_begin = int64_t{g} * setup_.kv_tokens_per_member;
      graph_options.kv_range_end = graph_options.kv_range_begin + setup_.kv_tokens_per_member;
      exec::ExecutorOptions options;
      options.name = fmt::format("kvp_member_{}", g);
      options.max_sequences = setup_.max_sequences;
      options.max_logit_rows = setup_.max_logit_rows;
      options.max_num_tokens = setup_.max_num_tokens;
      if (!setup_.bucket_ladder.empty()) options.bucket_ladder = setup_.bucket_ladder;
      options.first_dummy_block = setup_.first_dummy_block;
      options.num_dummy_blocks = setup_.num_dummy_blocks;
      options.mode = setup_.use_graphs ? exec::ExecutionMode::kGraph : exec::ExecutionMode::kEager;
      options.collectives = collectives_.back().get();
      const exec::ExecutorResources resources{
          member->pool, *member->arena, *page_pool_, model_->weights(),
          exec::KvCacheBinding{numbers, setup_.num_kv_blocks, 0}};
      FOLIO_ASSIGN_OR_RETURN(member->executor,
                             exec::Executor::create(model_->graph_factory(kv_cache, graph_options),
                                                    resources, options));
      members_.push_back(std::move(member));
    }
    for (int32_t g = 1; g < num_members; ++g) {
      threads_.push_back(std::make_unique<MemberThread>());
    }
    return Status();
  }

  engine::RemoteStepSetup setup_;
  std::unique_ptr<model::LlamaModel> model_;
  std::unique_ptr<device::VirtualMemory> vm_;
  std::unique_ptr<memory::PagePool> page_pool_;
  std::vector<std::unique_ptr<dist::Collectives>> group_;
  std::vector<std::unique_ptr<dist::GroupStepCollectives>> collectives_;
  std::vector<std::unique_ptr<Member>> members_;
  std::vector<std::unique_ptr<MemberThread>> threads_;  // members 1.. (joined first)
  int64_t num_steps_ = 0;
};

}  // namespace folio::testing
