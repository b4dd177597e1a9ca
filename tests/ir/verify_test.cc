// verify(), verify_order() and topological_order() on hand-built broken graphs, on the
// Llama-shaped graph, and on graphs whose op list was shuffled.
#include "folio/ir/verify.h"

#include <algorithm>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/ir/builder.h"
#include "testing/llama_test_graph.h"

namespace folio::ir {
namespace {

using ::testing::HasSubstr;

Op make_op(OpKind kind, std::string name, std::vector<TensorId> inputs,
           std::vector<TensorId> outputs, OpAttributes attributes = NoAttributes{}) {
  Op op;
  op.kind = kind;
  op.name = std::move(name);
  op.inputs = std::move(inputs);
  op.outputs = std::move(outputs);
  op.attributes = std::move(attributes);
  return op;
}

// x (input f32 [4, 8]) -> silu 'a' -> silu 'b', with the ops listed in `a_first` order or not.
struct TwoSilus {
  Graph graph;
  TensorId x, a, b;
};
TwoSilus two_silus(bool a_first) {
  TwoSilus result;
  result.x = result.graph.add_tensor("x", DType::kF32, {4, 8}, Residency::kInput).value();
  result.a = result.graph.add_tensor("a", DType::kF32, {4, 8}, Residency::kActivation).value();
  result.b = result.graph.add_tensor("b", DType::kF32, {4, 8}, Residency::kActivation).value();
  Op first = make_op(OpKind::kSilu, "make_a", {result.x}, {result.a});
  Op second = make_op(OpKind::kSilu, "make_b", {result.a}, {result.b});
  if (!a_first) std::swap(first, second);
  EXPECT_TRUE(result.graph.add_op(first).ok());
  EXPECT_TRUE(result.graph.add_op(second).ok());
  return result;
}

void expect_invalid(const Status& status, const std::string& text) {
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
  EXPECT_THAT(std::string(status.message()), HasSubstr(text));
}

TEST(VerifyTest, AcceptsAWellFormedGraph) {
  EXPECT_TRUE(verify(two_silus(true).graph).ok());
}

TEST(VerifyTest, CatchesATensorUsedBeforeItIsProduced) {
  const TwoSilus graph = two_silus(false);
  expect_invalid(verify(graph.graph), "op 'make_b' reads 'a' before it is produced");
  // A dependency order exists, and it is valid.
  Result<std::vector<OpId>> order = topological_order(graph.graph);
  ASSERT_TRUE(order.ok()) << order.status().to_string();
  EXPECT_EQ(*order, (std::vector<OpId>{OpId(1), OpId(0)}));
  EXPECT_TRUE(verify_order(graph.graph, *order).ok());
}

TEST(VerifyTest, CatchesCycles) {
  Graph graph;
  const TensorId a = graph.add_tensor("a", DType::kF32, {4}, Residency::kActivation).value();
  const TensorId b = graph.add_tensor("b", DType::kF32, {4}, Residency::kActivation).value();
  ASSERT_TRUE(graph.add_op(make_op(OpKind::kSilu, "f", {b}, {a})).ok());
  ASSERT_TRUE(graph.add_op(make_op(OpKind::kSilu, "g", {a}, {b})).ok());
  expect_invalid(verify(graph), "before it is produced");
  const Status cycle = topological_order(graph).status();
  expect_invalid(cycle, "dependency cycle");
  EXPECT_THAT(std::string(cycle.message()), HasSubstr("'f' 'g'"));
}

TEST(VerifyTest, CatchesTensorsProducedTwiceOrNever) {
  TwoSilus twice = two_silus(true);
  ASSERT_TRUE(twice.graph.add_op(make_op(OpKind::kSilu, "again", {twice.x}, {twice.a})).ok());
  expect_invalid(verify(twice.graph), "tensor 'a' is produced twice");
  expect_invalid(topological_order(twice.graph).status(), "produced twice");

  TwoSilus never = two_silus(true);
  ASSERT_TRUE(never.graph.add_tensor("orphan", DType::kF32, {4}, Residency::kOutput).ok());
  expect_invalid(verify(never.graph), "output tensor 'orphan' is never produced");
}

TEST(VerifyTest, CatchesProducedExternalTensorsAndIllegalUpdates) {
  TwoSilus produced = two_silus(true);
  const TensorId weight =
      produced.graph.add_tensor("w", DType::kF32, {4, 8}, Residency::kWeight).value();
  ASSERT_TRUE(
      produced.graph.add_op(make_op(OpKind::kSilu, "overwrite", {produced.a}, {weight})).ok());
  expect_invalid(verify(produced.graph), "produces 'w', a weight tensor");

  TwoSilus updated = two_silus(true);
  Op op = make_op(OpKind::kSilu, "sneaky", {updated.a}, {});
  op.updates = {updated.x};
  ASSERT_TRUE(updated.graph.add_op(op).ok());
  expect_invalid(verify(updated.graph), "only KV caches are updated in place");
}

TEST(VerifyTest, CatchesOutputsThatDisagreeWithTheSignature) {
  Graph graph;
  const TensorId x = graph.add_tensor("x", DType::kF32, {4, 8}, Residency::kInput).value();
  const TensorId w = graph.add_tensor("w", DType::kF32, {6, 8}, Residency::kWeight).value();
  const TensorId y = graph.add_tensor("y", DType::kF32, {4, 8}, Residency::kActivation).value();
  ASSERT_TRUE(graph.add_op(make_op(OpKind::kMatMul, "mm", {x, w}, {y})).ok());
  expect_invalid(verify(graph), "output 'y' is f32 [4, 8]; its inputs give f32 [4, 6]");

  Graph attributes;
  const TensorId in = attributes.add_tensor("in", DType::kF32, {4, 8}, Residency::kInput).value();
  const TensorId out =
      attributes.add_tensor("out", DType::kF32, {4, 8}, Residency::kActivation).value();
  ASSERT_TRUE(
      attributes.add_op(make_op(OpKind::kSilu, "s", {in}, {out}, RmsNormAttributes{})).ok());
  expect_invalid(verify(attributes), "wrong attribute type");
}

TEST(VerifyTest, AddOpRejectsUnknownTensorIdsWithoutChangingTheGraph) {
  TwoSilus graph = two_silus(true);
  const Status status =
      graph.graph.add_op(make_op(OpKind::kSilu, "bad", {TensorId(7)}, {graph.b})).status();
  EXPECT_EQ(status.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(graph.graph.num_ops(), 2);
}

TEST(VerifyTest, OrdersMustKeepKvCacheWritesBeforeTheAttentionThatReadsThem) {
  const Graph graph = folio::testing::build_llama_test_graph().value();
  std::vector<OpId> order = program_order(graph);
  ASSERT_TRUE(verify_order(graph, order).ok());
  const auto is_kind = [&](OpKind kind) {
    return [&graph, kind](OpId id) { return graph.op(id).kind == kind; };
  };
  auto write = std::find_if(order.begin(), order.end(), is_kind(OpKind::kKvCacheWrite));
  auto attention = std::find_if(order.begin(), order.end(), is_kind(OpKind::kPagedAttention));
  ASSERT_LT(write, attention);
  // No data edge joins them (attention reads the cache, not the write's outputs), but moving
  // attention before the write would read stale KV.
  std::vector<OpId> attention_first = order;
  attention_first.erase(attention_first.begin() + (attention - order.begin()));
  attention_first.insert(attention_first.begin() + (write - order.begin()), *attention);
  expect_invalid(verify_order(graph, attention_first), "KV cache 'blk.0.k_cache'");
}

TEST(VerifyTest, OrdersMustBePermutations) {
  const TwoSilus graph = two_silus(true);
  expect_invalid(verify_order(graph.graph, std::vector<OpId>{OpId(0)}), "lists 1 ops");
  expect_invalid(verify_order(graph.graph, std::vector<OpId>{OpId(0), OpId(0)}), "twice");
}

TEST(VerifyTest, TopologicalOrderOfAValidGraphIsTheProgramOrder) {
  const Graph graph = folio::testing::build_llama_test_graph().value();
  Result<std::vector<OpId>> order = topological_order(graph);
  ASSERT_TRUE(order.ok()) << order.status().to_string();
  EXPECT_EQ(*order, program_order(graph));
}

// The Llama graph's ops re-added in a shuffled list: the list is (almost surely) not a valid
// order, but topological_order recovers one that verify_order accepts and that keeps every
// KV-cache access in the shuffled program's order.
TEST(VerifyTest, TopologicalOrderRepairsShuffledOpLists) {
  const Graph source = folio::testing::build_llama_test_graph().value();
  std::mt19937_64 random(42);
  int num_invalid_lists = 0;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<OpId> permutation = program_order(source);
    std::shuffle(permutation.begin(), permutation.end(), random);
    Graph shuffled(source.phase());
    for (const TensorInfo& tensor : source.tensors()) {
      ASSERT_TRUE(
          shuffled.add_tensor(tensor.name, tensor.dtype, tensor.shape, tensor.residency).ok());
    }
    for (OpId id : permutation) ASSERT_TRUE(shuffled.add_op(source.op(id)).ok());
    if (!verify(shuffled).ok()) ++num_invalid_lists;
    Result<std::vector<OpId>> order = topological_order(shuffled);
    ASSERT_TRUE(order.ok()) << order.status().to_string();
    EXPECT_TRUE(verify_order(shuffled, *order).ok()) << "trial " << trial;
  }
  EXPECT_GT(num_invalid_lists, 15);
}

}  // namespace
}  // namespace folio::ir
